"""nvidia-smi topo -m parser and classify: real fixtures and our own layouts."""

from __future__ import annotations

import pytest
from conftest import OWN_FIXTURES

from nccl_tune.errors import NcclTuneError
from nccl_tune.nccl import topology
from nccl_tune.nccl.topology import classify, parse_topo

TOPO = OWN_FIXTURES / "topo"


def load(path):
    return parse_topo(path.read_text(), source=str(path))


def test_real_dgx_a100_tabs_nic_rows_and_legend(real_fixtures):
    topo = load(real_fixtures / "topo" / "dgx_a100_nv12_10nics_tabs_full_legend.txt")
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.nics == [f"NIC{i}" for i in range(10)]
    assert topo.nic_names["NIC0"] == "mlx5_0" and topo.nic_names["NIC9"] == "mlx5_9"
    assert all(link == "NV12" for row in topo.links().values() for link in row.values())
    assert topo.affinity["GPU0"] == {"CPU Affinity": "48-63,176-191", "NUMA Affinity": "3"}
    assert topo.affinity["GPU6"]["NUMA Affinity"] == "5"
    assert topo.affinity["NIC0"] == {}  # empty affinity cells on NIC rows
    assert topo.matrix["GPU0"]["NIC1"] == "PXB" and topo.matrix["NIC8"]["NIC9"] == "PIX"
    assert set(topo.legend) == {"X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV#"}
    assert classify(topo) == "nvlink"


def test_real_h100_spaces_and_prompt(real_fixtures):
    topo = load(real_fixtures / "topo" / "h100_8gpu_nv18_ht_affinity.txt")
    assert topo.gpus == [f"GPU{i}" for i in range(8)] and topo.nics == []
    assert topo.links()["GPU3"]["GPU7"] == "NV18"
    assert topo.affinity["GPU4"] == {"CPU Affinity": "52-103,156-207", "NUMA Affinity": "1"}
    assert classify(topo) == "nvlink"


def test_pcie_two_socket_tabs_gpu_numa_id():
    topo = load(TOPO / "pcie_2socket_8gpu_nics_tabs.txt")
    assert topo.affinity_columns == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    # nvidia-smi's extra empty cell before GPU NUMA ID must not shift the values.
    assert topo.affinity["GPU5"] == {"CPU Affinity": "32-63,96-127", "NUMA Affinity": "1", "GPU NUMA ID": "N/A"}
    links = topo.links()
    assert (links["GPU0"]["GPU1"], links["GPU0"]["GPU2"], links["GPU0"]["GPU4"]) == ("PIX", "NODE", "SYS")
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.matrix["GPU6"]["NIC1"] == "NODE"
    assert classify(topo) == "pcie-shm"  # NODE/SYS pairs exceed PXB (Intel)
    assert classify(topo, "GenuineIntel") == "pcie-shm"
    # AMD with more than two GPUs keeps PXB (paths.cc), and NCCL's search falls back.
    assert classify(topo, "AuthenticAMD") == "pcie-amd-2s"


def test_pcie_switch_spaces_prompt_is_a_pcie_switch_box():
    topo = load(TOPO / "pcie_switch_4gpu_spaces_prompt.txt")
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.links()["GPU2"] == {"GPU0": "PXB", "GPU1": "PXB", "GPU3": "PIX"}
    assert topo.affinity["GPU3"]["GPU NUMA ID"] == "N/A"
    assert classify(topo) == "pcie-switch"


def test_legacy_layout_mlx_columns_soc_cpu_affinity_only():
    topo = load(TOPO / "legacy_soc_mlx_columns_cpu_affinity_only.txt")
    assert topo.nics == ["mlx5_0"] and topo.affinity_columns == ["CPU Affinity"]
    assert topo.links()["GPU0"] == {"GPU1": "NV2", "GPU2": "SOC", "GPU3": "SOC"}
    assert topo.matrix["mlx5_0"]["GPU0"] == "PHB"
    assert "SOC" in topo.legend
    # NVLink pairs, but no NVLink ring through all four GPUs: SOC (= SYS) hops in the ring
    assert classify(topo) == "pcie-shm"


def test_markdown_paste_reads_only_the_first_matrix():
    topo = load(TOPO / "markdown_indented_phb_then_p2p_matrix.txt")
    assert topo.links() == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}
    assert "NS" not in topo.legend and "OK" not in topo.legend
    assert classify(topo) == "pcie-direct"  # PHB on one socket: beyond PXB
    assert classify(topo, "AuthenticAMD") == "pcie"  # two GPUs on AMD: SYS level, P2P


