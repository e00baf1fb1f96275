"""The sweep engine: options, launchers, environments, grouping, rounds, resume, sim backend."""

from __future__ import annotations

import json
import sys

import factories
import pytest

from nccl_tune import store
from nccl_tune.decide import report
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import launch, simbackend
from nccl_tune.measure import sweep as sweeplib

SIZES = (14336, 57344)


_grid = factories.grid


def _sim_engine(out, *, isolation="group", land=None, iters=100, nproc=8):
    land = land or simbackend.make_landscape("nccl", "pcie-shm", seed=3)
    options = sweeplib.MeasureOptions("sim", SIZES, iters=iters)
    return sweeplib.SweepEngine(options, launch.Launcher(nproc=nproc), str(out), isolation=isolation, landscape=land)


# ---------------------------------------------------------------- options and launchers


def test_resolve_sizes():
    assert sweeplib.resolve_sizes(None, "1,4", None, "bf16") == [14336, 57344]
    assert sweeplib.resolve_sizes(None, None, None, "bf16") == [t * 14336 for t in (1, 2, 3, 4, 6, 8)]
    assert sweeplib.resolve_sizes("1K,14336,64k,1M", None, None, "fp32") == [1024, 14336, 65536, 1 << 20]
    with pytest.raises(NcclTuneError, match="cannot be combined"):
        sweeplib.resolve_sizes("1K", "1", None, "bf16")
    with pytest.raises(NcclTuneError, match="not a multiple of the 4-byte fp32"):
        sweeplib.resolve_sizes("1026", None, None, "fp32")
    with pytest.raises(NcclTuneError, match="not a size"):
        sweeplib.resolve_sizes("12Q", None, None, "bf16")
    with pytest.raises(NcclTuneError, match="unknown dtype"):
        sweeplib.canonical_dtype("int3")


def test_microbench_args_pass_measurement_options_through():
    options = sweeplib.MeasureOptions(
        "nccl",
        SIZES,
        dtype="bf16",
        op="all_gather",
        iters=50,
        warmup=5,
        mode="graph",
        verify_effective=True,
        op_timeout=30,
    )
    assert options.microbench_args("P.json", "O.jsonl") == [
        "--plan",
        "P.json",
        "--out",
        "O.jsonl",
        "--backend",
        "nccl",
        "--op",
        "all_gather",
        "--sizes",
        "14336,57344",
        "--dtype",
        "bf16",
        "--iters",
        "50",
        "--warmup",
        "5",
        "--mode",
        "graph",
        "--verify-effective",
        "--timeout",
        "30",
    ]


