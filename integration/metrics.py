"""A serving engine's `/metrics` (Prometheus text exposition format): scrapes, deltas, and
the speculative-decoding figures they carry.

A scrape is a list of samples `name{label="value",...} number [timestamp]`; `# HELP` and
`# TYPE` lines are read for the metric types. Counters only grow, so what one benchmark
run did is the difference of two scrapes around it (`delta`).

vLLM (V1) counts, per engine (label `engine`) and model:

    vllm:spec_decode_num_drafts_total                    verify steps that carried drafts
    vllm:spec_decode_num_draft_tokens_total              draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total           draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}

so over a run the accept length (tokens per verify, the bonus token counted, DESIGN.md
section 6) is 1 + accepted / drafts and the acceptance at position i is
accepted_per_pos[i] / drafts, the definitions of vLLM's own dashboard
(vllm/v1/spec_decode/metrics.py). SGLang (`--enable-metrics`) exports gauges:
`sglang:spec_accept_length` (mean accept length of its last logging interval, not of a
run) and, in later releases, `sglang:spec_accept_rate`. SGLang 0.5.2x exports these
gauges, and `sglang:spec_num_draft_tokens`, on every server, at 0 when speculative
decoding is off (seen on a real 0.5.23 server): an accept length below 1 (plain decoding
is 1, DESIGN.md section 6) means "none", not a figure. 0.5.2x also counts, per finished
request (observe_one_finished_request in sglang/srt/observability/metrics_collector.py),
all three at once:

    sglang:spec_verify_calls_total      verify forwards
    sglang:generation_tokens_total      tokens generated
    sglang:num_requests_total           requests finished

Each request's first token comes from its prefill, every later one from a verify, so over
a run (generation tokens - requests) / verify calls is the tokens kept per verify: the
accept length of the run, except that a request's last verify may accept drafts beyond
`max_new_tokens` that are not kept (seen on 0.5.23; its `meta_info` counts them in
`spec_num_correct_drafts`, integration/client.py). These counters, when a run verified
anything, come before the gauge. (SGLang's per-request `spec_accept_length` is completion
tokens / verify calls, the prefill's token counted.)
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field

VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"
SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls_total"
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"
SGLANG_REQUESTS = "sglang:num_requests_total"
SGLANG_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"

# A sample line: name, optional {labels}, value, optional timestamp. Split in code after
# the name (a regex with ".*}" then optional blank-separated parts backtracks over every
# blank: quadratic on a long line); each regex here starts its matches at a distinct
# character and no two quantifiers compete for one run.
_NAME_RE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_TS_RE = re.compile(r"-?\d+")
_LABEL_RE = re.compile(r'(?<![A-Za-z0-9_])(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"')


class MetricsError(Exception):
    """The server's /metrics could not be read."""


