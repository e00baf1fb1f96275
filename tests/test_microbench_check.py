"""The correctness checker, the timers' bookkeeping and the NCCL log capture (no GPU)."""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading

import numpy as np
import pytest

from microbench import check, nccllog, timing
from nccl_tune.nccl import debuglog

# ---------------------------------------------------------------- correctness check


def _simulate(op: str, world: int, count: int, max_exact: int, dtype=np.float32) -> list[np.ndarray]:
    """Each rank's result of a correct collective, computed the slow way."""
    inputs = [check.input_values(op, r, world, count, max_exact).astype(dtype) for r in range(world)]
    if op == "allreduce":
        total = np.sum(inputs, axis=0, dtype=dtype)
        return [total.copy() for _ in range(world)]
    if op == "reduce_scatter":
        total = np.sum(inputs, axis=0, dtype=dtype)
        chunk = count // world
        return [total[r * chunk : (r + 1) * chunk] for r in range(world)]
    return [np.concatenate(inputs) for _ in range(world)]


@pytest.mark.parametrize("op", ["allreduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_expected_values_match_a_simulated_collective(op, world):
    count = 7168 // world * world
    results = _simulate(op, world, count, 256)
    for rank in range(world):
        expected = check.expected_values(op, rank, world, count, 256)
        assert check.count_wrong(results[rank], expected) == 0


def test_inputs_differ_between_ranks_and_sums_stay_exact_in_bf16():
    for world in (2, 4, 8):
        bound = check.value_bound("allreduce", world, 256)
        assert world * bound <= 256  # every partial sum is an exact bf16 integer
        a, b = (check.input_values("allreduce", r, world, 4096, 256) for r in (0, 1))
        assert not np.array_equal(a, b)


def test_checker_catches_a_wrong_result():
    world, count = 4, 4096
    good = check.expected_values("allreduce", 0, world, count, 256)
    assert check.count_wrong(good.copy(), good) == 0
    bad = good.copy()
    bad[123] += 1
    assert check.count_wrong(bad, good) == 1
    bad[7] = np.nan
    assert check.count_wrong(bad, good) == 2
    assert check.count_wrong(good[:-1], good) == count  # truncated output
    # A result missing one rank's contribution is caught everywhere that rank's value is not 0.
    partial = sum(check.input_values("allreduce", r, world, count, 256) for r in range(world - 1))
    assert check.count_wrong(partial, good) == np.count_nonzero(check.input_values("allreduce", 3, world, count, 256))


def test_checker_catches_swapped_all_gather_blocks():
    world, count = 4, 4096
    good = check.expected_values("all_gather", 0, world, count, 256)
    chunk = count // world
    swapped = np.concatenate([good[chunk : 2 * chunk], good[:chunk], good[2 * chunk :]])
    assert check.count_wrong(swapped, good) > chunk // 2


def test_bf16_roundtrip_of_check_values_is_exact():
    torch = pytest.importorskip("torch")
    for world in (2, 8):
        expected = check.expected_values("allreduce", 0, world, 7168, 256)
        roundtrip = torch.from_numpy(expected).to(torch.bfloat16).float().numpy()
        assert check.count_wrong(roundtrip, expected) == 0


# ---------------------------------------------------------------- timers and watchdog


class FakeClock:
    """A clock that moves only when told: timing arithmetic checked exactly, whatever
    the load on the machine."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_cpu_eager_times_each_aligned_call():
    calls, clock = [], FakeClock()
    samples = timing.cpu_eager(
        lambda: clock.advance(0.002),
        lambda: (calls.append("align"), clock.advance(1.0)),
        5,
        lambda: calls.append("beat"),
        clock=clock,
    )
    assert samples == pytest.approx([2000.0] * 5)  # the alignment is not timed
    assert calls == ["beat", "align"] * 5


def test_watchdog_expires_only_without_heartbeats():
    clock = FakeClock()
    dog = timing.Watchdog(0.3, lambda what, s: None, clock=clock)
    for _ in range(20):  # beats closer than the timeout: never expired, however long in all
        clock.advance(0.29)
        assert not dog.expired()
        dog.beat()
    clock.advance(0.31)
    assert dog.expired()


def test_watchdog_thread_reports_what_was_running():
    fired = threading.Event()
    seen = []
    dog = timing.Watchdog(0.2, lambda what, s: (seen.append((what, s)), fired.set()), poll_s=0.02).start()
    dog.beat("stuck in a collective")
    assert fired.wait(30.0)  # a lower bound only: no upper time limit on a loaded machine
    assert seen == [("stuck in a collective", 0.2)]


# ---------------------------------------------------------------- NCCL log capture


def test_capture_install_and_offsets(tmp_path):
    environ = {"NCCL_DEBUG": "WARN"}
    cap = nccllog.NcclLogCapture(str(tmp_path), environ)
    previous = cap.install()
    assert previous == {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": None, "NCCL_DEBUG_FILE": None}
    assert environ["NCCL_DEBUG"] == "INFO" and environ["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,TUNING"
    assert environ["NCCL_DEBUG_FILE"].endswith("nccl.0000.%h.%p.log")
    first = tmp_path / "nccl.0000.host.1.log"
    first.write_text("h:1:1 [0] NCCL INFO NCCL version 2.24.3+cuda12.6\n")
    snap = cap.snapshot()
    with first.open("a") as handle:
        handle.write("h:1:1 [0] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}\n")
        handle.write("h:1:1 [0] NCCL INFO partial line still being writ")
    (tmp_path / "nccl.0001.host.1.log").write_text("h:1:1 [0] NCCL INFO Connected all rings\n")
    lines = cap.read_since(snap)
    assert [e.kind for e in debuglog.parse_log(lines)] == ["choice", "connected"]
    assert len(cap.read_since({})) == 3
    cap.cleanup()
    assert not tmp_path.exists()


def test_loaded_nccl_paths_reads_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /opt/lib/libnccl.so.2.21.5\n"
        "7f01-7f02 r--p 00000000 08:01 2 /usr/lib/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
    )
    assert nccllog.loaded_nccl_paths(str(maps)) == ["/opt/lib/libnccl.so.2.21.5"]
    assert nccllog.loaded_nccl_paths(str(tmp_path / "absent")) == []


def _pip_libnccl():
    for entry in sys.path:
        found = glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so*"))
        if found:
            return found[0]
    return None


def test_quiet_and_loud_switch_files_through_the_real_library(tmp_path):
    """With the pip libnccl loaded, quiet()/loud() find ncclResetDebugInit and start new files."""
    path = _pip_libnccl()
    if path is None:
        pytest.skip("nvidia-nccl-cu12 is not installed")
    ctypes.CDLL(path)  # now mapped into this process, as torch would map it
    environ = {}
    cap = nccllog.NcclLogCapture(str(tmp_path), environ)
    cap.install()
    assert cap.quiet() is True and cap.reset_available is True
    assert environ["NCCL_DEBUG_SUBSYS"] == "INIT,ENV" and ".0001." in environ["NCCL_DEBUG_FILE"]
    assert cap.loud() is True
    assert environ["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,TUNING" and ".0002." in environ["NCCL_DEBUG_FILE"]


def test_quiet_reports_false_without_the_reset_function(tmp_path, monkeypatch):
    monkeypatch.setattr(nccllog, "find_reset_function", lambda: None)
    cap = nccllog.NcclLogCapture(str(tmp_path), {})
    cap.install()
    assert cap.quiet() is False and cap.reset_available is False
    assert cap.loud() is False


def test_size_record_turns_the_captured_log_into_effective(tmp_path, monkeypatch):
    """The wiring from captured NCCL lines to a record's `effective` (no NCCL run needed)."""
    from microbench import allreduce, options
    from tests.conftest import OWN_FIXTURES

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    args = options.parse_args(["--backend", "gloo", "--sizes", "14336"])
    bench = allreduce.Bench(args, None, {})
    bench.capture = nccllog.NcclLogCapture(str(tmp_path), {})
    bench.backend, bench.nnodes, bench.hosts, bench.gpus = "nccl", 1, ["box3", "box3"], None
    bench.versions = {"torch": "x", "cuda": None, "nccl": "2.24.3"}
    snapshot = bench.capture.snapshot()
    log = (OWN_FIXTURES / "nccl_log" / "nccl2.24_named_choice_ray_prefix.txt").read_text()
    (tmp_path / "nccl.0000.box3.88123.log").write_text(log)
    cell = options.Cell(
        cell="c-x", env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, comm_env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    )
    record = bench.size_record(cell, 14336, [20.0, 22.0, 21.0], 0, snapshot)
    assert record["effective"]["confirmed"] is True
    assert (record["effective"]["algo"], record["effective"]["proto"]) == ("Ring", "LL")
    assert record["status"] == "ok" and record["correct"] is True and record["lat_us"]["p50"] == 21.0
    wrong = options.Cell(cell="c-y", env={"NCCL_PROTO": "Simple"}, comm_env={"NCCL_PROTO": "Simple"})
    assert bench.size_record(wrong, 14336, [20.0], 3, {})["effective"]["confirmed"] is False
    bench.watchdog.stop()
