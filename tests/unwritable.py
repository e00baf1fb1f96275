"""A folder this process cannot write, made honestly for a user and for root (CI runs
as root, and root writes through mode bits): mode 0555 for a user; for root a read-only
bind mount, else an immutable folder (chattr +i). When the kernel allows neither here,
`unwritable_folder` yields None and `without_dac_override` runs a command as root
without the capabilities that override mode bits, which then hold for it too."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

PR_CAPBSET_DROP = 24
# capability(7): CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_LINUX_IMMUTABLE
OVERRIDES = (1, 2, 3, 9)


def _run(*argv: str) -> bool:
    try:
        return subprocess.run(argv, capture_output=True).returncode == 0
    except OSError:
        return False


@contextlib.contextmanager
def unwritable_folder(parent: Path) -> Iterator[tuple[Path, str] | None]:
    """(folder, how) for a folder under `parent` this process cannot create files in,
    or None when root can make none here. The folder holds one file, `kept.txt`."""
    folder = parent / "ro"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept\n")
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder, "mode 0555"
        finally:
            folder.chmod(0o755)
        return
    if _run("mount", "--bind", "-o", "ro", str(folder), str(folder)):
        try:
            yield folder, "read-only bind mount"
        finally:
            _run("umount", str(folder))
        return
    if _run("chattr", "+i", str(folder)):
        try:
            yield folder, "immutable folder"
        finally:
            _run("chattr", "-i", str(folder))
        return
    folder.chmod(0o555)
    try:
        yield None
    finally:
        folder.chmod(0o755)


def drop_overrides() -> None:
    """preexec_fn: take the mode-bit overrides out of the bounding set, so the command
    this process executes runs as root without them (capabilities(7): a root execve
    gets the file's full permitted set ANDed with the bounding set)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in OVERRIDES:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
