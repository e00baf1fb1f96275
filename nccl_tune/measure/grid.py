"""Grid specs -> cells: expansion, pruning (lint, topology) and grouping by scope.

A grid is a list of axes (an NCCL variable and the values to try; `None`, written
`default`, leaves the variable unset) plus optional explicit cells. Its cells are the
cartesian product of the axes, with the baseline (no NCCL_* at all) always first.

Three sources, which may be combined (later axes replace earlier ones of the same name):

- ``--set NCCL_PROTO=LL,LL128,default`` (values split on ``,``; a value that itself
  holds commas, such as ``NCCL_PROTO=LL,LL128`` as one setting, is written with ``|``
  between values instead: ``--set "NCCL_PROTO=LL|LL,LL128"``);
- ``--grid FILE.toml``::

      [grid]                      # axes: the cartesian product is swept
      NCCL_PROTO = ["default", "LL", "Simple"]
      NCCL_NTHREADS = [256, 512]  # integers are fine
      [[cells]]                   # extra cells, swept as written
      NCCL_PROTO = "LL"
      NCCL_P2P_LEVEL = "SYS"

- ``--grid decode``: the built-in small-message decode grid (`DECODE_GRID`).

Pruning happens before anything runs; every dropped cell keeps its reason. Grouping
(DESIGN.md section 5): NCCL caches process-scoped variables for the life of a process,
so cells are grouped by their process-scoped values (one launch per group), while the
communicator-scoped NCCL_PROTO / NCCL_ALGO / NCCL_THREAD_THRESHOLDS vary inside it.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field

import click

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import envcheck, grammar
from nccl_tune.model import costmodel
from nccl_tune.nccl import settings
from nccl_tune.store import BASELINE, cell_id, cell_label

DEFAULT_WORD = "default"
NAME_RE = re.compile(r"^NCCL_[A-Z0-9_]+$")
# Instrumentation, not settings: the microbench sets them to observe what NCCL ran.
INSTRUMENTATION = (
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_DEBUG_TIMESTAMP_FORMAT",
)
NVLS_ALGOS = frozenset({"NVLS", "NVLSTree"})

# The built-in decode grid: the knobs that move small-message allreduce latency
# (DESIGN.md section 1: the public 8x PCIe report's winning set is inside it).
DECODE_GRID: list[tuple[str, list[str | None]]] = [
    ("NCCL_PROTO", [None, "LL", "LL128", "Simple"]),
    ("NCCL_ALGO", [None, "Ring", "Tree"]),
    ("NCCL_MAX_NCHANNELS", [None, "4", "16"]),
    ("NCCL_BUFFSIZE", [None, "16777216"]),
    ("NCCL_NTHREADS", [None, "256", "512"]),
    ("NCCL_P2P_LEVEL", [None, "SYS"]),
]
BUILTIN_GRIDS = {"decode": DECODE_GRID}


@dataclass
class GridSpec:
    """Axes (name, values; None = unset) and explicit cells, with where they came from."""

    axes: list[tuple[str, list[str | None]]] = field(default_factory=list)
    cells: list[dict[str, str]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def merged(self, other: GridSpec) -> GridSpec:
        """This spec with `other`'s axes replacing same-named ones and its cells added."""
        names = {name for name, _ in other.axes}
        axes = [(n, v) for n, v in self.axes if n not in names] + list(other.axes)
        return GridSpec(axes, self.cells + other.cells, self.sources + other.sources)


class _NamedByEnv:
    """Id and label derived from an `env` mapping (cells and dropped cells alike)."""

    env: dict[str, str]

    @property
    def id(self) -> str:
        """Stable cell id (store.cell_id): 'baseline' or 'c-<hash>'."""
        return cell_id(self.env)

    @property
    def label(self) -> str:
        """The settings in words."""
        return cell_label(self.env)


@dataclass(frozen=True)
class Cell(_NamedByEnv):
    """One point of the grid: the NCCL_* variables it sets (the baseline sets none)."""

    env: dict[str, str]
    notes: tuple[str, ...] = ()

    @property
    def process_env(self) -> dict[str, str]:
        """The process-scoped part (cached by NCCL for the life of a process)."""
        return settings.split_by_scope(self.env)[0]

    @property
    def comm_env(self) -> dict[str, str]:
        """The communicator-scoped part (re-read at every communicator init)."""
        return settings.split_by_scope(self.env)[1]

    @property
    def process_key(self) -> tuple:
        """Cells with equal keys can share one process."""
        return tuple(sorted(self.process_env.items()))

    def split(self, isolation: str) -> tuple[dict[str, str], dict[str, str]]:
        """(process-wide, per-communicator) parts under `isolation` (see `split_env`)."""
        return split_env(self.env, isolation)


