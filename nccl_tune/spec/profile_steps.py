"""recommend --spec-steps: spec-plan's planner (nccl_tune.spec.planner.plan) under the
baseline and under the recommended cell; no planning code of its own.

What recommend adds is the pricing of the two cells: comm(n), the baseline's collectives
time at n tokens per sequence (its latency curve at n x batch x hidden x dtype bytes),
enters the verify model as spec-plan's --layers comm does; without --verify-ms the
verify is plain decoding's compute (flat, or + --compute-per-token-ms per extra token)
plus comm(n) (PlanRequest.compute_per_token_ms). Under the recommended cell every
forward of n tokens saves the table's own saving at that size (`analysis.saving_ms_at`,
PlanRequest.saving), so the profile's gain enters at every n and plain decoding equals
the table's projected tok/s; the draft step saves its own collectives' share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from nccl_tune.errors import NcclTuneError
from nccl_tune.spec.cycle import DEFAULT_REL_ERROR, StepPlan, best_step, decision
from nccl_tune.spec.options import AcceptanceInput


@dataclass
class SpecComparison:
    """Step plans under the baseline and the recommended cell (planner results)."""

    baseline: list[StepPlan]  # k = 0 (plain decoding) first when priced
    recommended: list[StepPlan] | None
    assumptions: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # step counts whose verify size is unmeasured
    skipped_verify: list[int] = field(default_factory=list)  # beyond the --verify-ms points
    extrapolated_bytes: dict = field(default_factory=dict)  # k -> bytes (with --extrapolate)
    extrapolated_tokens: dict = field(default_factory=dict)  # k -> tokens per sequence
    verify_model: dict | None = None
    rel_error: float = DEFAULT_REL_ERROR
    profile: str | None = None
    candidate_sets: dict = field(default_factory=dict)  # which -> the planner's candidates
    validate: str | None = None  # the planner's validate command (recommended cell, else baseline)

    def best(self, which: str) -> StepPlan | None:
        """Best StepPlan, plain decoding included, for 'baseline' or 'recommended'."""
        plans = getattr(self, which) or []
        return best_step(plans) if plans else None

    def decision(self, which: str) -> dict | None:
        """Speculate or not under `which` (nccl_tune.spec.cycle.decision)."""
        plans = getattr(self, which) or []
        return decision(plans) if plans else None

    def candidates(self, which: str) -> list[int] | None:
        """The planner's candidates under `which` (None if absent)."""
        return self.candidate_sets.get(which)

    def extrapolation_note(self) -> str | None:
        """One line naming what was extrapolated, or None."""
        parts = []
        if self.extrapolated_bytes:
            parts.append(
                "allreduce latency at "
                + ", ".join(f"{b} B (k = {k})" for k, b in sorted(self.extrapolated_bytes.items()))
                + " beyond the measured sizes"
            )
        if self.extrapolated_tokens:
            parts.append(
                "verify time at "
                + ", ".join(f"{t} tokens (k = {k})" for k, t in sorted(self.extrapolated_tokens.items()))
                + " beyond the --verify-ms points"
            )
        if not parts:
            return None
        return "EXTRAPOLATED (rows marked *): " + "; ".join(parts)

    def to_dict(self) -> dict:
        """JSON-ready form."""

        def plans(which):
            rows = getattr(self, which)
            return [asdict(p) for p in rows] if rows is not None else None

        best_b, best_r = self.best("baseline"), self.best("recommended")
        dec_b, dec_r = self.decision("baseline"), self.decision("recommended")
        return {
            "baseline": plans("baseline"),
            "recommended": plans("recommended"),
            "best_k_baseline": best_b.k if best_b else None,
            "best_tok_s_baseline": best_b.tok_s if best_b else None,
            "best_k_recommended": best_r.k if best_r else None,
            "best_tok_s_recommended": best_r.tok_s if best_r else None,
            "speculate_baseline": dec_b["speculate"] if dec_b else None,
            "speculate_recommended": dec_r["speculate"] if dec_r else None,
            "decision_baseline": dec_b["words"] if dec_b else None,
            "decision_recommended": dec_r["words"] if dec_r else None,
            "candidates_baseline": self.candidates("baseline"),
            "candidates_recommended": self.candidates("recommended"),
            "validate_command": self.validate,
            "verify_model": self.verify_model,
            "assumptions": self.assumptions,
            "skipped_steps": self.skipped,
            "skipped_steps_verify": self.skipped_verify,
            "extrapolated_bytes": {str(k): b for k, b in sorted(self.extrapolated_bytes.items())},
            "extrapolated_verify_tokens": {str(k): t for k, t in sorted(self.extrapolated_tokens.items())},
            "extrapolation_note": self.extrapolation_note(),
        }


