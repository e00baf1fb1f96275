"""Which allreduce path an installed SGLang takes for a decode allreduce, read from its source.

SGLang's `GroupCoordinator._resolve_outplace_all_reduce_method`
(srt/distributed/parallel_state.py) returns the name of the first path that takes the
tensor ("ca", "pcie_ipc", "qr", "pymscclpp", "torch_symm_mem", "pynccl" in 0.5.23) or
None, which means NCCL (torch.distributed / PyNCCL). Importing SGLang's communicators
needs torch and sgl_kernel's GPU parts, so this module never imports SGLang: it finds the
package folder (importlib's find_spec, which does not run a top-level package, or
NCCL_TUNE_SGLANG_ROOT for an SGLang in another virtual environment) and parses the files
with `ast`:

- the dispatch order: the strings that method returns, in source order;
- custom allreduce (custom_all_reduce.py `CustomAllreduce`): `_SUPPORTED_WORLD_SIZES`,
  the CUDA `_MAX_CAR_SIZE` (the class-body assignment, not the ones under `if _is_hip` /
  `if _is_musa`) and `should_custom_ar`'s CUDA rule (world_size == 2 or full_nvlink, a
  multiple of 16 B, at most max_size); `dispatch_custom_allreduce` uses v2
  (custom_all_reduce_v2.py) when SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 is on and every GPU
  pair is NVLink (`can_use_custom_all_reduce_v2`), capped by
  SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB;
- FlashInfer PCIe IPC (pcie_ipc_ar.py): opt-in SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, its
  world sizes, eligible groups, bf16 only, off under deterministic inference, bounded by
  SGLANG_PCIE_IPC_MAX_NUMEL or the decode width;
- torch symmetric memory (all_reduce_utils.py TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES) and the
  server flag that enables it;
- the SGLANG_* switches' defaults (srt/environ.py EnvBool / EnvInt).

`sglang_path` is pure: tables + machine + bytes + dtype + the profile's switches -> the
path (installed_engine.PathAnswer). Constants are evaluated by a small AST evaluator
(numbers, + - * //, lists, tuples, dicts, frozenset of literals), never by eval.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import operator
import os
from dataclasses import dataclass, field

from nccl_tune.model.installed_engine import EngineUnavailable, Machine, PathAnswer

ROOT_ENV = "NCCL_TUNE_SGLANG_ROOT"  # an SGLang package folder (.../site-packages/sglang)

# Files read, relative to the package folder.
DISPATCH = "srt/distributed/parallel_state.py"
CUSTOM = "srt/distributed/device_communicators/custom_all_reduce.py"
CUSTOM_V2 = "srt/distributed/device_communicators/custom_all_reduce_v2.py"
V2_CONFIGS = "srt/distributed/device_communicators/configs/custom_all_reduce_v2.py"
PCIE_IPC = "srt/distributed/device_communicators/pcie_ipc_ar.py"
UTILS = "srt/distributed/device_communicators/all_reduce_utils.py"
ENVIRON = "srt/environ.py"
SERVER_ARGS = ("srt/server_args.py", "srt/arg_groups/fields/*.py")

V2_SWITCH = "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2"
V2_MAX_KB = "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB"
PCIE_SWITCH = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
PCIE_MAX_NUMEL = "SGLANG_PCIE_IPC_MAX_NUMEL"
DETERMINISTIC = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"
# The switches whose defaults are read from environ.py: name -> SGLang's field type.
SWITCHES = {
    V2_SWITCH: "EnvBool",
    V2_MAX_KB: "EnvInt",
    PCIE_SWITCH: "EnvBool",
    PCIE_MAX_NUMEL: "EnvInt",
    DETERMINISTIC: "EnvBool",
}

# Method string -> (goes through NCCL, what it is, what sends it through NCCL instead).
PATHS = {
    "ca": (False, "SGLang custom allreduce", "--disable-custom-all-reduce"),
    "pcie_ipc": (False, "FlashInfer PCIe-IPC allreduce", f"{PCIE_SWITCH}=0"),
    "qr": (False, "quick allreduce (ROCm only)", None),
    "pymscclpp": (False, "MSCCL++ allreduce", "drop --enable-mscclpp"),
    "torch_symm_mem": (False, "torch symmetric memory allreduce", "drop --enable-torch-symm-mem"),
    "pynccl": (True, "NCCL (PyNCCL, piecewise CUDA graph)", None),
    "nccl": (True, "NCCL (torch.distributed / PyNCCL)", None),
}


@dataclass(frozen=True)
class PcieIpc:
    """What pcie_ipc_ar.py says about FlashInfer's PCIe-IPC allreduce."""

    world_sizes: tuple[int, ...]
    groups: tuple[str, ...]  # _ELIGIBLE_GROUP_NAMES
    fallback_width: int | None  # _FALLBACK_DECODE_WIDTH: rows when the server's config is absent
    bf16_only: bool
    off_when_deterministic: bool


