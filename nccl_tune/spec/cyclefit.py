"""Cycle time from measured tok/s alone (no verify or draft timings): cycle(k) = a + b k.

A measured tok/s X at K steps with tokens per cycle tau(K) implies the cycle time
c = 1000 x tau(K) / X. Two or more such points fix the fixed per-cycle cost a and the
per-step cost b (least squares); plain decoding's own time is not needed for that.

One point cannot separate them: every (a, b) with a + b K = c fits it. What the
physics allows is a range, and the plan must span it instead of picking one end:

- all per-step (the steepest): the cycle at k = 0 would be one plain decode step, so
  a = plain decoding's time D (no fixed overhead beyond a decode forward) and
  b = (c - D) / K. A verify of k+1 tokens costs at least a decode forward, so a >= D.
- all fixed (the flattest): b = the draft step time when one is given (each step
  costs at least a draft forward), else 0, and a = c - b K.

The candidates are every k that is within the stated error of the best somewhere on
that range; a second measurement at the candidate farthest from K (where the two
explanations differ most) decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SPAN_POINTS = 41  # explanations tried between the two ends (inclusive)


@dataclass(frozen=True)
class CycleFit:
    """cycle(k) = fixed + per_step x k, and where it came from."""

    fixed_ms: float
    per_step_ms: float
    points: tuple[tuple[int, float], ...]  # (k, implied cycle ms)
    note: str

    def __call__(self, k: int) -> float:
        return self.fixed_ms + self.per_step_ms * k


@dataclass(frozen=True)
class CycleSpan:
    """One measured point: the range of fits it allows, from all per-step to all fixed."""

    point: tuple[int, float]  # (K, implied cycle ms)
    per_step_range: tuple[float, float]  # (flattest, steepest)
    decode_ms: float
    floor_from: str  # what bounds the per-step cost from below

    def fits(self, count: int = SPAN_POINTS) -> list[CycleFit]:
        """`count` fits from the steepest (all per-step) to the flattest (all fixed)."""
        k1, c1 = self.point
        lo, hi = self.per_step_range
        out = []
        for i in range(count):
            b = hi - (hi - lo) * i / (count - 1)
            out.append(CycleFit(c1 - b * k1, b, (self.point,), ""))
        return out

    def to_dict(self) -> dict:
        """JSON-ready form."""
        k1, c1 = self.point
        lo, hi = self.per_step_range
        return {
            "measured_k": k1,
            "cycle_ms": c1,
            "per_step_ms": [lo, hi],
            "fixed_ms": [c1 - hi * k1, c1 - lo * k1],
            "per_step_floor": self.floor_from,
        }


def implied_cycles(measured: dict[int, float], tau: Callable[[int], float]) -> list[tuple[int, float]]:
    """(k, 1000 x tau(k) / tok/s) for every measured k >= 1."""
    return sorted((k, 1000.0 * tau(k) / x) for k, x in measured.items() if k >= 1)


def least_squares(points: Sequence[tuple[int, float]]) -> CycleFit:
    """cycle(k) = a + b k through two or more (k, cycle ms) points."""
    n = len(points)
    mx, my = sum(k for k, _ in points) / n, sum(c for _, c in points) / n
    sxx = sum((k - mx) ** 2 for k, _ in points)
    b = sum((k - mx) * (c - my) for k, c in points) / sxx
    a = my - b * mx
    ks = ", ".join(str(k) for k, _ in points)
    note = (
        f"FITTED (--fit, no verify or draft timings): cycle(k) = {a:.3f} + {b:.3f} x k ms, "
        f"least squares through the cycles measured at k = {ks} (1000 x tau(K) / measured "
        "tok/s); linear growth in k is the stated assumption"
    )
    return CycleFit(a, b, tuple(points), note)


def span(point: tuple[int, float], decode_ms: float, draft_ms: float | None) -> CycleSpan:
    """The fits one measured (k, cycle) point allows (see the module doc)."""
    k1, c1 = point
    steep = max((c1 - decode_ms) / k1, 0.0)
    floor = min(draft_ms or 0.0, steep)
    how = (
        "--draft-ms (a step costs at least one draft forward)"
        if draft_ms
        else "0 (no draft time given: drafts could cost nothing)"
    )
    return CycleSpan(point, (floor, steep), decode_ms, how)


def span_note(s: CycleSpan, measure_k: int | None) -> str:
    """One line: what one point cannot tell, and which measurement would."""
    k1, c1 = s.point
    lo, hi = s.per_step_range
    text = (
        f"ONE measured point (k = {k1}, cycle {c1:.3f} ms) cannot separate a fixed per-cycle "
        f"cost from a per-step cost: planned over every split from all per-step "
        f"({s.decode_ms:.3f} + {hi:.3f} x k ms: no fixed cost beyond a plain decode step) to "
        f"all fixed ({c1 - lo * k1:.3f} + {lo:.3f} x k ms; per-step floor {s.floor_from}); "
        "the candidates are what any split allows"
    )
    if measure_k is not None:
        text += f"; measure tok/s at k = {measure_k} to decide (the splits differ most there)"
    return text
