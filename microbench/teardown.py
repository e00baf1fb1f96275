"""Leave nothing behind on any exit: clean-up callbacks for every way a rank can end.

A rank ends normally, on an error (the entry point's os._exit), by its own watchdog
(os._exit(124)), or by a signal: torchrun sends SIGTERM to the other ranks as soon as
one fails, a scheduler sends SIGTERM or SIGHUP. os._exit skips atexit, and a rank
stuck in a CUDA or NCCL call never returns to Python, so a Python signal handler would
never run. Here: `run()` is called by the exit paths themselves (and by atexit for a
normal exit); for signals, the C-level handler Python installs writes the signal
number to a wakeup pipe from whatever thread receives it, and a watcher thread reads
it, runs the clean-ups and exits with 128 + the signal number, whatever the main
thread is blocked in. A SIGKILL or SIGABRT (torch's own teardown on a collective
timeout, which the microbench's watchdog is placed to pre-empt) cannot be caught.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable

SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_callbacks: list[Callable[[], object]] = []
_lock = threading.RLock()  # held through the clean-ups: a second exit waits for them
_watching = False


def add(callback: Callable[[], object]) -> None:
    """Run `callback` on every exit path (once; errors in it are ignored)."""
    with _lock:
        _callbacks.append(callback)


def run() -> None:
    """Run and forget every registered clean-up (idempotent; a concurrent caller waits
    until they are done, so no exit path ends the process half-way through them)."""
    with _lock:
        todo = list(_callbacks)
        _callbacks.clear()
        for callback in todo:
            try:
                callback()
            except Exception:
                pass


def exit_now(code: int) -> None:
    """Clean up, flush, and end the process with `code` without interpreter teardown."""
    run()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _on_signal(signum, frame) -> None:
    # Installed only so that Python's C-level handler (which feeds the wakeup pipe)
    # replaces the default action; the watcher thread does the exit, once.
    return None


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        for byte in data:
            if byte in [int(s) for s in SIGNALS]:
                exit_now(128 + byte)


def install() -> bool:
    """Watch SIGTERM/SIGHUP and run the clean-ups at exit; call from the main thread.

    Returns False where signals cannot be watched (not the main thread): atexit and the
    explicit exit paths still clean up.
    """
    global _watching
    atexit.register(run)
    if _watching:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for sig in SIGNALS:
            signal.signal(sig, _on_signal)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        return False
    threading.Thread(target=_watch, args=(read_fd,), name="microbench-teardown", daemon=True).start()
    _watching = True
    return True
