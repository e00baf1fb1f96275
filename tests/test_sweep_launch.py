"""Launch mechanics with test doubles for torchrun: records, confirmation re-runs,
hangs, crashes, and no process left behind."""

from __future__ import annotations

import sys
import time

import factories
import pytest
from conftest import OWN_FIXTURES, subprocess_env

from nccl_tune.measure import launch
from nccl_tune.measure import sweep as sweeplib

FAKE = OWN_FIXTURES / "sweep" / "fake_torchrun.py"
SIZES = (1024, 4096)
pytestmark = pytest.mark.slow


_grid = factories.grid


def _engine(tmp_path, mode="records", backend="gloo", isolation="group", timeout=30.0, **fake_env):
    pidfile = tmp_path / "pids"
    env = subprocess_env(FAKE_PIDFILE=str(pidfile), **{k: str(v) for k, v in fake_env.items()})
    env["NCCL_INHERITED_JUNK"] = "1"  # must not reach any launch
    launcher = launch.Launcher(nproc=2, template=f"{sys.executable} {FAKE} {mode} {{args}}")
    options = sweeplib.MeasureOptions(backend, SIZES, iters=5)
    return sweeplib.SweepEngine(
        options, launcher, str(tmp_path / "r.jsonl"), isolation=isolation, timeout=timeout, base_env=env
    )


def _left_alive(tmp_path) -> list[int]:
    path = tmp_path / "pids"
    pids = [int(p) for p in path.read_text().split()] if path.exists() else []
    return [p for p in pids if launch._alive(p)]


def _records(tmp_path):
    return factories.read_records(tmp_path / "r.jsonl")


