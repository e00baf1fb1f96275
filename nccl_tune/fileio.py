"""Every file the tool writes or reads goes through here: the contract at the edges
(DESIGN.md section 8). Bottom layer: imports only nccl_tune.errors.

Outputs (`check_output`, before any work starts):

- never the same file as an input (the resolved path, and device + inode, so a hard link
  or a symbolic link to an input is caught too);
- never under /proc or /sys, never a folder, never a device or pipe (except /dev/null
  for results and text, which discards them);
- the folder must exist and be writable *by this process*: the test is a real one (a
  temporary file is created and removed), because `os.access` says yes to root for a
  folder whose mode bits say no, and only the kernel knows about read-only mounts,
  immutable folders and root-squashing network file systems;
- RESULTS (JSON Lines, appended): an existing non-empty file must be one of this tool's
  results files (`results_file_problem`: a record among its first lines, the rule the
  results readers apply too), so results are never appended to a profile or a model file;
- PLOT: one suffix rule. A suffix matplotlib can write (`PLOT_SUFFIXES`) is kept;
  anything else gets `.png` added, and the returned path is the one really written, so
  the command can say it truly.

Exports, plots and every other whole-file output are written atomically
(`write_atomic`, `replacing`): a temporary file in the same folder, flushed to disk,
renamed over the target. A failure at any point (a full disk, a quota, Ctrl-C) leaves
the old file as it was and no temporary or empty file behind.

Results appends (`ResultsLock`, `append_line`) take an exclusive `flock` on the results
file. The policy is REFUSE, not wait: a run that writes results (a sweep, a validate, a
microbench, an import) holds the lock from before its first record until it ends, and a
second writer is refused at once with one line naming the file (and the holder's pid
when /proc/locks shows it). Waiting would turn two sweeps to one file into one sweep
measured twice, or leave a command hanging for hours behind another; refusing says what
is happening. On a file system that cannot lock at all (NFS without lockd) the run
writes unlocked rather than not at all. `check_not_busy` asks the same question early,
for a command whose writer is a process it has yet to start (bench, before torchrun). Within one process every append goes through the held lock; an append
without a held lock takes the lock for that one line. Readers take no lock: a record is
one `write` of one line, and a reader that sees a torn last line skips it with a warning.
/dev/null, the one device a results output may be, takes appends without a lock or fsync.

Inputs (`read_text`, `load_json`, `iter_lines`): strict UTF-8, a size cap per format, a
line-length cap, JSON nesting checked without recursion (before the parser sees it) and
NaN / Infinity / out-of-range numbers refused. Each problem is one NcclTuneError naming
the file (and line): exit 2, before anything runs, in well under a second. A named pipe
is read once a process writes to it; with no writer after PIPE_WAIT_S it is refused too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import signal
import stat
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from itertools import accumulate
from pathlib import Path
from typing import Any

from nccl_tune.errors import NcclTuneError, WriteFailed

MiB = 1024 * 1024

# Caps. A format that needs more says so at its reader.
MAX_TEXT_BYTES = 16 * MiB  # a profile, grid, topology paste, nccl-tests output, conf file
MAX_JSON_BYTES = 4 * MiB  # a model file, a plan (the depth check reads every bracket)
MAX_JSON_DEPTH = 32  # deeper than any of the tool's JSON formats
MAX_LINE_BYTES = 1 * MiB  # one line of a results file (a record with thousands of samples)
MAX_LOG_LINE = 64 * 1024  # a log line is matched only up to here (see iter_lines)

# Suffixes matplotlib's default backends write (FigureCanvasBase.get_supported_filetypes()
# with Agg, PDF, PS, SVG and PGF, matplotlib 3.6-3.10); tests/test_fileio.py checks the
# list against the installed matplotlib.
PLOT_SUFFIXES = frozenset(
    {"eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp"}
)
PLOT_DEFAULT_SUFFIX = "png"

KERNEL_TREES = ("/proc", "/sys")


class OutputKind(str, Enum):
    """What an output is, which decides how it is checked and written."""

    RESULTS = "results"  # JSON Lines, appended under an exclusive lock
    EXPORT = "export"  # a profile, conf file, tuner CSV, model file: replaced atomically
    PLOT = "plot"  # an image; one suffix rule
    TEXT = "text"  # any other written file


# ---------------------------------------------------------------- outputs


def _label(path, option: str | None) -> str:
    return f"{option} {path}" if option else str(path)


def plot_path(path) -> Path:
    """The file a plot asked for as `path` is written to: `path` when its suffix is one
    matplotlib writes, else `path` + '.png' (one rule for every command)."""
    path = Path(path)
    suffix = path.suffix[1:].lower()
    return path if suffix in PLOT_SUFFIXES else path.with_name(path.name + "." + PLOT_DEFAULT_SUFFIX)


def _under_kernel_tree(resolved: str) -> str | None:
    for tree in KERNEL_TREES:
        if resolved == tree or resolved.startswith(tree + "/"):
            return tree
    return None


def _same_file(output: str, resolved: str, given) -> bool:
    """True when `output` (resolved to `resolved`) names the same file as the input `given`."""
    if os.path.realpath(os.path.expanduser(str(given))) == resolved:
        return True
    try:
        a, b = os.stat(output), os.stat(os.path.expanduser(str(given)))
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _probe_folder(folder: str) -> str | None:
    """Why this process cannot create a file in `folder`, or None when it can.

    A real create-and-remove: the kernel decides, for root as for anyone (mode bits,
    read-only mounts, immutable folders, network file systems that squash root)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is not writable"
    try:
        fd, probe = tempfile.mkstemp(prefix=".nccl-tune-probe-", dir=folder)
    except OSError as exc:
        return f"is not writable ({exc.strerror})"
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return None


