"""The step planner: plans per batch size, reconciliation, --fit, candidates, decisions.

Inputs (all optional but the acceptance): plain decoding's own time (at batch 1, and at
other batch sizes), measured verify times at some token counts, a verify model (interp |
moe | dense), draft step and per-cycle other time, measured tok/s at some step counts.
The planner

1. builds the verify curve (nccl_tune.spec.verify; plain decoding's times are its points
   at batch-size tokens) with the saturation term (nccl_tune.spec.saturation);
2. builds the acceptance (nccl_tune.spec.accept), preferring, where figures at the same K
   disagree, the one a measured tok/s at that K supports;
3. predicts every measured point from the inputs and reports each disagreement beyond
   the tolerance (nccl_tune.spec.reconcile);
4. with --fit, fits the free parameters to the measured points and says so: the
   acceptance when none was given, else the verify curve's shape; with no verify or
   draft timings at all, the cycle time's growth with k (nccl_tune.spec.cyclefit: two
   points fix it; one point leaves a range, and the plan spans it);
5. plans every k (per batch size), plain decoding (k = 0) among them, picks the best and
   the candidates (every k within the uncertainty of the best) and the validate command.

Plain decoding's own time is asked for only where the answer depends on it: without it
the plan ranks k >= 1 and says how slow plain decoding must be for the best k to win.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from nccl_tune.spec import accept as sa
from nccl_tune.spec import cyclefit, reconcile, saturation
from nccl_tune.spec import verify as sv
from nccl_tune.spec.cycle import (
    DEFAULT_REL_ERROR,
    StepPlan,
    best_step,
    candidate_steps,
    decision,
    plan_steps,
    validate_command,
)
from nccl_tune.spec.options import AcceptanceInput

OTHER_NOTE = (
    "--other-ms is charged to speculative cycles only (draft re-extend, tree and "
    "acceptance work); plain decoding is priced by its own decode time"
)
BATCH_NOTE = (
    "at batch B a draft step is taken to cost --draft-ms x (a target forward of B "
    "sequences) / (one of 1): the draft runs on the same hardware, its time grows with "
    "the batch as the target's does (ASSUMED); --other-ms the same as at batch 1; tok/s "
    "is per sequence"
)


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
    # verify: {tokens: half}, decode_points: {batch: half}; accept lengths carry theirs
    # (AcceptancePoint.half)
    halves: dict = field(default_factory=dict)
    decode_points: list[tuple[int, float]] = field(default_factory=list)  # (batch > 1, ms)
    saturation_tokens: float | None = None  # given; else fitted or the default
    # no verify points: verify(n) = plain decoding's compute + this x (n - 1) + comm(n)
    compute_per_token_ms: float | None = None
    saving: Callable[[int], float] | None = None  # ms a profile saves on a forward of n tokens

    def uncertain(self) -> bool:
        """True when some input was given with an interval."""
        return (
            any(v for k, v in self.halves.items() if k not in ("verify", "decode_points"))
            or any(self.halves.get("verify", {}).values())
            or any(self.halves.get("decode_points", {}).values())
            or any(p.half for p in self.acceptance.points)
        )


@dataclass
class BatchPlan:
    """Plans for one batch size (plain decoding first when it was priced)."""

    batch: int
    plans: list[StepPlan]
    best: StepPlan
    candidates: list[int]
    left_out: list[int]
    validate: str
    intervals: dict | None = None  # k -> (low, high) tok/s from the inputs' intervals
    span: dict | None = None  # one measured point: the range of explanations (cyclefit)

    @property
    def plain(self) -> StepPlan | None:
        """Plain decoding's row, or None where it was not priced."""
        return next((p for p in self.plans if p.k == 0), None)

    @property
    def decision(self) -> dict:
        """Speculate or not, in words (nccl_tune.spec.cycle.decision)."""
        return decision(self.plans)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        plain = self.plain
        out = {
            "batch": self.batch,
            "best_k": self.best.k,
            "best_tok_s": self.best.tok_s,
            "best_extrapolated": self.best.extrapolated,
            "candidates": self.candidates,
            "speculate": self.decision["speculate"],
            "decision": self.decision["words"],
            "break_even_decode_ms": self.decision["break_even_decode_ms"],
            "plain_tok_s": plain.tok_s if plain else None,
            "speedup": self.best.tok_s / plain.tok_s if plain else None,
            "plans": [asdict(p) for p in self.plans],
            "left_out_steps": self.left_out,
            "validate_command": self.validate,
            "tok_s_intervals": ({str(k): list(v) for k, v in self.intervals.items()} if self.intervals else None),
            "uncertainty": (
                "the range one measured point allows (every split of the cycle into fixed and per-step cost)"
                if self.span
                else "the inputs' intervals (95% of 400 draws, uniform within each "
                "+-H; inputs without one taken as exact)"
                if self.intervals
                else "stated relative error"
            ),
            "one_point_span": self.span,
        }
        return out


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
        out = {
            key: first[key]
            for key in (
                "best_k",
                "candidates",
                "speculate",
                "decision",
                "break_even_decode_ms",
                "plain_tok_s",
                "plans",
                "best_tok_s",
                "speedup",
                "best_extrapolated",
                "left_out_steps",
                "validate_command",
                "tok_s_intervals",
                "uncertainty",
                "one_point_span",
            )
        }
        out.update(
            {
                "verify_model": self.verify_model,
                "acceptance": self.acceptance.to_dict(),
                "consistency": self.consistency,
                "fit": self.fit,
                "notes": self.notes,
                "rel_error": self.rel_error,
                "tolerance": self.tolerance,
                "decides": "the measured sweep decides: run the validate command",
                "conventions": sa.conventions_at(self.batches[0].best.tau, self.batches[0].best.k),
            }
        )
        if len(self.batches) > 1:
            out["batches"] = [b.to_dict() for b in self.batches]
        return out


