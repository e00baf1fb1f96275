"""Capture NCCL's own log for --verify-effective: files, offsets, and quiet spells.

At process start, before any NCCL call, `NcclLogCapture.install()` sets
NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING and NCCL_DEBUG_FILE to a private
temporary folder (one file per process: NCCL expands %h and %p). Lines are
attributed to a cell by remembering every file's size before the cell's communicator
is created (`snapshot`) and reading what was added since (`read_since`).

The cost problem, and what this module does about it: NCCL writes the per-collective
TUNING line ("AllReduce: 14336 Bytes -> Algo RING proto LL ...") at every enqueue, on
rank 0, under a mutex, through a line-buffered file (a write(2) per line; NCCL
src/debug.cc). In graph mode that happens at capture only, so replays cost nothing. In
eager mode it would sit inside every timed interval. So timed iterations run "quiet"
(in graph mode too: each sample's aligning collective, microbench.timing, is eager):
`quiet()` switches NCCL_DEBUG_SUBSYS to INIT,ENV (keeping WARN and INFO init lines)
and NCCL_DEBUG_FILE to a new file, then calls NCCL's exported ncclResetDebugInit(),
which makes NCCL re-read those variables at its next log call; `loud()` switches back.
The warm-up and the correctness check run loud: they are the short untimed burst
whose log lines verify what ran. A new file name per spell matters: NCCL reopens the
file with "w" on re-initialisation, which would truncate the old one.

Where the loaded libnccl does not export ncclResetDebugInit (it exists from 2.24.3;
NCCL 2.20-2.23 lack it and write one unbuffered line per collective on rank 0; or NCCL
linked statically into torch), per-collective lines cannot be switched off later, so
`install(per_collective=False)` leaves TUNING out from the start: timed eager runs then
stay free of NCCL's logging, and nothing confirms the algorithm/protocol of eager
cells (their `effective.confirmed` is None and the record says why).

Warnings: with NCCL_DEBUG_FILE set, NCCL writes its WARN lines to the file, not to
stderr, so a launcher that reads the ranks' output never sees them. `warnings()` reads
them back from the files (ours, or the user's NCCL_DEBUG_FILE pattern expanded as NCCL
does) so a failing rank can put them in its error line. NCCL 2.30.7 writes
`[dev] file:line (func) NCCL WARN ...`; `warn_messages` reads both that form and the
older `[dev] file:line NCCL WARN ...` through nccl_tune.nccl.debuglog.parse_log_line.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import tempfile

LOUD_SUBSYS = "INIT,ENV,TUNING"
QUIET_SUBSYS = "INIT,ENV"


def loaded_nccl_paths(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of libnccl files mapped into this process (empty when none or unreadable)."""
    from nccl_tune.nccl import ncclinfo

    return ncclinfo.mapped_libraries(maps_path)


def find_reset_function():
    """NCCL's ncclResetDebugInit in the libnccl this process uses, or None."""
    candidates = loaded_nccl_paths()
    for path in candidates:
        try:
            return ctypes.CDLL(path).ncclResetDebugInit
        except (OSError, AttributeError):
            continue
    try:  # NCCL linked into an already-loaded library (the process's global namespace)
        return ctypes.CDLL(None).ncclResetDebugInit
    except (OSError, AttributeError):
        return None


def warn_messages(lines) -> list[str]:
    """The messages of NCCL WARN lines among `lines` (every NCCL release's form)."""
    from nccl_tune.nccl import debuglog

    out = []
    for raw in lines:
        entry = debuglog.parse_log_line(raw)
        if entry is not None and entry.kind == "warn":
            out.append(entry.message.strip())
    return [m for m in out if m]


def expand_debug_file(pattern: str, host: str | None = None, pid: int | None = None) -> str:
    """NCCL_DEBUG_FILE as NCCL expands it: %h the host name up to its first dot (with '%'
    and '/' made '-'), %p the pid, %% a '%', anything else kept (src/debug.cc)."""
    host = (host if host is not None else socket.gethostname()).split(".", 1)[0]
    host = host.replace("%", "-").replace("/", "-")
    pid = os.getpid() if pid is None else pid
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if char != "%" or i + 1 >= len(pattern):
            out.append(char if char != "%" else "%")
            i += 1
            continue
        code = pattern[i + 1]
        out.append({"%": "%", "h": host, "p": str(pid)}.get(code, "%" + code))
        i += 2
    return "".join(out)


def file_warnings(paths) -> list[str]:
    """NCCL WARN messages in the files `paths` (unreadable ones skipped)."""
    found = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                found += warn_messages(handle)
        except OSError:
            continue
    return found