def test_grouped_launch_sets_each_cells_environment(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple,default", "NCCL_NTHREADS=256,default")
    engine = _engine(tmp_path)
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    assert engine.stats.launches == 2 and engine.stats.records_written == len(g.cells) * len(SIZES)
    for record in _records(tmp_path):
        assert record["seen_env"] == record["env"]  # process part by the launcher, comm part per cell
        assert record["isolation"] == "group" and record["round"] == 1
    assert not (tmp_path / "r.jsonl.work").exists()  # successful launches leave no files


def test_unconfirmed_nccl_cells_are_rerun_alone(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple")
    engine = _engine(tmp_path, backend="nccl", FAKE_CONFIRM="false")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    records = _records(tmp_path)
    superseded = [r for r in records if r.get("superseded")]
    final = [r for r in records if not r.get("superseded")]
    assert {r["cell"] for r in superseded} == {c.id for c in g.cells if c.comm_env}
    assert all(r["final"] is False and r["isolation"] == "group" for r in superseded)
    assert engine.stats.reruns == 2 and engine.stats.launches == 1 + 2
    by_cell = {r["cell"]: r["isolation"] for r in final}
    assert by_cell == {"baseline": "group", **{c.id: "process" for c in g.cells if c.comm_env}}
    assert sorted((r["cell"], r["bytes"]) for r in final) == sorted((c.id, b) for c in g.cells for b in SIZES)


def test_unconfirmable_nccl_switches_to_process_isolation(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple")
    engine = _engine(tmp_path, backend="nccl", FAKE_CONFIRM="null")
    sweeplib.run_rounds(engine, g.cells, rounds=2, seed=0)
    # Round 1: one shared launch, both PROTO cells unconfirmed -> re-run alone; then the
    # engine stops sharing processes: round 2 is three launches of one cell each.
    assert engine.stats.reruns == 2 and engine.stats.launches == 3 + 3
    assert engine.isolation == "process" and "switched to process" in engine.stats.notes[0]
    final = [r for r in _records(tmp_path) if not r.get("superseded")]
    assert {(r["round"], r["isolation"]) for r in final if r["cell"] != "baseline"} == {(1, "process"), (2, "process")}


def test_confirmed_cells_stay_grouped(tmp_path):
    engine = _engine(tmp_path, backend="nccl", FAKE_CONFIRM="true")
    sweeplib.run_rounds(engine, _grid("NCCL_PROTO=LL,Simple").cells, rounds=1, seed=0)
    assert engine.stats.reruns == 0 and engine.stats.launches == 1
    assert not any(r.get("superseded") for r in _records(tmp_path))


def test_hanging_launch_times_out_and_leaves_no_process(tmp_path):
    g = _grid("NCCL_NTHREADS=256,default")
    engine = _engine(tmp_path, mode="hang", isolation="process", timeout=2.0)
    start = time.monotonic()
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    assert time.monotonic() - start < 20
    records = _records(tmp_path)
    assert {r["status"] for r in records} == {"timeout"} and len(records) == 2 * len(SIZES)
    assert all("launch timed out" in r["error"] and "fake: hanging" in r["error"] for r in records)
    assert engine.stats.failures == {"timeout": 2}
    assert len((tmp_path / "pids").read_text().split()) == 2 * 3  # fake + child + grandchild, twice
    assert _left_alive(tmp_path) == []


def test_crashing_launch_is_recorded_and_the_sweep_goes_on(tmp_path):
    g = _grid("NCCL_NTHREADS=256,default")
    engine = _engine(tmp_path, mode="crash", isolation="process")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    records = _records(tmp_path)
    assert {r["status"] for r in records} == {"failed"} and len(records) == 2 * len(SIZES)
    error = records[0]["error"]
    assert "exited with code 3" in error and "fake: line 29" in error and "fake: line 5" not in error
    assert engine.stats.launches == 2 and _left_alive(tmp_path) == []


def test_crash_mid_group_blames_one_cell_and_relaunches_the_rest(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple,default", "NCCL_ALGO=Ring,Tree")  # one process group
    engine = _engine(tmp_path, FAKE_CRASH_AT=2)
    order = sweeplib.round_order(g.cells, 1, 0, "group")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    records = _records(tmp_path)
    status = {r["cell"]: r["status"] for r in records}
    # The relaunch meets FAKE_CRASH_AT=2 again at its own third cell.
    assert status[order[2].id] == "failed" and status[order[5].id] == "failed"
    assert [status[c.id] for c in order] == ["ok", "ok", "failed", "ok", "ok", "failed", "ok"]
    assert "Segmentation fault" in next(r["error"] for r in records if r["cell"] == order[2].id)
    assert engine.stats.launches == 3 and engine.stats.relaunches == 2
    # The engine's records of the crashed cells carry the machine and mode the ranks
    # reported, so the report lists them in the same family as the cells that ran.
    from nccl_tune.decide import report

    rows = report.summarize(records)
    assert len({(s.machine, s.mode, s.dtype) for s in rows}) == 1
    assert len(rows) == len(g.cells) * len(SIZES)


def test_hang_mid_group_times_out_one_cell(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple")
    engine = _engine(tmp_path, timeout=3.0, FAKE_HANG_AT=1)
    order = sweeplib.round_order(g.cells, 1, 0, "group")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    status = {r["cell"]: r["status"] for r in _records(tmp_path)}
    assert [status[c.id] for c in order] == ["ok", "timeout", "ok"]
    assert _left_alive(tmp_path) == []


def test_torchrun_boilerplate_is_left_out_of_errors(tmp_path):
    # The shape of torchrun's output after a rank failed (written here, not copied).
    log = tmp_path / "launch.log"
    log.write_text(
        "\n".join(
            [
                "*" * 41,
                "Setting OMP_NUM_THREADS environment variable for each process to be 1 ...",
                "*" * 41,
                "rank 1: the real reason",
                "W0101 00:00:00.000000 42 torch/distributed/elastic/multiprocessing/api.py:1] Sending SIGTERM",
                "Traceback (most recent call last):",
                '  File "/x/torch/distributed/run.py", line 1, in <module>',
                "    raise ChildFailedError(",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "=" * 60,
                "microbench.allreduce FAILED",
                "-" * 60,
                "Failures:",
                "  exitcode  : 2",
                "=" * 60,
            ]
        )
        + "\n"
    )
    assert launch.tail_lines(str(log)) == ["rank 1: the real reason"]
    prefixed = tmp_path / "prefixed.log"
    prefixed.write_text(log.read_text().replace(" 42 torch/distributed/", " 42 site-packages/torch/distributed/"))
    assert launch.tail_lines(str(prefixed)) == ["rank 1: the real reason"]
    plain = tmp_path / "plain.log"
    plain.write_text("".join(f"line {i}\n" for i in range(40)))
    assert launch.tail_lines(str(plain)) == [f"line {i}" for i in range(20, 40)]


def test_missing_launcher_fails_fast(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple,default", "NCCL_ALGO=Ring,Tree")
    options = sweeplib.MeasureOptions("gloo", SIZES)
    engine = sweeplib.SweepEngine(
        options, launch.Launcher(nproc=2, template="/no/such/torchrun {args}"), str(tmp_path / "r.jsonl"), timeout=10
    )
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    records = _records(tmp_path)
    assert engine.stats.launches == 2  # two empty failures in a row end the group
    assert {r["status"] for r in records} == {"failed"} and len(records) == len(g.cells) * len(SIZES)
    assert any("cannot start /no/such/torchrun" in r["error"] for r in records)
    assert (tmp_path / "r.jsonl.work").is_dir()  # failed launches keep their logs


def test_resume_after_crashes_measures_the_crashed_cells_again(tmp_path):
    g = _grid("NCCL_NTHREADS=256,default")
    crashed = _engine(tmp_path, mode="crash", isolation="process")
    sweeplib.run_rounds(crashed, g.cells, rounds=1, seed=0)
    assert {r["status"] for r in _records(tmp_path)} == {"failed"}
    working = _engine(tmp_path, isolation="process")
    sweeplib.run_rounds(working, g.cells, rounds=1, seed=0)
    assert working.stats.retried == 2 and working.stats.launches == 2
    records = _records(tmp_path)
    old = [r for r in records if r.get("superseded")]
    new = [r for r in records if not r.get("superseded")]
    assert len(old) == len(new) == 2 * len(SIZES)
    assert {r["status"] for r in old} == {"failed"} and all(r["final"] is False for r in old)
    assert {r["status"] for r in new} == {"ok"}
    assert _left_alive(tmp_path) == []


def test_a_ranks_error_leads_the_record_and_the_report(tmp_path, cli_runner):
    from nccl_tune.cli import cli

    engine = _engine(tmp_path, mode="rankerror", isolation="process")
    sweeplib.run_rounds(engine, _grid("NCCL_NTHREADS=256").cells[:1], rounds=1, seed=0)
    (record, _) = _records(tmp_path)
    first, second = record["error"].splitlines()[:2]
    assert first == (
        "launch exited with code 1: microbench.allreduce: rank 1: failed: RuntimeError: "
        "NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error"
    )
    log = second[len("(full output: ") : second.index(")")]
    assert second.startswith("(full output: ") and "[rank1]: Traceback" in open(log).read()
    out = cli_runner.invoke(cli, ["report", str(tmp_path / "r.jsonl")]).output
    assert f"@ 1024 B: {first} (full output: {log})" in out


def test_records_of_another_world_than_the_launcher_starts_are_failed(tmp_path):
    # A stand-in for `python -m torch.distributed.run --nproc-per-node 2 ...` whose ranks
    # each measured alone (what tasks started without torchrun do): world 1, not 2.
    standin = tmp_path / "python"
    standin.write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[sys.argv.index('-m', 3) + 2:]\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, {str(FAKE)!r}, 'records', *args])\n"
    )
    standin.chmod(0o755)
    env = subprocess_env(FAKE_WORLD="1")
    launcher = launch.Launcher(nproc=2, python=str(standin))
    assert launcher.expected_world == 2
    engine = sweeplib.SweepEngine(
        sweeplib.MeasureOptions("gloo", SIZES, iters=5), launcher, str(tmp_path / "r.jsonl"), timeout=30.0, base_env=env
    )
    sweeplib.run_rounds(engine, _grid("NCCL_PROTO=LL").cells, rounds=1, seed=0)
    records = _records(tmp_path)
    assert len(records) == 2 * len(SIZES) and {r["status"] for r in records} == {"failed"}
    assert all(
        r["error"].startswith(
            "world size mismatch: the ranks formed a world of 1, but the launcher starts 2 (2 per node x 1 node(s))"
        )
        for r in records
    )
    assert engine.stats.failures == {"failed": 2}
    # A template's world is its own business: nothing to compare with.
    assert launch.Launcher(nproc=2, template="srun {args}").expected_world is None