class PlanError(ValueError):
    """Inputs the planner cannot plan from (the message says what to give)."""


def _points(req: PlanRequest, decode: float | None) -> tuple[dict[int, float], list[str]]:
    points = dict(req.verify_points)
    sources = [f"--verify-ms at {', '.join(str(t) for t in sorted(points))} tokens"] if points else []
    if decode is not None and 1 not in points and not req.verify_flat:
        points[1] = decode
        sources.append("plain decoding's time as the 1-token point")
    return points, sources


def _build_curve(
    req: PlanRequest,
    points: dict[int, float],
    sources: list[str],
    extra: list[tuple[int, float]] = (),
    extra_note: str = "",
) -> sv.VerifyCurve:
    for t, m in extra:
        points.setdefault(t, m)
    if extra:
        sources = [*sources, extra_note]
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
        return sv.fit_curve(
            kind,
            sorted(points.items()),
            experts=req.experts,
            topk=req.topk,
            comm=req.comm,
            comm_note=req.comm_note,
            sources=sources,
        )
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def _flat_compute_curve(req: PlanRequest, decode: float | None) -> sv.VerifyCurve:
    if decode is None:
        raise PlanError(
            "without --verify-ms the verify is modelled from plain decoding's time: "
            "give --decode-ms (or --baseline-tok-s)"
        )
    comm = req.comm or (lambda n: 0.0)
    slope = req.compute_per_token_ms
    return sv.VerifyCurve(
        sv.DENSE,
        ((1, decode),),
        fixed_ms=decode - comm(1) - slope,
        slope_ms=slope,
        comm=comm,
        comm_note=req.comm_note,
        covers_all=True,
        sources=[
            "plain decoding's compute, flat in tokens"
            if not slope
            else f"plain decoding's compute + {slope:g} ms per extra token"
        ],
    )


