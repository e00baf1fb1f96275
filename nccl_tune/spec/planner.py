"""The step planner: plans per batch size, reconciliation, --fit, candidates.

Inputs (all optional but the acceptance and a plain decode time): measured verify times
at some token counts, a verify model (interp | moe | dense), draft step and per-cycle
other time, measured tok/s at some step counts. The planner

1. builds the verify curve (spec_verify; the plain decode time is its 1-token point);
2. builds the acceptance (spec_accept), preferring, where figures at the same K
   disagree, the one a measured tok/s at that K supports;
3. predicts every measured point from the inputs and reports each disagreement beyond
   the tolerance, naming the input that would have to change and to what;
4. with --fit, fits the free parameters to the measured points and says so: the
   acceptance when none was given, else the verify curve's shape; with no verify or
   draft timings at all, the cycle time's growth with k (linear through the points);
5. plans every k (per batch size), picks the best and the candidates (every k within
   the uncertainty of the best) and the validate command that measures them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from nccl_tune.spec import accept as sa
from nccl_tune.spec import verify as sv
from nccl_tune.spec.options import AcceptanceInput
from nccl_tune.spec.cycle import (DEFAULT_REL_ERROR, StepPlan, best_step, candidate_steps, plan_steps,
                               validate_command)

OTHER_NOTE = ("--other-ms is charged to speculative cycles only (draft re-extend, tree and "
              "acceptance work); plain decoding is priced by its own decode time")


@dataclass
class PlanRequest:
    """What the planner is given."""

    steps: list[int]
    acceptance: AcceptanceInput
    decode_ms: float | None = None
    verify_points: list[tuple[int, float]] = field(default_factory=list)  # (tokens, ms)
    verify_flat: bool = False  # one V without @: the same at every token count
    draft_ms: float | None = None  # per draft step
    other_ms: float = 0.0
    verify_model: str = "auto"  # auto | interp | moe | dense
    experts: int | None = None
    topk: int | None = None
    comm: Callable[[int], float] | None = None
    comm_note: str | None = None
    extrapolate: bool = False
    measured: list[tuple[int, float]] = field(default_factory=list)  # (k, tok/s)
    fit: bool = False
    rel_error: float = DEFAULT_REL_ERROR
    tolerance: float = DEFAULT_REL_ERROR
    batches: list[int] = field(default_factory=lambda: [1])
    profile: str | None = None  # named in the validate command
    # half-widths of the inputs' intervals (+-H): decode_ms, draft_ms, other_ms, and
    # verify: {tokens: half}; accept lengths carry theirs (AcceptancePoint.half)
    halves: dict = field(default_factory=dict)

    def uncertain(self) -> bool:
        """True when some input was given with an interval."""
        return (any(v for k, v in self.halves.items() if k != "verify")
                or any(self.halves.get("verify", {}).values())
                or any(p.half for p in self.acceptance.points))


@dataclass
class BatchPlan:
    """Plans for one batch size."""

    batch: int
    plans: list[StepPlan]
    best: StepPlan
    candidates: list[int]
    left_out: list[int]
    validate: str
    intervals: dict | None = None  # k -> (low, high) tok/s from the inputs' intervals

    def to_dict(self) -> dict:
        """JSON-ready form."""
        plain = self.plans[0]
        return {"batch": self.batch, "best_k": self.best.k, "best_tok_s": self.best.tok_s,
                "best_extrapolated": self.best.extrapolated, "candidates": self.candidates,
                "plain_tok_s": plain.tok_s, "speedup": self.best.tok_s / plain.tok_s,
                "plans": [asdict(p) for p in self.plans], "left_out_steps": self.left_out,
                "validate_command": self.validate,
                "tok_s_intervals": ({str(k): list(v) for k, v in self.intervals.items()}
                                    if self.intervals else None),
                "uncertainty": ("the inputs' intervals (95% of 400 draws, uniform within each "
                                "+-H; inputs without one taken as exact)" if self.intervals
                                else "stated relative error")}


@dataclass
class PlanResult:
    """Everything spec-plan prints."""

    batches: list[BatchPlan]
    verify_model: dict
    acceptance: sa.Acceptance
    consistency: list[dict]
    notes: list[str]
    fit: dict | None
    rel_error: float
    tolerance: float

    def to_dict(self) -> dict:
        """The stable JSON: the first batch size's keys at the top, every one under batches."""
        first = self.batches[0].to_dict()
        out = {"best_k": first["best_k"], "candidates": first["candidates"],
               "plain_tok_s": first["plain_tok_s"], "plans": first["plans"],
               "best_tok_s": first["best_tok_s"], "speedup": first["speedup"],
               "best_extrapolated": first["best_extrapolated"],
               "left_out_steps": first["left_out_steps"], "validate_command": first["validate_command"],
               "tok_s_intervals": first["tok_s_intervals"], "uncertainty": first["uncertainty"],
               "verify_model": self.verify_model, "acceptance": self.acceptance.to_dict(),
               "consistency": self.consistency, "fit": self.fit, "notes": self.notes,
               "rel_error": self.rel_error, "tolerance": self.tolerance,
               "decides": "the measured sweep decides: run the validate command",
               "conventions": sa.conventions_at(self.batches[0].best.tau, self.batches[0].best.k)}
        if len(self.batches) > 1:
            out["batches"] = [b.to_dict() for b in self.batches]
        return out


