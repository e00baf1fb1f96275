"""The CUDA/NCCL paths of the microbench, tested where they are pure or run on CPU:
alignment and its record, the libnccl really loaded, timeouts, conf-file values between
cells, NCCL's WARN lines and debug files, TORCH_NCCL_*, and clean-up on every exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from microbench import allreduce, nccllib, nccllog, options, timing
from nccl_tune.cli import cli
from nccl_tune.measure import launch, sweepplan
from nccl_tune.nccl import debuglog, ncclinfo
from tests.conftest import REPO_ROOT, subprocess_env

FAST = ["--iters", "3", "--warmup", "1"]


def _libnccl() -> str:
    """A loadable libnccl (nvidia-nccl-cu12 loads without a GPU), or skip."""
    lib = ncclinfo.default_library()
    if lib is None:
        pytest.skip("no loadable libnccl on this machine")
    return lib.path


# ---------------------------------------------------------------- 1: alignment


def test_timing_method_per_device_and_mode():
    assert timing.timing_method("cuda") == "device-aligned"
    assert timing.timing_method("cuda", gap_us=5.0) == "device-aligned"
    assert timing.timing_method("cpu") == "cpu-barrier"
    assert timing.timing_method("cpu", gap_us=250.0) == "cpu-last-arrival"
    assert set(timing.TIMING_METHODS) == {"cpu-barrier", "cpu-last-arrival", "device-aligned"}


def test_head_start_covers_the_host_enqueue_with_bounds():
    assert timing.head_start_us(15.0) == 50.0  # 2 x 15 + 20
    assert timing.head_start_us(0.0) == 20.0  # the documented bounds, [20 us, 5 ms]
    assert timing.head_start_us(1e6) == 5000.0
    assert timing.head_start_us(2490.0) == 5000.0  # 2 x 2490 + 20 = 5000, the bound itself
    assert timing.head_start_us(None) == 200.0 and timing.head_start_us(float("nan")) == 200.0
    assert timing.cycles_per_us(200_000, [0.1, 0.2, 0.1]) == pytest.approx(2000.0)  # median 0.1 ms
    assert timing.cycles_per_us(200_000, [0.0, -1.0]) is None
    assert timing.sleep_cycles(50.0, 1980.0) == 99_000 and timing.sleep_cycles(50.0, None) == 0


class _FakeEvent:
    log: list = []

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = len(_FakeEvent.log)
        _FakeEvent.log.append("record")

    def elapsed_time(self, other):  # ms: one "step" per logged action between the events
        return (other.t - self.t) / 1000.0


def test_cuda_sample_order_aligns_on_the_device_right_before_the_start_event(monkeypatch):
    """Per sample: host alignment, then the device alignment (the untimed collective and
    its head start), then start event, op(s), end event; the divisor applies."""
    import torch

    log = _FakeEvent.log
    log.clear()
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep {cycles}"), raising=False)
    align = timing.DeviceAlign(lambda: log.append("pre"), head_start_us=50.0, rate=2000.0)
    before = align.describe()  # before a timed loop: only what was intended
    assert before["head_start_intended_us"] == 50.0 and before["gpu_cycles_per_us"] == 2000.0
    assert before["head_start_us"] is None and before["head_start_short"] is None
    samples = timing.cuda_eager(
        lambda: log.append("op"), lambda: log.append("barrier"), iters=2, per_sample=3, device_align=align
    )
    # the mark (an event) right before the busy wait, then the start event
    one = ["barrier", "pre", "record", "sleep 100000", "record", "op", "op", "op", "record"]
    assert log == one + one + ["sync"]
    assert samples == [pytest.approx(4 / 3)] * 2  # 4 us between the events (1 us a step) / 3 ops
    # achieved head start: mark -> start event, 2 steps of the fake clock = 2 us
    assert align.achieved_us == [pytest.approx(2.0)] * 2 and len(align.host_after_us) == 2
    log.clear()
    no_sleep = timing.DeviceAlign(lambda: log.append("pre"), head_start_us=50.0, rate=None)
    assert no_sleep.describe()["head_start_us"] is None  # torch without _sleep: said so
    timing.cuda_graph(
        type("G", (), {"replay": lambda self: log.append("replay")})(), 10, lambda: None, 1, device_align=no_sleep
    )
    assert log == ["pre", "record", "replay", "record", "sync"]
    assert no_sleep.achieved_us == [] and no_sleep.describe()["head_start_basis"] is None


def test_head_start_record_is_the_measured_one_and_counts_short_samples():
    """describe() reports what the samples got: the median of the achieved head starts
    (not the intended one), their minimum, and the samples whose host enqueue after the
    wait took at least as long as the wait (host time could be inside those)."""
    align = timing.DeviceAlign(lambda: None, head_start_us=60.0, rate=1980.0, rate_before_loop=345.0)
    assert align.cycles == 118_800  # 60 us at 1980 cycles/us: sized with the higher rate given
    align.achieved_us = [61.0, 12.0, 60.5, 59.8, 60.2]  # one sample's wait ended early
    align.host_after_us = [20.0, 25.0, 19.0, 60.0, 21.0]  # one host enqueue as long as its wait
    d = align.describe()
    assert d["head_start_us"] == 60.2 and d["head_start_min_us"] == 12.0
    assert d["head_start_intended_us"] == 60.0 and d["head_start_short"] == 2  # 25 >= 12, 60 >= 59.8
    assert d["host_after_head_start_us"] == 21.0
    assert d["gpu_cycles_per_us"] == 1980.0 and d["gpu_cycles_per_us_before_loop"] == 345.0
    assert d["head_start_basis"] == "measured: CUDA events around the busy wait, median of 5 samples"


@pytest.mark.slow
def test_gloo_records_say_how_they_were_timed_and_the_torch_variables(tmp_path):
    out = tmp_path / "r.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "microbench.allreduce", "--backend", "gloo", "--sizes", "1K", "--out", str(out), *FAST],
        cwd=REPO_ROOT,
        env=subprocess_env(TORCH_NCCL_ENABLE_TIMING="1", TORCH_NCCL_BLOCKING_WAIT="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["timing_method"] == "cpu-barrier" and record["timing"] is None
    assert record["torch_nccl_env"] == {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ENABLE_TIMING": "1"}
    assert "# TORCH_NCCL_* at start: TORCH_NCCL_BLOCKING_WAIT=1 TORCH_NCCL_ENABLE_TIMING=1" in result.stdout
    assert "TORCH_NCCL_ENABLE_TIMING=1 adds host work" in result.stdout


# ---------------------------------------------------------------- 3: the libnccl loaded


def test_loaded_library_from_a_maps_file(tmp_path):
    path = _libnccl()
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f10 r-xp 00000000 08:01 123  /usr/lib/libc.so.6\n"
        f"7f10-7f20 r-xp 00000000 08:01 456  {path}\n"
        f"7f20-7f30 r--p 00010000 08:01 456  {path}\n"
    )
    lib = nccllib.loaded_library(str(maps))
    assert lib["path"] == path and lib["mapped"] == [path]
    assert lib["version"] == ncclinfo.library_version(path) and lib["error"] is None
    (tmp_path / "none").write_text("7f00-7f10 r-xp 00000000 08:01 123  /usr/lib/libc.so.6\n")
    none = nccllib.loaded_library(str(tmp_path / "none"))
    assert none["version"] is None and "no libnccl is mapped" in none["error"]


def test_a_process_that_loaded_libnccl_reports_that_file_and_its_version():
    path = _libnccl()
    code = (
        "import ctypes, json, sys; ctypes.CDLL(sys.argv[1]); from microbench import nccllib; "
        "print(json.dumps(nccllib.loaded_library()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, path],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lib = json.loads(out.stdout)
    assert os.path.realpath(lib["path"]) == os.path.realpath(path)
    assert lib["version"] == ncclinfo.library_version(path)


def test_version_record_trusts_the_loaded_library_and_says_when_versions_differ():
    same = nccllib.version_record(
        "2.21.5", {"path": "/x/libnccl.so.2", "version": "2.21.5", "mapped": ["/x/libnccl.so.2"]}, "2.21.5"
    )
    assert same["nccl"] == "2.21.5" and "nccl_note" not in same
    assert same["nccl_source"] == "ncclGetVersion of the loaded library"
    upgraded = nccllib.version_record(
        "2.21.5", {"path": "/p/libnccl.so.2", "version": "2.27.3", "mapped": ["/p/libnccl.so.2"]}, None
    )
    assert upgraded["nccl"] == "2.27.3" and upgraded["nccl_build"] == "2.21.5"
    assert "the loaded libnccl /p/libnccl.so.2 is 2.27.3, torch was built with 2.21.5" in upgraded["nccl_note"]
    from_log = nccllib.version_record("2.21.5", {"path": None, "version": None, "mapped": []}, "2.26.2")
    assert from_log["nccl"] == "2.26.2" and from_log["nccl_source"] == "NCCL's log"
    assert "NCCL's log says 2.26.2, torch was built with 2.21.5" in from_log["nccl_note"]
    only_build = nccllib.version_record("2.21.5", None, None)
    assert only_build["nccl"] == "2.21.5" and "not found" in only_build["nccl_source"]
    assert all(v is None or isinstance(v, str) for v in upgraded.values())  # store's contract


def test_log_version_line_reaches_the_version_record():
    log = ["NCCL version 2.26.2+cuda12.2", "host:1:1 [0] NCCL INFO Init COMPLETE"]
    version = debuglog.summarize_log(debuglog.parse_log(log))["version"]
    record = nccllib.version_record("2.26.2", {"version": "2.26.2", "path": "/l", "mapped": ["/l"]}, version)
    assert record["nccl_log"] == "2.26.2" and "nccl_note" not in record


def test_reset_debug_init_availability_by_version():
    assert "exists from 2.24.3" in nccllib.reset_debug_init_note(False, "2.23.4")
    assert "deprecated alias" in nccllib.reset_debug_init_note(True, "2.28.3")
    assert nccllib.reset_debug_init_note(True, "2.26.2") == "ncclResetDebugInit found"
    assert "not found" in nccllib.reset_debug_init_note(False, "2.26.2")


# ---------------------------------------------------------------- 4: timeouts


def test_nccl_watchdog_fires_inside_the_groups_timeout():
    group, watchdog = allreduce.timeouts("nccl", 300.0)
    assert watchdog == 300.0 and group == 300.0 + allreduce.GRACE_S  # ours first
    group, watchdog = allreduce.timeouts("gloo", 300.0)
    assert group == 300.0 and watchdog > group  # gloo raises in the caller: recorded by exchange


def test_expiry_line_names_rank_operation_and_nccl_warnings():
    line = allreduce.expiry_message(
        3, "all_gather", "measuring 14336 bytes in cell c-1", 300, "nccl", ["a WARN", "Cuda failure 'x'"]
    )
    assert line.startswith("rank 3: timeout: all_gather made no progress for 300 s while measuring")
    assert "blocks in a device sync" in line and line.endswith("[NCCL WARN: a WARN; Cuda failure 'x']")
    assert launch.ended_status(1, [f"microbench.allreduce: {line}"]) == "timeout"


def test_torchs_collective_timeout_makes_a_timeout_not_a_failure():
    torch_line = (
        "[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=7168, "
        "NumelOut=7168, Timeout(ms)=330000) ran for 330081 milliseconds before timing out."
    )
    assert launch.ended_status(-6, ["noise", torch_line]) == "timeout"
    assert launch.ended_status(1, ["RuntimeError: boom"]) == "failed"
    assert launch.ended_status(124, []) == "timeout"
    outcome = launch.LaunchOutcome("timeout", 1, 1.0, [torch_line], "")
    assert outcome.error_text().startswith("a collective timed out: [rank1]")
    assert "OpType=ALLREDUCE" in outcome.error_text()


# ---------------------------------------------------------------- 5: conf files between cells


def _cell(name, comm):
    return options.Cell(cell=name, env=dict(comm), comm_env=dict(comm))


def test_conf_values_a_cell_sets_and_another_drops_are_conflicts():
    conf = {
        "/home/u/.nccl.conf": {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"},
        "/etc/nccl.conf": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"},
    }
    cells = [_cell("baseline", {}), _cell("c-ll128", {"NCCL_PROTO": "LL128"})]
    # the first file wins (as NCCL's setenv(..., 0)); P2P_LEVEL is process-scoped
    assert options.conf_conflicts(conf, [c.comm_env for c in cells]) == [("/home/u/.nccl.conf", "NCCL_PROTO", 1)]
    message = options.conf_file_conflicts(conf, cells)
    assert "NCCL conf file /home/u/.nccl.conf sets NCCL_PROTO, which cell c-ll128 also sets" in message
    assert "--isolation process" in message
    # safe: no cell sets it, every cell sets it, or one cell alone
    assert options.conf_file_conflicts(conf, [_cell("b", {}), _cell("t", {"NCCL_THREAD_THRESHOLDS": "8"})]) is None
    assert (
        options.conf_file_conflicts(conf, [_cell("a", {"NCCL_PROTO": "LL"}), _cell("b", {"NCCL_PROTO": "Simple"})])
        is None
    )
    assert options.conf_file_conflicts(conf, cells[1:]) is None
    # under isolation nocache a cached (process-scoped) name is set per cell as well
    nthreads = [_cell("b", {}), _cell("t", {"NCCL_NTHREADS": "256"})]
    conf_nt = {"/etc/nccl.conf": {"NCCL_NTHREADS": "512"}}
    assert options.conf_file_conflicts(conf_nt, nthreads) is None
    assert "sets NCCL_NTHREADS" in options.conf_file_conflicts(conf_nt, nthreads, ("NCCL_NTHREADS",))


def test_conf_files_are_read_in_ncc_ls_order(tmp_path):
    from microbench import output

    home, own = tmp_path / "home", tmp_path / "own.conf"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_PROTO=LL\n")
    own.write_text("NCCL_ALGO=Tree\n")
    # NCCL_CONF_FILE replaces $HOME/.nccl.conf (src/misc/param.cc)
    with_own = output.read_conf_files({"HOME": str(home), "NCCL_CONF_FILE": str(own)})
    assert str(own) in with_own and str(home / ".nccl.conf") not in with_own
    assert str(home / ".nccl.conf") in output.read_conf_files({"HOME": str(home)})
    kept = sweepplan.conf_files({"HOME": str(home), "NCCL_CONF_FILE": str(own)}, keep=("NCCL_CONF_FILE",))
    assert kept[0] == (str(own), ["NCCL_ALGO"]) and all(p != str(home / ".nccl.conf") for p, _ in kept)


@pytest.mark.slow
def test_conf_values_matter_only_where_nccl_reads_them(tmp_path):
    """gloo never loads NCCL, so a gloo plan is not refused for a conf file (the NCCL
    path raises conf_file_conflicts' message through the same one-line exit 2)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_PROTO=LL\n")
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell": "baseline", "env": {}, "comm_env": {}},
                    {"cell": "c-simple", "env": {"NCCL_PROTO": "Simple"}, "comm_env": {"NCCL_PROTO": "Simple"}},
                ]
            }
        )
    )
    out = tmp_path / "r.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "microbench.allreduce",
            "--backend",
            "gloo",
            "--sizes",
            "1K",
            "--plan",
            str(plan),
            "--out",
            str(out),
            *FAST,
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert {json.loads(x)["cell"] for x in out.read_text().splitlines()} == {"baseline", "c-simple"}