@dataclass(frozen=True)
class SglangTables:
    """What one installed SGLang says about its allreduce paths."""

    version: str
    root: str
    files: dict[str, str]  # what was read -> file (relative to root) and function
    order: tuple[str, ...]  # method strings in dispatch order, then "nccl" (the None return)
    unknown: tuple[str, ...]  # method strings this module does not know
    custom_world_sizes: tuple[int, ...]
    custom_max: int  # CustomAllreduce._MAX_CAR_SIZE on CUDA
    custom_inclusive: bool  # should_custom_ar compares <= (else <)
    v2: bool  # dispatch_custom_allreduce picks v2 behind V2_SWITCH on full NVLink
    pcie_ipc: PcieIpc | None
    switches: dict[str, bool | int | None]
    symm_max: dict[int, dict[int, int]] = field(default_factory=dict)  # capability major -> TP -> bytes
    symm_flag: str | None = None  # the server flag that enables torch symmetric memory

    def describe(self) -> str:
        """'installed SGLang 0.5.23 (/path/sglang)'."""
        return f"installed SGLang {self.version} ({self.root})"


# ------------------------------------------------------------------ reading the source

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def constant(node: ast.AST, names: dict | None = None):
    """The value of a constant expression; ValueError for anything else."""
    names = names or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -constant(node.operand, names)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](constant(node.left, names), constant(node.right, names))
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [constant(e, names) for e in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {constant(k, names): constant(v, names) for k, v in zip(node.keys, node.values)}
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("frozenset", "set", "tuple", "list")
        and len(node.args) == 1
        and not node.keywords
    ):
        return constant(node.args[0], names)
    raise ValueError(f"not a constant: {ast.unparse(node)}")


def _parse(root: str, rel: str) -> ast.Module:
    path = os.path.join(root, rel)
    try:
        with open(path, encoding="utf-8") as handle:
            return ast.parse(handle.read(), filename=path)
    except OSError as exc:
        raise EngineUnavailable(f"{rel}: {exc.strerror or exc}") from None
    except SyntaxError as exc:
        raise EngineUnavailable(f"{rel}: not Python this interpreter parses ({exc.msg})") from None


def _assigned(body: list[ast.stmt], names: dict | None = None) -> dict:
    """Names assigned a constant directly in `body` (not under if/try), in order."""
    out = dict(names or {})
    for stmt in body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        value = getattr(stmt, "value", None)
        if value is None:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    out[target.id] = constant(value, out)
                except ValueError:
                    pass
    return out


def _find(body: list[ast.stmt], kind: type, name: str, where: str):
    for node in body:
        if isinstance(node, kind) and node.name == name:
            return node
    raise EngineUnavailable(f"{where}: no {name} (SGLang's source changed)")