class PlanError(ValueError):
    """Inputs the planner cannot plan from (the message says what to give)."""


def _verify_curve(req: PlanRequest, extra: list[tuple[int, float]] = (), extra_note: str = ""
                  ) -> sv.VerifyCurve:
    points = dict(req.verify_points)
    sources = [f"--verify-ms at {', '.join(str(t) for t in sorted(points))} tokens"] if points else []
    if req.decode_ms is not None and 1 not in points and not req.verify_flat:
        points[1] = req.decode_ms
        sources.append("--decode-ms as the 1-token point")
    for t, m in extra:
        points.setdefault(t, m)
    if extra:
        sources.append(extra_note)
    kind = req.verify_model
    if kind == "auto":
        kind = sv.MOE if req.experts else sv.INTERP
    if req.verify_flat and kind == sv.INTERP and not extra:
        return sv.measured_curve(list(req.verify_points), sources=["--verify-ms (one value: flat)"])
    if kind == sv.INTERP:
        return sv.measured_curve(sorted(points.items()), req.extrapolate, sources)
    if kind == sv.MOE and not (req.experts and req.topk):
        raise PlanError("--verify-model moe needs --moe-experts E and --moe-topk K")
    try:
        return sv.fit_curve(kind, sorted(points.items()), experts=req.experts, topk=req.topk,
                            comm=req.comm, comm_note=req.comm_note, sources=sources)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def _decode_ms(req: PlanRequest) -> tuple[float, str]:
    if req.decode_ms is not None:
        return req.decode_ms, f"--decode-ms {req.decode_ms:g}"
    one = dict(req.verify_points).get(1)
    if one is not None:
        how = "flat --verify-ms" if req.verify_flat else "--verify-ms point at 1 token"
        return one, f"{how} ({one:g} ms; give --decode-ms for a decode time of its own)"
    measured = dict(req.measured).get(0)
    if measured:
        return 1000.0 / measured, f"--measured-tok-s {measured:g}@0"
    raise PlanError("plain decoding needs a decode time of its own: --decode-ms D (ms per token "
                    "without speculation), a --verify-ms point at 1 token, or --measured-tok-s X@0")


def _cycle_parts(k, batch, acc, curve, req, cycle_fit):
    """(tau, cycle ms, verify ms at k) for k >= 1."""
    if cycle_fit is not None:
        return acc.tau(k), cycle_fit[0] + cycle_fit[1] * k, None
    verify = curve(batch * (k + 1))
    return acc.tau(k), k * req.draft_ms + verify + req.other_ms, verify


