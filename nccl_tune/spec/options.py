"""Option text of the speculative planner -> its inputs; every error names its option.

Shared by `spec-plan`, `recommend --spec-steps` and the benchmarks: step lists, V@T
lists, and the acceptance options (repeatable, one figure per K each), including the
inference of SGLang's accept-rate convention from an accept length at the same K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nccl_tune.spec import accept as sa

MAX_STEPS = 64  # more draft steps than this is not a plan (SGLang sweeps 1..10)
ACCEPTANCE_OPTIONS = (
    "--accept-len L@K",
    "--accepted-drafts A@K",
    "--accept-rate A",
    "--accept-per-pos P1,P2,...",
    "--sglang-accept-rate R@K",
    "--vllm-acceptance-rate R@K",
)


def parse_steps(
    text: str, option: str = "--steps", allow_zero: bool = False, noun: str = "step count", maximum: int = MAX_STEPS
) -> list[int]:
    """'1-10', '2,4,6' or '1-3,8' -> sorted distinct step counts.

    ValueError naming `option`. Bounds are checked before a range is expanded, so
    '1-99999999999999' is refused at once instead of built.
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
            raise bad(f"'{part}' is not a {noun} or a range like 1-10") from None
        if lo < (0 if allow_zero else 1):
            raise bad(f"{noun}s start at " + ("0" if allow_zero else "1"))
        if hi > maximum:
            raise bad(
                f"more than {maximum} draft steps is not a plan"
                if noun == "step count"
                else f"{noun}s above {maximum} are not planned"
            )
        if lo > hi:
            raise bad(f"range '{part}' runs backwards")
        out.update(range(lo, hi + 1))
    return sorted(out)


PLUS_MINUS = ("+-", "\u00b1")


def split_interval(text: str, what: str) -> tuple[str, list[float]]:
    """'1.62+-0.05@5' -> ('1.62@5', [0.05]): each value may carry +-H (or a plus-minus
    sign), the half-width of its interval; values without one get 0. ValueError naming `what`."""
    values_text, sep, at_text = text.partition("@")
    plain, halves = [], []
    for item in values_text.split(","):
        mark = next((pm for pm in PLUS_MINUS if pm in item), None)
        if mark is None:
            plain.append(item)
            halves.append(0.0)
            continue
        value, _, half_text = item.partition(mark)
        try:
            half = float(half_text)
        except ValueError:
            raise ValueError(f"cannot read {what} '{text}'") from None
        if not 0 <= half < math.inf:
            raise ValueError(f"{what} '{text}': an interval's half-width must be >= 0")
        plain.append(value)
        halves.append(half)
    return ",".join(plain) + sep + at_text, halves


def scalar(text: str | None, option: str, minimum: float = 0.0, strict: bool = False) -> tuple[float | None, float]:
    """'11.26' or '11.26+-0.1' -> (value, half-width); None -> (None, 0). ValueError naming it."""
    if text is None:
        return None, 0.0
    plain, halves = split_interval(text, option)
    try:
        value = float(plain)
    except ValueError:
        raise ValueError(f"{option} '{text}' is not a number (or N+-H)") from None
    if math.isnan(value) or math.isinf(value) or value < minimum or (strict and value <= minimum):
        raise ValueError(f"{option} '{text}' must be {'>' if strict else '>='} {minimum:g}")
    return value, halves[0]


def parse_at(text: str, what: str) -> tuple[list[float], list[int] | None]:
    """'V' -> ([V], None); 'V1,V2@T1,T2' or 'L@K' -> ([...], [...]); ValueError naming `what`.

    Values may carry +-H intervals (split_interval gives them); they are dropped here."""
    text_in = text
    text, _ = split_interval(text, what)
    values_text, _, at_text = text.partition("@")
    try:
        values = [float(v) for v in values_text.split(",")]
        at = [int(t) for t in at_text.split(",")] if at_text else None
    except ValueError:
        raise ValueError(f"cannot read {what} '{text_in}'") from None
    if at is not None and len(at) != len(values):
        raise ValueError(f"{what} '{text_in}': {len(values)} value(s) but {len(at)} position(s)")
    if any(math.isnan(v) or math.isinf(v) for v in values):
        raise ValueError(f"{what} '{text_in}' is not a finite number")
    return values, at


