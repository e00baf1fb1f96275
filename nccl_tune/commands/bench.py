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

import os
import re
import subprocess
import sys

import click

from nccl_tune import vocab
from nccl_tune.errors import NcclTuneError, RunFailed

_REASON_PREFIX = "microbench.allreduce: "


def torchrun_argv(
    nproc: int,
    nnodes: int,
    master_port: int | None,
    args: list[str],
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """The torchrun command line (this interpreter's torch.distributed.run).

    With `rdzv_endpoint` (multi-node): torchrun's static rendezvous at node 0's HOST:PORT,
    as `nccl-tune sweep` launches it, which pins global rank 0 (the one that writes
    --out) to node rank 0. Run the same command on every node with its --node-rank.
    """
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if rdzv_endpoint is not None:
        argv += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={rdzv_endpoint}",
        ]
    elif nnodes == 1 and master_port is None:
        argv.append("--standalone")
    else:
        argv.append(f"--nnodes={nnodes}")
        if master_port is not None:
            argv.append(f"--master-port={master_port}")
    return argv + ["-m", "microbench.allreduce", *args]


def _microbench_help() -> str:
    from microbench.options import build_parser

    text = build_parser().format_help()
    # Drop argparse's usage/description lines; keep the option list.
    return text[text.find("options:") :] if "options:" in text else text


_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def failure_summary(lines: list[str]) -> str | None:
    """One line from a failed run's stderr: each rank's own reason, else its exit code.

    Reasons are microbench's "microbench.allreduce: rank R: ..." lines; ranks that died
    without one are named from torchrun's failure report ("rank : R", "exitcode : C").
    """
    reasons: dict[int, str] = {}
    for line in lines:
        if line.startswith(_REASON_PREFIX):
            text = line[len(_REASON_PREFIX) :].strip()
            match = re.match(r"rank (\d+): ", text)
            key = int(match.group(1)) if match else -1
            reasons.setdefault(key, text)
    exits: dict[int, int] = {}
    rank = None
    for line in lines:
        match = _RANK_RE.match(line)
        if match:
            rank = int(match.group(1))
            continue
        match = _EXIT_RE.match(line)
        if match and rank is not None:
            exits.setdefault(rank, int(match.group(1)))
            rank = None
    parts = [
        f"rank {r} exited with code {c} without a message"
        for r, c in sorted(exits.items())
        if r not in reasons and c != 0
    ]
    parts += [text for _, text in sorted(reasons.items())]
    return "; ".join(parts) or None


def _machine() -> tuple[bool, bool, int]:
    """(CUDA available, torch built with NCCL, GPUs visible), as the ranks will see them."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    return cuda, dist.is_nccl_available(), torch.cuda.device_count() if cuda else 0


_STOPPED_BY_AGENT = (-15, -9)  # SIGTERM, then SIGKILL: torchrun stopping the other ranks


def refused_reason(lines: list[str]) -> str | None:
    """The ranks' reason when every rank refused its options before measuring: torchrun
    reports exit code 2 for each (or a rank it stopped after another had exited), else None.

    Ranks that said the same are named once: 'rank 0: error: X (ranks 1, 2 said the same)'.
    """
    exits = [int(m.group(1)) for m in map(_EXIT_RE.match, lines) if m]
    if 2 not in exits or any(code not in (2, *_STOPPED_BY_AGENT) for code in exits):
        return None
    said: dict[str, list[int]] = {}
    for line in lines:
        match = (
            re.match(r"rank (\d+): (.*)$", line[len(_REASON_PREFIX) :].strip())
            if line.startswith(_REASON_PREFIX)
            else None
        )
        if match:
            said.setdefault(match.group(2), []).append(int(match.group(1)))
    parts = []
    for text, ranks in said.items():
        ranks = sorted(set(ranks))
        others = ", ".join(map(str, ranks[1:]))
        parts.append(
            f"rank {ranks[0]}: {text}"
            + (f" (rank{'s' if len(ranks) > 2 else ''} {others} said the same)" if others else "")
        )
    return "; ".join(parts) or None


def _stream(argv: list[str]) -> tuple[int, str | None, bool]:
    """Run `argv`: stdout passes through; stderr too, less torchrun's own noise (its agent's
    log lines, its Python traceback and its failure box: bench's last line says it all).

    Returns (exit code, one-line reason or None, True when every rank refused with exit 2).
    """
    from nccl_tune.measure.launch import kill_tree

    kept: list[str] = []
    # torchrun sets OMP_NUM_THREADS=1 itself when unset, with a banner; same value, no banner.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, bufsize=1, env=env) as proc:
        try:
            code = _relay(proc, kept)
        except BaseException:  # Ctrl-C, SIGTERM: stop torchrun and its ranks (their own sessions)
            kill_tree(proc)
            raise
    if not code:
        return code, None, False
    refused = refused_reason(kept)
    return code, refused or failure_summary(kept), refused is not None


def _relay(proc: subprocess.Popen, kept: list[str]) -> int:
    """Pass `proc`'s stderr through (less torchrun's noise), keeping every line in `kept`;
    returns its exit code."""
    from nccl_tune.measure.launch import AGENT_LOG_RE

    state = "normal"  # | "traceback" | "box" (the ===== failure summary)
    held: list[str] = []  # a traceback, shown at its end unless it is torchrun's own
    assert proc.stderr is not None
    for line in proc.stderr:
        kept.append(line)
        rule = line.strip().startswith("=" * 20)
        if state == "normal" and line.startswith("Traceback (most recent call last):"):
            state, held = "traceback", [line]
            continue
        if state == "normal" and rule:
            state = "box"
            continue
        if state == "normal":
            if not AGENT_LOG_RE.match(line.strip()):
                sys.stderr.write(line)
        elif state == "traceback":
            held.append(line)
            if not line[:1].isspace():  # the exception line after the indented frames
                state = "normal"
                if "ChildFailedError" not in line:  # a rank's own traceback: show it
                    sys.stderr.writelines(held)
        elif state == "box" and rule:
            state = "normal"
    return proc.wait()


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
        code, reason, refused = _stream(argv)
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
