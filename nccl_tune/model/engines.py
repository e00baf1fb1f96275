"""When an inference engine sends a tensor-parallel allreduce through NCCL, and when not.

SGLang and vLLM run small allreduces through their own "custom allreduce" (a one-shot
or two-shot kernel over CUDA IPC buffers), not NCCL, where it is enabled. Read from
their sources (the conditions, not their code):

- vLLM, vllm/distributed/device_communicators/custom_all_reduce.py (main at commit
  00d618a): enabled for one node, world size in 2/4/6/8, when the GPUs pass the P2P
  check, and for more than two GPUs only when all of them are NVLink-connected
  ("not supported on more than two PCIe-only GPUs"); used per tensor when the size is a
  multiple of 16 B and below max_size (8 MiB; with torch symmetric memory enabled,
  lowered per GPU generation and world size by CUSTOM_ALL_REDUCE_MAX_SIZES). Option
  that sends every allreduce through NCCL: `--disable-custom-all-reduce`; newer
  releases also try torch symmetric memory first (VLLM_ALLREDUCE_USE_SYMM_MEM=0 turns
  it off) and FlashInfer's fused allreduce where the compilation config enables it.
- SGLang, python/sglang/srt/distributed/device_communicators/custom_all_reduce.py (main
  at commit 004e656; its header says it was adapted from vLLM v0.6.4.post1): the same
  conditions, max size 8 MiB on CUDA (16 MiB on ROCm); `--disable-custom-all-reduce`
  sends everything through NCCL.

The release each rule first appeared in was not established from these reads; the
commits are what was read. `full NVLink` here is the cost model's NVSwitch kinds (every
GPU pair NV#); the V100 hybrid cube mesh is not fully connected, so with more than two
GPUs it keeps NCCL. Two PCIe GPUs use the custom allreduce only where P2P works, which
the driver decides (`nvidia-smi topo -p2p r`): this module says so rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("sglang", "vllm", "none")
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)
MAX_BYTES = {"sglang": 8192 * 1024, "vllm": 8192 * 1024}
FULL_NVLINK_KINDS = ("nvlink", "nvswitch", "nvswitch-nvls")
P2P_KINDS = ("pcie", "pcie-switch")  # PCIe kinds where every pair uses P2P by default
SOURCES = {
    "vllm": "vLLM vllm/distributed/device_communicators/custom_all_reduce.py @00d618a",
    "sglang": "SGLang python/sglang/srt/distributed/device_communicators/custom_all_reduce.py @004e656",
}
TO_NCCL = {
    "vllm": "--disable-custom-all-reduce (and VLLM_ALLREDUCE_USE_SYMM_MEM=0 where torch symmetric memory is enabled)",
    "sglang": "--disable-custom-all-reduce",
}


@dataclass(frozen=True)
class Path:
    """Which allreduce implementation an engine uses for one size, and why."""

    engine: str
    nbytes: int
    via: str  # "nccl" | "custom" | "custom if P2P works"
    reason: str

    @property
    def bypasses_nccl(self) -> bool:
        """True when NCCL settings cannot change this allreduce (or may not)."""
        return self.via != "nccl"

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "engine": self.engine,
            "bytes": self.nbytes,
            "via": self.via,
            "reason": self.reason,
            "to_nccl": TO_NCCL.get(self.engine),
            "source": SOURCES.get(self.engine),
        }


def allreduce_path(engine: str, kind: str, nranks: int, nbytes: int) -> Path:
    """The engine's allreduce implementation for `nbytes` on a machine of `kind`."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}' (known: {', '.join(ENGINES)})")
    if engine == "none":
        return Path(engine, nbytes, "nccl", "no engine: every allreduce goes through NCCL")
    limit = MAX_BYTES[engine]
    if nranks not in SUPPORTED_WORLD_SIZES:
        return Path(engine, nbytes, "nccl", f"custom allreduce supports TP {SUPPORTED_WORLD_SIZES} only")
    if nbytes % 16 or nbytes >= limit:
        return Path(engine, nbytes, "nccl", f"{nbytes} B is not a multiple of 16 or not below {limit} B")
    if kind in FULL_NVLINK_KINDS:
        return Path(engine, nbytes, "custom", f"all GPUs NVLink-connected and {nbytes} B < {limit} B")
    if nranks > 2:
        return Path(
            engine,
            nbytes,
            "nccl",
            "custom allreduce is disabled on more than two GPUs that are not all NVLink-connected",
        )
    if kind in P2P_KINDS or kind == "nvlink-mesh":
        return Path(engine, nbytes, "custom", f"two GPUs with P2P and {nbytes} B < {limit} B")
    return Path(
        engine,
        nbytes,
        "custom if P2P works",
        "two GPUs: the engine's P2P check decides (host-memory kinds often lack P2P)",
    )


