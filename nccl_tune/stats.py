"""Statistics for latency samples: summaries, slowest-rank reduction, intervals, tests.

All pure functions on sequences of floats (numpy inside). Percentiles use numpy's
default linear interpolation; CV is the sample standard deviation over the mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The fewest rounds an interval over rounds is computed from. With two, Student's t has
# one degree of freedom (t = 12.7 at 95%, 63.7 at 99%): bounds from 0 to 10^15 times the
# median say nothing, so with fewer rounds callers say "too few rounds" instead.
MIN_ROUNDS = 3

FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no significant difference"


def summarize(samples: Sequence[float]) -> dict:
    """min, p10, p50, p90, p99, max, mean, cv and n of a sample (empty -> all None, n 0)."""
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        return {
            "min": None,
            "p10": None,
            "p50": None,
            "p90": None,
            "p99": None,
            "max": None,
            "mean": None,
            "cv": None,
            "n": 0,
        }
    p10, p50, p90, p99 = np.percentile(values, [10, 50, 90, 99])
    mean = float(values.mean())
    # One sample has no spread to estimate: cv is unknown (None), not 0.
    std = float(values.std(ddof=1)) if values.size > 1 else None
    return {
        "min": float(values.min()),
        "p10": float(p10),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
        "mean": mean,
        "cv": (std / mean) if mean and std is not None else None,
        "n": int(values.size),
    }


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per-iteration latency of a collective: the slowest rank's time at each iteration.

    `per_rank[r][i]` is rank r's time for iteration i; all ranks must have the same count.
    """
    if len({len(row) for row in per_rank}) > 1:
        raise ValueError("ranks have different numbers of samples: " + ", ".join(str(len(row)) for row in per_rank))
    table = np.asarray(per_rank, dtype=float)
    if table.ndim != 2:
        raise ValueError("expected one row of samples per rank")
    return table.max(axis=0).tolist()