def verify_halves(text: str, option: str = "--verify-ms") -> dict[int, float]:
    """Token count -> half-width of the verify time's interval (only those given with +-H)."""
    _, halves = split_interval(text, option)
    points, _ = verify_points(text, option)
    return {t: h for (t, _), h in zip(points, halves) if h > 0}


def half_of(text: str, option: str) -> float:
    """The +-H half-width given with a single value@K (0 without one)."""
    return split_interval(text, option)[1][0]


def value_at(text: str, option: str, example: str, min_k: int = 1) -> tuple[float, int]:
    """'R@K' -> (R, K) with K >= min_k; ValueError naming `option`."""
    values, at = parse_at(text, option)
    if len(values) != 1 or at is None or len(at) != 1:
        raise ValueError(f"{option} '{text}': expected a value@steps, e.g. {example}")
    if at[0] < min_k:
        raise ValueError(f"{option} '{text}': the step count after @ must be >= {min_k}")
    if at[0] > MAX_STEPS:
        raise ValueError(f"{option} '{text}': more than {MAX_STEPS} draft steps is not a plan")
    return values[0], at[0]


def verify_points(text: str, option: str = "--verify-ms") -> tuple[list[tuple[int, float]], bool]:
    """'V' (flat) or 'V1,V2,...@T1,T2,...' -> ((tokens, ms) points, flat); ValueError naming it."""
    values, at = parse_at(text, option)
    if at is None and len(values) != 1:
        raise ValueError(
            f"{option} '{text}': several values need @T1,T2,... (the tokens per "
            "forward, k+1 at batch 1, each was measured at)"
        )
    points = list(zip(at or [1], values))
    if any(t <= 0 for t, _ in points) or any(not m > 0 for _, m in points):
        raise ValueError(f"{option} '{text}': token counts and verify times must be positive")
    if len({t for t, _ in points}) != len(points):
        raise ValueError(f"{option} '{text}': token counts must be distinct")
    return points, at is None


def _rate(value: float, option: str, text: str) -> None:
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"{option} '{text}': an acceptance rate must be in [0, 1], got {value:g}")


def _length(value: float, k: int, option: str, text: str) -> None:
    if not 1.0 <= value <= k + 1 + 1e-9:
        raise ValueError(
            f"{option} '{text}': an accept length at {k} steps must lie in [1, {k + 1}] "
            f"(it counts the bonus token), got {value:.4g}"
        )


@dataclass
class AcceptanceInput:
    """What the acceptance options said: accept-length points, or a rate, or per-position."""

    points: list[sa.AcceptancePoint] = field(default_factory=list)
    rate: float | None = None
    per_pos: tuple[float, ...] | None = None
    checks: list[dict] = field(default_factory=list)  # convention inference, as consistency rows
    notes: list[str] = field(default_factory=list)

    @property
    def given(self) -> bool:
        """True when any acceptance option was given."""
        return bool(self.points) or self.rate is not None or self.per_pos is not None

    def build(self, max_k: int, prefer: dict[int, float] | None = None) -> sa.Acceptance:
        """The Acceptance model (ValueError when nothing was given)."""
        if self.rate is not None:
            acc = sa.from_iid_rate(self.rate)
        elif self.per_pos is not None:
            acc = sa.from_per_position(self.per_pos)
        elif self.points:
            acc = sa.from_points(self.points, max_k, prefer)
        else:
            raise ValueError("give the acceptance: one of " + ", ".join(ACCEPTANCE_OPTIONS))
        acc.notes = self.notes + acc.notes
        return acc


@dataclass(frozen=True)
class Timings:
    """The timing options: plain decoding, verify, draft step and other, with intervals."""

    decode_ms: float | None = None  # batch 1
    decode_points: tuple[tuple[int, float], ...] = ()  # (batch > 1, ms)
    verify_points: tuple[tuple[int, float], ...] = ()  # (tokens, ms)
    verify_flat: bool = False
    draft_ms: float | None = None
    other_ms: float = 0.0
    half_widths: tuple[tuple[str, float], ...] = ()  # decode_ms, draft_ms, other_ms: +-H
    verify_halves: tuple[tuple[int, float], ...] = ()  # tokens -> +-H
    decode_halves: tuple[tuple[int, float], ...] = ()  # batch > 1 -> +-H

    def halves(self) -> dict:
        """The planner's `halves` (nccl_tune.spec.planner.PlanRequest)."""
        return {**dict(self.half_widths), "verify": dict(self.verify_halves), "decode_points": dict(self.decode_halves)}


