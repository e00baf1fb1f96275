"""`nccl-tune sweep`: measure a grid of NCCL settings, safely, in rounds, resumably."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import click
from tabulate import tabulate

from microbench.options import DTYPE_ALIASES, DTYPES
from nccl_tune import fileio, stats, vocab
from nccl_tune.live import envcheck
from nccl_tune.model import costmodel
from nccl_tune.measure import grid as gridlib, launch, search, sweep as sweeplib
from nccl_tune.errors import Interrupted, NcclTuneError, RunFailed

SIM_DEFAULT_TOPOLOGY = costmodel.DEFAULT_TOPOLOGY
MAX_DROPPED_LISTED = 20
MAX_UNFINISHED_LISTED = 8


def gpu_count() -> int:
    """NVIDIA GPUs visible to this process, without importing torch (0 when none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        found = len([n for n in os.listdir("/proc/driver/nvidia/gpus")])
    except OSError:
        found = 0
    if visible is not None and found:
        wanted = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return min(found, len(wanted))
    return found


def launcher_gpus_needed(nproc: int, template: str | None) -> int:
    """GPUs this host needs for the ranks it starts (0 for a scheduler template)."""
    return 0 if template else nproc


def _choose_backend(backend: str, gpus: int) -> tuple[str, str]:
    if backend != "auto":
        return backend, f"backend {backend}"
    if gpus >= 2:
        return "nccl", f"backend nccl ({gpus} GPUs found)"
    return "gloo", "backend gloo (fewer than two GPUs found; --backend nccl or sim to change)"


def _choose_nproc(nproc: int | None, backend: str, gpus: int) -> tuple[int, str]:
    if nproc is not None:
        return nproc, f"{nproc} ranks per node"
    if backend == "nccl":
        chosen = max(1, min(8, gpus))
        return chosen, f"{chosen} ranks per node (one per GPU, at most 8)"
    if backend == "sim":
        return 8, "8 ranks (the modelled world; --nproc to change)"
    return 2, "2 ranks on CPU (gloo; --nproc to change)"


def _build_grid(sets, grid_option, topology_option, allow_unsafe, backend, nccl_version):
    spec = gridlib.GridSpec()
    if grid_option:
        spec = spec.merged(gridlib.resolve_grid_option(grid_option))
    if sets:
        spec = spec.merged(gridlib.spec_from_sets(list(sets)))
    if topology_option == "auto":
        topology, note = gridlib.detect_topology()
        if topology is None and backend == "sim":
            topology, note = SIM_DEFAULT_TOPOLOGY, (f"sim: modelled topology '{SIM_DEFAULT_TOPOLOGY}' "
                                                    "(none detected; --topology to change)")
    elif topology_option == "none":
        topology, note = None, "--topology none: nothing pruned by topology"
    else:
        topology, note = topology_option, f"topology '{topology_option}' (--topology)"
    if backend == "sim" and topology is None:
        raise NcclTuneError("--backend sim needs a topology to model: pass --topology "
                            f"({', '.join(costmodel.TOPOLOGIES)})")
    return gridlib.build_grid(spec, topology, allow_unsafe, nccl_version, note), spec


def _refuse_unknown_names(spec, allow_unknown: bool) -> None:
    """NcclTuneError for a variable neither the catalogue nor the installed libnccl knows
    (a typo such as NCCL_PROTOO would be measured as a cell NCCL ignores), with lint's
    did-you-mean (--allow-unknown keeps it), or for a value NCCL would reject: the
    vocabulary's rule (nccl_tune.live.envcheck), as `--set` is parsed with."""
    gridlib.check_spec(spec, allow_unknown)


def _check_runnable(backend: str, mode: str | None, verify_effective: bool | None) -> None:
    """Refuse (exit 2, before any launch) what no rank could run on this backend: the
    microbench's own rule (microbench.options.check_backend_mode). sim models anything."""
    if backend == "sim":
        return
    from microbench.options import check_backend_mode

    # nccl without GPUs is refused below with the GPU count; here: mode and log checks.
    check_backend_mode(backend, mode, verify_effective, cuda=backend == "nccl" or gpu_count() > 0)


def _measurements(g, spec, options, rounds) -> dict:
    """Planned measurements of each strategy (budget units: cell x size x round at full iters)."""
    n_cells = sum(1 for c in g.cells if c.env)
    out = {}
    for name in search.STRATEGIES:
        if name == "descent" and not spec.axes:
            continue
        out[name] = round(search.estimate_cost(name, n_cells, len(options.sizes), rounds,
                                               options.full_iters, axes=spec.axes), 1)
    return out


def _plan_dict(g, spec, options, isolation, rounds, launcher, notes, out, strategy, budget) -> dict:
    groups = gridlib.group_cells(g.cells, isolation)
    n_cells = sum(1 for c in g.cells if c.env)
    rungs = ([r.__dict__ for r in search.plan_halving(n_cells, options.full_iters, rounds)]
             if strategy == "halving" else None)
    exhaustive_launches = sweeplib.count_launches(g.cells, rounds, isolation)
    if strategy == "halving":  # at most one launch per process group per rung and round
        per_batch = len(groups)
        launches = sum(r["rounds"] * min(per_batch, r["cells"] + 1) for r in rungs)
    elif strategy == "descent":
        launches = None  # data-dependent: each probe batch is grouped by process scope
    else:
        launches = exhaustive_launches
    return {
        "search": strategy, "budget": budget, "measurements": _measurements(g, spec, options, rounds),
        "halving_rungs": rungs,
        "backend": options.backend, "simulated": options.backend == "sim", "out": out,
        "sizes": list(options.sizes), "op": options.op, "rounds": rounds, "isolation": isolation,
        "launcher": launcher.describe() if launcher else None, "topology": g.topology,
        "cells": [{"cell": c.id, "env": c.env, "label": c.label, "notes": list(c.notes)}
                  for c in g.cells],
        "dropped": [{"cell": d.id, "env": d.env, "label": d.label, "kind": d.kind,
                     "reason": d.reason} for d in g.dropped],
        "groups": [{"process_env": grp.process_env, "no_cache": list(grp.no_cache),
                    "launch_env": grp.launch_env, "cells": [c.id for c in grp.cells]}
                   for grp in groups],
        "launches": launches, "launches_exhaustive": exhaustive_launches,
        "launches_by_isolation": sweeplib.launches_by_isolation(g.cells, rounds),
        "estimate_s": round(sweeplib.estimate_seconds(g.cells, rounds, isolation, options), 1),
        "notes": notes,
    }


def _scope(plan: dict) -> str:
    """What will run, in words: cells, rounds or rungs, process groups, launches."""
    cells, rounds, groups = len(plan["cells"]), plan["rounds"], len(plan["groups"])
    if plan["search"] == "halving":
        rungs = plan["halving_rungs"]
        return (f"{cells} cells, search halving in {len(rungs)} rungs (final: {rungs[-1]['cells']} "
                f"cells x {rounds} rounds), {groups} process groups, at most {plan['launches']} launches")
    if plan["search"] == "descent":
        return (f"{cells} cells, search descent ({rounds} final rounds), {groups} process groups, "
                "launches depend on the data (each batch grouped by process scope)")
    return f"{cells} cells x {rounds} rounds, {groups} process groups, {plan['launches']} launches"


def _print_launches(plan: dict) -> None:
    """Launches under each isolation, and what each launch of the chosen one sets itself."""
    click.echo(f"\nLaunches for {plan['rounds']} round(s) under each isolation "
               "(exhaustive, no failures or re-runs):")
    for name, count in plan["launches_by_isolation"].items():
        mark = "  <- --isolation" if name == plan["isolation"] else ""
        click.echo(f"  {name:<8} {count:6d}{mark}")
    if plan["isolation"] == "nocache":
        for index, grp in enumerate(plan["groups"], start=1):
            shown = " ".join(f"{k}={v}" for k, v in grp["launch_env"].items()) or "(nothing)"
            click.echo(f"  g{index}: {len(grp['cells'])} cells, launch sets {shown}")


def _print_plan(plan: dict) -> None:
    click.echo(f"Plan: {_scope(plan)} "
               f"(isolation {plan['isolation']}), sizes {', '.join(map(str, plan['sizes']))} B, "
               f"{plan['op']}, backend {plan['backend']}"
               + (" (simulated)" if plan["simulated"] else ""))
    for note in plan["notes"]:
        click.echo(f"  note: {note}")
    group_of = {cell: f"g{index}" for index, grp in enumerate(plan["groups"], start=1)
                for cell in grp["cells"]}
    rows = [[group_of.get(c["cell"], "-"), c["cell"], c["label"], "; ".join(c["notes"])]
            for c in plan["cells"]]
    click.echo(tabulate(rows, headers=["launch", "cell", "settings", "notes"]))
    _print_launches(plan)
    dropped = plan["dropped"]
    if dropped and len(dropped) <= MAX_DROPPED_LISTED:
        click.echo(f"\nDropped before running ({len(dropped)}):")
        click.echo(tabulate([[d["label"], d["kind"], d["reason"]] for d in dropped],
                            headers=["settings", "why", "reason"]))
    elif dropped:
        by_reason: dict[str, list] = {}
        for d in dropped:
            by_reason.setdefault(d["reason"], []).append(d)
        click.echo(f"\nDropped before running ({len(dropped)}, by reason; --json lists every cell):")
        for reason, cells in sorted(by_reason.items(), key=lambda item: -len(item[1])):
            click.echo(f"  {len(cells):4d} x {reason}")
    click.echo("\nMeasurements each strategy would spend (one = a cell at one size for one round "
               "at full iterations; descent is an upper estimate):")
    full = plan["measurements"].get("exhaustive") or 1
    for name, spend in plan["measurements"].items():
        mark = "  <- --search" if name == plan["search"] else ""
        click.echo(f"  {name:<10} {spend:8.1f}  ({100 * spend / full:.0f}% of exhaustive){mark}")
    if plan["halving_rungs"]:
        click.echo("  halving rungs: " + ", ".join(
            f"{r['cells']} cells x {r['iters']} iters x {r['rounds']} round(s)"
            + (" (final)" if r["final"] else "") for r in plan["halving_rungs"]))
    if plan["budget"] is not None:
        click.echo(f"  --budget {plan['budget']:g}: the search stops before a batch that would exceed it")
    minutes = plan["estimate_s"] / 60
    share = plan["measurements"].get(plan["search"], full) / full
    scaled = "" if plan["search"] == "exhaustive" else (
        f"; {plan['search']} measures about {100 * share:.0f}% of that")
    click.echo(f"\nEstimated time: about {minutes:.1f} min exhaustive{scaled} (rough: launch "
               "start-up, communicator creation and iterations; failures and re-runs extra)")


@click.command("sweep")
@click.option("--set", "sets", multiple=True, metavar="NAME=V1,V2", type=gridlib.SetOption(),
              help="An axis of the grid; 'default' leaves the variable unset. Repeatable. "
                   "Use '|' between values that hold commas.")
@click.option("--grid", "grid_option", metavar="decode|FILE.toml",
              type=vocab.InputFile(names=gridlib.BUILTIN_GRIDS.__contains__,
                                   missing="neither a file nor a built-in grid (decode)"),
              help="A TOML grid file ([grid] axes, [[cells]]) or the built-in 'decode' grid.")
@click.option("--topology", "topology_option", default="auto", show_default=True,
              type=click.Choice(["auto", "none", *costmodel.TOPOLOGIES]),
              help="Machine kind for pruning (NVLS without NVSwitch, LL128 on PCIe).")
@click.option("--allow-unsafe", is_flag=True, help="Keep cells that force LL128 on PCIe.")
@click.option("--allow-unknown", is_flag=True, is_eager=True,
              help="Keep NCCL_* names neither the catalogue nor the installed libnccl knows.")
@click.option("--sizes", type=vocab.ByteSizes(), help="Message sizes: bytes or K/M/G, comma list.")
@click.option("--tokens", type=vocab.CountList(vocab.MAX_TOKENS),
              help="Decode token counts (sizes = tokens x hidden x dtype).")
@click.option("--hidden", type=vocab.Count(1, max=vocab.MAX_HIDDEN), help="Hidden size for --tokens [7168].")
@click.option("--dtype", default="bf16", show_default=True,
              type=click.Choice([*DTYPES, *DTYPE_ALIASES], case_sensitive=False))
@click.option("--iters", type=vocab.Count(1, max=vocab.MAX_ITERS), help="Timed iterations per size.")
@click.option("--warmup", type=vocab.Count(0, max=vocab.MAX_ITERS), help="Warm-up iterations per size.")
@click.option("--mode", type=click.Choice(["graph", "eager"]), help="Timing mode (CUDA).")
@click.option("--graph-ops", type=vocab.Count(1, max=vocab.MAX_ITERS),
              help="Collectives captured per CUDA graph replay (graph mode) [microbench: 10].")
@click.option("--op", default="allreduce", show_default=True,
              type=click.Choice(["allreduce", "reduce_scatter", "all_gather"]))
@click.option("--verify-effective/--no-verify-effective", default=None,
              help="Confirm from NCCL's log what ran (the microbench's default: on with NCCL).")
@click.option("--op-timeout", type=vocab.Finite(0, max=vocab.MAX_SECONDS, min_open=True),
              help="The microbench's own collective timeout (s).")
@click.option("--label", help="Free text stored in every record.")
@click.option("--backend", default="auto", show_default=True,
              type=click.Choice(["auto", *sweeplib.BACKENDS]),
              help="auto: nccl with 2+ GPUs, else gloo. sim: draws from the cost model.")
@click.option("--sim-landscape", default="nccl", show_default=True,
              type=click.Choice(["nccl", "perturbed", "flat"]),
              help="sim only: the model as is, with perturbed true parameters, or flat.")
@click.option("--model", "model_path", type=vocab.InputFile(),
              help="sim only: draw from a `model fit` file (constants fitted to one machine).")
@click.option("--isolation", default="auto", show_default=True,
              type=click.Choice(sweeplib.ISOLATION_CHOICES),
              help="process: one launch per cell. group: one per combination of process-scoped "
                   "values. nocache: NCCL_NO_CACHE (NCCL 2.29.7+) lets cached variables vary per "
                   "communicator, one launch per combination of what stays process-wide. auto: "
                   "nocache when the NCCL planned for is new enough, else group.")
@click.option("--nccl-version", "nccl_version_option", metavar="X.Y.Z",
              help="Plan for this NCCL version (another machine) instead of the libnccl found here.")
@click.option("--rounds", default=1, show_default=True, type=vocab.Count(1, max=vocab.MAX_ITERS),
              help="Passes over the grid (final rung for halving/descent), each in a fresh "
                   "random order with the baseline.")
@click.option("--search", "strategy", default="exhaustive", show_default=True,
              type=click.Choice(search.STRATEGIES),
              help="exhaustive: " + search.STRATEGY_HELP["exhaustive"] + ". halving: "
                   + search.STRATEGY_HELP["halving"] + ". descent: " + search.STRATEGY_HELP["descent"]
                   + ". --dry-run shows what each would spend.")
@click.option("--budget", type=vocab.Finite(0, max=vocab.MAX_BUDGET, min_open=True),
              help="Cap on measurements (one = a cell at one size for one round at full "
                   "iterations; shorter ones count in proportion).")
@click.option("--seed", default=0, show_default=True, type=vocab.Count(0, max=vocab.MAX_SEED),
              help="Seed of the round orders.")
@click.option("--nproc", type=vocab.Count(1, max=vocab.MAX_RANKS), help="Ranks per node [8 with 8 GPUs; 2 on CPU].")
@click.option("--nnodes", default=1, show_default=True, type=vocab.Count(1, max=vocab.MAX_RANKS))
@click.option("--node-rank", default=0, show_default=True, type=vocab.Count(0, max=vocab.MAX_RANKS - 1))
@click.option("--rdzv-endpoint", metavar="HOST:PORT", help="Node 0's address (multi-node).")
@click.option("--launcher", "template", metavar="TEMPLATE",
              help="Command template run without a shell; {module} {args} {env} {nproc} {nnodes} "
                   "become argv words. It must start torchrun-style ranks, e.g. 'srun --ntasks-per-node 1 "
                   "python -m torch.distributed.run --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
                   "--rdzv-endpoint node0:29500 -m {module} {args}'.")
@click.option("--keep-env", multiple=True, metavar="NCCL_NAME",
              type=envcheck.Name(also=sweeplib.CONTROLLED_PREFIXES[1:]),
              help="An inherited NCCL_* or TORCH_NCCL_* variable to keep in every cell (e.g. "
                   "NCCL_SOCKET_IFNAME); the others are removed from every launch.")
@click.option("--timeout", type=vocab.Finite(1, max=vocab.MAX_SECONDS),
              help="Seconds per launch [auto: 120 + 30 per cell in the launch].")
@click.option("--out", type=vocab.OutputFile(vocab.OutputKind.RESULTS),
              help="Results file (JSON Lines); required unless --dry-run.")
@click.option("--resume/--no-resume", default=None,
              help="Skip (cell, round) pairs already in --out [default when --out exists].")
@click.option("--dry-run", is_flag=True, help="Print the plan and an estimate; run nothing.")
@click.option("--module", default=sweeplib.MODULE, hidden=True,
              help="The module every rank runs (tests and custom measuring modules).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan or summary as JSON.")
def sweep(sets, grid_option, topology_option, allow_unsafe, allow_unknown, sizes, tokens, hidden, dtype, iters,
          warmup, mode, graph_ops, op, verify_effective, op_timeout, label, backend, sim_landscape, model_path, isolation,
          nccl_version_option, rounds,
          strategy, budget, seed, nproc, nnodes, node_rank, rdzv_endpoint, template, keep_env,
          timeout, out, resume, dry_run, module, as_json):
    """Measure a grid of NCCL settings: baseline always included, pruned, grouped, in rounds.

    Cells sharing their process-scoped settings are measured in one launch, each with a
    fresh communicator (with --isolation nocache, NCCL_NO_CACHE lets cached variables vary
    per communicator too); on NCCL a cell not confirmed by NCCL's log is re-run alone.
    """
    sim_model = None
    if model_path:
        from nccl_tune.model import calibrate

        if backend != "sim":
            raise NcclTuneError("--model needs --backend sim (it changes what the model draws)")
        sim_model = calibrate.load(model_path)
        if topology_option == "auto":
            topology_option = sim_model.topology
        elif topology_option != sim_model.topology:
            raise NcclTuneError(f"--topology {topology_option} differs from the model file's "
                                f"'{sim_model.topology}'", path=model_path)
        nproc = nproc or sim_model.nranks  # the fitted machine's world size
    gpus = gpu_count()
    backend, backend_note = _choose_backend(backend, gpus)
    nproc, nproc_note = _choose_nproc(nproc, backend, gpus)
    for name in keep_env:
        if not name.startswith(sweeplib.CONTROLLED_PREFIXES):
            raise NcclTuneError(f"--keep-env: '{name}' is not an NCCL_* or TORCH_NCCL_* variable")
    if not sets and not grid_option:
        raise NcclTuneError("no grid: give --set NAME=V1,V2 (repeatable) or --grid decode|FILE.toml")
    dtype = sweeplib.canonical_dtype(dtype)
    _check_runnable(backend, mode, verify_effective)
    options = sweeplib.MeasureOptions(
        backend=backend, sizes=tuple(sweeplib.resolve_sizes(sizes, tokens, hidden, dtype)),
        dtype=dtype, op=op, iters=iters, warmup=warmup, mode=mode, graph_ops=graph_ops,
        verify_effective=verify_effective, op_timeout=op_timeout, label=label)
    nccl_version, version_source = sweeplib.planned_nccl_version(backend, nccl_version_option)
    g, spec = _build_grid(sets, grid_option, topology_option, allow_unsafe, backend, nccl_version)
    _refuse_unknown_names(spec, allow_unknown)
    if strategy == "descent" and not spec.axes:
        raise NcclTuneError("--search descent needs grid axes (--set NAME=V1,V2 or a grid file's "
                            "[grid] table), not only explicit [[cells]]")
    notes = [backend_note + "; " + nproc_note] + g.notes
    chosen_isolation = isolation
    isolation, isolation_notes = sweeplib.resolve_isolation(isolation, backend, nccl_version,
                                                            verify_effective, version_source)
    notes += isolation_notes
    if backend == "gloo":
        notes.append(sweeplib.GLOO_NOTE)
    if backend == "nccl" and gpus < launcher_gpus_needed(nproc, template) and not dry_run:
        raise NcclTuneError(f"--backend nccl: {gpus} GPU(s) visible here for {nproc} ranks per node; "
                            "NCCL needs one GPU per rank (--nproc, --backend gloo|sim, or a "
                            "--launcher template for a scheduler)")
    if backend == "nccl" and gpus < launcher_gpus_needed(nproc, template):
        notes.append(f"warning: {gpus} GPU(s) visible here for {nproc} ranks per node: NCCL needs "
                     "one GPU per rank, so launches on this host will fail")
    if backend == "sim":
        notes.append("simulated: every measurement is drawn from the cost model, nothing is measured")
    launcher = launch.Launcher(nproc=nproc, nnodes=nnodes, node_rank=node_rank,
                               rdzv_endpoint=rdzv_endpoint, template=template,
                               simulated=backend == "sim")
    if backend != "sim":
        _, removed = sweeplib.launch_environment({}, tuple(keep_env))
        if removed:
            notes.append("inherited NCCL_* removed from every launch (the baseline sets none): "
                         + ", ".join(removed))
        conf = sweeplib.conf_files(keep=tuple(keep_env))
        for path, names in conf:
            notes.append(f"conf file {path} still supplies {', '.join(names) or 'nothing'} "
                         "to every cell, the baseline included")
        shared = isolation in ("group", "nocache")  # cells share a process
        no_cache = gridlib.no_cache_names(g.cells) if isolation == "nocache" else ()
        clashes = sweeplib.conf_cell_conflicts(conf, g.cells, no_cache) if backend == "nccl" and shared else []
        if clashes:
            what = ", ".join(f"{name} ({path})" for path, name in clashes)
            if chosen_isolation in ("group", "nocache"):
                raise NcclTuneError(f"--isolation {chosen_isolation}: the conf file value(s) {what} would be "
                                    "lost after the first cell that sets them (NCCL writes them into "
                                    "the C environment); use --isolation process or remove them")
            isolation = "process"
            notes.append(f"isolation process: conf file value(s) {what} are set by some cells; in "
                         "a shared process they would be lost after the first such cell")
        if not launcher.writes_records:
            notes.append(f"node {node_rank}: this node launches its ranks; node 0 writes the records")
    plan = _plan_dict(g, spec, options, isolation, rounds, launcher, notes, out, strategy, budget)
    if dry_run:
        if as_json:
            from nccl_tune.cli import emit_json
            emit_json(plan)
        else:
            _print_plan(plan)
        return
    if not out:
        raise NcclTuneError("--out FILE is required (results are appended there, one record per line)")
    inputs = [model_path] + ([grid_option] if grid_option and os.path.exists(grid_option) else [])
    fileio.check_output(out, kind=fileio.OutputKind.RESULTS, inputs=inputs, option="--out")
    if os.path.exists(out) and resume is False:
        raise NcclTuneError(f"--out {out} exists: pass --resume to continue it, or choose another file")
    # One writer for the whole run (fileio); a follower node of a multi-node sweep writes
    # nothing (node 0 does) and may share the file's folder with it.
    lock = fileio.ResultsLock(out, option="--out") if launcher_writes(launcher, options) else None
    with lock or contextlib.nullcontext():
        _run(plan, g, spec, options, launcher, isolation, rounds, seed, timeout, sim_landscape,
             keep_env, out, module, as_json, strategy, budget, sim_model)


def _planned_requests(plan: dict, n_cells: int, rounds: int) -> int | None:
    """Cell measurements (cell x round) the strategy plans, baseline included; None if unknown."""
    if plan["search"] == "exhaustive":
        return (n_cells + 1) * rounds
    if plan["search"] == "halving":
        return sum((r["cells"] + 1) * r["rounds"] for r in plan["halving_rungs"])
    return None  # descent: data-dependent


def _run(plan, g, spec, options, launcher, isolation, rounds, seed, timeout, sim_landscape, keep_env,
         out, module, as_json, strategy, budget, sim_model=None):
    from nccl_tune.measure import simbackend

    warnings: list[str] = []
    landscape = (simbackend.make_landscape(sim_landscape, g.topology, seed, model=sim_model)
                 if options.backend == "sim" else None)
    engine = sweeplib.SweepEngine(
        options, launcher, out, isolation=isolation, timeout=timeout if timeout else 120.0,
        timeout_per_cell=0.0 if timeout else 30.0, landscape=landscape, keep_env=tuple(keep_env),
        module=module, warn=warnings.append, strategy=strategy, grid=g.cells)
    done_before = len(engine.recorded_requests())
    planned = _planned_requests(plan, sum(1 for c in g.cells if c.env), rounds)
    todo = max(0, planned - done_before) if planned is not None else None
    if not as_json:
        _print_plan_short(plan, done_before)
    for message in warnings:
        click.echo(f"warning: {message}", err=True)
    interrupted = False
    progress = _Progress(todo, sys.stderr.isatty() and not as_json)
    engine.on_cell = progress.update
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    ledger = search.Ledger(len(options.sizes), options.full_iters, budget)
    outcome = None
    try:
        outcome = search.run_strategy(strategy, g.cells, engine.measure, ledger, rounds, seed,
                                      engine.isolation, axes=spec.axes)
    except (KeyboardInterrupt, sweeplib.SweepInterrupted):
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.close()
    summary = {**{k: plan[k] for k in ("backend", "simulated", "out", "rounds", "isolation")},
               "run_id": engine.run_id, "cells": len(g.cells), "dropped": len(g.dropped),
               "already_recorded": done_before, "interrupted": interrupted,
               **engine.stats.to_dict(), "notes": plan["notes"] + engine.stats.notes,
               "search": ({**outcome.to_dict(), "unfinished_env": {
                   c: next(cell.env for cell in g.cells if cell.id == c) for c in outcome.unfinished}}
                          if outcome else {"strategy": strategy}),
               "measurements_spent": round(ledger.spent, 1), "budget": budget}
    if as_json:
        from nccl_tune.cli import emit_json
        emit_json(summary)
    else:
        _print_summary(summary)
    if interrupted:
        raise Interrupted(f"sweep interrupted: every finished cell is in {out}",
                          resume=_resume_command())
    failure = sweeplib.run_failure(outcome.records) if outcome and launcher_writes(launcher, options) else None
    if failure:
        raise RunFailed(f"sweep: {failure}; the records are in {out} (nccl-tune report {out} "
                        "lists the errors)")


def _resume_command() -> str:
    """The command that continues this sweep: the same one (resuming is the default when
    --out exists), with --no-resume turned into --resume."""
    from nccl_tune.cli import command_line

    return command_line().replace(" --no-resume", " --resume")


def launcher_writes(launcher, options) -> bool:
    """True when this node writes the records (node 0, or the sim backend)."""
    return options.backend == "sim" or launcher is None or launcher.writes_records


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class _Progress:
    """Cells done, failures and ETA: a bar on a terminal, one line per cell otherwise."""

    def __init__(self, total: int | None, tty: bool):
        # total None: a strategy whose measurements depend on the data (descent)
        self.total, self.done, self.failed = total, 0, 0
        self.start = time.monotonic()
        self.bar = None
        if tty and total:
            self.bar = click.progressbar(length=total, label="measuring", show_eta=True,
                                         file=sys.stderr, item_show_func=lambda _: f"{self.failed} failed")
            self.bar.__enter__()

    def update(self, request, status: str) -> None:
        """One cell (for one round) finished with `status`."""
        self.done += 1
        self.failed += status != "ok"
        if self.bar is not None:
            self.bar.update(1)
            return
        elapsed = time.monotonic() - self.start
        if self.total is None:
            click.echo(f"[{self.done}] round {request.round} {request.cell.label}: {status} "
                       f"({self.failed} failed, {elapsed:.0f} s)", err=True)
            return
        eta = elapsed / self.done * max(0, self.total - self.done)
        click.echo(f"[{self.done}/{self.total}] round {request.round} {request.cell.label}: {status} "
                   f"({self.failed} failed, ETA {eta:.0f} s)", err=True)

    def close(self) -> None:
        """End the bar (a no-op for line output)."""
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _print_plan_short(plan: dict, done_before: int) -> None:
    click.echo(f"Sweep: {_scope(plan)}, {len(plan['dropped'])} dropped "
               f"(isolation {plan['isolation']}), backend {plan['backend']}"
               + (" (simulated)" if plan["simulated"] else "") + f" -> {plan['out']}")
    for note in plan["notes"]:
        click.echo(f"  note: {note}")
    for d in plan["dropped"][:MAX_DROPPED_LISTED]:
        click.echo(f"  dropped: {d['label']}: {d['reason']}")
    if len(plan["dropped"]) > MAX_DROPPED_LISTED:
        click.echo(f"  dropped: {len(plan['dropped']) - MAX_DROPPED_LISTED} more "
                   "(--dry-run lists them by reason)")
    if done_before:
        click.echo(f"  resuming: {done_before} (cell, round) pairs already recorded are skipped")


def _print_search(s: dict) -> None:
    found = s["search"]
    spent = f"{s['measurements_spent']:g} measurements" + (
        f" of a {s['budget']:g} budget" if s.get("budget") is not None else "")
    click.echo(f"search {found['strategy']}: {spent}")
    if found.get("strategy") != "exhaustive" and len(found.get("rungs") or []) > 1:
        click.echo("  rungs: " + "; ".join(
            f"{r['rung']}: {r['cells']} cells x {r['iters']} iters x {r['rounds']} round(s)"
            + (" final" if r["final"] else "") for r in found["rungs"]))
    if found.get("stopped"):
        click.echo(f"  stopped early: {found['stopped']}")
    if found.get("unfinished"):
        labels = [" ".join(f"{k[5:]}={v}" for k, v in found["unfinished_env"][c].items())
                  for c in found["unfinished"][:MAX_UNFINISHED_LISTED]]
        more = len(found["unfinished"]) - len(labels)
        click.echo(f"  never finished ({len(found['unfinished'])} cells; --json lists all): "
                   + "; ".join(labels) + (f"; ... and {more} more" if more > 0 else ""))
    if found.get("pruned"):
        click.echo(f"  pruned before the final rung: {len(found['pruned'])} cells "
                   "(kept in the results as final: false; report lists them apart)")
    if found.get("best"):
        label = " ".join(f"{k}={v}" for k, v in (found["best_env"] or {}).items())
        if found["score_ci"]:
            lo, hi = found["score_ci"]
            interval = f"interval {lo:.3f}-{hi:.3f}, Bonferroni over the finalists"
            verdict = ("faster than the baseline" if found["winner"]
                       else "not significantly faster than the baseline")
        else:
            interval = (f"too few rounds ({s['rounds']}) for an interval: --rounds "
                        f"{stats.MIN_ROUNDS} or more")
            verdict = "no verdict"
        click.echo(f"  best of {len(found['finalists'])} finalists: {found['best']} {label}: "
                   f"{found['best_score']:.3f} x baseline latency ({interval}): {verdict}"
                   + (" (simulated)" if s["simulated"] else ""))


def _print_summary(s: dict) -> None:
    failed = ", ".join(f"{n} {status}" for status, n in sorted(s["failures"].items())) or "none"
    rows = [["cells measured", s["cells_measured"]], ["cells already recorded", s["already_recorded"]],
            ["launches", s["launches"]], ["relaunches after a failure", s["relaunches"]],
            ["re-runs alone (unconfirmed)", s["reruns"]],
            ["failed cells measured again (resume)", s.get("retried", 0)],
            ["records written", s["records_written"]],
            ["failed cells", failed], ["wall time", f"{s['wall_s']:.1f} s"]]
    click.echo(tabulate(rows, tablefmt="plain"))
    for note in s["notes"]:
        if note.startswith(("NCCL's log confirmed no cell", "NCCL's log showed no cached")):
            click.echo(f"note: {note}")
    _print_search(s)
    if s["interrupted"]:
        click.echo(f"interrupted: the running launch was killed; every finished cell is in {s['out']}; "
                   "run the same command again to resume")
    else:
        click.echo(f"results: {s['out']}" + (" (simulated)" if s["simulated"] else "")
                   + f"; next: nccl-tune report {s['out']}")
