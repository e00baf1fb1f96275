"""Reconciliation: every given figure predicted from the others, disagreements named.

Measured tok/s at a step count is predicted from the timings and the acceptance (or the
fitted cycle growth); a prediction off by more than the tolerance is reported with the
inputs that would have to change, and to what. Acceptance figures at the same k that
disagree are reported too. Used by nccl_tune.spec.planner.
"""

from __future__ import annotations

from nccl_tune.spec import accept as sa


def acceptance_rows(acc: sa.Acceptance) -> list[dict]:
    """One consistency row per acceptance figure left out for disagreeing at its k."""
    rows = []
    for other in acc.alternatives:
        used = acc.at(other.k)
        rows.append(
            {
                "input": other.source,
                "predicted": used.accept_len if used else None,
                "measured": other.accept_len,
                "agrees": False,
                "note": f"accept length at k = {other.k}: {used.source} gives "
                f"{used.accept_len:.3f}, this gives {other.accept_len:.3f}",
            }
        )
    return rows


def cycle_parts(k, acc, curve, req, cycle_fit):
    """(tau, cycle ms, verify ms) at k >= 1 and batch 1 (verify None under a cycle fit)."""
    if cycle_fit is not None:
        return acc.tau(k), cycle_fit(k), None
    verify = curve(k + 1)
    return acc.tau(k), k * req.draft_ms + verify + req.other_ms, verify


def measured_rows(req, measured, acc, curve, decode, cycle_fit) -> list[dict]:
    """One consistency row per --measured-tok-s: predicted, agrees, what would have to change."""
    rows = []
    for k, x in sorted(measured.items()):
        row = {"input": f"--measured-tok-s {x:g}@{k}", "measured": x, "tolerance": req.tolerance}
        if k == 0 and decode is None:
            rows.append({**row, "predicted": None, "agrees": None, "note": "plain decoding not priced"})
            continue
        if k == 0:
            pred = 1000.0 / decode
            row.update(predicted=pred, agrees=abs(pred - x) <= req.tolerance * x)
            if not row["agrees"]:
                row["would_have_to"] = [{"input": "--decode-ms", "value": 1000.0 / x, "given": decode}]
            rows.append(row)
            continue
        if curve is not None and not curve.usable(k + 1):
            rows.append(
                {
                    **row,
                    "predicted": None,
                    "agrees": None,
                    "note": f"verify time at {k + 1} tokens not measured (--extrapolate)",
                }
            )
            continue
        tau, cycle, verify = cycle_parts(k, acc, curve, req, cycle_fit)
        pred = 1000.0 * tau / cycle
        row.update(predicted=pred, agrees=abs(pred - x) <= req.tolerance * x)
        if cycle_fit is not None:
            row["note"] = "a point the cycle growth was fitted to (--fit)"
        if not row["agrees"]:
            row["would_have_to"] = would_have_to(k, x, tau, cycle, verify, acc, curve, req)
        rows.append(row)
    return rows


def would_have_to(k, x, tau, cycle, verify, acc, curve, req) -> list[dict]:
    """The inputs that would have to change, and to what, for the prediction to meet x."""
    need_tau = x * cycle / 1000.0
    given = acc.at(k)
    source = given.source if given else f"{acc.convention} (extended from other k)"
    length = {
        "input": f"accept length at k = {k} (bonus token included)",
        "value": need_tau,
        "given": tau,
        "from": source,
    }
    if given and given.option == "--accepted-drafts":
        length["as_given"] = f"--accepted-drafts {need_tau - 1:.3f}@{k}"
    agreeing = [
        p.source
        for p in acc.alternatives + acc.points
        if p.k == k and abs(p.accept_len - need_tau) <= req.tolerance * need_tau
    ]
    if agreeing:
        length["agrees_with"] = agreeing
    out = [length]
    if verify is not None:
        need_v = 1000.0 * tau / x - k * req.draft_ms - req.other_ms
        measured_here = (k + 1) in dict(req.verify_points)
        out.append(
            {
                "input": f"verify time at {k + 1} tokens",
                "value": need_v,
                "given": verify,
                "from": "--verify-ms" if measured_here else curve.kind + " curve",
            }
        )
        if given and not measured_here:
            out.reverse()  # the acceptance was measured here, the verify time was not
    else:
        out.append(
            {"input": f"cycle time at k = {k}", "value": 1000.0 * tau / x, "given": cycle, "from": "cycle growth fit"}
        )
    return out
