"""Per-token time in collectives: layers x collectives x latency(message bytes).

A decode step of a tensor-parallel transformer runs `collectives_per_forward` allreduces
(2 per layer: attention out-projection and MLP/MoE down-projection; plus 1 extra, the
vocab-parallel embedding, as SGLang does for DeepSeek-V3/Kimi-K2 style models under plain
TP), each of `tokens x hidden x dtype` bytes, where tokens = batch x tokens per forward
(1 for plain decode, k+1 for a k-step speculative verify).

Latency at a size comes from measured points, interpolated linearly in
log(bytes)-log(latency). Outside the measured range it refuses (OutOfRangeError) unless
asked to extrapolate, and callers then say so.

Savings per forward pass (`estimate_saving`) carry an interval from the rounds: paired
by round with the baseline (Student-t) when there are enough rounds, else a bootstrap
over the iterations that says so (see the notes above `SavingEstimate`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from nccl_tune import stats

DTYPE_BYTES = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "fp64": 8,
    "float64": 8,
    "double": 8,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
}


class OutOfRangeError(ValueError):
    """A size outside the measured range when extrapolation was not allowed."""


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ('bf16', 'fp32', ...); ValueError when unknown."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype '{dtype}' (known: {', '.join(DTYPE_BYTES)})") from None


def message_bytes(tokens: int, hidden: int, dtype: str = "bf16") -> int:
    """Bytes of one TP allreduce: tokens x hidden x bytes per element."""
    return tokens * hidden * dtype_bytes(dtype)


def collectives_per_forward(layers: int, per_layer: int = 2, extra: int = 1) -> int:
    """Allreduces in one forward pass: layers x per_layer + extra."""
    return layers * per_layer + extra


@dataclass(frozen=True)
class Workload:
    """The served model's sizes and the batch sizes to plan."""

    layers: int | None = None
    hidden: int | None = 7168
    dtype: str = "bf16"
    tp: int | None = None
    batches: tuple[int, ...] = (1,)

    @property
    def batch(self) -> int:
        """The first (or only) batch size."""
        return self.batches[0]


@dataclass(frozen=True)
class LatencyCurve:
    """Latency (us) against message bytes, from measured (or modelled) points."""

    points: tuple[tuple[int, float], ...]
    label: str = ""

    @classmethod
    def from_points(cls, points: Iterable[tuple[int, float]], label: str = "") -> LatencyCurve:
        """Build a curve; points must have positive bytes and latency; duplicates averaged."""
        by_size: dict[int, list[float]] = {}
        for nbytes, lat in points:
            if nbytes <= 0 or not lat > 0:
                raise ValueError(f"bad point ({nbytes} B, {lat} us): both must be positive")
            by_size.setdefault(int(nbytes), []).append(float(lat))
        if not by_size:
            raise ValueError("a latency curve needs at least one point")
        merged = tuple((b, sum(v) / len(v)) for b, v in sorted(by_size.items()))
        return cls(merged, label)

    @property
    def sizes(self) -> list[int]:
        """Measured sizes in bytes, ascending."""
        return [b for b, _ in self.points]

    def covers(self, nbytes: int) -> bool:
        """True when `nbytes` lies within the measured range."""
        return self.points[0][0] <= nbytes <= self.points[-1][0]

    def at(self, nbytes: int, extrapolate: bool = False) -> float:
        """Latency at `nbytes`: log-log interpolation; extrapolation only when allowed."""
        sizes = self.sizes
        if not self.covers(nbytes):
            if not extrapolate:
                raise OutOfRangeError(
                    f"{nbytes} B is outside the measured range {sizes[0]}-{sizes[-1]} B"
                    f"{' of ' + self.label if self.label else ''}; measure that size or "
                    "allow extrapolation"
                )
            if len(sizes) == 1:
                return self.points[0][1]
            pair = self.points[:2] if nbytes < sizes[0] else self.points[-2:]
            return _loglog(pair[0], pair[1], nbytes)
        i = bisect.bisect_left(sizes, nbytes)
        if sizes[i] == nbytes:
            return self.points[i][1]
        return _loglog(self.points[i - 1], self.points[i], nbytes)