def _version(root: str) -> tuple[str, str]:
    """(version, where it was read)."""
    for rel in ("_version.py", "version.py"):
        if os.path.exists(os.path.join(root, rel)):
            found = _assigned(_parse(root, rel).body).get("__version__")
            if isinstance(found, str):
                return found, f"{rel} __version__"
    for meta in sorted(glob.glob(os.path.join(os.path.dirname(root), "sglang-*.dist-info", "METADATA"))):
        with open(meta, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip(), os.path.relpath(meta, root)
    raise EngineUnavailable("no __version__ in _version.py or version.py, and no sglang dist-info")


def _dispatch(root: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    where = f"{DISPATCH} GroupCoordinator"
    cls = _find(_parse(root, DISPATCH).body, ast.ClassDef, "GroupCoordinator", DISPATCH)
    fn = _find(cls.body, ast.FunctionDef, "_resolve_outplace_all_reduce_method", where)
    order: list[str] = []
    ends_none = False
    for stmt in fn.body:
        if isinstance(stmt, ast.If):
            returned = [n.value for n in stmt.body if isinstance(n, ast.Return)]
            if returned and isinstance(returned[0], ast.Constant) and isinstance(returned[0].value, str):
                order.append(returned[0].value)
        elif isinstance(stmt, ast.Return):
            ends_none = stmt.value is None or (isinstance(stmt.value, ast.Constant) and stmt.value.value is None)
    if not order or not ends_none:
        raise EngineUnavailable(
            f"{where}._resolve_outplace_all_reduce_method: no `if ...: return '<path>'` steps ending in "
            "`return None` (SGLang's source changed)"
        )
    return tuple(order) + ("nccl",), tuple(m for m in order if m not in PATHS)


def _custom(root: str) -> tuple[tuple[int, ...], int, bool, bool]:
    tree = _parse(root, CUSTOM)
    cls = _find(tree.body, ast.ClassDef, "CustomAllreduce", CUSTOM)
    names = _assigned(cls.body, _assigned(tree.body))
    sizes, limit = names.get("_SUPPORTED_WORLD_SIZES"), names.get("_MAX_CAR_SIZE")
    if not isinstance(sizes, list) or not isinstance(limit, int):
        raise EngineUnavailable(f"{CUSTOM} CustomAllreduce: no _SUPPORTED_WORLD_SIZES / _MAX_CAR_SIZE constants")
    rule = _find(cls.body, ast.FunctionDef, "should_custom_ar", f"{CUSTOM} CustomAllreduce")
    inclusive = None
    for node in ast.walk(rule):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "not _is_hip":
            for inner in ast.walk(node):
                if isinstance(inner, ast.If) and ast.unparse(inner.test) == "self.world_size == 2 or self.full_nvlink":
                    ret = inner.body[0]
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Compare):
                        if ast.unparse(ret.value.comparators[0]) == "self.max_size":
                            inclusive = isinstance(ret.value.ops[0], ast.LtE)
    if inclusive is None or "% 16" not in ast.unparse(rule):
        raise EngineUnavailable(
            f"{CUSTOM} CustomAllreduce.should_custom_ar: the CUDA rule (world_size == 2 or full_nvlink, "
            "size % 16, size <= max_size) was not found"
        )
    dispatch = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "dispatch_custom_allreduce"), None
    )
    v2 = dispatch is not None and V2_SWITCH in ast.unparse(dispatch) and os.path.exists(os.path.join(root, CUSTOM_V2))
    if v2:
        gate = next(
            (
                n
                for n in _parse(root, CUSTOM_V2).body
                if isinstance(n, ast.FunctionDef) and n.name == "can_use_custom_all_reduce_v2"
            ),
            None,
        )
        if gate is None or "full_nvlink is True" not in ast.unparse(gate):
            raise EngineUnavailable(f"{CUSTOM_V2} can_use_custom_all_reduce_v2: the full-NVLink gate was not found")
    return tuple(int(s) for s in sizes), limit, inclusive, v2