def test_launcher_argv_local_and_multinode():
    local = launch.Launcher(nproc=2)
    assert local.argv("microbench.allreduce", ["--plan", "p"], {}) == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        "--max-restarts",
        "0",
        "-m",
        "microbench.allreduce",
        "--plan",
        "p",
    ]
    multi = launch.Launcher(nproc=8, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400")
    argv = multi.argv("m", [], {})
    assert argv[argv.index("--rdzv-backend") + 1] == "static"
    assert argv[argv.index("--node-rank") + 1] == "1" and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert multi.world_size == 16 and not multi.writes_records and multi.kind == "multi-node"
    with pytest.raises(NcclTuneError, match="needs --rdzv-endpoint"):
        launch.Launcher(nproc=8, nnodes=2)
    with pytest.raises(NcclTuneError, match="--node-rank"):
        launch.Launcher(nproc=8, nnodes=2, node_rank=2, rdzv_endpoint="h:1")


def test_template_expands_to_argv_without_a_shell():
    template = "srun --nodes 2 --ntasks-per-node {nproc} env {env} python -m {module} {args}"
    argv = launch.expand_template(
        template, "microbench.allreduce", ["--plan", "a b;rm -rf /", "--out", "$(x)"], {"NCCL_NTHREADS": "256"}, 8, 2
    )
    assert argv == [
        "srun",
        "--nodes",
        "2",
        "--ntasks-per-node",
        "8",
        "env",
        "NCCL_NTHREADS=256",
        "python",
        "-m",
        "microbench.allreduce",
        "--plan",
        "a b;rm -rf /",
        "--out",
        "$(x)",
    ]
    for bad, message in [
        ("python -m {module}", "needs {args}"),
        ("x --a={args}", "word of its own"),
        ("'unclosed {args}", "cannot split"),
    ]:
        with pytest.raises(NcclTuneError, match=message):
            launch.check_template(bad)


def test_launch_environment_removes_inherited_nccl(tmp_path):
    base = {"PATH": "/bin", "NCCL_PROTO": "LL", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
    env, removed = sweeplib.launch_environment({"NCCL_NTHREADS": "256"}, ("NCCL_SOCKET_IFNAME",), base)
    assert removed == ["NCCL_DEBUG", "NCCL_PROTO"]
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_NTHREADS": "256",
    }
    conf = tmp_path / "nccl.conf"
    conf.write_text("# site defaults\nNCCL_P2P_LEVEL=SYS\nNCCL_IB_DISABLE=1\n")
    assert str(conf) not in dict(sweeplib.conf_files({"NCCL_CONF_FILE": str(conf)}))  # removed
    found = dict(sweeplib.conf_files({"NCCL_CONF_FILE": str(conf)}, keep=("NCCL_CONF_FILE",)))
    assert found[str(conf)] == ["NCCL_P2P_LEVEL", "NCCL_IB_DISABLE"]
    (tmp_path / ".nccl.conf").write_text("NCCL_PROTO=LL\n")
    assert dict(sweeplib.conf_files({"HOME": str(tmp_path)}))[str(tmp_path / ".nccl.conf")] == ["NCCL_PROTO"]


# ---------------------------------------------------------------- sim backend: grouping, rounds


def test_grouped_launches_and_rounds(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple,default", "NCCL_ALGO=Ring,Tree", "NCCL_NTHREADS=256,default")
    engine = _sim_engine(tmp_path / "r.jsonl")
    records = sweeplib.run_rounds(engine, g.cells, rounds=3, seed=7)
    groups = len(g.groups())
    assert groups == 2 and engine.stats.launches == groups * 3
    assert sweeplib.count_launches(g.cells, 3, "group") == engine.stats.launches
    assert len(records) == len(g.cells) * 3 * len(SIZES) == engine.stats.records_written
    for round_ in (1, 2, 3):  # the baseline in every round
        assert any(r["cell"] == store.BASELINE and r["round"] == round_ for r in records)
    assert {r["isolation"] for r in records} == {"group"}
    assert all(r["backend"] == "sim" and r["source"] == "modelled" for r in records)
    process = _sim_engine(tmp_path / "p.jsonl", isolation="process")
    sweeplib.run_rounds(process, g.cells, rounds=1, seed=7)
    assert process.stats.launches == len(g.cells)
    assert {r["isolation"] for r in store.read_records([str(tmp_path / "p.jsonl")])} == {"process"}


def test_round_order_is_random_per_round_and_reproducible():
    g = _grid("NCCL_PROTO=LL,Simple,default", "NCCL_ALGO=Ring,Tree,default", "NCCL_NTHREADS=256,default")
    orders = [[c.id for c in sweeplib.round_order(g.cells, r, 0, "group")] for r in (1, 2, 3)]
    assert len({tuple(o) for o in orders}) == 3
    assert orders[0] == [c.id for c in sweeplib.round_order(g.cells, 1, 0, "group")]
    assert orders[0] != [c.id for c in sweeplib.round_order(g.cells, 1, 1, "group")]
    for order in orders:  # grouped: each process group contiguous, its plain cell first
        keys = [next(c for c in g.cells if c.id == i).process_key for i in order]
        assert len([k for j, k in enumerate(keys) if j == 0 or keys[j - 1] != k]) == 2
        assert set(order) == {c.id for c in g.cells}


def test_resume_skips_recorded_pairs_and_returns_them(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL,Simple")
    first = _sim_engine(out)
    sweeplib.run_rounds(first, g.cells, rounds=2, seed=1)
    again = _sim_engine(out)
    records = sweeplib.run_rounds(again, g.cells, rounds=3, seed=1)
    assert again.stats.cells_reused == len(g.cells) * 2
    assert again.stats.cells_measured == len(g.cells)
    assert len(records) == len(g.cells) * 3 * len(SIZES)
    keys = [(r["cell"], r["round"], r["bytes"]) for r in store.read_records([str(out)])]
    assert len(keys) == len(set(keys)) == len(g.cells) * 3 * len(SIZES)


def test_resume_into_a_file_of_another_world_is_refused_before_measuring(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL")
    sweeplib.run_rounds(_sim_engine(out, nproc=8), g.cells, rounds=1, seed=1)
    before = out.read_bytes()
    with pytest.raises(NcclTuneError) as info:
        _sim_engine(out, nproc=4)
    assert str(info.value) == (
        f"{out}: holds the records of another sweep (world size 8 there, 4 here, line 1): resume "
        "only the same sweep (same grid, sizes and options), or choose another --out"
    )
    assert out.read_bytes() == before
    same = _sim_engine(out, nproc=8)
    sweeplib.run_rounds(same, g.cells, rounds=1, seed=1)
    assert same.stats.cells_reused == 2 and same.stats.cells_measured == 0


def test_resume_skips_a_corrupt_line_with_a_warning(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL")
    sweeplib.run_rounds(_sim_engine(out), g.cells, rounds=1, seed=1)
    lines = out.read_text().splitlines()
    lines[1] = lines[1][:25]  # a record cut short (a crash mid-write)
    out.write_text("\n".join(lines) + "\n")
    warnings = []
    land = simbackend.make_landscape("nccl", "pcie-shm", seed=3)
    again = sweeplib.SweepEngine(
        sweeplib.MeasureOptions("sim", SIZES, iters=100),
        launch.Launcher(nproc=8),
        str(out),
        landscape=land,
        warn=warnings.append,
    )
    sweeplib.run_rounds(again, g.cells, rounds=1, seed=1)
    assert len(warnings) == 1 and warnings[0].startswith(f"{out}:2: skipped: not JSON")
    assert again.stats.cells_measured == 1 and again.stats.cells_reused == 1
    summaries = report.summarize(store.read_records([str(out)]))
    assert {s.cell for s in summaries} == {c.id for c in g.cells}


def test_partially_recorded_cell_is_completed_exactly_once(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL")
    engine = _sim_engine(out)
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=1)
    kept = [r for r in store.read_records([str(out)]) if not (r["cell"] != "baseline" and r["bytes"] == SIZES[1])]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept))
    again = _sim_engine(out)
    sweeplib.run_rounds(again, g.cells, rounds=1, seed=1)
    keys = [(r["cell"], r["round"], r["bytes"]) for r in store.read_records([str(out)])]
    assert sorted(keys) == sorted({(c.id, 1, b) for c in g.cells for b in SIZES})


def test_sim_report_ranks_the_true_best_cell_first(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid(
        "NCCL_PROTO=LL,Simple,default",
        "NCCL_ALGO=Ring,Tree,default",
        "NCCL_P2P_LEVEL=SYS,default",
        "NCCL_MAX_NCHANNELS=16,default",
        topology="pcie-shm",
    )
    land = simbackend.make_landscape("perturbed", "pcie-shm", seed=11)
    engine = _sim_engine(out, land=land, iters=200)
    sweeplib.run_rounds(engine, g.cells, rounds=5, seed=2)
    summaries = report.summarize(store.read_records([str(out)]))
    for nbytes in SIZES:
        truth = {c.id: simbackend.true_choice(land, c.env, "allreduce", nbytes, 8).time_us for c in g.cells}
        rows = [s for s in summaries if s.bytes == nbytes and s.cell != store.BASELINE]
        measured_best = min(rows, key=lambda s: s.p50_us)
        true_best = min(truth, key=truth.get)
        # Ties within noise are allowed: the measured best is within 1% of the true best.
        assert truth[measured_best.cell] <= truth[true_best] * 1.01
        assert measured_best.verdict == "faster" and measured_best.delta_ci_us[1] < 0
        assert sum(1 for s in rows if s.verdict == "faster") >= 1


def test_flat_landscape_declares_no_winner(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL,Simple,default", "NCCL_ALGO=Ring,Tree,default", "NCCL_NTHREADS=256,512,default")
    land = simbackend.make_landscape("flat", "pcie", seed=5)
    sweeplib.run_rounds(_sim_engine(out, land=land), g.cells, rounds=5, seed=3)
    summaries = report.summarize(store.read_records([str(out)]))
    compared = [s for s in summaries if s.cell != store.BASELINE]
    assert len(compared) == (len(g.cells) - 1) * len(SIZES) and all(s.p_value is not None for s in compared)
    assert {s.verdict for s in compared} == {"no significant difference"}


def test_wrong_and_broken_cells_are_never_candidates(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL128,LL", topology="pcie", allow_unsafe=True)
    broken = next(c for c in g.cells if c.env.get("NCCL_PROTO") == "LL").id
    land = simbackend.make_landscape("nccl", "pcie", broken={broken: "failed"})
    engine = _sim_engine(out, land=land)
    sweeplib.run_rounds(engine, g.cells, rounds=3, seed=1)
    assert engine.stats.failures == {"wrong": 3, "failed": 3}
    summaries = report.summarize(store.read_records([str(out)]))
    bad = [s for s in summaries if s.cell != store.BASELINE]
    assert {s.status for s in bad} == {"wrong", "failed"} and all(s.verdict is None for s in bad)


def test_engine_argument_checks(tmp_path):
    options = sweeplib.MeasureOptions("sim", SIZES)
    with pytest.raises(NcclTuneError, match="needs a landscape"):
        sweeplib.SweepEngine(options, None, str(tmp_path / "x"))
    with pytest.raises(NcclTuneError, match="--isolation"):
        sweeplib.SweepEngine(
            options, None, str(tmp_path / "x"), isolation="thread", landscape=simbackend.make_landscape("nccl", "pcie")
        )
    with pytest.raises(NcclTuneError, match="--backend"):
        sweeplib.MeasureOptions("mpi", SIZES)


def test_strategy_interface_measures_requests_with_iters_and_extra(tmp_path):
    g = _grid("NCCL_PROTO=LL,Simple", "NCCL_NTHREADS=256,default")
    engine = _sim_engine(tmp_path / "r.jsonl")
    requests = [
        sweeplib.Request(c, 1, iters=20, extra={"strategy": "halving", "rung": 0, "final": False}) for c in g.cells
    ]
    records = engine.measure(requests)
    assert len(records) == len(g.cells) * len(SIZES)
    assert {(r["strategy"], r["rung"], r["final"], r["iters"]) for r in records} == {("halving", 0, False, 20)}
    assert engine.stats.launches == len(g.groups())
    rung1 = [sweeplib.Request(c, 1, iters=100, extra={"strategy": "halving", "rung": 1}) for c in g.cells[:2]]
    assert len(engine.measure(rung1)) == 2 * len(SIZES)  # same round, another rung: measured
    assert len(engine.measure(requests)) == len(records)  # already recorded: returned as found
    assert engine.stats.cells_reused == len(g.cells)


def test_resume_measures_failed_and_timed_out_cells_again_but_not_wrong_ones(tmp_path):
    out = tmp_path / "r.jsonl"
    g = _grid("NCCL_PROTO=LL,Simple")
    failed, wrong = [c.id for c in g.cells if c.env][:2]
    import dataclasses

    broken = dataclasses.replace(
        simbackend.make_landscape("nccl", "pcie-shm", seed=3), broken={failed: "failed", wrong: "wrong"}
    )
    sweeplib.run_rounds(_sim_engine(out, land=broken), g.cells, rounds=2, seed=1)
    lines = out.read_text().splitlines()
    # A timed-out record (the sim has none): the baseline of round 2, every size.
    timed_out = [
        json.dumps({**json.loads(line), "status": "timeout", "error": "launch timed out"})
        if (json.loads(line)["cell"], json.loads(line)["round"]) == ("baseline", 2)
        else line
        for line in lines
    ]
    out.write_text("\n".join(timed_out) + "\n")
    warnings = []
    again = sweeplib.SweepEngine(
        sweeplib.MeasureOptions("sim", SIZES, iters=100),
        launch.Launcher(nproc=8),
        str(out),
        landscape=simbackend.make_landscape("nccl", "pcie-shm", seed=3),
        warn=warnings.append,
    )
    assert len(warnings) == 1 and "3 recorded (cell, round) pair(s) failed or timed out" in warnings[0]
    assert len(again.recorded_requests()) == len(g.cells) * 2 - 3
    sweeplib.run_rounds(again, g.cells, rounds=2, seed=1)
    assert again.stats.retried == 3 and again.stats.cells_measured == 3
    assert again.stats.cells_reused == len(g.cells) * 2 - 3
    records = store.read_records([str(out)])
    old = [r for r in records if r.get("superseded")]
    assert len(old) == 3 * len(SIZES)  # nothing lost
    assert all(r["final"] is False and r["retried_by"] == again.run_id for r in old)
    assert {(r["cell"], r["status"]) for r in old} == {(failed, "failed"), ("baseline", "timeout")}
    current = [r for r in records if not r.get("superseded")]
    keys = [(r["cell"], r["round"], r["bytes"]) for r in current]
    assert len(keys) == len(set(keys)) == len(g.cells) * 2 * len(SIZES)
    status = {(r["cell"], r["round"]): r["status"] for r in current}
    assert status[(failed, 1)] == status[(failed, 2)] == status[("baseline", 2)] == "ok"
    assert status[(wrong, 1)] == status[(wrong, 2)] == "wrong"  # a result, not retried
    rows = {s.cell: s for s in report.summarize(records) if s.bytes == SIZES[0]}
    assert rows[failed].status == "ok" and rows[failed].n_rounds == 2
    # A third run finds nothing left to retry.
    third = _sim_engine(out)
    sweeplib.run_rounds(third, g.cells, rounds=2, seed=1)
    assert third.stats.retried == 0 and third.stats.cells_measured == 0


def test_launch_error_text_leads_with_the_ranks_own_error():
    tail = [
        "[rank1]: RuntimeError: NCCL error in: x.cpp:1, unhandled system error",
        "microbench.allreduce: rank 1: failed: RuntimeError: NCCL error in: x.cpp:1, unhandled system error",
        "microbench.allreduce: rank 0: lost contact with the other ranks (a peer closed its connection)",
        "some trailing line",
    ]
    text = launch.LaunchOutcome("failed", 1, 1.0, tail, "/tmp/x.log").error_text()
    assert text.splitlines()[0] == (
        "launch exited with code 1: microbench.allreduce: rank 1: failed: "
        "RuntimeError: NCCL error in: x.cpp:1, unhandled system error"
    )
    assert text.splitlines()[1] == "(full output: /tmp/x.log) last lines of output:"
    assert text.splitlines()[2:] == tail
    assert launch.summarize_error(text) == text.splitlines()[0] + " (full output: /tmp/x.log)"
    # Without an error-looking line: the last line; no output at all: said so.
    plain = launch.LaunchOutcome("failed", 3, 1.0, ["step 1", "step 2"], "/tmp/y.log").error_text()
    assert plain.splitlines()[0] == "launch exited with code 3: step 2"
    assert launch.LaunchOutcome("timeout", None, 1.0, [], "/tmp/z.log").error_text() == (
        "launch timed out (no output; full output: /tmp/z.log)"
    )
    # Records written before this format get the same one-line summary in reports.
    old = "launch exited with code 3 (full output: /w/l.log); last lines of output:\n" + "\n".join(tail)
    assert launch.summarize_error(old) == (
        "launch exited with code 3: microbench.allreduce: rank 1: failed: RuntimeError: NCCL error in: "
        "x.cpp:1, unhandled system error (full output: /w/l.log)"
    )
    assert launch.summarize_error("simulated: NCCL would fail") == "simulated: NCCL would fail"
