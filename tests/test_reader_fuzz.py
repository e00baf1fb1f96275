"""Every file reader against hostile input (DESIGN.md section 8, the input policy).

Each reader gets every input: random bytes, non-UTF-8 text, nesting 100,000 deep, a 1 MB
single line, a 50 MB file, JSON of the wrong types, a named pipe that no process writes to. Each must end with its own error (an
NcclTuneError: one line naming the file) or a result, within a time bound. The bound is
a hang detector, not a benchmark: each reader runs in a child process that is killed
when the whole table of inputs overruns, so a quadratic regular expression or a
recursion shows as a failure naming the reader and the input, not as a hung test run.

A new reader is one line in READERS: Python that defines `read(path)`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.slow  # a child process per reader, a 50 MB file

READERS = {
    "results": "from nccl_tune import store\nread = lambda p: store.read_records([p], warn=lambda m: None)",
    "grid": "from nccl_tune.measure import grid\nread = grid.load_grid_file",
    "plan": "from microbench import options\nread = options.load_plan",
    "model file": "from nccl_tune.model import calibrate\nread = calibrate.load",
    "topology paste": "from nccl_tune.live import sysinfo\nread = sysinfo.topology_info",
    "nccl-tests output": "from nccl_tune.measure import importers\nread = importers.import_file",
    "server log (SGLang, vLLM)": "from integration import logs\nread = logs.summarize_file",
    "NCCL log": "from nccl_tune.nccl import nccllog\nread = lambda p: nccllog.read_processes([p])",
    "profile": "from nccl_tune.live import profile\nread = profile.load_profile",
    "profile lint": "from nccl_tune.live import lint\nread = lint.lint_file",
    "conf file": "from nccl_tune.live import sysinfo\n"
    "read = lambda p: sysinfo.conf_files({'NCCL_CONF_FILE': p}, home='/nonexistent')",
    "reference table": "from nccl_tune.model import references\nread = references.load",
    "speculative config (validate --schedule)": "from integration import schedule_validate\n"
    "read = schedule_validate.read_schedule",
    "speculative config base (spec-plan)": "from nccl_tune.spec import schedule\nread = schedule.read_base",
}

MB = 1024 * 1024
# name -> bytes. Built once per run; the 50 MB file is plausible NCCL output, the slowest
# honest content for the log readers (every line reaches the parsers).
SMALL_INPUTS = {
    "empty": b"",
    "random bytes": random.Random(20).randbytes(64 * 1024),
    "random text": "".join(random.Random(21).choices("ab {}[]\"'=:,#|\\-.0123456789\n\t", k=64 * 1024)).encode(),
    "non-UTF-8": b"NCCL_PROTO=LL\n# \xff\xfe note\n",
    "non-UTF-8 in a record": b'{"schema": 1, "cell": "baseline", "label": "\xe9"}\n',
    "list nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "object nested 50,000 deep": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "TOML nested 100,000 deep": b"[grid]\nNCCL_PROTO = " + b"[" * 100_000,
    "1 MB line": b"a" * MB,
    "1 MB line of blanks in an NCCL line": b"h:1:1 [0] NCCL INFO " + b" \t" * (MB // 2) + b"x\n",
    "1 MB line of repeated prefixes": b"h:1:1 [0] NCCL INFO " * (MB // 20) + b"\n",
    "1 MB line of quotes and escapes": b'a="\\"' * (MB // 6) + b"\n",
    "1 MB of server args": b"server_args=ServerArgs(" + b"a='x', " * (MB // 7) + b"\n",
    # a profile's header at its caps: comment lines of a key and blanks, no colon (the
    # provenance pattern once backtracked between the key and the blanks: 4 s here)
    "long header comments": (b"#a" + b" " * 4000 + b"b\n") * 64 + b"NCCL_PROTO=LL\n",
    "wrong JSON types (model)": json.dumps(
        {"schema": "nccl-tune-model/1", "topology": ["pcie"], "nranks": "8", "params": []}
    ).encode(),
    "wrong JSON types (plan)": json.dumps({"cells": [{"cell": 1, "env": [], "round": "x"}]}).encode(),
    "wrong JSON types (record)": json.dumps({"schema": 1, "cell": ["x"], "bytes": "1", "lat_us": []}).encode() + b"\n",
    "wrong JSON types (references)": json.dumps([{"name": [], "points": "x", "n_gpus": {}}]).encode(),
    "JSON scalar": b'"just a string"',
    "JSON NaN and overflow": b'{"schema": 1, "cell": "baseline", "bytes": 1e999, "x": NaN}\n',
    "a 5,000-digit integer": b'{"schema": 1, "cell": "baseline", "bytes": ' + b"9" * 5000 + b"}\n",
    # a named pipe (mkfifo) that no process opens for writing: open() would block forever
    "named pipe, no writer": None,
}
BIG_LINE = b"host:123:456 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7\n"
BIG_INPUTS = {"50 MB file": BIG_LINE * (50 * MB // len(BIG_LINE))}
# Seconds for one read: a hang detector on a shared machine, not a speed target.
BOUND_S = {"small": 5.0, "big": 60.0}

DRIVER = textwrap.dedent("""
    import json, sys, time
    from nccl_tune import fileio
    from nccl_tune.errors import NcclTuneError
    fileio.PIPE_WAIT_S = 0.5  # the wait for a pipe's writer, shortened to fit BOUND_S
    exec(sys.argv[1])
    for name, path in json.loads(sys.argv[2]):
        print(json.dumps({"input": name, "start": True}), flush=True)
        start = time.monotonic()
        try:
            read(path)
            outcome, message = "result", ""
        except NcclTuneError as exc:
            outcome, message = "error", str(exc)
        except BaseException as exc:  # what the test fails on: the reader's crash
            outcome, message = "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps({"input": name, "outcome": outcome, "message": message,
                          "seconds": round(time.monotonic() - start, 3)}), flush=True)
""")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    made = []
    for size, table in (("small", SMALL_INPUTS), ("big", BIG_INPUTS)):
        for index, (name, data) in enumerate(table.items()):
            path = folder / f"{size}-{index}"
            if data is None:
                os.mkfifo(path)
            else:
                path.write_bytes(data)
            made.append((name, str(path), size))
    return made


@pytest.mark.parametrize("reader", list(READERS))
def test_reader_ends_with_its_own_error_or_a_result_in_time(reader, inputs):
    cases = [[name, path] for name, path, _ in inputs]
    limit = sum(BOUND_S[size] for *_, size in inputs)
    try:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, READERS[reader], json.dumps(cases)],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            cwd=REPO_ROOT,
            timeout=limit,
        )
    except subprocess.TimeoutExpired as exc:
        started = [json.loads(line) for line in (exc.stdout or b"").decode().splitlines()]
        pytest.fail(f"{reader}: hung on {started[-1]['input'] if started else 'its first input'}")
    results = [json.loads(line) for line in done.stdout.splitlines() if '"outcome"' in line]
    assert len(results) == len(inputs), done.stderr[-2000:]
    size_of = {name: size for name, _, size in inputs}
    path_of = {name: path for name, path, _ in inputs}
    for result in results:
        where = f"{reader} on {result['input']}"
        assert result["outcome"] in ("result", "error"), f"{where}: {result['message']}"
        assert result["seconds"] < BOUND_S[size_of[result["input"]]], f"{where}: {result['seconds']} s"
        if result["outcome"] == "error":
            assert "\n" not in result["message"] and path_of[result["input"]] in result["message"], (
                f"{where}: {result['message']!r}"
            )
