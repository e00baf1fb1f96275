"""Packaging: no second libnccl beside a CUDA torch, one for doctor beside a CPU torch.

A CUDA torch is presented as metadata only: a dist-info folder whose Requires-Dist lines
are torch 2.11.0's published ones (PyPI metadata of torch 2.11.0, Linux x86_64 wheel).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tools import nccl_wheel

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# torch 2.11.0's NVIDIA requirements as published (Requires-Dist of its PyPI wheel).
TORCH_2_11_REQUIRES = [
    "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]"
    '==13.0.2; platform_system == "Linux"',
    'cuda-bindings<14,>=13.0.3; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.19.0.56; platform_system == "Linux"',
    'nvidia-cusparselt-cu13==0.8.0; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.28.9; platform_system == "Linux"',
    'nvidia-nvshmem-cu13==3.4.5; platform_system == "Linux"',
    "filelock",
    'optree>=0.13.0; extra == "optree"',
]


def _dist_info(site: Path, name: str, version: str, requires: list[str] = ()) -> None:
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (folder / "METADATA").write_text("\n".join(lines) + "\n")


def test_a_cuda_torch_brings_its_nccl_wheel_so_none_is_added():
    choice = nccl_wheel.choose("2.11.0", TORCH_2_11_REQUIRES, ["torch", "filelock"])
    assert choice.extra is None
    assert choice.why == "torch 2.11.0 brings nvidia-nccl-cu13: no second NCCL wheel"


def test_an_installed_nccl_wheel_is_kept_whatever_torch_is():
    assert nccl_wheel.choose("2.13.0+cpu", [], ["torch", "nvidia_nccl_cu13"]).extra is None


def test_a_gpu_torch_without_an_nccl_wheel_gets_no_second_libnccl():
    """A torch built against a system NCCL or RCCL (no NCCL requirement) loads that one."""
    assert nccl_wheel.choose("2.6.0+cu126", [], ["torch"]).extra is None
    assert nccl_wheel.choose("2.9.0+rocm6.4", [], ["torch"]).extra is None


def test_a_cpu_torch_or_none_gets_the_nccl_extra_which_is_nvidia_nccl_cu12():
    assert nccl_wheel.choose("2.13.0+cpu", ["filelock", "sympy>=1.13.3"], ["torch"]).extra == "nccl"
    assert nccl_wheel.choose(None, None, []).extra == "nccl"
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["nccl"] == ["nvidia-nccl-cu12"]
    assert not [d for d in project["dependencies"] if d.startswith("nvidia-nccl")]


def test_decision_from_installed_metadata(tmp_path):
    cuda, cpu = tmp_path / "cuda", tmp_path / "cpu"
    _dist_info(cuda, "torch", "2.11.0", TORCH_2_11_REQUIRES)
    _dist_info(cuda, "nvidia-nccl-cu13", "2.28.9")
    _dist_info(cpu, "torch", "2.13.0+cpu", ["filelock"])
    assert nccl_wheel.from_metadata([str(cuda)]).why == "keeping the installed nvidia-nccl-cu13"
    assert nccl_wheel.from_metadata([str(cpu)]).extra == "nccl"


@pytest.mark.parametrize(
    "torch_version, requires, extra", [("2.11.0", TORCH_2_11_REQUIRES, ""), ("2.13.0+cpu", ["filelock"], "[nccl]")]
)
def test_install_sh_adds_the_nccl_extra_only_beside_a_cpu_torch(tmp_path, torch_version, requires, extra):
    """install.sh end to end with pip replaced by a recorder and a Python that sees only a
    stand-in torch (its module and its metadata) and the standard library."""
    site = tmp_path / "site"
    _dist_info(site, "torch", torch_version, requires)
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(f"__version__ = {torch_version!r}\n")
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -m ] && { [ "$2" = pip ] || [ "$2" = nccl_tune ]; }; then\n'
        f'  echo "$*" >>{log}; exit 0\nfi\n'
        f'exec {sys.executable} -S "$@"\n'
    )
    python.chmod(0o755)
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "install.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(python), "PYTHONPATH": str(site), "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert f"install.sh: keeping torch {torch_version}" in done.stdout
    assert log.read_text().splitlines()[0] == f"-m pip install -q -e .{extra}"
