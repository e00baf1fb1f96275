"""The engines' own allreduce paths (SGLang/vLLM custom allreduce) and --engine."""

from __future__ import annotations

import json

import pytest

from nccl_tune.model import engines
from nccl_tune.cli import cli


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("kind, nranks, nbytes, via", [
    ("nvswitch", 8, 14336, "custom"),          # NVLink: custom allreduce below 8 MiB
    ("nvswitch-nvls", 4, 57344, "custom"),
    ("nvswitch", 8, 8 << 20, "nccl"),          # not below max_size
    ("nvswitch", 8, 14338, "nccl"),            # not a multiple of 16 B
    ("nvswitch", 3, 14336, "nccl"),            # world size 3 unsupported
    ("nvlink-mesh", 8, 14336, "nccl"),         # V100 mesh: not all pairs NVLink
    ("pcie-amd-2s", 8, 14336, "nccl"),         # >2 PCIe-only GPUs
    ("pcie-switch", 2, 14336, "custom"),       # TP 2 over PCIe with P2P
    ("pcie-shm", 2, 14336, "custom if P2P works"),
])
def test_allreduce_path(engine, kind, nranks, nbytes, via):
    assert engines.allreduce_path(engine, kind, nranks, nbytes).via == via


def test_none_always_nccl_and_unknown_engine():
    assert engines.allreduce_path("none", "nvswitch", 8, 14336).via == "nccl"
    assert engines.notes("none", "nvswitch", 8, [14336]) == []
    with pytest.raises(ValueError):
        engines.allreduce_path("trt", "nvswitch", 8, 14336)


def test_recommend_says_nccl_settings_do_not_change_bypassed_allreduces(cli_runner):
    result = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--topology", "nvswitch",
                                     "--engine", "sglang"])
    assert result.exit_code == 0, result.output
    assert "NCCL settings do not change those allreduces" in result.output
    assert "--disable-custom-all-reduce" in result.output
    out = json.loads(cli_runner.invoke(cli, ["recommend", "--layers", "61", "--topology", "pcie-amd-2s",
                                             "--engine", "sglang", "--json"]).stdout)
    # SGLang is read by the cited rules (test_engine_paths covers vLLM, read from vLLM itself)
    assert out["engine"]["name"] == "sglang" and "go through NCCL" in out["engine"]["notes"][1]


def test_spec_plan_engine_note(cli_runner):
    result = cli_runner.invoke(cli, ["spec-plan", "--verify-ms", "20", "--draft-ms", "2",
                                     "--accept-rate", "0.7", "--steps", "1-3", "--engine", "vllm",
                                     "--topology", "nvswitch", "--tp", "8", "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["engine_notes"]
    assert notes and "NCCL settings do not change" in notes[0]
