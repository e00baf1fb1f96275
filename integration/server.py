"""One serving-engine launch: start under a profile (or clean), wait for health, find the
workers and prove their environment, stop everything, keep the log.

    with Server(engine, ["--model", "m", "--tensor-parallel-size", "8"],
                profile_env={"NCCL_PROTO": "LL"}, steps=2, log_path="server.log") as server:
        server.wait_ready()
        report = server.check_env()      # do the TP workers carry the profile?
        ... benchmark server.url ...
    # stopped here, whole process group, also on errors and Ctrl-C

An `Engine` describes one serving engine in a few fields (integration/sglang.py and
integration/vllm.py): the command that starts it, how a draft step count becomes server
arguments, which API its server speaks, and which NCCL variables it sets itself.

The server runs as `COMMAND ARGS --host H --port P` in a session of its own, so stopping
it signals every process it started (both engines spawn their TP workers with
multiprocessing, and the workers inherit the environment). Its output goes to a log
file that is kept. The environment is the caller's with every NCCL_* removed, plus the
profile's variables (none for the baseline), so nothing left over in the shell or the
container leaks into either side of the comparison.

`check_env` reads the environment of the server and of every descendant through
nccl_tune.live.procenv (the logic of `nccl-tune check --tree`), which also handles workers
that rewrote their environment block with setproctitle (both engines do).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class ServerError(Exception):
    """The server could not be started or did not become healthy; `log_tail` says why."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- last lines of the server log ---\n{log_tail}" if log_tail else ""))
        self.short = message
        self.log_tail = log_tail


@dataclass(frozen=True)
class Engine:
    """What differs between serving engines; everything else is `Server`'s."""

    name: str
    command: tuple[str, ...]  # argv before the server arguments
    args_for_steps: Callable[[list[str], int], list[str]]  # ValueError on bad arguments
    api: str = "openai"  # the client protocol: openai (/v1/completions) | generate (SGLang)
    tp_options: tuple[str, ...] = ("--tp", "--tp-size", "--tensor-parallel-size")
    server_managed: frozenset = frozenset()  # NCCL_* the engine sets itself


# --- argument lists ----------------------------------------------------------------------


def _option_spans(args: list[str]) -> list[tuple[str, int, int]]:
    # (name, start, end) of every --option with its value (next token unless it is an option)
    spans, i = [], 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            end = i + 1
            if "=" not in token and end < len(args) and not args[end].startswith("--"):
                end += 1
            spans.append((name, i, end))
            i = end
        else:
            i += 1
    return spans


def remove_options(args: list[str], names) -> list[str]:
    """`args` without the named options (and their values); names ending in '*' are prefixes."""
    drop = set()
    for name, start, end in _option_spans(args):
        if any(name == n or (n.endswith("*") and name.startswith(n[:-1])) for n in names):
            drop.update(range(start, end))
    return [a for i, a in enumerate(args) if i not in drop]


def option_value(args: list[str], *names: str) -> str | None:
    """The value of the last of the named options in `args`, or None."""
    value = None
    for name, start, end in _option_spans(args):
        if name in names:
            token = args[start]
            value = token.split("=", 1)[1] if "=" in token else (args[start + 1] if end > start + 1 else "")
    return value


def tp_size(engine: Engine, server_args: list[str]) -> int | None:
    """The tensor-parallel size the arguments ask for (None: not given, the engine's 1)."""
    value = option_value(server_args, *engine.tp_options)
    for i, token in enumerate(server_args[:-1]):  # vLLM's short form, `-tp 8`
        if token == "-tp":
            value = server_args[i + 1]
    return int(value) if value and value.isdigit() else None


def server_env(base: dict[str, str], profile_env: dict[str, str] | None) -> dict[str, str]:
    """`base` with every NCCL_* removed, then the profile's variables (None: baseline)."""
    env = {k: v for k, v in base.items() if not k.startswith("NCCL_")}
    env.update(profile_env or {})
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections on host:port now (a server already
    there would answer the health poll meant for the one about to start)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", None) else "::1" if host == "::" else host
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_in_use(server_args: list[str]) -> str | None:
    """Why the --port the server arguments give cannot be used (something already answers
    there), or None (no --port given, or it is free)."""
    given = option_value(server_args, "--port")
    if not given or not given.isdigit():
        return None
    host = option_value(server_args, "--host") or "127.0.0.1"
    if answers(host, int(given)):
        return (
            f"--port {given}: something already answers on {host}:{given}; it would answer "
            "the health checks and the benchmark meant for the server validate starts (stop "
            "it, or leave --port out: a free port is chosen)"
        )
    return None