def _verify_curve(req: PlanRequest, decode: float | None, extra=(), extra_note: str = "") -> sv.VerifyCurve:
    """The verify curve with its saturation term (its note says how the constant was found)."""
    if not req.verify_points and req.compute_per_token_ms is not None:
        curve = _flat_compute_curve(req, decode)
    else:
        points, sources = _points(req, decode)
        curve = _build_curve(req, points, sources, extra, extra_note)
    t1 = decode if decode is not None else curve.base(curve.points[0][0])
    n_sat, note = req.saturation_tokens, "--saturation-tokens"
    if req.decode_points:
        # plain decoding at batch sizes: each sequence's own cost, and a knee if they show one
        extended = curve
        if curve.kind == sv.INTERP and not curve.flat:
            extended = sv.measured_curve(list(curve.points), True, curve.sources)
        batch_times = ([(1, decode)] if decode is not None else []) + list(req.decode_points)
        try:
            curve.per_seq_ms, knee, fitted = saturation.fit(batch_times, extended.base, t1)
        except ValueError as exc:
            raise PlanError(f"--decode-ms: {exc}") from None
        if not n_sat:
            n_sat, note = knee, fitted
        else:
            note += f"; {fitted}"
    if not n_sat:
        n_sat = saturation.DEFAULT_TOKENS
        note = (f"{note}; " if req.decode_points else "") + saturation.DEFAULT_SOURCE
    curve.sat_tokens, curve.sat_t1_ms, curve.sat_note = n_sat, t1, note
    return curve


def _decode_ms(req: PlanRequest) -> tuple[float | None, str | None]:
    if req.decode_ms is not None:
        return req.decode_ms, f"--decode-ms {req.decode_ms:g}"
    one = dict(req.verify_points).get(1)
    if one is not None:
        how = "flat --verify-ms" if req.verify_flat else "--verify-ms point at 1 token"
        return one, f"{how} ({one:g} ms; give --decode-ms for a decode time of its own)"
    measured = dict(req.measured).get(0)
    if measured:
        return 1000.0 / measured, f"--measured-tok-s {measured:g}@0"
    return None, None


def _check(req: PlanRequest, measured: dict, timings: bool) -> None:
    if len(measured) != len(req.measured):
        raise PlanError("--measured-tok-s: give one figure per step count")
    if not timings and not req.fit:
        raise PlanError(
            "give the verify time (--verify-ms V@T, T = k + 1 tokens), or tok/s "
            "measured at two step counts with --measured-tok-s X@K and --fit"
        )
    if timings and req.draft_ms is None:
        raise PlanError("--verify-ms needs --draft-ms (one draft step's time; 0 if negligible)")
    if not timings and (max(req.batches) > 1 or req.decode_points):
        raise PlanError("--batch needs verify timings (--verify-ms): tokens per verify grow with it")


