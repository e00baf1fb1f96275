"""Acceptance in the forms engines and profilers print, each with its convention.

One cycle drafts k tokens, verifies them in one target forward of k+1 tokens and always
emits one more token from the target (the correction or "bonus" token), so

    tau(k) = 1 + sum_{i=1..k} p_i          tokens per cycle (plain decoding: 1.0)

where p_i is the probability that drafts 1..i are all accepted ("reach", non-increasing).
With one iid per-token rate a, p_i = a^i and tau(k) = (1 - a^(k+1)) / (1 - a).

Conventions (all per verify cycle, topk 1):

- accept length, bonus token INCLUDED (`--accept-len L@K`): SGLang's `accept len`
  (python/sglang/srt/managers/scheduler_metrics_mixin.py, `update_spec_metrics` adds
  accepted drafts + bs per batch of bs requests) and vLLM's "Mean acceptance length"
  (vllm/v1/spec_decode/metrics.py: 1 + accepted / drafts). L = tau.
- accepted drafts per cycle, bonus token NOT counted (`--accepted-drafts A@K`): what a
  per-cycle profiler counts (the public Kimi-K2.5 report's "Accept len: 0.95"). L = A + 1.
- SGLang's `accept rate` (`--sglang-accept-rate R@K`): its meaning changed. In
  log_decode_stats (same file) sgl-project/sglang PR #11572 (merged 2025-10-13) made it
  accepted tokens / (forwards x speculative_num_draft_tokens) = L / (k + 1), bonus in the
  numerator (before it, the rate could exceed 1); PR #13212 (2025-11-13) only fixed the
  draft-token count; PR #23530 (merged 2026-04-23) changed it to accepted drafts /
  proposed drafts = (L - 1) / k. Releases cut between those merges print L / (k + 1),
  later ones (L - 1) / k. The public report's `accept len: 1.62, accept rate: 0.27` at 5
  steps is 1.62 / 6: the earlier form. Given an accept length at the same K the
  convention is inferred from the pair; otherwise it must be named.
- vLLM's draft acceptance rate (`--vllm-acceptance-rate R@K`): accepted / drafted =
  (L - 1) / k; its per-position counters spec_decode_num_accepted_tokens_per_pos /
  spec_decode_num_drafts are p_1..p_k (`--accept-per-pos`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

SGLANG_RATE_DRAFTS = "drafts"  # (L - 1) / k: SGLang after PR #23530 (2026-04-23)
SGLANG_RATE_TOTAL = "total"  # L / (k + 1): SGLang from PR #11572 (2025-10-13) to #23530
SGLANG_RATE_AUTO = "auto"  # infer from an accept length at the same K
SGLANG_CONVENTION_WORDS = {
    SGLANG_RATE_DRAFTS: "(L - 1) / k, SGLang after PR #23530 (2026-04-23)",
    SGLANG_RATE_TOTAL: "L / (k + 1), SGLang from PR #11572 (2025-10-13) until PR #23530",
}
CONVENTION_ACCEPT_LEN = "accept length, bonus token included (SGLang accept len, vLLM mean acceptance length)"
CONVENTION_DRAFTS = "accepted drafts per cycle, bonus token not counted (profiler): accept length = A + 1"
CONVENTION_VLLM_RATE = "vLLM draft acceptance rate, accepted / drafted: accept length = 1 + R x k"
CONVENTION_PER_POS = (
    "per-position acceptance p_i (vLLM spec_decode_num_accepted_tokens_per_pos / spec_decode_num_drafts)"
)
CONVENTION_IID = "iid per-token acceptance probability (none of the engines' averages)"
# the order in which acceptance figures at the same K are trusted when they disagree and
# no measured tok/s decides: a per-cycle count first, then the engines' accept lengths
SOURCE_PRIORITY = ("--accepted-drafts", "--accept-len", "--vllm-acceptance-rate", "--sglang-accept-rate", "--fit")


# ---------------------------------------------------------------- tokens per cycle


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate <= 1.0:  # NaN fails this too
        raise ValueError(f"an acceptance probability must be in [0, 1], got {rate}")


def tau_iid(rate: float, k: int) -> float:
    """Tokens per cycle with iid per-token acceptance `rate` and k draft steps."""
    _check_rate(rate)
    if k < 0:
        raise ValueError("k must be >= 0")
    if rate == 1.0:
        return float(k + 1)
    if rate == 0.0:
        return 1.0
    # expm1/log1p: the plain (1 - a^(k+1)) / (1 - a) cancels catastrophically as a -> 1
    log_rate = math.log1p(rate - 1.0) if rate > 0.5 else math.log(rate)
    return math.expm1((k + 1) * log_rate) / math.expm1(log_rate)


def tau_from_reach(reach: Sequence[float], k: int | None = None) -> float:
    """Tokens per cycle from per-position reach probabilities p_1..p_k."""
    values = list(reach)
    k = len(values) if k is None else k
    if k > len(values):
        raise ValueError(f"{k} steps need {k} per-position rates, got {len(values)}")
    for value in values[:k]:
        _check_rate(value)
    return 1.0 + sum(values[:k])


def reach_from_conditional(rates: Sequence[float]) -> list[float]:
    """p_i = product of the conditional acceptance rates c_1..c_i."""
    out, product = [], 1.0
    for rate in rates:
        _check_rate(rate)
        product *= rate
        out.append(product)
    return out


def iid_rate_from_accept_len(accept_len: float, k: int) -> float:
    """The iid per-token rate a with tau_iid(a, k) == accept_len (bonus counted, in [1, k+1])."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if not 1.0 <= accept_len <= k + 1:
        raise ValueError(
            f"an accept length at {k} steps must lie in [1, {k + 1}] (it counts the bonus token), got {accept_len:g}"
        )
    return _segment_ratio(1.0, k, accept_len - 1.0)