# --- processes: lifecycle here, environments through nccl_tune.live.procenv ------------------


def _stat(pid: int) -> tuple[int, str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], int(fields[19])  # ppid, state, start time (ticks)


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), to tell it from a later reuse of its id."""
    info = _stat(pid)
    return None if info is None else info[2]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    info = _stat(pid)
    return info is not None and info[1] != "Z"


@dataclass
class EnvCheck:
    """Whether each server process carries the expected NCCL_* environment.

    Built on nccl_tune.live.procenv (the `check` command's logic). Stricter than `check` in
    one way: an NCCL_* variable the profile does not set is a problem too (for the
    baseline, every NCCL_* is), except those the engine sets itself (`server_set`).
    """

    expected: dict[str, str]
    processes: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every process read, every expected value there, no unexpected NCCL_*."""
        return bool(self.processes) and all(p["ok"] for p in self.processes)

    def problems(self) -> list[str]:
        """One line per process that does not match."""
        out = []
        for p in self.processes:
            if p["ok"]:
                continue
            parts = []
            if p["error"]:
                parts.append(p["error"])
            if p["missing"]:
                parts.append("missing " + ", ".join(p["missing"]))
            if p["different"]:
                parts.append("different " + ", ".join(f"{k}={v}" for k, v in p["different"].items()))
            if p["extra"]:
                parts.append("unexpected " + ", ".join(f"{k}={v}" for k, v in p["extra"].items()))
            who = p.get("role") or p["cmd"][:60]
            out.append(f"pid {p['pid']} ({who}): {'; '.join(parts)}")
        return out

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"ok": self.ok, "expected": self.expected, "processes": self.processes, "problems": self.problems()}


def _entry(result, managed: frozenset) -> dict:
    # one procenv.ProcessCheck as this module reports it
    extra = {k: v for k, v in result.extra.items() if k not in managed}
    entry = {
        "pid": result.pid,
        "cmd": " ".join(result.cmdline),
        "role": result.role,
        "error": result.error,
        "env_source": result.env_source,
        "rewritten": result.rewritten,
        "inherited_from": result.inherited_from,
        "inheritance": result.inheritance,
        "missing": [v.name for v in result.variables if v.status == "missing"],
        "different": {v.name: v.actual for v in result.variables if v.status == "different"},
        "inherited": [v.name for v in result.variables if v.status == "inherited"],
        "extra": extra,
        "server_set": {k: v for k, v in result.extra.items() if k in managed},
    }
    entry["ok"] = result.ok and not extra
    return entry


def check_processes(pids: list[int], expected: dict[str, str], managed: frozenset = frozenset()) -> EnvCheck:
    """Compare each process's NCCL_* variables with `expected` (the profile; {} for baseline)."""
    from nccl_tune.live import procenv

    check = EnvCheck(dict(expected))
    for pid in pids:
        try:
            result = procenv.check_process(expected, pid)
        except procenv.ProcessGone:
            result = procenv.ProcessCheck(pid, None, [], error="the process is gone")
        check.processes.append(_entry(result, managed))
    return check


def check_tree(root: int, expected: dict[str, str], managed: frozenset = frozenset()) -> EnvCheck:
    """The server process and every descendant (procenv.check_processes with tree=True)."""
    from nccl_tune.errors import NcclTuneError
    from nccl_tune.live import procenv

    check = EnvCheck(dict(expected))
    try:
        results = procenv.check_processes(expected, root, tree=True)
    except NcclTuneError as exc:
        results = [procenv.ProcessCheck(root, None, [], error=str(exc))]
    check.processes.extend(_entry(r, managed) for r in results)
    return check


