"""SGLang's allreduce paths read from its source (nccl_tune.model.installed_sglang).

Expected values are written by hand from SGLang 0.5.23's files: parallel_state.py
GroupCoordinator._resolve_outplace_all_reduce_method returns "ca", "pcie_ipc", "qr",
"pymscclpp", "torch_symm_mem", "pynccl" in that order, else None (NCCL);
custom_all_reduce.py CustomAllreduce has _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8] and, on
CUDA, _MAX_CAR_SIZE = 8192 * 1024, and should_custom_ar takes a multiple of 16 B up to
(<=) max_size when world_size == 2 or full_nvlink; custom allreduce v2 (on by default,
SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 = EnvBool(True)) replaces it on full NVLink, capped
by SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB = EnvInt(16 * 1024); pcie_ipc_ar.py is opt-in
(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = EnvBool(False)), world sizes (2, 4, 8), bf16 only;
all_reduce_utils.py TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[9][8] = 128 * MiB.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_tune.cli import cli
from nccl_tune.model import engines, installed_sglang
from nccl_tune.model.installed_engine import EngineUnavailable, Machine
from nccl_tune.model.installed_sglang import PcieIpc, SglangTables

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
ORDER_0523 = ("ca", "pcie_ipc", "qr", "pymscclpp", "torch_symm_mem", "pynccl", "nccl")
PCIE = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
V2 = "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2"


def _checkouts() -> list[Path]:
    """This checkout, and the main checkout when this one is a git worktree."""
    found = [REPO]
    dot_git = REPO / ".git"
    if dot_git.is_file():  # "gitdir: <main>/.git/worktrees/<name>"
        gitdir = Path(dot_git.read_text(encoding="utf-8").split(":", 1)[1].strip())
        found.append(gitdir.parents[2])
    return found


def _real_root() -> Path | None:
    """The SGLang that `./install.sh --sglang-cpu` puts in <repo>/.venv-sglang."""
    for checkout in _checkouts():
        for root in sorted(checkout.glob(".venv-sglang/lib/python3*/site-packages/sglang")):
            return root
    return None


REAL = _real_root()
needs_real = pytest.mark.skipif(REAL is None, reason="no .venv-sglang with sglang (./install.sh --sglang-cpu)")


@needs_real
def test_reads_the_installed_sglang():
    t = installed_sglang.read_sglang(str(REAL))
    assert (t.version, t.root) == ("0.5.23", str(REAL))
    assert t.order == ORDER_0523 and t.unknown == ()
    assert t.custom_world_sizes == (2, 4, 6, 8)
    assert (t.custom_max, t.custom_inclusive, t.v2) == (8 * MiB, True, True)
    assert t.switches == {
        V2: True,
        "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": 16384,
        PCIE: False,
        "SGLANG_PCIE_IPC_MAX_NUMEL": 0,
        "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": False,
    }
    assert t.pcie_ipc == PcieIpc((2, 4, 8), ("tp",), 64, bf16_only=True, off_when_deterministic=True)
    assert t.symm_max[9] == {2: 64 * MiB, 4: 64 * MiB, 6: 128 * MiB, 8: 128 * MiB}
    assert t.symm_flag == "--enable-torch-symm-mem"
    assert t.files["dispatch"] == (
        "srt/distributed/parallel_state.py GroupCoordinator._resolve_outplace_all_reduce_method"
    )


def _tables(**kw) -> SglangTables:
    """SGLang 0.5.23's figures, written by hand (see the module docstring)."""
    base = dict(
        version="hand",
        root="/hand",
        files={"dispatch": "d", "custom": "c"},
        order=ORDER_0523,
        unknown=(),
        custom_world_sizes=(2, 4, 6, 8),
        custom_max=8 * MiB,
        custom_inclusive=True,
        v2=True,
        pcie_ipc=PcieIpc((2, 4, 8), ("tp",), 64, True, True),
        switches={
            V2: True,
            "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": 16384,
            PCIE: False,
            "SGLANG_PCIE_IPC_MAX_NUMEL": 0,
            "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": False,
        },
        symm_max={9: {8: 128 * MiB}},
        symm_flag="--enable-torch-symm-mem",
    )
    base.update(kw)
    return SglangTables(**base)


PCIE_2 = Machine(2, "9.0", fully_connected=False, multicast=False, flashinfer=False)
PCIE_8 = Machine(8, "9.0", fully_connected=False, multicast=False, flashinfer=False)
NVSWITCH_8 = Machine(8, "9.0", fully_connected=True, multicast=True, flashinfer=False)


