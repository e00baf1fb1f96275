"""check: a real process started with a known environment (match, missing, different, tree)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import subprocess_env

from nccl_tune.cli import cli
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import procenv

pytestmark = pytest.mark.slow

PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_NTHREADS": "512"}

# The checked process starts a worker whose environment lost NCCL_ALGO and changed
# NCCL_NTHREADS (what a launcher that overwrites variables does); the worker starts a
# child of its own (a TP worker's helper), which inherits the worker's environment. The
# parent prints "worker_pid grandchild_pid", then waits to be killed.
WORKER = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(grandchild.pid, flush=True)
try:
    time.sleep(120)
finally:
    grandchild.kill()
"""
PARENT = """
import os, subprocess, sys, time
env = dict(os.environ); env.pop("NCCL_ALGO"); env["NCCL_NTHREADS"] = "256"
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
try:
    time.sleep(120)
finally:
    child.kill()
"""


@pytest.fixture
def server():
    """A process tree: parent with the full profile (+ NCCL_DEBUG), its worker, the worker's child."""
    env = subprocess_env(NCCL_PROTO="LL", NCCL_ALGO="Ring", NCCL_NTHREADS="512", NCCL_DEBUG="WARN")
    proc = subprocess.Popen([sys.executable, "-c", PARENT, WORKER], stdout=subprocess.PIPE, text=True, env=env)
    worker, grandchild = map(int, proc.stdout.readline().split())
    yield proc.pid, worker, grandchild
    proc.terminate()
    proc.wait(timeout=30)
    for pid in (worker, grandchild):  # SIGTERM skips the finally blocks: ours to stop
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "p.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
    return path


def test_match_and_extra(server):
    pid, _, _ = server
    (root,) = procenv.check_processes(PROFILE, pid)
    assert root.ok and root.pid == pid
    assert [v.status for v in root.variables] == ["ok", "ok", "ok"]
    assert root.extra == {"NCCL_DEBUG": "WARN"}
    assert root.cmdline[0] == sys.executable


def test_missing_and_different(server):
    pid, _, _ = server
    wanted = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "16777216"}
    (root,) = procenv.check_processes(wanted, pid)
    assert not root.ok
    assert [(v.name, v.status, v.actual) for v in root.variables] == [
        ("NCCL_PROTO", "different", "LL"),
        ("NCCL_ALGO", "ok", "Ring"),
        ("NCCL_BUFFSIZE", "missing", None),
    ]


def test_tree_finds_the_child_and_the_grandchild(server):
    pid, worker, grandchild = server
    results = procenv.check_processes(PROFILE, pid, tree=True)
    assert [r.pid for r in results] == [pid, worker, grandchild]
    child, grand = results[1], results[2]
    assert child.ppid == pid and grand.ppid == worker  # two levels below the checked pid
    for found in (child, grand):
        assert not found.ok
        assert {v.name: (v.status, v.actual) for v in found.variables} == {
            "NCCL_PROTO": ("ok", "LL"),
            "NCCL_ALGO": ("missing", None),
            "NCCL_NTHREADS": ("different", "256"),
        }
    assert procenv.descendants(pid) == [worker, grandchild]


def test_cli_exit_codes_and_json(server, profile_file, cli_runner):
    pid, worker, grandchild = server
    ok = cli_runner.invoke(cli, ["check", "--profile", str(profile_file), "--pid", str(pid)])
    assert ok.exit_code == 0, ok.output
    tree = cli_runner.invoke(cli, ["check", "--profile", str(profile_file), "--pid", str(pid), "--tree"])
    assert tree.exit_code == 1
    assert f"pid {worker}: NCCL_ALGO missing (profile: Ring)" in tree.output
    assert f"pid {worker}: NCCL_NTHREADS different: process 256, profile 512" in tree.output
    assert f"pid {grandchild}: NCCL_ALGO missing (profile: Ring)" in tree.output
    data = json.loads(
        cli_runner.invoke(cli, ["check", "--profile", str(profile_file), "--pid", str(pid), "--tree", "--json"]).stdout
    )
    assert [(d["pid"], d["ok"]) for d in data] == [(pid, True), (worker, False), (grandchild, False)]
    assert data[0]["extra"] == {"NCCL_DEBUG": "WARN"}