@dataclass(frozen=True)
class SpecInputs:
    """What the speculative options said."""

    acceptance: AcceptanceInput
    timings: Timings


def _many(value) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def parse_acceptance(
    accept_len=(),
    accepted_drafts=(),
    accept_rate: float | None = None,
    accept_per_pos: str | None = None,
    sglang_accept_rate=(),
    vllm_acceptance_rate=(),
    sglang_convention: str = sa.SGLANG_RATE_AUTO,
) -> AcceptanceInput:
    """The acceptance options -> AcceptanceInput; ValueError naming the option.

    L@K figures (accept length, accepted drafts, SGLang and vLLM rates) may be given at
    several K and together; an iid rate or a per-position list stands alone. An SGLang
    rate at a K where an accept length is also given infers the convention from the pair
    (and is then not a second acceptance figure); elsewhere it is converted by the
    inferred or named convention, or refused when neither is known.
    """
    out = AcceptanceInput()
    lengths = _many(accept_len)
    drafts = _many(accepted_drafts)
    sglang = _many(sglang_accept_rate)
    vllm = _many(vllm_acceptance_rate)
    pointwise = bool(lengths or drafts or sglang or vllm)
    alone = [x for x in (accept_rate, accept_per_pos) if x is not None]
    if len(alone) + bool(pointwise) > 1:
        raise ValueError(
            "give --accept-rate, or --accept-per-pos, or L@K figures (--accept-len, "
            "--accepted-drafts, --sglang-accept-rate, --vllm-acceptance-rate), not "
            "several of these"
        )
    if accept_rate is not None:
        _rate(accept_rate, "--accept-rate", str(accept_rate))
        out.rate = float(accept_rate)
        return out
    if accept_per_pos is not None:
        try:
            reach = tuple(float(v) for v in accept_per_pos.split(","))
        except ValueError:
            raise ValueError(f"cannot read --accept-per-pos '{accept_per_pos}'") from None
        for value in reach:
            _rate(value, "--accept-per-pos", accept_per_pos)
        try:
            sa.from_per_position(reach)
        except ValueError as exc:
            raise ValueError(f"--accept-per-pos '{accept_per_pos}': {exc}") from None
        out.per_pos = reach
        return out
    for text in lengths:
        value, k = value_at(
            text, "--accept-len", "1.62@5 (accept length 1.62, bonus token included, with 5 draft steps)"
        )
        _length(value, k, "--accept-len", text)
        out.points.append(
            sa.AcceptancePoint(
                k, value, f"--accept-len {text}", sa.CONVENTION_ACCEPT_LEN, half_of(text, "--accept-len")
            )
        )
    for text in drafts:
        value, k = value_at(
            text,
            "--accepted-drafts",
            "0.95@5 (0.95 drafts accepted per cycle, bonus token not counted, with 5 draft steps)",
        )
        if not 0.0 <= value <= k:
            raise ValueError(
                f"--accepted-drafts '{text}': accepted drafts at {k} steps must lie in [0, {k}], got {value:g}"
            )
        out.points.append(
            sa.AcceptancePoint(
                k, value + 1.0, f"--accepted-drafts {text}", sa.CONVENTION_DRAFTS, half_of(text, "--accepted-drafts")
            )
        )
    for text in vllm:
        value, k = value_at(
            text, "--vllm-acceptance-rate", "0.6@4 (vLLM's draft acceptance rate 0.6 with 4 speculative tokens)"
        )
        _rate(value, "--vllm-acceptance-rate", text)
        out.points.append(
            sa.AcceptancePoint(
                k,
                sa.accept_len_from_vllm_rate(value, k),
                f"--vllm-acceptance-rate {text}",
                sa.CONVENTION_VLLM_RATE,
                k * half_of(text, "--vllm-acceptance-rate"),
            )
        )
    _sglang_rates(out, sglang, lengths, sglang_convention)
    return out


