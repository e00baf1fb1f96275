"""Which allreduce path an installed vLLM takes for a decode allreduce, read from vLLM itself.

vLLM's CUDA communicator (vllm/distributed/device_communicators/cuda_communicator.py,
`CudaCommunicator.all_reduce`) tries its paths in order and returns from the first that
takes the tensor; the size limits are tables in all_reduce_utils.py
(CUSTOM_ALL_REDUCE_MAX_SIZES, SYMM_MEM_ALL_REDUCE_MAX_SIZES per compute capability and
world size, NCCL_SYMM_MEM_ALL_REDUCE_CONFIG), the switches are vllm.envs entries. This
module reads all of them from the installed package, never from a copy:

- `read_vllm` imports all_reduce_utils (and custom_all_reduce, vllm.envs) in a child
  process: importing vLLM takes seconds and rewrites os.environ (vllm.env_override sets
  LD_LIBRARY_PATH, PYTORCH_NVML_BASED_CUDA_CHECK, TORCHINDUCTOR_COMPILE_THREADS), so the
  caller's process stays clean and the cost is bounded by a timeout. The dispatch order
  is read from the source of `CudaCommunicator.all_reduce` (ast, in the child) without
  importing the communicator (it pulls in ROCm and FlashInfer modules). The answer is
  cached per installed file set under ~/.cache/nccl-tune.
- `vllm_path` is pure: tables + switches + (TP, compute capability, bytes, machine) ->
  the path. The conditions it applies per path are read from the same release's source
  (custom_all_reduce.py should_custom_ar, symm_mem.py should_use_symm_mem,
  all_reduce_utils.py should_nccl_symm_mem_allreduce, flashinfer_all_reduce.py) and
  stated in each answer; the numbers and the order come from the installed package.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

# The child: imports the modules that hold the tables, reads the switches' defaults from
# vllm.envs with those variables removed, and walks CudaCommunicator.all_reduce's source.
_PROBE = r"""
import ast, importlib, importlib.util, inspect, json, os, sys
SWITCHES = sys.argv[1].split(",")
PKG = "vllm.distributed.device_communicators"
out = {"errors": []}
for name in SWITCHES:
    os.environ.pop(name, None)
utils = importlib.import_module(PKG + ".all_reduce_utils")
import vllm, vllm.envs as envs
out["version"] = getattr(vllm, "__version__", None)
out["root"] = os.path.dirname(vllm.__file__)
out["tables"] = {k: getattr(utils, k) for k in ("CUSTOM_ALL_REDUCE_MAX_SIZES",
                 "SYMM_MEM_ALL_REDUCE_MAX_SIZES", "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG") if hasattr(utils, k)}
out["files"] = {"all_reduce_utils": utils.__file__}
try:
    ca = importlib.import_module(PKG + ".custom_all_reduce").CustomAllreduce
    out["custom"] = {"world_sizes": list(ca._SUPPORTED_WORLD_SIZES),
                     "max_size": inspect.signature(ca.__init__).parameters["max_size"].default}
except Exception as exc:
    out["errors"].append(f"custom_all_reduce: {type(exc).__name__}: {exc}")
out["switches"] = {n: envs.environment_variables[n]() for n in SWITCHES if n in envs.environment_variables}
spec = importlib.util.find_spec(PKG + ".cuda_communicator")
out["files"]["cuda_communicator"] = spec.origin
steps = []
for cls in ast.parse(open(spec.origin, encoding="utf-8").read()).body:
    if isinstance(cls, ast.ClassDef) and cls.name == "CudaCommunicator":
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "all_reduce":
                for stmt in fn.body:
                    calls = [ast.unparse(n.func) for n in ast.walk(stmt) if isinstance(n, ast.Call)]
                    returns = isinstance(stmt, ast.If) and any(isinstance(n, ast.Return) for n in ast.walk(stmt))
                    if calls and (returns or not isinstance(stmt, ast.If)):
                        steps.append({"line": stmt.lineno, "test": ast.unparse(stmt.test) if returns else None,
                                      "calls": calls})
