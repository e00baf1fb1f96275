"""recommend --spec-steps: the step planner under the baseline and the recommended cell.

The same planner pieces as spec-plan (nccl_tune.spec.verify, specdec.plan_steps,
candidate_steps): verify(n) = compute(n) + comm(n), where comm(n) is the baseline's
collectives time at n tokens per sequence (its latency curve at n x batch x hidden x
dtype bytes) and compute(n) is what the measured verify times leave after it (interp),
or the fitted fixed + slope x distinct experts (moe) / x tokens (dense). Under the
recommended cell, every forward of n tokens saves the table's own saving at that size
(`analysis.saving_ms_at`), so the profile's gain enters through comm(n) at every n and
plain decoding here equals the table's projected tok/s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nccl_tune.spec import verify as sv
from nccl_tune.spec.cycle import DEFAULT_REL_ERROR, best_step, candidate_steps, plan_steps, validate_command


@dataclass
class SpecComparison:
    """Step plans under the baseline and the recommended cell."""

    baseline: list  # specdec.StepPlan, k = 0 (plain decoding) first
    recommended: list | None
    assumptions: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # step counts whose verify size is unmeasured
    skipped_verify: list[int] = field(default_factory=list)  # beyond the --verify-ms points
    extrapolated_bytes: dict = field(default_factory=dict)  # k -> bytes (with --extrapolate)
    extrapolated_tokens: dict = field(default_factory=dict)  # k -> tokens per sequence
    verify_model: dict | None = None
    rel_error: float = DEFAULT_REL_ERROR
    profile: str | None = None

    def best(self, which: str):
        """Best StepPlan among k >= 1 for 'baseline' or 'recommended' (None if absent)."""
        plans = [p for p in (getattr(self, which) or []) if p.k >= 1]
        return best_step(plans) if plans else None

    def candidates(self, which: str) -> list[int] | None:
        """Step counts within the stated relative error of the best (None if absent)."""
        plans = getattr(self, which)
        return candidate_steps(plans, self.rel_error) if plans and len(plans) > 1 else None

    def extrapolation_note(self) -> str | None:
        """One line naming what was extrapolated, or None."""
        parts = []
        if self.extrapolated_bytes:
            parts.append("allreduce latency at " + ", ".join(
                f"{b} B (k = {k})" for k, b in sorted(self.extrapolated_bytes.items()))
                + " beyond the measured sizes")
        if self.extrapolated_tokens:
            parts.append("verify time at " + ", ".join(
                f"{t} tokens (k = {k})" for k, t in sorted(self.extrapolated_tokens.items()))
                + " beyond the --verify-ms points")
        if not parts:
            return None
        return "EXTRAPOLATED (rows marked *): " + "; ".join(parts)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        def plans(which):
            rows = getattr(self, which)
            return [asdict(p) for p in rows] if rows is not None else None
        best_b, best_r = self.best("baseline"), self.best("recommended")
        cands = self.candidates("recommended") or self.candidates("baseline")
        return {"baseline": plans("baseline"), "recommended": plans("recommended"),
                "best_k_baseline": best_b.k if best_b else None,
                "best_tok_s_baseline": best_b.tok_s if best_b else None,
                "best_k_recommended": best_r.k if best_r else None,
                "best_tok_s_recommended": best_r.tok_s if best_r else None,
                "candidates_baseline": self.candidates("baseline"),
                "candidates_recommended": self.candidates("recommended"),
                "validate_command": validate_command(cands, self.profile) if cands else None,
                "verify_model": self.verify_model,
                "assumptions": self.assumptions, "skipped_steps": self.skipped,
                "skipped_steps_verify": self.skipped_verify,
                "extrapolated_bytes": {str(k): b for k, b in sorted(self.extrapolated_bytes.items())},
                "extrapolated_verify_tokens": {str(k): t for k, t in
                                               sorted(self.extrapolated_tokens.items())},
                "extrapolation_note": self.extrapolation_note()}


def compare_profiles(analysis, *, steps: list[int], tau, hidden: int, dtype: str, batch: int,
                     layers: int, baseline_tok_s: float | None = None, decode_ms: float | None = None,
                     verify_points: list | None = None, verify_model: str = "auto",
                     experts: int | None = None, topk: int | None = None,
                     compute_per_token_ms: float = 0.0, draft_ms: float | None = None,
                     draft_collectives: int = 3, other_ms: float = 0.0, extrapolate: bool = False,
                     rel_error: float = DEFAULT_REL_ERROR, profile: str | None = None) -> SpecComparison:
    """tau, cycle time and tok/s per step count under the baseline and the recommended cell.

    `analysis` is a recommendation.Analysis. Plain decoding is priced by `decode_ms` (or
    1000 / baseline_tok_s, or the verify point at 1 token), never with `other_ms`, which
    is per speculative cycle. `verify_points` are (tokens per sequence, ms) under the
    baseline; without them compute is flat from the decode time plus
    `compute_per_token_ms` per extra token. The draft step keeps its compute and changes
    its `draft_collectives` one-token collectives with the profile.
    """
    from nccl_tune.errors import NcclTuneError
    from nccl_tune.model.per_token import message_bytes

    points = dict(verify_points or [])
    if decode_ms is None and baseline_tok_s:
        decode_ms = 1000.0 / baseline_tok_s
    if decode_ms is None and 1 in points:
        decode_ms = points[1]
    if decode_ms is None:
        raise NcclTuneError("speculative planning needs plain decoding's own time: --decode-ms, "
                            "--baseline-tok-s, or a --verify-ms point at 1 token")
    assumptions: list[str] = []
    base_curve = analysis.baseline.curve
    rec = analysis.recommended
    rec_curve = rec.curve if rec else None

    def comm(tokens):
        lat = base_curve.at(message_bytes(tokens * batch, hidden, dtype), extrapolate)
        return analysis.collectives * lat / 1000.0

    kind = verify_model if verify_model != "auto" else (sv.MOE if experts else sv.INTERP)
    curves = [c for c in (base_curve, rec_curve) if c is not None]
    usable, skipped, skipped_verify, extrap_bytes, extrap_tokens = [], [], [], {}, {}
    fit_pts = dict(points)
    fit_pts.setdefault(1, decode_ms)
    measured = sv.measured_curve(sorted(fit_pts.items())) if points else None
    for k in [0, *steps]:
        nbytes = message_bytes((k + 1) * batch, hidden, dtype)
        if not all(curve.covers(nbytes) for curve in curves):
            if not extrapolate:
                skipped.append(k)
                continue
            extrap_bytes[k] = nbytes
        if measured is not None and measured.extrapolated(k + 1) and kind == sv.INTERP:
            if not extrapolate:
                skipped_verify.append(k)
                continue
            extrap_tokens[k] = k + 1
        usable.append(k)
    if 0 in skipped:
        raise NcclTuneError("the decode size is outside the measured range (--extrapolate)")
    if points and kind != sv.INTERP:
        try:
            curve = sv.fit_curve(kind, sorted(fit_pts.items()), experts=experts, topk=topk,
                                 comm=comm, comm_note="from the baseline's latency curve (the source above)",
                                 sources=["--verify-ms", "plain decode time as the 1-token point"])
        except ValueError as exc:
            raise NcclTuneError(str(exc)) from None
        for k in usable:
            if curve.extrapolated(k + 1):
                extrap_tokens[k] = k + 1
        assumptions.append(f"verify: {curve.describe()}")
    elif points:
        curve = sv.measured_curve(sorted(fit_pts.items()), linear_beyond=True)
        assumptions.append("verify compute = measured verify time (plain decode time at 1 token) "
                           "minus the baseline's collectives time (its latency curve) at each "
                           "token count, linear between the points")
    else:
        fixed = decode_ms - comm(1)
        curve = sv.VerifyCurve(sv.DENSE, ((1, decode_ms),), fixed_ms=fixed - compute_per_token_ms,
                               slope_ms=compute_per_token_ms, comm=comm,
                               comm_note="the baseline's latency curve", covers_all=True)
        assumptions.append(f"verify compute = plain decode time ({decode_ms:.3f} ms) minus its "
                           "collectives time, " + ("flat in tokens (dense-like; give --verify-ms "
                                                   "points or --moe-experts for MoE)"
                                                   if compute_per_token_ms == 0 else
                                                   f"+ {compute_per_token_ms} ms per extra token"))
    if decode_ms - comm(1) <= 0:
        raise NcclTuneError("the plain decode time is smaller than the collectives time alone: "
                            "check --baseline-tok-s / --decode-ms against the results")
    if other_ms:
        assumptions.append("--other-ms is charged to speculative cycles only, not to plain decoding")
    one_token = base_curve.at(message_bytes(batch, hidden, dtype), extrapolate)
    if draft_ms is None:
        draft_base = (decode_ms - comm(1)) / layers + draft_collectives * one_token / 1000.0
        assumptions.append(f"draft step ASSUMED = one target layer's compute plus "
                           f"{draft_collectives} collectives ({draft_base:.3f} ms); pass "
                           "--draft-ms to use a measured one")
    else:
        draft_base = draft_ms
    savings: dict[int, float] = {}

    def saving(tokens):
        # the table's own estimator (Analysis.saving_ms_at), so k = 0 equals its projection
        if tokens not in savings:
            nbytes = message_bytes(tokens * batch, hidden, dtype)
            savings[tokens] = analysis.saving_ms_at(rec, nbytes, extrapolate)
        return savings[tokens]

    def verify_for(with_saving):
        def verify(n):
            return curve(n) - (saving(n) if with_saving else 0.0)
        # a row is marked when its latency or its verify time was extrapolated
        verify.extrapolated = lambda n: (n - 1) in extrap_bytes or (n - 1) in extrap_tokens
        return verify

    base_plans = plan_steps(usable, tau, draft_base, verify_for(False), other_ms, decode_ms)
    rec_plans = None
    if rec_curve is not None:
        draft_rec = draft_base - draft_collectives * saving(1) / analysis.collectives
        rec_plans = plan_steps(usable, tau, max(draft_rec, 0.0), verify_for(True), other_ms,
                               decode_ms - saving(1))
        assumptions.append("under the recommended cell: the baseline's decode, verify and draft "
                           "times minus the cell's saving at each forward's size, estimated as "
                           "in the table above (so k = 0 matches its projected tok/s)")
    return SpecComparison(base_plans, rec_plans, assumptions, [k for k in skipped if k],
                          [k for k in skipped_verify if k], extrap_bytes, extrap_tokens,
                          curve.to_dict(), rel_error, profile)