@dataclass(frozen=True)
class Dropped(_NamedByEnv):
    """A cell removed before running, and why (`id` is the one it would have had)."""

    env: dict[str, str]
    reason: str
    kind: str  # "lint" | "topology" | "duplicate"


@dataclass
class ProcessGroup:
    """Cells that share their process-scoped values: one launch measures them all.

    `no_cache`: under isolation nocache, the cached variables NCCL_NO_CACHE lists for this
    launch (they vary per cell, each with a fresh communicator); empty otherwise.
    """

    process_env: dict[str, str]
    cells: list[Cell]
    no_cache: tuple[str, ...] = ()

    @property
    def launch_env(self) -> dict[str, str]:
        """What the launch itself sets: the process-wide values, plus NCCL_NO_CACHE."""
        env = dict(self.process_env)
        if self.no_cache:
            env["NCCL_NO_CACHE"] = ",".join(self.no_cache)
        return env


@dataclass
class Grid:
    """The result of building a grid: what runs, what was dropped, and why."""

    cells: list[Cell]
    dropped: list[Dropped]
    topology: str | None
    notes: list[str]
    sources: list[str]

    def groups(self) -> list[ProcessGroup]:
        """The cells grouped by process-scoped values (see `group_by_process`)."""
        return group_by_process(self.cells)


# ---------------------------------------------------------------- reading specs


def _check_name(name: str, where: str) -> str:
    name = name.strip()
    if not NAME_RE.match(name):
        raise NcclTuneError(f"{where}: '{name}' is not an NCCL_* variable name")
    problem = grammar.name_problem(name)  # a cell's env becomes a profile: the same rule
    if problem:
        raise NcclTuneError(f"{where}: {problem}")
    if name in INSTRUMENTATION:
        raise NcclTuneError(
            f"{where}: {name} is instrumentation, not a setting to sweep "
            "(the microbench sets NCCL's debug output itself)"
        )
    if name == "NCCL_NO_CACHE":
        raise NcclTuneError(
            f"{where}: NCCL_NO_CACHE is set by the sweep itself for each launch "
            "under --isolation nocache, not a setting to sweep"
        )
    return name


def _value(raw, where: str) -> str | None:
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise NcclTuneError(f"{where}: values must be strings or integers, got {raw!r}")
    text = str(raw).strip()
    if text.lower() == DEFAULT_WORD:
        return None
    if not text:
        raise NcclTuneError(f"{where}: empty value (write '{DEFAULT_WORD}' to leave it unset)")
    problem = grammar.value_problem(text)
    if problem:
        raise NcclTuneError(f"{where}: {problem}")
    return text


def parse_set(text: str) -> tuple[str, list[str | None]]:
    """``NAME=v1,v2`` (or ``NAME=v1|v2`` when values hold commas) -> (name, values)."""
    where = f"--set {text}"
    if "=" not in text:
        raise NcclTuneError(f"{where}: expected NAME=VALUE[,VALUE...]")
    name, body = text.split("=", 1)
    name = _check_name(name, "--set")
    parts = body.split("|") if "|" in body else body.split(",")
    values = [_value(part, where) for part in parts]
    return name, list(dict.fromkeys(values))


class SetOption(click.ParamType):
    """`--set NAME=V1,V2`: one axis, its name and values checked as it is parsed (the
    vocabulary's rule, nccl_tune.live.envcheck); an unknown name passes when the command's
    `--allow-unknown` flag (eager, so parsed first) is given."""

    name = "NAME=V1,V2"

    def convert(self, value, param, ctx) -> str:
        try:
            name, values = parse_set(str(value))
            allow = bool(ctx.params.get("allow_unknown")) if ctx is not None else False
            envcheck.check_settings([(name, v) for v in values], "--set", allow_unknown=allow)
        except NcclTuneError as exc:
            self.fail(str(exc).removeprefix("--set: "), param, ctx)
        return value


def check_spec(spec: GridSpec, allow_unknown: bool) -> None:
    """NcclTuneError naming the spec's sources for the first unknown name or invalid value
    of its axes and cells (envcheck.check_settings, the rule `--set` is parsed with)."""
    where = ", ".join(spec.sources) or "grid"
    pairs = [(name, v) for name, values in spec.axes for v in values]
    pairs += [(name, v) for cell in spec.cells for name, v in cell.items()]
    envcheck.check_settings(pairs, where, allow_unknown=allow_unknown)


