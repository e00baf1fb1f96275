"""The machine kinds the latency model knows (costmodel.TOPOLOGIES), and what each means.

One kind per way NCCL behaves differently on one node: NVSwitch with or without NVLink
SHARP, an NVLink hybrid cube mesh, PCIe switches, direct attach on one socket, two
sockets, and two AMD sockets (where NCCL's topology search falls back). topology.classify
detects them from `nvidia-smi topo -m`, the CPU vendor and the GPU names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    """A one-node machine as the model sees it."""

    name: str
    link: str  # "nvlink" | "pci": what NCCL's tuning model calls the intra-node hardware
    p2p_path: str  # farthest GPU-GPU path, as `nvidia-smi topo -m` / NCCL print it
    nvswitch: bool = False
    default_channels: int = 2  # channels NCCL's topology search typically finds
    ll128_by_default: bool = False  # NCCL enables LL128 itself only on NVLink machines
    description: str = ""
    nvls: bool | None = None  # NVLink SHARP available (NVSwitch gen3, Hopper+); None: = nvswitch
    # What NCCL's topology search finds, where it is not the link's usual bandwidth: GB/s per
    # channel and channels of the ring graph NCCL's selection uses (None: the usual view).
    search_bw: float | None = None
    search_channels: int | None = None
    sockets: int = 1
    host: str = ""  # CPU vendor the kind implies ("amd", "intel"; "" = either)

    @property
    def has_nvls(self) -> bool:
        """True when NCCL can build NVLS (NVLink SHARP) collectives on this machine."""
        return self.nvswitch if self.nvls is None else self.nvls


# The kinds real machines need (topology.classify detects them). `nvlink`, `pcie` and
# `pcie-shm` are the original names and keep their meaning.
TOPOLOGIES: dict[str, Topology] = {
    "nvlink": Topology(
        "nvlink",
        "nvlink",
        "NVL",
        nvswitch=True,
        default_channels=16,
        ll128_by_default=True,
        description="GPUs on NVLink/NVSwitch (DGX/HGX class)",
    ),
    "nvswitch": Topology(
        "nvswitch",
        "nvlink",
        "NVL",
        nvswitch=True,
        nvls=False,
        default_channels=16,
        ll128_by_default=True,
        description="NVSwitch without NVLink SHARP (A100 HGX class): no NVLS",
    ),
    "nvswitch-nvls": Topology(
        "nvswitch-nvls",
        "nvlink",
        "NVL",
        nvswitch=True,
        nvls=True,
        default_channels=16,
        ll128_by_default=True,
        description="NVSwitch with NVLink SHARP (H100/B200 HGX class)",
    ),
    # V100/P100 hybrid cube mesh: some GPU pairs are SYS in `nvidia-smi topo -m`, but NCCL's
    # search builds its rings from NVLink hops only (each GPU has NVLinks to 4-6 others), so
    # NCCL's view is NVLink (graph typeIntra NVL) and no data goes through host memory.
    "nvlink-mesh": Topology(
        "nvlink-mesh",
        "nvlink",
        "NVL",
        default_channels=4,
        ll128_by_default=True,
        description="NVLink hybrid cube mesh, no NVSwitch (DGX-1 V100 class): NCCL's rings use NVLink hops only",
    ),
    "pcie": Topology(
        "pcie", "pci", "PXB", default_channels=2, description="PCIe-only GPUs, P2P enabled between all pairs"
    ),
    "pcie-switch": Topology(
        "pcie-switch",
        "pci",
        "PXB",
        default_channels=2,
        description="PCIe-only GPUs behind PCIe switches on one CPU: P2P between all pairs (PIX/PXB)",
    ),
    "pcie-direct": Topology(
        "pcie-direct",
        "pci",
        "PHB",
        default_channels=2,
        description="PCIe-only GPUs on one CPU, some pairs not under "
        "one PCIe switch (PHB/NODE): beyond NCCL's default "
        "P2P level, so those pairs go through host memory",
    ),
    "pcie-shm": Topology(
        "pcie-shm",
        "pci",
        "SYS",
        default_channels=2,
        sockets=2,
        description="PCIe-only GPUs across CPU sockets: NCCL's default P2P "
        "level excludes SYS paths, so data goes through host memory",
    ),
    # NCCL 2.28/2.29 on two AMD sockets: topo.h's AMD_BW (16 GB/s for every AMD CPU) makes
    # the ring search fail, and search.cc falls back to one channel at 0.1 GB/s (typeIntra
    # SYS). With that bandwidth NCCL's estimate puts Simple ahead of LL from about 4 KB
    # (LL's halved bandwidth dominates), although LL is far faster on the real links. More
    # than two AMD GPUs keep NCCL's default P2P level PXB (paths.cc), so the pairs across
    # sockets use host memory unless NCCL_P2P_LEVEL=SYS. NCCL_GRAPH_FILE replaces the search.
    "pcie-amd-2s": Topology(
        "pcie-amd-2s",
        "pci",
        "SYS",
        default_channels=2,
        sockets=2,
        host="amd",
        search_bw=0.1,
        search_channels=1,
        description="PCIe-only GPUs on two AMD sockets (EPYC): NCCL's "
        "ring search falls back to 0.1 GB/s and it picks "
        "Simple for small messages; SYS pairs via host memory",
    ),
}
