"""The libnccl this process really uses, and the NCCL version a record states.

`torch.cuda.nccl.version()` is the version torch was *built* against. The library a
process runs can be another: a pip-upgraded nvidia-nccl-cu12, an LD_PRELOAD, an
LD_LIBRARY_PATH copy. So a record states three things and which one it trusts:

- the libnccl files mapped into this process (/proc/self/maps) and what their
  `ncclGetVersion` says (nccl_tune.nccl.ncclinfo.library_version; ncclGetVersion only
  returns NCCL_VERSION_CODE, it initialises nothing, src/init.cc), or, with NCCL linked
  into another library, what the process's global namespace answers;
- the "NCCL version 2.x.y+cudaZ" line of NCCL's own log, once a log was captured;
- torch's build version.

`versions.nccl` is the loaded library's version when known, else the log's, else
torch's; `versions.nccl_note` says when they differ.
"""

from __future__ import annotations

from microbench.nccllog import loaded_nccl_paths
from nccl_tune.nccl import ncclinfo


def loaded_library(maps_path: str = "/proc/self/maps") -> dict:
    """{path, version, error} of the libnccl this process has mapped.

    path is the first mapped libnccl file, or "(linked into the process)" where no file
    is mapped but the global namespace answers ncclGetVersion (NCCL linked statically
    into torch), or None; version is what ncclGetVersion returned, or None (error says why).
    """
    paths = loaded_nccl_paths(maps_path)
    errors = []
    for path in paths:
        try:
            return {"path": path, "version": ncclinfo.library_version(path), "error": None, "mapped": paths}
        except (OSError, AttributeError) as exc:
            errors.append(f"{path}: {exc}")
    try:
        version = ncclinfo.library_version(None)  # ctypes.CDLL(None): the loaded objects
        return {"path": "(linked into the process)", "version": version, "error": None, "mapped": paths}
    except (OSError, AttributeError):
        pass
    return {
        "path": paths[0] if paths else None,
        "version": None,
        "mapped": paths,
        "error": "; ".join(errors) or "no libnccl is mapped into this process",
    }


def build_version(torch_module) -> str | None:
    """torch's build-time NCCL version as 'x.y.z' (a tuple in torch 2.x, an int code
    before); None where torch has no NCCL."""
    try:
        version = torch_module.cuda.nccl.version()
    except Exception:
        return None
    if isinstance(version, int):
        version = ncclinfo.decode_version(version)
    return ".".join(map(str, version))


def _same(a: str | None, b: str | None) -> bool:
    return ncclinfo.parse_version(a) == ncclinfo.parse_version(b)


def version_record(build: str | None, loaded: dict | None, log_version: str | None) -> dict:
    """The `versions` fields about NCCL: nccl (the one trusted), nccl_build (torch's),
    nccl_library / nccl_library_version (mapped, ncclGetVersion), nccl_log (the log's
    version line), nccl_source (which one `nccl` is) and nccl_note when they differ."""
    loaded = loaded or {}
    lib_version = loaded.get("version")
    if lib_version:
        trusted, source = lib_version, "ncclGetVersion of the loaded library"
    elif log_version:
        trusted, source = log_version, "NCCL's log"
    elif build:
        trusted, source = build, "torch's build version (the loaded library was not found)"
    else:
        trusted, source = None, None
    out = {
        "nccl": trusted,
        "nccl_source": source,
        "nccl_build": build,
        "nccl_library": loaded.get("path"),
        "nccl_library_version": lib_version,
        "nccl_log": log_version,
    }
    notes = []
    if lib_version and build and not _same(lib_version, build):
        notes.append(f"the loaded libnccl {loaded.get('path')} is {lib_version}, torch was built with {build}")
    if log_version and lib_version and not _same(log_version, lib_version):
        notes.append(f"NCCL's log says {log_version}, ncclGetVersion {lib_version}")
    elif log_version and not lib_version and build and not _same(log_version, build):
        notes.append(f"NCCL's log says {log_version}, torch was built with {build}")
    if len(loaded.get("mapped") or []) > 1:
        notes.append("several libnccl files are mapped: " + ", ".join(loaded["mapped"]))
    if notes:
        out["nccl_note"] = "; ".join(notes)
    return out


def reset_debug_init_note(available: bool | None, version: str | None) -> str:
    """Why ncclResetDebugInit is or is not there (it exists from 2.24.3; from 2.28 it is a
    deprecated alias kept for compatibility, src/debug.cc)."""
    parsed = ncclinfo.parse_version(version)
    if available:
        if parsed and parsed >= (2, 28, 0):
            return "ncclResetDebugInit found (deprecated alias since NCCL 2.28)"
        return "ncclResetDebugInit found"
    if parsed and parsed < (2, 24, 3):
        return f"NCCL {version} has no ncclResetDebugInit (it exists from 2.24.3)"
    return "ncclResetDebugInit not found in the loaded libnccl"
