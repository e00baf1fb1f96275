"""Results files under concurrency (DESIGN.md section 8): one writer at a time, nothing
duplicated, nothing lost. Real processes on the sim backend (nothing is measured: the
cost model draws the numbers), so the file, its lock and SIGKILL are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, subprocess_env

from nccl_tune import fileio, store

pytestmark = pytest.mark.slow

SIZES = "1K,14K"
SWEEP = [
    "sweep",
    "--backend",
    "sim",
    "--topology",
    "pcie-shm",
    "--grid",
    "decode",
    "--rounds",
    "1",
    "--sizes",
    SIZES,
    "--json",
]


def _sweep(out, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nccl_tune", *SWEEP, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
        **kwargs,
    )


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _lines(path) -> int:
    try:
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    except OSError:
        return 0


def _final_keys(path) -> list[tuple]:
    return [(r["cell"], r["round"], r["bytes"]) for r in store.read_records([str(path)]) if not r.get("superseded")]


def _expected_pairs() -> int:
    plan = subprocess.run(
        [sys.executable, "-m", "nccl_tune", *SWEEP, "--dry-run"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
        check=True,
    )
    return len(json.loads(plan.stdout)["cells"]) * len(SIZES.split(","))


def test_a_second_sweep_to_the_same_file_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "r.jsonl"
    first = _sweep(out)
    try:
        _wait_for(lambda: out.exists() and fileio._busy(str(out)) is not None, "the first sweep's lock")
        second = subprocess.run(
            [sys.executable, "-m", "nccl_tune", *SWEEP, "--out", str(out)],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            cwd=REPO_ROOT,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr == (
            f"Error: --out {out}: another process (pid {first.pid}) is writing "
            "results to this file; wait for it to finish or choose another file\n"
        )
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    keys = _final_keys(out)
    assert len(keys) == len(set(keys)) == _expected_pairs()  # every pair once


def test_a_sweep_killed_and_resumed_while_report_reads_loses_and_repeats_nothing(tmp_path):
    out = tmp_path / "r.jsonl"
    expected = _expected_pairs()
    first = _sweep(out)
    _wait_for(lambda: _lines(out) >= 40, "the first records")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    before = out.read_bytes()
    assert 0 < len(_final_keys(out)) < expected  # killed mid-way
    resumed = _sweep(out)
    reports = []
    while resumed.poll() is None or not reports:  # read while it writes, at least once
        reports.append(
            subprocess.run(
                [sys.executable, "-m", "nccl_tune", "report", "--json", str(out)],
                capture_output=True,
                text=True,
                env=subprocess_env(),
                cwd=REPO_ROOT,
                timeout=120,
            )
        )
    resumed.wait(timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for report in reports:  # a torn last line is skipped with a warning, never an error
        assert report.returncode == 0, report.stderr[-2000:]
        json.loads(report.stdout)
    after = out.read_bytes()
    assert after[: len(before)] == before  # nothing the killed sweep wrote was lost or changed
    keys = _final_keys(out)
    assert len(keys) == len(set(keys)) == expected  # every pair once, none twice