def _loglog(p0: tuple[int, float], p1: tuple[int, float], nbytes: int) -> float:
    # log(lat) is linear in log(bytes) between (and beyond) the two points.
    x0, y0 = math.log(p0[0]), math.log(p0[1])
    x1, y1 = math.log(p1[0]), math.log(p1[1])
    x = math.log(nbytes)
    return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def comm_time_us(
    curve: LatencyCurve,
    tokens: int,
    layers: int,
    hidden: int,
    dtype: str = "bf16",
    per_layer: int = 2,
    extra: int = 1,
    extrapolate: bool = False,
) -> float:
    """Time (us) one forward pass of `tokens` tokens spends in allreduces."""
    nbytes = message_bytes(tokens, hidden, dtype)
    return collectives_per_forward(layers, per_layer, extra) * curve.at(nbytes, extrapolate)


def predicted_saving_ms(
    baseline: LatencyCurve,
    profile: LatencyCurve,
    tokens: int,
    layers: int,
    hidden: int,
    dtype: str = "bf16",
    per_layer: int = 2,
    extra: int = 1,
    extrapolate: bool = False,
) -> float:
    """ms one forward pass of `tokens` tokens saves under `profile` versus `baseline`."""
    base = comm_time_us(baseline, tokens, layers, hidden, dtype, per_layer, extra, extrapolate)
    prof = comm_time_us(profile, tokens, layers, hidden, dtype, per_layer, extra, extrapolate)
    return (base - prof) / 1000.0


def projected_tok_s(baseline_tok_s: float, saving_ms_per_token: float) -> float:
    """Throughput after saving `saving_ms_per_token` from each token's time.

    1000 / (1000 / baseline - saving): e.g. 62.9 tok/s and 4.64 ms saved -> ~88.8 tok/s.
    """
    if baseline_tok_s <= 0:
        raise ValueError("baseline tok/s must be positive")
    per_token_ms = 1000.0 / baseline_tok_s - saving_ms_per_token
    if per_token_ms <= 0:
        raise ValueError("the saving exceeds the whole time per token")
    return 1000.0 / per_token_ms


# ---------------------------------------------------------------- savings with intervals
#
# The saving of a cell at the decode size, per forward pass, with its interval carried
# from the rounds, the same way report.py compares cells with the baseline:
# - at least MIN_ROUNDS rounds shared with the baseline: each round gives its own
#   interpolated latency for both cells, the difference is paired by round (drift that
#   hits a whole round cancels), and a Student-t interval covers the mean difference;
# - at least MIN_ROUNDS rounds each but not shared: Welch's t interval;
# - fewer rounds: a bootstrap over the pooled per-iteration samples (medians at the
#   bracketing sizes, interpolated log-log); that interval ignores drift between rounds
#   and is labelled "iterations".

MIN_ROUNDS = stats.MIN_ROUNDS
BASIS_ROUNDS = "rounds"
BASIS_ROUNDS_UNPAIRED = "rounds (unpaired)"
BASIS_ITERATIONS = "iterations"