def notes(engine: str, kind: str, nranks: int, sizes) -> list[str]:
    """Lines for a command's output: which decode allreduces bypass NCCL, and the option."""
    if engine == "none":
        return []
    paths = [allreduce_path(engine, kind, nranks, int(b)) for b in sorted(set(sizes))]
    bypass = [p for p in paths if p.bypasses_nccl]
    if not bypass:
        return [
            f"engine {engine}: at these sizes its allreduces go through NCCL on {kind} with "
            f"{nranks} GPUs ({paths[0].reason}; {SOURCES[engine]})"
        ]
    sure = all(p.via == "custom" for p in bypass)
    sizes_text = ", ".join(f"{p.nbytes} B" for p in bypass)
    return [
        f"engine {engine}: {'its custom allreduce, not NCCL, runs' if sure else 'its custom allreduce may run (not NCCL)'} "
        f"the allreduces of {sizes_text} on {kind} with {nranks} GPUs ({bypass[0].reason}; "
        f"{SOURCES[engine]}): NCCL settings do not change those allreduces"
        f"{'' if sure else ' where it runs'}; {TO_NCCL[engine]} sends them through NCCL"
    ]


# ------------------------------------------------------------ read from the installed engine
#
# `report` answers from the installed engine where it can (nccl_tune.model.installed_engine
# reads vLLM's own tables, switches and dispatch order; nccl_tune.model.installed_sglang
# reads SGLang's from its source) and falls back on the cited rules above only when the
# engine is not found or cannot be read, saying so.


@dataclass(frozen=True)
class EngineReport:
    """Which path carries each decode allreduce, from where the answer was read."""

    engine: str
    basis: str  # "installed" (read from the engine) | "cited rules" (this module's) | "none"
    version: str | None
    read_from: str | None  # the package folder, or the rules' source
    fallback: str | None  # why the installed engine was not read
    paths: tuple = ()  # installed_engine.PathAnswer per size (installed basis only)
    lines: tuple[str, ...] = ()

    @property
    def nccl_changes_decode(self) -> bool | None:
        """True when NCCL carries every size, False when none, None when mixed or unknown."""
        if not self.paths:
            return None
        carried = {p.nccl for p in self.paths}
        return carried.pop() if len(carried) == 1 else None

    def to_dict(self) -> dict:
        """JSON-ready form (keys: engine, basis, version, read_from, fallback, paths, notes)."""
        return {
            "engine": self.engine,
            "basis": self.basis,
            "version": self.version,
            "read_from": self.read_from,
            "fallback": self.fallback,
            "paths": [p.to_dict() for p in self.paths],
            "nccl_changes_decode": self.nccl_changes_decode,
            "notes": list(self.lines),
        }


def switch_overrides(env: dict[str, str] | None) -> dict[str, bool | int]:
    """The engine switches a profile sets, read as each engine reads them: vLLM's
    (VLLM_ALLREDUCE_USE_*=0/1 and the like) as integers, non-zero meaning on (vllm/envs.py);
    SGLang's as srt/environ.py's EnvBool (true/1/yes/y, false/0/no/n, any case) and EnvInt
    parse them. A value the engine would refuse is left out (SGLang then keeps its default)."""
    from nccl_tune.model import installed_engine, installed_sglang

    out: dict[str, bool | int] = {}
    for name, value in (env or {}).items():
        if name in installed_engine.SWITCHES and value.strip().lstrip("-").isdigit():
            out[name] = int(value) != 0
        elif name in installed_sglang.SWITCHES:
            parsed = installed_sglang.parse_switch(name, value)
            if parsed is not None:
                out[name] = parsed
    return out


