"""Speculative decoding model: tokens per verify cycle, cycle time, the best step count.

One cycle drafts k tokens (k draft steps), verifies them in one target forward of k+1
tokens (the last accepted token plus the k drafts; SGLang with topk 1 calls k+1 its
`speculative_num_draft_tokens`), accepts a prefix, and always emits one more token from
the target (the correction or "bonus" token). So

    tau(k) = 1 + sum_{i=1..k} p_i          tokens per cycle (plain decoding: 1.0)

where p_i is the probability that draft position i is accepted, i.e. that drafts 1..i
all are ("reach" probabilities, non-increasing). With one per-token acceptance rate a,
p_i = a^i and tau(k) = (1 - a^(k+1)) / (1 - a). Throughput = tau(k) / cycle time with

    cycle(k) = k * t_draft_step + t_verify(k + 1) + t_other.

Conventions of the tools people read these numbers from (all counted per cycle):

- SGLang `accept len` (scheduler log "Decode batch ... accept len: L"): accepted tokens
  per verify forward, bonus included: `update_spec_metrics` adds
  `num_accepted_tokens + bs` per batch of bs requests, so L = tau and plain decoding
  would be 1.0 (sgl-project/sglang python/sglang/srt/managers/scheduler_metrics_mixin.py).
- SGLang `accept rate`: its definition changed between releases. Recent releases log
  (accepted - forwards) / (forwards * (num_draft_tokens - 1)) = (L - 1) / k; some
  earlier ones logged accepted / (forwards * num_draft_tokens) = L / (k + 1), bonus in
  the numerator (same file, different commits). `sglang_accept_rate` takes the variant.
- vLLM "Mean acceptance length" (SpecDecoding metrics log, vllm/v1/spec_decode/metrics.py):
  1 + accepted / drafts, "conventionally including the bonus token", so it equals tau;
  its "Per-position acceptance rate" is accepted-at-position-i / drafts, which is p_i;
  its "Avg Draft acceptance rate" is accepted / drafted = (tau - 1) / k.

The acceptance rate `a` this module's iid model uses is none of those averages: it is
the chance that one more draft token is accepted given the ones before it were. Use
`iid_rate_from_accept_len(L, k)` to get it from a measured accept length at k steps.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

SGLANG_RATE_DRAFTS = "drafts"  # (L - 1) / k: recent SGLang
SGLANG_RATE_TOTAL = "total"  # L / (k + 1): earlier SGLang


# ---------------------------------------------------------------- tokens per cycle

def tau_iid(rate: float, k: int) -> float:
    """Tokens per cycle with iid per-token acceptance `rate` and k draft steps."""
    _check_rate(rate)
    if k < 0:
        raise ValueError("k must be >= 0")
    if rate == 1.0:
        return float(k + 1)
    # (1 - a^(k+1)) / (1 - a) via expm1/log1p: the plain form cancels catastrophically as
    # a nears 1 (a = 1 - 1e-16 would give tau off by ~1e-8 and the inverse off by more).
    if rate == 0.0:
        return 1.0
    log_rate = math.log1p(rate - 1.0) if rate > 0.5 else math.log(rate)
    return math.expm1((k + 1) * log_rate) / math.expm1(log_rate)


def tau_from_reach(reach: Sequence[float], k: int | None = None) -> float:
    """Tokens per cycle from per-position reach probabilities p_1..p_k (vLLM's per-position rates)."""
    values = list(reach)
    if k is None:
        k = len(values)
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


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"an acceptance probability must be in [0, 1], got {rate}")