def _paired(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """a - b element by element; unequal lengths are an error (numpy would broadcast a
    single value silently and pair every round with the same one)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.shape != xb.shape:
        raise ValueError(f"paired samples need equal lengths, got {xa.size} and {xb.size}")
    return xa - xb


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def bootstrap_ci(
    values: Sequence[float], statistic=np.median, confidence: float = 0.95, n_boot: int = 2000, seed: int | None = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of `statistic` (the median by default).

    With one value the interval is that value (no spread can be estimated).
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values")
    if data.size == 1:
        return float(data[0]), float(data[0])
    idx = _rng(seed).integers(0, data.size, size=(n_boot, data.size))
    stats = statistic(data[idx], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return float(lo), float(hi)


def bootstrap_diff_ci(
    a: Sequence[float],
    b: Sequence[float],
    statistic=np.median,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int | None = 0,
) -> tuple[float, float, float]:
    """stat(a) - stat(b) and its percentile-bootstrap interval (samples resampled apart)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size == 0 or xb.size == 0:
        raise ValueError("no values")
    delta = float(statistic(xa) - statistic(xb))
    if xa.size == 1 and xb.size == 1:
        return delta, delta, delta
    rng = _rng(seed)
    sa = statistic(xa[rng.integers(0, xa.size, size=(n_boot, xa.size))], axis=1)
    sb = statistic(xb[rng.integers(0, xb.size, size=(n_boot, xb.size))], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(sa - sb, [alpha, 1 - alpha])
    return delta, float(lo), float(hi)


def paired_diff_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int | None = 0
) -> tuple[float, float, float]:
    """Median of the paired differences a[i] - b[i] (same round) and its bootstrap interval.

    Pairing by round cancels drift that hits both cells of a round alike.
    """
    diffs = _paired(a, b)
    lo, hi = bootstrap_ci(diffs, np.median, confidence, n_boot, seed)
    return float(np.median(diffs)), lo, hi


def t_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval of the mean (for a few round-level values).

    With 3-10 rounds a percentile bootstrap is far too narrow (a false "winner" in about
    a quarter of flat comparisons at 3 rounds); the t interval keeps its nominal rate.
    """
    from scipy.stats import t as student_t

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values")
    mean = float(data.mean())
    if data.size == 1:
        return mean, mean, mean
    half = float(student_t.ppf(0.5 + confidence / 2, data.size - 1) * data.std(ddof=1) / np.sqrt(data.size))
    return mean, mean - half, mean + half


def wilson_ci(successes: float, trials: float, confidence: float = 0.95) -> tuple[float, float, float]:
    """A proportion and its Wilson score interval (sound near 0 and 1 and for few trials,
    where the normal approximation leaves [0, 1]): (p, lo, hi)."""
    from scipy.stats import norm

    if trials <= 0:
        raise ValueError("no trials")
    p = successes / trials
    z = float(norm.ppf(0.5 + confidence / 2))
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * float(np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))) / (1 + z * z / trials)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def positive_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Interval for a positive quantity (a latency, a throughput) from a few round values:
    Student's t on the log scale, mapped back: (geometric mean, lo, hi) with 0 < lo <= hi.

    The plain t interval of a few noisy latencies reaches below zero (-1690 us around a
    2510 us p50 over 3 rounds), which no latency can; on the log scale the interval is
    multiplicative and stays positive. Values <= 0 are an error.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values")
    if np.any(data <= 0) or not np.all(np.isfinite(data)):
        raise ValueError("positive_ci needs finite values > 0")
    centre, lo, hi = t_ci(np.log(data), confidence)
    return float(np.exp(centre)), float(np.exp(lo)), float(np.exp(hi))


def rate_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float | None, list[float] | None]:
    """(mean, interval) of a few throughputs (tok/s per run): the arithmetic mean, and the
    interval on the log scale (`positive_ci`), so it never reaches below zero, as latency
    intervals do not; None for no values, and no interval for one value or any value <= 0."""
    data = [float(v) for v in values if v is not None]
    if not data:
        return None, None
    mean = float(np.mean(data))
    if len(data) < 2 or min(data) <= 0 or not all(np.isfinite(data)):
        return mean, None
    _, lo, hi = positive_ci(data, confidence)
    return mean, [lo, hi]


def tied(best_rounds: dict, other_rounds: dict, confidence: float = 0.95) -> bool | None:
    """Whether `other` is statistically tied with `best`: the paired Student-t interval of
    their per-round differences (rounds both were measured in) includes zero. None with
    fewer than MIN_ROUNDS shared rounds (no interval: the caller decides).

    The tie rule of every pick (sweep's best finalist, recommend's cell): among the cells
    tied with the best, the one that sets the fewest variables wins.
    """
    shared = sorted(set(best_rounds) & set(other_rounds))
    if len(shared) < MIN_ROUNDS:
        return None
    _, lo, hi = t_ci([best_rounds[r] - other_rounds[r] for r in shared], confidence)
    return lo <= 0 <= hi


def paired_t_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences a[i] - b[i] (same round) and its t interval."""
    return t_ci(_paired(a, b), confidence)


def welch_t_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its Welch (unequal variances) t interval."""
    from scipy.stats import t as student_t

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        raise ValueError("Welch's interval needs at least two values per side")
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    delta = float(xa.mean() - xb.mean())
    se = float(np.sqrt(va + vb))
    if se == 0:
        return delta, delta, delta
    dof = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    half = float(student_t.ppf(0.5 + confidence / 2, dof) * se)
    return delta, delta - half, delta + half


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value (1.0 when either sample has fewer than 2 values)."""
    from scipy.stats import mannwhitneyu

    if len(a) < 2 or len(b) < 2:
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def verdict(delta_lo: float, delta_hi: float) -> str:
    """For a latency difference (cell - baseline): faster, slower or no significant difference."""
    if delta_hi < 0:
        return FASTER
    if delta_lo > 0:
        return SLOWER
    return NO_DIFFERENCE