def _probe_append(path: str) -> str | None:
    """Why this process cannot append to the existing file `path`, or None."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot be appended to ({exc.strerror})"
    os.close(fd)
    return None


def is_results_line(raw: bytes | str) -> bool:
    """True when one line is a record of this tool's results format: a JSON object with
    a positive integer `schema` and a `cell` key (nccl_tune.store writes every record so)."""
    if not raw.lstrip().startswith(b"{" if isinstance(raw, bytes) else "{"):
        return False
    try:
        record = json_line(raw)
    except ValueError:
        return False
    schema = record.get("schema") if isinstance(record, dict) else None
    return isinstance(schema, int) and not isinstance(schema, bool) and schema >= 1 and "cell" in record


def check_output(path, *, kind: OutputKind, inputs: Sequence = (), option: str | None = None) -> Path:
    """Refuse an output that would lose data or cannot be written; return the path to write.

    NcclTuneError (exit 2, one line naming `option` and the path) when the output is the
    same file as any of `inputs`, lies under /proc or /sys, is a folder or not a regular
    file, sits in a folder that does not exist or that this process cannot write, or (for
    RESULTS) is an existing file whose first line is not one of this tool's records. For
    PLOT the returned path carries the suffix rule (`plot_path`). Call it before any work.
    """
    kind = OutputKind(kind)
    label = _label(path, option)
    given = os.path.expanduser(str(path))
    if not given:
        raise NcclTuneError(f"{option or 'output'}: an empty path")
    if os.path.isdir(given):
        raise NcclTuneError(f"{label}: is a folder; give a file name")
    target = str(plot_path(given)) if kind is OutputKind.PLOT else given
    if target != given:
        label = f"{label} (written as {target})"
    resolved = os.path.realpath(target)
    tree = _under_kernel_tree(resolved)
    if tree:
        raise NcclTuneError(f"{label}: is under {tree}, a kernel file system, not a place for output")
    for source in inputs:
        if source is None or str(source) == "":
            continue
        if _same_file(target, resolved, source):
            raise NcclTuneError(f"{label}: is the same file as the input {source}; write to another file")
    try:
        info = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):  # the folder check below says which
        info = None
    except OSError as exc:
        raise NcclTuneError(f"{label}: cannot be checked ({exc.strerror})") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise NcclTuneError(f"{label}: is a folder; give a file name")
    appended = kind in (OutputKind.RESULTS, OutputKind.TEXT)
    if info is not None and not stat.S_ISREG(info.st_mode):
        if not (appended and resolved == os.devnull):
            raise NcclTuneError(f"{label}: is not a regular file (a device, pipe or socket)")
        return Path(target)
    folder = os.path.dirname(resolved) or "."
    if not os.path.isdir(folder):
        shown = os.path.dirname(os.path.abspath(target))
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise NcclTuneError(f"{label}: the folder {shown} {what}")
    if info is not None and appended:
        why = _probe_append(target)
    else:
        why = _probe_folder(folder)
        why = f"the folder {folder} {why}" if why else None
    if why:
        raise NcclTuneError(f"{label}: {why}")
    if kind is OutputKind.RESULTS and info is not None and info.st_size > 0:
        try:
            problem = results_file_problem(target)
        except NcclTuneError as exc:
            raise NcclTuneError(f"{label}: {exc.message}") from None
        if problem:
            raise NcclTuneError(
                f"{label}: exists and is not a nccl-tune results file ({problem}); "
                "results are appended only to results files: choose another file"
            )
    return Path(target)


def check_outputs(outputs: Sequence[tuple[str, Any, OutputKind]], *, inputs: Sequence = ()) -> dict[str, Path]:
    """`check_output` for each (option, path, kind) given a path, and no two of them
    naming one file: {option: the path that will be written}. For commands that write
    several files (recommend's --export, --export-conf, --tuner-csv and --plot)."""
    checked: dict[str, Path] = {}
    for option, path, kind in outputs:
        if path is None or str(path) == "":
            continue
        target = check_output(path, kind=kind, inputs=inputs, option=option)
        resolved = os.path.realpath(target)
        for other, earlier in checked.items():
            if os.path.realpath(earlier) == resolved:
                raise NcclTuneError(
                    f"{_label(path, option)}: is the same file as {other} {earlier}; give each output its own file"
                )
        checked[option] = target
    return checked


def check_not_busy(path, *, option: str | None = None) -> None:
    """Refuse (NcclTuneError) a results file another process is writing now: for a
    command that checks before it starts processes that will take the lock themselves
    (bench: rank 0 of the microbench writes). Commands that write in their own process
    just take the lock (`ResultsLock`), which refuses the same way."""
    info = None
    try:
        info = os.stat(path)
    except OSError:
        return
    if (info.st_dev, info.st_ino) in _HELD:
        return
    holder = _busy(str(path))
    if holder is not None:
        who = f"another process (pid {holder})" if holder else "another process"
        raise NcclTuneError(
            f"{_label(path, option)}: {who} is writing results to this file; wait "
            "for it to finish or choose another file"
        )


def _busy(path: str) -> int | None:
    """None when no process holds the results lock on `path`; else the holder's pid (0
    when /proc/locks does not say). Takes the lock and lets it go at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _HELD_ERRNOS:
            return _lock_holder(os.fstat(fd)) or 0
        return None  # a file system without locks: nothing can be known (see ResultsLock)
    finally:
        os.close(fd)
    return None


def _new_file_mode() -> int:
    """The mode open() would give a new file under the current umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder; the rename is still atomic
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path) -> Iterator[str]:
    """Yield a temporary path beside `path`; on a clean exit it is synced and renamed
    over `path` (symbolic links followed, so a linked file is replaced, not the link).

    On any failure inside the block or while renaming, the temporary file is removed and
    `path` is left as it was: WriteFailed (exit 1) naming the file for an OSError (a full
    disk, a quota), the original exception otherwise (Ctrl-C stays Ctrl-C).
    """
    shown = str(path)
    target = os.path.realpath(os.path.expanduser(shown))
    folder = os.path.dirname(target)
    try:
        fd, temp = tempfile.mkstemp(prefix=".nccl-tune-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteFailed(f"cannot write: {exc.strerror}", path=shown) from None
    os.close(fd)
    try:
        yield temp
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            mode = _new_file_mode()
        os.chmod(temp, mode)
        os.replace(temp, target)
    except OSError as exc:
        _unlink(temp)
        raise WriteFailed(f"cannot write: {exc.strerror or exc}", path=shown) from None
    except BaseException:
        _unlink(temp)
        raise
    _fsync_folder(folder)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_atomic(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically: readers see the old file or the new one,
    never half of one, and a failure (ENOSPC, EDQUOT, EFBIG, Ctrl-C) leaves the old file
    intact and nothing else behind. WriteFailed (exit 1) naming the file on an OSError."""
    data = text.encode("utf-8")
    with replacing(path) as temp:
        with open(temp, "wb") as handle:
            handle.write(data)


# ---------------------------------------------------------------- results appends


def _lock_holder(info: os.stat_result) -> int | None:
    """The pid holding a flock on the file `info` describes, from /proc/locks (Linux)."""
    want = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            for line in handle:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want:
                    return int(parts[4]) if parts[4].isdigit() else None
    except OSError:
        return None
    return None


_HELD: dict[tuple[int, int], ResultsLock] = {}  # (st_dev, st_ino) -> this process's lock
_HELD_ERRNOS = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)  # another process holds it
# A file system that cannot lock (an NFS mount without lockd, some FUSE file systems):
# refusing every write there would make the tool useless on shared home folders, so the
# run writes without the lock (appends stay whole lines, each one write).
_NO_LOCKS_ERRNOS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class ResultsLock:
    """An exclusive flock on a results file, held for a whole run (see the module
    docstring: a second writer is refused, never kept waiting).

    `with ResultsLock(path, option="--out"):` creates the file when it is missing and
    appends through the held descriptor; `append_line(path, ...)` anywhere in the same
    process uses it. A file this lock created and nothing was written to is removed on
    release, so a run that fails before its first record leaves no empty file.
    """

    def __init__(self, path, *, option: str | None = None):
        self.path = str(path)
        self.option = option
        self.fd: int | None = None
        self.created = False
        self.locked = True  # False on a file system without locks (see _NO_LOCKS_ERRNOS)
        self.key: tuple[int, int] | None = None
        self.regular = True  # False for /dev/null: nothing to lock, sync or cut back

    def acquire(self) -> ResultsLock:
        """Open (creating) and lock the file; NcclTuneError when another process holds it."""
        label = _label(self.path, self.option)
        try:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o666)
                self.created = True
            except FileExistsError:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise NcclTuneError(f"{label}: cannot open for appending ({exc.strerror})") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # /dev/null (the one device check_output allows): discards
            self.fd, self.locked, self.regular = fd, False, False
            return self
        key = (info.st_dev, info.st_ino)
        if key in _HELD:
            os.close(fd)
            raise NcclTuneError(f"{label}: this process is already writing it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _NO_LOCKS_ERRNOS:  # a file system without locks: write unlocked
                self.fd, self.key, self.locked = fd, key, False
                _HELD[key] = self
                return self
            os.close(fd)
            if exc.errno not in _HELD_ERRNOS:
                raise NcclTuneError(f"{label}: cannot lock ({exc.strerror})") from None
            holder = _lock_holder(info)
            who = f"another process (pid {holder})" if holder else "another process"
            raise NcclTuneError(
                f"{label}: {who} is writing results to this file; wait for it to finish or choose another file"
            ) from None
        self.fd, self.key = fd, key
        _HELD[key] = self
        return self

    def append(self, data: bytes) -> None:
        """Append `data` (whole lines) with one write; on failure the file is cut back to
        where it was, so no torn line is left behind (WriteFailed naming the file: exit 1)."""
        assert self.fd is not None, "append on a released ResultsLock"
        if not self.regular:
            _write_all(self.fd, data)
            return
        start = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            prefix = b""
            if start > 0 and _last_byte(self.path, start) != b"\n":
                prefix = b"\n"  # a torn last line (a crash mid-write): start a line of our own
            _write_all(self.fd, prefix + data)
            os.fsync(self.fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise WriteFailed(f"cannot append: {exc.strerror or exc}", path=self.path) from None

    def release(self) -> None:
        """Unlock and close; remove the file when this lock created it and it is still empty."""
        if self.fd is None:
            return
        try:
            if self.created and self.regular and os.fstat(self.fd).st_size == 0:
                _unlink(self.path)
        finally:
            _HELD.pop(self.key, None)
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None

    def __enter__(self) -> ResultsLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _last_byte(path: str, size: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        return handle.read(1)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def held(path) -> ResultsLock | None:
    """This process's lock on the results file `path`, or None."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _HELD.get((info.st_dev, info.st_ino))


def append_line(path, line: str) -> None:
    """Append one line (no newline in it) to a results file under its exclusive lock:
    this process's held `ResultsLock` when there is one, else the lock taken for this
    append alone (refused when another process holds it)."""
    append_lines(path, [line])


def append_lines(path, lines: Sequence[str]) -> None:
    """Append `lines` with one write under the results lock (see `append_line`): all of
    them or, when the write fails (a full disk), none."""
    if not lines:
        return
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    lock = held(path)
    if lock is not None:
        lock.append(data)
        return
    with ResultsLock(path) as lock:
        lock.append(data)


# ---------------------------------------------------------------- inputs


def _a(what: str) -> str:
    """'a grid file', 'an NCCL log', 'an SGLang log': the article by how the word sounds."""
    first = what.split()[0] if what.split() else what
    if first.isupper() or (first[:2].isupper() and len(first) > 1):  # an acronym: by its letter
        vowel = first[:1] in "AEFHILMNORSX"
    else:
        vowel = first[:1].lower() in "aeiou"
    return ("an " if vowel else "a ") + what


def _size_words(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"


# A named pipe (mkfifo) is read once a process opens it for writing; until then open()
# blocks. An input no process writes to is refused after this long, not waited on forever.
PIPE_WAIT_S = 5.0


class _PipeWait(Exception):
    """Raised by the SIGALRM handler that bounds the open of a named pipe."""


def _expired(signum, frame):
    raise _PipeWait


def _open_pipe(real: str, shown: str):
    """`open(real, 'rb')` of a named pipe, waiting at most PIPE_WAIT_S for a writer (an
    alarm interrupts the blocked open; only the main thread can take signals, so another
    thread opens it plainly). A pipe from `<(command)` has its writer already and opens at once."""
    if threading.current_thread() is not threading.main_thread():
        return open(real, "rb")
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, PIPE_WAIT_S)
    try:
        return open(real, "rb")
    except _PipeWait:
        raise NcclTuneError(
            f"a named pipe that no process writes to (waited {PIPE_WAIT_S:g} s for a writer)", path=shown
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _open_input(path, what: str):
    real = os.path.expanduser(str(path))
    try:
        if stat.S_ISFIFO(os.stat(real).st_mode):
            return _open_pipe(real, str(path))
        return open(real, "rb")
    except IsADirectoryError:
        raise NcclTuneError(f"is a folder, not {_a(what)}", path=str(path)) from None
    except OSError as exc:
        raise NcclTuneError(f"cannot read the {what}: {exc.strerror}", path=str(path)) from None


def _decode(data: bytes, path: str, what: str, first_line: int = 1) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + first_line
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise NcclTuneError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}); {_a(what)} is UTF-8",
            path=path,
            line=line,
        ) from None