VERDICT = {
    True: "NCCL carries every one of these decode allreduces: NCCL settings apply",
    False: "NCCL carries none of these decode allreduces: NCCL settings cannot change "
    "decode unless the engine's own paths are switched off (A/B below)",
    None: "NCCL carries some of these decode allreduces, not all (per size below)",
}


def _fallback(engine: str, kind: str, nranks: int, sizes, why: str) -> EngineReport:
    head = f"engine {engine}: {why}; the answer below is the cited rules ({SOURCES[engine]})"
    return EngineReport(
        engine, "cited rules", None, SOURCES[engine], why, lines=(head, *notes(engine, kind, nranks, sizes))
    )


def report(
    engine: str,
    kind: str,
    nranks: int,
    sizes,
    cc: str | None = None,
    env: dict[str, str] | None = None,
    read_vllm=None,
    read_sglang=None,
    dtype: str = "bf16",
) -> EngineReport:
    """The engine's path for each decode allreduce size (of `dtype` elements) at `nranks`
    GPUs of compute capability `cc` on a `kind` machine, read from the installed engine.

    `env`: the profile's variables (its engine switches apply). `read_vllm` and
    `read_sglang` are the readers (parameters so tests inject them); SGLang is found by
    installed_sglang.locate (NCCL_TUNE_SGLANG_ROOT, else this Python's sglang).
    """
    from nccl_tune.model import installed_engine, kinds

    sizes = sorted({int(b) for b in sizes})
    if engine == "none":
        return EngineReport("none", "none", None, None, None)
    if engine == "sglang":
        from nccl_tune.model import installed_sglang

        try:
            tables = (read_sglang or installed_sglang.read_sglang)()
        except installed_engine.EngineUnavailable as exc:
            return _fallback(engine, kind, nranks, sizes, f"not read from an installed SGLang ({exc})")
        return _sglang_report(tables, kind, nranks, sizes, cc, switch_overrides(env), dtype)
    try:
        tables = (read_vllm or installed_engine.read_vllm)()
    except installed_engine.EngineUnavailable as exc:
        return _fallback(engine, kind, nranks, sizes, f"not read from an installed vLLM ({exc})")
    topo = kinds.TOPOLOGIES.get(kind)
    machine = installed_engine.Machine(
        tp=nranks,
        cc=cc or "unknown",
        fully_connected=kind in FULL_NVLINK_KINDS,
        multicast=bool(topo and topo.has_nvls),
        flashinfer=tables.flashinfer_installed,
    )
    overrides = switch_overrides(env)
    paths = tuple(installed_engine.vllm_path(tables, machine, b, overrides) for b in sizes)
    lines = [
        f"engine vLLM {tables.version}, read from {tables.root}: TP {nranks}, compute "
        f"capability {cc or 'unknown'}, {kind}" + (f", profile switches {overrides}" if overrides else "")
    ]
    lines.append(f"  {VERDICT[EngineReport('vllm', 'installed', None, None, None, paths).nccl_changes_decode]}")
    if cc is None:
        lines.append(
            "  compute capability unknown (give --arch, or run where nvidia-smi sees the "
            "GPUs): vLLM's per-capability limits were not applied"
        )
    for p in paths:
        what = installed_engine.PATHS[p.path][2]
        if p.nccl:
            passed = "; ".join(x for x in p.skipped if "ROCm" not in x and "opt-in" not in x)
            lines.append(f"  {p.nbytes} B: {what}: NCCL settings apply ({passed or p.reason})")
        else:
            lines.append(
                f"  {p.nbytes} B: {what}, not NCCL ({p.reason}): NCCL settings do not change "
                f"it; to A/B against NCCL: {', '.join(p.to_nccl)}"
            )
        if p.uncertain:
            lines.append(f"    uncertain: {p.uncertain}")
    if not tables.flashinfer_installed:
        lines.append(
            "  flashinfer is not installed beside this vLLM: on a server that has it, "
            "FlashInfer's allreduce (on by default, VLLM_ALLREDUCE_USE_FLASHINFER) may take "
            "these sizes first"
        )
    return EngineReport("vllm", "installed", tables.version, tables.root, None, paths, tuple(lines))


