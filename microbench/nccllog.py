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
eager mode it would sit inside every timed interval. So eager timing runs "quiet":
`quiet()` switches NCCL_DEBUG_SUBSYS to INIT,ENV (keeping WARN and INFO init lines)
and NCCL_DEBUG_FILE to a new file, then calls NCCL's exported ncclResetDebugInit(),
which makes NCCL re-read those variables at its next log call; `loud()` switches back.
The warm-up and the correctness check run loud: they are the short untimed burst
whose log lines verify what ran. A new file name per spell matters: NCCL reopens the
file with "w" on re-initialisation, which would truncate the old one.

Where the loaded libnccl does not export ncclResetDebugInit (older NCCL, or NCCL
linked statically into torch), quiet() returns False and the caller records that
eager latencies include NCCL's logging.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile

LOUD_SUBSYS = "INIT,ENV,TUNING"
QUIET_SUBSYS = "INIT,ENV"


def loaded_nccl_paths(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of libnccl files mapped into this process (empty when none or unreadable)."""
    found: list[str] = []
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                path = line.rsplit(" ", 1)[-1].strip()
                if "libnccl" in os.path.basename(path) and path.startswith("/") and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def find_reset_function():
    """NCCL's ncclResetDebugInit in the libnccl this process uses, or None."""
    candidates = loaded_nccl_paths()
    for path in candidates:
        try:
            return getattr(ctypes.CDLL(path), "ncclResetDebugInit")
        except (OSError, AttributeError):
            continue
    try:  # NCCL linked into an already-loaded library (the process's global namespace)
        return getattr(ctypes.CDLL(None), "ncclResetDebugInit")
    except (OSError, AttributeError):
        return None


class NcclLogCapture:
    """NCCL's log of this process, written into a private folder and read back by offset."""

    def __init__(self, directory: str | None = None, environ=None):
        self.environ = os.environ if environ is None else environ
        self.directory = directory or tempfile.mkdtemp(prefix="nccl-tune-log-")
        self.spell = 0
        self.previous: dict[str, str | None] = {}
        self._reset = None
        self.reset_available: bool | None = None  # known after the first quiet()

    def _file_pattern(self) -> str:
        # Zero-padded spell first, so sorted names are chronological.
        return os.path.join(self.directory, f"nccl.{self.spell:04d}.%h.%p.log")

    def install(self) -> dict[str, str | None]:
        """Point NCCL's log at the folder (call before any NCCL init); returns old values."""
        for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
            self.previous[name] = self.environ.get(name)
        self.environ["NCCL_DEBUG"] = "INFO"
        self.environ["NCCL_DEBUG_SUBSYS"] = LOUD_SUBSYS
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

    def read_since(self, snapshot: dict[str, int]) -> list[str]:
        """Lines added to the log files since `snapshot` (new files read whole)."""
        lines: list[str] = []
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
            lines.extend(text.splitlines())
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
        return self._switch(LOUD_SUBSYS)

    def cleanup(self) -> None:
        """Remove the folder."""
        shutil.rmtree(self.directory, ignore_errors=True)