def _sglang_rates(out: AcceptanceInput, rates: tuple[str, ...], lengths: tuple[str, ...], convention: str) -> None:
    option = "--sglang-accept-rate"
    if convention not in (sa.SGLANG_RATE_AUTO, *sa.SGLANG_CONVENTION_WORDS):
        raise ValueError(
            f"unknown SGLang accept-rate convention '{convention}' (known: auto, "
            f"{', '.join(sa.SGLANG_CONVENTION_WORDS)})"
        )
    parsed = []
    for text in rates:
        value, k = value_at(text, option, "0.27@5 (SGLang's accept rate 0.27 with 5 draft steps)")
        _rate(value, option, text)
        parsed.append((text, value, k))
    length_at = {p.k: p for p in out.points if p.option == "--accept-len"}
    inferred = set()
    for text, value, k in parsed:
        pair = length_at.get(k)
        if pair is None:
            continue
        variant, predicted = sa.infer_sglang_convention(pair.accept_len, value, k)
        words = "; ".join(f"{sa.SGLANG_CONVENTION_WORDS[v].split(',')[0]} = {p:.3f}" for v, p in predicted.items())
        if variant is None:
            out.checks.append(
                {
                    "input": f"{option} {text}",
                    "predicted": None,
                    "measured": value,
                    "agrees": False,
                    "note": f"with {pair.source}: {words}; the rate "
                    "matches neither SGLang convention (or both): not used",
                }
            )
            continue
        inferred.add(variant)
        out.checks.append(
            {
                "input": f"{option} {text}",
                "predicted": predicted[variant],
                "measured": value,
                "agrees": True,
                "note": f"convention inferred from {pair.source}: {sa.SGLANG_CONVENTION_WORDS[variant]} ({words})",
            }
        )
        if convention != sa.SGLANG_RATE_AUTO and convention != variant:
            out.checks[-1]["agrees"] = False
            out.checks[-1]["note"] += f"; contradicts --sglang-rate-convention {convention}"
    for text, value, k in parsed:
        if k in length_at:
            continue  # used to infer the convention, not a second figure at this K
        if convention != sa.SGLANG_RATE_AUTO:
            variant = convention
            how = f"--sglang-rate-convention {convention}"
        elif len(inferred) == 1:
            variant = next(iter(inferred))
            how = "inferred from the accept length at another K"
        else:
            raise ValueError(
                f"{option} '{text}': SGLang's accept rate changed meaning between "
                "releases (L/(k+1) from PR #11572, (L-1)/k from PR #23530): give "
                "--accept-len at the same K (the decode log prints both), or "
                "--sglang-rate-convention drafts|total"
            )
        length = sa.accept_len_from_sglang_rate(value, k, variant)
        _length(length, k, option, text)
        scale = k if variant == sa.SGLANG_RATE_DRAFTS else k + 1
        out.points.append(
            sa.AcceptancePoint(
                k,
                length,
                f"{option} {text}",
                f"SGLang accept rate, {sa.SGLANG_CONVENTION_WORDS[variant]} ({how})",
                scale * half_of(text, option),
            )
        )


def parse_decode(text: str | None) -> tuple[float | None, tuple[tuple[int, float], ...], dict]:
    """'D', 'D+-H' or 'D1,D2@B1,B2' (each may carry +-H) -> (batch-1 time, ((batch, ms),
    ...) at other batch sizes, {batch: +-H}); ValueError naming --decode-ms."""
    if text is None:
        return None, (), {}
    if "@" not in text:
        value, half = scalar(text, "--decode-ms", 0.0, True)
        return value, (), {1: half}
    values, at = parse_at(text, "--decode-ms")
    _, halves = split_interval(text, "--decode-ms")
    if any(not v > 0 for v in values) or any(b < 1 for b in at) or len(set(at)) != len(at):
        raise ValueError(f"--decode-ms '{text}': times must be positive, batch sizes distinct and >= 1")
    by_batch = dict(zip(at, values))
    half = dict(zip(at, halves))
    return by_batch.pop(1, None), tuple(sorted(by_batch.items())), half


def parse_timings(decode_ms, verify_ms, draft_ms, other_ms) -> Timings:
    """The timing options -> Timings; ValueError naming the option."""
    decode, points, decode_halves = parse_decode(decode_ms)
    verify, flat = verify_points(verify_ms) if verify_ms else ([], False)
    verify_half = verify_halves(verify_ms) if verify_ms else {}
    draft, draft_half = scalar(draft_ms, "--draft-ms")
    other, other_half = scalar(other_ms if other_ms is not None else "0", "--other-ms")
    return Timings(
        decode,
        points,
        tuple(verify),
        flat,
        draft,
        other,
        (("decode_ms", decode_halves.get(1, 0.0)), ("draft_ms", draft_half), ("other_ms", other_half)),
        tuple(sorted(verify_half.items())),
        tuple(sorted((b, h) for b, h in decode_halves.items() if b != 1 and h)),
    )