def _segment_ratio(start: float, steps: int, total: float) -> float:
    """r in [0, 1] with sum_{m=1..steps} start x r^m == total (bisection; clamped)."""
    if total <= 0 or start <= 0:
        return 0.0
    if total >= steps * start:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if start * sum(mid**m for m in range(1, steps + 1)) < total:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def simulate_cycles(conditional: Sequence[float], cycles: int, seed: int = 0) -> float:
    """Mean tokens per cycle from accept/reject draws (accept drafts in order until the
    first rejection, then the target's one token): a check of the closed forms."""
    rng = random.Random(seed)
    total = 0
    for _ in range(cycles):
        accepted = 0
        for rate in conditional:
            if rng.random() >= rate:
                break
            accepted += 1
        total += accepted + 1
    return total / cycles


# ---------------------------------------------------------------- conventions


def accept_len_from_sglang_rate(rate: float, k: int, variant: str = SGLANG_RATE_DRAFTS) -> float:
    """SGLang `accept rate` at k steps (topk 1) -> accept length, under `variant`."""
    if variant == SGLANG_RATE_DRAFTS:
        return 1.0 + rate * k
    if variant == SGLANG_RATE_TOTAL:
        return rate * (k + 1)
    raise ValueError(f"unknown SGLang accept-rate variant '{variant}'")


def sglang_accept_rate(accept_len: float, k: int, variant: str = SGLANG_RATE_DRAFTS) -> float:
    """Accept length at k steps -> the `accept rate` SGLang would log under `variant`."""
    if variant == SGLANG_RATE_DRAFTS:
        return (accept_len - 1.0) / k
    if variant == SGLANG_RATE_TOTAL:
        return accept_len / (k + 1)
    raise ValueError(f"unknown SGLang accept-rate variant '{variant}'")


def accept_len_from_vllm(mean_acceptance_length: float) -> float:
    """vLLM's mean acceptance length already counts the bonus token: it is tau."""
    return float(mean_acceptance_length)


def vllm_draft_acceptance_rate(accept_len: float, k: int) -> float:
    """vLLM's draft acceptance rate (accepted / drafted) for tau at k steps."""
    return (accept_len - 1.0) / k


def accept_len_from_vllm_rate(draft_acceptance_rate: float, k: int) -> float:
    """tau from vLLM's draft acceptance rate at k steps."""
    return 1.0 + draft_acceptance_rate * k


