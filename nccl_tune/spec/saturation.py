"""Where a forward turns compute-bound: the saturation term of the verify cost.

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

The constant: DEFAULT_TOKENS = 295, the ridge point of an H100 SXM5 (989 TFLOP/s dense
BF16 Tensor Core / 3.35 TB/s HBM3, NVIDIA's H100 Tensor Core GPU datasheet) with bf16
weights. For another GPU pass its own (peak FLOP/s / bandwidth in bytes/s x bytes per
weight / 2), or give plain decoding's step time at two or more batch sizes and the
constant is fitted (`fit_tokens`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

DEFAULT_TOKENS = 295.0
DEFAULT_SOURCE = ("the H100 SXM5 ridge point with bf16 weights: 989 TFLOP/s dense BF16 / 3.35 "
                  "TB/s (NVIDIA H100 datasheet); --saturation-tokens sets your GPU's")
GRID = tuple(10 ** (i / 100) for i in range(0, 601))  # 1 .. 1e6 tokens, 2.3% apart


def term_ms(t1: float, tokens: float, n_sat: float) -> float:
    """The compute-bound line: t1 x n / n_sat (t1: the one-token, memory-bound forward)."""
    return t1 * tokens / n_sat


def fit_tokens(points: Sequence[tuple[int, float]], base: Callable[[float], float],
               t1: float) -> tuple[float, str]:
    """n_sat from plain decoding's step time at two or more batch sizes (batch, ms).

    Least squares in log time of max(base(B), t1 x B / n_sat) against the measured step
    times, n_sat searched over a geometric grid: `base` is the verify cost without the
    term (the curve of the batch-1 timings and its model: MoE expert growth, a dense
    per-token slope), so only growth beyond what it explains counts as saturation. When
    the times do not rise beyond `base`, saturation lies beyond the largest batch size:
    then n_sat is max(DEFAULT_TOKENS, that batch size) and the note says so.
    """
    pts = sorted((int(b), float(ms)) for b, ms in points)
    if len(pts) < 2:
        raise ValueError("fitting the saturation point needs plain decoding's time at two or "
                         "more batch sizes")

    def error(n_sat: float) -> float:
        return sum((math.log(max(base(b), term_ms(t1, b, n_sat))) - math.log(ms)) ** 2
                   for b, ms in pts)

    best = min(GRID, key=lambda n: (round(error(n), 12), -n))
    largest = pts[-1][0]
    where = ", ".join(f"{b} ({ms:g} ms)" for b, ms in pts)
    if best >= largest:
        n_sat = max(DEFAULT_TOKENS, float(largest))
        return n_sat, (f"plain decoding's times at batch {where} rise no faster than the verify "
                       f"model: no compute-bound growth up to {largest} tokens per forward; "
                       f"saturation taken at {n_sat:g} tokens (the default, or the largest "
                       "batch size measured)")
    return best, (f"FITTED to plain decoding's times at batch {where}: the verify forward turns "
                  f"compute-bound (t1 x n / n_sat) at n_sat = {best:.3g} tokens")