def plan(req: PlanRequest) -> PlanResult:
    """Plan the step count (see the module doc). PlanError on inputs it cannot plan from."""
    notes = [OTHER_NOTE] if req.other_ms else []
    decode, decode_how = _decode_ms(req)
    measured = dict(req.measured)
    if len(measured) != len(req.measured):
        raise PlanError("--measured-tok-s: give one figure per step count")
    max_k = max([*req.steps, *measured, 1])
    timings = bool(req.verify_points)
    if not timings and not req.fit:
        raise PlanError("give the verify time (--verify-ms V@T, T = k + 1 tokens), or tok/s "
                        "measured at two step counts with --measured-tok-s X@K and --fit")
    if timings and req.draft_ms is None:
        raise PlanError("--verify-ms needs --draft-ms (one draft step's time; 0 if negligible)")
    if not timings and max(req.batches) > 1:
        raise PlanError("--batch needs verify timings (--verify-ms): tokens per verify grow with it")
    curve = _verify_curve(req) if timings else None
    fit_info = None
    # acceptance: given (preferring, at a disputed K, what a measured tok/s supports), or fitted
    implied_tau = {}
    if timings:
        for k, x in measured.items():
            if k >= 1 and curve.usable(k + 1):
                implied_tau[k] = x * (k * req.draft_ms + curve(k + 1) + req.other_ms) / 1000.0
    if req.acceptance.given:
        acc = _build(req.acceptance, max_k, implied_tau)
    elif req.fit and timings and implied_tau:
        fitted = [sa.AcceptancePoint(k, min(max(t, 1.0), k + 1.0), f"--fit --measured-tok-s "
                                     f"{measured[k]:g}@{k}", "accept length implied by the measured "
                                     "tok/s and the timings (FITTED)") for k, t in implied_tau.items()]
        acc = sa.from_points(fitted, max_k)
        fit_info = {"fitted": "acceptance", "from": [p.source for p in fitted],
                    "accept_len": {str(p.k): p.accept_len for p in fitted}}
    else:
        raise PlanError("give the acceptance: --accept-len L@K, --accepted-drafts A@K, "
                        "--accept-per-pos, --accept-rate, --sglang-accept-rate or "
                        "--vllm-acceptance-rate")
    if acc.max_k is not None and max(req.steps) > acc.max_k:
        raise PlanError(f"--accept-per-pos gives {acc.max_k} positions; --steps goes to "
                        f"{max(req.steps)}")
    consistency = list(req.acceptance.checks)
    consistency += _acceptance_rows(acc)
    cycle_fit = None
    if not timings:
        cycle_fit, fit_info = _fit_cycle(measured, acc, decode)
        notes.append(fit_info["note"])
    consistency += _measured_rows(req, measured, acc, curve, decode, cycle_fit, fit_info)
    if req.fit and timings and fit_info is None:
        extra = []
        for k, x in measured.items():
            if k >= 1:
                v = 1000.0 * acc.tau(k) / x - k * req.draft_ms - req.other_ms
                if v > 0:
                    extra.append((k + 1, v))
        if extra:
            curve = _verify_curve(req, extra, "verify times implied by --measured-tok-s (FITTED, --fit)")
            fit_info = {"fitted": "verify curve", "implied_points": [list(p) for p in extra],
                        "note": "FITTED: the verify curve includes the verify times the measured "
                                "tok/s imply with the given acceptance, draft and other times"}
            notes.append(fit_info["note"])
    if req.fit and fit_info is None:
        notes.append("--fit: nothing was fitted (give --measured-tok-s X@K at some K >= 1)")
    intervals = _intervals(req) if req.uncertain() else {}
    batches = [_plan_batch(b, req, acc, curve, decode, cycle_fit, intervals.get(b))
               for b in req.batches]
    verify_model = (curve.to_dict() if curve is not None else
                    {"kind": "cycle-fit", "description": fit_info["note"], "points": None})
    verify_model["plain_decoding"] = f"{decode:.4g} ms per token from {decode_how}"
    return PlanResult(batches, verify_model, acc, consistency, notes + acc.notes, fit_info,
                      req.rel_error, req.tolerance)


def _build(inputs: AcceptanceInput, max_k: int, prefer: dict[int, float]) -> sa.Acceptance:
    try:
        return inputs.build(max_k, prefer)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def _acceptance_rows(acc: sa.Acceptance) -> list[dict]:
    rows = []
    for other in acc.alternatives:
        used = acc.at(other.k)
        rows.append({"input": other.source, "predicted": used.accept_len if used else None,
                     "measured": other.accept_len, "agrees": False,
                     "note": f"accept length at k = {other.k}: {used.source} gives "
                             f"{used.accept_len:.3f}, this gives {other.accept_len:.3f}"})
    return rows


def _fit_cycle(measured: dict[int, float], acc: sa.Acceptance, decode: float):
    """cycle(k) = a + b k through the cycles that measured tok/s imply (no timings given)."""
    pts = sorted((k, 1000.0 * acc.tau(k) / x) for k, x in measured.items() if k >= 1)
    if not pts:
        raise PlanError("--fit without timings needs --measured-tok-s X@K at some K >= 1")
    if len(pts) == 1:
        (k1, c1), = pts
        a, b = decode, (c1 - decode) / k1
        how = (f"through the plain decode time at k = 0 and the measured cycle at k = {k1} "
               "(one speculative point: no fixed per-cycle overhead assumed)")
    else:
        n = len(pts)
        mx, my = sum(k for k, _ in pts) / n, sum(c for _, c in pts) / n
        sxx = sum((k - mx) ** 2 for k, _ in pts)
        b = sum((k - mx) * (c - my) for k, c in pts) / sxx
        a = my - b * mx
        how = "least squares through the measured cycles at k = " + ", ".join(str(k) for k, _ in pts)
    note = (f"FITTED (--fit, no verify or draft timings): cycle(k) = {a:.3f} + {b:.3f} x k ms, "
            f"{how}; the cycle implied at K is 1000 x tau(K) / measured tok/s; linear growth in k "
            "is the stated assumption")
    return (a, b), {"fitted": "cycle growth", "cycle_ms_fixed": a, "cycle_ms_per_step": b,
                    "points": [list(p) for p in pts], "note": note}