def plan(req: PlanRequest) -> PlanResult:
    """Plan the step count (see the module doc). PlanError on inputs it cannot plan from."""
    notes = [OTHER_NOTE] if req.other_ms else []
    decode, decode_how = _decode_ms(req)
    measured = dict(req.measured)
    max_k = max([*req.steps, *measured, 1])
    timings = bool(req.verify_points) or req.compute_per_token_ms is not None
    _check(req, measured, timings)
    curve = _verify_curve(req, decode) if timings else None
    fit_info = None
    implied_tau = {}
    if timings:
        for k, x in measured.items():
            if k >= 1 and curve.usable(k + 1):
                implied_tau[k] = x * (k * req.draft_ms + curve(k + 1) + req.other_ms) / 1000.0
    if req.acceptance.given:
        acc = _build(req.acceptance, max_k, implied_tau)
    elif req.fit and timings and implied_tau:
        fitted = [
            sa.AcceptancePoint(
                k,
                min(max(t, 1.0), k + 1.0),
                f"--fit --measured-tok-s {measured[k]:g}@{k}",
                "accept length implied by the measured tok/s and the timings (FITTED)",
            )
            for k, t in implied_tau.items()
        ]
        acc = sa.from_points(fitted, max_k)
        fit_info = {
            "fitted": "acceptance",
            "from": [p.source for p in fitted],
            "accept_len": {str(p.k): p.accept_len for p in fitted},
        }
    else:
        raise PlanError(
            "give the acceptance: --accept-len L@K, --accepted-drafts A@K, "
            "--accept-per-pos, --accept-rate, --sglang-accept-rate or "
            "--vllm-acceptance-rate"
        )
    if acc.max_k is not None and max(req.steps) > acc.max_k:
        raise PlanError(f"--accept-per-pos gives {acc.max_k} positions; --steps goes to {max(req.steps)}")
    consistency = list(req.acceptance.checks) + reconcile.acceptance_rows(acc)
    fits, span = [None], None
    if not timings:
        fits, span, fit_info = _cycle_fits(measured, acc, decode, req.draft_ms)
        notes.append(fit_info["note"])
    consistency += reconcile.measured_rows(req, measured, acc, curve, decode, fits[len(fits) // 2])
    if req.fit and timings and fit_info is None:
        curve, fit_info = _fit_verify(req, measured, acc, decode, curve, notes)
    if req.fit and fit_info is None:
        notes.append("--fit: nothing was fitted (give --measured-tok-s X@K at some K >= 1)")
    if decode is None:
        notes.append(
            "plain decoding was not given: the plan ranks k >= 1; whether speculation "
            "beats plain decoding depends on its time (--decode-ms decides; the decision "
            "line says the break-even)"
        )
    if timings and max(req.batches) > 1:
        notes.append(BATCH_NOTE)
    intervals = _intervals(req) if req.uncertain() and span is None else {}
    batches = [_plan_batch(b, req, acc, curve, decode, fits, span, intervals.get(b)) for b in req.batches]
    verify_model = (
        curve.to_dict() if curve is not None else {"kind": "cycle-fit", "description": fit_info["note"], "points": None}
    )
    verify_model["plain_decoding"] = (
        f"{decode:.4g} ms per token from {decode_how}" if decode else "not given (--decode-ms)"
    )
    return PlanResult(
        batches, verify_model, acc, consistency, notes + acc.notes, fit_info, req.rel_error, req.tolerance
    )


def _build(inputs: AcceptanceInput, max_k: int, prefer: dict[int, float]) -> sa.Acceptance:
    try:
        return inputs.build(max_k, prefer)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def _fit_verify(req, measured, acc, decode, curve, notes):
    extra = []
    for k, x in measured.items():
        if k >= 1:
            v = 1000.0 * acc.tau(k) / x - k * req.draft_ms - req.other_ms
            if v > 0:
                extra.append((k + 1, v))
    if not extra:
        return curve, None
    curve = _verify_curve(req, decode, extra, "verify times implied by --measured-tok-s (FITTED, --fit)")
    info = {
        "fitted": "verify curve",
        "implied_points": [list(p) for p in extra],
        "note": "FITTED: the verify curve includes the verify times the measured tok/s imply "
        "with the given acceptance, draft and other times",
    }
    notes.append(info["note"])
    return curve, info


def _cycle_fits(measured, acc, decode, draft_ms):
    """([CycleFit, ...] from steepest to flattest, span or None, fit info)."""
    pts = cyclefit.implied_cycles(measured, acc.tau)
    if not pts:
        raise PlanError("--fit without timings needs --measured-tok-s X@K at some K >= 1")
    if len(pts) >= 2:
        fit = cyclefit.least_squares(pts)
        return (
            [fit],
            None,
            {
                "fitted": "cycle growth",
                "cycle_ms_fixed": fit.fixed_ms,
                "cycle_ms_per_step": fit.per_step_ms,
                "points": [list(p) for p in pts],
                "note": fit.note,
            },
        )
    if decode is None:
        raise PlanError(
            f"one measured tok/s (k = {pts[0][0]}) cannot separate a fixed per-cycle cost "
            "from a per-step cost: give plain decoding's time (--decode-ms; it bounds "
            "the fixed cost) or tok/s measured at a second step count"
        )
    span = cyclefit.span(pts[0], decode, draft_ms)
    fits = span.fits()
    mid = fits[len(fits) // 2]
    return (
        fits,
        span,
        {
            "fitted": "cycle growth (one point: a range)",
            "cycle_ms_fixed": mid.fixed_ms,
            "cycle_ms_per_step": mid.per_step_ms,
            "points": [list(pts[0])],
            "span": span.to_dict(),
            "note": cyclefit.span_note(span, None),
        },
    )


def _plain(batch: int, req: PlanRequest, curve, decode) -> tuple[StepPlan | None, bool]:
    """Plain decoding's row at `batch` (None where it is not priced), and whether it was
    left out (its forward lies beyond the measured verify points)."""
    given = dict(req.decode_points)
    extrapolated = False
    if batch == 1 and decode is not None:
        ms = decode
    elif batch in given:
        ms = given[batch]
    elif decode is None or curve is None:
        return None, False
    elif not curve.usable(batch):
        return None, True
    else:  # one token per sequence: a forward of `batch` tokens over `batch` sequences
        ms, extrapolated = curve.at(batch, batch), curve.extrapolated(batch)
    if req.saving is not None:
        ms -= req.saving(batch)
    if ms <= 0:
        raise PlanError("plain decoding must take positive time")
    return StepPlan(0, 1.0, 0.0, ms, 0.0, ms, 1000.0 / ms, extrapolated), False


class _AtBatch:
    """The verify curve for forwards over `batch` sequences (VerifyCurve.at), less what a
    profile saves on each forward (recommend's cell), marking what it extrapolates."""

    def __init__(self, curve: sv.VerifyCurve, batch: int, saving: Callable[[int], float] | None):
        self.curve, self.batch, self.saving = curve, batch, saving

    def __call__(self, tokens: int) -> float:
        return self.curve.at(tokens, self.batch) - (self.saving(tokens) if self.saving else 0.0)

    def extrapolated(self, tokens: int) -> bool:
        return self.curve.extrapolated(tokens)


def _spec_plans(batch, req, acc, curve, steps) -> list[StepPlan]:
    draft = req.draft_ms
    if batch > 1:  # BATCH_NOTE: the draft step grows with the batch as the target's forward does
        draft = req.draft_ms * curve.at(batch, batch) / curve.at(1, 1)
    return plan_steps(steps, acc.tau, draft, _AtBatch(curve, batch, req.saving), req.other_ms, None, batch)


def _validate(plans, cands, profile) -> str:
    # the measured sweep decides: the candidates, plain decoding and the best k >= 1 (so a
    # "do not speculate" answer is checked against its strongest alternative)
    spec = [p for p in plans if p.k >= 1]
    return validate_command(sorted({*cands, *([best_step(spec).k] if spec else [])}), profile)


def _plan_batch(batch, req, acc, curve, decode, fits, span, intervals=None) -> BatchPlan:
    steps, left_out = [], []
    for k in req.steps:
        if curve is not None and not curve.usable(batch * (k + 1)):
            left_out.append(k)
        else:
            steps.append(k)
    if not steps:
        raise PlanError(
            f"the verify points cover none of --steps at batch {batch} (k + 1 tokens "
            "per sequence): measure those, give a verify model, or --extrapolate"
        )
    if curve is not None:
        plain, plain_out = _plain(batch, req, curve, decode)
    else:  # a cycle fit (batch 1 only): plain decoding at its own time, when given
        plain = StepPlan(0, 1.0, None, None, 0.0, decode, 1000.0 / decode) if decode else None
        plain_out = False
    if plain_out:
        left_out.insert(0, 0)
    head = [plain] if plain else []
    if curve is not None:
        plans = head + _spec_plans(batch, req, acc, curve, steps)
        if intervals and not all(p.k in intervals for p in plans):
            intervals = None  # some draw could not be planned at some k: the stated error then
        cands = candidate_steps(plans, req.rel_error, intervals)
        return BatchPlan(
            batch, plans, best_step(plans), cands, left_out, _validate(plans, cands, req.profile), intervals
        )
    ks = [k for k, _ in fits[0].points]
    per_fit = [head + [_fitted(k, acc, fit, not min(ks) <= k <= max(ks)) for k in steps] for fit in fits]
    plans = per_fit[len(per_fit) // 2]
    cands = sorted({k for p in per_fit for k in candidate_steps(p, req.rel_error)})
    span_info = None
    if span is not None:
        ranges = {
            p.k: (min(q[i].tok_s for q in per_fit), max(q[i].tok_s for q in per_fit)) for i, p in enumerate(plans)
        }
        measure = _measure_next(plans, cands, ranges, span.point[0], req.rel_error)
        span_info = {
            **span.to_dict(),
            "best_k_all_per_step": best_step(per_fit[0]).k,
            "best_k_all_fixed": best_step(per_fit[-1]).k,
            "measure_k": measure,
            "note": cyclefit.span_note(span, measure),
        }
        intervals = ranges
    return BatchPlan(
        batch, plans, best_step(plans), cands, left_out, _validate(plans, cands, req.profile), intervals, span_info
    )


def _measure_next(plans, cands, ranges, measured_k, rel_error) -> int | None:
    """Which k to measure next: a second point at any other k fixes the split; the middle
    split's best k when the splits differ there by more than twice the stated error (it
    decides and checks the likely answer at once), else the candidate farthest from the
    measured k (where they differ most)."""
    others = [k for k in cands if k >= 1 and k != measured_k]
    if not others:
        return None
    best = best_step([p for p in plans if p.k >= 1]).k
    lo, hi = ranges[best]
    if best in others and hi > lo * (1 + 2 * rel_error):
        return best
    return max(others, key=lambda k: (abs(k - measured_k), k))


def _fitted(k, acc, fit, extrapolated) -> StepPlan:
    c = fit(k)
    if c <= 0:
        raise PlanError(
            f"the fitted cycle time at k = {k} is not positive: the measured points disagree with each other"
        )
    return StepPlan(k, acc.tau(k), None, None, 0.0, c, 1000.0 * acc.tau(k) / c, extrapolated)


def _intervals(req: PlanRequest, draws: int = 400, seed: int = 0) -> dict[int, dict]:
    """batch -> k -> (2.5%, 97.5%) tok/s over draws of the inputs uniform in their intervals."""
    rng = random.Random(seed)
    h = req.halves

    def jitter(value, half, floor=0.0):
        return value if value is None or not half else max(floor, value + rng.uniform(-half, half))

    samples: dict[int, dict[int, list[float]]] = {}
    for _ in range(draws):
        points = [
            replace(p, accept_len=min(max(jitter(p.accept_len, p.half), 1.0), p.k + 1.0), half=0.0)
            for p in req.acceptance.points
        ]
        verify = [(t, jitter(m, h.get("verify", {}).get(t, 0.0), 1e-6)) for t, m in req.verify_points]
        batch_times = [(b, jitter(m, h.get("decode_points", {}).get(b, 0.0), 1e-6)) for b, m in req.decode_points]
        draw = replace(
            req,
            halves={},
            acceptance=replace(req.acceptance, points=points, checks=[], notes=[]),
            decode_ms=jitter(req.decode_ms, h.get("decode_ms", 0.0), 1e-6),
            draft_ms=jitter(req.draft_ms, h.get("draft_ms", 0.0)),
            other_ms=jitter(req.other_ms, h.get("other_ms", 0.0)),
            verify_points=verify,
            decode_points=batch_times,
        )
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
            lo = values[int(round(0.025 * (len(values) - 1)))]
            hi = values[int(round(0.975 * (len(values) - 1)))]
            out[batch][k] = (lo, hi)
    return out


def plan_from_loop(
    records: dict[int, dict], steps: list[int] | None = None, rel_error: float = DEFAULT_REL_ERROR
) -> PlanResult:
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
        acc = AcceptanceInput(
            points=[
                sa.AcceptancePoint(
                    k, r["accept_len"], f"--accept-len {r['accept_len']:.3f}@{k}", sa.CONVENTION_ACCEPT_LEN
                )
                for k, r in sorted(spec.items())
            ]
        )
    measured = [(k, r["tok_s"]) for k, r in sorted(records.items()) if r.get("tok_s")]
    req = PlanRequest(
        sorted(steps or spec),
        acc,
        records[0]["step_ms"],
        [(k + 1, r["verify_ms"]) for k, r in sorted(spec.items())],
        False,
        draft,
        other,
        measured=measured,
        rel_error=rel_error,
    )
    return plan(req)
