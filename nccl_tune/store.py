"""The results store: JSON Lines, one record per (cell, message size, round).

Contract (DESIGN.md section 3). Writers append one record at a time and flush it, so a
crash or Ctrl-C never loses what was already measured. Readers skip a corrupt or
foreign line with a warning naming file and line, and keep every other record.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from typing import Callable, Iterable, Iterator

from nccl_tune.errors import NcclTuneError

SCHEMA = 1
BACKENDS = ("nccl", "gloo", "sim", "nccl-tests")
STATUSES = ("ok", "failed", "timeout", "wrong")
BASELINE = "baseline"

# Every record carries these keys (None where unknown); writers may add more.
FIELDS = (
    "schema", "run_id", "cell", "env", "backend", "op", "mode", "world_size", "nnodes",
    "bytes", "dtype", "iters", "lat_us", "samples_us", "algbw_gbps", "busbw_gbps",
    "correct", "wrong", "effective", "versions", "host", "gpus", "topology", "status",
    "error", "time", "round", "label",
)
LAT_KEYS = ("min", "p10", "p50", "p90", "p99", "max", "mean", "cv", "n")


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
    """Append one record as a line and flush it to disk before returning."""
    line = json.dumps(record, separators=(",", ":"), default=str)
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise NcclTuneError(f"cannot append: {exc.strerror}", path=path) from None


def append_records(path: str, records: Iterable[dict]) -> None:
    """Append records one by one (each flushed), so a failure keeps the earlier ones."""
    for record in records:
        append_record(path, record)


def iter_records(path: str, warn: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Yield the valid records of one file; report each skipped line through `warn`."""
    try:
        handle = open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NcclTuneError(f"cannot read: {exc.strerror}", path=path) from None
    with handle:
        for number, line in enumerate(handle, start=1):
            text = line.strip()
            if not text:
                continue
            problem = None
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                problem = f"not JSON ({exc.msg})"
            else:
                if not isinstance(record, dict) or "schema" not in record:
                    problem = "not a nccl-tune record"
                elif not isinstance(record["schema"], int) or record["schema"] > SCHEMA:
                    problem = f"schema {record['schema']!r} is newer than this tool's {SCHEMA}"
            if problem:
                if warn:
                    warn(f"{path}:{number}: skipped: {problem}")
                continue
            yield record


def read_records(paths: Iterable[str], warn: Callable[[str], None] | None = None) -> list[dict]:
    """All valid records of several files, in file order."""
    out: list[dict] = []
    for path in paths:
        out.extend(iter_records(path, warn))
    return out