def iid_rate_from_accept_len(accept_len: float, k: int) -> float:
    """The iid per-token rate a with tau_iid(a, k) == accept_len (bisection).

    `accept_len` counts the bonus token, so it lies in [1, k + 1].
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    if not 1.0 <= accept_len <= k + 1:
        raise ValueError(f"an accept length at {k} steps must lie in [1, {k + 1}] (it counts the "
                         f"bonus token), got {accept_len}")
    if accept_len == k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if tau_iid(mid, k) < accept_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ---------------------------------------------------------------- tool conventions

def accept_len_from_sglang_rate(rate: float, k: int, variant: str = SGLANG_RATE_DRAFTS) -> float:
    """SGLang `accept rate` at k steps (topk 1) -> accept length (tau)."""
    if variant == SGLANG_RATE_DRAFTS:
        return 1.0 + rate * k
    if variant == SGLANG_RATE_TOTAL:
        return rate * (k + 1)
    raise ValueError(f"unknown SGLang accept-rate variant '{variant}'")


def sglang_accept_rate(accept_len: float, k: int, variant: str = SGLANG_RATE_DRAFTS) -> float:
    """Accept length (tau) at k steps -> the `accept rate` SGLang would log."""
    if variant == SGLANG_RATE_DRAFTS:
        return (accept_len - 1.0) / k
    if variant == SGLANG_RATE_TOTAL:
        return accept_len / (k + 1)
    raise ValueError(f"unknown SGLang accept-rate variant '{variant}'")


def accept_len_from_vllm(mean_acceptance_length: float) -> float:
    """vLLM's mean acceptance length already counts the bonus token: it is tau."""
    return float(mean_acceptance_length)


def vllm_draft_acceptance_rate(accept_len: float, k: int) -> float:
    """vLLM's "Avg Draft acceptance rate" (accepted / drafted) for tau at k steps."""
    return (accept_len - 1.0) / k


def accept_len_from_vllm_rate(draft_acceptance_rate: float, k: int) -> float:
    """tau from vLLM's "Avg Draft acceptance rate" at k steps."""
    return 1.0 + draft_acceptance_rate * k


# ---------------------------------------------------------------- Monte-Carlo check

def simulate_cycles(conditional: Sequence[float], cycles: int, seed: int = 0) -> float:
    """Mean tokens per cycle from accept/reject draws: accept drafts in order until the
    first rejection, then add the target's one token. For checking the closed forms."""
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


# ---------------------------------------------------------------- verify cost

@dataclass(frozen=True)
class MeasuredVerify:
    """Verify time (ms) measured at some token counts; linear in tokens between them.

    One point means flat (the verify costs the same for any token count, as for a dense
    model whose forward is memory-bound); beyond the points it extrapolates linearly
    from the last two and `extrapolated` says so.
    """

    points: tuple[tuple[int, float], ...]

    @classmethod
    def from_lists(cls, tokens: Sequence[int], ms: Sequence[float]) -> "MeasuredVerify":
        """Build from parallel lists; tokens must be positive and distinct, times positive."""
        if len(tokens) != len(ms) or not tokens:
            raise ValueError("give one verify time per token count")
        pairs = sorted(zip((int(t) for t in tokens), (float(m) for m in ms)))
        if any(t <= 0 for t, _ in pairs) or any(not m > 0 for _, m in pairs):
            raise ValueError("token counts and verify times must be positive")
        if len({t for t, _ in pairs}) != len(pairs):
            raise ValueError("token counts must be distinct")
        return cls(tuple(pairs))

    def extrapolated(self, tokens: int) -> bool:
        """True when `tokens` lies outside the measured token counts (and there are >= 2)."""
        return len(self.points) > 1 and not self.points[0][0] <= tokens <= self.points[-1][0]

    def __call__(self, tokens: int) -> float:
        pts = self.points
        if len(pts) == 1:
            return pts[0][1]
        if tokens <= pts[0][0]:
            (t0, m0), (t1, m1) = pts[0], pts[1]
        elif tokens >= pts[-1][0]:
            (t0, m0), (t1, m1) = pts[-2], pts[-1]
        else:
            i = next(j for j, (t, _) in enumerate(pts) if t >= tokens)
            (t0, m0), (t1, m1) = pts[i - 1], pts[i]
        return max(0.0, m0 + (m1 - m0) * (tokens - t0) / (t1 - t0))