def test_single_gpu_cannot_be_classified():
    topo = load(TOPO / "single_gpu_tabs.txt")
    assert topo.gpus == ["GPU0"] and topo.links() == {"GPU0": {}}
    assert topo.affinity["GPU0"] == {"CPU Affinity": "0-15", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    with pytest.raises(NcclTuneError):
        classify(topo)


def test_kinds_are_the_cost_model_topologies():
    from nccl_tune.model import costmodel

    assert set(topology.KINDS) == set(costmodel.TOPOLOGIES)


def test_to_dict_links_shape():
    data = load(TOPO / "pcie_2socket_8gpu_nics_tabs.txt").to_dict()
    assert set(data["links"]) == {f"GPU{i}" for i in range(8)}
    assert all(len(row) == 7 and g not in row for g, row in data["links"].items())
    assert data["nics"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}


@pytest.mark.parametrize(
    "text,line,fragment",
    [
        ("hello\nworld\n", None, "no nvidia-smi topo -m matrix"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \tFOO\n", 3, "affinity"),
        ("\tGPU0\tGPU1\nGPU0\t X \tFAST\nGPU1\tFAST\t X \n", 2, "unknown link entry 'FAST'"),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tPIX\t X \n", 2, "expected 2 link entries"),
        ("\tGPU0\tGPU1\nGPU0\t X \tPIX\n\n", 3, "no matrix row for GPU1"),
        ("\tGPU0\tGPU1\nGPU0\tPIX\tPIX\nGPU1\tPIX\t X \n", 2, "diagonal"),
    ],
)
def test_bad_input_names_the_line(text, line, fragment):
    with pytest.raises(NcclTuneError) as info:
        parse_topo(text, source="t.txt")
    assert fragment in str(info.value)
    assert info.value.line == line


def test_detect_kind_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(topology.shutil, "which", lambda name: None)
    assert topology.run_nvidia_smi_topo() is None
    assert topology.detect_kind() is None


def test_detect_kind_runs_nvidia_smi(monkeypatch, tmp_path):
    # A stand-in nvidia-smi on PATH that prints a saved matrix: exercises the real subprocess path.
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat '{TOPO / 'pcie_switch_4gpu_spaces_prompt.txt'}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert topology.detect_kind() == "pcie-switch"


def test_default_p2p_level():
    assert topology.default_p2p_level(None) == "PXB"
    assert topology.default_p2p_level("GenuineIntel") == "PXB"
    assert topology.default_p2p_level("AuthenticAMD") == "SYS"
    assert topology.default_p2p_level("AuthenticAMD", 2) == "SYS"
    assert topology.default_p2p_level("AuthenticAMD", 8) == "PXB"


def test_v100_hybrid_cube_mesh_is_classified_by_the_rings_nccl_builds():
    # SYS pairs in the matrix, but every GPU reaches the ring over NVLink: NCCL's rings
    # use NVLink hops only, so this is no host-memory (pcie-shm) machine.
    topo = load(TOPO / "v100_hybrid_cube_mesh_8gpu_tabs.txt")
    assert topo.links()["GPU0"]["GPU5"] == "SYS"
    assert classify(topo) == "nvlink-mesh"
    assert classify(topo, "GenuineIntel") == "nvlink-mesh"


def test_nvswitch_kind_by_gpu_name(real_fixtures):
    topo = load(real_fixtures / "topo" / "h100_8gpu_nv18_ht_affinity.txt")
    assert classify(topo, None, ["NVIDIA H100 80GB HBM3"] * 8) == "nvswitch-nvls"
    assert classify(topo, None, ["NVIDIA A100-SXM4-80GB"] * 8) == "nvswitch"
    assert classify(topo, None, None) == "nvlink"


def test_nvswitch_kind_by_nvls_support_the_compute_capability_decides(real_fixtures):
    from nccl_tune.nccl.topology import nvls_support

    topo = load(real_fixtures / "topo" / "h100_8gpu_nv18_ht_affinity.txt")
    assert classify(topo, None, None, ["9.0"] * 8) == "nvswitch-nvls"  # Hopper: NVLink SHARP
    assert classify(topo, None, None, ["8.0"] * 8) == "nvswitch"  # Ampere: no NVLS
    # The capability wins over a name (an H100 reported at 8.0 would have no NVLS).
    assert classify(topo, None, ["NVIDIA H100 80GB HBM3"] * 8, ["8.0"] * 8) == "nvswitch"
    assert nvls_support(["9.0", "8.6"]) is False and nvls_support(["x"]) is None
    assert nvls_support(None, ["Tesla V100-SXM2-16GB"]) is False
    assert nvls_support(None, ["NVIDIA L40S"]) is None


def test_damaged_nic_cells_keep_the_gpu_block_and_warn():
    # Two tab-separated cells merged in a paste (NODENODE), a NIC row cut (SYSSYS).
    topo = load(TOPO / "damaged_nic_cells_merged_tabs.txt")
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.links()["GPU1"] == {"GPU0": "NODE", "GPU2": "SYS", "GPU3": "SYS"}
    assert classify(topo) == "pcie-shm"
    assert len(topo.warnings) == 2
    assert topo.warnings[0].startswith("line 3: GPU1's NIC and affinity cells are damaged ('NODENODE'")
    assert topo.warnings[1].startswith("line 7: NIC1's row is damaged")
    data = topo.to_dict()
    assert data["gpu_nic"]["GPU1"] == {} and data["gpu_nic"]["GPU0"]["NIC0"] == "PIX"
    assert data["affinity"]["GPU1"] == {} and data["affinity"]["GPU2"]["NUMA Affinity"] == "1"
    assert data["warnings"] == topo.warnings


def test_damaged_gpu_block_is_still_refused():
    text = (TOPO / "damaged_nic_cells_merged_tabs.txt").read_text().replace("NODE\t X \tSYS", "NODEX\tSYS", 1)
    with pytest.raises(NcclTuneError, match="GPU1: unknown link entry 'NODEX'") as info:
        parse_topo(text, source="t.txt")
    assert info.value.line == 3


def test_doctor_reads_a_damaged_paste_and_warns(cli_runner):
    from nccl_tune.cli import cli

    result = cli_runner.invoke(cli, ["doctor", "--topo-file", str(TOPO / "damaged_nic_cells_merged_tabs.txt")])
    assert result.exit_code == 0, result.output
    assert "kind: pcie-shm" in result.output
    assert "warning: line 3: GPU1's NIC and affinity cells are damaged" in result.output


def test_markdown_pipe_table():
    topo = load(TOPO / "markdown_pipe_table_pcie_4gpu.txt")
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"] and topo.nics == []
    assert topo.links()["GPU0"] == {"GPU1": "PIX", "GPU2": "PXB", "GPU3": "PXB"}
    assert topo.affinity["GPU3"] == {"CPU Affinity": "0-31", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    assert classify(topo) == "pcie-switch" and not topo.warnings  # PIX/PXB only: P2P everywhere


# PCIe machines whose GPU blocks were posted publicly (each file's .source names the post):
# P2P over PCIe (pcie, pcie-switch) or through host memory (pcie-direct on one socket,
# pcie-shm / pcie-amd-2s across sockets) decides the shipped advice.
@pytest.mark.parametrize(
    "name, vendor, kind",
    [
        ("pcie_2gpu_phb_tabs_threadripper.txt", "AuthenticAMD", "pcie"),  # AMD, <= 2 GPUs: default SYS
        ("pcie_2gpu_phb_tabs_threadripper.txt", "GenuineIntel", "pcie-direct"),  # PHB beyond PXB
        ("pcie_4gpu_all_phb_spaces.txt", None, "pcie-direct"),  # PHB beyond the PXB default
        ("pcie_4gpu_all_phb_spaces.txt", "AuthenticAMD", "pcie-direct"),  # AMD, > 2 GPUs: PXB too
        ("pcie_5gpu_sys_phb_node_spaces.txt", "GenuineIntel", "pcie-shm"),
        ("pcie_5gpu_sys_phb_node_spaces.txt", "AuthenticAMD", "pcie-amd-2s"),  # SYS pairs, AMD search
        ("markdown_pipe_table_pcie_4gpu.txt", "GenuineIntel", "pcie-switch"),  # PIX/PXB only
    ],
)
def test_pcie_classification_on_posted_machines(name, vendor, kind):
    topo = load(TOPO / name)
    assert classify(topo, vendor) == kind
    assert all(not link.startswith("NV") for row in topo.links().values() for link in row.values())