def test_sweep_isolates_cells_whose_conf_values_would_be_lost(cli_runner, tmp_path):
    (tmp_path / ".nccl.conf").write_text("NCCL_PROTO=LL\n")
    env = {"HOME": str(tmp_path)}
    result = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_PROTO=Simple", "--backend", "nccl", "--dry-run", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["isolation"] == "process"
    assert any("isolation process: conf file value(s) NCCL_PROTO" in n for n in plan["notes"])
    refused = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_PROTO=Simple", "--backend", "nccl", "--isolation", "group", "--dry-run"], env=env
    )
    assert refused.exit_code == 2 and "--isolation group" in refused.output
    other = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_ALGO=Ring", "--backend", "nccl", "--dry-run", "--json"], env=env
    )
    assert json.loads(other.output)["isolation"] in ("group", "nocache")  # nothing lost: shared
    gloo = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_PROTO=Simple", "--backend", "gloo", "--dry-run", "--json"], env=env
    )
    assert json.loads(gloo.output)["isolation"] in ("group", "nocache")  # gloo reads no NCCL files


# ---------------------------------------------------------------- 6: NCCL's log

WARN_2_30 = "[2026-12-01 10:05:05] vm:29418:29418 [0] init.cc:2955 (ncclCommInitRank) NCCL WARN Cuda failure 'x'"


