"""Published references: kinds, interpolation, and the range a kind of machine measured."""

from __future__ import annotations

import json

import pytest

from nccl_tune.model import references as R
from nccl_tune.errors import NcclTuneError


@pytest.fixture
def refs(real_fixtures):
    return R.load(real_fixtures / "reference_latency")


@pytest.mark.parametrize("entry, kind", [
    ({"interconnect": "nvlink", "gpus": "Tesla V100-SXM2-16GB", "n_gpus": 8}, "nvlink-mesh"),
    ({"interconnect": "nvlink", "gpus": "A100-SXM4-40GB", "n_gpus": 8}, "nvswitch"),
    ({"interconnect": "nvlink", "gpus": "H100 (SXM assumed)", "n_gpus": 8}, "nvswitch-nvls"),
    ({"interconnect": "pcie-p2p", "cpu": "2x AMD EPYC 9575F (Turin), dual socket", "n_gpus": 8},
     "pcie-amd-2s"),
    ({"interconnect": "pcie-p2p", "cpu": "2x AMD EPYC 9575F, dual socket", "n_gpus": 2}, "pcie-shm"),
    ({"interconnect": "pcie-p2p (3 Microchip PCIe switches, single CPU)", "cpu": "single CPU",
      "n_gpus": 8}, "pcie-switch"),
    ({"interconnect": "pcie-mixed (P2P within a virtual switch, SHM for NODE pairs)",
      "cpu": "2x AMD EPYC; 4-GPU runs use GPUs 0-3 on NUMA 0", "n_gpus": 4}, "pcie-direct"),
    ({"interconnect": "pcie-shm", "cpu": "unknown", "n_gpus": 2}, "pcie-shm"),
])
def test_kind_of_reads_what_an_entry_says(entry, kind):
    assert R.kind_of(entry) == kind


def test_every_reference_has_a_cost_model_kind_and_one_machine_one_kind(refs):
    from nccl_tune.model import costmodel

    assert refs and all(r.kind in costmodel.TOPOLOGIES for r in refs)
    by_machine = {}
    for r in refs:
        by_machine.setdefault(r.machine, set()).add(r.kind)
    assert all(len(kinds) == 1 for kinds in by_machine.values())
    # A table under another setting takes its machine's kind (its default table's).
    sys_level = next(r for r in refs if r.name == "asus-4xrtxpro6000-p2pmark-p2p-level-sys")
    assert sys_level.kind == "pcie-direct"


def test_at_interpolates_inside_flat_below_none_above():
    ref = R.Reference("x", "pcie", 8, {}, None, ((8192, 10.0), (32768, 40.0)))
    assert ref.at(1024) == 10.0
    assert ref.at(16384) == pytest.approx(20.0)  # log-log between the two points
    assert ref.at(65536) is None


def test_kind_range_is_at_most_3_5x_covers_its_machines_and_names_them(refs):
    for ref in refs:
        found = R.kind_range(refs, ref.kind, ref.n_gpus, 16384, ref.env)
        assert found is not None and found.high / found.low <= R.RANGE_MAX_RATIO
        assert ref.name in found.machines and found.covers(ref.at(16384))
    assert R.kind_range(refs, "nvswitch", 3, 16384) is None  # no 3-GPU machine published
    # The original name `nvlink` covers every NVLink kind's machines.
    nv = R.kind_range(refs, "nvlink", 8, 16384)
    assert {"modal-8xa100-40gb", "blog-8xv100-sxm2-16gb"} <= set(nv.machines)


def test_leaving_a_machine_out_uses_only_the_others(refs):
    found = R.kind_range(refs, "pcie-amd-2s", 8, 16384, exclude_machine="festr-turin-8xrtxpro6000")
    assert found is not None and not any(m.startswith("festr") for m in found.machines)


def test_projection_is_a_range_from_the_published_default_latency():
    found = R.Range(20.0, 70.0, (30.0, 50.0), ("a", "b"), "NCCL's defaults")
    low, high = R.project_tok_s(60.0, 123, 50.0, 25.0, found)  # the cell halves the latency
    # 123 x 10..35 us saved per token
    assert low == pytest.approx(1000 / (1000 / 60 - 1.23))
    assert high == pytest.approx(1000 / (1000 / 60 - 4.305))


def test_load_missing_and_malformed(tmp_path, monkeypatch):
    monkeypatch.setenv(R.ENV_VAR, str(tmp_path / "none.json"))
    monkeypatch.setattr(R, "_REPO_ROOT", tmp_path)
    assert R.load() == []
    bad = tmp_path / "references.json"
    bad.write_text(json.dumps([{"name": "x", "points": [[1, 2]]}]))
    with pytest.raises(NcclTuneError, match="entry 0"):
        R.load(tmp_path)
    bad.write_text("{")
    with pytest.raises(NcclTuneError) as info:
        R.load(bad)
    assert str(info.value) == (f"{bad}:1: not JSON (Expecting property name enclosed in double "
                               "quotes, column 2); a reference table is JSON")
