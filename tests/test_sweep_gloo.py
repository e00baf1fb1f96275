"""Real launches on CPU: gloo sweeps through torchrun and microbench.allreduce, and two
torchrun agents on 127.0.0.1 joined by rendezvous (two "nodes" on one machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import factories
import pytest
from conftest import OWN_FIXTURES, REPO_ROOT, subprocess_env

from nccl_tune import store

pytestmark = pytest.mark.slow
pytest.importorskip("torch")


def _sweep(*args, timeout=240):
    cmd = [sys.executable, "-m", "nccl_tune", "sweep", *args]
    env = subprocess_env(NCCL_INHERITED_BY_MISTAKE="1")  # must not reach the ranks
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def test_gloo_sweep_end_to_end_then_report(tmp_path):
    pytest.importorskip("microbench.allreduce")
    out = tmp_path / "r.jsonl"
    # One process group (NCCL_PROTO is communicator-scoped): one launch per round measures
    # all three cells, each on a fresh process group. (Process-scoped grouping across
    # launches is exercised by the two-node test below and by the launch tests.)
    done = _sweep(
        "--set",
        "NCCL_PROTO=LL,Simple,default",
        "--sizes",
        "1024,4096",
        "--iters",
        "10",
        "--warmup",
        "2",
        "--backend",
        "gloo",
        "--nproc",
        "2",
        "--rounds",
        "2",
        "--seed",
        "4",
        "--out",
        str(out),
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["launches"] == 2 and summary["cells_measured"] == 6 and summary["failures"] == {}
    assert any("do not affect gloo" in n for n in summary["notes"])
    records = store.read_records([str(out)])
    keys = [(r["cell"], r["round"], r["bytes"]) for r in records]
    assert len(keys) == len(set(keys)) == 3 * 2 * 2
    for r in records:
        assert r["backend"] == "gloo" and r["world_size"] == 2 and r["status"] == "ok"
        assert r["correct"] is True and r["isolation"] == "group" and len(r["samples_us"]) == 10
        assert r["env_process"] == {}  # inherited NCCL_* removed; nothing process-scoped set
    assert not (tmp_path / "r.jsonl.work").exists()
    text = subprocess.run(
        [sys.executable, "-m", "nccl_tune", "report", str(out)],
        env=subprocess_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 0 and "NCCL settings do not affect gloo" in text.stdout
    assert "allreduce, 4096 B, world 2, backend gloo" in text.stdout
    rows = json.loads(
        subprocess.run(
            [sys.executable, "-m", "nccl_tune", "report", str(out), "--json"],
            env=subprocess_env(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert len(rows) == 3 * 2 and all(r["status"] == "ok" and r["p50_us"] > 0 for r in rows)
    assert all(r["verdict"] is not None for r in rows if r["cell"] != store.BASELINE)


def test_two_nodes_by_rendezvous_each_rank_sees_the_cells_environment(tmp_path):
    out = tmp_path / "r.jsonl"
    probe_path = f"{REPO_ROOT}:{OWN_FIXTURES / 'sweep'}"
    endpoint = f"127.0.0.1:{factories.free_port()}"
    common = [
        "--set",
        "NCCL_NTHREADS=256",
        "--set",
        "NCCL_PROTO=LL",
        "--sizes",
        "1024",
        "--backend",
        "gloo",
        "--nproc",
        "1",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        endpoint,
        "--module",
        "rank_probe",
        "--timeout",
        "120",
        "--out",
        str(out),
    ]
    env = subprocess_env(PYTHONPATH=probe_path)
    cmd = [sys.executable, "-m", "nccl_tune", "sweep", *common]
    follower = subprocess.Popen(
        [*cmd, "--node-rank", "1"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    leader = subprocess.run(
        [*cmd, "--node-rank", "0"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240
    )
    follower_out, _ = follower.communicate(timeout=120)
    assert leader.returncode == 0, leader.stdout + leader.stderr
    assert follower.returncode == 0, follower_out
    assert "node 0 writes the records" in follower_out
    records = store.read_records([str(out)])
    assert sorted(r["cell"] for r in records) == sorted(
        [store.BASELINE, store.cell_id({"NCCL_NTHREADS": "256", "NCCL_PROTO": "LL"})]
    )
    for r in records:  # one world of two ranks across both agents
        assert r["world_size"] == 2 and r["nnodes"] == 2 and r["correct"] is True
        assert [seen["env"] for seen in r["rank_envs"]] == [r["env"], r["env"]]
