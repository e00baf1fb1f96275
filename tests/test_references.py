"""Published references: the shipped tables, extra tables, kinds, interpolation, projection."""

from __future__ import annotations

import json

import pytest

from nccl_tune.errors import NcclTuneError
from nccl_tune.model import costmodel, ranges
from nccl_tune.model import references as R


@pytest.fixture(scope="module")
def shipped():
    return R.shipped()


def test_the_tables_ship_with_the_package_and_name_their_machines(shipped, monkeypatch):
    monkeypatch.delenv(R.ENV_VAR, raising=False)
    assert R.load() == shipped  # no $NCCL_TUNE_REFERENCES, no ../shared: the shipped tables
    assert len({r.machine for r in shipped}) >= 10
    assert all(r.kind in costmodel.TOPOLOGIES and r.source and r.points for r in shipped)
    assert all(r.machine_id for r in shipped)  # explicit, not guessed from the name
    sys_level = next(r for r in shipped if r.name == "asus-4xrtxpro6000-p2pmark-p2p-level-sys")
    assert (sys_level.kind, sys_level.p2p, sys_level.env) == ("pcie-direct", True, {"NCCL_P2P_LEVEL": "SYS"})


def test_extra_tables_are_added_in_either_form(shipped, tmp_path, monkeypatch):
    old_form = [
        {
            "name": "lab-4x",
            "gpus": "L4",
            "n_gpus": 4,
            "interconnect": "pcie-shm",
            "cpu": "unknown",
            "graph_mode": True,
            "env": {},
            "points": [[16384, 20.0]],
        },
        {"name": shipped[0].name, "gpus": "x", "n_gpus": 2, "interconnect": "nvlink", "points": [[8, 1.0]]},
    ]
    path = tmp_path / "references.json"
    path.write_text(json.dumps(old_form))
    monkeypatch.setenv(R.ENV_VAR, str(tmp_path))
    refs = R.load()
    extra = [r for r in refs if r.name == "lab-4x"]
    assert len(refs) == len(shipped) + 1  # a shipped name keeps the shipped table
    assert extra[0].kind == "pcie-shm" and extra[0].mode == "graph" and extra[0].machine == "lab-4x"


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not JSON .*; a reference table is JSON"),
        ('{"schema": "x"}', "not a reference table"),
        (json.dumps([{"name": "x", "points": [[1, 2]]}]), "malformed"),
        (
            json.dumps(
                {
                    "schema": R.SCHEMA,
                    "references": [{"name": "x", "machine": "m", "kind": "warp", "n_gpus": 2, "points": [[8, 1.0]]}],
                }
            ),
            "unknown kind 'warp'",
        ),
        (
            json.dumps(
                {
                    "schema": R.SCHEMA,
                    "references": [{"name": "x", "machine": "m", "kind": "pcie", "n_gpus": 2, "points": []}],
                }
            ),
            "no points",
        ),
    ],
)
def test_a_bad_table_is_one_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "references.json"
    path.write_text(text)
    with pytest.raises(NcclTuneError, match=message) as err:
        R.load(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "entry, kind",
    [
        ({"interconnect": "nvlink", "gpus": "Tesla V100-SXM2-16GB", "n_gpus": 8}, "nvlink-mesh"),
        ({"interconnect": "nvlink", "gpus": "A100-SXM4-40GB", "n_gpus": 8}, "nvswitch"),
        ({"interconnect": "nvlink", "gpus": "H100 (SXM assumed)", "n_gpus": 8}, "nvswitch-nvls"),
        ({"interconnect": "pcie-p2p", "cpu": "2x AMD EPYC 9575F (Turin), dual socket", "n_gpus": 8}, "pcie-amd-2s"),
        ({"interconnect": "pcie-p2p", "cpu": "2x AMD EPYC 9575F, dual socket", "n_gpus": 2}, "pcie-shm"),
        (
            {"interconnect": "pcie-p2p (3 Microchip PCIe switches, single CPU)", "cpu": "single CPU", "n_gpus": 8},
            "pcie-switch",
        ),
        (
            {
                "interconnect": "pcie-mixed (P2P within a virtual switch, SHM for NODE pairs)",
                "cpu": "2x AMD EPYC; 4-GPU runs use GPUs 0-3 on NUMA 0",
                "n_gpus": 4,
            },
            "pcie-direct",
        ),
        ({"interconnect": "pcie-shm", "cpu": "unknown", "n_gpus": 2}, "pcie-shm"),
    ],
)
def test_kind_of_reads_what_an_older_entry_says(entry, kind):
    assert R.kind_of(entry) == kind


def test_at_interpolates_inside_flat_below_none_above():
    ref = R.Reference("x", "pcie", 8, {}, None, ((8192, 10.0), (32768, 40.0)))
    assert ref.at(1024) == 10.0
    assert ref.at(16384) == pytest.approx(20.0)  # log-log between the two points
    assert ref.at(65536) is None


def test_projection_applies_the_models_saving_to_the_defaults_range():
    found = ranges.Range(20.0, 70.0, 50.0, None)
    low, high = R.project_tok_s(60.0, 123, 50.0, 25.0, found)  # the cell halves the latency
    # 123 x 10..35 us saved per token
    assert low == pytest.approx(1000 / (1000 / 60 - 1.23))
    assert high == pytest.approx(1000 / (1000 / 60 - 4.305))


def test_a_modelled_recommendation_gets_a_range_on_every_row():
    from nccl_tune.decide import recommendation

    analysis = recommendation.analyze_model(
        topology_name="pcie-amd-2s", nranks=8, nbytes=14336, collectives=123, baseline_tok_s=62.9
    )
    found = R.attach_published_range(analysis, "pcie-amd-2s", 62.9)
    for row in (analysis.baseline, *analysis.cells):
        low, high = row.latency_range
        assert low < high <= low * ranges.MAX_WIDTH * (1 + 1e-9) and row.calibrated is False
    assert analysis.baseline.latency_range == (found.low, found.high)