def _char_boundary(raw: bytes) -> bytes:
    """`raw` cut before a UTF-8 sequence that a length cap split in two."""
    end = len(raw)
    while end > 0 and len(raw) - end < 4 and raw[end - 1] & 0xC0 == 0x80:
        end -= 1  # continuation bytes
    if end > 0 and raw[end - 1] >= 0xC0:  # the lead byte of the split sequence
        lead = raw[end - 1]
        need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if len(raw) - (end - 1) < need:
            return raw[: end - 1]
    return raw


def read_bytes(path, *, what: str, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """A file's bytes, at most `max_bytes` (NcclTuneError naming the file beyond it, or
    when it cannot be read). Pipes and /proc files are read up to the cap too."""
    shown = str(path)
    with _open_input(path, what) as handle:
        try:
            info = os.fstat(handle.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise NcclTuneError(f"is a folder, not {_a(what)}", path=shown)
            if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
                raise NcclTuneError(
                    f"{_size_words(info.st_size)}: more than the {_size_words(max_bytes)} {_a(what)} may have",
                    path=shown,
                )
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise NcclTuneError(f"cannot read the {what}: {exc.strerror}", path=shown) from None
    if len(data) > max_bytes:
        raise NcclTuneError(f"more than the {_size_words(max_bytes)} {_a(what)} may have", path=shown)
    return data


def read_size(path, *, what: str) -> int | None:
    """The size of the regular file `path` (None for a pipe or device); NcclTuneError
    naming it when it cannot be read or is a folder."""
    with _open_input(path, what) as handle:
        info = os.fstat(handle.fileno())
    if stat.S_ISDIR(info.st_mode):
        raise NcclTuneError(f"is a folder, not {_a(what)}", path=str(path))
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def read_text(path, *, what: str, max_bytes: int = MAX_TEXT_BYTES, max_line: int | None = None) -> str:
    """A file's text: strict UTF-8, at most `max_bytes`, each line at most `max_line`
    characters when given. NcclTuneError naming the file (and line) otherwise."""
    shown = str(path)
    text = _decode(read_bytes(path, what=what, max_bytes=max_bytes), shown, what)
    if max_line is not None and len(text) > max_line:
        for number, line in enumerate(text.split("\n"), start=1):
            if len(line) > max_line:
                raise NcclTuneError(
                    f"a line of {len(line)} characters: more than the {max_line} {_a(what)} line may have",
                    path=shown,
                    line=number,
                )
    return text


def bracket_depth(text: str) -> int:
    """How deeply `[`/`{` nest in `text` (every bracket counts: strip strings first), by
    the running balance's maximum, without recursion and in linear time."""
    brackets = re.sub(r"[^\[\]{}]+", "", text)
    if not brackets:
        return 0
    steps = array("b")
    steps.frombytes(brackets.encode("ascii").translate(bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")))
    return max(0, max(accumulate(steps)))


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON `text`, computed without recursion and
    in linear time: escapes, then strings are removed (linear regular expressions: no
    nested or overlapping quantifiers), then `bracket_depth`."""
    return bracket_depth(re.sub(r'"[^"]*"', "", re.sub(r"\\.", "", text, flags=re.S)))


MAX_LINE_DEPTH = 16  # one JSON Lines record (a results record nests 4 deep)


def json_line(raw: bytes | str, *, max_depth: int = MAX_LINE_DEPTH) -> Any:
    """One line of JSON Lines, its nesting checked first (without recursion): ValueError
    with a short reason ('not JSON (...)', 'nested N levels deep') when it is not one."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from None
    if raw.count("[") + raw.count("{") > max_depth:  # the cheap test first: most lines pass it
        depth = json_depth(raw)
        if depth > max_depth:
            raise ValueError(f"nested {depth} levels deep (a record nests at most {max_depth})")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str, *, path: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON `text` read from `path` by the input policy (see `load_json`)."""
    depth = json_depth(text)
    if depth > max_depth:
        raise NcclTuneError(f"nested {depth} levels deep: {_a(what)} nests at most {max_depth}", path=path)
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise NcclTuneError(
            f"not JSON ({exc.msg}, column {exc.colno}); {_a(what)} is JSON", path=path, line=exc.lineno
        ) from None
    except (ValueError, RecursionError) as exc:  # NaN, Infinity, a 5,000-digit integer
        raise NcclTuneError(f"not valid JSON for {_a(what)}: {exc}", path=path) from None
    bad = _non_finite(data)
    if bad is not None:
        raise NcclTuneError(f"the number {bad} is out of range; {_a(what)} holds finite numbers", path=path)
    return data


def wrong_type(path, name: str, value: Any, expected: str, *, line: int | None = None) -> NcclTuneError:
    """The one-line error for a schema value of the wrong type: 'field NAME is VALUE,
    expected EXPECTED' naming the file (the value shown as JSON, cut at 60 characters)."""
    shown = json.dumps(value, default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return NcclTuneError(f"field {name} is {shown}, expected {expected}", path=str(path), line=line)


def is_number(value: Any) -> bool:
    """A JSON number that is not a boolean (JSON's true is no count or latency)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """A JSON integer that is not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def _non_finite(data: Any) -> str | None:
    """The first number that JSON decoded to infinity (1e400), or None: an explicit stack."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return repr(item)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def load_json(path, *, what: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file's value by the input policy: strict UTF-8, at most `max_bytes`, nested
    at most `max_depth` (checked before parsing, without recursion), no NaN, Infinity or
    numbers out of range. NcclTuneError naming the file (and line) otherwise."""
    return parse_json(read_text(path, what=what, max_bytes=max_bytes), path=str(path), what=what, max_depth=max_depth)


def iter_byte_lines(
    path, *, what: str, max_line: int = MAX_LINE_BYTES, on_long: Callable[[int, int], None] | None = None
) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the newline) of a file of any size, streamed.

    A line longer than `max_line` bytes is cut there (the rest is read and dropped in
    fixed-size pieces, so memory and time stay linear) and reported through
    `on_long(number, length)`; without `on_long` it is an NcclTuneError naming the line.
    """
    shown = str(path)
    with _open_input(path, what) as handle:
        number = 0
        while True:
            try:
                raw = handle.readline(max_line + 1)
            except OSError as exc:
                raise NcclTuneError(f"cannot read the {what}: {exc.strerror}", path=shown) from None
            if not raw:
                return
            number += 1
            if len(raw) > max_line and not raw.endswith(b"\n"):
                length = len(raw)
                while True:  # drop the rest of the line
                    more = handle.readline(MiB)
                    length += len(more)
                    if not more or more.endswith(b"\n"):
                        length -= more.endswith(b"\n")
                        break
                if on_long is None:
                    raise NcclTuneError(
                        f"a line of {length} bytes: more than the {_size_words(max_line)} {_a(what)} line may have",
                        path=shown,
                        line=number,
                    )
                on_long(number, length)
                raw = _char_boundary(raw[:max_line])
            yield number, raw.rstrip(b"\n").rstrip(b"\r")


def iter_lines(
    path,
    *,
    what: str,
    max_line: int = MAX_LINE_BYTES,
    strict: bool = True,
    on_long: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[int, str]]:
    """(line number, text without the newline) of a file of any size, streamed: lines
    cut as `iter_byte_lines` cuts them. `strict`: bytes that are not UTF-8 are an
    NcclTuneError naming the line (a file a user gives); otherwise they are replaced (a
    log a run of the tool wrote itself, read after the run)."""
    shown = str(path)
    for number, raw in iter_byte_lines(path, what=what, max_line=max_line, on_long=on_long):
        if strict:
            yield number, _decode(raw, shown, what, first_line=number)
        else:
            yield number, raw.decode("utf-8", errors="replace")


RESULTS_PROBE_LINES = 8  # a results file has a record among its first non-blank lines


def results_file_problem(path) -> str | None:
    """Why the existing file `path` is not one of this tool's results files, or None.

    One rule for writers (`check_output`) and readers (nccl_tune.store): an empty file
    is one; otherwise a record (`is_results_line`) must be among its first
    RESULTS_PROBE_LINES non-blank lines (one torn or corrupt line at the top of a real
    results file does not disqualify it; a profile or a model file has none)."""
    seen = 0
    for _, raw in iter_byte_lines(
        path, what="results file", max_line=MAX_LINE_BYTES, on_long=lambda number, length: None
    ):
        if not raw.strip():
            continue
        if is_results_line(raw):
            return None
        seen += 1
        if seen >= RESULTS_PROBE_LINES:
            return f"none of its first {seen} lines is a nccl-tune record"
    return None if seen == 0 else "no line of it is a nccl-tune record"
