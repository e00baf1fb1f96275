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

Rewritten blocks: a process that calls setproctitle (vLLM's engine core and workers,
SGLang's schedulers) overwrites that memory with its title and NUL padding, so
/proc/PID/environ shows a remnant, not its environment. Such a block is recognised
(`rewritten_block`: empty entries or entries without `=`), and the environment is then
read from the process's memory instead (nccl_tune.live.procmem: setproctitle keeps a copy of
every string behind libc's `environ`). Where that is refused, the nearest ancestor whose
environment could be read stands in: the process inherited it (`spawned`: it exec'd a
new program, e.g. multiprocessing's spawn; `forked`: it shares the ancestor's start-up
memory) unless it changed its own environment since, which only NCCL's own `set by
environment` log lines of that rank prove (`nccl-tune logs nccl`).

Roles (`role_of`): vLLM's API server, `VLLM::EngineCore` and `VLLM::Worker_TP<N>`;
SGLang's launcher (API server), `sglang::scheduler_TP<N>` and detokenizer.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from nccl_tune.errors import NcclTuneError

PROC = "/proc"
OK_STATUSES = ("ok", "inherited", "conf")


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
    status: str  # "ok" | "missing" | "different" | "inherited" | "conf" | "conf-different"
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
    role: str | None = None  # API server, engine core, TP worker N, ... (role_of)
    env_source: str | None = None  # environ | memory | inherited
    rewritten: bool = False  # its /proc/PID/environ block was overwritten (setproctitle)
    inherited_from: int | None = None  # the confirmed ancestor, for env_source inherited
    inheritance: list[str] = field(default_factory=list)  # spawned/forked, ancestor first
    note: str | None = None  # how the environment was established, in words
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
    return _parse_block(_settled_environ(pid))


def rewritten_block(raw: bytes) -> bool:
    """True when an environ block is not what execve wrote: execve writes `KEY=VALUE`
    strings back to back, so an empty entry (NUL padding) or one without `=` (title
    text) means the process overwrote the area (setproctitle does both)."""
    entries = raw.split(b"\0")
    if entries and entries[-1] == b"":
        entries.pop()  # the terminator of the last string
    return any(not e or b"=" not in e for e in entries)


def _parse_block(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
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
    return stat[stat.rfind(")") + 2 :].split()


def read_ppid(pid: int) -> int | None:
    """The parent pid from /proc/PID/stat, or None when it cannot be read."""
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def read_comm(pid: int) -> str:
    """The kernel's short name of `pid` (/proc/PID/comm; setproctitle sets it too)."""
    try:
        return _read_bytes(pid, "comm").decode("utf-8", "replace").strip()
    except (ProcessGone, PermissionError):
        return ""


def memory_layout(pid: int) -> tuple[int, ...] | None:
    """(arg_start, arg_end, env_start, env_end) of /proc/PID/stat, or None."""
    fields = _stat_fields(pid)
    # stat fields 48-51 (1-based, pid first); _stat_fields starts at field 3 (state)
    if len(fields) < 49 or not all(f.isdigit() for f in fields[45:49]):
        return None
    return tuple(int(f) for f in fields[45:49])


_TITLE_RE = re.compile(r"^(?P<engine>VLLM|sglang)::(?P<name>\S+)")
_TP_RE = re.compile(r"TP(\d+)")


def role_of(cmdline: list[str], comm: str = "") -> str | None:
    """A serving-engine process's role from its title or command line, or None.

    vLLM titles processes `VLLM::EngineCore`, `VLLM::Worker_TP0` (also `_DP`, `_PP`,
    `_EP` parts), `VLLM::APIServer_0`; SGLang `sglang::scheduler_TP0` (its TP workers),
    `sglang::detokenizer`. An untitled API server is known by its module.
    """
    text = " ".join(cmdline)
    match = _TITLE_RE.match(text) or _TITLE_RE.match(comm)
    if match:
        engine, name = ("vLLM" if match["engine"] == "VLLM" else "SGLang"), match["name"]
        tp = _TP_RE.search(name)
        lower = name.lower()
        if lower.startswith("enginecore"):
            return f"{engine} engine core"
        if lower.startswith("worker") or lower.startswith("scheduler"):
            kind = "scheduler, " if lower.startswith("scheduler") else ""
            # no TP part: one rank (0); a bare "_TP": the kernel's 15-byte comm cut it off
            number = tp.group(1) if tp else ("?" if name.endswith("TP") else "0")
            return f"{engine} {kind}TP worker {number}"
        if lower.startswith("apiserver"):
            return f"{engine} API server"
        return f"{engine} {name}"
    if "vllm.entrypoints" in text or (len(cmdline) > 1 and cmdline[0].endswith("vllm") and cmdline[1] == "serve"):
        return "vLLM API server"
    if "sglang.launch_server" in text:
        return "SGLang API server (launcher)"
    if "multiprocessing.resource_tracker" in text:
        return "resource tracker"
    if "multiprocessing.spawn" in text or "--multiprocessing-fork" in text:
        return "spawned worker (not yet titled)"
    return None


PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


def is_kernel_thread(pid: int) -> bool:
    """True for a kernel thread (kthreadd and its children): /proc/PID/stat's flags
    (field 9) carry PF_KTHREAD; its environ and cmdline read as a vanished process's."""
    fields = _stat_fields(pid)
    return len(fields) > 6 and fields[6].isdigit() and bool(int(fields[6]) & PF_KTHREAD)


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

    Read as NCCL would at its first lookup (nccl_tune.live.conffile): NCCL_CONF_FILE (relative
    to the process's working directory) or $HOME/.nccl.conf, then /etc/nccl.conf, inside
    the process's root (/proc/PID/root: a container's own files); values the environment
    already sets are not supplied. The files are read now, not when the process read them.
    """
    from nccl_tune.live.sysinfo import conf_files

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


def compare_env(
    profile_env: dict[str, str], environ: dict[str, str], conf: dict[str, dict] | None = None
) -> tuple[list[VarCheck], dict[str, str]]:
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
            checks.append(
                VarCheck(name, expected, value, "conf" if value == expected else "conf-different", conf[name]["path"])
            )
            continue
        status = "missing" if actual is None else ("ok" if actual == expected else "different")
        checks.append(VarCheck(name, expected, actual, status))
    extra = {k: environ[k] for k in sorted(environ) if k.startswith("NCCL_") and k not in profile_env}
    return checks, extra


def _settled_environ(pid: int, wait_s: float = 0.5) -> bytes:
    """/proc/PID/environ, waited for while the process is inside execve: the kernel
    switches to the new memory map before it lays out the new stack, so for a moment
    (after Popen has returned) both cmdline and environ read empty. A zombie or a
    kernel thread stays empty: after `wait_s` the empty block is returned as it is."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        raw = _read_bytes(pid, "environ")
        if raw or is_zombie(pid) or time.monotonic() >= deadline:
            return raw
        if _read_bytes(pid, "cmdline"):  # argv is laid out with environ: a truly empty env
            return _read_bytes(pid, "environ")
        time.sleep(0.005)


def read_process_env(pid: int) -> tuple[dict[str, str], str, bool, str | None]:
    """(environment, source, rewritten, why-not) of one process.

    source "environ": its /proc/PID/environ block as execve wrote it; "memory": the block
    was rewritten and the environment was read from its memory (nccl_tune.live.procmem);
    "remnant": rewritten and the memory could not be read (why-not says why): only what
    is left of the block. Raises ProcessGone and PermissionError as read_environ does.
    """
    from nccl_tune.live import procmem

    environ = read_environ(pid)
    if not rewritten_block(_read_bytes(pid, "environ")):
        return environ, "environ", False, None
    try:
        return procmem.read_environ_from_memory(pid), "memory", True, None
    except procmem.MemoryReadError as exc:
        return environ, "remnant", True, str(exc)


def _hop(parent: int, child: int) -> str:
    # exec'd children get a new stack (new argument/environment addresses); a fork
    # without exec keeps its parent's
    a, b = memory_layout(parent), memory_layout(child)
    return "forked" if a is not None and a == b else "spawned"


def nearest_confirmed_ancestor(pid: int, limit: int = 64) -> tuple[int, dict[str, str], str, list[str]] | None:
    """(ancestor pid, its environment, its source, hops ancestor-first) of the nearest
    ancestor whose environment could be read in full, or None."""
    hops: list[str] = []
    child, parent = pid, read_ppid(pid)
    while parent and parent > 0 and limit > 0:
        hops.insert(0, _hop(parent, child))
        try:
            env, source, _, _ = read_process_env(parent)
            if source in ("environ", "memory"):
                return parent, env, source, hops
        except (ProcessGone, PermissionError):
            return None
        child, parent, limit = parent, read_ppid(parent), limit - 1
    return None


def check_process(profile_env: dict[str, str], pid: int) -> ProcessCheck:
    """Compare one process with the profile; raises ProcessGone when it is not there."""
    if is_zombie(pid):
        raise ProcessGone(pid)
    try:  # the environment first: it waits out an execve in progress (argv comes with it)
        environ, source, rewritten, why = read_process_env(pid)
    except PermissionError as exc:
        ppid, cmdline = read_ppid(pid), read_cmdline(pid)
        role = role_of(cmdline, read_comm(pid))
        return ProcessCheck(
            pid, ppid, cmdline, error=f"cannot read its environment: {exc.strerror or 'permission denied'}", role=role
        )
    ppid, cmdline = read_ppid(pid), read_cmdline(pid)
    role = role_of(cmdline, read_comm(pid))
    conf = conf_supply(pid, environ)
    variables, extra = compare_env(profile_env, environ, conf)
    result = ProcessCheck(
        pid, ppid, cmdline, variables, extra, role=role, env_source=source, rewritten=rewritten, conf=conf
    )
    if source == "memory":
        result.note = "its environment block was rewritten (setproctitle); read from its memory instead (libc environ)"
    elif source == "remnant":
        _inherit(result, profile_env, why)
    return result


def _inherit(result: ProcessCheck, profile_env: dict[str, str], why: str | None) -> None:
    # a rewritten, unreadable process: what its nearest readable ancestor proves
    found = nearest_confirmed_ancestor(result.pid)
    result.note = f"its environment block was rewritten (setproctitle) and its memory could not be read ({why})"
    if found is None:
        result.env_source = None
        result.note += "; no readable ancestor: unverified"
        return
    ancestor, env, _, hops = found
    result.env_source, result.inherited_from, result.inheritance = "inherited", ancestor, hops
    result.note += (
        f"; inherited from pid {ancestor} ({' then '.join(hops)}); only NCCL's own "
        "'set by environment' lines of this rank prove it (nccl-tune logs nccl)"
    )
    checks = []
    for v in result.variables:
        if v.status == "missing" and env.get(v.name) == v.expected:
            checks.append(VarCheck(v.name, v.expected, env[v.name], "inherited"))
        else:
            checks.append(v)
    result.variables = checks
    for key, value in env.items():  # the ancestor's stray NCCL_* reached it too
        if key.startswith("NCCL_") and key not in profile_env:
            result.extra.setdefault(key, value)


def check_processes(profile_env: dict[str, str], pid: int, tree: bool = False) -> list[ProcessCheck]:
    """Compare `pid` (and, with `tree`, all its descendants) with `profile_env`.

    Returns one ProcessCheck per process, `pid` first. NcclTuneError when `pid` itself
    does not exist (or is a zombie) or its environment cannot be read (the CLI's exit
    2); descendants that exit meanwhile are left out, unreadable ones carry an `error`.
    """
    try:
        root = check_process(profile_env, pid)
    except ProcessGone:
        if is_kernel_thread(pid):  # its /proc files answer ESRCH, as a missing process's do
            raise NcclTuneError(
                f"pid {pid} ({read_comm(pid) or '?'}) is a kernel thread: it has "
                "no environment to check (give a server's pid)"
            ) from None
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