def conventions_at(tau: float, k: int) -> dict:
    """tau at k steps in every engine's convention (what each would print)."""
    return {
        "k": k,
        "accept_len": tau,
        "accepted_drafts": tau - 1.0,
        "sglang_accept_rate": sglang_accept_rate(tau, k, SGLANG_RATE_DRAFTS) if k else None,
        "sglang_accept_rate_total": sglang_accept_rate(tau, k, SGLANG_RATE_TOTAL) if k else None,
        "vllm_mean_acceptance_length": tau,
        "vllm_draft_acceptance_rate": vllm_draft_acceptance_rate(tau, k) if k else None,
    }


RATE_MATCH_ABS = 0.006  # logs print rates to 2 decimals: half a unit plus float slack


def infer_sglang_convention(accept_len: float, rate: float, k: int) -> tuple[str | None, dict]:
    """Which SGLang convention turns `accept_len` at k steps into `rate`.

    Returns (variant or None when neither or both match, {variant: the rate it predicts}).
    SGLang prints both to 2 decimals, so a match is within RATE_MATCH_ABS.
    """
    predicted = {v: sglang_accept_rate(accept_len, k, v) for v in (SGLANG_RATE_DRAFTS, SGLANG_RATE_TOTAL)}
    matches = [v for v, p in predicted.items() if abs(p - rate) <= RATE_MATCH_ABS]
    return (matches[0] if len(matches) == 1 else None), predicted


# ---------------------------------------------------------------- acceptance model


@dataclass(frozen=True)
class AcceptancePoint:
    """One accept length (bonus included) at k steps, and what it was read from."""

    k: int
    accept_len: float
    source: str  # the option as given, e.g. "--accepted-drafts 0.95@5"
    convention: str
    half: float = 0.0  # half-width of the accept length's interval, when given (+-H)

    @property
    def option(self) -> str:
        """The option name of the source."""
        return self.source.split(" ", 1)[0]


def reach_from_points(points: Sequence[tuple[int, float]], max_k: int) -> tuple[list[float], list[str]]:
    """Per-position reach p_1..p_max_k that meets every (k, accept length) point.

    Between given step counts (and from k = 0, tau = 1) the reach decays geometrically
    with a ratio solved so that tau matches at each given k; with one point this is the
    iid closed form; beyond the last point the last ratio continues. Returns (reach,
    notes on points that no non-increasing reach can meet).
    """
    reach: list[float] = []
    notes: list[str] = []
    prev_k, prev_tau, prev_p, ratio = 0, 1.0, 1.0, 0.0
    for k, length in sorted(points):
        steps, gain = k - prev_k, length - prev_tau
        if gain < -1e-9:
            notes.append(
                f"accept length {length:g} at k = {k} is below {prev_tau:g} at k = {prev_k}: "
                "tokens per cycle cannot fall with more drafts"
            )
        elif gain > steps * prev_p + 1e-9:
            notes.append(
                f"accept length {length:g} at k = {k} needs per-position acceptance to rise "
                f"after k = {prev_k}: the inputs disagree"
            )
        ratio = _segment_ratio(prev_p, steps, gain)
        reach.extend(prev_p * ratio**m for m in range(1, steps + 1))
        prev_k, prev_tau, prev_p = k, prev_tau + sum(reach[-steps:]), reach[-1]
    while len(reach) < max_k:
        reach.append(reach[-1] * ratio if reach else 0.0)
    return reach[: max(max_k, len(reach))], notes


@dataclass
class Acceptance:
    """Tokens per cycle at every k, from what was measured, with its convention stated."""

    description: str
    convention: str
    reach: tuple[float, ...] | None = None  # p_1.. (per-position given or fitted)
    rate: float | None = None  # iid per-token rate, when the model is iid
    points: list[AcceptancePoint] = field(default_factory=list)  # the accept lengths used
    alternatives: list[AcceptancePoint] = field(default_factory=list)  # disagreeing ones left out
    limit_k: int | None = None  # per-position input covers no more steps than this
    notes: list[str] = field(default_factory=list)

    @property
    def max_k(self) -> int | None:
        """The largest k this acceptance can speak for (None: any)."""
        return self.limit_k

    def tau(self, k: int) -> float:
        """Tokens per cycle at k draft steps."""
        if k == 0:
            return 1.0
        if self.rate is not None and self.reach is None:
            return tau_iid(self.rate, k)
        if self.limit_k is not None and k > self.limit_k:
            raise ValueError(f"per-position acceptance covers {self.limit_k} steps, not {k}")
        return tau_from_reach(self.reach, k)

    def at(self, k: int) -> AcceptancePoint | None:
        """The given accept length at exactly k steps, if any."""
        return next((p for p in self.points if p.k == k), None)

    def to_dict(self) -> dict:
        """JSON-ready form (key `convention` states how the inputs were read)."""
        return {
            "description": self.description,
            "convention": self.convention,
            "iid_rate": self.rate,
            "per_position": list(self.reach[:16]) if self.reach is not None else None,
            "points": [
                {"k": p.k, "accept_len": p.accept_len, "source": p.source, "convention": p.convention}
                for p in self.points
            ],
            "left_out": [{"k": p.k, "accept_len": p.accept_len, "source": p.source} for p in self.alternatives],
            "notes": self.notes,
        }