@dataclass(frozen=True)
class SavingEstimate:
    """ms a cell saves per forward pass versus the baseline, and how sure that is."""

    saving_ms: float
    ci_ms: tuple[float, float] | None  # None when no spread can be estimated
    basis: str | None  # rounds | rounds (unpaired) | iterations | None
    n_rounds: int  # rounds that entered the estimate (shared rounds when paired)
    per_round_ms: dict = None  # round -> saving (paired basis only), for tie checks
    extrapolated: bool = False  # the decode size lies outside a measured range

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly above or below zero."""
        return self.ci_ms is not None and (self.ci_ms[0] > 0 or self.ci_ms[1] < 0)


def _round_of(record: dict) -> int:
    value = record.get("round")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _ok_points(records: Iterable[dict]) -> Iterable[tuple[dict, int, float]]:
    """(record, bytes, p50) for ok records that pass the results reader's field rules
    (store.field_problem: a positive size, a finite positive p50) and have both.

    Imported nccl-tests tables start at 0 bytes, and hand-made records may carry NaN or
    strings: the same rule that makes the reader skip them keeps them off every curve.
    """
    from nccl_tune.store import field_problem

    for r in records:
        if (r.get("status") or "ok") != "ok" or field_problem(r) is not None:
            continue
        nbytes, p50 = r.get("bytes"), (r.get("lat_us") or {}).get("p50")
        if nbytes is not None and p50 is not None:
            yield r, int(nbytes), float(p50)


def round_points(records: Iterable[dict]) -> dict[int, dict[int, float]]:
    """round -> {bytes: p50 (median over that round's records)} for usable ok records."""
    acc: dict[int, dict[int, list[float]]] = {}
    for r, nbytes, p50 in _ok_points(records):
        acc.setdefault(_round_of(r), {}).setdefault(nbytes, []).append(p50)
    return {rnd: {b: float(np.median(v)) for b, v in sizes.items()} for rnd, sizes in acc.items()}


def pooled_samples(records: Iterable[dict]) -> dict[int, list[float]]:
    """bytes -> pooled per-iteration samples (the p50 alone where a record has none)."""
    out: dict[int, list[float]] = {}
    for r, nbytes, p50 in _ok_points(records):
        out.setdefault(nbytes, []).extend([float(x) for x in r.get("samples_us") or []] or [p50])
    return out


def _round_latency(points: dict[int, float], nbytes: int, extrapolate: bool) -> float | None:
    try:
        return LatencyCurve.from_points(points.items()).at(nbytes, extrapolate)
    except OutOfRangeError:
        return None


def saving_from_rounds(
    base: dict[int, dict[int, float]],
    cell: dict[int, dict[int, float]],
    nbytes: int,
    collectives: int,
    extrapolate: bool = False,
    confidence: float = 0.95,
) -> SavingEstimate | None:
    """Saving (ms per forward) from per-round latencies; None with too few rounds.

    Raises OutOfRangeError when no round covers `nbytes` and extrapolation is off.
    """
    from nccl_tune import stats

    def at(rounds):
        vals = {rnd: _round_latency(pts, nbytes, extrapolate) for rnd, pts in rounds.items()}
        return {rnd: v for rnd, v in vals.items() if v is not None}

    base_at, cell_at = at(base), at(cell)
    if not base_at or not cell_at:
        _refuse_if_uncovered(base, cell, nbytes, extrapolate)
        return None
    scale = collectives / 1000.0
    extrap = _outside(base, nbytes) or _outside(cell, nbytes)
    shared = sorted(set(base_at) & set(cell_at))
    if len(shared) >= MIN_ROUNDS:
        per_round = {rnd: (base_at[rnd] - cell_at[rnd]) * scale for rnd in shared}
        mean, lo, hi = stats.t_ci(list(per_round.values()), confidence)
        return SavingEstimate(mean, (lo, hi), BASIS_ROUNDS, len(shared), per_round, extrap)
    if len(base_at) >= MIN_ROUNDS and len(cell_at) >= MIN_ROUNDS:
        delta, lo, hi = stats.welch_t_ci(list(base_at.values()), list(cell_at.values()), confidence)
        return SavingEstimate(
            delta * scale,
            (lo * scale, hi * scale),
            BASIS_ROUNDS_UNPAIRED,
            min(len(base_at), len(cell_at)),
            None,
            extrap,
        )
    return None


def _outside(rounds: dict[int, dict[int, float]], nbytes: int) -> bool:
    sizes = {b for pts in rounds.values() for b in pts}
    return bool(sizes) and not (min(sizes) <= nbytes <= max(sizes))


def _refuse_if_uncovered(base, cell, nbytes: int, extrapolate: bool) -> None:
    if extrapolate:
        return
    for rounds in (base, cell):
        sizes = sorted({b for pts in rounds.values() for b in pts})
        if sizes and not sizes[0] <= nbytes <= sizes[-1]:
            raise OutOfRangeError(
                f"{nbytes} B is outside the measured range {sizes[0]}-{sizes[-1]} B; "
                "measure that size or allow extrapolation"
            )


def _bracket(sizes: list[int], nbytes: int, extrapolate: bool) -> list[int]:
    if nbytes in sizes:
        return [nbytes]
    if not sizes[0] <= nbytes <= sizes[-1]:
        if not extrapolate:
            raise OutOfRangeError(
                f"{nbytes} B is outside the measured range {sizes[0]}-{sizes[-1]} B; "
                "measure that size or allow extrapolation"
            )
        if len(sizes) == 1:
            return sizes
        return sizes[:2] if nbytes < sizes[0] else sizes[-2:]
    i = bisect.bisect_left(sizes, nbytes)
    return [sizes[i - 1], sizes[i]]


def _boot_at(
    samples: dict[int, list[float]], nbytes: int, extrapolate: bool, n_boot: int, rng
) -> tuple[float, np.ndarray]:
    """Point latency at `nbytes` and `n_boot` bootstrap replicates (medians, log-log)."""
    sizes = _bracket(sorted(samples), nbytes, extrapolate)
    points, boots = [], []
    for size in sizes:
        data = np.asarray(samples[size], dtype=float)
        points.append(float(np.median(data)))
        idx = rng.integers(0, data.size, size=(n_boot, data.size))
        boots.append(np.median(data[idx], axis=1))
    if len(sizes) == 1:
        return points[0], boots[0]
    x0, x1, x = math.log(sizes[0]), math.log(sizes[1]), math.log(nbytes)
    w = (x - x0) / (x1 - x0)
    point = math.exp((1 - w) * math.log(points[0]) + w * math.log(points[1]))
    boot = np.exp((1 - w) * np.log(boots[0]) + w * np.log(boots[1]))
    return point, boot


def saving_from_samples(
    base: dict[int, list[float]],
    cell: dict[int, list[float]],
    nbytes: int,
    collectives: int,
    extrapolate: bool = False,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    n_rounds: int = 1,
) -> SavingEstimate | None:
    """Saving (ms per forward) from pooled iterations; None when there are no samples.

    The interval ignores drift between rounds (basis "iterations"); with one value per
    size on each side there is no interval at all.
    """
    if not base or not cell:
        return None
    rng = np.random.default_rng(seed)
    base_point, base_boot = _boot_at(base, nbytes, extrapolate, n_boot, rng)
    cell_point, cell_boot = _boot_at(cell, nbytes, extrapolate, n_boot, rng)
    scale = collectives / 1000.0
    extrap = not (min(base) <= nbytes <= max(base)) or not (min(cell) <= nbytes <= max(cell))
    saving = (base_point - cell_point) * scale
    single = all(len(v) == 1 for v in base.values()) and all(len(v) == 1 for v in cell.values())
    if single:
        return SavingEstimate(saving, None, None, n_rounds, None, extrap)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile((base_boot - cell_boot) * scale, [alpha, 1 - alpha])
    return SavingEstimate(saving, (float(lo), float(hi)), BASIS_ITERATIONS, n_rounds, None, extrap)


def estimate_saving(
    base_records: list[dict],
    cell_records: list[dict],
    nbytes: int,
    collectives: int,
    extrapolate: bool = False,
    confidence: float = 0.95,
    seed: int = 0,
) -> SavingEstimate | None:
    """Saving per forward pass of `cell_records` versus `base_records` at `nbytes`.

    Rounds when there are enough of them, else pooled iterations (see the notes above).
    Raises OutOfRangeError when `nbytes` is outside the measured sizes and
    `extrapolate` is off.
    """
    base_rounds, cell_rounds = round_points(base_records), round_points(cell_records)
    by_rounds = saving_from_rounds(base_rounds, cell_rounds, nbytes, collectives, extrapolate, confidence)
    if by_rounds is not None:
        return by_rounds
    shared = len(set(base_rounds) & set(cell_rounds)) or min(len(base_rounds), len(cell_rounds))
    return saving_from_samples(
        pooled_samples(base_records),
        pooled_samples(cell_records),
        nbytes,
        collectives,
        extrapolate,
        confidence,
        seed=seed,
        n_rounds=shared,
    )


def projected_tok_s_interval(
    baseline_tok_s: float, saving_ci_ms: tuple[float, float] | None
) -> tuple[float, float] | None:
    """projected_tok_s at both ends of a saving interval (None when it cannot be computed)."""
    if saving_ci_ms is None:
        return None
    try:
        return (projected_tok_s(baseline_tok_s, saving_ci_ms[0]), projected_tok_s(baseline_tok_s, saving_ci_ms[1]))
    except ValueError:
        return None