@pytest.mark.parametrize(
    "machine, nbytes, dtype, overrides, path",
    [
        (PCIE_2, 14336, "bf16", {}, "ca"),  # world_size == 2, multiple of 16, <= 8 MiB
        (PCIE_8, 14336, "bf16", {}, "nccl"),  # > 2 PCIe GPUs: no custom allreduce; PCIe IPC off
        (PCIE_8, 14336, "bf16", {PCIE: True}, "pcie_ipc"),  # opt-in on: bf16 at TP 8
        (PCIE_8, 14336, "fp16", {PCIE: True}, "nccl"),  # bf16 only
        (PCIE_8, 14336, "bf16", {PCIE: True, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": True}, "nccl"),
        (PCIE_8, 14336, "bf16", {PCIE: True, "SGLANG_PCIE_IPC_MAX_NUMEL": 7168}, "pcie_ipc"),  # 7168 elements
        (PCIE_8, 14336, "bf16", {PCIE: True, "SGLANG_PCIE_IPC_MAX_NUMEL": 7167}, "nccl"),
        (PCIE_2, 14336, "bf16", {PCIE: True}, "ca"),  # ca comes first in the dispatch
        (NVSWITCH_8, 8 * MiB, "bf16", {V2: False}, "ca"),  # v1: <= 8 MiB
        (NVSWITCH_8, 8 * MiB + 16, "bf16", {V2: False}, "nccl"),
        (NVSWITCH_8, 8 * MiB + 16, "bf16", {}, "ca"),  # v2 (default): <= 16 MiB
        (NVSWITCH_8, 16 * MiB + 16, "bf16", {}, "nccl"),
        (NVSWITCH_8, 14344, "bf16", {}, "nccl"),  # 14344 % 16 == 8
        (PCIE_2, 14344, "bf16", {}, "nccl"),
    ],
)
def test_sglang_path_by_hand(machine, nbytes, dtype, overrides, path):
    answer = installed_sglang.sglang_path(_tables(), machine, nbytes, dtype, overrides)
    assert answer.path == path and answer.nccl == (path == "nccl")


def test_the_switches_that_send_it_through_nccl():
    answer = installed_sglang.sglang_path(_tables(), PCIE_8, 14336, "bf16", {PCIE: True})
    assert answer.to_nccl == (f"{PCIE}=0",)
    answer = installed_sglang.sglang_path(_tables(), NVSWITCH_8, 14336)
    assert answer.to_nccl == ("--disable-custom-all-reduce",)
    assert answer.reason == (
        f"custom allreduce v2 (all GPUs NVLink, {V2} on): 14336 B <= 16777216 B = SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB"
    )


def test_profile_switches_are_read_as_sglang_reads_them():
    assert engines.switch_overrides(
        {PCIE: "Yes", V2: "0", "SGLANG_PCIE_IPC_MAX_NUMEL": "4096", "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": "x"}
    ) == {PCIE: True, V2: False, "SGLANG_PCIE_IPC_MAX_NUMEL": 4096}
    assert engines.switch_overrides({PCIE: "2"}) == {}  # EnvBool refuses it: SGLang keeps its default


# A package tree written by hand in the shape of SGLang 0.5.23's files (no PCIe IPC).
_TREE = {
    "_version.py": "__version__ = version = '9.9.9'\n",
    "srt/distributed/parallel_state.py": (
        "class GroupCoordinator:\n"
        "    def _resolve_outplace_all_reduce_method(self, input_):\n"
        "        if self.ca_comm is not None and self.ca_comm.should_custom_ar(input_):\n"
        "            return 'ca'\n"
        "        return None\n"
    ),
    "srt/distributed/device_communicators/custom_all_reduce.py": (
        "MB = 1024 * 1024\n"
        "class CustomAllreduce:\n"
        "    _SUPPORTED_WORLD_SIZES = [2, 4]\n"
        "    _MAX_CAR_SIZE = 4 * MB\n"
        "    if _is_hip:\n"
        "        _MAX_CAR_SIZE = 2 * 8192 * 1024\n"
        "    def should_custom_ar(self, inp):\n"
        "        inp_size = inp.numel() * inp.element_size()\n"
        "        if inp_size % 16 != 0:\n"
        "            return False\n"
        "        if not _is_hip:\n"
        "            if self.world_size == 2 or self.full_nvlink:\n"
        "                return inp_size < self.max_size\n"
        "            return False\n"
    ),
    "srt/distributed/device_communicators/all_reduce_utils.py": "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {}\n",
    "srt/environ.py": "class Envs:\n    SGLANG_ENABLE_DETERMINISTIC_INFERENCE = EnvBool(False)\n",
}


def _write_tree(root: Path, tree: dict[str, str]) -> Path:
    for rel, text in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def test_a_tree_written_by_hand_is_read(tmp_path):
    t = installed_sglang.read_sglang(str(_write_tree(tmp_path, _TREE)))
    assert (t.version, t.order, t.custom_world_sizes, t.custom_max) == ("9.9.9", ("ca", "nccl"), (2, 4), 4 * MiB)
    assert (t.custom_inclusive, t.v2, t.pcie_ipc) == (False, False, None)
    nvswitch_4 = Machine(4, "9.0", fully_connected=True, multicast=True, flashinfer=False)
    assert installed_sglang.sglang_path(t, nvswitch_4, 4 * MiB - 16).path == "ca"
    assert installed_sglang.sglang_path(t, nvswitch_4, 4 * MiB).path == "nccl"  # `<` in this tree


def test_a_changed_structure_falls_back_with_its_reason(tmp_path, monkeypatch):
    tree = dict(_TREE)
    tree["srt/distributed/parallel_state.py"] = tree["srt/distributed/parallel_state.py"].replace(
        "_resolve_outplace_all_reduce_method", "_pick_all_reduce_method"
    )
    monkeypatch.setenv(installed_sglang.ROOT_ENV, str(_write_tree(tmp_path, tree)))
    report = engines.report("sglang", "pcie", 8, [14336], cc="9.0")
    assert (report.basis, report.paths) == ("cited rules", ())
    why = (
        "not read from an installed SGLang (srt/distributed/parallel_state.py GroupCoordinator: "
        "no _resolve_outplace_all_reduce_method (SGLang's source changed))"
    )
    assert report.fallback == why
    assert report.lines[0] == f"engine sglang: {why}; the answer below is the cited rules ({engines.SOURCES['sglang']})"


def test_a_missing_file_falls_back(tmp_path):
    tree = {k: v for k, v in _TREE.items() if not k.endswith("custom_all_reduce.py")}
    root = str(_write_tree(tmp_path, tree))
    with pytest.raises(EngineUnavailable, match=r"^srt/distributed/device_communicators/custom_all_reduce.py: "):
        installed_sglang.read_sglang(root)


def test_not_an_sglang_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(installed_sglang.ROOT_ENV, str(tmp_path))
    report = engines.report("sglang", "pcie", 8, [14336])
    assert (
        report.fallback == f"not read from an installed SGLang ({tmp_path} is not an SGLang package folder (no srt/))"
    )


SPEC = ["spec-plan", "--verify-ms", "20", "--draft-ms", "2", "--accept-rate", "0.7", "--steps", "1"]


@needs_real
def test_spec_plan_names_the_installed_sglang(cli_runner, tmp_path):
    machine = ["--engine", "sglang", "--topology", "pcie", "--tp", "8", "--arch", "sm90"]
    env = {installed_sglang.ROOT_ENV: str(REAL)}
    result = cli_runner.invoke(cli, [*SPEC, *machine, "--json"], env=env)
    assert result.exit_code == 0, result.output
    engine = json.loads(result.stdout)["engine"]
    assert (engine["basis"], engine["version"], engine["read_from"]) == ("installed", "0.5.23", str(REAL))
    assert engine["notes"][0] == f"engine installed SGLang 0.5.23 ({REAL}): TP 8, compute capability 9.0, pcie, bf16"
    assert [(p["bytes"], p["path"], p["nccl"]) for p in engine["paths"]] == [
        (14336, "nccl", True),
        (28672, "nccl", True),
    ]
    assert any(line.startswith(f"  {PCIE}=1 (off by default") for line in engine["notes"])
    text = cli_runner.invoke(cli, [*SPEC, *machine], env=env).stdout
    assert (
        f"note: engine installed SGLang 0.5.23 ({REAL}): TP 8, compute capability 9.0, pcie, bf16" in text.splitlines()
    )
    # a profile that turns PCIe IPC on: SGLang's bf16 decode allreduces leave NCCL
    profile = tmp_path / "ipc.env"
    profile.write_text(f"NCCL_PROTO=LL\n{PCIE}=1\n", encoding="utf-8")
    result = cli_runner.invoke(cli, [*SPEC, *machine, "--profile", str(profile), "--json"], env=env)
    assert result.exit_code == 0, result.output
    engine = json.loads(result.stdout)["engine"]
    assert [(p["path"], p["nccl"], p["to_nccl"]) for p in engine["paths"]] == [("pcie_ipc", False, [f"{PCIE}=0"])] * 2
    assert engine["nccl_changes_decode"] is False
