"""`nccl-tune sweep`: measure a grid of NCCL settings, safely, in rounds, resumably.

The options build a `SweepRequest`; nccl_tune.measure.sweep_request plans it and
nccl_tune.measure.sweep_run runs it; nccl_tune.commands.sweep_render prints both.
"""

from __future__ import annotations

import click

from microbench.options import DTYPE_ALIASES, DTYPES
from nccl_tune import vocab
from nccl_tune.commands import sweep_render
from nccl_tune.commands.sweep_console import Console
from nccl_tune.errors import Interrupted, RunFailed
from nccl_tune.live import envcheck
from nccl_tune.measure import grid as gridlib
from nccl_tune.measure import search, sweep_request, sweepplan
from nccl_tune.measure.sweep_run import run_sweep
from nccl_tune.model import costmodel


@click.command("sweep")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="NAME=V1,V2",
    type=gridlib.SetOption(),
    help="An axis of the grid; 'default' leaves the variable unset. Repeatable. "
    "Use '|' between values that hold commas.",
)
@click.option(
    "--grid",
    metavar="decode|FILE.toml",
    type=vocab.InputFile(
        names=gridlib.BUILTIN_GRIDS.__contains__, missing="neither a file nor a built-in grid (decode)"
    ),
    help="A TOML grid file ([grid] axes, [[cells]]) or the built-in 'decode' grid.",
)
@click.option(
    "--topology",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "none", *costmodel.TOPOLOGIES]),
    help="Machine kind for pruning (NVLS without NVSwitch, LL128 on PCIe).",
)
@click.option("--allow-unsafe", is_flag=True, help="Keep cells that force LL128 on PCIe.")
@click.option(
    "--allow-unknown",
    is_flag=True,
    is_eager=True,
    help="Keep NCCL_* names neither the catalogue nor the installed libnccl knows.",
)
@click.option("--sizes", type=vocab.ByteSizes(), help="Message sizes: bytes or K/M/G, comma list.")
@click.option(
    "--tokens", type=vocab.CountList(vocab.MAX_TOKENS), help="Decode token counts (sizes = tokens x hidden x dtype)."
)
@click.option("--hidden", type=vocab.Count(1, max=vocab.MAX_HIDDEN), help="Hidden size for --tokens [7168].")
@click.option(
    "--dtype", default="bf16", show_default=True, type=click.Choice([*DTYPES, *DTYPE_ALIASES], case_sensitive=False)
)
@click.option("--iters", type=vocab.Count(1, max=vocab.MAX_ITERS), help="Timed iterations per size.")
@click.option("--warmup", type=vocab.Count(0, max=vocab.MAX_ITERS), help="Warm-up iterations per size.")
@click.option("--mode", type=click.Choice(["graph", "eager"]), help="Timing mode (CUDA).")
@click.option(
    "--graph-ops",
    type=vocab.Count(1, max=vocab.MAX_ITERS),
    help="Collectives captured per CUDA graph replay (graph mode) [microbench: 10].",
)
@click.option(
    "--op", default="allreduce", show_default=True, type=click.Choice(["allreduce", "reduce_scatter", "all_gather"])
)
@click.option(
    "--verify-effective/--no-verify-effective",
    default=None,
    help="Confirm from NCCL's log what ran (the microbench's default: on with NCCL).",
)
@click.option(
    "--op-timeout",
    type=vocab.Finite(0, max=vocab.MAX_SECONDS, min_open=True),
    help="The microbench's own collective timeout (s).",
)
@click.option("--label", help="Free text stored in every record.")
@click.option(
    "--backend",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", *sweepplan.BACKENDS]),
    help="auto: nccl with 2+ GPUs, else gloo. sim: draws from the cost model.",
)
@click.option(
    "--sim-landscape",
    default="nccl",
    show_default=True,
    type=click.Choice(["nccl", "perturbed", "flat"]),
    help="sim only: the model as is, with perturbed true parameters, or flat.",
)
@click.option(
    "--model", type=vocab.InputFile(), help="sim only: draw from a `model fit` file (constants fitted to one machine)."
)
@click.option(
    "--isolation",
    default="auto",
    show_default=True,
    type=click.Choice(sweepplan.ISOLATION_CHOICES),
    help="process: one launch per cell. group: one per combination of process-scoped "
    "values. nocache: NCCL_NO_CACHE (NCCL 2.29.7+) lets cached variables vary per "
    "communicator, one launch per combination of what stays process-wide. auto: "
    "nocache when the NCCL planned for is new enough, else group.",
)
@click.option(
    "--nccl-version",
    metavar="X.Y.Z",
    help="Plan for this NCCL version (another machine) instead of the libnccl found here.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=vocab.Count(1, max=vocab.MAX_ITERS),
    help="Passes over the grid (final rung for halving/descent), each in a fresh random order with the baseline.",
)
@click.option(
    "--search",
    "strategy",
    default="exhaustive",
    show_default=True,
    type=click.Choice(search.STRATEGIES),
    help="exhaustive: "
    + search.STRATEGY_HELP["exhaustive"]
    + ". halving: "
    + search.STRATEGY_HELP["halving"]
    + ". descent: "
    + search.STRATEGY_HELP["descent"]
    + ". --dry-run shows what each would spend.",
)
@click.option(
    "--budget",
    type=vocab.Finite(0, max=vocab.MAX_BUDGET, min_open=True),
    help="Cap on measurements (one = a cell at one size for one round at full "
    "iterations; shorter ones count in proportion).",
)
@click.option(
    "--seed", default=0, show_default=True, type=vocab.Count(0, max=vocab.MAX_SEED), help="Seed of the round orders."
)
@click.option("--nproc", type=vocab.Count(1, max=vocab.MAX_RANKS), help="Ranks per node [8 with 8 GPUs; 2 on CPU].")
@click.option("--nnodes", default=1, show_default=True, type=vocab.Count(1, max=vocab.MAX_RANKS))
@click.option("--node-rank", default=0, show_default=True, type=vocab.Count(0, max=vocab.MAX_RANKS - 1))
@click.option("--rdzv-endpoint", metavar="HOST:PORT", help="Node 0's address (multi-node).")
@click.option(
    "--launcher",
    "template",
    metavar="TEMPLATE",
    help="Command template run without a shell; {module} {args} {env} {nproc} {nnodes} "
    "become argv words. It must start torchrun-style ranks, e.g. 'srun --ntasks-per-node 1 "
    "python -m torch.distributed.run --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
    "--rdzv-endpoint node0:29500 -m {module} {args}'.",
)
@click.option(
    "--keep-env",
    multiple=True,
    metavar="NCCL_NAME",
    type=envcheck.Name(also=sweepplan.CONTROLLED_PREFIXES[1:]),
    help="An inherited NCCL_* or TORCH_NCCL_* variable to keep in every cell (e.g. "
    "NCCL_SOCKET_IFNAME); the others are removed from every launch.",
)
@click.option(
    "--timeout",
    type=vocab.Finite(1, max=vocab.MAX_SECONDS),
    help="Seconds per launch [auto: 120 + 30 per cell in the launch].",
)
@click.option(
    "--out",
    type=vocab.OutputFile(vocab.OutputKind.RESULTS),
    help="Results file (JSON Lines); required unless --dry-run.",
)
@click.option(
    "--resume/--no-resume", default=None, help="Skip (cell, round) pairs already in --out [default when --out exists]."
)
@click.option("--dry-run", is_flag=True, help="Print the plan and an estimate; run nothing.")
@click.option(
    "--module",
    default=sweepplan.MODULE,
    hidden=True,
    help="The module every rank runs (tests and custom measuring modules).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan or summary as JSON.")