def _measured_rows(req, measured, acc, curve, decode, cycle_fit, fit_info) -> list[dict]:
    rows = []
    for k, x in sorted(measured.items()):
        row = {"input": f"--measured-tok-s {x:g}@{k}", "measured": x, "tolerance": req.tolerance}
        if k == 0:
            pred = 1000.0 / decode
            row.update(predicted=pred, agrees=abs(pred - x) <= req.tolerance * x)
            if not row["agrees"]:
                row["would_have_to"] = [{"input": "--decode-ms", "value": 1000.0 / x, "given": decode}]
            rows.append(row)
            continue
        if curve is not None and not curve.usable(k + 1):
            rows.append({**row, "predicted": None, "agrees": None,
                         "note": f"verify time at {k + 1} tokens not measured (--extrapolate)"})
            continue
        tau, cycle, verify = _cycle_parts(k, 1, acc, curve, req, cycle_fit)
        pred = 1000.0 * tau / cycle
        row.update(predicted=pred, agrees=abs(pred - x) <= req.tolerance * x)
        if cycle_fit is not None:
            row["note"] = "a point the cycle growth was fitted to (--fit)"
        if not row["agrees"]:
            row["would_have_to"] = _would_have_to(k, x, tau, cycle, verify, acc, curve, req)
        rows.append(row)
    return rows


def _would_have_to(k, x, tau, cycle, verify, acc, curve, req) -> list[dict]:
    """The inputs that would have to change, and to what, for the prediction to meet x."""
    need_tau = x * cycle / 1000.0
    given = acc.at(k)
    source = given.source if given else f"{acc.convention} (extended from other k)"
    length = {"input": f"accept length at k = {k} (bonus token included)", "value": need_tau,
              "given": tau, "from": source}
    if given and given.option == "--accepted-drafts":
        length["as_given"] = f"--accepted-drafts {need_tau - 1:.3f}@{k}"
    agreeing = [p.source for p in acc.alternatives + acc.points
                if p.k == k and abs(p.accept_len - need_tau) <= req.tolerance * need_tau]
    if agreeing:
        length["agrees_with"] = agreeing
    out = [length]
    if verify is not None:
        need_v = 1000.0 * tau / x - k * req.draft_ms - req.other_ms
        measured_here = (k + 1) in dict(req.verify_points)
        out.append({"input": f"verify time at {k + 1} tokens", "value": need_v, "given": verify,
                    "from": "--verify-ms" if measured_here else curve.kind + " curve"})
        if given and not measured_here:
            out.reverse()  # the acceptance was measured here, the verify time was not
    else:
        out.append({"input": f"cycle time at k = {k}", "value": 1000.0 * tau / x, "given": cycle,
                    "from": "cycle growth fit"})
    return out


def _intervals(req: PlanRequest, draws: int = 400, seed: int = 0) -> dict[int, dict]:
    """batch -> k -> (2.5%, 97.5%) tok/s over draws of the inputs uniform in their intervals."""
    rng = random.Random(seed)
    h = req.halves

    def jitter(value, half, floor=0.0):
        return value if value is None or not half else max(floor, value + rng.uniform(-half, half))
    samples: dict[int, dict[int, list[float]]] = {}
    for _ in range(draws):
        points = [replace(p, accept_len=min(max(jitter(p.accept_len, p.half), 1.0), p.k + 1.0),
                          half=0.0) for p in req.acceptance.points]
        verify = [(t, jitter(m, h.get("verify", {}).get(t, 0.0), 1e-6)) for t, m in req.verify_points]
        draw = replace(req, halves={}, acceptance=replace(req.acceptance, points=points,
                                                          checks=[], notes=[]),
                       decode_ms=jitter(req.decode_ms, h.get("decode_ms", 0.0), 1e-6),
                       draft_ms=jitter(req.draft_ms, h.get("draft_ms", 0.0)),
                       other_ms=jitter(req.other_ms, h.get("other_ms", 0.0)), verify_points=verify)
        try:
            result = plan(draw)
        except (PlanError, ValueError):
            continue
        for b in result.batches:
            for p in b.plans:
                samples.setdefault(b.batch, {}).setdefault(p.k, []).append(p.tok_s)
    out = {}
    for batch, by_k in samples.items():
        out[batch] = {}
        for k, values in by_k.items():
            values.sort()
            lo = values[int(0.025 * (len(values) - 1))]
            hi = values[int(round(0.975 * (len(values) - 1)))]
            out[batch][k] = (lo, hi)
    return out


