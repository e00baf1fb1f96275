"""The results store: JSON Lines, one record per (cell, message size, round).

Contract (DESIGN.md section 3). Writers append one record at a time and flush it, so a
crash or Ctrl-C never loses what was already measured. Readers skip a corrupt or
foreign line with a warning naming file and line, and keep every other record.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

from nccl_tune import fileio, vocab
from nccl_tune.errors import NcclTuneError

SCHEMA = 1
MARKER_SCHEMA = 2  # supersede markers (see `supersede`): schema-1 readers skip them
SUPERSEDE = "supersede"
BACKENDS = ("nccl", "gloo", "sim", "nccl-tests")
STATUSES = ("ok", "failed", "timeout", "wrong")
BASELINE = "baseline"

# Every record carries these keys (None where unknown); writers may add more.
FIELDS = (
    "schema",
    "run_id",
    "cell",
    "env",
    "backend",
    "op",
    "mode",
    "world_size",
    "nnodes",
    "bytes",
    "dtype",
    "iters",
    "lat_us",
    "samples_us",
    "algbw_gbps",
    "busbw_gbps",
    "correct",
    "wrong",
    "effective",
    "versions",
    "host",
    "gpus",
    "topology",
    "status",
    "error",
    "time",
    "round",
    "label",
)
LAT_KEYS = ("min", "p10", "p50", "p90", "p99", "max", "mean", "cv", "n")


# ---------------------------------------------------------------- field types
#
# What a reader may assume of a record's fields. A line whose JSON is valid but whose
# fields have other types (a hand edit, another tool's output, a bug elsewhere) is
# skipped like a corrupt line: readers (report, recommend, sweep resume, validate)
# index, hash and compute with these values. Every field may also be absent or null.


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_nonneg(value) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 0


def _str_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _str_list(value) -> bool:
    return isinstance(value, list) and all(v is None or isinstance(v, str) for v in value)


def _lat(value) -> bool:
    if not isinstance(value, dict):
        return False
    for key in LAT_KEYS:
        item = value.get(key)
        if item is None:
            continue
        if key == "n" and not (_is_int(item) and item >= 0):
            return False
        if key != "n" and not _finite_nonneg(item):
            return False
    return True


def _effective(value) -> bool:
    return (
        isinstance(value, dict)
        and all(value.get(k) is None or isinstance(value[k], str) for k in ("algo", "proto", "detail"))
        and (value.get("channels") is None or _is_int(value["channels"]))
        and value.get("confirmed") in (None, True, False)
    )


def _count(low: int, high: int) -> Callable[[object], bool]:
    """An integer in [low, high]: the option vocabulary's physical bound (nccl_tune.vocab),
    so a record holds no value an option would refuse (10**30 bytes, 10**20 ranks)."""
    return lambda v: _is_int(v) and low <= v <= high


# field -> (check of a non-null value, what it must be)
FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "run_id": (lambda v: isinstance(v, str), "a string"),
    "cell": (lambda v: isinstance(v, str), "a string"),
    "env": (_str_map, "an object of NAME: string values"),
    "backend": (lambda v: isinstance(v, str), "a string"),
    "op": (lambda v: isinstance(v, str), "a string"),
    "mode": (lambda v: isinstance(v, str), "a string"),
    "world_size": (_count(1, vocab.MAX_RANKS), f"an integer from 1 to {vocab.MAX_RANKS}"),
    "nnodes": (_count(1, vocab.MAX_RANKS), f"an integer from 1 to {vocab.MAX_RANKS}"),
    "bytes": (_count(1, vocab.MAX_BYTES), f"an integer from 1 to {vocab.MAX_BYTES}"),
    "dtype": (lambda v: isinstance(v, str), "a string"),
    "iters": (_count(0, vocab.MAX_ITERS), f"an integer from 0 to {vocab.MAX_ITERS}"),
    "lat_us": (_lat, "an object of finite non-negative numbers (n an integer)"),
    "samples_us": (
        lambda v: isinstance(v, list) and all(_finite_nonneg(x) for x in v),
        "a list of finite non-negative numbers",
    ),
    "algbw_gbps": (_finite_nonneg, "a finite non-negative number"),
    "busbw_gbps": (_finite_nonneg, "a finite non-negative number"),
    "correct": (lambda v: isinstance(v, bool), "true or false"),
    "wrong": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "effective": (_effective, "an object with string algo/proto/detail, integer channels and boolean confirmed"),
    "versions": (
        lambda v: isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()),
        "an object of version strings",
    ),
    "host": (lambda v: isinstance(v, str), "a string"),
    "hosts": (_str_list, "a list of strings"),
    "gpus": (_str_list, "a list of strings"),
    "topology": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "status": (lambda v: v in STATUSES, "one of " + ", ".join(STATUSES)),
    "error": (lambda v: isinstance(v, str), "a string"),
    "time": (lambda v: isinstance(v, str), "a string"),
    "round": (_is_int, "an integer"),
    "label": (lambda v: isinstance(v, str), "a string"),
    "rung": (_is_int, "an integer"),
    "final": (lambda v: isinstance(v, bool), "true or false"),
    "superseded": (lambda v: isinstance(v, bool), "true or false"),
    "strategy": (lambda v: isinstance(v, str), "a string"),
    "isolation": (lambda v: isinstance(v, str), "a string"),
    "source_file": (lambda v: isinstance(v, str), "a string"),
    "sweep": (lambda v: isinstance(v, dict), "an object (the sweep's identity)"),
    "conf_files": (
        lambda v: isinstance(v, dict) and all(_str_map(x) for x in v.values()),
        "an object of path: {NAME: value}",
    ),
}


def field_problem(record: dict) -> str | None:
    """Why a decoded record cannot be used ('field X is ..., expected ...'), or None."""
    for name, (check, expected) in FIELD_TYPES.items():
        value = record.get(name)
        if value is not None and not check(value):
            shown = json.dumps(value, default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return f"field {name} is {shown}, expected {expected}"
    p50 = (record.get("lat_us") or {}).get("p50")
    if p50 is not None and p50 <= 0 and (record.get("status") or "ok") == "ok":
        # Latency curves and bandwidths divide by it; zero is no measurement.
        return f"field lat_us has p50 {p50}, expected a positive latency in an ok record"
    return None


def cell_id(env: dict[str, str]) -> str:
    """A stable id for a set of NCCL settings: 'baseline' when empty, else 'c-' + hash.

    The hash covers the sorted KEY=VALUE pairs, so the same settings get the same id
    whatever their order or the run that measured them.
    """
    if not env:
        return BASELINE
    text = "\n".join(f"{k}={env[k]}" for k in sorted(env))
    return "c-" + hashlib.sha1(text.encode()).hexdigest()[:10]


def cell_label(env: dict[str, str]) -> str:
    """Human-readable settings: 'NCCL_PROTO=LL NCCL_ALGO=Ring', or 'baseline (NCCL defaults)'."""
    if not env:
        return "baseline (NCCL defaults)"
    return " ".join(f"{k}={v}" for k, v in env.items())


def new_run_id() -> str:
    """A unique, time-ordered id for one run of a command."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def now_iso() -> str:
    """Current UTC time as ISO 8601 with seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_record(**fields) -> dict:
    """A record with every contract key present (None where not given) plus extras.

    `schema`, `time` and `host` are filled in when not given; `cell` is derived from
    `env` when not given.
    """
    record = {key: None for key in FIELDS}
    record["schema"] = SCHEMA
    record["time"] = now_iso()
    record["host"] = socket.gethostname()
    record["status"] = "ok"
    record.update(fields)
    if record.get("cell") is None and record.get("env") is not None:
        record["cell"] = cell_id(record["env"])
    return record


def append_record(path: str, record: dict) -> None:
    """Append one record as a line and flush it to disk before returning.

    Under the results file's exclusive lock (nccl_tune.fileio.append_line: the run's held
    lock, or one taken for this line; another process writing the file is refused). A
    file whose last line is torn (a crash mid-write leaves no final newline) gets a
    newline first, so the new record starts a line of its own; a failed write (a full
    disk) is cut back, and a file it created is removed, so no torn or empty file stays.
    """
    fileio.append_line(path, json.dumps(record, separators=(",", ":"), default=str))


def append_records(path: str, records: Iterable[dict]) -> None:
    """Append records with one write under the results lock: all of them, or none when
    the write fails (an import retried after a full disk then adds no duplicates)."""
    fileio.append_lines(path, [json.dumps(r, separators=(",", ":"), default=str) for r in records])


def record_key(record: dict) -> tuple:
    """What identifies a sweep's records of one measurement: (run_id, cell, round, rung)."""
    return (record.get("run_id"), record.get("cell"), record.get("round"), record.get("rung"))


