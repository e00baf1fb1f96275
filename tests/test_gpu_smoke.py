"""bench/gpu_smoke.sh and bench/gpu_nocache_check.sh on a machine without a GPU: the
NCCL_NO_CACHE gate, the deadline, what a failed step says, the verdicts of world size 1,
and the archive. Steps are replaced through GPU_SMOKE_STEP_RUNNER
(tests/smoke_step_runner.sh), never by editing the scripts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from bench.smoke import checks, digest, gate
from nccl_tune.measure import sweepplan
from tests.conftest import REPO_ROOT, subprocess_env

RUNNER = str(REPO_ROOT / "tests" / "smoke_step_runner.sh")


def _smoke(tmp_path: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "bench/gpu_smoke.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(**env),
    )


@pytest.fixture(autouse=True)
def _smoke_folders_in_tmp(tmp_path, monkeypatch):
    """The scripts make their folders with mktemp under /tmp: leave none behind."""
    before = set(Path("/tmp").glob("nccl-tune-smoke.*")) | set(Path("/tmp").glob("nccl-tune-nocache.*"))
    yield
    after = set(Path("/tmp").glob("nccl-tune-smoke.*")) | set(Path("/tmp").glob("nccl-tune-nocache.*"))
    for folder in after - before:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the NCCL_NO_CACHE gate


@pytest.mark.parametrize("version, run", [("2.28.9", False), ("2.29.6", False), ("2.29.7", True), ("2.30.7", True)])
def test_gate_and_sweep_planner_decide_alike(version, run):
    """NCCL_NO_CACHE exists from 2.29.7 (DESIGN.md 5): the smoke's gate and the sweep's
    isolation auto (one function, settings.no_cache_supported) agree on every version."""
    decided, line = gate.decide(version)
    assert decided is run
    assert line == (
        f"RUN (NCCL {version} has NCCL_NO_CACHE, from 2.29.7)" if run else f"SKIP (NCCL {version} has no NCCL_NO_CACHE)"
    )
    parsed = tuple(int(x) for x in version.split("."))
    isolation, _ = sweepplan.resolve_isolation(None, "nccl", parsed)
    assert (isolation == "nocache") is run


def test_gate_without_a_version_skips_and_says_why():
    assert gate.decide(None, "torch 2.13.0+cpu maps no libnccl") == (
        False,
        "SKIP (no NCCL version known: torch 2.13.0+cpu maps no libnccl)",
    )


def _fake_libnccl(folder: Path, code: int) -> Path:
    """A libnccl.so.2 whose only symbol is ncclGetVersion, returning `code`."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build a stand-in libnccl")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fake.c").write_text(f"int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n")
    lib = folder / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(folder / "fake.c")], check=True)
    return lib