def test_warn_lines_of_every_form():
    assert nccllog.warn_messages(
        [
            WARN_2_30,
            "host:1:2 [1] transport/net.cc:10 NCCL WARN old form",
            "[1,0]<stderr>:host:1:2 [0] misc/socket.cc:5 (ncclSocketConnect) NCCL WARN refused",
            "host:1:2 [0] NCCL INFO not a warning",
            "junk",
        ]
    ) == ["Cuda failure 'x'", "old form", "refused"]


def test_debug_file_pattern_expands_as_ncc_ls():
    assert nccllog.expand_debug_file("/t/n.%h.%p.log", "node7.cluster.local", 42) == "/t/n.node7.42.log"
    assert nccllog.expand_debug_file("/t/%%h-%x", "a/b", 1) == "/t/%h-%x"
    assert nccllog.expand_debug_file("/t/%h", "a%b/c.d", 1) == "/t/a-b-c"


def test_captured_warnings_are_read_from_the_log_folder(tmp_path):
    capture = nccllog.NcclLogCapture(directory=str(tmp_path / "logs"), environ={})
    os.makedirs(capture.directory)
    capture.install(per_collective=False)
    assert capture.environ["NCCL_DEBUG_SUBSYS"] == nccllog.QUIET_SUBSYS  # no TUNING at all
    path = os.path.join(capture.directory, "nccl.0000.h.1.log")
    with open(path, "w") as handle:
        handle.write("h:1:1 [0] NCCL INFO Init COMPLETE\n")
    snap = capture.snapshot()
    with open(path, "a") as handle:
        handle.write("\n" + WARN_2_30 + "\n")
    assert capture.warnings() == ["Cuda failure 'x'"]
    assert nccllog.warn_messages(capture.read_since(snap)) == ["Cuda failure 'x'"]
    assert capture.read_since({}, with_files=True)[0] == ("nccl.0000.h.1.log", "h:1:1 [0] NCCL INFO Init COMPLETE")
    capture.cleanup()
    assert not os.path.exists(capture.directory)