out["dispatch"] = steps
out["flashinfer_installed"] = importlib.util.find_spec("flashinfer") is not None
parallel = importlib.util.find_spec("vllm.config.parallel")
out["disable_custom_all_reduce"] = bool(parallel) and "disable_custom_all_reduce" in open(parallel.origin, encoding="utf-8").read()
print(json.dumps(out, default=str))
"""

SWITCHES = (
    "VLLM_ALLREDUCE_USE_FLASHINFER",
    "VLLM_USE_NCCL_SYMM_MEM",
    "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
    "VLLM_ALLREDUCE_USE_SYMM_MEM",
    "VLLM_BATCH_INVARIANT",
)
# The files whose content decides the answer (cache key), relative to the vllm package.
_KEY_FILES = (
    "distributed/device_communicators/all_reduce_utils.py",
    "distributed/device_communicators/cuda_communicator.py",
    "distributed/device_communicators/custom_all_reduce.py",
    "envs.py",
    "version.py",
)
DEFAULT_TIMEOUT_S = 120.0

# Dispatch steps, recognised by the call that carries the tensor in the step's body.
# id -> (call suffixes, goes through NCCL, what it is, the switch that turns it off).
PATHS = {
    "nccl-symm": (
        ("all_reduce_symmetric_with_copy",),
        True,
        "NCCL with symmetric memory (PyNCCL)",
        "VLLM_USE_NCCL_SYMM_MEM=0",
    ),
    "quick": (("quick_all_reduce",), False, "quick allreduce (ROCm only)", None),
    "flashinfer-pcie-ipc": (
        ("fi_pcie_ipc_ar_comm.all_reduce",),
        False,
        "FlashInfer PCIe IPC allreduce",
        "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=0",
    ),
    "flashinfer": (("fi_ar_comm.all_reduce",), False, "FlashInfer allreduce", "VLLM_ALLREDUCE_USE_FLASHINFER=0"),
    "aiter": (("aiter_ar_comm.custom_all_reduce",), False, "AITER allreduce (ROCm only)", None),
    "custom": (("ca_comm.custom_all_reduce",), False, "vLLM custom allreduce", "--disable-custom-all-reduce"),
    "batch-invariant": (("all_reduce_batch_invariant",), False, "batch-invariant allreduce (ROCm only)", None),
    "torch-symm": (
        ("symm_mem_comm.all_reduce",),
        False,
        "torch symmetric memory allreduce",
        "VLLM_ALLREDUCE_USE_SYMM_MEM=0",
    ),
    "nccl": (("pynccl_comm.all_reduce", "torch.distributed.all_reduce"), True, "NCCL (PyNCCL)", None),
}


class EngineUnavailable(Exception):
    """The installed engine could not be read (not importable, import failed, timed out)."""


@dataclass(frozen=True)
class VllmTables:
    """What one installed vLLM says about its allreduce paths."""

    version: str
    root: str
    custom_max: dict[str, dict[int, int]]
    symm_max: dict[str, dict[int, int]]
    nccl_symm: dict
    custom_world_sizes: tuple[int, ...]
    custom_default_max: int
    switches: dict[str, bool]
    order: tuple[str, ...]  # path ids in dispatch order
    unknown_steps: tuple[int, ...] = ()  # source lines of steps this module does not know
    flashinfer_installed: bool = False
    disable_custom_all_reduce: bool = True
    errors: tuple[str, ...] = ()

    def describe(self) -> str:
        """'vLLM 0.32.0 (/path/vllm)'."""
        return f"vLLM {self.version} ({self.root})"


def _int_keys(table: dict) -> dict:
    return {cc: {int(ws): int(v) for ws, v in row.items()} for cc, row in table.items()}


def _order(steps: list[dict]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    order: list[str] = []
    unknown: list[int] = []
    for step in steps:
        found = next(
            (
                pid
                for pid, (suffixes, *_rest) in PATHS.items()
                if any(c.endswith(s) for c in step["calls"] for s in suffixes)
            ),
            None,
        )
        if found is None:
            if step["test"] is not None:
                unknown.append(step["line"])
        elif found not in order:
            order.append(found)
    return tuple(order), tuple(unknown)


def parse_probe(data: dict) -> VllmTables:
    """VllmTables from the child's JSON (a function of its own for tests)."""
    tables = data["tables"]
    order, unknown = _order(data["dispatch"])
    nccl_symm = dict(tables.get("NCCL_SYMM_MEM_ALL_REDUCE_CONFIG", {}))
    if "custom_ar_preferred_ranges" in nccl_symm:
        nccl_symm["custom_ar_preferred_ranges"] = {
            int(k): tuple(v) for k, v in nccl_symm["custom_ar_preferred_ranges"].items()
        }
    fi_gate = any(
        "use_fi_ar" in (s["test"] or "")
        for s in data["dispatch"]
        if any(c.endswith("all_reduce_symmetric_with_copy") for c in s["calls"])
    )
    nccl_symm["after_flashinfer"] = fi_gate
    custom = data.get("custom") or {}
    return VllmTables(
        version=str(data.get("version")),
        root=data.get("root", "?"),
        custom_max=_int_keys(tables.get("CUSTOM_ALL_REDUCE_MAX_SIZES", {})),
        symm_max=_int_keys(tables.get("SYMM_MEM_ALL_REDUCE_MAX_SIZES", {})),
        nccl_symm=nccl_symm,
        custom_world_sizes=tuple(custom.get("world_sizes", ())),
        custom_default_max=int(custom.get("max_size", 0) or 0),
        switches={k: bool(v) for k, v in data.get("switches", {}).items()},
        order=order,
        unknown_steps=unknown,
        flashinfer_installed=bool(data.get("flashinfer_installed")),
        disable_custom_all_reduce=bool(data.get("disable_custom_all_reduce")),
        errors=tuple(data.get("errors", ())),
    )