def compare_profiles(
    analysis,
    *,
    steps: list[int],
    acceptance: AcceptanceInput,
    hidden: int,
    dtype: str,
    batch: int,
    layers: int,
    baseline_tok_s: float | None = None,
    decode_ms: float | None = None,
    verify_points: list | None = None,
    verify_model: str = "auto",
    experts: int | None = None,
    topk: int | None = None,
    compute_per_token_ms: float = 0.0,
    draft_ms: float | None = None,
    draft_collectives: int = 3,
    other_ms: float = 0.0,
    extrapolate: bool = False,
    rel_error: float = DEFAULT_REL_ERROR,
    profile: str | None = None,
    halves: dict | None = None,
) -> SpecComparison:
    """The planner's plans per step count under the baseline and the recommended cell.

    `analysis` is a recommendation.Analysis. Plain decoding is priced by `decode_ms` (or
    1000 / baseline_tok_s, or the verify point at 1 token), never with `other_ms`.
    `verify_points` are (tokens per sequence, ms) under the baseline. Without `draft_ms`
    the draft step is ASSUMED to be one target layer's compute plus its
    `draft_collectives` one-token collectives.
    """
    from nccl_tune.model.per_token import message_bytes
    from nccl_tune.spec.planner import PlanError, PlanRequest, plan

    points = dict(verify_points or [])
    if decode_ms is None and baseline_tok_s:
        decode_ms = 1000.0 / baseline_tok_s
    if decode_ms is None:
        decode_ms = points.get(1)
    base_curve = analysis.baseline.curve
    rec = analysis.recommended
    curves = [c for c in (base_curve, rec.curve if rec else None) if c is not None]

    def comm(tokens):
        lat = base_curve.at(message_bytes(tokens * batch, hidden, dtype), extrapolate)
        return analysis.collectives * lat / 1000.0

    usable, skipped, extrap_bytes = [], [], {}
    for k in [0, *steps]:
        nbytes = message_bytes((k + 1) * batch, hidden, dtype)
        if not all(curve.covers(nbytes) for curve in curves):
            if not extrapolate:
                skipped.append(k)
                continue
            extrap_bytes[k] = nbytes
        usable.append(k)
    if 0 in skipped:
        raise NcclTuneError("the decode size is outside the measured range (--extrapolate)")
    if len(usable) < 2:
        raise NcclTuneError("no step count's verify size lies in the measured range (--extrapolate)")
    if decode_ms is not None and decode_ms - comm(1) <= 0:
        raise NcclTuneError(
            "the plain decode time is smaller than the collectives time alone: "
            "check --baseline-tok-s / --decode-ms against the results"
        )
    assumptions: list[str] = []
    one_token = base_curve.at(message_bytes(batch, hidden, dtype), extrapolate)
    if draft_ms is None:
        if decode_ms is None:
            raise NcclTuneError(
                "the draft step is assumed from plain decoding's time: give --draft-ms, --decode-ms or --baseline-tok-s"
            )
        draft_ms = (decode_ms - comm(1)) / layers + draft_collectives * one_token / 1000.0
        assumptions.append(
            f"draft step ASSUMED = one target layer's compute plus "
            f"{draft_collectives} collectives ({draft_ms:.3f} ms); pass "
            "--draft-ms to use a measured one"
        )
    req = PlanRequest(
        usable[1:],
        acceptance,
        decode_ms,
        sorted(points.items()),
        False,
        draft_ms,
        other_ms,
        verify_model,
        experts,
        topk,
        comm,
        "from the baseline's latency curve (the source above)",
        extrapolate,
        rel_error=rel_error,
        profile=profile,
        halves=dict(halves or {}),
        compute_per_token_ms=None if points else compute_per_token_ms,
    )
    try:
        base = plan(req)
        recommended = None
        if rec is not None:
            savings: dict[int, float] = {}

            def saving(tokens):  # the table's own estimator, so k = 0 equals its projection
                if tokens not in savings:
                    nbytes = message_bytes(tokens * batch, hidden, dtype)
                    savings[tokens] = analysis.saving_ms_at(rec, nbytes, extrapolate)
                return savings[tokens]

            draft_rec = max(draft_ms - draft_collectives * saving(1) / analysis.collectives, 0.0)
            recommended = plan(replace(req, draft_ms=draft_rec, saving=saving))
    except PlanError as exc:
        raise NcclTuneError(str(exc)) from None
    assumptions.append(f"verify: {base.verify_model['description']}")
    assumptions += base.notes
    if recommended is not None:
        assumptions.append(
            "under the recommended cell: the baseline's decode, verify and draft "
            "times minus the cell's saving at each forward's size, estimated as "
            "in the table above (so k = 0 matches its projected tok/s)"
        )

    def marked(result):
        return [replace(p, extrapolated=True) if p.k in extrap_bytes else p for p in result.batches[0].plans]

    first = base.batches[0]
    extrap_tokens = {p.k: p.k + 1 for p in first.plans if p.extrapolated and p.k}
    cands = {"baseline": first.candidates}
    validate = first.validate
    if recommended is not None:
        cands["recommended"] = recommended.batches[0].candidates
        validate = recommended.batches[0].validate
    return SpecComparison(
        marked(base),
        marked(recommended) if recommended else None,
        assumptions,
        [k for k in skipped if k],
        [k for k in first.left_out if k],
        extrap_bytes,
        extrap_tokens,
        base.verify_model,
        rel_error,
        profile,
        cands,
        validate,
    )