@dataclass(frozen=True)
class ModelledVerify:
    """Verify time = compute_fixed + compute_per_token x n + comm(n) (ms).

    comm(n) is the collectives time of a forward of n tokens (nccl_tune.model), so a
    profile that changes latency at the verify sizes changes the verify cost.
    """

    compute_fixed_ms: float
    compute_per_token_ms: float
    comm_ms: Callable[[int], float]

    def extrapolated(self, tokens: int) -> bool:
        """A model covers every token count its comm(n) covers."""
        return False

    def __call__(self, tokens: int) -> float:
        return self.compute_fixed_ms + self.compute_per_token_ms * tokens + self.comm_ms(tokens)


# ---------------------------------------------------------------- planning

@dataclass(frozen=True)
class StepPlan:
    """One step count's cycle."""

    k: int
    tau: float
    draft_ms: float
    verify_ms: float
    other_ms: float
    cycle_ms: float
    tok_s: float
    extrapolated: bool = False


def cycle_ms(k: int, draft_step_ms: float, verify_ms: float, other_ms: float = 0.0) -> float:
    """k x draft step + verify(k+1) + other."""
    return k * draft_step_ms + verify_ms + other_ms


def plan_steps(steps: Sequence[int], tau: Callable[[int], float], draft_step_ms: float,
               verify: Callable[[int], float], other_ms: float = 0.0) -> list[StepPlan]:
    """One StepPlan per k in `steps` (k = 0 is plain decoding: tau 1, a forward of 1 token).

    `verify(n)` is the time of a target forward of n tokens per sequence (n = k + 1).
    """
    out = []
    for k in steps:
        if k < 0:
            raise ValueError("step counts must be >= 0")
        tokens = k + 1
        t_verify = verify(tokens)
        t_tau = 1.0 if k == 0 else tau(k)
        t_cycle = cycle_ms(k, draft_step_ms, t_verify, other_ms)
        if t_cycle <= 0:
            raise ValueError("a cycle must take positive time")
        extrap = bool(getattr(verify, "extrapolated", lambda n: False)(tokens))
        out.append(StepPlan(k, t_tau, k * draft_step_ms, t_verify, other_ms, t_cycle,
                            1000.0 * t_tau / t_cycle, extrap))
    return out


def best_step(plans: Sequence[StepPlan]) -> StepPlan:
    """The plan with the highest tok/s (fewer steps on a tie)."""
    if not plans:
        raise ValueError("no step counts to choose from")
    return max(plans, key=lambda p: (round(p.tok_s, 9), -p.k))


MAX_STEPS = 64  # more draft steps than this is not a plan (SGLang sweeps 1..10)


def parse_steps(text: str, option: str = "--steps") -> list[int]:
    """'1-10', '2,4,6' or '1-3,8' -> sorted distinct step counts.

    ValueError naming `option` on bad text. Bounds are checked on each item before a
    range is expanded, so '1-99999999999999' is refused at once instead of building it.
    """
    def bad(why: str) -> ValueError:
        return ValueError(f"{option} '{text}': {why}")

    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise bad("empty item")
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise bad(f"'{part}' is not a step count or a range like 1-10") from None
        if lo < 1:
            raise bad("step counts start at 1")
        if hi > MAX_STEPS:
            raise bad(f"more than {MAX_STEPS} draft steps is not a plan")
        if lo > hi:
            raise bad(f"range '{part}' runs backwards")
        out.update(range(lo, hi + 1))
    return sorted(out)


