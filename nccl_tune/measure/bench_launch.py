"""`nccl-tune bench`'s launch: the torchrun command line, its stderr relayed without
torchrun's own noise, and the one-line reason a failed run ends with (each rank's own
"microbench.allreduce: rank R: ..." line, else the exit codes torchrun reports).

Pure parsing of torchrun's output (failure_summary, refused_reason) and one process
relay (stream); the command (nccl_tune.commands.bench) decides the exit code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


def stream(argv: list[str]) -> tuple[int, str | None, bool]:
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
