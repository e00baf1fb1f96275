"""Correctness check of a collective: per-rank distinct inputs, exact expected outputs.

Inputs are small integers chosen so that every partial sum, in any order a protocol
may add them, is exactly representable in the element type: with `world` ranks each
value is at most max_exact // world (bf16: 256 // 8 = 32 at 8 ranks), so the result
must match bit for bit and any mismatch is a real corruption, not rounding. Values
depend on the rank (distinct between ranks for worlds up to that bound + 1) and on
the position, so swapped or shifted blocks show up too. Pure numpy; the measuring
code copies these values into its tensors.
"""

from __future__ import annotations

import numpy as np

REDUCING = ("allreduce", "reduce_scatter")


def value_bound(op: str, world: int, max_exact: int) -> int:
    """Largest input value: sums of `world` values must stay exact for reducing ops."""
    if op in REDUCING:
        return max(1, max_exact // max(world, 1))
    return max_exact


def pattern(rank: int, length: int, bound: int) -> np.ndarray:
    """Rank `rank`'s values 0..bound over `length` positions (float64, small integers)."""
    index = np.arange(length, dtype=np.int64)
    return ((index * 7 + rank * 13 + 1) % (bound + 1)).astype(np.float64)


def input_length(op: str, count: int, world: int) -> int:
    """Elements each rank sends: all of `count` except for all_gather (count / world)."""
    return count // world if op == "all_gather" else count


def output_length(op: str, count: int, world: int) -> int:
    """Elements each rank receives: count / world for reduce_scatter, else count."""
    return count // world if op == "reduce_scatter" else count


def input_values(op: str, rank: int, world: int, count: int, max_exact: int) -> np.ndarray:
    """What rank `rank` contributes to one collective whose message holds `count` elements."""
    return pattern(rank, input_length(op, count, world), value_bound(op, world, max_exact))


def expected_values(op: str, rank: int, world: int, count: int, max_exact: int) -> np.ndarray:
    """The exact result rank `rank` must hold after the collective."""
    bound = value_bound(op, world, max_exact)
    if op == "allreduce":
        return sum(pattern(q, count, bound) for q in range(world))
    if op == "reduce_scatter":
        chunk = count // world
        total = sum(pattern(q, count, bound) for q in range(world))
        return total[rank * chunk : (rank + 1) * chunk]
    if op == "all_gather":
        chunk = count // world
        return np.concatenate([pattern(q, chunk, bound) for q in range(world)])
    raise ValueError(f"unknown op {op!r}")


def count_wrong(actual: np.ndarray, expected: np.ndarray) -> int:
    """Elements of `actual` that differ from `expected` (NaN counts as wrong).

    A shape mismatch counts every element of the longer array as wrong.
    """
    got = np.asarray(actual, dtype=np.float64).ravel()
    want = np.asarray(expected, dtype=np.float64).ravel()
    if got.shape != want.shape:
        return int(max(got.size, want.size))
    return int(np.count_nonzero(~(got == want)))
