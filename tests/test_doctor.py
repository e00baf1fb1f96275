"""doctor: runs on this machine (no GPU) and reports what is really installed."""

from __future__ import annotations

import ctypes
import json
import shutil
from importlib import metadata
from pathlib import Path

import pytest

from nccl_tune.cli import cli
from nccl_tune.live import sysinfo

KEYS = ["nccl_libraries", "torch", "gpus", "topology", "conf_files", "env"]


def pip_nccl():
    """(path, version) of nvidia-nccl-cu12's libnccl, found through the package's own metadata."""
    try:
        dist = metadata.distribution("nvidia-nccl-cu12")
    except metadata.PackageNotFoundError:
        pytest.skip("nvidia-nccl-cu12 is not installed")
    libs = [f for f in dist.files if f.name.startswith("libnccl.so")]
    return Path(dist.locate_file(libs[0])).resolve(), dist.version


def ctypes_version(path) -> str:
    code = ctypes.c_int()
    assert ctypes.CDLL(str(path)).ncclGetVersion(ctypes.byref(code)) == 0
    v = code.value  # NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from click.testing import CliRunner

    runner = CliRunner(env={"NCCL_PROTO": "^LL", "NCCL_FOO_BAR": "1", "NCCL_CONF_FILE": None})
    result = runner.invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_keys_exactly(report):
    assert list(report) == KEYS


def test_reports_nvidia_nccl_cu12_real_version(report):
    path, dist_version = pip_nccl()
    real = ctypes_version(path)
    assert dist_version.startswith(real)  # the wheel's version is the library's
    entries = [e for e in report["nccl_libraries"] if e["source"] == "nvidia-nccl-cu12"]
    assert entries and Path(entries[0]["path"]).resolve() == path
    assert entries[0]["version"] == real and set(entries[0]) >= {"path", "version"}


def test_torch_info_matches_torch(report):
    import torch

    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["cuda"] == torch.version.cuda
    if torch.version.cuda is None:
        assert report["torch"]["nccl"] is None and "CPU build" in report["torch"]["note"]


def test_no_gpu_is_said_plainly(report):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    assert report["gpus"]["count"] == 0 and "nvidia-smi not found" in report["gpus"]["note"]
    assert report["topology"]["kind"] is None and "no topology" in report["topology"]["note"]


def test_current_environment_is_linted(report):
    assert report["env"]["variables"] == {"NCCL_FOO_BAR": "1", "NCCL_PROTO": "^LL"}
    messages = {f["variable"]: f["message"] for f in report["env"]["findings"]}
    assert "LL128" in messages["NCCL_PROTO"] and "unknown" in messages["NCCL_FOO_BAR"]


def test_topo_file_links_and_affinity(real_fixtures, cli_runner):
    path = real_fixtures / "topo" / "dgx_a100_nv12_10nics_tabs_full_legend.txt"
    result = cli_runner.invoke(cli, ["doctor", "--json", "--topo-file", str(path)])
    assert result.exit_code == 0, result.output
    topo = json.loads(result.stdout)["topology"]
    assert topo["source"] == str(path) and topo["kind"] == "nvlink"
    assert topo["links"]["GPU0"] == {f"GPU{i}": "NV12" for i in range(1, 8)}
    assert topo["affinity"]["GPU2"] == {"CPU Affinity": "16-31,144-159", "NUMA Affinity": "1"}
    assert topo["nics"]["NIC3"] == "mlx5_3" and topo["gpu_nic"]["GPU0"]["NIC0"] == "PXB"


def test_text_output(cli_runner, tmp_path):
    own = Path(__file__).parent / "fixtures" / "topo" / "pcie_2socket_8gpu_nics_tabs.txt"
    result = cli_runner.invoke(cli, ["doctor", "--topo-file", str(own)])
    assert result.exit_code == 0, result.output
    for heading in ("NCCL libraries", "torch", "GPUs", "Topology", "NCCL conf files", "NCCL_* environment"):
        assert heading in result.output
    assert "kind: pcie-shm" in result.output