def user_debug_file_warnings(environ=None, pid: int | None = None) -> list[str]:
    """Warnings NCCL wrote to the user's own NCCL_DEBUG_FILE (this process's file)."""
    environ = os.environ if environ is None else environ
    pattern = environ.get("NCCL_DEBUG_FILE")
    return file_warnings([expand_debug_file(pattern, pid=pid)]) if pattern else []


class NcclLogCapture:
    """NCCL's log of this process, written into a private folder and read back by offset."""

    def __init__(self, directory: str | None = None, environ=None, keep_in: str | None = None):
        self.environ = os.environ if environ is None else environ
        self.directory = directory or tempfile.mkdtemp(prefix="nccl-tune-log-")
        self.keep_in = keep_in  # cleanup moves the folder here instead of removing it
        self.spell = 0
        self.previous: dict[str, str | None] = {}
        self._reset = None
        self.reset_available: bool | None = None  # known after the first probe()
        self.per_collective = True  # TUNING lines in the loud spells (see install)

    def _file_pattern(self) -> str:
        # Zero-padded spell first, so sorted names are chronological.
        return os.path.join(self.directory, f"nccl.{self.spell:04d}.%h.%p.log")

    def install(self, per_collective: bool = True) -> dict[str, str | None]:
        """Point NCCL's log at the folder (call before any NCCL init); returns old values.

        `per_collective=False` leaves the per-collective TUNING lines out for the whole
        process (for an NCCL that cannot switch them off around timed eager runs).
        """
        for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
            self.previous[name] = self.environ.get(name)
        self.per_collective = per_collective
        self.environ["NCCL_DEBUG"] = "INFO"
        self.environ["NCCL_DEBUG_SUBSYS"] = LOUD_SUBSYS if per_collective else QUIET_SUBSYS
        self.environ["NCCL_DEBUG_FILE"] = self._file_pattern()
        return dict(self.previous)

    def files(self) -> list[str]:
        """The log files written so far, oldest first."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        return [os.path.join(self.directory, n) for n in names if n.endswith(".log")]

    def snapshot(self) -> dict[str, int]:
        """Size of every log file now: pass it to read_since later."""
        out = {}
        for path in self.files():
            try:
                out[path] = os.path.getsize(path)
            except OSError:
                continue
        return out

    def read_since(self, snapshot: dict[str, int], with_files: bool = False) -> list:
        """Lines added to the log files since `snapshot` (new files read whole); with
        `with_files`, (file name, line) pairs."""
        lines: list = []
        for path in self.files():
            try:
                with open(path, "rb") as handle:
                    handle.seek(snapshot.get(path, 0))
                    data = handle.read()
            except OSError:
                continue
            text = data.decode("utf-8", errors="replace")
            if text and not text.endswith("\n"):  # a line still being written: leave it
                text = text[: text.rfind("\n") + 1]
            name = os.path.basename(path)
            lines.extend((name, line) if with_files else line for line in text.splitlines())
        return lines

    def probe(self) -> bool:
        """Look up ncclResetDebugInit once (libnccl must be loaded); True when it exists."""
        if self.reset_available is None:
            self._reset = find_reset_function()
            self.reset_available = self._reset is not None
        return self.reset_available

    def _switch(self, subsys: str) -> bool:
        if not self.probe():
            return False
        self.spell += 1
        self.environ["NCCL_DEBUG_SUBSYS"] = subsys
        self.environ["NCCL_DEBUG_FILE"] = self._file_pattern()
        self._reset()
        return True

    def quiet(self) -> bool:
        """Stop per-collective lines (for timed eager iterations); False if NCCL cannot."""
        return self._switch(QUIET_SUBSYS)

    def loud(self) -> bool:
        """Log per-collective lines again (after a quiet spell)."""
        return self._switch(LOUD_SUBSYS if self.per_collective else QUIET_SUBSYS)

    def warnings(self) -> list[str]:
        """NCCL WARN messages in every log file of the folder, oldest first."""
        return file_warnings(self.files())

    def cleanup(self) -> None:
        """Remove the folder, or move it into `keep_in` (idempotent; every exit path calls
        it, see microbench.teardown)."""
        if self.keep_in and os.path.isdir(self.directory):
            try:
                shutil.move(self.directory, os.path.join(self.keep_in, os.path.basename(self.directory)))
                return
            except OSError:
                pass  # kept what moved; the rest goes below
        shutil.rmtree(self.directory, ignore_errors=True)