class Server:
    """One server launch: start, wait for /health, check workers' environment, stop."""

    def __init__(
        self,
        engine: Engine,
        server_args: list[str],
        profile_env: dict[str, str] | None = None,
        steps: int = 0,
        log_path: str | None = None,
        host: str | None = None,
        port: int | None = None,
        health_timeout: float = 900.0,
        stop_timeout: float = 30.0,
        command: list[str] | None = None,
        base_env: dict[str, str] | None = None,
    ):
        self.engine = engine
        args = engine.args_for_steps(list(server_args), steps)
        self.host = host or option_value(args, "--host") or "127.0.0.1"
        given_port = option_value(args, "--port")
        self.port = port or (int(given_port) if given_port and given_port.isdigit() else free_port(self.host))
        self.argv = [
            *(command or engine.command),
            *remove_options(args, ["--host", "--port"]),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        self.profile_env = dict(profile_env or {})
        self.env = server_env(dict(os.environ if base_env is None else base_env), profile_env)
        self.steps = steps
        self.log_path = log_path or f"{engine.name}-server.log"
        self.health_timeout = health_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen | None = None
        self._log = None
        self.started_at: float | None = None
        self._seen: dict[int, int] = {}  # pid -> start time of every server process seen

    @property
    def url(self) -> str:
        """Base URL of the server."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Start the server process in its own session, output to the log file; ServerError
        when something already answers on its port (it would pass for this server)."""
        if answers(self.host, self.port):
            raise ServerError(
                f"port {self.port} on {self.host} already answers: another process "
                "would answer the health checks meant for this server"
            )
        self._log = open(self.log_path, "w", encoding="utf-8")
        self._log.write(
            f"# nccl-tune: {' '.join(self.argv)}\n# nccl-tune: NCCL env "
            f"{self.profile_env or '{} (baseline: every NCCL_* removed)'}\n"
        )
        self._log.flush()
        try:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise ServerError(f"cannot start {self.argv[0]}: {exc.strerror}") from None
        self.started_at = time.monotonic()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        if self._log and not self._log.closed:
            self._log.flush()
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return "".join(deque(handle, maxlen=lines)).rstrip()
        except OSError:
            return ""

    def healthy(self) -> bool:
        """True when GET /health answers 200."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def running(self) -> bool:
        """True while the server's main process has not exited."""
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, poll: float = 0.5) -> float:
        """Wait (at most health_timeout) for /health; seconds taken, or ServerError."""
        assert self.process is not None, "start() first"
        deadline = self.started_at + self.health_timeout
        while True:
            self.processes()  # remember workers as they appear
            code = self.process.poll()
            if code is not None:
                tail = self.log_tail()
                self.stop()  # workers it left behind
                raise ServerError(
                    f"the {self.engine.name} server exited with code {code} before it "
                    f"became healthy (log: {self.log_path})",
                    tail,
                )
            if self.healthy():
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(
                    f"the {self.engine.name} server was not healthy after "
                    f"{self.health_timeout:.0f} s (log: {self.log_path})",
                    tail,
                )
            time.sleep(poll)

    def processes(self) -> list[int]:
        """The server's process and all its descendants (the TP workers among them)."""
        if self.process is None or not alive(self.process.pid):
            return []
        from nccl_tune.live.procenv import descendants

        found = [self.process.pid, *(p for p in descendants(self.process.pid) if alive(p))]
        for pid in found:
            started = start_time(pid)
            if started is not None:
                self._seen.setdefault(pid, started)
        return found

    def _ours(self, pid: int) -> bool:
        # the same process we saw, not a later one that was given the same id
        return alive(pid) and start_time(pid) == self._seen.get(pid)

    def check_env(self) -> EnvCheck:
        """Do the server's processes carry the profile (or, for the baseline, no NCCL_*)?

        The workers are what matter: they run NCCL. The launcher process is included,
        since the engine's own code there decides what the workers inherit.
        """
        self.processes()  # remember them for stop()
        if self.process is None:
            return EnvCheck(dict(self.profile_env))
        return check_tree(self.process.pid, self.profile_env, self.engine.server_managed)

    def stop(self) -> None:
        """Stop every process of the server: SIGTERM to the group, then SIGKILL."""
        if self.process is None:
            return
        pid = self.process.pid
        self.processes()
        # after SIGKILL, up to 30 s for the processes to be gone: on a 2-core box at load 20,
        # SGLang's workers (about 700 MB each) were still there just after a 5 s bound
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 30.0)):
            if self.process.poll() is None or any(self._ours(p) for p in self._seen):
                try:
                    os.killpg(pid, sig)  # the session we started: pgid == the server's pid
                except (ProcessLookupError, PermissionError):
                    pass
            for other in self._seen:  # any that left the group (setsid) are signalled by pid
                if other != pid and self._ours(other):
                    try:
                        os.kill(other, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.process.poll()
                if self.process.returncode is not None and not any(self._ours(p) for p in self._seen):
                    break
                time.sleep(0.05)
            else:
                continue
            break
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._log and not self._log.closed:
            self._log.close()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # runs on errors and on KeyboardInterrupt too
