"""Per-token time in collectives: layers x collectives x latency(message bytes).

A decode step of a tensor-parallel transformer runs `collectives_per_forward` allreduces
(2 per layer: attention out-projection and MLP/MoE down-projection; plus 1 extra, the
vocab-parallel embedding, as SGLang does for DeepSeek-V3/Kimi-K2 style models under plain
TP), each of `tokens x hidden x dtype` bytes, where tokens = batch x tokens per forward
(1 for plain decode, k+1 for a k-step speculative verify).

Latency at a size comes from measured points, interpolated linearly in
log(bytes)-log(latency). Outside the measured range it refuses (OutOfRangeError) unless
asked to extrapolate, and callers then say so.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable

DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
               "fp32": 4, "float32": 4, "float": 4, "fp8": 1, "int8": 1, "uint8": 1}


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
class LatencyCurve:
    """Latency (us) against message bytes, from measured (or modelled) points."""

    points: tuple[tuple[int, float], ...]
    label: str = ""

    @classmethod
    def from_points(cls, points: Iterable[tuple[int, float]], label: str = "") -> "LatencyCurve":
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
                    "allow extrapolation")
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


def comm_time_us(curve: LatencyCurve, tokens: int, layers: int, hidden: int,
                 dtype: str = "bf16", per_layer: int = 2, extra: int = 1,
                 extrapolate: bool = False) -> float:
    """Time (us) one forward pass of `tokens` tokens spends in allreduces."""
    nbytes = message_bytes(tokens, hidden, dtype)
    return collectives_per_forward(layers, per_layer, extra) * curve.at(nbytes, extrapolate)


def predicted_saving_ms(baseline: LatencyCurve, profile: LatencyCurve, tokens: int,
                        layers: int, hidden: int, dtype: str = "bf16", per_layer: int = 2,
                        extra: int = 1, extrapolate: bool = False) -> float:
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