def supersede(path: str, keys: Iterable[tuple], **marks) -> int:
    """Take the records of `keys` (`record_key`s) out of every verdict, append-only.

    A resumed sweep that measures a failed cell again keeps the failed records but marks
    them `superseded: true, final: false` (plus `marks`, e.g. retried_by). The file is
    never rewritten: one marker line is appended (under the results lock, like every
    record), and readers apply it to the records before it. So nothing a concurrent
    writer appended can be lost, and a crash leaves either the marker or not. The marker
    has schema MARKER_SCHEMA, which readers of schema 1 skip with a warning instead of
    taking it for a measurement. Returns how many keys were marked.
    """
    keys = sorted({tuple(k) for k in keys}, key=repr)
    if not keys:
        return 0
    append_record(
        path,
        {
            "schema": MARKER_SCHEMA,
            "kind": SUPERSEDE,
            "cell": None,
            "time": now_iso(),
            "supersedes": [list(k) for k in keys],
            **marks,
        },
    )
    return len(keys)


def _marker(record: dict) -> list[tuple] | None:
    """The keys a supersede marker names, or None when `record` is no valid marker."""
    keys = record.get("supersedes")
    if record.get("kind") != SUPERSEDE or not isinstance(keys, list):
        return None
    if not all(isinstance(k, list) and len(k) == 4 for k in keys):
        return None
    return [tuple(k) for k in keys]


