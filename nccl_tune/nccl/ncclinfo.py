"""What NCCL is installed: libraries, versions, variable names.

Library discovery works without a GPU: `ncclGetVersion` needs no device, and the
library's own strings list every NCCL_* variable it reads. What NCCL logs
(NCCL_DEBUG=INFO output) is parsed by nccl_tune.nccl.debuglog.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import mmap
import os
import re
import sys
from dataclasses import asdict, dataclass

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError

_VAR_RE = re.compile(rb"NCCL_[A-Z0-9_]{2,}")


@dataclass(frozen=True)
class NcclLibrary:
    """One libnccl found on this machine."""

    path: str
    source: str  # the NCCL wheel ("nvidia-nccl-cu12", "nvidia-nccl-cu13", ...) | "torch" |
    #              "LD_LIBRARY_PATH" | "system"
    version: str | None  # "2.21.5", or None when it could not be loaded
    error: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


def decode_version(code: int) -> tuple[int, int, int]:
    """NCCL_VERSION_CODE -> (major, minor, patch); codes changed scheme at 2.9."""
    if code >= 20900:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """'2.21.5' or '2.21.5+cuda12.4' -> (2, 21, 5); None when absent or unreadable."""
    if not text:
        return None
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text.strip())
    return tuple(int(g) for g in match.groups()) if match else None


def library_version(path: str) -> str:
    """Load `path` with ctypes and ask ncclGetVersion; raises OSError on failure."""
    lib = ctypes.CDLL(path)
    code = ctypes.c_int(0)
    result = lib.ncclGetVersion(ctypes.byref(code))
    if result != 0:
        raise OSError(f"ncclGetVersion returned {result}")
    return ".".join(map(str, decode_version(code.value)))


def nccl_wheels(site: str) -> list[str]:
    """The NCCL wheels installed in the folder `site` (nvidia-nccl-cu12, -cu13, ...), from
    their dist-info folders. Every one of them writes nvidia/nccl/lib/libnccl.so.2, so
    with two the file is whichever was installed last."""
    names = (
        os.path.basename(p).split("-", 1)[0].replace("_", "-").lower()
        for p in glob.glob(os.path.join(site, "nvidia_nccl_cu*.dist-info"))
    )
    return sorted(set(names))


def _pip_nccl_paths(search: list[str]) -> list[tuple[str, str]]:
    found = []
    for entry in search:
        source = "+".join(nccl_wheels(entry)) or "pip (nvidia/nccl)"
        found += [(path, source) for path in glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so*"))]
    return found


def mapped_libraries(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of the libnccl files mapped into this process, in order (empty when none or
    unreadable)."""
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


def _torch_lib_paths(search: list[str]) -> list[str]:
    found = []
    for entry in search:
        found += glob.glob(os.path.join(entry, "torch", "lib", "libnccl*.so*"))
    return found


def _ld_paths() -> list[str]:
    found = []
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if folder:
            found += glob.glob(os.path.join(folder, "libnccl.so*"))
    return found


def _system_paths() -> list[str]:
    patterns = [
        "/usr/lib/x86_64-linux-gnu/libnccl.so*",
        "/usr/lib/aarch64-linux-gnu/libnccl.so*",
        "/usr/lib64/libnccl.so*",
        "/usr/local/lib/libnccl.so*",
        "/usr/local/cuda*/lib64/libnccl.so*",
        "/usr/lib/libnccl.so*",
    ]
    found = []
    for pattern in patterns:
        found += glob.glob(pattern)
    return found


def find_libraries(load: bool = True, search: list[str] | None = None) -> list[NcclLibrary]:
    """Every libnccl this machine offers, one entry per real file, with its version.

    Order: the NCCL wheel's (nvidia-nccl-cu12 or -cu13: what a pip-installed CUDA torch
    loads), torch's bundled copy, LD_LIBRARY_PATH, then the system folders. `search` is
    the list of site folders to look in (default sys.path).
    """
    search = sys.path if search is None else search
    groups = [
        sorted(_pip_nccl_paths(search)),
        [(p, "torch") for p in sorted(_torch_lib_paths(search))],
        [(p, "LD_LIBRARY_PATH") for p in sorted(_ld_paths())],
        [(p, "system") for p in sorted(_system_paths())],
    ]
    seen: set[str] = set()
    out: list[NcclLibrary] = []
    for path, source in (item for group in groups for item in group):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        version, error = None, None
        if load:
            try:
                version = library_version(path)
            except OSError as exc:
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        out.append(NcclLibrary(path=path, source=source, version=version, error=error))
    return out


def default_library() -> NcclLibrary | None:
    """The library NCCL_* names are checked against: the first loadable one found."""
    for lib in find_libraries():
        if lib.version:
            return lib
    return None


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nccl-tune")


def variable_names(path: str, use_cache: bool = True) -> frozenset[str]:
    """Every NCCL_* token in the library's bytes (the names it reads, and a few more).

    The scan maps the file (hundreds of MB) once; the result is cached per path, size
    and mtime under ~/.cache/nccl-tune so later lints are instant.
    """
    stat = os.stat(path)
    key = hashlib.sha1(f"{os.path.realpath(path)}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = os.path.join(_cache_dir(), f"varnames-{key}.json")
    if use_cache and os.path.exists(cache):
        try:  # a cache of our own, still read by the input policy: a bad one is rebuilt
            cached = fileio.load_json(cache, what="cache file", max_depth=1)
        except NcclTuneError:
            cached = None
        if isinstance(cached, list) and all(isinstance(n, str) for n in cached):
            return frozenset(cached)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        names = frozenset(m.group().decode() for m in _VAR_RE.finditer(data))
    if use_cache:
        try:
            os.makedirs(_cache_dir(), exist_ok=True)
            fileio.write_atomic(cache, json.dumps(sorted(names)))
        except (OSError, NcclTuneError):
            pass  # no cache: the next lint scans again
    return names