def parse_at(text: str, what: str) -> tuple[list[float], list[int] | None]:
    """'V' -> ([V], None); 'V1,V2@T1,T2' or 'L@K' -> ([...], [...]); ValueError naming `what`."""
    values_text, _, at_text = text.partition("@")
    try:
        values = [float(v) for v in values_text.split(",")]
        at = [int(t) for t in at_text.split(",")] if at_text else None
    except ValueError:
        raise ValueError(f"cannot read {what} '{text}'") from None
    if at is not None and len(at) != len(values):
        raise ValueError(f"{what} '{text}': {len(values)} value(s) but {len(at)} position(s)")
    if any(math.isnan(v) or math.isinf(v) for v in values):
        raise ValueError(f"{what} '{text}' is not a finite number")
    return values, at


def verify_from_option(text: str, option: str = "--verify-ms") -> MeasuredVerify:
    """'V' (flat) or 'V1,V2,...@T1,T2,...' -> MeasuredVerify; ValueError naming `option`."""
    values, at = parse_at(text, option)
    if at is None and len(values) != 1:
        raise ValueError(f"{option} '{text}': several values need @T1,T2,... (the tokens per "
                         "sequence, k+1, each was measured at)")
    try:
        return MeasuredVerify.from_lists(at or [1], values)
    except ValueError as exc:
        raise ValueError(f"{option} '{text}': {exc}") from None


# ---------------------------------------------------------------- acceptance from user input

@dataclass(frozen=True)
class Acceptance:
    """How tokens per cycle follow from what the user measured."""

    description: str
    rate: float | None = None  # iid per-token rate, when the model is iid
    reach: tuple[float, ...] | None = None  # per-position reach probabilities, when given
    accept_len: float | None = None  # the accept length (tau) given or converted, at at_k steps
    at_k: int | None = None

    @property
    def max_k(self) -> int | None:
        """The largest k this acceptance can speak for (None: any)."""
        return len(self.reach) if self.reach is not None else None

    def tau(self, k: int) -> float:
        """Tokens per cycle at k draft steps."""
        if self.reach is not None:
            return tau_from_reach(self.reach, k)
        return tau_iid(self.rate, k)


ACCEPTANCE_OPTIONS = ("--accept-len L@K", "--accept-rate A", "--accept-per-pos P1,P2,...",
                      "--sglang-accept-rate R@K", "--vllm-acceptance-rate R@K")
SGLANG_CONVENTION_WORDS = {SGLANG_RATE_DRAFTS: "(L - 1) / k, recent SGLang",
                           SGLANG_RATE_TOTAL: "L / (k + 1), earlier SGLang"}


def _value_at(text: str, option: str, example: str) -> tuple[float, int]:
    """'R@K' -> (R, K) with K >= 1; ValueError naming `option`."""
    values, at = parse_at(text, option)
    if len(values) != 1 or at is None or len(at) != 1:
        raise ValueError(f"{option} '{text}': expected a value@steps, e.g. {example}")
    if at[0] < 1:
        raise ValueError(f"{option} '{text}': the step count after @ must be >= 1")
    return values[0], at[0]


def _from_accept_len(length: float, k: int, option: str, text: str, how: str) -> Acceptance:
    try:
        rate = iid_rate_from_accept_len(length, k)
    except ValueError as exc:
        raise ValueError(f"{option} '{text}': {exc}") from None
    return Acceptance(f"{how} -> iid per-token acceptance {rate:.3f}", rate=rate, accept_len=length,
                      at_k=k)