def _path_lines(p, what: str) -> list[str]:
    """One size's line (and its doubt) in report's notes."""
    if p.nccl:
        passed = "; ".join(
            x for x in p.skipped if not any(w in x for w in ("ROCm", "opt-in", "off by default", "NCCL too"))
        )
        line = f"  {p.nbytes} B: {what}: NCCL settings apply ({passed or p.reason})"
    else:
        line = (
            f"  {p.nbytes} B: {what}, not NCCL ({p.reason}): NCCL settings do not change "
            f"it; to A/B against NCCL: {', '.join(p.to_nccl)}"
        )
    return [line, f"    uncertain: {p.uncertain}"] if p.uncertain else [line]


def _sglang_report(tables, kind: str, nranks: int, sizes, cc: str | None, overrides: dict, dtype: str) -> EngineReport:
    """report() for an SGLang read by installed_sglang.read_sglang."""
    from nccl_tune.model import installed_engine, kinds
    from nccl_tune.model import installed_sglang as sgl

    topo = kinds.TOPOLOGIES.get(kind)
    machine = installed_engine.Machine(
        tp=nranks,
        cc=cc or "unknown",
        fully_connected=kind in FULL_NVLINK_KINDS,
        multicast=bool(topo and topo.has_nvls),
        flashinfer=False,
        p2p=True if kind in P2P_KINDS or kind in FULL_NVLINK_KINDS else None,
    )
    paths = tuple(sgl.sglang_path(tables, machine, b, dtype, overrides) for b in sizes)
    carried = EngineReport("sglang", "installed", None, None, None, paths).nccl_changes_decode
    lines = [
        f"engine {tables.describe()}: TP {nranks}, compute capability {cc or 'unknown'}, {kind}, {dtype}"
        + (f", profile switches {overrides}" if overrides else ""),
        f"  {VERDICT[carried]}",
    ]
    for p in paths:
        lines += _path_lines(p, sgl.PATHS[p.path][1])
    pcie = tables.pcie_ipc
    sizes_text = "/".join(map(str, pcie.world_sizes)) if pcie else ""
    if pcie is not None and overrides.get(sgl.PCIE_SWITCH, tables.switches.get(sgl.PCIE_SWITCH)):
        lines.append(
            f"  {sgl.PCIE_SWITCH} is on: SGLang's bf16 decode allreduces at TP {sizes_text} that its custom "
            f"allreduce does not take leave NCCL for FlashInfer's PCIe-IPC kernels ({sgl.PCIE_IPC}): NCCL "
            "tuning no longer changes them"
        )
    elif pcie is not None and topo is not None and topo.link == "pci":
        lines.append(
            f"  {sgl.PCIE_SWITCH}=1 (off by default, {sgl.ENVIRON}) sends bf16 decode allreduces at TP "
            f"{sizes_text} on PCIe-only GPUs through FlashInfer's PCIe-IPC kernels ({sgl.PCIE_IPC}) instead "
            "of NCCL: with it on, NCCL settings no longer change them"
        )
    symm = tables.symm_max.get(int(cc.split(".")[0]) if cc and cc.split(".")[0].isdigit() else -1, {})
    if tables.symm_flag and nranks in symm:
        lines.append(
            f"  {tables.symm_flag} (off by default): when enabled, bf16 allreduces that no earlier path takes, "
            f"below {symm[nranks]} B (TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, {sgl.UTILS}), leave NCCL"
        )
    if topo is None or topo.link != "pci":
        lines.append(
            "  not read: FlashInfer allreduce fusion (--flashinfer-allreduce-fusion-backend; SGLang turns it on "
            "for supported models on SM90/SM10X), which GroupCoordinator.all_reduce tries before this dispatch"
        )
    lines.append(f"  read: {tables.files['dispatch']} (order: {', '.join(tables.order)}); {tables.files['custom']}")
    return EngineReport("sglang", "installed", tables.version, tables.root, None, paths, tuple(lines))