def from_iid_rate(rate: float) -> Acceptance:
    """Acceptance from an iid per-token rate."""
    _check_rate(rate)
    return Acceptance(f"iid per-token acceptance {rate:g} (given)", CONVENTION_IID, rate=rate)


def from_per_position(reach: Sequence[float]) -> Acceptance:
    """Acceptance from per-position reach p_1..p_n (non-increasing)."""
    reach = tuple(float(v) for v in reach)
    for value in reach:
        _check_rate(value)
    if any(b > a + 1e-12 for a, b in zip(reach, reach[1:])):
        raise ValueError(
            "per-position acceptance (the share of drafts accepted up to each position) cannot rise with the position"
        )
    return Acceptance(
        "per-position acceptance " + ", ".join(f"{p:g}" for p in reach) + " (position-dependent tau = 1 + sum p_i)",
        CONVENTION_PER_POS,
        reach=reach,
        limit_k=len(reach),
    )


def from_points(points: Sequence[AcceptancePoint], max_k: int, prefer: dict[int, float] | None = None) -> Acceptance:
    """Acceptance from accept lengths at one or more k (one used per k).

    Several figures at the same k: those agreeing within 2% are one; when they disagree
    the one nearest `prefer[k]` (the accept length a measured tok/s implies) is used,
    else the first by SOURCE_PRIORITY, and the others are kept in `alternatives`.
    """
    by_k: dict[int, list[AcceptancePoint]] = {}
    for p in points:
        by_k.setdefault(p.k, []).append(p)
    used, left_out, notes = [], [], []
    for k, group in sorted(by_k.items()):
        if prefer and k in prefer:
            group = sorted(group, key=lambda p: abs(p.accept_len - prefer[k]))
            reason = "the measured tok/s at this k supports it"
        else:
            group = sorted(
                group,
                key=lambda p: SOURCE_PRIORITY.index(p.option) if p.option in SOURCE_PRIORITY else len(SOURCE_PRIORITY),
            )
            reason = "no measured tok/s at this k decides; the measured sweep does"
        chosen = group[0]
        used.append(chosen)
        for other in group[1:]:
            if abs(other.accept_len - chosen.accept_len) > 0.02 * chosen.accept_len:
                left_out.append(other)
                notes.append(
                    f"at k = {k}: {other.source} (accept length {other.accept_len:.3f}) "
                    f"disagrees with {chosen.source} ({chosen.accept_len:.3f}); planned "
                    f"with the latter ({reason})"
                )
    reach, shape_notes = reach_from_points([(p.k, p.accept_len) for p in used], max_k)
    if len(used) == 1:
        p = used[0]
        rate = iid_rate_from_accept_len(min(max(p.accept_len, 1.0), p.k + 1), p.k)
        desc = (
            f"accept length {p.accept_len:.3f} at {p.k} steps from {p.source} ({p.convention}); "
            f"one (length, k) pair: iid closed form, per-token acceptance {rate:.3f}"
        )
        return Acceptance(
            desc, p.convention, reach=None, rate=rate, points=used, alternatives=left_out, notes=notes + shape_notes
        )
    desc = (
        "accept lengths "
        + ", ".join(f"{p.accept_len:.3f}@{p.k} ({p.source})" for p in used)
        + "; position-dependent: reach decays geometrically between the given k, matching each"
    )
    conventions = "; ".join(sorted({p.convention for p in used}))
    return Acceptance(
        desc, conventions, reach=tuple(reach), points=used, alternatives=left_out, notes=notes + shape_notes
    )
