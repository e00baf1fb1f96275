"""Launching the microbench on every rank: torchrun (local or multi-node) or a template.

Three launchers build an argv list (never a shell line):

- local: ``python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE ARGS``
  (a free rendezvous port on this host, so parallel sweeps do not collide);
- multi-node: ``... --nnodes N --node-rank K --rdzv-backend static --rdzv-endpoint H:P``
  run once on every node with the same plan; static rendezvous pins global rank 0 to
  node rank 0, which is where records are written;
- template: a scheduler line that starts torchrun on every node, such as ``srun
  --ntasks-per-node 1 python -m torch.distributed.run --nnodes 2 --nproc-per-node 8
  --rdzv-backend c10d --rdzv-endpoint node0:29500 -m {module} {args}`` (tasks started
  without torchrun have no RANK/WORLD_SIZE: the microbench refuses to run in them, and
  the engine fails records whose world is not the expected one), split with shlex,
  each placeholder replaced by argv elements: ``{module}``, ``{args}``
  (the microbench arguments, one element each), ``{env}`` (KEY=VALUE elements of the
  launch's NCCL settings, for launchers that need them spelled out), ``{nproc}``,
  ``{nnodes}``. Every launcher passes the launch's environment to its child.

A launch runs in a session of its own. torchrun starts its workers in sessions of their
own too (torch.distributed.elastic's subprocess handler), so killing the launch's
process group alone would orphan them: `kill_tree` collects every descendant through
/proc before signalling, and signals each one (SIGTERM, then SIGKILL after a grace
period).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nccl_tune.errors import NcclTuneError

PLACEHOLDERS = ("{module}", "{args}", "{env}", "{nproc}", "{nnodes}")
TAIL_LINES = 20


@dataclass(frozen=True)
class Launcher:
    """How a launch reaches every rank."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    template: str | None = None
    python: str = sys.executable
    simulated: bool = False  # the sim backend: nothing is launched, no rendezvous needed

    def __post_init__(self):
        if self.nproc < 1:
            raise NcclTuneError(f"--nproc: {self.nproc} must be at least 1")
        if self.nnodes < 1:
            raise NcclTuneError(f"--nnodes: {self.nnodes} must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise NcclTuneError(f"--node-rank: {self.node_rank} is not in [0, {self.nnodes - 1}]")
        if self.template is None and self.nnodes > 1 and not self.rdzv_endpoint and not self.simulated:
            raise NcclTuneError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address)")
        if self.rdzv_endpoint and ":" not in self.rdzv_endpoint:
            raise NcclTuneError(f"--rdzv-endpoint: '{self.rdzv_endpoint}' is not HOST:PORT")
        if self.template is not None:
            check_template(self.template)

    @property
    def kind(self) -> str:
        """'template', 'multi-node' or 'local'."""
        if self.template is not None:
            return "template"
        return "multi-node" if self.nnodes > 1 else "local"

    @property
    def world_size(self) -> int:
        """Ranks in the world (nproc per node x nodes)."""
        return self.nproc * self.nnodes

    @property
    def expected_world(self) -> int | None:
        """The world the ranks must form: nproc x nnodes for torchrun; None for a template
        (what it starts is the template's business, whatever --nproc says)."""
        return None if self.template is not None else self.world_size

    @property
    def writes_records(self) -> bool:
        """True on the node that hosts global rank 0 (the one whose records are kept)."""
        return self.node_rank == 0

    def argv(self, module: str, args: list[str], env: dict[str, str]) -> list[str]:
        """The command that runs `module` with `args` on every rank."""
        if self.template is not None:
            return expand_template(self.template, module, args, env, self.nproc, self.nnodes)
        head = [self.python, "-m", "torch.distributed.run", "--nproc-per-node", str(self.nproc)]
        if self.nnodes > 1:
            head += [
                "--nnodes",
                str(self.nnodes),
                "--node-rank",
                str(self.node_rank),
                "--rdzv-backend",
                "static",
                "--rdzv-endpoint",
                self.rdzv_endpoint,
            ]
        else:
            head += ["--standalone"]
        return head + ["--max-restarts", "0", "-m", module, *args]

    def describe(self) -> str:
        """One line for the plan."""
        if self.template is not None:
            return f"template: {self.template}"
        if self.simulated:
            return f"simulated: nothing is launched; a modelled world of {self.world_size} ranks"
        if self.nnodes > 1:
            return (
                f"torchrun, {self.nnodes} nodes x {self.nproc} ranks, this is node "
                f"{self.node_rank}, rendezvous {self.rdzv_endpoint}"
            )
        return f"torchrun on this host, {self.nproc} ranks"


