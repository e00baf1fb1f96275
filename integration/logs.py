"""Parse SGLang and vLLM server logs: decode/prefill statistics, speculative settings.

SGLang's scheduler logs a line every `--decode-log-interval` decode steps. The formats
this module reads (seen in public sgl-project/sglang issues and its scheduler source;
tests/fixtures/logs/README.md names where):

    [04:40:55 TP0] Decode batch. #running-req: 2, #token: 4078, token usage: 0.00, gen throughput (token/s): 447.31, #queue-req: 0
    [2025-02-27 04:46:39 TP0] Decode batch. #running-req: 8, ..., accept len: 2.10, gen throughput (token/s): 186.64, #queue-req: 0
    [2026-04-05 20:02:51] Decode batch, #running-req: 32, ..., cuda graph: True, gen throughput (token/s): 1635.11, #queue-req: 0
    [2026-01-10 08:00:00 DP0 TP0] Decode batch [1204], ..., accept len: 3.1, accept rate: 0.70, ..., #queue-req: 0,

i.e. `Decode batch` then `.` or `,` (or ` [iteration],`), then `key: value` pairs separated
by commas, in any order, optional fields (accept len, accept rate, cuda/cpu/npu graph,
largest-len, ...) and sometimes a trailing comma. Prefixes vary: time only, date and
time, TP/DP/EP/PP ranks, Python logging's `date - logger - LEVEL - ` and `LEVEL:logger:`,
Ray's `(Actor pid=N) `. Also read: `Prefill batch` lines, `server_args=ServerArgs(...)`
(the speculative settings actually used; SGLang 0.5.2x prints it as a dict,
`server_args={'model_path': ..., 'device': 'cpu', ...}`), the ready line, the line each
process of a test server prints when it loaded a test-only substitute for SGLang's
kernels (`nccl-tune TEST-ONLY SUBSTITUTE: sgl_kernel (...)`, tests/sglang_cpu), and vLLM's speculative metrics
in both forms (`Speculative metrics: ...` up to v0.8, `SpecDecoding metrics: ...` in V1)
and its `Avg generation throughput` lines.

Nothing here raises on odd input: a line that does not parse is skipped.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError

READY_TEXT = "The server is fired up and ready to roll"
# Printed by tests/sglang_cpu/substitutes (its _nccl_tune_substitute.MARKER): a run that used
# them did not run SGLang's own kernels, and every summary says so.
SUBSTITUTE_MARKER = "nccl-tune TEST-ONLY SUBSTITUTE"
# The one of them that runs speculative verify attention (its marker appears at a
# scheduler's first verify batch; tests/sglang_cpu/substitutes/_nccl_tune_tree_verify.NAME).
VERIFY_SUBSTITUTE = "torch_native_tree_verify"
DEFAULT_IDLE_GAP_S = 5.0

_DECODE_RE = re.compile(r"Decode batch(?:\s*\[(?P<iter>\d+)\])?\s*[.,]\s*(?P<body>.*)$")
_PREFILL_RE = re.compile(r"Prefill batch(?:\s*\[(?P<iter>\d+)\])?\s*[.,]\s*(?P<body>.*)$")
SERVER_ARGS_TEXT = "server_args=ServerArgs("  # the body runs to the ")" that ends the line
SERVER_ARGS_DICT_TEXT = "server_args={"  # SGLang 0.5.2x prints a dict, to the "}" that ends it
_SUBSTITUTE_RE = re.compile(re.escape(SUBSTITUTE_MARKER) + r":\s*(?P<package>[A-Za-z0-9_.]+)")
_VLLM_OLD_RE = re.compile(r"Speculative metrics:\s*(?P<body>.*)$")
_VLLM_NEW_RE = re.compile(r"SpecDecoding metrics:\s*(?P<body>.*)$")
_VLLM_STATS_RE = re.compile(r"Avg generation throughput:\s*(?P<value>[-+0-9.eE]+)")
# vLLM V1 prefixes its periodic stats line with the engine: `Engine 000: Avg prompt ...`
_VLLM_ENGINE_RE = re.compile(r"\bEngine (?P<engine>\d+):\s*Avg prompt throughput")
_DATE_TIME_RE = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d+))?")
_MONTH_DAY_TIME_RE = re.compile(r"\b(?P<md>\d{2}-\d{2}) (?P<time>\d{2}:\d{2}:\d{2})\b")
_TIME_RE = re.compile(r"\b(?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d+))?\b")
_RANK_RE = re.compile(r"\b(?P<kind>TP|DP|EP|PP|CP|MoE)(?P<num>\d+)\b")
# `'key': value` of the dict form (a value up to the next comma or bracket: nested values
# are skipped, and only SERVER_ARG_KEYS are kept)
_DICT_ARG_RE = re.compile(
    r"(?:^|,\s*)'(?P<key>[A-Za-z_][A-Za-z0-9_]*)':\s*(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()\[\]{}]*)"
)
_ARG_RE = re.compile(
    r"(?:^|,\s*)(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()\[\]{}]*)"
)

# SGLang decode/prefill keys -> field names; values are converted by type.
_SGLANG_KEYS = {
    "#running-req": "running_req",
    "#token": "tokens",
    "#full token": "tokens",
    "token usage": "token_usage",
    "gen throughput (token/s)": "gen_throughput",
    "#queue-req": "queue_req",
    "accept len": "accept_len",
    "accept rate": "accept_rate",
    "largest-len": "largest_len",
    "#new-seq": "new_seq",
    "#new-token": "new_token",
    "#cached-token": "cached_token",
    "input throughput (token/s)": "input_throughput",
}
SERVER_ARG_KEYS = (
    "model_path",
    "device",
    "tp_size",
    "dp_size",
    "enable_dp_attention",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "disable_custom_all_reduce",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
    "decode_log_interval",
)


@dataclass
class LogEvent:
    """One recognised line: kind, where, when, and its fields."""

    kind: str  # decode | prefill | server_args | ready | substitute | vllm_spec | vllm_stats
    line: int
    time_s: float | None  # seconds (epoch with a date, else seconds of the day)
    dated: bool
    source: str  # ranks as printed ("TP0", "DP1 TP0") or ""
    fields: dict = field(default_factory=dict)


def _number(text: str):
    text = text.strip().rstrip(".")
    if text in ("True", "False"):
        return text == "True"
    percent = text.endswith("%")
    core = text[:-1] if percent else text
    core = core.split()[0] if core.split() else core  # "66 tokens" -> "66"
    try:
        value = int(core)
    except ValueError:
        try:
            value = float(core)
        except ValueError:
            return text
        if not math.isfinite(value):  # "nan", "inf", "1e999": not a figure (and not JSON)
            return text
    return value / 100.0 if percent else value


def _pairs(body: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for part in body.split(","):
        key, sep, value = part.partition(":")
        if sep and key.strip():
            out[key.strip()] = _number(value)
    return out


def _when(prefix: str) -> tuple[float | None, bool]:
    match = _DATE_TIME_RE.search(prefix)
    if match:
        try:
            stamp = _dt.datetime.strptime(f"{match['date']} {match['time']}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return None, False
        frac = float("0." + match["frac"]) if match["frac"] else 0.0
        return stamp.replace(tzinfo=_dt.timezone.utc).timestamp() + frac, True
    match = _MONTH_DAY_TIME_RE.search(prefix) or _TIME_RE.search(prefix)
    if match:
        try:
            h, m, s = (int(x) for x in match["time"].split(":"))
        except ValueError:
            return None, False
        if h > 23 or m > 59 or s > 60:
            return None, False
        frac = match.groupdict().get("frac")
        return h * 3600 + m * 60 + s + (float("0." + frac) if frac else 0.0), False
    return None, False


def _source(prefix: str) -> str:
    # Only rank tags inside the last [...] of the prefix (SGLang's "[time TP0]").
    bracket = prefix.rfind("[")
    scope = prefix[bracket:] if bracket >= 0 else prefix
    return " ".join(m.group(0) for m in _RANK_RE.finditer(scope))


def _sglang_fields(raw: dict[str, object]) -> dict:
    out: dict = {}
    extra: dict = {}
    for key, value in raw.items():
        name = _SGLANG_KEYS.get(key)
        if name:
            out[name] = value
        elif key.endswith(" graph"):  # cuda graph / cpu graph / npu graph
            out["graph"] = value if isinstance(value, bool) else None
            out["graph_kind"] = key[: -len(" graph")]
        else:
            extra[key] = value
    if extra:
        out["extra"] = extra
    return out


def _server_args(body: str, pattern: re.Pattern = _ARG_RE) -> dict:
    out: dict = {}
    for match in pattern.finditer(body):
        key, value = match["key"], match["value"].strip()
        if key not in SERVER_ARG_KEYS or key in out:
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            out[key] = value[1:-1]
        elif value == "None":
            out[key] = None
        else:
            out[key] = _number(value)
    return out


def _vllm_spec(body: str, new_form: bool) -> dict:
    per_position = None
    head, sep, tail = body.partition("Per-position acceptance rate:")
    if sep:
        # the list runs to the end or to the next "Name: value" pair
        parts = re.split(r",\s*(?=[A-Za-z])", tail, maxsplit=1)
        per_position = [
            v
            for v in (_number(x) for x in parts[0].split(",") if x.strip())
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        body = head + (parts[1] if len(parts) > 1 else "")
    raw = {k.lower(): v for k, v in _pairs(body).items()}
    out: dict = {"form": "SpecDecoding" if new_form else "Speculative"}
    rate = raw.get("draft acceptance rate", raw.get("avg draft acceptance rate"))
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        out["accept_rate"] = float(rate)
    for key, name in (
        ("mean acceptance length", "accept_len"),
        ("system efficiency", "efficiency"),
        ("number of speculative tokens", "num_spec_tokens"),
        ("accepted", "accepted"),
        ("drafted", "drafted"),
        ("number of accepted tokens", "accepted"),
        ("number of draft tokens", "drafted"),
        ("number of draft tokens tokens", "drafted"),
        ("number of emitted tokens", "emitted"),
        ("number of emitted tokens tokens", "emitted"),
        ("drafts", "drafts"),
    ):
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    if per_position:
        out["per_position"] = per_position
    # The old form has no accept length: emitted tokens per step = efficiency x (k + 1).
    if "accept_len" not in out and "efficiency" in out and "num_spec_tokens" in out:
        out["accept_len"] = out["efficiency"] * (out["num_spec_tokens"] + 1)
    return out


def parse_line(text: str, number: int = 0) -> LogEvent | None:
    """The event a log line holds, or None (never raises)."""
    try:
        return _parse_line(text, number)
    except Exception:
        return None


def _parse_line(text: str, number: int) -> LogEvent | None:
    text = text.rstrip("\r\n")
    for kind, regex in (("decode", _DECODE_RE), ("prefill", _PREFILL_RE)):
        match = regex.search(text)
        if match:
            raw = _pairs(match["body"])
            prefix = text[: match.start()]
            fields = _sglang_fields(raw)
            if not any(_is_number(v) for k, v in fields.items() if k in _SGLANG_KEYS.values()):
                return None  # no figure SGLang prints: a line that only looks like one
            if match["iter"]:
                fields["iteration"] = int(match["iter"])
            when, dated = _when(prefix)
            return LogEvent(kind, number, when, dated, _source(prefix), fields)
    for kind, regex in (("vllm_spec_new", _VLLM_NEW_RE), ("vllm_spec_old", _VLLM_OLD_RE)):
        match = regex.search(text)
        if match:
            fields = _vllm_spec(match["body"], kind.endswith("new"))
            if len(fields) <= 1:
                return None
            when, dated = _when(text[: match.start()])
            return LogEvent("vllm_spec", number, when, dated, "", fields)
    match = _VLLM_STATS_RE.search(text)
    if match:
        value = _number(match["value"])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            engine = _VLLM_ENGINE_RE.search(text)
            start = engine.start() if engine else match.start()
            when, dated = _when(text[:start])
            fields = {"gen_throughput": float(value)}
            for key, name in (("running", "running_req"), ("waiting", "queue_req")):
                count = re.search(rf"\b{key}:\s*(\d+) reqs", text, re.I)
                if count:
                    fields[name] = int(count.group(1))
            return LogEvent("vllm_stats", number, when, dated, f"Engine {engine['engine']}" if engine else "", fields)
    for opening, closing, pattern in ((SERVER_ARGS_TEXT, ")", _ARG_RE), (SERVER_ARGS_DICT_TEXT, "}", _DICT_ARG_RE)):
        start = text.find(opening)
        rest = text[start + len(opening) :].rstrip() if start >= 0 else ""
        if rest.endswith(closing):
            return LogEvent("server_args", number, None, False, "", _server_args(rest[:-1], pattern))
    match = _SUBSTITUTE_RE.search(text)
    if match:
        return LogEvent("substitute", number, None, False, "", {"package": match["package"]})
    if READY_TEXT in text:
        when, dated = _when(text[: text.find(READY_TEXT)])
        return LogEvent("ready", number, when, dated, "", {})
    return None


def parse_lines(lines: Iterable[str]) -> list[LogEvent]:
    """Every recognised event of `lines`, in order (line numbers from 1)."""
    events = []
    for number, text in enumerate(lines, start=1):
        event = parse_line(text, number)
        if event is not None:
            events.append(event)
    return events


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _gap(prev: LogEvent, cur: LogEvent) -> float | None:
    if prev.time_s is None or cur.time_s is None or prev.dated != cur.dated:
        return None
    delta = cur.time_s - prev.time_s
    if not cur.dated and delta < -43200:  # time-only stamps passing midnight
        delta += 86400
    return delta


# Why a decode line's gen throughput was left out (summary key "excluded").
AFTER_START = "first after the server started"
AT_LOG_START = "first of the log, not shown continuing"
AFTER_IDLE_PREFILL = "after a prefill that found nothing running"
AFTER_GAP = "after an idle gap, fields not continuing"


def continues(prev: LogEvent, cur: LogEvent) -> bool | None:
    """Whether `cur` continues `prev`'s decoding, from the lines' own fields.

    SGLang prints the running requests and the tokens they hold: the same nonzero
    #running-req and a larger #token mean the same batch kept decoding between the two
    lines (however slowly), so no idle time lies in between. None when a line does not
    print both; False when they show the batch changed.
    """
    values = [e.fields.get(k) for e in (prev, cur) for k in ("running_req", "tokens")]
    if not all(_is_number(v) for v in values):
        return None
    prev_run, prev_tok, cur_run, cur_tok = values
    return bool(cur_run == prev_run and cur_run > 0 and cur_tok > prev_tok)


def _excluded_reasons(events: list[LogEvent], idle_gap_s: float) -> list[tuple[LogEvent, str | None]]:
    """Each decode line with a throughput, and why it is left out (None: it counts)."""
    started = False
    decisions: list[tuple[LogEvent, str | None]] = []
    last: dict[str, LogEvent] = {}
    first_at_log_start: dict[str, int] = {}
    idle_prefill: dict[str, bool] = {}
    for event in events:
        if event.kind in ("ready", "server_args"):
            started = True
            last.clear()  # a (re)start: every rank begins again
            continue
        if event.kind == "prefill":
            if event.fields.get("running_req") == 0:
                idle_prefill[event.source] = True
            continue
        if event.kind != "decode" or not _is_number(event.fields.get("gen_throughput")):
            continue
        prev = last.get(event.source)
        reason = None
        if idle_prefill.get(event.source, False):
            reason = AFTER_IDLE_PREFILL
        elif prev is None:
            reason = AFTER_START if started else AT_LOG_START
            if not started:
                first_at_log_start[event.source] = len(decisions)
        else:
            gap = _gap(prev, event)
            if continues(prev, event) is not True and gap is not None and gap > idle_gap_s:
                reason = AFTER_GAP
            index = first_at_log_start.pop(event.source, None)
            if index is not None and reason is None and continues(prev, event):
                decisions[index] = (decisions[index][0], None)  # the log began mid-decoding
        decisions.append((event, reason))
        last[event.source] = event
        idle_prefill[event.source] = False
    return decisions


def throughput_lines(
    events: list[LogEvent], idle_gap_s: float = DEFAULT_IDLE_GAP_S
) -> tuple[list[LogEvent], list[LogEvent]]:
    """Decode lines whose gen throughput counts, and those excluded.

    SGLang divides the tokens since its previous decode line by the time since then, so
    a line whose interval holds idle time is left out: the first after the server
    started; one after a prefill that found nothing running; one more than `idle_gap_s`
    after the previous line unless the two lines' own fields (#running-req, #token)
    show the same batch kept decoding (a slow server logs seconds apart). A log that
    starts mid-run (an excerpt) keeps its first line when the next line shows decoding
    continued. Each rank prefix is followed on its own.
    """
    used, excluded = [], []
    for event, reason in _excluded_reasons(events, idle_gap_s):
        (excluded if reason else used).append(event)
    return used, excluded


def excluded_counts(events: list[LogEvent], idle_gap_s: float = DEFAULT_IDLE_GAP_S) -> dict[str, int]:
    """How many decode lines were left out, by reason (see throughput_lines)."""
    counts: dict[str, int] = {}
    for _, reason in _excluded_reasons(events, idle_gap_s):
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _per_position_mean(rows: list[list[float]]) -> list[float] | None:
    # element-wise mean of vLLM's per-position rates over lines of the same length (k)
    if not rows:
        return None
    k = max(len(r) for r in rows)
    same = [r for r in rows if len(r) == k]
    return [statistics.fmean(r[i] for r in same) for i in range(k)]


def summarize_events(events: list[LogEvent], idle_gap_s: float = DEFAULT_IDLE_GAP_S) -> dict:
    """Counts and means of a parsed log (see `nccl-tune logs summarize`)."""
    decode = [e for e in events if e.kind == "decode"]
    used, excluded = throughput_lines(events, idle_gap_s)
    throughput = [float(e.fields["gen_throughput"]) for e in used]
    accept_len = [float(e.fields["accept_len"]) for e in decode if _is_number(e.fields.get("accept_len"))]
    accept_rate = [float(e.fields["accept_rate"]) for e in decode if _is_number(e.fields.get("accept_rate"))]
    graphs = [e.fields.get("graph") for e in decode if isinstance(e.fields.get("graph"), bool)]
    server_args: dict = {}
    for e in events:
        if e.kind == "server_args":
            server_args = e.fields  # the last launch in the log wins
    speculative = {k[len("speculative_") :]: v for k, v in server_args.items() if k.startswith("speculative_")}
    if not speculative.get("algorithm"):
        speculative = None  # launched without speculative decoding (or not said)
    vllm = [e for e in events if e.kind == "vllm_spec"]
    vllm_stats = [e.fields["gen_throughput"] for e in events if e.kind == "vllm_stats"]
    vllm_summary = (
        {
            "spec_lines": len(vllm),
            "accept_len_mean": _mean([e.fields["accept_len"] for e in vllm if "accept_len" in e.fields]),
            "accept_rate_mean": _mean([e.fields["accept_rate"] for e in vllm if "accept_rate" in e.fields]),
            "gen_throughput_mean": _mean([v for v in vllm_stats if v > 0]),  # 0: idle interval
            "stats_lines": len(vllm_stats),
            "per_position_mean": _per_position_mean(
                [e.fields["per_position"] for e in vllm if e.fields.get("per_position")]
            ),
        }
        if (vllm or vllm_stats)
        else None
    )
    engine = "sglang" if decode or server_args else ("vllm" if vllm_summary else None)
    substitutes = sorted({e.fields["package"] for e in events if e.kind == "substitute"}) or None
    if engine == "vllm":  # the headline figures come from vLLM's own lines
        # each periodic stats line (V1: `Engine 000: ...`) is vLLM's decode line: a
        # logging interval's mean generation throughput; 0 marks an idle interval
        return {
            "engine": engine,
            "decode_lines": len(vllm_stats),
            "prefill_lines": 0,
            "gen_throughput_mean": vllm_summary["gen_throughput_mean"],
            "gen_throughput_median": statistics.median([v for v in vllm_stats if v > 0])
            if any(v > 0 for v in vllm_stats)
            else None,
            "gen_throughput_lines": sum(v > 0 for v in vllm_stats),
            "excluded_after_idle": sum(v <= 0 for v in vllm_stats),
            "accept_len_mean": vllm_summary["accept_len_mean"],
            "accept_rate_mean": vllm_summary["accept_rate_mean"],
            "accept_len_lines": sum("accept_len" in e.fields for e in vllm),
            "graph_share": None,
            "sources": sorted({e.source for e in events if e.kind == "vllm_stats" and e.source}),
            "ready": False,
            "speculative": None,
            "server_args": None,
            "vllm": vllm_summary,
            "substitutes": substitutes,
        }
    return {
        "engine": engine,
        "decode_lines": len(decode),
        "prefill_lines": sum(e.kind == "prefill" for e in events),
        "gen_throughput_mean": _mean(throughput),
        "gen_throughput_median": statistics.median(throughput) if throughput else None,
        "gen_throughput_lines": len(throughput),
        "excluded_after_idle": len(excluded),
        "excluded": excluded_counts(events, idle_gap_s),
        "accept_len_mean": _mean(accept_len),
        "accept_rate_mean": _mean(accept_rate),
        "accept_len_lines": len(accept_len),
        "graph_share": (sum(graphs) / len(graphs)) if graphs else None,
        "sources": sorted({e.source for e in decode if e.source}),
        "ready": any(e.kind == "ready" for e in events),
        "speculative": speculative,
        "server_args": server_args or None,
        "vllm": vllm_summary,
        # test-only stand-ins the server loaded instead of SGLang's kernels (tests/sglang_cpu)
        "substitutes": substitutes,
    }


MAX_LOG_LINE = 64 * 1024  # a line is matched on its first 64 KiB (vLLM prints KB-long configs)
MAX_LOG_BYTES = 256 * 1024 * 1024  # a server log of days; larger ones: cut the part wanted


def read_log(path: str) -> list[str]:
    """The lines of a server log or saved scrape a user gives, by the input policy
    (nccl_tune.fileio): strict UTF-8 and a size cap are one NcclTuneError naming the file
    (and line); an over-long line is cut at MAX_LOG_LINE, so matching stays linear."""
    size = fileio.read_size(path, what="server log")
    if size is not None and size > MAX_LOG_BYTES:
        raise NcclTuneError(
            f"{size} bytes: more than the {MAX_LOG_BYTES // (1024 * 1024)} MiB a "
            "server log may have (cut the part of interest)",
            path=path,
        )
    return [
        text
        for _, text in fileio.iter_lines(
            path, what="server log", max_line=MAX_LOG_LINE, on_long=lambda number, length: None
        )
    ]


def summarize_scrape(lines: list[str]) -> dict:
    """A saved /metrics scrape (Prometheus text) in the shape of `summarize_events`: its
    counters run from the server's start, so the figures cover everything it served."""
    from integration import metrics

    scrape = metrics.parse("\n".join(lines))
    spec = metrics.speculative(scrape)
    names = scrape.names()
    engine = (
        "vllm"
        if any(n.startswith("vllm:") for n in names)
        else "sglang"
        if any(n.startswith("sglang:") for n in names)
        else None
    )
    return {
        "engine": engine,
        "kind": "metrics scrape",
        "decode_lines": 0,
        "prefill_lines": 0,
        "gen_throughput_mean": None,
        "gen_throughput_median": None,
        "gen_throughput_lines": 0,
        "excluded_after_idle": 0,
        "accept_len_mean": spec.get("accept_len") if spec else None,
        "accept_rate_mean": spec.get("accept_rate") if spec else None,
        "accept_len_lines": 0,
        "graph_share": None,
        "sources": [],
        "ready": False,
        "speculative": None,
        "server_args": None,
        "vllm": None,
        "metrics": spec,
        "samples": len(scrape.samples),
        "substitutes": None,
    }


def summarize_file(path: str, idle_gap_s: float = DEFAULT_IDLE_GAP_S) -> dict:
    """`summarize_events` of a log file, with the file's path (or `summarize_scrape` of
    a saved /metrics answer)."""
    from integration.metrics import looks_like_metrics

    lines = read_log(path)
    if looks_like_metrics("\n".join(lines[:400])):
        return {"log": path, **summarize_scrape(lines)}
    summary = summarize_events(parse_lines(lines), idle_gap_s)
    return {"log": path, **summary}
