"""The environment of running processes (Linux /proc), compared with a profile.

This is the guard against a server that was restarted without its NCCL variables:
`check_processes(profile_env, pid, tree=True)` reads /proc/PID/environ of a server and
of every descendant (its TP workers) and says, per process and per variable, whether
the profile is there.

What /proc/PID/environ shows is the environment the process was started with (what
execve received). Changes a process makes to its own environment later (SGLang up to
0.5.4 sets NCCL_CUMEM_ENABLE and NCCL_NVLS_ENABLE in Python) are not visible there,
but workers spawned afterwards inherit them and show them: check with `tree=True`.
Reading another user's process needs the same rights as ptrace (root, or the same user).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from nccl_tune.errors import NcclTuneError

PROC = "/proc"
OK_STATUSES = ("ok", "conf")


class ProcessGone(Exception):
    """The process exited (or never existed) while it was being read."""


@dataclass(frozen=True)
class VarCheck:
    """One profile variable in one process: ok, missing or different.

    "conf" / "conf-different": not in the environment, but an NCCL conf file the process
    would read supplies it (with the profile's value / another one); `source` names it.
    """

    name: str
    expected: str
    actual: str | None
    status: str  # "ok" | "missing" | "different" | "conf" | "conf-different"
    source: str | None = None  # the conf file, for the conf statuses


@dataclass
class ProcessCheck:
    """One process compared with the profile.

    `variables` has one entry per profile variable; `extra` holds NCCL_* variables the
    process has that the profile does not set; `error` says why it could not be read
    (then `variables` is empty and the process counts as not matching).
    """

    pid: int
    ppid: int | None
    cmdline: list[str]
    variables: list[VarCheck] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    conf: dict[str, dict] = field(default_factory=dict)  # NAME -> {value, path}: conf supplies

    @property
    def ok(self) -> bool:
        """True when the process could be read and every profile variable matches."""
        return self.error is None and all(v.status in OK_STATUSES for v in self.variables)

    def to_dict(self) -> dict:
        """JSON-ready form (with `ok`)."""
        out = asdict(self)
        out["ok"] = self.ok
        return out


def _read_bytes(pid: int, name: str) -> bytes:
    try:
        with open(os.path.join(PROC, str(pid), name), "rb") as handle:
            return handle.read()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(pid) from None


def read_environ(pid: int) -> dict[str, str]:
    """The start-up environment of `pid` (/proc/PID/environ), decoded leniently.

    Raises ProcessGone when the process does not exist and PermissionError when it
    belongs to someone else.
    """
    env: dict[str, str] = {}
    for entry in _read_bytes(pid, "environ").split(b"\0"):
        if b"=" in entry:
            key, value = entry.split(b"=", 1)
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def read_cmdline(pid: int) -> list[str]:
    """argv of `pid` (empty for kernel threads or when it cannot be read)."""
    try:
        raw = _read_bytes(pid, "cmdline")
    except (ProcessGone, PermissionError):
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the comm field (which may hold spaces and parens)."""
    try:
        stat = _read_bytes(pid, "stat").decode("utf-8", "replace")
    except (ProcessGone, PermissionError):
        return []
    return stat[stat.rfind(")") + 2:].split()


def read_ppid(pid: int) -> int | None:
    """The parent pid from /proc/PID/stat, or None when it cannot be read."""
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def is_zombie(pid: int) -> bool:
    """True for a process that exited and awaits its parent (its environ reads empty)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] == "Z"


def children_map() -> dict[int, list[int]]:
    """parent pid -> child pids, for every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir(PROC):
        if entry.isdigit():
            parent = read_ppid(int(entry))
            if parent is not None:
                tree.setdefault(parent, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every descendant of `pid` (children, grandchildren, ...), breadth first."""
    tree = children_map()
    out: list[int] = []
    queue = sorted(tree.get(pid, []))
    while queue:
        child = queue.pop(0)
        if child in out or child == pid:
            continue
        out.append(child)
        queue += sorted(tree.get(child, []))
    return out


def conf_supply(pid: int, environ: dict[str, str]) -> dict[str, dict]:
    """NCCL_* values the NCCL conf files would give process `pid` (name -> {value, path}).

    Read as NCCL would at its first lookup (nccl_tune.conffile): NCCL_CONF_FILE (relative
    to the process's working directory) or $HOME/.nccl.conf, then /etc/nccl.conf, inside
    the process's root (/proc/PID/root: a container's own files); values the environment
    already sets are not supplied. The files are read now, not when the process read them.
    """
    from nccl_tune.sysinfo import conf_files

    base = os.path.join(PROC, str(pid))
    root = os.path.join(base, "root")
    root = root if os.access(root, os.R_OK | os.X_OK) else ""
    try:
        cwd = os.readlink(os.path.join(base, "cwd"))
    except OSError:
        cwd = None
    out: dict[str, dict] = {}
    for item in conf_files(environ, home=environ.get("HOME", ""), root=root, cwd=cwd):
        for name, value in item["effective"].items():
            if name.startswith("NCCL_"):
                out.setdefault(name, {"value": value, "path": item["path"]})
    return out


def compare_env(profile_env: dict[str, str], environ: dict[str, str],
                conf: dict[str, dict] | None = None) -> tuple[list[VarCheck], dict[str, str]]:
    """(one VarCheck per profile variable, NCCL_* in `environ` that the profile lacks).

    `conf`: what conf files supply (conf_supply); a variable missing from the environment
    but supplied there is "conf" (same value) or "conf-different".
    """
    checks = []
    conf = conf or {}
    for name, expected in profile_env.items():
        actual = environ.get(name)
        if actual is None and name in conf:
            value = conf[name]["value"]
            checks.append(VarCheck(name, expected, value,
                                   "conf" if value == expected else "conf-different",
                                   conf[name]["path"]))
            continue
        status = "missing" if actual is None else ("ok" if actual == expected else "different")
        checks.append(VarCheck(name, expected, actual, status))
    extra = {k: environ[k] for k in sorted(environ)
             if k.startswith("NCCL_") and k not in profile_env}
    return checks, extra


def check_process(profile_env: dict[str, str], pid: int) -> ProcessCheck:
    """Compare one process with the profile; raises ProcessGone when it is not there."""
    ppid, cmdline = read_ppid(pid), read_cmdline(pid)
    if is_zombie(pid):
        raise ProcessGone(pid)
    try:
        environ = read_environ(pid)
    except PermissionError as exc:
        return ProcessCheck(pid, ppid, cmdline, error=f"cannot read its environment: "
                                                     f"{exc.strerror or 'permission denied'}")
    conf = conf_supply(pid, environ)
    variables, extra = compare_env(profile_env, environ, conf)
    return ProcessCheck(pid, ppid, cmdline, variables, extra, conf=conf)


def check_processes(profile_env: dict[str, str], pid: int, tree: bool = False) -> list[ProcessCheck]:
    """Compare `pid` (and, with `tree`, all its descendants) with `profile_env`.

    Returns one ProcessCheck per process, `pid` first. NcclTuneError when `pid` itself
    does not exist (or is a zombie) or its environment cannot be read (the CLI's exit
    2); descendants that exit meanwhile are left out, unreadable ones carry an `error`.
    """
    try:
        root = check_process(profile_env, pid)
    except ProcessGone:
        raise NcclTuneError(f"no process with pid {pid}") from None
    if root.error:
        raise NcclTuneError(f"pid {pid}: {root.error}")
    results = [root]
    if tree:
        for child in descendants(pid):
            try:
                results.append(check_process(profile_env, child))
            except ProcessGone:
                continue
    return results


def all_ok(results: list[ProcessCheck]) -> bool:
    """True when every process matched."""
    return all(r.ok for r in results)
