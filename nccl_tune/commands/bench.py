"""`nccl-tune bench`: run `torchrun -m microbench.allreduce` for people who don't want to type it.

Every option after bench's own (--nproc, --nnodes, --node-rank, --rdzv-endpoint,
--master-port, --dry-run) goes to microbench.allreduce unchanged; they are checked here
first (same parser), and the backend and mode are resolved here too (torch is imported
for that, as the ranks would), so a bad option or a mode this machine cannot run is one
line and exit 2 before anything starts. The launch is an argv list (no shell). Output
streams through; when the run fails, the last line is the microbench's own one-line
reason (rank and cause), not torchrun's traceback; when every rank refused its options
(exit 2), bench exits 2 with their reason.
"""

from __future__ import annotations

import click

from nccl_tune import vocab
from nccl_tune.errors import NcclTuneError, RunFailed
from nccl_tune.measure.bench_launch import stream, torchrun_argv


def _microbench_help() -> str:
    from microbench.options import build_parser

    text = build_parser().format_help()
    # Drop argparse's usage/description lines; keep the option list.
    return text[text.find("options:") :] if "options:" in text else text


def _machine() -> tuple[bool, bool, int]:
    """(CUDA available, torch built with NCCL, GPUs visible), as the ranks will see them."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    return cuda, dist.is_nccl_available(), torch.cuda.device_count() if cuda else 0


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": True,
        "help_option_names": ["-h", "--help"],
    }
)
@click.option(
    "--nproc",
    type=vocab.Count(1, max=vocab.MAX_RANKS),
    default=None,
    help="Processes (GPUs) per node [one per GPU with NCCL; 2 on CPU, as sweep and validate].",
)
@click.option(
    "--nnodes",
    type=vocab.Count(1, max=vocab.MAX_RANKS),
    default=1,
    show_default=True,
    help="Nodes; with more than one, run the same command on every node with its "
    "--node-rank and node 0's --rdzv-endpoint.",
)
@click.option(
    "--node-rank",
    type=vocab.Count(0, max=vocab.MAX_RANKS - 1),
    default=0,
    show_default=True,
    help="This node's rank (multi-node); node 0 hosts rank 0, which writes --out.",
)
@click.option("--rdzv-endpoint", metavar="HOST:PORT", help="Node 0's address for torchrun's rendezvous (multi-node).")
@click.option(
    "--master-port",
    type=vocab.Count(1, max=65535),
    default=None,
    help="Rendezvous port on one node (default: --standalone).",
)
@click.option("--dry-run", is_flag=True, help="Print the torchrun command and exit.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(
    nproc: int | None,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str | None,
    master_port: int | None,
    dry_run: bool,
    args: tuple[str, ...],
) -> None:
    """Measure small-message collective latency: torchrun -m microbench.allreduce.

    Example: nccl-tune bench --nproc 8 --tokens 1,2,4 --out results.jsonl
    """
    from microbench.options import WORLD_ONE_NOTE, parse_args, preflight
    from nccl_tune.measure.launch import Launcher

    options = parse_args(list(args))  # raises NcclTuneError: one line, exit 2
    if rdzv_endpoint is not None and master_port is not None:
        raise click.UsageError("--master-port is for one node; with --rdzv-endpoint give HOST:PORT there")
    # What every rank would refuse (backend, mode, --verify-effective, --out, --plan) is
    # said once, here, before torchrun starts (microbench.options.preflight is the rule).
    cuda, nccl, gpus = _machine()
    backend, _, _ = preflight(options, cuda=cuda, nccl=nccl, writes_out=node_rank == 0)
    if nproc is None:
        nproc = max(1, gpus) if backend == "nccl" else 2
    Launcher(nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint)  # checks
    argv = torchrun_argv(nproc, nnodes, master_port, list(args), node_rank, rdzv_endpoint)
    if dry_run:
        if nproc * nnodes == 1:  # a run says it itself (rank 0), as under plain torchrun
            click.echo(f"note: {WORLD_ONE_NOTE}", err=True)
        click.echo(" ".join(argv))
        return
    try:
        code, reason, refused = stream(argv)
    except OSError as exc:
        raise NcclTuneError(f"cannot start torchrun: {exc.strerror}") from None
    if refused:
        raise NcclTuneError(reason)
    if code != 0:
        raise RunFailed(f"torchrun exited with code {code}" + (f": {reason}" if reason else ""))


bench.help = (
    (bench.help or "")
    + "\n\n\b\nOptions passed to microbench.allreduce:\n"
    + "\n".join("  " + line for line in _microbench_help().splitlines()[1:] if "show this help" not in line)
)