def _package_root(name: str) -> str | None:
    """The folder of an installed top-level package, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _cache_path(root: str) -> str:
    parts = [root]
    for rel in _KEY_FILES:
        try:
            st = os.stat(os.path.join(root, rel))
            parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{rel}:-")
    key = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nccl-tune", f"vllm-allreduce-{key}.json")


def _run_probe(timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, ",".join(SWITCHES)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(f"importing vLLM took over {timeout:.0f} s") from None
    except OSError as exc:
        raise EngineUnavailable(f"could not start {sys.executable}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineUnavailable(f"importing vLLM's allreduce modules failed: {tail}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EngineUnavailable("vLLM probe printed no JSON") from None


def read_vllm(timeout: float = DEFAULT_TIMEOUT_S, use_cache: bool = True) -> VllmTables:
    """The installed vLLM's allreduce tables, switches and dispatch order.

    EngineUnavailable when vLLM is not installed or its modules cannot be imported.
    """
    root = _package_root("vllm")
    if root is None:
        raise EngineUnavailable("vLLM is not importable in this Python")
    cache = _cache_path(root)
    if use_cache:
        try:
            with open(cache, encoding="utf-8") as handle:
                return parse_probe(json.load(handle))
        except (OSError, ValueError, KeyError):
            pass
    data = _run_probe(timeout)
    if use_cache:
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            tmp = f"{cache}.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, cache)
        except OSError:
            pass
    return parse_probe(data)


@dataclass(frozen=True)
class Machine:
    """What the dispatch depends on besides the tensor: TP, GPU generation, links."""

    tp: int
    cc: str  # compute capability "9.0"
    fully_connected: bool  # every GPU pair NVLink (vLLM's is_fully_connected)
    multicast: bool  # NVSwitch multicast (torch symmetric memory, FlashInfer MNNVL)
    flashinfer: bool  # flashinfer installed on the server
    rocm: bool = False
    p2p: bool | None = True  # two GPUs without NVLink: P2P works (None: the engine's check decides)


@dataclass(frozen=True)
class PathAnswer:
    """Which path carries one allreduce, why, and how to A/B it against NCCL."""

    path: str  # a PATHS id
    nccl: bool  # NCCL settings can change this allreduce
    nbytes: int
    reason: str
    skipped: tuple[str, ...] = ()  # why earlier paths did not take it
    to_nccl: tuple[str, ...] = ()  # the switches that send it through NCCL instead
    uncertain: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "path": self.path,
            "nccl": self.nccl,
            "bytes": self.nbytes,
            "reason": self.reason,
            "skipped": list(self.skipped),
            "to_nccl": list(self.to_nccl),
            "uncertain": self.uncertain,
        }


def _switch(t: VllmTables, overrides: dict[str, bool], name: str) -> bool:
    return overrides.get(name, t.switches.get(name, False))


def _takes(pid: str, t: VllmTables, m: Machine, nbytes: int, ov: dict[str, bool], custom_on: bool) -> tuple[bool, str]:
    """Whether step `pid` takes a bf16 decode tensor of `nbytes`, and why (or why not)."""
    invariant = _switch(t, ov, "VLLM_BATCH_INVARIANT")
    if pid in ("quick", "aiter", "batch-invariant"):
        return (False, "ROCm only") if not m.rocm else (False, "ROCm paths are not modelled")
    if pid == "flashinfer-pcie-ipc":
        on = _switch(t, ov, "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC") and not invariant
        return False, (
            "opt-in VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC is off"
            if not on
            else "FlashInfer PCIe IPC conditions are not modelled"
        )
    if pid == "flashinfer":
        if not _switch(t, ov, "VLLM_ALLREDUCE_USE_FLASHINFER") or invariant:
            return False, "VLLM_ALLREDUCE_USE_FLASHINFER is off"
        if not m.flashinfer:
            return False, "flashinfer is not installed"
        return True, (
            "VLLM_ALLREDUCE_USE_FLASHINFER is on and flashinfer is installed: FlashInfer "
            "takes 2-D tensors up to its per-capability size limit"
        )
    if pid == "nccl-symm":
        cfg = t.nccl_symm
        if not _switch(t, ov, "VLLM_USE_NCCL_SYMM_MEM") or invariant:
            return False, "VLLM_USE_NCCL_SYMM_MEM is off"
        if m.tp < cfg.get("min_world_size", 0):
            return False, f"TP {m.tp} < min_world_size {cfg.get('min_world_size')}"
        rng = cfg.get("custom_ar_preferred_ranges", {}).get(m.tp)
        if rng is not None:
            lo, hi = rng
            ok = nbytes <= lo or nbytes >= hi
            return ok, (f"{nbytes} B {'outside' if ok else 'inside'} custom_ar_preferred_ranges[{m.tp}] = ({lo}, {hi})")
        above = cfg.get("always_use_above_world_size", 0)
        return m.tp > above, f"TP {m.tp} {'>' if m.tp > above else '<='} always_use_above_world_size {above}"
    if pid == "custom":
        if not custom_on:
            return False, "custom allreduce disabled (--disable-custom-all-reduce)"
        if m.tp not in t.custom_world_sizes or m.tp > 8:
            return False, f"TP {m.tp} not a custom allreduce world size {list(t.custom_world_sizes)} up to 8"
        if nbytes % 16:
            return False, f"{nbytes} B is not a multiple of 16"
        if not (m.tp == 2 or m.fully_connected):
            return False, "more than two GPUs that are not all NVLink-connected"
        limit, where = t.custom_default_max, "CustomAllreduce max_size default"
        if _torch_symm_on(t, m, ov) and m.tp in t.custom_max.get(m.cc, {}):
            limit = min(t.custom_max[m.cc][m.tp], limit)
            where = f"CUSTOM_ALL_REDUCE_MAX_SIZES['{m.cc}'][{m.tp}]"
        ok = nbytes < limit
        return ok, f"{nbytes} B {'<' if ok else '>='} {limit} B = {where}"
    if pid == "torch-symm":
        if not _torch_symm_on(t, m, ov):
            return False, _torch_symm_why_not(t, m, ov)
        limit = t.symm_max[m.cc][m.tp]
        ok = nbytes % 4 == 0 and nbytes <= limit
        return ok, f"{nbytes} B {'<=' if ok else '>'} {limit} B = SYMM_MEM_ALL_REDUCE_MAX_SIZES['{m.cc}'][{m.tp}]"
    if pid == "nccl":
        return True, "no earlier path takes it"
    return False, "unknown step"


def _torch_symm_on(t: VllmTables, m: Machine, ov: dict[str, bool]) -> bool:
    return (
        _switch(t, ov, "VLLM_ALLREDUCE_USE_SYMM_MEM")
        and not _switch(t, ov, "VLLM_BATCH_INVARIANT")
        and m.cc in t.symm_max
        and m.tp in t.symm_max[m.cc]
        and m.multicast
    )


def _torch_symm_why_not(t: VllmTables, m: Machine, ov: dict[str, bool]) -> str:
    if not _switch(t, ov, "VLLM_ALLREDUCE_USE_SYMM_MEM"):
        return "VLLM_ALLREDUCE_USE_SYMM_MEM is off"
    if m.cc not in t.symm_max or m.tp not in t.symm_max.get(m.cc, {}):
        return f"no SYMM_MEM_ALL_REDUCE_MAX_SIZES entry for capability {m.cc}, TP {m.tp}"
    if not m.multicast:
        return "no NVSwitch multicast on this machine"
    return "batch invariance is on"


def _walk(
    t: VllmTables, m: Machine, nbytes: int, ov: dict[str, bool], custom_on: bool
) -> tuple[str, str, tuple[str, ...]]:
    """(path id, why it takes the tensor, why each earlier path did not)."""
    skipped: list[str] = []
    fi_takes = _takes("flashinfer", t, m, nbytes, ov, custom_on)[0]
    for pid in t.order:
        if pid == "nccl-symm" and t.nccl_symm.get("after_flashinfer") and fi_takes:
            skipped.append("nccl-symm: FlashInfer takes it first")
            continue
        takes, why = _takes(pid, t, m, nbytes, ov, custom_on)
        if takes:
            return pid, why, tuple(skipped)
        skipped.append(f"{pid}: {why}")
    return "nccl", "no path takes it", tuple(skipped)


def vllm_path(
    t: VllmTables, m: Machine, nbytes: int, overrides: dict[str, bool] | None = None, custom_on: bool = True
) -> PathAnswer:
    """The path vLLM's dispatch takes for one bf16 decode allreduce of `nbytes`, and the
    switches that would send it through NCCL instead."""
    ov = dict(overrides or {})
    pid, why, skipped = _walk(t, m, nbytes, ov, custom_on)
    uncertain = None
    if pid == "flashinfer":
        uncertain = "FlashInfer's own size limit is not read (its module imports only on a CUDA build)"
    elif t.unknown_steps:
        uncertain = (
            f"steps at cuda_communicator.py lines {list(t.unknown_steps)} are not "
            "recognised: a newer vLLM may take another path first"
        )
    return PathAnswer(
        pid, PATHS[pid][1], nbytes, why, skipped, _to_nccl(t, m, nbytes, dict(ov), custom_on, pid), uncertain
    )


def _to_nccl(t: VllmTables, m: Machine, nbytes: int, ov: dict[str, bool], custom_on: bool, pid: str) -> tuple[str, ...]:
    """The switches that, turned off one after another, send this allreduce through NCCL."""
    switches: list[str] = []
    while not PATHS[pid][1]:
        switch = PATHS[pid][3]
        if switch is None or switch in switches:
            return tuple(switches + [f"(no switch turns off {PATHS[pid][2]})"])
        switches.append(switch)
        if switch.startswith("--"):
            custom_on = False
        else:
            ov[switch.split("=")[0]] = False
        pid = _walk(t, m, nbytes, ov, custom_on)[0]
    return tuple(switches)