def spec_from_sets(items: list[str]) -> GridSpec:
    """A spec from repeated ``--set`` options; a repeated name adds values to its axis."""
    axes: dict[str, list[str | None]] = {}
    for item in items:
        name, values = parse_set(item)
        merged = axes.setdefault(name, [])
        merged.extend(v for v in values if v not in merged)
    return GridSpec(list(axes.items()), [], ["--set"] if items else [])


GRID_MAX_BYTES = 1024 * 1024  # a grid file: axes and explicit cells, a few KB in practice
GRID_MAX_DEPTH = 8  # [[cells]] tables and arrays of values nest 2 or 3 deep
GRID_MAX_CELLS = 50_000  # cells a grid may expand to (a sweep of more never finishes)
# TOML strings and comments (where brackets do not nest), escapes removed first. Each
# alternative starts with its own character and stops at the line's end: linear.
_TOML_NOISE = re.compile(r'"[^"\n]*"|\'[^\'\n]*\'|#[^\n]*')


def toml_depth(text: str) -> int:
    """How deeply arrays and tables nest in TOML `text` (strings and comments skipped),
    without recursion: checked before tomllib, whose parser recurses."""
    return fileio.bracket_depth(_TOML_NOISE.sub("", re.sub(r"\\.", "", text, flags=re.S)))