def _plan_batch(batch, req, acc, curve, decode, cycle_fit, intervals=None) -> BatchPlan:
    steps, left_out = [], []
    for k in req.steps:
        if curve is not None and not curve.usable(batch * (k + 1)):
            left_out.append(k)
        else:
            steps.append(k)
    if not steps:
        raise PlanError(f"the verify points cover none of --steps at batch {batch} (k + 1 tokens "
                        "per sequence): measure those, give a verify model, or --extrapolate")
    if cycle_fit is not None:
        lo = min(k for k, _ in cycle_fit_points(req)) if req.measured else 1
        hi = max(k for k, _ in cycle_fit_points(req)) if req.measured else 1
        plans = [StepPlan(0, 1.0, None, None, 0.0, decode, 1000.0 / decode)]
        for k in steps:
            c = cycle_fit[0] + cycle_fit[1] * k
            if c <= 0:
                raise PlanError(f"the fitted cycle time at k = {k} is not positive: the measured "
                                "points disagree with the plain decode time")
            plans.append(StepPlan(k, acc.tau(k), None, None, 0.0, c, 1000.0 * acc.tau(k) / c,
                                  not lo <= k <= hi))
    else:
        plain = decode if batch == 1 else curve(batch)
        plans = plan_steps([0, *steps], acc.tau, req.draft_ms, curve, req.other_ms, plain, batch)
    best = best_step(plans[1:])
    if intervals and not all(p.k in intervals for p in plans):
        intervals = None  # some draw could not be planned at some k: fall back to the stated error
    cands = candidate_steps(plans, req.rel_error, intervals)
    return BatchPlan(batch, plans, best, cands, left_out, validate_command(cands, req.profile),
                     intervals)


def cycle_fit_points(req: PlanRequest) -> list[tuple[int, float]]:
    """The measured (k, tok/s) points at k >= 1."""
    return [(k, x) for k, x in req.measured if k >= 1]


def plan_from_loop(records: dict[int, dict], steps: list[int] | None = None,
                   rel_error: float = DEFAULT_REL_ERROR) -> PlanResult:
    """The planner on a decode loop's own measurements (the built-in loop's JSON records
    by step count; validate and bench/spec_sweep.py use it).

    Plain decoding: the k = 0 run's time per token (`step_ms`); verify times at k + 1
    tokens from each k >= 1 run; draft step and other time averaged over the k >= 1 runs;
    acceptance per position from the run with the most steps (`accept_per_pos`), else
    the accept lengths per k. Each run's tok/s is a measured point to reconcile (not fitted).
    """
    if 0 not in records or not records[0].get("step_ms"):
        raise PlanError("the loop's plain decoding (k = 0) was not measured")
    spec = {k: r for k, r in records.items() if k >= 1 and r.get("verify_ms") and r.get("accept_len")}
    if not spec:
        raise PlanError("no speculative (k >= 1) run of the loop was measured")
    draft = sum(r["draft_ms"] / k for k, r in spec.items()) / len(spec)
    other = sum(r.get("other_ms") or 0.0 for r in spec.values()) / len(spec)
    deepest = records[max(spec)]
    if deepest.get("accept_per_pos"):
        reach = sorted(deepest["accept_per_pos"], reverse=True)  # shares; ties keep it monotone
        acc = AcceptanceInput(per_pos=tuple(reach))
    else:
        acc = AcceptanceInput(points=[sa.AcceptancePoint(k, r["accept_len"], f"--accept-len "
                                                         f"{r['accept_len']:.3f}@{k}",
                                                         sa.CONVENTION_ACCEPT_LEN)
                                      for k, r in sorted(spec.items())])
    measured = [(k, r["tok_s"]) for k, r in sorted(records.items()) if r.get("tok_s")]
    req = PlanRequest(sorted(steps or spec), acc, records[0]["step_ms"],
                      [(k + 1, r["verify_ms"]) for k, r in sorted(spec.items())], False, draft,
                      other, measured=measured, rel_error=rel_error)
    return plan(req)