def test_conf_files_precedence(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_DEBUG=INFO\nNCCL_PROTO=Simple\n")
    mine = tmp_path / "mine.conf"
    mine.write_text("# site\nNCCL_PROTO=LL\nNCCL_ALGO=Ring\nNCCL_IB_HCA='mlx5'\n")
    env = {"NCCL_CONF_FILE": str(mine), "NCCL_ALGO": "Tree"}
    items = sysinfo.conf_files(env, str(home), nccl_version=(2, 32, 3))
    assert [(i["role"], i["exists"], i["read_by_nccl"]) for i in items] == [
        ("NCCL_CONF_FILE", True, True),
        ("user", True, False),
        ("system", Path("/etc/nccl.conf").is_file(), True),
    ]
    # read as NCCL reads it (src/misc/param.cc setEnvFile): literally, quotes kept
    assert items[0]["sets"] == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_IB_HCA": "'mlx5'"}
    assert items[0]["effective"] == {"NCCL_PROTO": "LL", "NCCL_IB_HCA": "'mlx5'"}  # env wins for ALGO
    assert items[1]["effective"] == {}  # not read at all
    assert [f["line"] for f in items[0]["findings"]] == [4]  # quoted: NCCL keeps quotes
    # Before 2.23 NCCL ignores NCCL_CONF_FILE and reads ~/.nccl.conf.
    old = sysinfo.conf_files(env, str(home), nccl_version=(2, 21, 5))
    assert [(i["role"], i["read_by_nccl"]) for i in old][:2] == [("NCCL_CONF_FILE", False), ("user", True)]
    assert old[1]["effective"] == {"NCCL_DEBUG": "INFO", "NCCL_PROTO": "Simple"}


def test_bad_topo_file_is_exit_2(tmp_path, cli_runner):
    bad = tmp_path / "topo.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tWARP\nGPU1\tWARP\t X \n")
    result = cli_runner.invoke(cli, ["doctor", "--topo-file", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2:" in result.output


# ---------------------------------------------------------------- which libnccl torch loads


def _wheel_site(root: Path, *wheels: str) -> Path:
    """A site folder holding nvidia/nccl/lib/libnccl.so.2 and the dist-info of `wheels`."""
    (root / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (root / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    for name in wheels:
        (root / f"{name.replace('-', '_')}-2.28.9.dist-info").mkdir()
    return root


def test_a_wheels_libnccl_is_named_after_the_wheel_that_installed_it(tmp_path):
    from nccl_tune.nccl import ncclinfo

    cu13 = _wheel_site(tmp_path / "a", "nvidia-nccl-cu13")
    both = _wheel_site(tmp_path / "b", "nvidia-nccl-cu12", "nvidia-nccl-cu13")
    found = {lib.path: lib.source for lib in ncclinfo.find_libraries(load=False, search=[str(cu13), str(both)])}
    assert found[str(cu13 / "nvidia/nccl/lib/libnccl.so.2")] == "nvidia-nccl-cu13"
    assert found[str(both / "nvidia/nccl/lib/libnccl.so.2")] == "nvidia-nccl-cu12+nvidia-nccl-cu13"


def test_two_nccl_wheels_in_one_place_are_a_warning(cli_runner, monkeypatch):
    lib = {"source": "nvidia-nccl-cu12+nvidia-nccl-cu13", "version": "2.28.9", "path": "/s/libnccl.so.2", "error": None}
    report = {
        "nccl_libraries": [lib],
        "torch": {"version": None, "note": "not inspected"},
        "gpus": {"devices": [], "note": "none"},
        "topology": {"note": "none"},
        "conf_files": [],
        "env": {"variables": {}, "findings": []},
    }
    monkeypatch.setattr(sysinfo, "doctor_report", lambda topo_file=None: report)
    result = cli_runner.invoke(cli, ["doctor"])
    assert (
        "  warning: nvidia-nccl-cu12 and nvidia-nccl-cu13 are all installed; each writes "
        "/s/libnccl.so.2, so it is the last one installed: keep the one torch requires"
    ) in result.output.splitlines()


def test_the_libnccl_torch_loads_is_the_one_import_torch_mapped_else_by_version():
    from nccl_tune.nccl.ncclinfo import NcclLibrary

    libs = [
        NcclLibrary("/a/libnccl.so.2", "nvidia-nccl-cu12", "2.32.3"),
        NcclLibrary("/b/libnccl.so.2", "system", "2.28.9"),
    ]
    mapped = {"nccl": "2.28.9", "nccl_mapped": ["/c/libnccl.so.2"]}
    assert sysinfo.torch_library(mapped, libs) == ("/c/libnccl.so.2", "mapped into this process by import torch")
    assert sysinfo.torch_library({"nccl": "2.28.9", "nccl_mapped": None}, libs)[0] == "/b/libnccl.so.2"
    path, basis = sysinfo.torch_library({"nccl": "2.27.3", "nccl_mapped": []}, libs)
    assert path is None and basis.startswith("no file found of torch's NCCL version 2.27.3")


def test_mapped_libraries_from_a_maps_file(tmp_path):
    from nccl_tune.nccl import ncclinfo

    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f10 r-xp 00000000 08:01 1  /usr/lib/libc.so.6\n"
        "7f10-7f20 r-xp 00000000 08:01 2  /s/nvidia/nccl/lib/libnccl.so.2\n"
        "7f20-7f30 r--p 00010000 08:01 2  /s/nvidia/nccl/lib/libnccl.so.2\n"
    )
    assert ncclinfo.mapped_libraries(str(maps)) == ["/s/nvidia/nccl/lib/libnccl.so.2"]
    assert ncclinfo.mapped_libraries(str(tmp_path / "absent")) == []