@dataclass
class Scrape:
    """One /metrics answer: samples keyed by (name, sorted labels), and metric types."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def names(self) -> set[str]:
        """Every sample name present."""
        return {name for name, _ in self.samples}

    def total(self, name: str, **match: str) -> float | None:
        """The sum of `name` over every label set (those given in `match` must agree)."""
        values = [
            v
            for (n, labels), v in self.samples.items()
            if n == name and all(dict(labels).get(k) == want for k, want in match.items())
        ]
        return sum(values) if values else None

    def mean(self, name: str) -> float | None:
        """The mean of `name` over its label sets (for gauges, which do not add up)."""
        values = [v for (n, _), v in self.samples.items() if n == name]
        return sum(values) / len(values) if values else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """`name` summed per value of `label` (e.g. per position)."""
        out: dict[str, float] = {}
        for (n, labels), value in self.samples.items():
            key = dict(labels).get(label)
            if n == name and key is not None:
                out[key] = out.get(key, 0.0) + value
        return out


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _number(text: str) -> float | None:
    try:
        return float(text)  # also NaN, +Inf, -Inf as Prometheus writes them
    except ValueError:
        return None


def _sample(line: str) -> tuple[str, str, float] | None:
    """(name, label text, value) of one stripped sample line, or None (not a sample)."""
    name = _NAME_RE.match(line)
    if name is None:
        return None
    rest, labels = line[name.end() :], ""
    if rest.startswith("{"):
        close = rest.rfind("}")
        if close < 0:
            return None
        labels, rest = rest[1:close], rest[close + 1 :]
    parts = rest.split()
    if not rest[:1].isspace() or len(parts) not in (1, 2) or (len(parts) == 2 and not _TS_RE.fullmatch(parts[1])):
        return None
    value = _number(parts[0])
    return None if value is None else (name.group(), labels, value)


def parse(text: str) -> Scrape:
    """A Scrape of Prometheus text; lines that do not parse are skipped (never raises)."""
    scrape = Scrape()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                scrape.types[parts[2]] = parts[3].strip()
            continue
        sample = _sample(line)
        if sample is None:
            continue
        name, label_text, value = sample
        labels = tuple(sorted((m["key"], _unescape(m["value"])) for m in _LABEL_RE.finditer(label_text)))
        scrape.samples[(name, labels)] = value
    return scrape


def looks_like_metrics(text: str) -> bool:
    """True for text in the exposition format (a `# TYPE` line or a vllm:/sglang: sample)."""
    head = text[:20000]
    return bool(
        re.search(r"^# TYPE \S+ \w+", head, re.M)
        or re.search(r"^(?:vllm|sglang):[A-Za-z0-9_:]+(?:\{[^}]*\})?\s+\S+\s*$", head, re.M)
    )


def scrape(url: str, timeout: float = 10.0) -> Scrape:
    """GET `url`/metrics and parse it; MetricsError when it cannot be read."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as response:
            if response.status != 200:
                raise MetricsError(f"/metrics answered HTTP {response.status}")
            return parse(response.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MetricsError(f"/metrics: {exc}") from None


def try_scrape(url: str, timeout: float = 10.0) -> Scrape | None:
    """`scrape`, or None when the server has no readable /metrics."""
    try:
        return scrape(url, timeout)
    except MetricsError:
        return None


def delta(before: Scrape, after: Scrape) -> Scrape:
    """What the counters did between two scrapes; gauges (and samples of unknown type
    that are not `_total`s) keep their value after. A counter that went down (the
    server restarted) counts from zero."""
    out = Scrape(types=dict(after.types))
    for key, value in after.samples.items():
        name = key[0]
        kind = after.types.get(name) or after.types.get(name.removesuffix("_total"))
        counter = kind == "counter" or (kind is None and name.endswith("_total"))
        if not counter:
            out.samples[key] = value
            continue
        old = before.samples.get(key, 0.0)
        out.samples[key] = value - old if value >= old else value
    return out


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def speculative(sc: Scrape) -> dict | None:
    """Speculative-decoding figures of a scrape (or a delta): accept length, acceptance
    rate, per-position acceptance, counts; None when the server exports none."""
    drafts = sc.total(VLLM_DRAFTS)
    if drafts is not None:
        accepted = sc.total(VLLM_ACCEPTED) or 0.0
        draft_tokens = sc.total(VLLM_DRAFT_TOKENS) or 0.0
        per_pos = sc.by_label(VLLM_PER_POS, "position")
        positions = sorted(per_pos, key=lambda p: int(p) if p.isdigit() else 10**6)
        return {
            "source": "vllm /metrics",
            "drafts": drafts,
            "draft_tokens": draft_tokens,
            "accepted_tokens": accepted,
            "accept_len": 1.0 + accepted / drafts if drafts > 0 else None,
            "accept_rate": accepted / draft_tokens if draft_tokens > 0 else None,
            "per_position": [per_pos[p] / drafts for p in positions] if drafts > 0 and per_pos else None,
            "generation_tokens": sc.total(VLLM_GENERATION_TOKENS),
        }
    counted = _sglang_counted(sc)
    if counted is not None:
        return counted
    length = _finite(sc.mean(SGLANG_ACCEPT_LENGTH))
    if length is not None and length >= 1.0:
        return {
            "source": "sglang /metrics (gauge: its last logging interval)",
            "accept_len": length,
            "accept_rate": _finite(sc.mean(SGLANG_ACCEPT_RATE)),
            "per_position": None,
        }
    return None


def _sglang_counted(sc: Scrape) -> dict | None:
    # SGLang's per-request counters (see the module docstring); None when nothing verified
    verify = sc.total(SGLANG_VERIFY_CALLS)
    tokens = sc.total(SGLANG_GENERATION_TOKENS)
    requests = sc.total(SGLANG_REQUESTS)
    if not verify or verify <= 0 or tokens is None or requests is None:
        return None
    length = (tokens - requests) / verify
    drafts = _finite(sc.mean(SGLANG_DRAFT_TOKENS))  # its draft tokens per verify, root counted
    # SGLang's accept rate: correct drafts / proposed drafts, (draft tokens - 1) per verify
    rate = (length - 1.0) / (drafts - 1.0) if drafts is not None and drafts > 1 else None
    return {
        "source": "sglang /metrics counters: tokens kept per verify",
        "accept_len": length,
        "accept_rate": rate,
        "per_position": None,
        "verify_calls": verify,
        "generation_tokens": tokens,
        "requests": requests,
    }