def test_real_ncc_l_warnings_go_to_its_debug_file_and_are_read_back(tmp_path):
    """libnccl on a machine without a usable GPU: ncclCommInitRank fails and NCCL writes
    its WARN lines to NCCL_DEBUG_FILE (not stderr), in the 2.30+ `(func)` form."""
    path = _libnccl()
    code = (
        "import ctypes, json, sys; lib = ctypes.CDLL(sys.argv[1]); uid = ctypes.create_string_buffer(128); "
        "lib.ncclGetUniqueId(uid); comm = ctypes.c_void_p(); "
        "rc = lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0); "
        "from microbench import nccllog; print(json.dumps([rc, nccllog.user_debug_file_warnings()]))"
    )
    env = subprocess_env(NCCL_DEBUG="WARN", NCCL_DEBUG_FILE=str(tmp_path / "nccl.%h.%p.log"), CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [sys.executable, "-c", code, path], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rc, warns = json.loads(out.stdout.strip().splitlines()[-1])
    if rc == 0:
        pytest.skip("ncclCommInitRank succeeded here (a GPU is usable): no warning to read")
    assert warns and all("NCCL WARN" not in w for w in warns)  # messages, prefix stripped
    assert "NCCL WARN" not in out.stderr  # the file got them, not stderr
    assert allreduce.with_warnings("RuntimeError: x", warns).startswith("RuntimeError: x [NCCL WARN: ")


def test_reset_debug_init_is_exported_by_the_installed_libnccl():
    path = _libnccl()
    version = ncclinfo.library_version(path)
    import ctypes

    found = hasattr(ctypes.CDLL(path), "ncclResetDebugInit")
    assert found == (ncclinfo.parse_version(version) >= (2, 24, 3))


# ---------------------------------------------------------------- 7: TORCH_NCCL_*


def test_torch_nccl_variables_recorded_and_removed_from_launches():
    environ = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_PROTO": "LL",
        "PATH": "/bin",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    assert options.torch_nccl_env(environ) == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    notes = options.torch_env_notes({"TORCH_NCCL_BLOCKING_WAIT": "1"}, "graph")
    assert any("hang CUDA graph capture" in n for n in notes)
    env, removed = sweepplan.launch_environment({}, ("TORCH_NCCL_TRACE_BUFFER_SIZE",), environ)
    assert removed == ["NCCL_PROTO", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env


# ---------------------------------------------------------------- 6: clean-up on every exit

_GUARDED = """
import os, sys, shutil, time
from microbench import teardown
folder = sys.argv[1]
os.makedirs(folder)
teardown.install()
teardown.add(lambda: shutil.rmtree(folder))
print("ready", flush=True)
if sys.argv[2] == "block":
    import ctypes
    while True:  # stuck in C (a signal only cuts one sleep short): only the watcher can end it
        ctypes.CDLL(None).sleep(60)
elif sys.argv[2] == "exit":
    teardown.exit_now(3)
"""


@pytest.mark.parametrize("how,code", [("block", 128 + signal.SIGTERM), ("exit", 3), ("normal", 0)])
def test_the_folder_goes_on_every_exit_path(tmp_path, how, code):
    folder = tmp_path / "nccl-tune-log"
    proc = subprocess.Popen(
        [sys.executable, "-c", _GUARDED, str(folder), how],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    if how == "block":
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == code
    assert not folder.exists()
