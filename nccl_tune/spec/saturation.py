"""How a forward's time grows with the batch: each sequence's own cost, and where it turns
compute-bound (the saturation term of the verify cost).

A decode or verify forward of n tokens reads the (active) weights once and does 2 FLOPs
per weight per token. Reading takes W = weight bytes / memory bandwidth, computing takes
n x F with F = 2 x weights / peak FLOP/s. The forward is memory-bound (its time nearly
flat in n) while n x F < W, and compute-bound (its time proportional to n) beyond

    n_sat = W / F = ridge point (FLOP per byte) x bytes per weight / 2

the roofline's ridge point; with bf16 weights n_sat is the ridge point itself. So the
verify cost of n tokens gets the term

    t(n) = max(base(n), t1 x n / n_sat)

where base(n) is the verify curve (measured points, or the MoE / dense model) and t1 the
one-token forward (memory-bound: t1 ~ W, so t1 / n_sat ~ F). Below n_sat the term is
inactive; beyond it every extra token costs a full token's compute, so at large batch
sizes the best k falls. The same holds for MoE targets with the active weights.

Each sequence in the batch also costs on its own (it reads its own KV cache, and an
engine does per-sequence work), whatever its token count: a forward of n tokens over b
sequences is base(n) + per_seq x (b - 1) before the max above. Plain decoding's step
times at batch sizes measure both (`fit`): per_seq from how they rise, a knee only where
they rise faster than a per-sequence cost explains.

The constant: DEFAULT_TOKENS = 295, the ridge point of an H100 SXM5 (989 TFLOP/s dense
BF16 Tensor Core / 3.35 TB/s HBM3, NVIDIA's H100 Tensor Core GPU datasheet) with bf16
weights. For another GPU pass its own (peak FLOP/s / bandwidth in bytes/s x bytes per
weight / 2), or give plain decoding's step time at two or more batch sizes and the
constant is fitted (`fit_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

DEFAULT_TOKENS = 295.0
DEFAULT_SOURCE = (
    "the H100 SXM5 ridge point with bf16 weights: 989 TFLOP/s dense BF16 / 3.35 "
    "TB/s (NVIDIA H100 datasheet); --saturation-tokens sets your GPU's"
)
GRID = tuple(10 ** (i / 100) for i in range(601))  # 1 .. 1e6 tokens, 2.3% apart
# a knee is claimed only when it explains the times much better than a per-sequence cost
# alone: its rms log misfit under KNEE_GAIN times the other's, which misses by over MIN_MISS
KNEE_GAIN = 0.5
MIN_MISS = 0.05


def term_ms(t1: float, tokens: float, n_sat: float) -> float:
    """The compute-bound line: t1 x n / n_sat (t1: the one-token, memory-bound forward)."""
    return t1 * tokens / n_sat


def _per_seq(points, base, t1, n_sat) -> float:
    """Least squares per-sequence ms (>= 0) where the memory-bound term sets the time."""
    rows = [(b - 1, ms - base(b)) for b, ms in points if b > 1 and (n_sat is None or term_ms(t1, b, n_sat) < ms)]
    sxx = sum(x * x for x, _ in rows)
    return max(0.0, sum(x * y for x, y in rows) / sxx) if sxx else 0.0


def _miss(points, base, t1, per_seq, n_sat) -> float:
    """rms log misfit of max(base(B) + per_seq (B - 1), t1 B / n_sat) at the points."""
    errs = []
    for b, ms in points:
        model = base(b) + per_seq * (b - 1)
        if n_sat is not None:
            model = max(model, term_ms(t1, b, n_sat))
        errs.append((math.log(model) - math.log(ms)) ** 2)
    return math.sqrt(sum(errs) / len(errs))


def fit(
    points: Sequence[tuple[int, float]], base: Callable[[float], float], t1: float
) -> tuple[float, float | None, str]:
    """(per-sequence ms, n_sat or None, note) from plain decoding's step time at batch
    sizes (batch, ms): a plain step at batch B is a forward of B tokens over B sequences.

    `base` is the verify curve of one sequence (its timings and model), so the model is
    max(base(B) + per_seq x (B - 1), t1 x B / n_sat): each sequence beyond the first adds
    its own cost (its KV cache reads, per-sequence work; least squares, >= 0), and beyond
    n_sat tokens the compute-bound line. n_sat is searched over a geometric grid with the
    per-sequence cost refitted for each; a knee is claimed only when it fits the times
    much better than the per-sequence cost alone (KNEE_GAIN, MIN_MISS), so two batch
    sizes (which a per-sequence cost always meets) never give one.
    """
    pts = sorted((int(b), float(ms)) for b, ms in points)
    if not any(b > 1 for b, _ in pts):
        raise ValueError("fitting batch costs needs plain decoding's time at a batch size > 1")
    where = ", ".join(f"{b} ({ms:g} ms)" for b, ms in pts)
    flat = _per_seq(pts, base, t1, None)
    miss = _miss(pts, base, t1, flat, None)
    knees = [(n, _per_seq(pts, base, t1, n)) for n in GRID if n < pts[-1][0]]
    scored = [(_miss(pts, base, t1, s, n), -n, n, s) for n, s in knees]
    best = min(scored) if scored else None
    if best is None or miss <= MIN_MISS or best[0] > KNEE_GAIN * miss:
        return (
            flat,
            None,
            (
                f"from plain decoding's times at batch {where}: {flat:.3f} ms per "
                f"sequence beyond the first (rms misfit {100 * miss:.1f}%); no "
                f"compute-bound knee below {pts[-1][0]} tokens"
            ),
        )
    _, _, n_sat, per_seq = best
    return (
        per_seq,
        n_sat,
        (
            f"FITTED to plain decoding's times at batch {where}: {per_seq:.3f} ms "
            f"per sequence beyond the first, compute-bound (t1 x n / n_sat) from "
            f"n_sat = {n_sat:.3g} tokens (rms misfit {100 * best[0]:.1f}%, "
            f"{100 * miss:.1f}% without the knee)"
        ),
    )
