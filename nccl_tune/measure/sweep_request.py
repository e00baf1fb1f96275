"""From a sweep's options to its plan: `SweepRequest` -> `plan_sweep()` -> `SweepPlan`.

Every decision `nccl-tune sweep` takes before anything runs lives here: the backend and
ranks per node, the grid and its pruning, the isolation and its fallbacks (a conf file
whose values cells could not share a process with), the GPU check, and what each search
strategy would spend. Bad input is an NcclTuneError (exit 2) raised before any launch.
The plan is typed and frozen; `SweepPlan.to_dict()` is what `sweep --dry-run --json`
prints. Running the plan is nccl_tune.measure.sweep_run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import grid as gridlib
from nccl_tune.measure import search, sweepplan
from nccl_tune.measure.launch import Launcher
from nccl_tune.model import costmodel

if TYPE_CHECKING:
    from nccl_tune.model.calibrate import LoadedModel

SIM_DEFAULT_TOPOLOGY = costmodel.DEFAULT_TOPOLOGY


@dataclass(frozen=True)
class SweepRequest:
    """What the user asked a sweep for: the options of `nccl-tune sweep`, unresolved
    ('auto' and None mean "decide here"), named as the command's parameters."""

    sets: tuple[str, ...] = ()  # --set NAME=V1,V2 items, each checked as parsed
    grid: str | None = None  # a grid TOML file or a built-in grid's name
    topology: str = "auto"  # auto | none | a costmodel.TOPOLOGIES name
    allow_unsafe: bool = False
    allow_unknown: bool = False
    sizes: str | None = None
    tokens: str | None = None
    hidden: int | None = None
    dtype: str = "bf16"
    iters: int | None = None
    warmup: int | None = None
    mode: str | None = None
    graph_ops: int | None = None
    op: str = "allreduce"
    verify_effective: bool | None = None
    op_timeout: float | None = None
    label: str | None = None
    backend: str = "auto"
    sim_landscape: str = "nccl"
    model: str | None = None  # a `model fit` file (sim only)
    isolation: str = "auto"
    nccl_version: str | None = None  # plan for this NCCL instead of the one found here
    rounds: int = 1
    strategy: str = "exhaustive"
    budget: float | None = None
    seed: int = 0
    nproc: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    template: str | None = None  # --launcher
    keep_env: tuple[str, ...] = ()
    timeout: float | None = None
    out: str | None = None
    resume: bool | None = None  # None: resume when --out exists
    dry_run: bool = False
    module: str = sweepplan.MODULE


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep will run, decided: the grid, the launcher, the isolation and the
    estimates of every strategy. `to_dict()` is the `--dry-run --json` object."""

    request: SweepRequest
    options: sweepplan.MeasureOptions  # resolved backend, sizes and dtype
    grid: gridlib.Grid
    axes: list[tuple[str, list[str | None]]]  # the spec's axes (descent walks them)
    launcher: Launcher
    isolation: str  # the one used: auto resolved, a conf-file clash turned into process
    notes: tuple[str, ...]
    groups: tuple[gridlib.ProcessGroup, ...]  # the launches of one round
    measurements: dict[str, float]  # strategy -> measurements it would spend
    halving_rungs: tuple[search.Rung, ...] | None  # --search halving only
    launches: int | None  # None: descent (the data decide)
    launches_exhaustive: int
    launches_by_isolation: dict[str, int]
    estimate_s: float
    sim_model: LoadedModel | None = None  # --model: what the sim backend draws from

    @property
    def strategy(self) -> str:
        """The search strategy (--search)."""
        return self.request.strategy

    @property
    def rounds(self) -> int:
        """Passes over the grid (the final rung's rounds for halving and descent)."""
        return self.request.rounds

    @property
    def backend(self) -> str:
        """nccl, gloo or sim, resolved."""
        return self.options.backend

    @property
    def simulated(self) -> bool:
        """True on the sim backend: every figure is drawn from the cost model."""
        return self.options.backend == "sim"

    @property
    def writes_records(self) -> bool:
        """True when this node writes the records (node 0, or the sim backend)."""
        return self.simulated or self.launcher.writes_records

    @property
    def n_cells(self) -> int:
        """Cells other than the baseline."""
        return sum(1 for c in self.grid.cells if c.env)

    def planned_requests(self) -> int | None:
        """Cell measurements (cell x round) the strategy plans, baseline included; None
        when the data decide (descent)."""
        if self.strategy == "exhaustive":
            return (self.n_cells + 1) * self.rounds
        if self.strategy == "halving":
            return sum((r.cells + 1) * r.rounds for r in self.halving_rungs)
        return None

    def to_dict(self) -> dict:
        """JSON-ready form (the `sweep --dry-run --json` object)."""
        g = self.grid
        return {
            "search": self.strategy,
            "budget": self.request.budget,
            "measurements": dict(self.measurements),
            "halving_rungs": ([asdict(r) for r in self.halving_rungs] if self.halving_rungs is not None else None),
            "backend": self.backend,
            "simulated": self.simulated,
            "out": self.request.out,
            "sizes": list(self.options.sizes),
            "op": self.options.op,
            "rounds": self.rounds,
            "isolation": self.isolation,
            "launcher": self.launcher.describe(),
            "topology": g.topology,
            "cells": [{"cell": c.id, "env": c.env, "label": c.label, "notes": list(c.notes)} for c in g.cells],
            "dropped": [
                {"cell": d.id, "env": d.env, "label": d.label, "kind": d.kind, "reason": d.reason} for d in g.dropped
            ],
            "groups": [
                {
                    "process_env": grp.process_env,
                    "no_cache": list(grp.no_cache),
                    "launch_env": grp.launch_env,
                    "cells": [c.id for c in grp.cells],
                }
                for grp in self.groups
            ],
            "launches": self.launches,
            "launches_exhaustive": self.launches_exhaustive,
            "launches_by_isolation": dict(self.launches_by_isolation),
            "estimate_s": self.estimate_s,
            "notes": list(self.notes),
        }


def gpu_count() -> int:
    """NVIDIA GPUs visible to this process, without importing torch (0 when none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        found = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        found = 0
    if visible is not None and found:
        wanted = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return min(found, len(wanted))
    return found


def launcher_gpus_needed(nproc: int, template: str | None) -> int:
    """GPUs this host needs for the ranks it starts (0 for a scheduler template)."""
    return 0 if template else nproc


def choose_backend(backend: str, gpus: int) -> tuple[str, str]:
    """(backend, note): 'auto' is nccl with two or more GPUs, else gloo."""
    if backend != "auto":
        return backend, f"backend {backend}"
    if gpus >= 2:
        return "nccl", f"backend nccl ({gpus} GPUs found)"
    return "gloo", "backend gloo (fewer than two GPUs found; --backend nccl or sim to change)"


def choose_nproc(nproc: int | None, backend: str, gpus: int) -> tuple[int, str]:
    """(ranks per node, note): one per GPU on nccl (at most 8), 8 modelled on sim, 2 on gloo."""
    if nproc is not None:
        return nproc, f"{nproc} ranks per node"
    if backend == "nccl":
        chosen = max(1, min(8, gpus))
        return chosen, f"{chosen} ranks per node (one per GPU, at most 8)"
    if backend == "sim":
        return 8, "8 ranks (the modelled world; --nproc to change)"
    return 2, "2 ranks on CPU (gloo; --nproc to change)"


def build_grid(
    request: SweepRequest, topology_option: str, backend: str, nccl_version
) -> tuple[gridlib.Grid, gridlib.GridSpec]:
    """The pruned grid of `--set` and `--grid`, and its spec; sim needs a topology."""
    spec = gridlib.GridSpec()
    if request.grid:
        spec = spec.merged(gridlib.resolve_grid_option(request.grid))
    if request.sets:
        spec = spec.merged(gridlib.spec_from_sets(list(request.sets)))
    if topology_option == "auto":
        topology, note = gridlib.detect_topology()
        if topology is None and backend == "sim":
            topology, note = (
                SIM_DEFAULT_TOPOLOGY,
                (f"sim: modelled topology '{SIM_DEFAULT_TOPOLOGY}' (none detected; --topology to change)"),
            )
    elif topology_option == "none":
        topology, note = None, "--topology none: nothing pruned by topology"
    else:
        topology, note = topology_option, f"topology '{topology_option}' (--topology)"
    if backend == "sim" and topology is None:
        raise NcclTuneError(
            f"--backend sim needs a topology to model: pass --topology ({', '.join(costmodel.TOPOLOGIES)})"
        )
    grid = gridlib.build_grid(spec, topology, request.allow_unsafe, nccl_version, note)
    return grid, spec


def check_runnable(backend: str, mode: str | None, verify_effective: bool | None, gpus: int) -> None:
    """Refuse (exit 2, before any launch) what no rank could run on this backend: the
    microbench's own rule (microbench.options.check_backend_mode). sim models anything."""
    if backend == "sim":
        return
    from microbench.options import check_backend_mode

    # nccl without GPUs is refused by plan_sweep with the GPU count; here: mode and log checks.
    check_backend_mode(backend, mode, verify_effective, cuda=backend == "nccl" or gpus > 0)


def strategy_costs(grid: gridlib.Grid, axes, options: sweepplan.MeasureOptions, rounds: int) -> dict[str, float]:
    """Planned measurements of each strategy (budget units: cell x size x round at full iters)."""
    n_cells = sum(1 for c in grid.cells if c.env)
    out = {}
    for name in search.STRATEGIES:
        if name == "descent" and not axes:
            continue
        out[name] = round(
            search.estimate_cost(name, n_cells, len(options.sizes), rounds, options.full_iters, axes=axes), 1
        )
    return out


def _load_model(request: SweepRequest):
    """(LoadedModel or None, the topology option, the nproc option) after --model: the
    model file's topology and world size unless given (and a differing topology refused)."""
    if not request.model:
        return None, request.topology, request.nproc
    from nccl_tune.model import calibrate

    if request.backend != "sim":
        raise NcclTuneError("--model needs --backend sim (it changes what the model draws)")
    model = calibrate.load(request.model)
    topology = request.topology
    if topology == "auto":
        topology = model.topology
    elif topology != model.topology:
        raise NcclTuneError(
            f"--topology {topology} differs from the model file's '{model.topology}'", path=request.model
        )
    return model, topology, request.nproc or model.nranks  # the fitted machine's world size


def _conf_file_isolation(
    request: SweepRequest, backend: str, grid: gridlib.Grid, isolation: str, notes: list[str]
) -> str:
    """The isolation after NCCL conf files: notes on inherited NCCL_* and conf files, and
    process instead of a shared one when some cells set a conf-file value (NCCL writes it
    into the C environment, so it would be lost after the first such cell); an explicit
    group or nocache is refused instead."""
    _, removed = sweepplan.launch_environment({}, tuple(request.keep_env))
    if removed:
        notes.append("inherited NCCL_* removed from every launch (the baseline sets none): " + ", ".join(removed))
    conf = sweepplan.conf_files(keep=tuple(request.keep_env))
    for path, names in conf:
        notes.append(
            f"conf file {path} still supplies {', '.join(names) or 'nothing'} to every cell, the baseline included"
        )
    shared = isolation in ("group", "nocache")  # cells share a process
    no_cache = gridlib.no_cache_names(grid.cells) if isolation == "nocache" else ()
    clashes = sweepplan.conf_cell_conflicts(conf, grid.cells, no_cache) if backend == "nccl" and shared else []
    if not clashes:
        return isolation
    what = ", ".join(f"{name} ({path})" for path, name in clashes)
    if request.isolation in ("group", "nocache"):
        raise NcclTuneError(
            f"--isolation {request.isolation}: the conf file value(s) {what} would be "
            "lost after the first cell that sets them (NCCL writes them into "
            "the C environment); use --isolation process or remove them"
        )
    notes.append(
        f"isolation process: conf file value(s) {what} are set by some cells; in "
        "a shared process they would be lost after the first such cell"
    )
    return "process"


def plan_sweep(request: SweepRequest, gpus: int | None = None) -> SweepPlan:
    """Every decision before a sweep runs, in the order its refusals are checked (each an
    NcclTuneError, exit 2): --model, backend and ranks, --keep-env, the grid, what the
    backend can run, sizes, the NCCL version planned for, the grid's names and values,
    descent's axes, the isolation, GPUs (refused unless --dry-run), the launcher, conf
    files. `gpus`: the GPUs visible here (None: counted, gpu_count)."""
    sim_model, topology_option, nproc = _load_model(request)
    gpus = gpu_count() if gpus is None else gpus
    backend, backend_note = choose_backend(request.backend, gpus)
    nproc, nproc_note = choose_nproc(nproc, backend, gpus)
    for name in request.keep_env:
        if not name.startswith(sweepplan.CONTROLLED_PREFIXES):
            raise NcclTuneError(f"--keep-env: '{name}' is not an NCCL_* or TORCH_NCCL_* variable")
    if not request.sets and not request.grid:
        raise NcclTuneError("no grid: give --set NAME=V1,V2 (repeatable) or --grid decode|FILE.toml")
    dtype = sweepplan.canonical_dtype(request.dtype)
    check_runnable(backend, request.mode, request.verify_effective, gpus)
    options = sweepplan.MeasureOptions(
        backend=backend,
        sizes=tuple(sweepplan.resolve_sizes(request.sizes, request.tokens, request.hidden, dtype)),
        dtype=dtype,
        op=request.op,
        iters=request.iters,
        warmup=request.warmup,
        mode=request.mode,
        graph_ops=request.graph_ops,
        verify_effective=request.verify_effective,
        op_timeout=request.op_timeout,
        label=request.label,
    )
    nccl_version, version_source = sweepplan.planned_nccl_version(backend, request.nccl_version)
    grid, spec = build_grid(request, topology_option, backend, nccl_version)
    # a variable neither the catalogue nor the installed libnccl knows (a typo such as
    # NCCL_PROTOO would be measured as a cell NCCL ignores), or a value NCCL would reject
    gridlib.check_spec(spec, request.allow_unknown)
    if request.strategy == "descent" and not spec.axes:
        raise NcclTuneError(
            "--search descent needs grid axes (--set NAME=V1,V2 or a grid file's "
            "[grid] table), not only explicit [[cells]]"
        )
    notes = [backend_note + "; " + nproc_note] + grid.notes
    isolation, isolation_notes = sweepplan.resolve_isolation(
        request.isolation, backend, nccl_version, request.verify_effective, version_source
    )
    notes += isolation_notes
    if backend == "gloo":
        notes.append(sweepplan.GLOO_NOTE)
    short = backend == "nccl" and gpus < launcher_gpus_needed(nproc, request.template)
    if short and not request.dry_run:
        raise NcclTuneError(
            f"--backend nccl: {gpus} GPU(s) visible here for {nproc} ranks per node; "
            "NCCL needs one GPU per rank (--nproc, --backend gloo|sim, or a "
            "--launcher template for a scheduler)"
        )
    if short:
        notes.append(
            f"warning: {gpus} GPU(s) visible here for {nproc} ranks per node: NCCL needs "
            "one GPU per rank, so launches on this host will fail"
        )
    if backend == "sim":
        notes.append("simulated: every measurement is drawn from the cost model, nothing is measured")
    launcher = Launcher(
        nproc=nproc,
        nnodes=request.nnodes,
        node_rank=request.node_rank,
        rdzv_endpoint=request.rdzv_endpoint,
        template=request.template,
        simulated=backend == "sim",
    )
    if backend != "sim":
        isolation = _conf_file_isolation(request, backend, grid, isolation, notes)
        if not launcher.writes_records:
            notes.append(f"node {request.node_rank}: this node launches its ranks; node 0 writes the records")
    return _plan(request, options, grid, spec.axes, launcher, isolation, notes, sim_model)


def _plan(
    request: SweepRequest,
    options: sweepplan.MeasureOptions,
    grid: gridlib.Grid,
    axes,
    launcher: Launcher,
    isolation: str,
    notes: list[str],
    sim_model,
) -> SweepPlan:
    """The plan's counts and estimates for the decisions taken."""
    rounds, strategy = request.rounds, request.strategy
    groups = gridlib.group_cells(grid.cells, isolation)
    n_cells = sum(1 for c in grid.cells if c.env)
    rungs = tuple(search.plan_halving(n_cells, options.full_iters, rounds)) if strategy == "halving" else None
    exhaustive = sweepplan.count_launches(grid.cells, rounds, isolation)
    if strategy == "halving":  # at most one launch per process group per rung and round
        launches = sum(r.rounds * min(len(groups), r.cells + 1) for r in rungs)
    elif strategy == "descent":
        launches = None  # data-dependent: each probe batch is grouped by process scope
    else:
        launches = exhaustive
    return SweepPlan(
        request=request,
        options=options,
        grid=grid,
        axes=axes,
        launcher=launcher,
        isolation=isolation,
        notes=tuple(notes),
        groups=tuple(groups),
        measurements=strategy_costs(grid, axes, options, rounds),
        halving_rungs=rungs,
        launches=launches,
        launches_exhaustive=exhaustive,
        launches_by_isolation=sweepplan.launches_by_isolation(grid.cells, rounds),
        estimate_s=round(sweepplan.estimate_seconds(grid.cells, rounds, isolation, options), 1),
        sim_model=sim_model,
    )