def _pcie_ipc(root: str) -> PcieIpc | None:
    if not os.path.exists(os.path.join(root, PCIE_IPC)):
        return None
    tree = _parse(root, PCIE_IPC)
    names = _assigned(tree.body)
    funcs = {n.name: ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    methods = {
        m.name: ast.unparse(m)
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for m in c.body
        if isinstance(m, ast.FunctionDef)
    }
    gate, takes = funcs.get("eligible_group", ""), methods.get("should_pcie_ipc_ar", "")
    if PCIE_SWITCH not in gate or not takes or not isinstance(names.get("_SUPPORTED_WORLD_SIZES"), list):
        raise EngineUnavailable(
            f"{PCIE_IPC}: eligible_group ({PCIE_SWITCH}), should_pcie_ipc_ar or _SUPPORTED_WORLD_SIZES not found"
        )
    width = names.get("_FALLBACK_DECODE_WIDTH")
    return PcieIpc(
        world_sizes=tuple(int(s) for s in names["_SUPPORTED_WORLD_SIZES"]),
        groups=tuple(sorted(names.get("_ELIGIBLE_GROUP_NAMES") or ())),
        fallback_width=width if isinstance(width, int) else None,
        bf16_only="torch.bfloat16" in takes,
        off_when_deterministic="deterministic" in gate,
    )


def _switches(root: str) -> dict[str, bool | int | None]:
    out: dict[str, bool | int | None] = {}
    for node in ast.walk(_parse(root, ENVIRON)):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(target, ast.Name)
            and target.id in SWITCHES
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == SWITCHES[target.id]
            and value.args
        ):
            try:
                out[target.id] = constant(value.args[0])
            except ValueError:
                pass
    return out


