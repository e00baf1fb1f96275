"""GPU topology from `nvidia-smi topo -m`: parse the matrix, classify it for the cost model.

The parser takes what people save and paste, not only what nvidia-smi prints:

- cells separated by tabs (nvidia-smi itself, with empty cells for missing affinities and
  an extra tab before `GPU NUMA ID`) or by spaces (terminal copies, markdown);
- anything before the header (a `$ nvidia-smi topo -m` prompt, a code fence) and after
  the matrix (the `Legend:` and `NIC Legend:` blocks, a second matrix such as
  `topo -p2p`) is skipped; the NIC legend (`NIC0: mlx5_0`) is read;
- entries X, NV#, PIX, PXB, PHB, NODE, SYS and the pre-2017 SOC (today's SYS);
- NIC rows and columns named NIC# (with a legend) or, in older layouts, by device
  (`mlx5_0`); affinity columns `CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`, or
  only `CPU Affinity` in older layouts.

`classify` reduces a matrix (and the CPU vendor, and GPU names where known) to the cost
model's topology kinds (costmodel.TOPOLOGIES) by what NCCL would build: NVSwitch with or
without NVLS, an NVLink hybrid cube mesh (SYS pairs, but NVLink rings), PCIe switches,
direct attach on one socket, two sockets (Intel-like or AMD, where NCCL's topology
search falls back). NCCL's default P2P level (graph/paths.cc ncclTopoCheckP2p,
2.2x-2.30) is PXB, and SYS on AMD hosts with two GPUs or fewer: pass the CPU vendor when
known; without it the common Intel case (PXB) is assumed. The driver may still refuse
P2P between some GPUs (`nvidia-smi topo -p2p r` shows it); this module cannot see that.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from nccl_tune.errors import NcclTuneError

MAX_PASTE_BYTES = 1024 * 1024  # `nvidia-smi topo -m` of 72 GPUs and NICs is some 30 KB
MAX_PASTE_LINE = 4096  # characters per line (the widest matrix row is some 600)
LINK_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_NVLINK_RE = re.compile(r"^NV\d+$")
_GPU_RE = re.compile(r"^GPU\d+$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_LEGEND_RE = re.compile(r"^\s*(\S+)\s+=\s+(.+?)\s*$")
# Multi-word affinity column names, longest first.
_AFFINITY_NAMES = (("GPU", "NUMA", "ID"), ("CPU", "Affinity"), ("NUMA", "Affinity"))
PCIE_P2P_ENTRIES = ("PIX", "PXB")  # within NCCL's default P2P level on Intel (PXB)
KINDS = (
    "nvlink",
    "pcie",
    "pcie-shm",
    "nvswitch",
    "nvswitch-nvls",
    "nvlink-mesh",
    "pcie-switch",
    "pcie-direct",
    "pcie-amd-2s",
)


@dataclass
class Topology:
    """One `nvidia-smi topo -m` matrix.

    `devices` is the header's column order (GPUs, then NICs); `matrix[row][col]` the
    entry as printed (X on the diagonal); `affinity[row]` maps each printed affinity
    column to its value (missing or empty cells left out); `nic_names` the NIC legend.
    """

    devices: list[str]
    matrix: dict[str, dict[str, str]]
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)
    affinity_columns: list[str] = field(default_factory=list)
    nic_names: dict[str, str] = field(default_factory=dict)
    legend: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    warnings: list[str] = field(default_factory=list)  # parts not read (damaged NIC cells)

    @property
    def gpus(self) -> list[str]:
        """GPU names in column order (GPU0, GPU1, ...)."""
        return [d for d in self.devices if _GPU_RE.match(d)]

    @property
    def nics(self) -> list[str]:
        """Non-GPU device columns (NIC0..., or mlx5_0... in older layouts)."""
        return [d for d in self.devices if not _GPU_RE.match(d)]

    def links(self) -> dict[str, dict[str, str]]:
        """GPU -> {every other GPU -> link entry as printed (NV18, PIX, SYS...)}."""
        gpus = self.gpus
        return {g: {h: self.matrix[g][h] for h in gpus if h != g} for g in gpus}

    def to_dict(self) -> dict:
        """JSON-ready form (doctor's `topology` object, less its `kind`)."""
        return {
            "source": self.source,
            "gpus": self.gpus,
            "nics": {n: self.nic_names.get(n) for n in self.nics},
            "links": self.links(),
            "affinity": {g: self.affinity.get(g, {}) for g in self.gpus},
            "gpu_nic": {g: {n: self.matrix[g][n] for n in self.nics if n in self.matrix[g]} for g in self.gpus},
            "warnings": list(self.warnings),
        }


def _is_header(words: list[str]) -> bool:
    """The header starts with GPU0 and, unlike GPU0's row, is not followed by a link entry."""
    return words[:1] == ["GPU0"] and not (len(words) > 1 and LINK_RE.match(words[1]))


def _split_header(words: list[str]) -> tuple[list[str], list[str]]:
    """Header words -> (device columns, affinity column names)."""
    devices: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word in ("CPU", "NUMA") or (word == "GPU" and index + 1 < len(words)):
            break
        devices.append(word)
        index += 1
    names: list[str] = []
    while index < len(words):
        for name in _AFFINITY_NAMES:
            if tuple(words[index : index + len(name)]) == name:
                names.append(" ".join(name))
                index += len(name)
                break
        else:
            names.append(words[index])
            index += 1
    return devices, names


def _row_cells(line: str, width: int) -> tuple[str, list[str], list[str]]:
    """A matrix row -> (label, link cells, non-empty affinity cells)."""
    if "\t" in line:
        parts = line.split("\t")
        label, rest = parts[0].strip(), parts[1:]
        links = [c.strip() for c in rest[:width]]
        extra = [c.strip() for c in rest[width:] if c.strip()]
    else:
        parts = line.split()
        label, links, extra = parts[0], parts[1 : 1 + width], parts[1 + width :]
    return label, links, extra


_PIPE_SEPARATOR_RE = re.compile(r"^[\s:|-]*$")  # and a "-" (checked apart: no overlapping runs)


def _unpipe(lines: list[str]) -> list[str]:
    """Markdown pipe-table rows (`| GPU0 | X | PIX |`) -> tab-separated cells; the
    `|---|---|` separator row dropped. Other lines are returned as they are."""
    out = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.count("|") >= 3:
            if "-" in stripped and _PIPE_SEPARATOR_RE.match(stripped):
                continue
            out.append("\t".join(c.strip() for c in stripped.strip("|").split("|")))
        else:
            out.append(line)
    return out


def parse_topo(text: str, source: str | None = None) -> Topology:
    """Parse `nvidia-smi topo -m` output; NcclTuneError naming the line on bad input.

    The GPU block (GPU rows x GPU columns) must be whole: it is what classify reads.
    Damage elsewhere (NIC cells merged in a paste, `NODENODE`; a NIC row cut short)
    leaves those cells out with a warning in `Topology.warnings` naming the line.
    """
    where = source or "<topology>"
    lines = _unpipe(text.replace("\r\n", "\n").split("\n"))
    header_at = next((i for i, line in enumerate(lines) if _is_header(line.split())), None)
    if header_at is None:
        raise NcclTuneError("no nvidia-smi topo -m matrix found (no header line starting with GPU0)", path=where)
    devices, affinity_columns = _split_header(lines[header_at].split())
    if len(set(devices)) != len(devices):
        raise NcclTuneError("repeated column name in the header", path=where, line=header_at + 1)
    n_gpus = sum(1 for d in devices if _GPU_RE.match(d))
    matrix: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    warnings: list[str] = []
    end = header_at + 1
    for number in range(header_at + 1, len(lines)):
        line = lines[number]
        first = line.split()[:1]
        if not first or first[0] not in devices or first[0] in matrix:
            break
        label, cells, extra = _row_cells(line, len(devices))
        is_gpu = bool(_GPU_RE.match(label))
        gpu_cells = cells[:n_gpus]
        bad_gpu = next(((col, c) for col, c in zip(devices, gpu_cells) if not LINK_RE.match(c)), None)
        if is_gpu and (len(gpu_cells) < n_gpus or bad_gpu):
            if len(gpu_cells) < n_gpus:
                raise NcclTuneError(
                    f"{label}: expected {len(devices)} link entries, found {len(cells)}", path=where, line=number + 1
                )
            raise NcclTuneError(
                f"{label}: unknown link entry '{bad_gpu[1]}' in column {bad_gpu[0]} "
                "(expected X, NV#, PIX, PXB, PHB, NODE, SYS)",
                path=where,
                line=number + 1,
            )
        rest = list(zip(devices[n_gpus:], cells[n_gpus:]))
        bad_rest = next(((col, c) for col, c in rest if not LINK_RE.match(c)), None)
        damaged = len(cells) < len(devices) or bad_rest is not None or len(extra) > len(affinity_columns)
        if damaged and len(devices) == n_gpus:  # no NIC columns: the cells are not understood
            raise NcclTuneError(
                f"{label}: {len(extra)} cells after the links but only "
                f"{len(affinity_columns)} affinity columns in the header",
                path=where,
                line=number + 1,
            )
        if damaged and not is_gpu and (len(gpu_cells) < n_gpus or bad_gpu):
            warnings.append(f"line {number + 1}: {label}'s row is damaged: row left out")
            end = number + 1
            continue
        if damaged:
            what = (
                f"'{bad_rest[1]}' in column {bad_rest[0]}"
                if bad_rest is not None
                else f"{len(cells)} link cells and {len(extra)} after them"
            )
            warnings.append(
                f"line {number + 1}: {label}'s NIC and affinity cells are damaged "
                f"({what}, cells merged in the paste?): left out, its GPU links read"
            )
            matrix[label] = dict(zip(devices[:n_gpus], gpu_cells))
            affinity[label] = {}
        else:
            matrix[label] = dict(zip(devices, cells))
            affinity[label] = dict(zip(affinity_columns, extra))
        end = number + 1
    missing = [g for g in devices if _GPU_RE.match(g) and g not in matrix]
    if missing:
        raise NcclTuneError(f"no matrix row for {', '.join(missing)}", path=where, line=end + 1)
    for row, cells in matrix.items():
        if row in cells and cells[row] != "X":
            raise NcclTuneError(
                f"{row}: the diagonal entry is '{cells[row]}', not X",
                path=where,
                line=header_at + 2 + list(matrix).index(row),
            )
    legend, nic_names = _parse_legends(lines[end:])
    return Topology(
        devices=devices,
        matrix=matrix,
        affinity=affinity,
        affinity_columns=affinity_columns,
        nic_names=nic_names,
        legend=legend,
        source=source,
        warnings=warnings,
    )


def _parse_legends(lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The first `Legend:` block (entry -> meaning) and the `NIC Legend:` block."""
    legend: dict[str, str] = {}
    nic_names: dict[str, str] = {}
    block = None
    for line in lines:
        stripped = line.strip()
        if stripped == "Legend:":
            if legend:  # a second legend belongs to another matrix (topo -p2p)
                break
            block = "legend"
            continue
        if stripped == "NIC Legend:":
            block = "nic"
            continue
        if block == "legend":
            match = _LEGEND_RE.match(line)
            if match:
                legend[match.group(1)] = match.group(2)
            elif stripped and legend:
                block = None
        elif block == "nic":
            match = _NIC_LEGEND_RE.match(line)
            if match:
                nic_names[match.group(1)] = match.group(2)
            elif stripped and nic_names:
                block = None
    return legend, nic_names


def default_p2p_level(cpu_vendor: str | None, n_gpus: int | None = None) -> str:
    """NCCL's default P2P level for a CPU vendor string (as /proc/cpuinfo's vendor_id).

    paths.cc (ncclTopoCheckP2p, 2.2x-2.30): PXB, except on AMD hosts with two GPUs or
    fewer, where it is SYS. Unknown vendor: PXB (the common Intel case, and the cautious
    one for latency estimates); AMD with an unknown GPU count: SYS (the two-GPU rule).
    """
    if cpu_vendor is None:
        return "PXB"
    vendor = cpu_vendor.lower()
    if ("amd" in vendor or "hygon" in vendor) and (n_gpus is None or n_gpus <= 2):
        return "SYS"
    return "PXB"


def _is_amd(cpu_vendor: str | None) -> bool:
    return bool(cpu_vendor) and ("amd" in cpu_vendor.lower() or "hygon" in cpu_vendor.lower())


def _nvlink_ring(gpus: list[str], nv: set[frozenset]) -> bool:
    """True when one ring can visit every GPU over NVLink hops only (a Hamiltonian cycle)."""
    if len(gpus) < 3:
        return all(frozenset(p) in nv for p in itertools.combinations(gpus, 2))
    first, rest = gpus[0], gpus[1:]

    def extend(path: list[str], left: set[str]) -> bool:
        if not left:
            return frozenset((path[-1], first)) in nv
        return any(extend(path + [g], left - {g}) for g in sorted(left) if frozenset((path[-1], g)) in nv)

    return extend([first], set(rest))


def nvls_support(compute_caps: list[str] | None = None, gpu_names: list[str] | None = None) -> bool | None:
    """Whether NCCL can build NVLS (NVLink SHARP) on GPUs that all reach each other over
    NVLink: compute capability 9.0 or more (Hopper, Blackwell: NVSwitch gen3 multicast) on
    every GPU; from the names when the capabilities are unknown; None when neither tells."""
    caps = []
    for cap in compute_caps or []:
        try:
            caps.append(float(cap))
        except ValueError:
            return None
    if caps:
        return min(caps) >= 9.0
    names = " ".join(gpu_names or []).upper()
    if re.search(r"H100|H200|H800|H20\b|B200|B100|GB200|B300|GH200", names):
        return True
    if re.search(r"A100|A800|V100", names):
        return False
    return None


def classify(
    topo: Topology,
    cpu_vendor: str | None = None,
    gpu_names: list[str] | None = None,
    compute_caps: list[str] | None = None,
) -> str:
    """The cost model's topology kind (a key of costmodel.TOPOLOGIES), by what NCCL builds.

    - every GPU pair NV#: `nvswitch-nvls` where NCCL can build NVLS (`nvls_support`:
      compute capability 9.0+, else Hopper/Blackwell names), `nvswitch` where it cannot,
      `nvlink` when neither the capabilities nor the names tell;
    - some pairs NV# and the others not, but one ring can visit every GPU over NVLink
      (V100/P100 hybrid cube mesh: SYS pairs in the matrix): `nvlink-mesh`, since NCCL's
      search builds its rings from NVLink hops and nothing goes through host memory;
    - otherwise the non-NVLink pairs decide, against NCCL's default P2P level (PXB; SYS
      on AMD with two GPUs or fewer): all PIX/PXB -> `pcie-switch`; all within the
      level -> `pcie`; SYS pairs on an AMD host with more than two GPUs -> `pcie-amd-2s`
      (NCCL's search fallback, see costmodel); other SYS pairs -> `pcie-shm`; PHB/NODE
      pairs only -> `pcie-direct`.
    NcclTuneError when there are fewer than two GPUs.
    """
    gpus = topo.gpus
    if len(gpus) < 2:
        raise NcclTuneError(f"{len(gpus)} GPU in the topology: no GPU-to-GPU link to classify", path=topo.source)
    pairs = {frozenset(p): topo.matrix[p[0]][p[1]] for p in itertools.combinations(gpus, 2)}
    nv = {p for p, link in pairs.items() if _NVLINK_RE.match(link)}
    other = [link for p, link in pairs.items() if p not in nv]
    if not other:
        nvls = nvls_support(compute_caps, gpu_names)
        return "nvlink" if nvls is None else ("nvswitch-nvls" if nvls else "nvswitch")
    if nv and _nvlink_ring(gpus, nv):
        return "nvlink-mesh"
    if all(p in PCIE_P2P_ENTRIES for p in other):
        return "pcie-switch"
    if default_p2p_level(cpu_vendor, len(gpus)) == "SYS":
        return "pcie"
    if any(p in ("SYS", "SOC") for p in other):
        return "pcie-amd-2s" if _is_amd(cpu_vendor) and len(gpus) > 2 else "pcie-shm"
    return "pcie-direct"


def query_gpus(field: str, timeout: float = 30.0) -> list[str] | None:
    """One `nvidia-smi --query-gpu=FIELD` value per GPU, or None when nvidia-smi is
    absent, fails or lists no GPU (the one place this package asks nvidia-smi per GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    values = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return values if done.returncode == 0 and values else None


def gpu_names(timeout: float = 30.0) -> list[str] | None:
    """GPU product names (`--query-gpu=name`), or None when nvidia-smi cannot tell."""
    return query_gpus("name", timeout)


def compute_caps(timeout: float = 30.0) -> list[str] | None:
    """GPU compute capabilities ('9.0'), or None (no GPU, or a driver whose nvidia-smi
    lacks the compute_cap field: its answer is then not of that form)."""
    caps = query_gpus("compute_cap", timeout)
    return caps if caps and all(re.fullmatch(r"\d+\.\d+", c) for c in caps) else None


def run_nvidia_smi_topo(timeout: float = 30.0) -> str | None:
    """`nvidia-smi topo -m` output, or None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def local_cpu_vendor() -> str | None:
    """This machine's CPU vendor_id from /proc/cpuinfo (GenuineIntel, AuthenticAMD...)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def detect_kind() -> str | None:
    """This machine's topology kind from `nvidia-smi topo -m`, or None when it cannot tell.

    None when nvidia-smi is absent or fails, its output does not parse, or there are
    fewer than two GPUs.
    """
    text = run_nvidia_smi_topo()
    if text is None:
        return None
    try:
        return classify(parse_topo(text, source="nvidia-smi topo -m"), local_cpu_vendor(), gpu_names(), compute_caps())
    except NcclTuneError:
        return None
