"""microbench.allreduce end to end under torchrun with gloo (CPU), and its CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys

import factories
import pytest

from nccl_tune import store
from tests.conftest import REPO_ROOT, subprocess_env

FAST = ["--iters", "12", "--warmup", "2"]


_port = factories.free_port


def torchrun(nproc: int, *args: str, env_extra: dict | None = None, timeout: int = 120):
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={_port()}",
        "-m",
        "microbench.allreduce",
        *args,
    ]
    env = subprocess_env(OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def microbench(*args: str, timeout: int = 60):
    return subprocess.run(
        [sys.executable, "-m", "microbench.allreduce", *args],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_records = factories.read_records


def _assert_valid(record: dict, world: int, op: str = "allreduce") -> None:
    assert set(store.FIELDS) <= set(record)
    assert record["schema"] == store.SCHEMA and record["status"] == "ok"
    assert (record["backend"], record["mode"], record["op"], record["world_size"]) == ("gloo", "eager", op, world)
    assert record["nnodes"] == 1 and record["effective"] is None
    assert record["correct"] is True and record["wrong"] == 0
    lat = record["lat_us"]
    assert 0 < lat["min"] <= lat["p10"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["n"] == record["iters"] == len(record["samples_us"])
    assert all(s > 0 for s in record["samples_us"])
    assert record["algbw_gbps"] == pytest.approx(record["bytes"] / (lat["p50"] * 1e-6) / 1e9)


@pytest.mark.slow
def test_world2_tokens_end_to_end(tmp_path):
    out = tmp_path / "r.jsonl"
    result = torchrun(2, "--tokens", "1,4", "--out", str(out), "--label", "e2e", *FAST)
    assert result.returncode == 0, result.stderr
    records = _records(out)
    assert [r["bytes"] for r in records] == [14336, 57344]  # tokens x 7168 x 2
    for record in records:
        _assert_valid(record, 2)
        assert record["cell"] == "baseline" and record["env"] == {} and record["label"] == "e2e"
        assert record["busbw_gbps"] == pytest.approx(record["algbw_gbps"])  # 2(n-1)/n = 1 at n=2
    lines = result.stdout.splitlines()
    assert any(line.startswith("# world 2 rank(s) on 1 node(s)") for line in lines)
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [row[0] for row in rows] == ["14336", "57344"] and all(row[2] == "bfloat16" for row in rows)


@pytest.mark.slow
def test_world4_end_to_end_with_json(tmp_path):
    out = tmp_path / "r.jsonl"
    result = torchrun(4, "--sizes", "1K,14336", "--json", "--out", str(out), "--ops-per-sample", "3", *FAST)
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    stored = _records(out)
    assert [r["bytes"] for r in printed] == [r["bytes"] for r in stored] == [1024, 14336]
    assert "ops-per-sample 3" in result.stderr
    for record in stored:
        _assert_valid(record, 4)
        assert record["ops_per_sample"] == 3
        assert record["busbw_gbps"] == pytest.approx(record["algbw_gbps"] * 1.5)  # 2(n-1)/n at n=4
    assert "# world 4 rank(s)" in result.stderr  # header goes to stderr with --json


@pytest.mark.slow
@pytest.mark.parametrize("op,factor", [("reduce_scatter", 0.5), ("all_gather", 0.5)])
def test_op_variants(tmp_path, op, factor):
    out = tmp_path / "r.jsonl"
    result = torchrun(2, "--op", op, "--sizes", "1K,14340", "--dtype", "fp32", "--out", str(out), *FAST)
    assert result.returncode == 0, result.stderr
    records = _records(out)
    # 14340 B of fp32 is 3585 elements: rounded down to whole elements per rank, as nccl-tests.
    assert [r["bytes"] for r in records] == [1024, 14336]
    for record in records:
        _assert_valid(record, 2, op)
        assert record["busbw_gbps"] == pytest.approx(record["algbw_gbps"] * factor)


@pytest.mark.slow
def test_plan_cells_records_extras_and_a_failed_cell(tmp_path):
    plan = {
        "run_id": "sweep-1",
        "cells": [
            {
                "cell": "baseline",
                "env": {},
                "comm_env": {},
                "round": 0,
                "iters": None,
                "warmup": None,
                "extra": {"isolation": "group", "strategy": "grid"},
            },
            {
                "cell": "c-ll",
                "env": {"NCCL_PROTO": "LL"},
                "comm_env": {"NCCL_PROTO": "LL"},
                "round": 0,
                "iters": 5,
                "warmup": 1,
                "extra": {"isolation": "group", "rung": 1, "final": False},
            },
            {
                "cell": "c-ring",
                "env": {"NCCL_ALGO": "Ring"},
                "comm_env": {"NCCL_ALGO": "Ring"},
                "round": 1,
                "iters": None,
                "warmup": None,
                "extra": {"isolation": "group"},
            },
        ],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    out = tmp_path / "r.jsonl"
    result = torchrun(
        2,
        "--plan",
        str(path),
        "--sizes",
        "1K,2K",
        "--out",
        str(out),
        "--timeout",
        "3",
        *FAST,
        env_extra={"MICROBENCH_FAULT": "1:raise:c-ll"},
    )
    assert result.returncode == 0, result.stderr  # a failed cell is data, not a failed run
    records = _records(out)
    assert [(r["cell"], r["bytes"], r["status"]) for r in records] == [
        ("baseline", 1024, "ok"),
        ("baseline", 2048, "ok"),
        ("c-ll", 1024, "failed"),
        ("c-ll", 2048, "failed"),
        ("c-ring", 1024, "ok"),
        ("c-ring", 2048, "ok"),
    ]
    assert all(r["run_id"] == "sweep-1" and r["isolation"] == "group" for r in records)
    assert records[0]["strategy"] == "grid" and records[0]["round"] == 0 and records[0]["iters"] == 12
    assert records[2]["rung"] == 1 and records[2]["final"] is False and records[2]["iters"] == 5
    assert records[2]["error"].startswith("rank 1: RuntimeError: injected fault")
    assert records[2]["env"] == {"NCCL_PROTO": "LL"} and records[4]["env"] == {"NCCL_ALGO": "Ring"}
    assert records[4]["round"] == 1
    assert "# cell c-ring round 1: NCCL_ALGO=Ring" in result.stdout


@pytest.mark.slow
def test_wrong_result_is_recorded_and_fails_the_run(tmp_path):
    out = tmp_path / "r.jsonl"
    result = torchrun(2, "--sizes", "1K", "--out", str(out), *FAST, env_extra={"MICROBENCH_FAULT": "0:wrong"})
    assert result.returncode != 0
    (record,) = _records(out)
    assert (record["status"], record["correct"], record["wrong"]) == ("wrong", False, 1)
    assert "microbench.allreduce: cell baseline: 1 wrong element(s) at 1024 bytes" in result.stderr


@pytest.mark.slow
def test_dead_rank_fails_every_rank_with_one_reason(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "nccl_tune",
        "bench",
        "--nproc",
        "2",
        "--master-port",
        str(_port()),
        "--sizes",
        "1K",
        "--timeout",
        "5",
        *FAST,
    ]
    result = subprocess.run(
        argv, cwd=REPO_ROOT, env=subprocess_env(MICROBENCH_FAULT="1:exit"), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: torchrun exited with code 1: rank 1 exited with code 3")
    assert "rank 0: lost contact with the other ranks" in last
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_bench_runs_torchrun(tmp_path):
    out = tmp_path / "r.jsonl"
    argv = [
        sys.executable,
        "-m",
        "nccl_tune",
        "bench",
        "--nproc",
        "2",
        "--master-port",
        str(_port()),
        "--sizes",
        "4K",
        "--out",
        str(out),
        *FAST,
    ]
    result = subprocess.run(argv, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (record,) = _records(out)
    _assert_valid(record, 2)


@pytest.mark.slow
def test_gap_us_times_each_collective_from_the_last_arrival(tmp_path):
    out = tmp_path / "r.jsonl"
    # A 50 ms busy gap before every collective: timed from the start of the gap (or
    # from this rank's own arrival while the other still spins) each sample would be
    # 50 ms or more; timed from the last rank's arrival it is the collective alone. The
    # bound is a structural one (half the gap), not a latency target.
    result = torchrun(
        2, "--sizes", "4K", "--dtype", "fp32", "--gap-us", "50000", "--ops-per-sample", "3", "--out", str(out), *FAST
    )
    assert result.returncode == 0, result.stderr
    (record,) = _records(out)
    _assert_valid(record, 2)
    assert record["gap_us"] == 50000.0 and record["ops_per_sample"] == 3
    assert "gap-us 50000 (timed from the last rank's arrival)" in result.stdout
    samples = record["samples_us"]
    assert len(samples) == 12 and sorted(samples)[len(samples) // 2] < 25000.0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gap-us", "-5"], "--gap-us: -5.0 must be a number in [0, 6.048e+11]"),
        (["--timeout", "inf"], "--timeout: inf must be a number in (0, 604800] seconds"),
        (["--iters", "100000000"], "--iters: 100000000 is not in [1, 10000000]"),
        (["--tokens", "1048577"], "--tokens: 1048577 is more than 1048576"),
        (["--iter", "10"], "unrecognized arguments: --iter 10"),  # no abbreviations, as click
        (["--sizes", "12Q"], "--sizes: '12Q' is not a size"),
        (["--dtype", "int3"], "--dtype: unknown dtype 'int3'"),
        (["--mode", "graph"], "--mode graph needs CUDA"),
        (["--backend", "nccl"], "--backend nccl needs CUDA"),
    ],
)
def test_cli_errors_are_one_line_exit_2(args, message):
    result = microbench(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("microbench.allreduce: error: ") and message in lines[0]
    assert result.stdout == ""


@pytest.mark.slow
def test_every_rank_refuses_alike_before_any_process_group():
    # plain torchrun: each rank checks its options before init_process_group and says the
    # same line with exit 2 (torchrun then adds its own ChildFailedError report, which no
    # rank can silence: nccl-tune bench wraps it into one line)
    result = torchrun(2, "--mode", "graph", "--sizes", "1K", timeout=120)
    said = [
        line.split(": ", 2) for line in result.stderr.splitlines() if line.startswith("microbench.allreduce: rank ")
    ]
    assert said and {text for _, _, text in said} == {
        "error: --mode graph needs CUDA (torch.cuda.is_available() is False); use --mode eager"
    }
    assert "exitcode  : 2" in result.stderr and "Timed out" not in result.stderr


def test_bench_rejects_bad_options_before_launching():
    result = subprocess.run(
        [sys.executable, "-m", "nccl_tune", "bench", "--dtype", "int3"],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "Error: --dtype: unknown dtype 'int3' (known: bf16, fp16, fp32)"


def test_bench_dry_run_argv():
    from nccl_tune.measure.bench_launch import torchrun_argv

    argv = torchrun_argv(8, 1, None, ["--tokens", "1,2"])
    assert argv[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=8",
        "--standalone",
        "-m",
        "microbench.allreduce",
        "--tokens",
        "1,2",
    ]
    assert "--master-port=29600" in torchrun_argv(2, 2, 29600, [])


def test_failure_summary_names_silent_ranks():
    from nccl_tune.measure.bench_launch import failure_summary

    lines = [
        "microbench.allreduce: rank 0: lost contact with the other ranks (x)\n",
        "[1]:\n",
        "  rank      : 1 (local_rank: 1)\n",
        "  exitcode  : -9 (pid: 5)\n",
        "[0]:\n",
        "  rank      : 0 (local_rank: 0)\n",
        "  exitcode  : 1 (pid: 4)\n",
    ]
    assert failure_summary(lines) == (
        "rank 1 exited with code -9 without a message; rank 0: lost contact with the other ranks (x)"
    )
    assert failure_summary([]) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "variables,prints",
    [
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, True),
        ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, False),
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}, True),
        ({"PMI_SIZE": "2"}, True),
    ],
)
def test_scheduler_tasks_without_torchrun_are_refused(variables, prints):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "microbench.allreduce",
            "--backend",
            "gloo",
            "--sizes",
            "1K",
            "--iters",
            "2",
            "--warmup",
            "0",
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(**variables),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    if prints:
        assert len(lines) == 1 and "without torchrun's RANK/WORLD_SIZE" in lines[0]
        assert "start torchrun under the scheduler" in lines[0] and "Traceback" not in result.stderr
    else:
        assert lines == []  # one line from task 0, not one per task


@pytest.mark.slow
def test_scheduler_variables_of_one_task_or_under_torchrun_are_fine():
    from microbench.allreduce import scheduler_without_torchrun

    assert scheduler_without_torchrun({"SLURM_NTASKS": "1"}) is None
    assert scheduler_without_torchrun({"PMI_SIZE": "8", "RANK": "0", "WORLD_SIZE": "8"}) is None
    assert scheduler_without_torchrun({"PMI_SIZE": "8", "PMI_RANK": "3"}) == ("PMI_SIZE", 8, "3")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "microbench.allreduce",
            "--backend",
            "gloo",
            "--sizes",
            "1K",
            "--iters",
            "2",
            "--warmup",
            "0",
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(SLURM_NTASKS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def _bench(*args: str, timeout: int = 120):
    return subprocess.run(
        [sys.executable, "-m", "nccl_tune", "bench", *args],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mode", "graph"], "Error: --mode graph needs CUDA (torch.cuda.is_available() is False); use --mode eager"),
        (
            ["--backend", "nccl"],
            "Error: --backend nccl needs CUDA GPUs and a torch built with NCCL (torch.cuda.is_available() is False)",
        ),
    ],
)
def test_bench_resolves_backend_and_mode_before_launching(args, message):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = _bench("--nproc", "2", *args)
    assert result.returncode == 2
    assert result.stderr.strip() == message and result.stdout == ""  # no torchrun box


def test_bench_refuses_a_missing_plan_once_before_torchrun(tmp_path):
    # bench reads the plan itself (microbench.options.preflight), so the ranks never start:
    # one line, not one per rank after torchrun's start-up
    result = _bench("--nproc", "2", "--master-port", str(_port()), "--plan", str(tmp_path / "missing.json"))
    assert result.returncode == 2
    reason = f"{tmp_path / 'missing.json'}: cannot read the plan: No such file or directory"
    assert result.stderr.strip() == f"Error: {reason}" and result.stdout == ""


def test_refused_reason_needs_every_rank_to_exit_2():
    from nccl_tune.measure.bench_launch import refused_reason

    said = ["microbench.allreduce: rank 1: error: bad plan\n", "microbench.allreduce: rank 0: error: bad plan\n"]
    report = [
        "  rank      : 1 (local_rank: 1)\n",
        "  exitcode  : 2 (pid: 5)\n",
        "  rank      : 0 (local_rank: 0)\n",
        "  exitcode  : 2 (pid: 4)\n",
    ]
    assert refused_reason(said + report) == "rank 0: error: bad plan (rank 1 said the same)"
    stopped = report[:3] + ["  exitcode  : -15 (pid: 4)\n"]  # torchrun stopped rank 0 after rank 1 exited
    assert refused_reason(said[:1] + stopped) == "rank 1: error: bad plan"
    assert refused_reason(said + report[:3] + ["  exitcode  : 1 (pid: 4)\n"]) is None
    assert refused_reason(said) is None


def test_bench_multinode_argv_and_checks():
    from nccl_tune.measure.bench_launch import torchrun_argv

    assert torchrun_argv(8, 2, None, ["--sizes", "1K"], 1, "node0:29500")[3:] == [
        "--nproc-per-node=8",
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=static",
        "--rdzv-endpoint=node0:29500",
        "-m",
        "microbench.allreduce",
        "--sizes",
        "1K",
    ]
    for args, message in (
        (["--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank: 2 is not in [0, 1]"),
        (["--nnodes", "2", "--rdzv-endpoint", "h"], "--rdzv-endpoint: 'h' is not HOST:PORT"),
    ):
        result = _bench(*args, "--dry-run")
        assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.slow
def test_bench_two_nodes_by_rendezvous(tmp_path):
    out = tmp_path / "r.jsonl"
    common = [
        "--nproc",
        "1",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        f"127.0.0.1:{_port()}",
        "--backend",
        "gloo",
        "--sizes",
        "1K",
        "--out",
        str(out),
        *FAST,
    ]
    env = subprocess_env(OMP_NUM_THREADS="1")
    bench = [sys.executable, "-m", "nccl_tune", "bench"]  # bench's own options come first
    follower = subprocess.Popen(
        [*bench, "--node-rank", "1", *common],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    leader = subprocess.run(
        [*bench, "--node-rank", "0", *common], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    follower_out, _ = follower.communicate(timeout=120)
    assert leader.returncode == 0, leader.stderr
    assert follower.returncode == 0, follower_out
    (record,) = _records(out)  # rank 0 (node 0) writes
    _assert_valid(record, 2)


@pytest.mark.slow
def test_records_name_the_nccl_conf_files(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("# site settings\nNCCL_PROTO=LL\nNCCL_SOCKET_IFNAME=eth0\nOTHER=1\n")
    out = tmp_path / "r.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "microbench.allreduce", "--backend", "gloo", "--sizes", "1K", "--out", str(out), *FAST],
        cwd=REPO_ROOT,
        env=subprocess_env(HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (record,) = _records(out)
    from microbench.allreduce import nccl_conf_files

    expected = nccl_conf_files({"HOME": str(home)})  # /etc/nccl.conf too, where it exists
    assert record["conf_files"] == expected
    assert expected[str(home / ".nccl.conf")] == {"NCCL_PROTO": "LL", "NCCL_SOCKET_IFNAME": "eth0"}
    assert f"# NCCL conf file {home / '.nccl.conf'}: NCCL_PROTO=LL" in result.stdout


def test_conf_files_of_ranks_on_different_hosts_are_kept_apart():
    from microbench.allreduce import merge_conf_files

    same = {"/etc/nccl.conf": {"NCCL_PROTO": "LL"}}
    assert merge_conf_files([("a", same), ("a", same), ("b", same)]) == same
    assert merge_conf_files([("a", same), ("b", {})]) == {"a:/etc/nccl.conf": {"NCCL_PROTO": "LL"}}
    assert merge_conf_files([("a", {})]) == {}