def _line_problem(raw: bytes) -> tuple[str | None, dict | None]:
    """(why the line is skipped, None) or (None, the decoded object)."""
    try:
        record = fileio.json_line(raw)
    except ValueError as exc:
        return str(exc), None
    if not isinstance(record, dict) or "schema" not in record:
        return "not a nccl-tune record", None
    if record.get("kind") == SUPERSEDE and record["schema"] == MARKER_SCHEMA:
        return (None, record) if _marker(record) is not None else ("a malformed supersede marker", None)
    if not _is_int(record["schema"]) or record["schema"] < 1:
        return f"field schema is {json.dumps(record['schema'])}, expected a positive integer", None
    if record["schema"] > SCHEMA:
        return f"schema {record['schema']!r} is newer than this tool's {SCHEMA}", None
    return field_problem(record), record


def iter_numbered_records(path: str, warn: Callable[[str], None] | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of the valid records of one file; skipped lines go to `warn`.

    The input policy (nccl_tune.fileio): a file that is not a results file at all (a
    model file, a profile: no record among its first lines) is one NcclTuneError, not a
    warning per line. In a results file each corrupt, torn, non-UTF-8, too deeply nested,
    wrongly typed or over-long line (fileio.MAX_LINE_BYTES) is skipped with a warning
    naming file and line, and every other record is kept. Supersede markers are applied
    to the records before them (`supersede`). Lines are split at '\\n' only (as they are
    written), so numbers are stable.
    """
    warn = warn or (lambda message: None)
    held: list[str] = []  # warnings before the first record: dropped if it is no results file
    found = False
    blank_or_bad = 0
    kept: list[tuple[int, dict]] = []
    marks: list[tuple[int, set, dict]] = []
    long_lines: dict[int, int] = {}

    def say(message: str) -> None:
        (warn if found else held.append)(message)

    for number, raw in fileio.iter_byte_lines(
        path, what="results file", max_line=fileio.MAX_LINE_BYTES, on_long=long_lines.__setitem__
    ):
        if not raw.strip():
            continue
        if number in long_lines:
            problem, record = f"a line of {long_lines[number]} bytes (at most {fileio.MAX_LINE_BYTES})", None
        else:
            problem, record = _line_problem(raw)
        if not found:
            if problem is None or fileio.is_results_line(raw):
                found = True
                for message in held:
                    warn(message)
            else:
                blank_or_bad += 1
                if blank_or_bad >= fileio.RESULTS_PROBE_LINES:
                    raise NcclTuneError(
                        f"not a nccl-tune results file (none of its first {blank_or_bad} lines is a record)", path=path
                    )
        if problem:
            say(f"{path}:{number}: skipped: {problem}")
            continue
        keys = _marker(record) if record.get("kind") == SUPERSEDE else None
        if keys is not None:
            extra = {k: v for k, v in record.items() if k not in ("schema", "kind", "cell", "time", "supersedes")}
            marks.append((number, set(keys), extra))
            continue
        kept.append((number, record))
    if not found and blank_or_bad:
        raise NcclTuneError("not a nccl-tune results file (no line of it is a record)", path=path)
    latest: dict[tuple, tuple[int, dict]] = {}  # key -> (line of the last marker naming it, marks)
    for marker_line, keys, extra in marks:
        for key in keys:
            latest[key] = (marker_line, extra)
    for number, record in kept:
        marker_line, extra = latest.get(record_key(record), (0, {}))
        if number < marker_line:
            record.update(superseded=True, final=False, **extra)
    yield from kept


def iter_records(path: str, warn: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Yield the valid records of one file; report each skipped line through `warn`."""
    for _, record in iter_numbered_records(path, warn):
        yield record


def read_records(paths: Iterable[str], warn: Callable[[str], None] | None = None) -> list[dict]:
    """All valid records of several files, in file order."""
    out: list[dict] = []
    for path in paths:
        out.extend(iter_records(path, warn))
    return out
