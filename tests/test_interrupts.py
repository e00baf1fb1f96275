"""Ctrl-C and SIGTERM end every command with exit 130 and one line, never click's
"Aborted!" with exit 1, and leave no rank running (issue 20: bench and validate)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import subprocess_env

from nccl_tune.measure import launch

pytestmark = pytest.mark.slow

TINY = "--layers 2 --hidden 32 --heads 2 --vocab 64 --prompt-len 6"


def _interrupt(argv, sig, whole_group, cwd, settle=lambda proc, seen: len(seen) >= 2):
    """Start `argv` in a session of its own, wait until its ranks run, send `sig` (to the
    whole group, as a terminal's Ctrl-C, or to the command alone), and return (exit code,
    stderr, the pids that were running under it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nccl_tune", *argv],
        env=subprocess_env(),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        seen |= set(launch.descendants(proc.pid))
        if settle(proc, seen):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    seen |= set(launch.descendants(proc.pid))
    try:
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        launch.kill_tree(proc)  # whatever the outcome, nothing of the test stays behind
    return proc.returncode, err, seen


def _check(code, err, seen):
    assert code == 130, err
    assert "Aborted!" not in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "Error: interrupted", err
    time.sleep(0.5)
    assert not [pid for pid in seen if launch._alive(pid)], "ranks left running"


def _ranks_started(proc, seen):  # torchrun and its two ranks
    return len(seen) >= 3


@pytest.mark.parametrize("sig, whole_group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_bench_interrupted(tmp_path, sig, whole_group):
    code, err, seen = _interrupt(
        ["bench", "--nproc", "2", "--sizes", "1K", "--iters", "5000000"], sig, whole_group, tmp_path, _ranks_started
    )
    _check(code, err, seen)


def test_validate_interrupted(tmp_path):
    (tmp_path / "p.env").write_text("NCCL_PROTO=LL\n")
    code, err, seen = _interrupt(
        [
            "validate",
            "--profile",
            "p.env",
            "--steps",
            "0",
            "--runs",
            "1000",
            "--max-tokens",
            "500",
            "--model-args",
            TINY,
            "--out",
            "v.jsonl",
        ],
        signal.SIGINT,
        True,
        tmp_path,
        _ranks_started,
    )
    _check(code, err, seen)
