"""nccl-tests output formats: the text table as people paste it, and `-J` JSON -> runs.

Formats (facts read from NVIDIA/nccl-tests src/common.cu and src/util.cu across
versions, and from outputs in public issues; see tests/fixtures/nccl_tests/README.md):

- The text table: `#` header lines (a column-name row such as
  ``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time ...``), then one
  row per size: the out-of-place block, then the in-place block. Variants:
  no ``root`` (before ~2019), no ``redop`` (old all_gather), NCCL 1.x names
  (``bytes N type op ... res``), ``error``/``res`` (max deviation, ``%5.0le``, a ``*``
  when out of tolerance) instead of ``#wrong`` (a count), ``N/A`` in that column when
  validation is off (``-c 0``: not checked, so not a failure), ``cputime`` (``-C``),
  per-iteration columns ``i_min i_max i_p99 i_cv%`` after each block (``-I``), a
  trailing timestamp (``-S``).
- Around the table: ``# nThread ... iters: 20 ... graph: 0``, ``#  Rank  0 Group  0 Pid
  ... on HOST device 0 [...] NAME`` (older: no Group, no Pid), ``NCCL version x.y.z``,
  ``# nccl-tests version ... nccl-library=22907``, ``# Collective test starting: NAME``,
  footers ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth``.
- As pasted: mpirun ``--tag-output`` prefixes (``[1,0]<stdout>:``), ``[0]`` and srun
  ``-l`` (``0:``) prefixes, indentation, NCCL INFO/WARN lines in between (even inside a
  row, whose numbers then continue on a later line), failure lines (``Test NCCL
  failure common.cu:NNN '...'``), several runs in one file.
- `-J file.json`: one object with ``args``, ``env`` (a list of ``K=V``),
  ``nccl_version`` (a version code), ``config``, ``devices`` and ``results`` (``size``,
  ``count``, ``type``, ``redop``, ``root``, ``out_of_place``/``in_place`` with
  ``time`` or ``cpu_time``, ``alg_bw``, ``bus_bw``, ``nwrong``, and with ``-I``
  ``out_of_place_per_iter`` holding ``p50_us`` and ``times_us``).

Parsing only: each file becomes `Run`s (header facts and rows); nccl_tune.measure.importers
turns them into results records. Errors name the file and line.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.nccl.ncclinfo import decode_version

INSTRUMENTATION_PREFIXES = ("NCCL_DEBUG", "NCCL_TESTS_")
_TAG_RE = re.compile(r"^\s*(?:\[\d+,\d+\]<(stdout|stderr)>:|\[\d+\]\s?|\d+:\s)")
_ENV_ASSIGN_RE = re.compile(r"(?<![A-Za-z0-9_])(NCCL_[A-Z0-9_]+)=([^\s'\"`;]+)")
_SET_BY_ENV_RE = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (\S+?)\.?\s*$")
# A network plugin changing a setting itself (aws-ofi-nccl: 'Setting NCCL_PROTO to "simple"').
_SET_BY_PLUGIN_RE = re.compile(r"\bSetting (NCCL_[A-Z0-9_]+) to \"?([^\"\s]+)\"?")
_NCCL_VERSION_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_TESTS_VERSION_RE = re.compile(r"#\s*nccl-tests version (\S+).*?nccl-library=(\d+)")
_TEST_NAME_RE = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_NTHREAD_RE = re.compile(r"^#?\s*nThread\s+\d+\s+nGpus\s+(\d+)")
_ITERS_RE = re.compile(r"\biters:\s*(\d+)")
_WARMUP_RE = re.compile(r"warmup iters:\s*(\d+)")
_GRAPH_RE = re.compile(r"\bgraph:\s*(\d+)")
_RANK_RE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+"
    r"device\s+(\d+)\s+\[[^\]]*\]\s+(.*?)\s*$"
)
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_FAILURE_RE = re.compile(r"Test (?:NCCL |CUDA )?failure|NCCL failure|CUDA failure|Test timeout")
_ROW_START_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+([A-Za-z][A-Za-z0-9_]*)\b(.*)$")
_NUMBER_RE = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\*?$")
# A log line printed while a row was half written: "... -1[0] host:pid:tid [0] NCCL INFO ...".
_GLUED_RE = re.compile(r"(\d)(\[\d+\]|[A-Za-z][\w.-]*:\d+:\d+|[A-Za-z][\w.-]*: Test )")
_LOG_FRAGMENT_RE = re.compile(r"^(\[\d+\]|[\w.-]+:\d+:\d+|[A-Za-z][\w.-]*:$|NCCL\b)")
_BLANKS_RE = re.compile(r"\s*")
MAX_LINE = 4096  # characters of a text line that are matched (nccl-tests lines are short)
JSON_MAX_DEPTH = 8  # a -J file: run -> results -> entry -> block
_TIMESTAMP_RE = re.compile(r"(?<!\s)\s+\d{4}-\d\d-\d\d\s+\d\d:\d\d:\d\d\s*$")  # one scan per run
COLUMN_SYNONYMS = {
    "bytes": "size",
    "n": "count",
    "op": "redop",
    "res": "error",
    "cputime": "time",
    "#wrong": "wrong",
    "error": "error",
}
OPS_BY_TEST = {"all_reduce": "allreduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter"}


@dataclass
class Layout:
    """Which columns a row has: the preamble fields and the width of each block."""

    preamble: tuple[str, ...] = ("size", "count", "type", "redop", "root")
    block: int = 4  # time algbw busbw check, + 4 with per-iteration columns (-I)
    check: str = "wrong"  # "wrong" (#wrong count) or "error" (max deviation)
    from_header: bool = False


@dataclass
class Run:
    """One nccl-tests run: its header facts and its rows."""

    number: int
    op: str | None = None
    iters: int | None = None
    warmup: int | None = None
    graph: bool | None = None
    hosts: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_plugin: dict[str, str] = field(default_factory=dict)  # set by a plugin, not the user
    rows: list[dict] = field(default_factory=list)
    out_of_bounds: int | None = None
    failure: str | None = None
    zero_byte_rows: int = 0  # rows of 0 bytes, left out by the importer
    ranks: list[int] = field(default_factory=list)  # the `# Rank N` numbers, as printed
    notes: list[str] = field(default_factory=list)  # what the parser decided (split runs)


def _strip_tag(line: str) -> tuple[str, bool]:
    match = _TAG_RE.match(line)
    if not match:
        return line.strip(), False
    return line[match.end() :].strip(), match.group(1) == "stderr"


def _number(token: str) -> float | None:
    return float(token.rstrip("*")) if _NUMBER_RE.match(token) else None


def parse_header(text: str, path: str, line: int) -> Layout:
    """A column-name row (``# size count type redop root time ...``) -> its Layout."""
    names = [COLUMN_SYNONYMS.get(t.lower(), t.lower()) for t in text.lstrip("#").split()]
    if names and names[-1] == "timestamp":
        names = names[:-1]
    preamble = []
    for name in names:
        if name in ("size", "count", "type", "redop", "root"):
            preamble.append(name)
        else:
            break
    rest = names[len(preamble) :]
    if preamble[:3] != ["size", "count", "type"] or not rest or rest[0] != "time":
        raise NcclTuneError(f"unrecognised nccl-tests column header: {text.strip()}", path=path, line=line)
    width = rest[1:].index("time") + 1 if "time" in rest[1:] else len(rest)
    check = rest[3] if width > 3 else "wrong"
    return Layout(tuple(preamble), width, "error" if check == "error" else "wrong", True)


def _guess_layout(tokens: list[str]) -> Layout:
    """The layout of a row seen without a header (a pasted fragment): from its shape."""
    pre = ["size", "count", "type"]
    index = 3
    if index < len(tokens) and re.match(r"^[A-Za-z]", tokens[index]):
        pre.append("redop")
        index += 1
    rest = len(tokens) - index
    if rest % 4 == 1 and re.match(r"^-?\d+$", tokens[index]):
        pre.append("root")
        rest -= 1
    block = 8 if rest >= 16 else 4
    check = "error" if any("e" in t.lower() and _number(t) is not None for t in tokens[index:]) else "wrong"
    return Layout(tuple(pre), block, check)


def _block(values: list[str], layout: Layout) -> dict | None:
    if len(values) < 3:
        return None
    time_us = _number(values[0])
    if time_us is None:
        return None
    out = {"time_us": time_us, "algbw_gbps": _number(values[1]), "busbw_gbps": _number(values[2])}
    check = values[3] if len(values) > 3 else None
    out["checked"] = check not in (None, "N/A")
    if layout.check == "error":
        out["max_error"] = _number(check) if check else None
        out["wrong"] = 1 if (check or "").endswith("*") else (0 if out["checked"] else None)
    else:
        value = _number(check) if check and check != "N/A" else None
        out["wrong"] = int(value) if value is not None else None
    if layout.block >= 8 and len(values) >= 8:
        out["per_iter"] = {
            "min_us": _number(values[4]),
            "max_us": _number(values[5]),
            "p99_us": _number(values[6]),
            "cv_pct": _number(values[7]),
        }
    return out


class _TextParser:
    def __init__(self, path: str):
        self.path = path
        self.runs: list[Run] = []
        self.layout: Layout | None = None
        self.env: dict[str, str] = {}
        self.env_plugin: dict[str, str] = {}
        self.nccl_version: str | None = None
        self.tests_version: str | None = None
        self.pending: dict | None = None  # a row whose numbers continue on later lines
        self.first_unknown: tuple[int, str] | None = None
        self.expect_new_run = True

    def run(self) -> Run:
        if self.expect_new_run or not self.runs:
            self.runs.append(Run(len(self.runs) + 1))
            self.expect_new_run = False
        return self.runs[-1]

    def close_run(self) -> None:
        self._flush_pending(None)
        if self.runs and not self.expect_new_run:
            self.runs[-1].env = dict(self.env)  # the settings in force when the run ended
            self.runs[-1].env_plugin = dict(self.env_plugin)
        self.expect_new_run = True

    def boundary(self) -> None:
        """A line that starts a run (nThread, test name, column header): close the open one."""
        if self.runs and not self.expect_new_run and self.runs[-1].rows:
            self.close_run()

    def feed(self, number: int, raw: str) -> None:
        text, stderr = _strip_tag(raw.rstrip("\r\n"))
        for name, value in _ENV_ASSIGN_RE.findall(text):
            self._set_env(name, value)
        plugin = _SET_BY_PLUGIN_RE.search(text)
        if plugin:
            self.env_plugin[plugin.group(1)] = plugin.group(2)
        match = _SET_BY_ENV_RE.search(text)
        if match:
            self._set_env(match.group(1), match.group(2))
        if not text or stderr:
            return
        match = _NCCL_VERSION_RE.search(text)
        if match:
            self.nccl_version = self.nccl_version or match.group(1)
        if self._header_line(number, text):
            return
        failure = _FAILURE_RE.search(text)
        if self._row_line(number, text):
            if failure and self.pending:  # "...  -1host: Test NCCL failure ...": the row died
                host = re.sub(r"^-?\d+", "", (text[: failure.start()].split() or [""])[-1])
                self._flush_pending((host + " " if host else "") + text[failure.start() :])
            return
        if failure:
            self._failure(text)
            return
        if not text.startswith("#") and "NCCL" not in text and self.first_unknown is None:
            self.first_unknown = (number, text)

    def _set_env(self, name: str, value: str) -> None:
        if not name.startswith(INSTRUMENTATION_PREFIXES):
            self.env[name] = value

    def _header_line(self, number: int, text: str) -> bool:
        match = _TESTS_VERSION_RE.match(text)
        if match:
            self.tests_version = match.group(1)
            self.nccl_version = ".".join(map(str, decode_version(int(match.group(2)))))
            return True
        match = _TEST_NAME_RE.match(text)
        if match:
            self.boundary()
            self.run().op = op_from_test_name(match.group(1))
            return True
        match = _NTHREAD_RE.match(text)
        if match:
            self.boundary()
            run = self.run()
            iters, warmup, graph = (
                _ITERS_RE.search(text.split("warmup iters")[-1]),
                _WARMUP_RE.search(text),
                _GRAPH_RE.search(text),
            )
            run.iters = int(iters.group(1)) if iters else None
            run.warmup = int(warmup.group(1)) if warmup else None
            run.graph = bool(int(graph.group(1))) if graph else None
            return True
        match = _RANK_RE.match(text)
        if match:
            run = self.run()
            run.ranks.append(int(match.group(1)))
            run.hosts.append(match.group(2))
            run.gpus.append(match.group(4))
            return True
        if not text.startswith("#"):
            return False
        words = [w.lower() for w in text.lstrip("#").split()]
        if {"time", "algbw"} <= set(words) or ("cputime" in words and "algbw" in words):
            self.boundary()
            self.layout = parse_header(text, self.path, number)
            self.run()
            return True
        match = _OOB_RE.match(text)
        if match:
            self._flush_pending(None)
            run = self.run()
            run.out_of_bounds = int(match.group(1))
            return True
        if text.lstrip("#").strip().startswith("Avg bus bandwidth"):
            self.close_run()
            return True
        return True  # any other comment line: units row, "Using devices", blank "#"

    def _row_line(self, number: int, text: str) -> bool:
        text = _GLUED_RE.sub(r"\1 \2", _TIMESTAMP_RE.sub("", text))
        match = _ROW_START_RE.match(text)
        tokens = text.split()
        if match and tokens[2].lower() not in ("nccl", "info", "warn"):
            self._flush_pending(None)
            layout = self.layout or _guess_layout(tokens)
            npre = len(layout.preamble)
            pre, body = tokens[:npre], []
            for token in tokens[npre:]:
                if _number(token) is None and token != "N/A":
                    if not _LOG_FRAGMENT_RE.match(token):
                        raise NcclTuneError(
                            f"cannot read this nccl-tests row ('{token}' is not a number): {text}",
                            path=self.path,
                            line=number,
                        )
                    break  # a log line glued to the row: its numbers follow on later lines
                body.append(token)
            if len(pre) < npre or (
                "root" in layout.preamble and not re.match(r"^-?\d+$", pre[layout.preamble.index("root")])
            ):
                raise NcclTuneError(f"cannot read this nccl-tests row: {text}", path=self.path, line=number)
            self.pending = {"line": number, "pre": dict(zip(layout.preamble, pre)), "body": body, "layout": layout}
            if len(body) >= 2 * layout.block:
                self._flush_pending(None)
            return True
        if self.pending and all(_number(t) is not None or t == "N/A" for t in tokens):
            self.pending["body"].extend(tokens)
            if len(self.pending["body"]) >= 2 * self.pending["layout"].block:
                self._flush_pending(None)
            return True
        if re.match(r"^\d+\s+\d+\s+", text):
            raise NcclTuneError(f"cannot read this nccl-tests row: {text}", path=self.path, line=number)
        return False

    def _failure(self, text: str) -> None:
        if self.pending:
            self._flush_pending(text)
        elif self.runs:
            self.runs[-1].failure = self.runs[-1].failure or text

    def _flush_pending(self, failure: str | None) -> None:
        row, self.pending = self.pending, None
        if row is None:
            return
        layout, body = row["layout"], row["body"]
        out = _block(body[: layout.block], layout)
        inplace = _block(body[layout.block : 2 * layout.block], layout)
        pre = row["pre"]
        self.run().rows.append(
            {
                "line": row["line"],
                "size": int(pre["size"]),
                "count": int(pre["count"]),
                "type": pre["type"],
                "redop": pre.get("redop"),
                "root": int(pre["root"]) if pre.get("root") not in (None, "") else None,
                "out": out,
                "in": inplace,
                "failure": failure if out is None else None,
                "truncated": out is None and failure is None,
            }
        )


def _key(row: dict) -> tuple[str, str]:
    return (str(row.get("type") or "").lower(), str(row.get("redop") or "").lower())


def split_interleaved(run: Run, path: str) -> list[Run]:
    """One run whose sizes repeat or go backwards -> the runs that were interleaved in it.

    Within one run nccl-tests prints sizes in increasing order for each (type, redop)
    (`-d all` / `-o all` start the sizes over for each pair, which is not a repeat).
    When two outputs were pasted into one (two processes writing to one terminal, each
    printing its own header: the `# Rank` numbers then repeat), a size repeats or goes
    back: each row goes to the interleaved run it continues (the one whose last size is
    the largest below it). Runs so split unevenly (one much shorter than another: rows
    out of order rather than two outputs) are refused naming the first such line.
    """
    streams: list[list[dict]] = [[]]
    first_break = None
    for row in run.rows:
        if row["size"] <= 0:  # 0-byte rows repeat by design (counts rounded down to 0)
            streams[0].append(row)
            continue
        key = _key(row)
        same = [s for s in streams if s and _key(s[-1]) == key and s[-1]["size"] < row["size"]]
        if same:
            max(same, key=lambda s: s[-1]["size"]).append(row)  # max keeps the first of ties
            continue
        other = [s for s in streams if not s or _key(s[-1]) != key]
        if other:
            other[0].append(row)  # the first row, or a new (type, redop) segment of a run
            continue
        first_break = first_break or row
        streams.append([row])
    if len(streams) == 1:
        return [run]
    lengths = [sum(r["size"] > 0 for r in s) for s in streams]
    where = f"line {first_break['line']}" if first_break.get("line") else f"results entry {first_break.get('entry')}"
    if min(lengths) * 2 < max(lengths):
        raise NcclTuneError(
            f"{'' if first_break.get('line') else where + ': '}"
            f"size {first_break['size']} repeats or goes backwards within one run "
            f"(rows of {len(streams)} runs interleaved, or out of order) and the rows "
            "do not split into interleaved runs of similar length: split the file "
            "by hand",
            path=path,
            line=first_break.get("line"),
        )
    copies = max(run.ranks.count(r) for r in run.ranks) if run.ranks else 1
    runs = []
    for index, rows in enumerate(streams):
        part = Run(
            run.number,
            op=run.op,
            iters=run.iters,
            warmup=run.warmup,
            graph=run.graph,
            env=dict(run.env),
            env_plugin=dict(run.env_plugin),
            rows=rows,
            out_of_bounds=run.out_of_bounds,  # a FAILED footer: which part is unknown
            failure=run.failure,
        )
        if copies == len(streams):  # each process printed its ranks: the i-th copy of each
            seen: dict[int, int] = {}
            for rank, host, gpu in zip(run.ranks, run.hosts, run.gpus):
                if seen.get(rank, 0) == index:
                    part.ranks.append(rank)
                    part.hosts.append(host)
                    part.gpus.append(gpu)
                seen[rank] = seen.get(rank, 0) + 1
        part.notes.append(
            f"{where}: size {first_break['size']} repeats or goes backwards "
            f"within one run: {len(streams)} outputs interleaved, split into "
            f"{len(streams)} runs (this is part {index + 1}, {lengths[index]} rows)"
        )
        runs.append(part)
    return runs


def op_from_test_name(name: str) -> str | None:
    """'all_reduce_perf' / './build/all_reduce_perf_mpi' -> 'allreduce'; None if unknown."""
    base = os.path.basename(name)
    for prefix, op in OPS_BY_TEST.items():
        if base.startswith(prefix):
            return op
    return None


def _half_ulp(value: float) -> float:
    """How far the true time may lie from a printed one. nccl-tests prints %7.2f, %7.1f
    from 100 us and %7.0f from 10 ms (src/common.cu); ten times that half-digit here, so
    that a release printing one digit fewer cannot narrow the bounds wrongly."""
    return 5.0 if value >= 10000 else (0.5 if value >= 100 else 0.05)


def _ratio_bounds(row: dict) -> tuple[float, float] | None:
    """Bounds on busbw / algbw of a row from the printed digits (bandwidths %.2f, and
    algbw = size / time): None when the row cannot bound it."""
    out = row.get("out") or {}
    busbw, algbw, time_us = out.get("busbw_gbps"), out.get("algbw_gbps"), out.get("time_us")
    if busbw is None or (algbw is None and not time_us):
        return None
    bus_lo, bus_hi = max(busbw - 0.005, 0.0), busbw + 0.005
    alg_lo, alg_hi = (max(algbw - 0.005, 0.0), algbw + 0.005) if algbw is not None else (0.0, float("inf"))
    if time_us and row.get("size"):
        err = _half_ulp(time_us)
        alg_lo = max(alg_lo, row["size"] / ((time_us + err) * 1e3))
        alg_hi = min(alg_hi, row["size"] / (max(time_us - err, 1e-9) * 1e3))
    if alg_lo <= 0 or alg_lo > alg_hi:
        return None
    return bus_lo / alg_hi, bus_hi / alg_lo


def _ranks_from_counts(rows: list[dict]) -> int | None:
    """all_gather / reduce_scatter print the per-rank count: size = count x type size x ranks."""
    found = set()
    for row in rows:
        size, count = row.get("size"), row.get("count")
        if not size or not count or not row.get("type"):
            continue
        per_rank = count * _type_size(row["type"])
        if size % per_rank:
            return None
        found.add(size // per_rank)
    return found.pop() if len(found) == 1 else None


def infer_world_size(rows: list[dict], op: str, limit: int = 4096) -> int | None:
    """Ranks from nccl-tests' own definitions when the header does not list them.

    all_gather / reduce_scatter: size / (count x element size). Every op: busbw =
    algbw x 2(n-1)/n (allreduce) or x (n-1)/n, bounded by the printed digits of each row
    (bandwidths to 0.01 GB/s, algbw also as size / time): the one n that every row
    allows. None when no n or more than one n fits.
    """
    if op in ("all_gather", "reduce_scatter"):
        ranks = _ranks_from_counts(rows)
        if ranks:
            return ranks
    factor = 2.0 if op == "allreduce" else 1.0
    candidates = set(range(1, limit + 1))
    used = 0
    for row in rows:
        bounds = _ratio_bounds(row)
        if bounds is None:
            continue
        low, high = bounds
        candidates = {n for n in candidates if low - 1e-12 <= factor * (n - 1) / n <= high + 1e-12}
        used += 1
    if used and len(candidates) == 1:
        return candidates.pop()
    return None


def infer_op(rows: list[dict]) -> str:
    """From the rows' shape: size = count x type size for allreduce; x nranks for
    all_gather (redop none) and reduce_scatter; 'rooted' for broadcast/reduce."""
    for row in rows:
        if row.get("root") not in (None, -1):
            return "rooted"
        if row["count"] and row["size"] and row["size"] != row["count"] * _type_size(row["type"]):
            return "all_gather" if (row.get("redop") in (None, "none")) else "reduce_scatter"
    return "allreduce"


def _type_size(name: str) -> int:
    name = name.lower()
    for key, size in (
        ("int8", 1),
        ("uint8", 1),
        ("char", 1),
        ("fp8", 1),
        ("e4m3", 1),
        ("e5m2", 1),
        ("half", 2),
        ("bfloat16", 2),
        ("float16", 2),
        ("double", 8),
        ("int64", 8),
        ("uint64", 8),
    ):
        if key in name:
            return size
    return 4


def parse_text(text: str, path: str) -> tuple[list[Run], dict]:
    """Runs of a text file and file-level facts (versions). NcclTuneError naming the line.

    Each line is matched on its first MAX_LINE characters only: nccl-tests' own lines are
    short, and a cap keeps every regular expression here linear in the file's size."""
    parser = _TextParser(path)
    for number, raw in enumerate(text.splitlines(), start=1):
        parser.feed(number, raw[:MAX_LINE])
    parser.close_run()
    runs = []
    for run in parser.runs:
        if run.rows:
            runs += split_interleaved(run, path)
    for number, run in enumerate(runs, start=1):
        run.number = number
    if not runs:
        where = parser.first_unknown
        if where:
            raise NcclTuneError(
                f"not nccl-tests output: '{where[1][:60]}' (expected '# nThread ...', a "
                "'# size count type ...' header, or result rows)",
                path=path,
                line=where[0],
            )
        raise NcclTuneError("no nccl-tests result rows found", path=path)
    return runs, {"nccl": parser.nccl_version, "nccl_tests": parser.tests_version}


# ---------------------------------------------------------------- JSON (-J)


def _json_objects(text: str, path: str) -> list[dict]:
    depth = fileio.json_depth(text)  # checked without recursion, before the decoder recurses
    if depth > JSON_MAX_DEPTH:
        raise NcclTuneError(f"nested {depth} levels deep: nccl-tests JSON nests at most {JSON_MAX_DEPTH}", path=path)
    decoder = json.JSONDecoder()
    objects, index = [], 0
    while True:
        index = _BLANKS_RE.match(text, index).end()
        if index >= len(text):
            break
        try:
            obj, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError as exc:
            raise NcclTuneError(f"not valid nccl-tests JSON: {exc.msg}", path=path, line=exc.lineno) from None
        except ValueError as exc:  # an integer of thousands of digits
            raise NcclTuneError(f"not valid nccl-tests JSON: {exc}", path=path) from None
        if not isinstance(obj, dict) or "results" not in obj:
            line = text.count("\n", 0, index) + 1
            raise NcclTuneError("JSON without a 'results' list: not nccl-tests -J output", path=path, line=line)
        objects.append(obj)
    return objects


def _json_number(value, what: str, path: str, where: str) -> float | None:
    """A number field of a results entry: None when null or absent, an error otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise NcclTuneError(f"{where}: '{what}' is {json.dumps(value)}, not a non-negative number", path=path)
    return float(value)


def _json_block(data, path: str, where: str) -> dict | None:
    """An out_of_place / in_place object -> time, bandwidths, #wrong; None when absent."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise NcclTuneError(f"{where} is {json.dumps(data)[:40]}, not an object", path=path)
    key = "time" if "time" in data else "cpu_time"
    time_us = _json_number(data.get(key), key, path, where)
    if time_us is None:
        return None
    wrong = _json_number(data.get("nwrong"), "nwrong", path, where)
    return {
        "time_us": time_us,
        "algbw_gbps": _json_number(data.get("alg_bw"), "alg_bw", path, where),
        "busbw_gbps": _json_number(data.get("bus_bw"), "bus_bw", path, where),
        "checked": wrong is not None,
        "wrong": int(wrong) if wrong is not None else None,
    }


def _json_field(obj: dict, key: str, kind: type, path: str, what: str = "the run"):
    """obj[key] when it has the type nccl-tests writes (None when absent or null)."""
    value = obj.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is int):
        raise NcclTuneError(
            f"{what}'s '{key}' is {json.dumps(value)[:40]}, not a JSON {_JSON_KIND[kind]}: not nccl-tests -J output",
            path=path,
        )
    return value


_JSON_KIND = {list: "list", dict: "object", str: "string", int: "integer"}


def parse_json(text: str, path: str) -> tuple[list[Run], dict]:
    """Runs of a `-J` JSON file (one object per run; concatenated objects allowed).

    A field of the wrong type (a non-numeric time, an `env` that is not a list, ...) is
    an error naming the file and the results entry, never a silently failed row.
    """
    runs, versions = [], {"nccl": None, "nccl_tests": None}
    for index, obj in enumerate(_json_objects(text, path), start=1):
        run = Run(index)
        args = _json_field(obj, "args", list, path) or []
        run.op = op_from_test_name(str(args[0])) if args else None
        config = _json_field(obj, "config", dict, path) or {}
        run.iters = config.get("iterations") if isinstance(config.get("iterations"), int) else None
        run.warmup = config.get("warmup_iters") if isinstance(config.get("warmup_iters"), int) else None
        run.graph = bool(config.get("graph")) if config.get("graph") is not None else None
        devices = (
            _json_field(obj, "devices", list, path)  # util.cu nests it in config
            or _json_field(config, "devices", list, path, "the run's config")
            or []
        )
        for device in devices:
            if isinstance(device, dict):
                run.hosts.append(str(device.get("hostname")))
                run.gpus.append(str(device.get("device_info")))
        for item in _json_field(obj, "env", list, path) or []:
            if isinstance(item, str) and "=" in item:
                name, value = item.split("=", 1)
                if name.startswith("NCCL_") and not name.startswith(INSTRUMENTATION_PREFIXES):
                    run.env[name] = value
        if isinstance(obj.get("nccl_version"), int) and obj["nccl_version"] > 0:
            versions["nccl"] = ".".join(map(str, decode_version(obj["nccl_version"])))
        oob = obj.get("out_of_bounds")
        if isinstance(oob, dict) and isinstance(oob.get("count"), int):
            run.out_of_bounds = oob["count"]
        errors = [e for e in _json_field(obj, "errors", list, path) or [] if isinstance(e, str) and e]
        run.failure = errors[0] if errors else None
        results = obj.get("results")
        if not isinstance(results, list):
            raise NcclTuneError(
                f"'results' is {json.dumps(results)[:40]}, not a list: not nccl-tests -J output", path=path
            )
        for position, result in enumerate(results, start=1):
            where = f"results entry {position}"
            if (
                not isinstance(result, dict)
                or not isinstance(result.get("size"), int)
                or isinstance(result.get("size"), bool)
            ):
                raise NcclTuneError(f"{where} has no integer 'size'", path=path)
            if result["size"] < 0:
                raise NcclTuneError(f"{where}: 'size' is {result['size']}, not a byte count", path=path)
            for key, kind in (("type", str), ("redop", str), ("actual_iterations", int)):
                _json_field(result, key, kind, path, where)
            out = _json_block(result.get("out_of_place"), path, f"{where} out_of_place")
            per_iter = _json_field(result, "out_of_place_per_iter", dict, path, where)
            if out is not None and per_iter is not None:
                out["per_iter"] = {
                    k: _json_number(per_iter.get(k), k, path, f"{where} out_of_place_per_iter")
                    for k in ("min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us", "cv_pct")
                }
                times = _json_field(per_iter, "times_us", list, path, f"{where} out_of_place_per_iter")
                out["samples_us"] = (
                    None
                    if times is None
                    else [_json_number(t, "times_us", path, f"{where} out_of_place_per_iter") for t in times]
                )
                if out["samples_us"] is not None and None in out["samples_us"]:
                    raise NcclTuneError(f"{where} out_of_place_per_iter: 'times_us' holds a null", path=path)
            root = str(result.get("root", "")).strip()
            run.rows.append(
                {
                    "line": None,
                    "entry": position,
                    "size": result["size"],
                    "count": result.get("count"),
                    "type": result.get("type"),
                    "redop": result.get("redop"),
                    "root": int(root) if re.match(r"^-?\d+$", root) else None,
                    "out": out,
                    "in": _json_block(result.get("in_place"), path, f"{where} in_place"),
                    "failure": None,
                    "truncated": out is None,
                    "iters": result.get("actual_iterations"),
                }
            )
        runs += split_interleaved(run, path) if run.rows else [run]
    if not any(r.rows for r in runs):
        raise NcclTuneError("no results in nccl-tests JSON", path=path)
    for number, run in enumerate(runs, start=1):
        run.number = number
    return runs, versions