def acceptance_from_options(accept_len: str | None = None, accept_rate: float | None = None,
                            accept_per_pos: str | None = None,
                            sglang_accept_rate: str | None = None,
                            vllm_acceptance_rate: str | None = None,
                            sglang_convention: str = SGLANG_RATE_DRAFTS) -> Acceptance:
    """Exactly one of: 'L@K' (accept length counting the bonus token, measured at K
    steps: SGLang's accept len, vLLM's mean acceptance length), an iid per-token rate,
    per-position rates 'p1,p2,...' (vLLM's per-position acceptance rate), SGLang's
    averaged `accept rate` 'R@K' (under `sglang_convention`, see the module doc), or
    vLLM's draft acceptance rate 'R@K' (accepted / drafted). ValueError naming the option.
    """
    given = [x is not None for x in (accept_len, accept_rate, accept_per_pos, sglang_accept_rate,
                                     vllm_acceptance_rate)]
    if sum(given) != 1:
        raise ValueError("give exactly one of " + ", ".join(ACCEPTANCE_OPTIONS))
    if accept_len is not None:
        length, k = _value_at(accept_len, "--accept-len", "3.2@4 (accept length 3.2, bonus token "
                              "included, measured with 4 draft steps)")
        return _from_accept_len(length, k, "--accept-len", accept_len,
                                f"accept length {length:g} at {k} steps (bonus token included)")
    if sglang_accept_rate is not None:
        option = "--sglang-accept-rate"
        if sglang_convention not in SGLANG_CONVENTION_WORDS:
            raise ValueError(f"unknown SGLang accept-rate convention '{sglang_convention}' "
                             f"(known: {', '.join(SGLANG_CONVENTION_WORDS)})")
        value, k = _value_at(sglang_accept_rate, option, "0.7@3 (SGLang's accept rate 0.7 with 3 "
                             "draft steps)")
        _check_option_rate(value, option, sglang_accept_rate)
        length = accept_len_from_sglang_rate(value, k, sglang_convention)
        return _from_accept_len(length, k, option, sglang_accept_rate,
                                f"SGLang accept rate {value:g} at {k} steps "
                                f"({SGLANG_CONVENTION_WORDS[sglang_convention]}) -> accept length "
                                f"{length:.3f}")
    if vllm_acceptance_rate is not None:
        option = "--vllm-acceptance-rate"
        value, k = _value_at(vllm_acceptance_rate, option, "0.6@4 (vLLM's draft acceptance rate "
                             "0.6 with 4 speculative tokens)")
        _check_option_rate(value, option, vllm_acceptance_rate)
        length = accept_len_from_vllm_rate(value, k)
        return _from_accept_len(length, k, option, vllm_acceptance_rate,
                                f"vLLM draft acceptance rate {value:g} at {k} steps (accepted / "
                                f"drafted) -> accept length {length:.3f}")
    if accept_rate is not None:
        _check_option_rate(accept_rate, "--accept-rate", str(accept_rate))
        return Acceptance(f"iid per-token acceptance {accept_rate:g} (given)", rate=accept_rate)
    try:
        reach = tuple(float(v) for v in accept_per_pos.split(","))
    except ValueError:
        raise ValueError(f"cannot read --accept-per-pos '{accept_per_pos}'") from None
    for value in reach:
        _check_option_rate(value, "--accept-per-pos", accept_per_pos)
    if any(b > a + 1e-12 for a, b in zip(reach, reach[1:])):
        raise ValueError(f"--accept-per-pos '{accept_per_pos}': per-position acceptance (the share "
                         "of drafts accepted up to each position) cannot rise with the position")
    return Acceptance(f"per-position acceptance {', '.join(f'{p:g}' for p in reach)} "
                      "(vLLM's per-position rates)", reach=reach)


def _check_option_rate(value: float, option: str, text: str) -> None:
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"{option} '{text}': an acceptance rate must be in [0, 1], got {value:g}")


# ---------------------------------------------------------------- profiles compared

