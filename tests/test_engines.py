"""The engines' own allreduce paths (SGLang/vLLM custom allreduce) and --engine."""

from __future__ import annotations

import json

import pytest

from nccl_tune.cli import cli
from nccl_tune.model import engines


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize(
    "kind, nranks, nbytes, via",
    [
        ("nvswitch", 8, 14336, "custom"),  # NVLink: custom allreduce below 8 MiB
        ("nvswitch-nvls", 4, 57344, "custom"),
        ("nvswitch", 8, 8 << 20, "nccl"),  # not below max_size
        ("nvswitch", 8, 14338, "nccl"),  # not a multiple of 16 B
        ("nvswitch", 3, 14336, "nccl"),  # world size 3 unsupported
        ("nvlink-mesh", 8, 14336, "nccl"),  # V100 mesh: not all pairs NVLink
        ("pcie-amd-2s", 8, 14336, "nccl"),  # >2 PCIe-only GPUs
        ("pcie-switch", 2, 14336, "custom"),  # TP 2 over PCIe with P2P
        ("pcie-shm", 2, 14336, "custom if P2P works"),
    ],
)
def test_allreduce_path(engine, kind, nranks, nbytes, via):
    assert engines.allreduce_path(engine, kind, nranks, nbytes).via == via


def test_none_always_nccl_and_unknown_engine():
    assert engines.allreduce_path("none", "nvswitch", 8, 14336).via == "nccl"
    assert engines.notes("none", "nvswitch", 8, [14336]) == []
    with pytest.raises(ValueError):
        engines.allreduce_path("trt", "nvswitch", 8, 14336)


def test_recommend_says_nccl_settings_do_not_change_bypassed_allreduces(cli_runner, monkeypatch):
    from nccl_tune.model import installed_engine, installed_sglang

    def missing(root=None):
        raise installed_engine.EngineUnavailable("SGLang is not importable in this Python")

    monkeypatch.setattr(installed_sglang, "read_sglang", missing)  # the cited rules, wherever SGLang is
    result = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--topology", "nvswitch", "--engine", "sglang"])
    assert result.exit_code == 0, result.output
    assert "NCCL settings do not change those allreduces" in result.output
    assert "--disable-custom-all-reduce" in result.output
    out = json.loads(
        cli_runner.invoke(
            cli, ["recommend", "--layers", "61", "--topology", "pcie-amd-2s", "--engine", "sglang", "--json"]
        ).stdout
    )
    # SGLang read by the cited rules (test_installed_sglang covers SGLang read from its source)
    assert out["engine"]["name"] == "sglang" and "go through NCCL" in out["engine"]["notes"][1]


def _hand_vllm():
    """vLLM-shaped tables written by hand (numbers chosen for the test, not vLLM's): custom
    allreduce first, then PyNCCL; with torch symmetric memory on, compute capability 9.0 at
    TP 8 caps the custom allreduce at 32 KiB (elsewhere its 8 MiB default holds)."""
    from nccl_tune.model.installed_engine import VllmTables

    return VllmTables(
        version="hand",
        root="/hand",
        custom_max={"9.0": {8: 32 << 10}},
        symm_max={"9.0": {8: 64 << 20}},
        nccl_symm={},
        custom_world_sizes=(2, 4, 6, 8),
        custom_default_max=8 << 20,
        order=("custom", "nccl"),
        switches={
            "VLLM_ALLREDUCE_USE_FLASHINFER": False,
            "VLLM_USE_NCCL_SYMM_MEM": False,
            "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": False,
            "VLLM_ALLREDUCE_USE_SYMM_MEM": True,
            "VLLM_BATCH_INVARIANT": False,
        },
    )


def test_spec_plan_reads_the_engine_as_recommend_does(cli_runner, monkeypatch):
    from nccl_tune.model import installed_engine

    monkeypatch.setattr(installed_engine, "read_vllm", _hand_vllm)
    machine = ["--topology", "nvswitch-nvls", "--tp", "8", "--engine", "vllm", "--arch", "sm90"]
    plan = cli_runner.invoke(
        cli,
        [
            "spec-plan",
            "--verify-ms",
            "20",
            "--draft-ms",
            "2",
            "--accept-rate",
            "0.7",
            "--steps",
            "1-3",
            *machine,
            "--json",
        ],
    )
    assert plan.exit_code == 0, plan.output
    engine = json.loads(plan.stdout)["engine"]
    # verify of 1..4 tokens x 7168 x 2 B: below the 32 KiB cap (9.0, TP 8) custom, above NCCL
    assert (engine["name"], engine["basis"], engine["version"]) == ("vllm", "installed", "hand")
    assert [(p["bytes"], p["path"], p["nccl"]) for p in engine["paths"]] == [
        (14336, "custom", False),
        (28672, "custom", False),
        (43008, "nccl", True),
        (57344, "nccl", True),
    ]
    assert engine["nccl_changes_decode"] is None  # some sizes, not all
    assert json.loads(plan.stdout)["engine_notes"][:-1] == engine["notes"]
    # recommend --spec-steps asks about the same sizes: the same answer, one code path
    rec = cli_runner.invoke(
        cli,
        [
            "recommend",
            "--layers",
            "61",
            "--spec-steps",
            "1-3",
            "--accept-rate",
            "0.7",
            "--draft-ms",
            "2",
            "--verify-ms",
            "20",
            *machine,
            "--json",
        ],
    )
    assert rec.exit_code == 0, rec.output
    assert json.loads(rec.stdout)["engine"] == engine
    text = cli_runner.invoke(
        cli, ["spec-plan", "--verify-ms", "20", "--draft-ms", "2", "--accept-rate", "0.7", "--steps", "1-3", *machine]
    ).stdout
    assert [x for x in text.splitlines() if x.startswith("note: ")] == [
        *(f"note: {line}" for line in engine["notes"]),
        "note: (sizes: verify of k+1 tokens at hidden 7168, bf16)",
    ]


def test_spec_plan_engine_fallback_and_assumed_kind(cli_runner, monkeypatch):
    from nccl_tune.model import installed_engine

    def missing():
        raise installed_engine.EngineUnavailable("vLLM is not importable in this Python")

    monkeypatch.setattr(installed_engine, "read_vllm", missing)
    result = cli_runner.invoke(
        cli,
        [
            "spec-plan",
            "--verify-ms",
            "20",
            "--draft-ms",
            "2",
            "--accept-rate",
            "0.7",
            "--steps",
            "1",
            "--engine",
            "vllm",
            "--tp",
            "8",
            "--arch",
            "9.0",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["engine"]["basis"], out["engine"]["fallback"]) == (
        "cited rules",
        "not read from an installed vLLM (vLLM is not importable in this Python)",
    )
    # no --topology: the kind comm(n) assumes, said so; then the cited rules for it
    assert out["engine_notes"][:2] == [
        "engine vllm: machine kind pcie-shm ASSUMED (pass --topology for yours)",
        (
            "engine vllm: not read from an installed vLLM (vLLM is not importable in this Python); "
            f"the answer below is the cited rules ({engines.SOURCES['vllm']})"
        ),
    ]
    assert out["engine_notes"][2:-1] == engines.notes("vllm", "pcie-shm", 8, [14336, 28672])