def check_template(template: str) -> list[str]:
    """The template split with shlex; NcclTuneError when it cannot work."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise NcclTuneError(f"--launcher: cannot split '{template}': {exc}") from None
    if not words:
        raise NcclTuneError("--launcher: empty template")
    if "{args}" not in words:
        raise NcclTuneError(
            "--launcher: the template needs {args} as a word of its own (where the microbench arguments go)"
        )
    for word in words:
        for whole in ("{args}", "{env}"):
            if whole in word and word != whole:
                raise NcclTuneError(f"--launcher: {whole} must be a word of its own, not part of '{word}'")
    return words


def expand_template(
    template: str, module: str, args: list[str], env: dict[str, str], nproc: int, nnodes: int
) -> list[str]:
    """The template's words with placeholders replaced by argv elements (no shell)."""
    out: list[str] = []
    for word in check_template(template):
        if word == "{args}":
            out.extend(args)
        elif word == "{env}":
            out.extend(f"{k}={v}" for k, v in env.items())
        else:
            out.append(word.replace("{module}", module).replace("{nproc}", str(nproc)).replace("{nnodes}", str(nnodes)))
    return out


# ---------------------------------------------------------------- process trees


def _proc_table() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, session id, state) of every process (Linux /proc)."""
    table = []
    if not os.path.isdir("/proc"):
        return table
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read().decode(errors="replace")
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        fields = data[data.rfind(")") + 2 :].split()
        if len(fields) > 3:
            table.append((int(name), int(fields[1]), int(fields[3]), fields[0]))
    return table


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, and every process still in its session.

    Descendants are found by parent links (workers that started sessions of their own
    included); session members catch processes orphaned by a parent that already
    exited (the launch is the leader of its own session).
    """
    table = [row for row in _proc_table() if row[3] not in ("Z", "X")]
    children: dict[int, list[int]] = {}
    for child, parent, _, _ in table:
        children.setdefault(parent, []).append(child)
    out, queue = [], deque(children.get(pid, []))
    while queue:
        child = queue.popleft()
        out.append(child)
        queue.extend(children.get(child, []))
    seen = set(out)
    out += [p for p, _, sid, _ in table if sid == pid and p != pid and p not in seen]
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """Stop a launch and everything it started: SIGTERM, then SIGKILL after `grace` s."""
    tree = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the launch's own session
    except (ProcessLookupError, PermissionError):
        pass
    for pid in tree:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        tree = sorted(set(tree) | set(descendants(proc.pid)))
        if proc.poll() is not None and not any(_alive(p) for p in tree):
            break
        time.sleep(0.05)
    tree = sorted(set(tree) | set(descendants(proc.pid)))
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in tree:
        _signal(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        pass


def _kill_shielded(proc: subprocess.Popen) -> None:
    """kill_tree that a second Ctrl-C (or SIGTERM) cannot cut short, leaving ranks behind."""
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread: signals go elsewhere anyway
            pass
    try:
        kill_tree(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().decode(errors="replace")
    except OSError:
        return False
    return state[state.rfind(")") + 2 :].split()[0] not in ("Z", "X")


# ---------------------------------------------------------------- running one launch


@dataclass
class LaunchOutcome:
    """How a launch ended."""

    status: str  # ok | failed | timeout | interrupted
    returncode: int | None
    wall_s: float
    tail: list[str]
    log_path: str

    def error_text(self) -> str:
        """What went wrong, for a record's `error`: first line what happened and the most
        telling line of output (a rank's error, see `key_error_line`), then where the full
        output is and its last lines."""
        timed_out = "a collective timed out" if collective_timeout(self.tail) else "launch timed out"
        what = {
            "timeout": timed_out,
            "interrupted": "interrupted",
            "failed": f"launch exited with code {self.returncode}",
        }.get(self.status, f"launch exited with code {self.returncode}")
        key = key_error_line(self.tail)
        if key is None and self.status == "failed" and self.tail:
            key = self.tail[-1].strip()
        head = f"{what}: {key}" if key else what
        where = f"full output: {self.log_path}" if self.log_path else ""
        tail = "\n".join(self.tail[-TAIL_LINES:])
        if not tail:
            return f"{head} (no output" + (f"; {where})" if where else ")")
        return f"{head}\n" + (f"({where}) " if where else "") + f"last lines of output:\n{tail}"


_ERRORISH_RE = re.compile(
    r"Error|Exception|\berror\b|\bfailed\b|FAILED|timed out|\btimeout\b|"
    r"Segmentation fault|Killed|Aborted|core dumped|NCCL WARN"
)
_RANK_RE = re.compile(r"\brank\s*\d+\b", re.IGNORECASE)
# A rank reporting that another one went away: a consequence, not the cause.
_CONSEQUENCE_RE = re.compile(
    r"lost contact|closed (its|the) connection|Connection reset|"
    r"connection closed by peer|another rank",
    re.IGNORECASE,
)
KEY_LINE_MAX = 300


def key_error_line(lines: list[str]) -> str | None:
    """The line of a launch's output that says best what went wrong, or None.

    The last error line that names a rank (the microbench's "rank N: failed: ..." or
    torchrun's "[rankN]: RuntimeError: ..."), a rank's own failure before one that only
    saw another rank go away; else the last error-looking line of any kind.
    """
    errorish = [line.strip() for line in lines if _ERRORISH_RE.search(line)]
    ranked = [line for line in errorish if _RANK_RE.search(line)]
    causes = [line for line in ranked if not _CONSEQUENCE_RE.search(line)]
    pick = (causes or ranked or errorish or [None])[-1]
    if pick and len(pick) > KEY_LINE_MAX:
        pick = pick[: KEY_LINE_MAX - 3] + "..."
    return pick


_OLD_HEAD_RE = re.compile(
    r"^(?P<what>launch timed out|launch exited with code -?\d+|interrupted)"
    r"(?: \(full output: (?P<path>.+?)\))?; last lines of output:$"
)
_WHERE_RE = re.compile(r"^\(full output: (?P<path>.+?)\) last lines of output:$")


def summarize_error(text: str) -> str:
    """One line for a record's `error`: its first line (for a launch failure, what happened
    and the telling line of output) plus where the full output is, when it says.

    Records written before launch errors led with the telling line (``launch exited with
    code 3 (full output: P); last lines of output:`` and the lines) get the same summary.
    """
    lines = [line for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    old = _OLD_HEAD_RE.match(lines[0].strip())
    if old:
        key = key_error_line(lines[1:]) or (lines[-1].strip() if len(lines) > 1 else None)
        head = old.group("what") + (f": {key}" if key else "")
        return head + (f" (full output: {old.group('path')})" if old.group("path") else "")
    where = next((m.group("path") for m in map(_WHERE_RE.match, (x.strip() for x in lines[1:2])) if m), None)
    return lines[0].strip() + (f" (full output: {where})" if where else "")


# torchrun's agent log lines: glog prefix, then the source path, which torch prints
# relative to the import root ("torch/distributed/...") or with the directory above it
# ("site-packages/torch/distributed/...") depending on the install.
AGENT_LOG_RE = re.compile(r"^[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ (?:\S*/)?torch/distributed/")


def without_launcher_noise(lines: list[str]) -> list[str]:
    """Output lines less torchrun's own boilerplate, so the ranks' last words show.

    Dropped: the OMP_NUM_THREADS banner, the agent's log lines (``E1129 09:22:04.504 123
    torch/distributed/...``), its ChildFailedError traceback and the ``=====`` failure
    summary it prints after a rank failed (the rank's own error line comes before).
    """
    out, skipping = [], None
    for line in lines:
        text = line.strip()
        if skipping == "traceback":  # indented frames, then the unindented exception line
            if not line[:1].isspace():
                skipping = None
            continue
        if skipping == "summary":
            if text.startswith("=" * 20):
                skipping = None
            continue
        if text.startswith("Traceback (most recent call last)") and any(
            "torch/distributed/run.py" in later for later in lines
        ):
            skipping = "traceback"
            continue
        if text.startswith("=" * 20):
            skipping = "summary"
            continue
        if AGENT_LOG_RE.match(text) or set(text) == {"*"} or text.startswith("Setting OMP_NUM_THREADS"):
            continue
        out.append(line)
    return out


def tail_lines(path: str, count: int = TAIL_LINES) -> list[str]:
    """The last `count` meaningful lines of a launch's output (empty when unreadable)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read().decode(errors="replace")
    except OSError:
        return []
    lines = [line.rstrip() for line in data.splitlines() if line.strip()]
    return without_launcher_noise(lines)[-count:] or lines[-count:]


def run_launch(
    argv: list[str],
    env: dict[str, str],
    log_path: str,
    timeout: float | None,
    poll: Callable[[], None] | None = None,
    poll_interval: float = 0.2,
) -> LaunchOutcome:
    """Run one launch to its end, calling `poll` meanwhile; kill it on timeout or Ctrl-C.

    Output (stdout and stderr) goes to `log_path`. A KeyboardInterrupt kills the launch
    and returns status 'interrupted'; the caller decides what to keep.
    """
    start = time.monotonic()
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as exc:
            log.write(f"cannot start {argv[0]}: {exc.strerror}\n".encode())
            log.flush()
            return LaunchOutcome("failed", None, 0.0, tail_lines(log_path), log_path)
        status = None
        try:
            while True:
                try:
                    proc.wait(timeout=poll_interval)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if poll:
                    poll()
                if timeout is not None and time.monotonic() - start > timeout:
                    kill_tree(proc)
                    status = "timeout"
                    break
        except KeyboardInterrupt:
            _kill_shielded(proc)
            status = "interrupted"
        # A launch that ended leaves no stragglers behind (daemonised helpers included).
        for pid in descendants(proc.pid):
            _signal(pid, signal.SIGKILL)
    if poll:
        poll()
    tail = tail_lines(log_path)
    if status is None:
        status = "ok" if proc.returncode == 0 else ended_status(proc.returncode, tail)
    return LaunchOutcome(status, proc.returncode, time.monotonic() - start, tail, log_path)


# torch's ProcessGroupNCCL watchdog, before it ends the process with SIGABRT
# (TORCH_NCCL_ASYNC_ERROR_HANDLING=1, which torchrun sets in its workers, aborts the
# communicators first; torch's default 3 does not): "[Rank 1] Watchdog caught collective
# operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, ...) ran for 600081 ms ...";
# the microbench's own watchdog exits 124 after recording the timeout.
TORCH_TIMEOUT_RE = re.compile(
    r"Watchdog caught collective operation timeout|"
    r"\brank \d+: timeout: .* made no progress"
)
WATCHDOG_EXIT = 124


def collective_timeout(tail: list[str]) -> bool:
    """True when a launch's output says a collective timed out (torch's or ours)."""
    return any(TORCH_TIMEOUT_RE.search(line) for line in tail)


def ended_status(returncode: int | None, tail: list[str]) -> str:
    """'timeout' for a launch that ended by a collective timeout (torch's NCCL watchdog
    or a rank's watchdog said so, or a rank exited 124 without torchrun), else 'failed'."""
    return "timeout" if returncode == WATCHDOG_EXIT or collective_timeout(tail) else "failed"