@dataclass
class SpecComparison:
    """Step plans under the baseline and the recommended cell."""

    baseline: list  # specdec.StepPlan, k = 0 (plain decoding) first
    recommended: list | None
    assumptions: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # step counts whose verify size is unmeasured
    # step counts left out because --verify-ms was not measured at their token count
    skipped_verify: list[int] = field(default_factory=list)
    # with extrapolation allowed: verify message sizes (bytes) beyond the measured latency
    # sizes, and verify token counts beyond the --verify-ms points, each with its k
    extrapolated_bytes: dict = field(default_factory=dict)  # k -> bytes
    extrapolated_tokens: dict = field(default_factory=dict)  # k -> tokens per sequence

    def best(self, which: str):
        """Best StepPlan among k >= 1 for 'baseline' or 'recommended' (None if absent)."""
        plans = [p for p in (getattr(self, which) or []) if p.k >= 1]
        return best_step(plans) if plans else None

    def extrapolation_note(self) -> str | None:
        """One line naming what was extrapolated, or None."""
        parts = []
        if self.extrapolated_bytes:
            parts.append("allreduce latency at " + ", ".join(
                f"{b} B (k = {k})" for k, b in sorted(self.extrapolated_bytes.items()))
                + " beyond the measured sizes")
        if self.extrapolated_tokens:
            parts.append("verify time at " + ", ".join(
                f"{t} tokens (k = {k})" for k, t in sorted(self.extrapolated_tokens.items()))
                + " beyond the --verify-ms points")
        if not parts:
            return None
        return "EXTRAPOLATED (--extrapolate; rows marked *): " + "; ".join(parts)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        def plans(which):
            rows = getattr(self, which)
            return [asdict(p) for p in rows] if rows is not None else None
        best_b, best_r = self.best("baseline"), self.best("recommended")
        return {"baseline": plans("baseline"), "recommended": plans("recommended"),
                "best_k_baseline": best_b.k if best_b else None,
                "best_tok_s_baseline": best_b.tok_s if best_b else None,
                "best_k_recommended": best_r.k if best_r else None,
                "best_tok_s_recommended": best_r.tok_s if best_r else None,
                "assumptions": self.assumptions, "skipped_steps": self.skipped,
                "skipped_steps_verify": self.skipped_verify,
                "extrapolated_bytes": {str(k): b for k, b in sorted(self.extrapolated_bytes.items())},
                "extrapolated_verify_tokens": {str(k): t for k, t in
                                               sorted(self.extrapolated_tokens.items())},
                "extrapolation_note": self.extrapolation_note()}