def _symm(root: str) -> tuple[dict[int, dict[int, int]], str | None]:
    """The size table, and the server-args file that defines --enable-torch-symm-mem."""
    table = _assigned(_parse(root, UTILS).body).get("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    if not isinstance(table, dict):
        raise EngineUnavailable(f"{UTILS}: no TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES table")
    flag = None
    for pattern in SERVER_ARGS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            if "enable_torch_symm_mem:" in text or "--enable-torch-symm-mem" in text:
                flag = os.path.relpath(path, root)
                break
        if flag:
            break
    return {int(cc): {int(ws): int(v) for ws, v in row.items()} for cc, row in table.items()}, flag


def locate(root: str | None = None) -> str:
    """SGLang's package folder: `root`, else NCCL_TUNE_SGLANG_ROOT, else find_spec in this
    Python (which does not run a top-level package). EngineUnavailable when none."""
    root = root or os.environ.get(ROOT_ENV) or None
    if root is None:
        try:
            spec = importlib.util.find_spec("sglang")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise EngineUnavailable(f"SGLang is not importable in this Python (set {ROOT_ENV} to its package folder)")
        root = next(iter(spec.submodule_search_locations))
    if not os.path.isdir(os.path.join(root, "srt")):
        raise EngineUnavailable(f"{root} is not an SGLang package folder (no srt/)")
    return os.path.abspath(root)


def read_sglang(root: str | None = None) -> SglangTables:
    """The installed SGLang's allreduce dispatch, tables and switch defaults, from its source.

    EngineUnavailable with a one-line reason when it is not found or its source changed.
    """
    root = locate(root)
    order, unknown = _dispatch(root)
    sizes, limit, inclusive, v2 = _custom(root)
    symm, flag_file = _symm(root)
    pcie = _pcie_ipc(root)
    version, version_file = _version(root)
    files = {
        "version": version_file,
        "dispatch": f"{DISPATCH} GroupCoordinator._resolve_outplace_all_reduce_method",
        "custom": f"{CUSTOM} CustomAllreduce (_SUPPORTED_WORLD_SIZES, _MAX_CAR_SIZE, should_custom_ar)",
        "switches": f"{ENVIRON} (EnvBool / EnvInt defaults)",
        "symm": f"{UTILS} TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES",
    }
    if v2:
        files["custom_v2"] = f"{CUSTOM_V2} can_use_custom_all_reduce_v2, {CUSTOM} dispatch_custom_allreduce"
    if flag_file:
        files["symm_flag"] = f"{flag_file} enable_torch_symm_mem"
    if pcie:
        files["pcie_ipc"] = f"{PCIE_IPC} eligible_group, PcieIpcCommunicator.should_pcie_ipc_ar"
    return SglangTables(
        version=version,
        root=root,
        files=files,
        order=order,
        unknown=unknown,
        custom_world_sizes=sizes,
        custom_max=limit,
        custom_inclusive=inclusive,
        v2=v2,
        pcie_ipc=pcie,
        switches=_switches(root),
        symm_max=symm,
        symm_flag="--enable-torch-symm-mem" if flag_file else None,
    )


# ------------------------------------------------------------------ the path for one size


def parse_switch(name: str, value: str) -> bool | int | None:
    """A profile's value as SGLang reads it (srt/environ.py EnvBool.parse / EnvInt.parse);
    None when SGLang would refuse it (it then warns and keeps the default)."""
    if SWITCHES.get(name) == "EnvBool":
        low = value.lower()
        return True if low in ("true", "1", "yes", "y") else False if low in ("false", "0", "no", "n") else None
    if SWITCHES.get(name) == "EnvInt":
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _switch(t: SglangTables, ov: dict, name: str):
    return ov[name] if name in ov else t.switches.get(name)


def _ca(t: SglangTables, m: Machine, nbytes: int, ov: dict, custom_on: bool) -> tuple[bool, str]:
    if not custom_on:
        return False, "custom allreduce disabled (--disable-custom-all-reduce)"
    if nbytes % 16:
        return False, f"{nbytes} B is not a multiple of 16"
    if t.v2 and _switch(t, ov, V2_SWITCH) and m.fully_connected:
        limit = int(_switch(t, ov, V2_MAX_KB) or 0) * 1024
        ok = nbytes <= limit
        return ok, (
            f"custom allreduce v2 (all GPUs NVLink, {V2_SWITCH} on): {nbytes} B {'<=' if ok else '>'} "
            f"{limit} B = {V2_MAX_KB}"
        )
    if m.tp not in t.custom_world_sizes:
        return False, f"TP {m.tp} not in CustomAllreduce._SUPPORTED_WORLD_SIZES {list(t.custom_world_sizes)}"
    if not (m.tp == 2 or m.fully_connected):
        return False, "custom allreduce is disabled on more than two GPUs that are not all NVLink-connected"
    ok = nbytes <= t.custom_max if t.custom_inclusive else nbytes < t.custom_max
    cmp = ("<=" if t.custom_inclusive else "<") if ok else (">" if t.custom_inclusive else ">=")
    where = "all GPUs NVLink" if m.fully_connected else "two GPUs"
    return ok, f"{where}: {nbytes} B {cmp} {t.custom_max} B = CustomAllreduce._MAX_CAR_SIZE"


def _pcie(t: SglangTables, m: Machine, nbytes: int, dtype: str, ov: dict) -> tuple[bool, str]:
    p = t.pcie_ipc
    if p is None:
        return False, "this SGLang has no PCIe-IPC allreduce"
    if not _switch(t, ov, PCIE_SWITCH):
        return False, f"opt-in {PCIE_SWITCH} is off"
    if p.off_when_deterministic and _switch(t, ov, DETERMINISTIC):
        return False, f"{DETERMINISTIC} is on"
    if m.tp not in p.world_sizes:
        return False, f"TP {m.tp} not a PCIe-IPC world size {list(p.world_sizes)}"
    if p.bf16_only and dtype.lower() not in ("bf16", "bfloat16"):
        return False, f"{dtype}: PCIe-IPC takes bf16 only"
    cap = _switch(t, ov, PCIE_MAX_NUMEL)
    if cap:
        numel = nbytes // 2
        ok = numel <= cap
        return ok, f"bf16, {numel} elements {'<=' if ok else '>'} {PCIE_MAX_NUMEL} = {cap}"
    width = f"{p.fallback_width} rows without it" if p.fallback_width else "a fixed width without it"
    return True, (
        f"{PCIE_SWITCH} on, TP {m.tp}, bf16, a decode batch within the workspace (rows up to the "
        f"CUDA-graph max batch x draft tokens; {width})"
    )


def _symm_why(t: SglangTables, m: Machine, nbytes: int) -> str:
    try:
        major = int(m.cc.split(".")[0])
        limit = t.symm_max[major][m.tp]
    except (ValueError, KeyError):
        return f"{t.symm_flag or 'torch symmetric memory'} is off by default"
    return (
        f"off by default; with {t.symm_flag} it takes bf16 below {limit} B = "
        f"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[{major}][{m.tp}]"
    )


def _takes(pid, t, m, nbytes, dtype, ov, custom_on) -> tuple[bool, str]:
    if pid == "ca":
        return _ca(t, m, nbytes, ov, custom_on)
    if pid == "pcie_ipc":
        return _pcie(t, m, nbytes, dtype, ov)
    if pid == "qr":
        return False, "ROCm only"
    if pid == "pymscclpp":
        return False, "--enable-mscclpp is off by default"
    if pid == "torch_symm_mem":
        return False, _symm_why(t, m, nbytes)
    if pid == "pynccl":
        return False, "piecewise CUDA graph only (NCCL too)"
    if pid == "nccl":
        return True, "no earlier path takes it"
    return False, "unknown step"


def _walk(t, m, nbytes, dtype, ov, custom_on) -> tuple[str, str, tuple[str, ...]]:
    skipped: list[str] = []
    for pid in t.order:
        takes, why = _takes(pid, t, m, nbytes, dtype, ov, custom_on)
        if takes:
            return pid, why, tuple(skipped)
        skipped.append(f"{pid}: {why}")
    return "nccl", "no path takes it", tuple(skipped)


def sglang_path(
    t: SglangTables, m: Machine, nbytes: int, dtype: str = "bf16", overrides: dict | None = None, custom_on: bool = True
) -> PathAnswer:
    """The path SGLang's dispatch takes for one decode allreduce of `nbytes` (CUDA), and
    the switches that would send it through NCCL instead."""
    ov = dict(overrides or {})
    pid, why, skipped = _walk(t, m, nbytes, dtype, ov, custom_on)
    uncertain = None
    if m.rocm:
        uncertain = "ROCm paths (quick allreduce, AITER, 16 MiB custom allreduce) are not modelled"
    elif pid == "ca" and m.tp == 2 and not m.fully_connected and m.p2p is not True:
        uncertain = "two GPUs without NVLink: SGLang's P2P check decides (nvidia-smi topo -p2p r)"
    elif pid == "ca" and "v2" in why and m.tp not in t.custom_world_sizes:
        uncertain = f"v2's world sizes and tuned thresholds per GPU generation ({V2_CONFIGS}) are not read"
    elif pid == "pcie_ipc":
        uncertain = "needs FlashInfer with comm.PcieIpcAllReduceWorkspace on the server; its supports() is not read"
    elif t.unknown:
        uncertain = f"dispatch steps {list(t.unknown)} in {DISPATCH} are not recognised"
    return PathAnswer(
        pid,
        PATHS.get(pid, (True,))[0],
        nbytes,
        why,
        skipped,
        _to_nccl(t, m, nbytes, dtype, ov, custom_on, pid),
        uncertain,
    )


def _to_nccl(t, m, nbytes, dtype, ov, custom_on, pid) -> tuple[str, ...]:
    switches: list[str] = []
    while not PATHS[pid][0]:
        switch = PATHS[pid][2]
        if switch is None or switch in switches:
            return tuple(switches + [f"(no switch turns off {PATHS[pid][1]})"])
        switches.append(switch)
        if switch == "--disable-custom-all-reduce":
            custom_on = False
        elif "=" in switch:
            ov[switch.split("=")[0]] = False
        else:
            return tuple(switches)
        pid = _walk(t, m, nbytes, dtype, ov, custom_on)[0]
    return tuple(switches)
