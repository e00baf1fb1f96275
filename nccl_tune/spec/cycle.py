"""Speculative decoding model: tokens per cycle, cycle time, the best step count.

One cycle drafts k tokens (k draft steps), verifies them in one target forward of k+1
tokens, accepts a prefix and always emits one more token from the target (the bonus
token), so tau(k) = 1 + sum_{i<=k} p_i and

    cycle(k) = k x t_draft_step + t_verify(k + 1) + t_other        (k >= 1)
    tok/s(k) = 1000 x tau(k) / cycle(k)

Plain decoding (k = 0) is priced by a decode time of its own: one target forward of one
token, with none of the per-cycle overhead `t_other` of speculation (draft re-extend,
tree building, acceptance). A verify time is never charged to it.

The other pieces of `nccl_tune.spec` live by concern (see its `__init__`); callers
import each name from the module that defines it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_REL_ERROR = 0.05  # stated relative error of a predicted tok/s when no interval is given


@dataclass(frozen=True)
class StepPlan:
    """One step count's cycle (k = 0: plain decoding, priced by its own decode time)."""

    k: int
    tau: float
    draft_ms: float | None
    verify_ms: float | None
    other_ms: float
    cycle_ms: float
    tok_s: float
    extrapolated: bool = False


def cycle_ms(k: int, draft_step_ms: float, verify_ms: float, other_ms: float = 0.0) -> float:
    """k x draft step + verify(k+1) + other (a speculative cycle, k >= 1)."""
    return k * draft_step_ms + verify_ms + other_ms


def plan_steps(
    steps: Sequence[int],
    tau: Callable[[int], float],
    draft_step_ms: float,
    verify: Callable[[int], float],
    other_ms: float = 0.0,
    decode_ms: float | None = None,
    batch: int = 1,
) -> list[StepPlan]:
    """One StepPlan per k in `steps`.

    `verify(n)` is the time of a target forward of n tokens (n = batch x (k + 1)); k = 0 is
    plain decoding at `decode_ms` (default: verify(batch), a forward of one token per
    sequence) without `other_ms`, which is per speculative cycle. tok/s is per sequence.
    """
    extrapolated = getattr(verify, "extrapolated", lambda n: False)
    out = []
    for k in steps:
        if k < 0:
            raise ValueError("step counts must be >= 0")
        tokens = batch * (k + 1)
        if k == 0:
            t_cycle = verify(tokens) if decode_ms is None else decode_ms
            if t_cycle <= 0:
                raise ValueError("plain decoding must take positive time")
            out.append(
                StepPlan(
                    0,
                    1.0,
                    0.0,
                    t_cycle,
                    0.0,
                    t_cycle,
                    1000.0 / t_cycle,
                    decode_ms is None and bool(extrapolated(tokens)),
                )
            )
            continue
        t_verify = verify(tokens)
        t_tau = tau(k)
        t_cycle = cycle_ms(k, draft_step_ms, t_verify, other_ms)
        if t_cycle <= 0:
            raise ValueError("a cycle must take positive time")
        out.append(
            StepPlan(
                k,
                t_tau,
                k * draft_step_ms,
                t_verify,
                other_ms,
                t_cycle,
                1000.0 * t_tau / t_cycle,
                bool(extrapolated(tokens)),
            )
        )
    return out


def best_step(plans: Sequence[StepPlan]) -> StepPlan:
    """The plan with the highest tok/s (fewer steps on a tie). Plain decoding (k = 0) is
    a plan like any other: when it is the best, the answer is "do not speculate"."""
    if not plans:
        raise ValueError("no step counts to choose from")
    return max(plans, key=lambda p: (round(p.tok_s, 9), -p.k))


def decision(plans: Sequence[StepPlan]) -> dict:
    """Whether to speculate, in words and as JSON: the best plan against plain decoding.

    `speculate` is False when plain decoding (k = 0) is the best plan, True when a k >= 1
    beats it, None when plain decoding was not priced (no decode time given): then
    `break_even_decode_ms` says how slow plain decoding must be for the best k to win.
    """
    best = best_step(plans)
    plain = next((p for p in plans if p.k == 0), None)
    if plain is None:
        return {
            "speculate": None,
            "best_k": best.k,
            "break_even_decode_ms": 1000.0 / best.tok_s,
            "words": (
                f"speculate with k = {best.k} only if plain decoding takes more than "
                f"{1000.0 / best.tok_s:.3f} ms per token (below {best.tok_s:.1f} tok/s): "
                "plain decoding was not given (--decode-ms decides)"
            ),
        }
    if best.k == 0:
        spec = [p for p in plans if p.k >= 1]
        runner = ""
        if spec:
            second = best_step(spec)
            runner = f"; the best speculative k = {second.k} gives {second.tok_s / plain.tok_s:.2f}x"
        return {
            "speculate": False,
            "best_k": 0,
            "break_even_decode_ms": None,
            "words": f"do not speculate: plain decoding is fastest ({plain.tok_s:.1f} tok/s{runner})",
        }
    return {
        "speculate": True,
        "best_k": best.k,
        "break_even_decode_ms": None,
        "words": (
            f"speculate with k = {best.k} draft steps: {best.tok_s:.1f} tok/s, "
            f"{best.tok_s / plain.tok_s:.2f}x plain decoding"
        ),
    }


def candidate_steps(
    plans: Sequence[StepPlan],
    rel_error: float = DEFAULT_REL_ERROR,
    intervals: dict[int, tuple[float, float]] | None = None,
) -> list[int]:
    """Every step count whose predicted tok/s is within the uncertainty of the best plan,
    plain decoding (k = 0) included.

    With `intervals` (k -> (low, high) tok/s from the inputs' intervals): each k whose
    high end reaches the best's low end. Otherwise each k within `rel_error` of the best.
    """
    if not plans:
        return []
    best = best_step(plans)
    if intervals and all(p.k in intervals for p in plans):
        floor = intervals[best.k][0]
        return sorted(p.k for p in plans if intervals[p.k][1] >= floor)
    floor = best.tok_s * (1.0 - rel_error)
    return sorted(p.k for p in plans if p.tok_s >= floor)


def validate_command(candidates: Sequence[int], profile: str | None = None) -> str:
    """The `nccl-tune validate` command that measures exactly the candidates (plus plain)."""
    steps = ",".join(str(k) for k in sorted({0, *candidates}))
    return f"nccl-tune validate --profile {profile or 'PROFILE.env'} --steps {steps}"
