"""Launch and stop an SGLang server under a profile (or as the NCCL-defaults baseline).

    with SGLangServer(["--model-path", "m", "--tp", "8"], profile_env={"NCCL_PROTO": "LL"},
                      steps=2, log_path="server.log") as server:
        server.wait_ready()
        report = server.check_env()      # do the TP workers carry the profile?
        ... benchmark server.url ...
    # stopped here, whole process group, also on errors and Ctrl-C

The server runs as `python -m sglang.launch_server ARGS --host H --port P` in a session of
its own, so stopping it signals every process it started (SGLang spawns its TP workers
with multiprocessing, and they inherit the environment). Its output goes to a log file
that is kept. The environment is the caller's with every NCCL_* removed, plus the
profile's variables (none for the baseline), so nothing left over in the shell or the
container leaks into either side of the comparison.

`check_env` reads /proc/PID/environ of the server and every descendant through
nccl_tune.procenv (the logic of `nccl-tune check`): SGLang's TP workers are where NCCL
runs, so they are what must carry the profile.

Speculative decoding (DESIGN.md section 6): with topk 1 SGLang's draft token count is
steps + 1; both are passed explicitly, with `--speculative-eagle-topk 1`, replacing any
such values in the given arguments. Steps 0 removes every `--speculative-*` option, so
the same argument list serves plain decoding.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field

# Set by SGLang itself up to 0.5.4 whatever the environment says (DESIGN.md section 5).
SERVER_MANAGED = frozenset({"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"})
STEP_OPTIONS = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
DEFAULT_COMMAND = (sys.executable, "-m", "sglang.launch_server")


class ServerError(Exception):
    """The server could not be started or did not become healthy; `log_tail` says why."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- last lines of the server log ---\n{log_tail}" if log_tail else ""))
        self.short = message
        self.log_tail = log_tail


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


def server_args_for_steps(args: list[str], steps: int) -> list[str]:
    """The server arguments for `steps` draft steps (0: plain decoding).

    ValueError when steps > 0 and the arguments name no speculative algorithm.
    """
    if steps < 0:
        raise ValueError("steps must not be negative")
    if steps == 0:
        return remove_options(args, ["--speculative-*"])
    if not option_value(args, "--speculative-algorithm"):
        raise ValueError("steps > 0 needs --speculative-algorithm (and its draft model) in the "
                         "server arguments")
    return remove_options(args, STEP_OPTIONS) + [
        "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(steps + 1)]


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


# --- processes: lifecycle here, environments through nccl_tune.procenv ------------------

def _stat(pid: int) -> tuple[int, str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
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

    Built on nccl_tune.procenv (the `check` command's logic). Stricter than `check` in
    one way: an NCCL_* variable the profile does not set is a problem too (for the
    baseline, every NCCL_* is), except those SGLang sets itself (`server_set`).
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
            out.append(f"pid {p['pid']} ({p['cmd'][:60]}): {'; '.join(parts)}")
        return out

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"ok": self.ok, "expected": self.expected, "processes": self.processes,
                "problems": self.problems()}


def _entry(result) -> dict:
    # one procenv.ProcessCheck as this module reports it
    extra = {k: v for k, v in result.extra.items() if k not in SERVER_MANAGED}
    entry = {"pid": result.pid, "cmd": " ".join(result.cmdline), "error": result.error,
             "missing": [v.name for v in result.variables if v.status == "missing"],
             "different": {v.name: v.actual for v in result.variables if v.status == "different"},
             "extra": extra,
             "server_set": {k: v for k, v in result.extra.items() if k in SERVER_MANAGED}}
    entry["ok"] = result.ok and not extra
    return entry


def check_processes(pids: list[int], expected: dict[str, str]) -> EnvCheck:
    """Compare each process's NCCL_* variables with `expected` (the profile; {} for baseline)."""
    from nccl_tune import procenv

    check = EnvCheck(dict(expected))
    for pid in pids:
        try:
            result = procenv.check_process(expected, pid)
        except procenv.ProcessGone:
            result = procenv.ProcessCheck(pid, None, [], error="the process is gone")
        check.processes.append(_entry(result))
    return check


def check_tree(root: int, expected: dict[str, str]) -> EnvCheck:
    """The server process and every descendant (procenv.check_processes with tree=True)."""
    from nccl_tune import procenv
    from nccl_tune.errors import NcclTuneError

    check = EnvCheck(dict(expected))
    try:
        results = procenv.check_processes(expected, root, tree=True)
    except NcclTuneError as exc:
        results = [procenv.ProcessCheck(root, None, [], error=str(exc))]
    check.processes.extend(_entry(r) for r in results)
    return check


class SGLangServer:
    """One server launch: start, wait for /health, check workers' environment, stop."""

    def __init__(self, server_args: list[str], profile_env: dict[str, str] | None = None,
                 steps: int = 0, log_path: str = "sglang-server.log", host: str | None = None,
                 port: int | None = None, health_timeout: float = 900.0, stop_timeout: float = 30.0,
                 command: list[str] | None = None, base_env: dict[str, str] | None = None):
        args = server_args_for_steps(list(server_args), steps)
        self.host = host or option_value(args, "--host") or "127.0.0.1"
        given_port = option_value(args, "--port")
        self.port = port or (int(given_port) if given_port and given_port.isdigit() else free_port(self.host))
        self.argv = [*(command or DEFAULT_COMMAND), *remove_options(args, ["--host", "--port"]),
                     "--host", self.host, "--port", str(self.port)]
        self.profile_env = dict(profile_env or {})
        self.env = server_env(dict(os.environ if base_env is None else base_env), profile_env)
        self.steps = steps
        self.log_path = log_path
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
        """Start the server process in its own session, output to the log file."""
        self._log = open(self.log_path, "w", encoding="utf-8")
        self._log.write(f"# nccl-tune: {' '.join(self.argv)}\n# nccl-tune: NCCL env "
                        f"{self.profile_env or '{} (baseline: every NCCL_* removed)'}\n")
        self._log.flush()
        try:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=self._log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise ServerError(f"cannot start {self.argv[0]}: {exc.strerror}") from None
        self.started_at = time.monotonic()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        if self._log:
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
                raise ServerError(f"the server exited with code {code} before it became healthy "
                                  f"(log: {self.log_path})", tail)
            if self.healthy():
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"the server was not healthy after {self.health_timeout:.0f} s "
                                  f"(log: {self.log_path})", tail)
            time.sleep(poll)

    def processes(self) -> list[int]:
        """The server's process and all its descendants (the TP workers among them)."""
        if self.process is None or not alive(self.process.pid):
            return []
        from nccl_tune.procenv import descendants

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
        since SGLang's own code there decides what the workers inherit.
        """
        self.processes()  # remember them for stop()
        if self.process is None:
            return EnvCheck(dict(self.profile_env))
        return check_tree(self.process.pid, self.profile_env)

    def stop(self) -> None:
        """Stop every process of the server: SIGTERM to the group, then SIGKILL."""
        if self.process is None:
            return
        pid = self.process.pid
        self.processes()
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 5.0)):
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

    def __enter__(self) -> "SGLangServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # runs on errors and on KeyboardInterrupt too
