"""The sweep library without the command: SweepRequest -> plan_sweep -> run_sweep.

Expected figures are counted by hand from the requests (cells = baseline + one per value;
NCCL_PROTO is communicator-scoped, so every cell shares one launch under group isolation).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nccl_tune.errors import NcclTuneError
from nccl_tune.measure.sweep_request import SweepRequest, plan_sweep
from nccl_tune.measure.sweep_run import RunStart, run_sweep

TWO_PROTOCOLS = ("NCCL_PROTO=LL,Simple",)


def _sim(**changes) -> SweepRequest:
    base = SweepRequest(sets=TWO_PROTOCOLS, backend="sim", topology="pcie-shm", sizes="1K,2K", rounds=2)
    return replace(base, **changes)


def test_a_sim_plan_counts_cells_launches_and_measurements():
    plan = plan_sweep(_sim(), gpus=0)
    assert (plan.backend, plan.simulated, plan.isolation) == ("sim", True, "group")
    assert [c.label for c in plan.grid.cells] == ["baseline (NCCL defaults)", "NCCL_PROTO=LL", "NCCL_PROTO=Simple"]
    assert plan.launcher.nproc == 8  # sim's modelled world when --nproc is not given
    # one shared launch per round; alone, each of the 3 cells would need its own
    assert (plan.launches, plan.launches_exhaustive) == (2, 2)
    assert plan.launches_by_isolation == {"process": 6, "group": 2, "nocache": 2}
    assert plan.planned_requests() == 3 * 2  # (cells + baseline) x rounds
    assert plan.measurements["exhaustive"] == 3 * 2 * 2  # x sizes: each at full iterations


def test_the_plan_dict_is_the_dry_run_json_contract():
    data = plan_sweep(_sim(), gpus=0).to_dict()
    assert list(data) == [
        "search",
        "budget",
        "measurements",
        "halving_rungs",
        "backend",
        "simulated",
        "out",
        "sizes",
        "op",
        "rounds",
        "isolation",
        "launcher",
        "topology",
        "cells",
        "dropped",
        "groups",
        "launches",
        "launches_exhaustive",
        "launches_by_isolation",
        "estimate_s",
        "notes",
    ]
    assert data["sizes"] == [1024, 2048] and data["halving_rungs"] is None
    assert data["groups"][0]["cells"] == [c["cell"] for c in data["cells"]]
    assert json.loads(json.dumps(data, allow_nan=False)) == data


def test_auto_backend_and_ranks_follow_the_gpus_given():
    request = SweepRequest(sets=TWO_PROTOCOLS, topology="none", dry_run=True)
    on_gpus = plan_sweep(request, gpus=2)
    assert (on_gpus.backend, on_gpus.launcher.nproc) == ("nccl", 2)
    assert on_gpus.notes[0] == "backend nccl (2 GPUs found); 2 ranks per node (one per GPU, at most 8)"
    on_cpu = plan_sweep(request, gpus=0)
    assert (on_cpu.backend, on_cpu.launcher.nproc) == ("gloo", 2)


def test_nccl_with_fewer_gpus_than_ranks_is_refused_unless_dry_run_or_a_scheduler():
    request = SweepRequest(sets=TWO_PROTOCOLS, backend="nccl", nproc=2, topology="none", out="unused.jsonl")
    with pytest.raises(NcclTuneError, match=r"^--backend nccl: 1 GPU\(s\) visible here for 2 ranks"):
        plan_sweep(request, gpus=1)
    dry = plan_sweep(replace(request, dry_run=True), gpus=1)
    assert (
        "warning: 1 GPU(s) visible here for 2 ranks per node: NCCL needs one GPU per rank, "
        "so launches on this host will fail" in dry.notes
    )
    template = replace(request, template="srun {module} {args}")
    assert not [n for n in plan_sweep(template, gpus=1).notes if "GPU(s) visible" in n]


def test_run_sweep_measures_the_plan_then_resumes_it(tmp_path):
    out = str(tmp_path / "r.jsonl")
    plan = plan_sweep(_sim(out=out), gpus=0)
    starts, cells = [], []
    summary = run_sweep(plan, on_start=starts.append, on_cell=lambda r, s: cells.append(s))
    assert starts == [RunStart(already_recorded=0, todo=6, warnings=())]
    assert cells == ["ok"] * 6
    assert (summary.stats.cells_measured, summary.stats.records_written) == (6, 3 * 2 * 2)
    assert summary.failure is None and not summary.interrupted
    assert summary.to_dict()["search"]["strategy"] == "exhaustive"
    again = run_sweep(plan, on_start=starts.append)
    assert starts[-1] == RunStart(already_recorded=6, todo=0, warnings=())
    assert again.stats.cells_measured == 0
    refused = plan_sweep(_sim(out=out, resume=False), gpus=0)
    with pytest.raises(NcclTuneError, match="exists: pass --resume"):
        run_sweep(refused)