def _load_toml(path: str) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    text = fileio.read_text(path, what="grid file", max_bytes=GRID_MAX_BYTES)
    depth = toml_depth(text)
    if depth > GRID_MAX_DEPTH:
        raise NcclTuneError(f"nested {depth} levels deep: a grid file nests at most {GRID_MAX_DEPTH}", path=path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says where in its message: "(at line 3, column 7)" or "(at end of document)".
        message = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(match.group(1)) if match else None
        if line is None and "end of document" in message:
            line = max(1, text.count("\n"))
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", message)
        raise NcclTuneError(f"not a valid TOML grid: {message}", path=path, line=line) from None


def load_grid_file(path: str) -> GridSpec:
    """A spec from a TOML grid file (`[grid]` axes, `[[cells]]` explicit cells)."""
    data = _load_toml(path)
    unknown = set(data) - {"grid", "cells"}
    if unknown:
        raise NcclTuneError(f"unknown table(s) {', '.join(sorted(unknown))}; expected [grid] and [[cells]]", path=path)
    axes = []
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise NcclTuneError("[grid] must be a table of NAME = [values]", path=path)
    for name, values in grid.items():
        where = f"{path}: [grid] {name}"
        name = _check_name(name, f"{path}: [grid]")
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise NcclTuneError(f"{where}: no values")
        axes.append((name, list(dict.fromkeys(_value(v, where) for v in values))))
    cells = []
    raw_cells = data.get("cells", [])
    if not isinstance(raw_cells, list):
        raise NcclTuneError("cells must be an array of tables ([[cells]])", path=path)
    for index, raw in enumerate(raw_cells, start=1):
        if not isinstance(raw, dict):
            raise NcclTuneError(f"[[cells]] entry {index} is not a table", path=path)
        env = {}
        for name, value in raw.items():
            name = _check_name(name, f"{path}: [[cells]] entry {index}")
            value = _value(value, f"{path}: [[cells]] entry {index} {name}")
            if value is not None:
                env[name] = value
        cells.append(env)
    if not axes and not cells:
        raise NcclTuneError("the grid is empty: give a [grid] table or [[cells]]", path=path)
    return GridSpec(axes, cells, [path])


def resolve_grid_option(value: str) -> GridSpec:
    """``--grid``: a built-in name (``decode``) or a TOML file path."""
    if value in BUILTIN_GRIDS and not os.path.exists(value):
        return GridSpec([(n, list(v)) for n, v in BUILTIN_GRIDS[value]], [], [f"built-in '{value}'"])
    if not os.path.exists(value):
        raise NcclTuneError(f"--grid: '{value}' is neither a file nor a built-in grid ({', '.join(BUILTIN_GRIDS)})")
    return load_grid_file(value)


# ---------------------------------------------------------------- expansion and pruning


def cell_count(spec: GridSpec) -> int:
    """How many envs `expand` would make (baseline included), counted without making them."""
    product = 1
    for _, values in spec.axes:
        product *= len(values)
    return 1 + (product if spec.axes else 0) + len(spec.cells)


def expand(spec: GridSpec) -> list[dict[str, str]]:
    """Every env of the spec, baseline first, in axis order, duplicates kept (pruned later).

    NcclTuneError, before any is made, when there would be more than GRID_MAX_CELLS."""
    count = cell_count(spec)
    if count > GRID_MAX_CELLS:
        shape = " x ".join(str(len(values)) for _, values in spec.axes) or "0"
        raise NcclTuneError(
            f"the grid expands to {count:,} cells (axes {shape}"
            f"{f' + {len(spec.cells)} cells' if spec.cells else ''}), more than the "
            f"{GRID_MAX_CELLS:,} a sweep takes: give fewer values per axis"
        )
    envs: list[dict[str, str]] = [{}]
    names = [name for name, _ in spec.axes]
    for combo in itertools.product(*(values for _, values in spec.axes)):
        envs.append({n: v for n, v in zip(names, combo) if v is not None})
    envs.extend(dict(cell) for cell in spec.cells)
    return envs


def lint_reasons(env: dict[str, str], nccl_version=None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of settings.check_value over a cell's values."""
    errors, warnings = [], []
    for name, value in env.items():
        for severity, message in settings.check_value(name, value, nccl_version):
            (errors if severity == settings.ERROR else warnings).append(message)
        if settings.lookup(name) is None:
            warnings.append(f"{name} is not in nccl-tune's catalogue: treated as process-scoped")
    return errors, warnings


def topology_reason(env: dict[str, str], topology: str | None, allow_unsafe: bool) -> tuple[str | None, list[str]]:
    """(why the cell cannot or must not run on `topology`, notes); (None, []) when fine."""
    if topology is None:
        return None, []
    topo = costmodel.topology(topology)
    notes: list[str] = []
    algo = env.get("NCCL_ALGO")
    # NVLS needs NVSwitch with NVLink SHARP (Hopper or later): A100's NVSwitch has none.
    lacks = "NVSwitch" if not topo.nvswitch else "NVLink SHARP"
    if algo is not None and not topo.has_nvls:
        allowed = settings.allowed_algorithms(algo)
        if allowed and allowed <= NVLS_ALGOS:
            return f"NCCL_ALGO={algo} allows only NVLS, which needs {lacks} ('{topology}' has none)", []
        if allowed & NVLS_ALGOS and not algo.startswith("^"):
            notes.append(f"NCCL_ALGO={algo}: NVLS has no effect without {lacks}")
    if env.get("NCCL_NVLS_ENABLE") == "1" and not topo.has_nvls:
        return f"NCCL_NVLS_ENABLE=1 needs {lacks} ('{topology}' has none)", []
    proto = env.get("NCCL_PROTO")
    if proto is not None and settings.enables_ll128(proto) and not topo.ll128_by_default:
        message = (
            f"NCCL_PROTO={proto} forces LL128 on '{topology}', where NCCL keeps it off because it can corrupt data"
        )
        if not allow_unsafe:
            return message + " (--allow-unsafe measures it anyway)", []
        notes.append(message + " (kept: --allow-unsafe; its correctness check decides)")
    return None, notes


def prune(
    envs: list[dict[str, str]], topology: str | None, allow_unsafe: bool = False, nccl_version=None
) -> tuple[list[Cell], list[Dropped]]:
    """Cells that may run, and the dropped ones with reasons (lint, topology, duplicate).

    The baseline (empty env) is never dropped.
    """
    cells: list[Cell] = []
    dropped: list[Dropped] = []
    seen: set[str] = set()
    for env in envs:
        key = cell_id(env)
        if key in seen:
            if env:
                dropped.append(Dropped(env, "same settings as an earlier cell", "duplicate"))
            continue
        seen.add(key)
        errors, warnings = lint_reasons(env, nccl_version)
        if errors:
            dropped.append(Dropped(env, "; ".join(errors), "lint"))
            continue
        reason, notes = topology_reason(env, topology, allow_unsafe)
        if reason:
            dropped.append(Dropped(env, reason, "topology"))
            continue
        # The LL128 lint warning is the topology check's business (it knows the machine).
        warnings = [w for w in warnings if "LL128" not in w]
        cells.append(Cell(env, tuple(notes + warnings)))
    return cells, dropped


def group_by_process(cells: list[Cell]) -> list[ProcessGroup]:
    """Cells grouped by process-scoped values, in first-appearance order.

    Inside a group, the cell without communicator-scoped settings (when present) comes
    first: its communicator is then created before any NCCL_PROTO/NCCL_ALGO was ever set
    in that process, so it is clean by construction.
    """
    return group_cells(cells, "group")


# ---------------------------------------------------------------- isolation


def split_env(env: dict[str, str], isolation: str) -> tuple[dict[str, str], dict[str, str]]:
    """(process-wide part, per-communicator part) of a cell's env under `isolation`.

    group/process: by catalogue scope. nocache: the cached NCCL_PARAM variables that
    NCCL_NO_CACHE makes NCCL re-read (settings.rereads_under_no_cache) move to the
    per-communicator part; static caches (NCCL_P2P_LEVEL, ...) stay process-wide.
    """
    process, comm = settings.split_by_scope(env)
    if isolation != "nocache":
        return process, comm
    moved = {k: v for k, v in process.items() if settings.rereads_under_no_cache(k)}
    resident = {k: v for k, v in process.items() if k not in moved}
    return resident, {**comm, **moved}


def no_cache_names(cells: list[Cell]) -> tuple[str, ...]:
    """The cached variables that NCCL_NO_CACHE must list for `cells` (set in any of them), sorted."""
    return tuple(sorted({k for c in cells for k in c.env if settings.rereads_under_no_cache(k)}))


def group_cells(cells: list[Cell], isolation: str) -> list[ProcessGroup]:
    """Cells grouped into launches under `isolation`, in first-appearance order.

    process: one launch per cell. group: by process-scoped values. nocache: by the values
    that stay process-wide under NCCL_NO_CACHE; each group lists the cached variables its
    cells set (`no_cache`). Inside a group, the cell with no per-communicator settings (at
    most one) comes first: its communicator is created before anything was set per cell.
    """
    if isolation == "process":
        return [ProcessGroup(split_env(c.env, "group")[0], [c]) for c in cells]
    groups: dict[tuple, ProcessGroup] = {}
    for cell in cells:
        resident = split_env(cell.env, isolation)[0]
        group = groups.setdefault(tuple(sorted(resident.items())), ProcessGroup(resident, []))
        group.cells.append(cell)
    for group in groups.values():
        group.cells.sort(key=lambda c: bool(split_env(c.env, isolation)[1]))
        if isolation == "nocache":
            group.no_cache = no_cache_names(group.cells)
    return list(groups.values())


# ---------------------------------------------------------------- topology


def detect_topology() -> tuple[str | None, str]:
    """This machine's topology kind (costmodel.TOPOLOGIES name) and how it was found.

    Uses nccl_tune.nccl.topology.detect_kind when that module is present; None (nothing is
    pruned by topology) when it is missing or cannot tell.
    """
    try:
        from nccl_tune.nccl import topology as topo_module

        detect = topo_module.detect_kind
    except (ImportError, AttributeError):
        return None, (
            "unknown topology (nccl_tune.nccl.topology.detect_kind is not available): "
            "nothing pruned by topology; pass --topology to prune"
        )
    try:
        kind = detect()
    except Exception as exc:  # detection must never stop a sweep
        return None, f"unknown topology (detection failed: {exc}): nothing pruned by topology"
    if kind is None:
        return None, (
            "unknown topology (no nvidia-smi or fewer than two GPUs): nothing pruned "
            "by topology; pass --topology to prune"
        )
    if kind not in costmodel.TOPOLOGIES:
        return None, f"unknown topology kind '{kind}': nothing pruned by topology"
    return kind, f"topology '{kind}' detected from nvidia-smi topo -m"


def build_grid(
    spec: GridSpec,
    topology: str | None = None,
    allow_unsafe: bool = False,
    nccl_version=None,
    topology_note: str | None = None,
) -> Grid:
    """Expand, prune and describe a grid; `topology` None means unknown (no topology pruning)."""
    if topology is not None and topology not in costmodel.TOPOLOGIES:
        raise NcclTuneError(f"--topology: unknown '{topology}' (known: {', '.join(costmodel.TOPOLOGIES)})")
    cells, dropped = prune(expand(spec), topology, allow_unsafe, nccl_version)
    notes = [topology_note] if topology_note else []
    if not any(c.id == BASELINE for c in cells):  # pragma: no cover - prune keeps it
        cells.insert(0, Cell({}))
    return Grid(cells, dropped, topology, notes, list(spec.sources))
