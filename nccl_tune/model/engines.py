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
    "vllm": "--disable-custom-all-reduce (and VLLM_ALLREDUCE_USE_SYMM_MEM=0 where torch "
            "symmetric memory is enabled)",
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
        return {"engine": self.engine, "bytes": self.nbytes, "via": self.via,
                "reason": self.reason, "to_nccl": TO_NCCL.get(self.engine),
                "source": SOURCES.get(self.engine)}


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
        return Path(engine, nbytes, "nccl",
                    f"{nbytes} B is not a multiple of 16 or not below {limit} B")
    if kind in FULL_NVLINK_KINDS:
        return Path(engine, nbytes, "custom", f"all GPUs NVLink-connected and {nbytes} B < {limit} B")
    if nranks > 2:
        return Path(engine, nbytes, "nccl",
                    "custom allreduce is disabled on more than two GPUs that are not all "
                    "NVLink-connected")
    if kind in P2P_KINDS or kind == "nvlink-mesh":
        return Path(engine, nbytes, "custom", f"two GPUs with P2P and {nbytes} B < {limit} B")
    return Path(engine, nbytes, "custom if P2P works",
                "two GPUs: the engine's P2P check decides (host-memory kinds often lack P2P)")


def notes(engine: str, kind: str, nranks: int, sizes) -> list[str]:
    """Lines for a command's output: which decode allreduces bypass NCCL, and the option."""
    if engine == "none":
        return []
    paths = [allreduce_path(engine, kind, nranks, int(b)) for b in sorted(set(sizes))]
    bypass = [p for p in paths if p.bypasses_nccl]
    if not bypass:
        return [f"engine {engine}: at these sizes its allreduces go through NCCL on {kind} with "
                f"{nranks} GPUs ({paths[0].reason}; {SOURCES[engine]})"]
    sure = all(p.via == "custom" for p in bypass)
    sizes_text = ", ".join(f"{p.nbytes} B" for p in bypass)
    return [f"engine {engine}: {'its custom allreduce, not NCCL, runs' if sure else 'its custom allreduce may run (not NCCL)'} "
            f"the allreduces of {sizes_text} on {kind} with {nranks} GPUs ({bypass[0].reason}; "
            f"{SOURCES[engine]}): NCCL settings do not change those allreduces"
            f"{'' if sure else ' where it runs'}; {TO_NCCL[engine]} sends them through NCCL"]