def compare_profiles(analysis, *, steps: list[int], tau, hidden: int, dtype: str, batch: int,
                     layers: int, baseline_tok_s: float | None = None, verify_measured=None,
                     compute_per_token_ms: float = 0.0, draft_ms: float | None = None,
                     draft_collectives: int = 3, other_ms: float = 0.0,
                     extrapolate: bool = False) -> SpecComparison:
    """tau, cycle time and tok/s per step count under the baseline and the recommended cell.

    `analysis` is a recommendation.Analysis (its baseline and recommended latency curves
    and collectives per forward).

    Verify time = compute(n) + comm(n): comm from the baseline's latency curve at
    n x batch x hidden x dtype bytes, minus, under the recommended cell, its saving at that
    size by the table's own estimator (`analysis.saving_ms_at`); compute from the measured verify times under the
    baseline (`verify_measured`, a callable of tokens per sequence) minus the baseline's
    comm, or from the plain decode time 1000 / baseline_tok_s minus its comm, flat in n
    plus `compute_per_token_ms` per extra token. The draft step keeps its compute and
    changes its `draft_collectives` collectives of one token with the profile.
    """
    from nccl_tune.errors import NcclTuneError
    from nccl_tune.model import message_bytes

    if verify_measured is None and baseline_tok_s is None:
        raise NcclTuneError("speculative planning needs a forward time: --baseline-tok-s or "
                            "--verify-ms")
    assumptions: list[str] = []
    base_curve = analysis.baseline.curve
    rec = analysis.recommended
    rec_curve = rec.curve if rec else None

    def lat(curve, tokens):
        return curve.at(message_bytes(tokens * batch, hidden, dtype), extrapolate)

    def comm(curve, tokens):
        return analysis.collectives * lat(curve, tokens) / 1000.0

    curves = [c for c in (base_curve, rec_curve) if c is not None]
    usable, skipped, skipped_verify = [], [], []
    extrap_bytes, extrap_tokens = {}, {}
    for k in [0, *steps]:
        nbytes = message_bytes((k + 1) * batch, hidden, dtype)
        if not all(curve.covers(nbytes) for curve in curves):
            if not extrapolate:
                skipped.append(k)
                continue
            extrap_bytes[k] = nbytes
        if verify_measured is not None and verify_measured.extrapolated(k + 1):
            if not extrapolate:
                skipped_verify.append(k)
                continue
            extrap_tokens[k] = k + 1
        usable.append(k)
    if 0 in skipped:
        raise NcclTuneError("the decode size is outside the measured range (--extrapolate)")
    if 0 in skipped_verify:
        raise NcclTuneError("--verify-ms has no point at 1 token (plain decoding): add one, or "
                            "pass --extrapolate to extrapolate to it")
    if verify_measured is not None:
        def compute(n):
            return verify_measured(n) - comm(base_curve, n)
        assumptions.append("verify compute = measured verify time minus the baseline's collectives "
                           "time (its latency curve) at each token count")
    else:
        decode_ms = 1000.0 / baseline_tok_s
        fixed = decode_ms - comm(base_curve, 1)

        def compute(n):
            return fixed + compute_per_token_ms * (n - 1)
        assumptions.append(f"verify compute = plain decode time ({decode_ms:.3f} ms from "
                           f"--baseline-tok-s) minus its collectives time, "
                           + ("flat in tokens (dense-like; pass --compute-per-token-ms for MoE)"
                              if compute_per_token_ms == 0 else
                              f"+ {compute_per_token_ms} ms per extra token"))
    if compute(1) <= 0:
        raise NcclTuneError("the forward time given is smaller than the collectives time alone: "
                            "check --baseline-tok-s / --verify-ms against the results")
    one_token = lat(base_curve, 1)
    if draft_ms is None:
        draft_base = compute(1) / layers + draft_collectives * one_token / 1000.0
        assumptions.append(f"draft step ASSUMED = one target layer's compute plus "
                           f"{draft_collectives} collectives ({draft_base:.3f} ms); pass "
                           "--draft-ms to use a measured one")
    else:
        draft_base = draft_ms

    savings: dict[int, float] = {}

    def saving(tokens):
        # ms per forward the recommended cell saves, by the same estimator as the main
        # table (Analysis.saving_ms_at), so plain decoding here equals its projection
        if tokens not in savings:
            at = getattr(analysis, "saving_ms_at", None)
            nbytes = message_bytes(tokens * batch, hidden, dtype)
            savings[tokens] = (at(rec, nbytes, extrapolate) if at is not None
                               else comm(base_curve, tokens) - comm(rec_curve, tokens))
        return savings[tokens]

    def verify_for(with_saving):
        def verify(n):
            return compute(n) + comm(base_curve, n) - (saving(n) if with_saving else 0.0)
        # a row is marked when its latency or its measured verify time was extrapolated
        verify.extrapolated = lambda n: (n - 1) in extrap_bytes or (n - 1) in extrap_tokens
        return verify

    base_plans = plan_steps(usable, tau, draft_base, verify_for(False), other_ms)
    rec_plans = None
    if rec_curve is not None:
        draft_rec = draft_base - draft_collectives * saving(1) / analysis.collectives
        rec_plans = plan_steps(usable, tau, max(draft_rec, 0.0), verify_for(True), other_ms)
        assumptions.append("under the recommended cell: the baseline's verify and draft times "
                           "minus the cell's saving at each verify size, estimated as in the "
                           "table above (so k = 0 matches its projected tok/s)")
    return SpecComparison(base_plans, rec_plans, assumptions, [k for k in skipped if k],
                          [k for k in skipped_verify if k], extrap_bytes, extrap_tokens)