def test_unreadable_process_is_exit_2(profile_file, cli_runner):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    with pytest.raises(NcclTuneError):
        procenv.check_processes(PROFILE, dead.pid)
    result = cli_runner.invoke(cli, ["check", "--profile", str(profile_file), "--pid", str(dead.pid)])
    assert result.exit_code == 2 and f"no process with pid {dead.pid}" in result.output


def test_compare_env_is_pure():
    checks, extra = procenv.compare_env({"NCCL_A": "1", "NCCL_B": "2"}, {"NCCL_A": "1", "NCCL_C": "3", "PATH": "/bin"})
    assert [(c.name, c.status) for c in checks] == [("NCCL_A", "ok"), ("NCCL_B", "missing")]
    assert extra == {"NCCL_C": "3"}


def test_unreadable_descendant_is_reported_not_fatal(server, monkeypatch):
    pid, worker, _ = server
    real = procenv.read_environ

    def deny_worker(p):
        if p == worker:
            raise PermissionError(13, "Permission denied")
        return real(p)

    monkeypatch.setattr(procenv, "read_environ", deny_worker)
    results = procenv.check_processes(PROFILE, pid, tree=True)
    assert [r.ok for r in results] == [True, False, False]
    assert "Permission denied" in results[1].error and results[1].variables == []
    monkeypatch.setattr(procenv, "read_environ", lambda p: deny_worker(worker))
    with pytest.raises(NcclTuneError) as info:
        procenv.check_processes(PROFILE, pid)
    assert f"pid {pid}: cannot read its environment" in str(info.value)


def test_readme_example_server_with_two_workers():
    # The README's check example, with the shipped example server and profile.
    from conftest import REPO_ROOT

    argv = [
        sys.executable,
        "-m",
        "nccl_tune",
        "exec",
        "--clean",
        "--profile",
        "pcie-8gpu-decode",
        "--",
        sys.executable,
        str(REPO_ROOT / "examples" / "server_with_two_workers.py"),
        "60",
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(NCCL_DEBUG="INFO"),
        cwd=REPO_ROOT,
    )
    try:
        words = proc.stdout.readline().replace(",", "").split()
        assert words[0] == "server" and words[2] == "workers", words
        server, first, second = int(words[1]), int(words[3]), int(words[4])
        assert server == proc.pid  # exec replaced nccl-tune: the server keeps its pid
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nccl_tune",
                "check",
                "--profile",
                "pcie-8gpu-decode",
                "--pid",
                str(server),
                "--tree",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            cwd=REPO_ROOT,
            timeout=60,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        by_pid = {p["pid"]: p for p in json.loads(done.stdout)}
        assert by_pid[server]["ok"] and by_pid[first]["ok"] and not by_pid[second]["ok"]
        missing = [v["name"] for v in by_pid[second]["variables"] if v["status"] == "missing"]
        assert missing == ["NCCL_P2P_LEVEL"]
        assert by_pid[server]["extra"] == {}  # --clean removed the caller's NCCL_DEBUG
    finally:
        proc.kill()
        proc.wait()


def _a_kernel_thread() -> int | None:
    for entry in sorted(os.listdir("/proc"), key=lambda e: (len(e), e)):
        if entry.isdigit() and procenv.is_kernel_thread(int(entry)):
            return int(entry)
    return None


def test_a_kernel_thread_is_named_not_reported_missing(profile_file, cli_runner):
    pid = _a_kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread is visible in this PID namespace")
    result = cli_runner.invoke(cli, ["check", "--profile", profile_file, "--pid", str(pid)])
    assert result.exit_code == 2
    comm = procenv.read_comm(pid)
    assert result.output.strip() == (
        f"Error: pid {pid} ({comm}) is a kernel thread: it has no environment to check (give a server's pid)"
    )


def test_kernel_thread_flag_is_read_from_stat(monkeypatch):
    # /proc/PID/stat field 9 (flags): kthreadd's 0x208040 carries PF_KTHREAD (0x00200000)
    fields = {2: "S 0 0 0 0 -1 2129984 0 0".split(), 7: "S 1 7 7 0 -1 4194560 0 0".split()}
    monkeypatch.setattr(procenv, "_stat_fields", lambda pid: fields.get(pid, []))
    assert procenv.is_kernel_thread(2) and not procenv.is_kernel_thread(7)
    assert not procenv.is_kernel_thread(99)