@pytest.mark.slow
@pytest.mark.parametrize("code, version, run", [(22809, "2.28.9", False), (23007, "2.30.7", True)])
def test_nocache_check_gates_on_the_loaded_libnccls_version(tmp_path, code, version, run):
    """The libnccl mapped into the process (here preloaded: a CPU torch maps none) is
    asked for its version; 2.28.9 prints the SKIP line and exits 0 without launching,
    2.30.7 launches (the stand-in launch writes no log, so the check then fails)."""
    lib = _fake_libnccl(tmp_path / str(code), code)
    calls = tmp_path / "calls.txt"
    done = subprocess.run(
        ["bash", "bench/gpu_nocache_check.sh", str(tmp_path / "out")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(
            LD_PRELOAD=str(lib), GPU_SMOKE_STEP_RUNNER=RUNNER, SMOKE_FAKE="*=pass", SMOKE_FAKE_LOG=str(calls)
        ),
    )
    lines = done.stdout.splitlines()
    assert lines[0] == f"nocache gate: NCCL {version} (ncclGetVersion of {lib})"
    if run:
        assert lines[1] == "RUN (NCCL 2.30.7 has NCCL_NO_CACHE, from 2.29.7)"
        assert calls.read_text().startswith("nocache-launch ")
        assert done.returncode == 1 and "nocache check: FAILED: missing in NCCL's log" in done.stdout
    else:
        assert lines[1:] == ["SKIP (NCCL 2.28.9 has no NCCL_NO_CACHE)"] and done.returncode == 0
        assert not calls.exists()


# ---------------------------------------------------------------- the whole smoke on CPU


@pytest.mark.slow
def test_smoke_on_a_machine_without_gpu_skips_every_step_passes_and_archives(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = _smoke(tmp_path, OUT=str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    steps = ["preflight", "graph", "eager1", "eager10", "nocache", "loop64", "loopbf16"]
    for step in steps:
        assert any(line.startswith(f"SKIP {step}: no CUDA device") for line in done.stdout.splitlines()), step
    assert "0 failure(s)" in done.stdout.splitlines()
    with tarfile.open(out / "gpu-smoke.tar.gz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    assert {"smoke.log", "preflight.out", "preflight.rc", "steps.txt", "graph.skip"} <= names


@pytest.mark.slow
def test_smoke_ends_by_its_deadline_and_prints_its_summary_when_steps_hang(tmp_path):
    """Every step but the preflight sleeps far past any bound: the first is stopped at
    what the deadline leaves, the rest are not started, and the summary still comes."""
    start = time.monotonic()
    done = _smoke(
        tmp_path, GPU_SMOKE_DEADLINE_S="55", GPU_SMOKE_STEP_RUNNER=RUNNER, SMOKE_FAKE="preflight=pass *=sleep"
    )
    took = time.monotonic() - start
    assert took < 55, f"{took:.1f} s"
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    # 55 s less 30 s for the checks and the archive, 10 s of timeout's grace, and what
    # the stand-in preflight took (0 s, a little more on a busy machine)
    (header,) = [line for line in lines if line.startswith("== graph (bound ")]
    bound, elapsed = (int(x) for x in re.match(r"== graph \(bound (\d+) s, (\d+) s elapsed\)", header).groups())
    assert bound == 55 - 30 - 10 - elapsed and elapsed <= 3
    assert f"CUT  graph: stopped at its bound of {bound} s (exit code 124)" in lines
    for step in ("eager1", "eager10", "nocache", "loop64", "loopbf16"):
        assert any(line.startswith(f"CUT  {step}: not started:") for line in lines), step
    assert lines[-2].startswith("7 failure(s): graph cut; eager1 cut;")
    assert lines[-1].startswith("gpu_smoke: outputs in ") and "of the 55 s deadline" in lines[-1]


@pytest.mark.slow
def test_a_failing_worker_s_own_error_line_is_in_the_smoke_output(tmp_path):
    """The graph step really runs: torchrun starts the microbench with --backend nccl on a
    machine without CUDA, the worker refuses in one line and torchrun adds its
    ChildFailedError block; the smoke shows the worker's line, not the block."""
    done = _smoke(tmp_path, GPU_SMOKE_STEP_RUNNER=RUNNER, SMOKE_FAKE="preflight=pass graph=run *=pass")
    lines = done.stdout.splitlines()
    start = lines.index("-- graph (FAIL: exit code 1)")
    said = lines[start + 1 : start + 3]
    assert said[0] == (
        "  microbench.allreduce: rank 0: error: --backend nccl needs CUDA GPUs and a "
        "torch built with NCCL (torch.cuda.is_available() is False)"
    )
    assert said[1] == "  torchrun: failed (exitcode: 2) local_rank: 0"
    assert not any("ChildFailedError" in line or "Root Cause" in line for line in lines)


# ---------------------------------------------------------------- the digest

TORCHRUN_AFTER_A_WORKER = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "x.py", line 3, in <module>
torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
Last error:
socketStartConnect: Connect to 127.0.0.1<53447> failed : Software caused connection abort
host:123:123 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 127.0.0.1<53447> failed : Software caused connection abort
E1201 14:28:59.196000 17595 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 17676) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
microbench.allreduce FAILED
Root Cause (first observed failure):
  exitcode  : 1 (pid: 17676)
============================================================
"""


def test_digest_keeps_the_workers_reasons_and_drops_torchruns_block():
    assert digest.digest(TORCHRUN_AFTER_A_WORKER.splitlines()) == [
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled "
        "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9",
        "Last error:",
        "socketStartConnect: Connect to 127.0.0.1<53447> failed : Software caused connection abort",
        "host:123:123 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "127.0.0.1<53447> failed : Software caused connection abort",
        "torchrun: failed (exitcode: 1) local_rank: 0",
    ]


def test_digest_reads_warn_lines_from_a_kept_nccl_log_folder(tmp_path):
    kept = tmp_path / "graph.nccl" / "nccl-tune-log-abc"
    kept.mkdir(parents=True)
    (kept / "nccl.0000.host.42.log").write_text(
        "host:42:42 [0] NCCL INFO Init COMPLETE\n"
        "host:42:50 [0] transport/p2p.cc:275 (p2pMap) NCCL WARN Cuda failure 'out of memory'\n"
    )
    assert digest.digest(digest.read_lines([str(tmp_path / "graph.nccl")])) == [
        "host:42:50 [0] transport/p2p.cc:275 (p2pMap) NCCL WARN Cuda failure 'out of memory'"
    ]


# ---------------------------------------------------------------- verdicts at world size 1


def _record(cell: str, p50: float, **timing) -> dict:
    return {
        "cell": cell,
        "status": "ok",
        "correct": True,
        "iters": 200,
        "lat_us": {"p50": p50},
        "samples_us": [p50, p50 + 1.0],
        "timing_method": "device-aligned",
        "effective": {"confirmed": None},
        "versions": {"nccl_library": "/l/libnccl.so.2", "nccl_library_version": "2.28.9"},
        "timing": timing or None,
    }


def _folder(tmp_path: Path, graph_p50: float, eager_p50: float, short: int) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, recs in (
        ("graph", [_record("baseline", graph_p50), _record("c-proto-simple", graph_p50)]),
        (
            "eager1",
            [_record("c-default", eager_p50, head_start_us=61.0, head_start_intended_us=60.0, head_start_short=short)],
        ),
        ("eager10", [_record("c-default", eager_p50 * 2)]),
    ):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (tmp_path / f"{name}.rc").write_text("0\n")
    (tmp_path / "steps.txt").write_text("graph\neager1\neager10\n")
    return tmp_path


def test_world_one_mode_comparisons_are_info_whatever_they_show(tmp_path):
    """Graph slower than eager at world 1 (where NCCL runs no algorithm) is a figure, not
    a failure: the same folder with the opposite order gives the same verdicts."""
    slow_graph = checks.bench_checks(str(_folder(tmp_path / "a", 9.0, 5.0, short=0)))
    fast_graph = checks.bench_checks(str(_folder(tmp_path / "b", 5.0, 9.0, short=0)))
    assert [v.status for v in slow_graph] == [v.status for v in fast_graph]
    (line,) = [v for v in slow_graph if v.what.startswith("(d) graph per-op p50")]
    assert line.status == "INFO" and line.detail == "graph 9.0 us, eager 5.0 us"


@pytest.mark.parametrize("short, status", [(10, "PASS"), (11, "FAIL")])
def test_head_start_verdict_allows_five_percent_short_samples(tmp_path, short, status):
    """200 one-op eager samples: 10 short ones (5%) pass, 11 fail."""
    (verdict,) = [
        v for v in checks.bench_checks(str(_folder(tmp_path, 5.0, 9.0, short))) if v.what.startswith("(d) eager, 1 op")
    ]
    assert verdict.status == status and f"short in {short} of 200" in verdict.detail


def test_a_step_that_skipped_itself_is_a_skip_not_a_pass(tmp_path):
    (tmp_path / "nocache.rc").write_text("0\n")
    (tmp_path / "nocache.out").write_text(
        "nocache gate: NCCL 2.28.9 (ncclGetVersion of /l)\nSKIP (NCCL 2.28.9 has no NCCL_NO_CACHE)\n"
    )
    assert checks.step_verdict(str(tmp_path), "nocache").line() == "SKIP nocache: NCCL 2.28.9 has no NCCL_NO_CACHE"
