"""`nccl-tune bench`: run `torchrun -m microbench.allreduce` for people who don't want to type it.

Every option after bench's own (--nproc, --nnodes, --master-port, --dry-run) goes to
microbench.allreduce unchanged; they are checked here first (same parser, no torch
import), so a bad option is one line and exit 2 before anything starts. The launch is
an argv list (no shell). Output streams through; when the run fails, the last line is
the microbench's own one-line reason (rank and cause), not torchrun's traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click

from nccl_tune.errors import NcclTuneError

_REASON_PREFIX = "microbench.allreduce: "


def torchrun_argv(nproc: int, nnodes: int, master_port: int | None, args: list[str]) -> list[str]:
    """The torchrun command line (this interpreter's torch.distributed.run)."""
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1 and master_port is None:
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
    return text[text.find("options:"):] if "options:" in text else text


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
            text = line[len(_REASON_PREFIX):].strip()
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
    parts = [f"rank {r} exited with code {c} without a message" for r, c in sorted(exits.items())
             if r not in reasons and c != 0]
    parts += [text for _, text in sorted(reasons.items())]
    return "; ".join(parts) or None


def _stream(argv: list[str]) -> tuple[int, str | None]:
    """Run `argv`: stdout passes through; stderr too, less torchrun's own Python traceback."""
    kept: list[str] = []
    # torchrun sets OMP_NUM_THREADS=1 itself when unset, with a banner; same value, no banner.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    in_traceback = False
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, bufsize=1, env=env) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            kept.append(line)
            if line.startswith("Traceback (most recent call last):"):
                in_traceback = True
            if not in_traceback:
                sys.stderr.write(line)
            elif "ChildFailedError" in line:
                in_traceback = False
        code = proc.wait()
    return code, failure_summary(kept) if code else None


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes (GPUs) per node.")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes (multi-node needs torchrun's rendezvous settings in the environment).")
@click.option("--master-port", type=click.IntRange(1, 65535), default=None,
              help="Rendezvous port (default: --standalone on one node).")
@click.option("--dry-run", is_flag=True, help="Print the torchrun command and exit.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(nproc: int, nnodes: int, master_port: int | None, dry_run: bool, args: tuple[str, ...]) -> None:
    """Measure small-message collective latency: torchrun -m microbench.allreduce.

    Example: nccl-tune bench --nproc 8 --tokens 1,2,4 --out results.jsonl
    """
    from microbench.options import parse_args

    parse_args(list(args))  # raises NcclTuneError: one line, exit 2
    argv = torchrun_argv(nproc, nnodes, master_port, list(args))
    if dry_run:
        click.echo(" ".join(argv))
        return
    try:
        code, reason = _stream(argv)
    except OSError as exc:
        raise NcclTuneError(f"cannot start torchrun: {exc.strerror}") from None
    if code != 0:
        raise click.ClickException(
            f"torchrun exited with code {code}" + (f": {reason}" if reason else ""))


bench.help = (bench.help or "") + "\n\n\b\nOptions passed to microbench.allreduce:\n" + "\n".join(
    "  " + line for line in _microbench_help().splitlines()[1:] if "show this help" not in line)