def sweep(as_json, **options):
    """Measure a grid of NCCL settings: baseline always included, pruned, grouped, in rounds.

    Cells sharing their process-scoped settings are measured in one launch, each with a
    fresh communicator (with --isolation nocache, NCCL_NO_CACHE lets cached variables vary
    per communicator too); on NCCL a cell not confirmed by NCCL's log is re-run alone.
    """
    request = sweep_request.SweepRequest(**options)
    plan = sweep_request.plan_sweep(request)
    if request.dry_run:
        if as_json:
            from nccl_tune.cli import emit_json

            emit_json(plan.to_dict())
        else:
            sweep_render.print_plan(plan)
        return
    console = Console(plan, as_json)
    try:
        summary = run_sweep(plan, on_start=console.start, on_cell=console.cell, on_warning=console.warning)
    finally:
        console.close()
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json(summary.to_dict())
    else:
        sweep_render.print_summary(summary)
    if summary.interrupted:
        raise Interrupted(f"sweep interrupted: every finished cell is in {request.out}", resume=_resume_command())
    if summary.failure:
        raise RunFailed(
            f"sweep: {summary.failure}; the records are in {request.out} (nccl-tune "
            f"report {request.out} lists the errors)"
        )


def _resume_command() -> str:
    """The command that continues this sweep: the same one (resuming is the default when
    --out exists), with --no-resume turned into --resume."""
    from nccl_tune.cli import command_line

    return command_line().replace(" --no-resume", " --resume")
