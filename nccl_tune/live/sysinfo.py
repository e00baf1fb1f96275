"""What this machine offers NCCL: torch, GPUs, NCCL conf files, the NCCL_* environment.

`doctor_report` gathers everything `nccl-tune doctor` shows into one JSON-ready dict
with keys nccl_libraries, torch, gpus, topology, conf_files, env. Each part works on a
machine without a GPU and says so instead of failing; torch is imported only inside
`torch_info` (so importing this module stays fast).

NCCL conf files (misc/param.cc initEnv, read once at the first NCCL_* lookup):
NCCL_CONF_FILE when set (NCCL >= 2.23.4), otherwise ~/.nccl.conf; then /etc/nccl.conf.
Each line `KEY=VALUE` sets KEY only when nothing set it before, so the environment wins
over the files and the first file over the second. What a file sets is read as NCCL
reads it (conffile.read_like_nccl: literally, any name, first line wins), so a foreign
file's LD_PRELOAD line is shown, not hidden; the lint findings (the profile grammar)
then say which lines a profile could not carry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from nccl_tune import fileio
from nccl_tune.live import conffile
from nccl_tune.live import lint as linter
from nccl_tune.live.conffile import CONF_FILE_SINCE, read_like_nccl
from nccl_tune.live.profile import nccl_env
from nccl_tune.nccl import ncclinfo, topology


def torch_info() -> dict:
    """torch's version, CUDA build, CUDA availability and NCCL version (when built with it),
    and `nccl_mapped`: the libnccl files that `import torch` mapped into this process (a
    CUDA torch from pip links its NCCL wheel's libnccl.so.2; read before anything here
    loads a libnccl itself, so call this first; None when torch was imported already)."""
    fresh = "torch" not in sys.modules
    before = set(ncclinfo.mapped_libraries())
    try:
        import torch
    except Exception as exc:  # an absent or broken torch is a finding, not a crash
        return {"version": None, "error": f"cannot import torch: {exc}"}
    mapped = [p for p in ncclinfo.mapped_libraries() if p not in before] if fresh else None
    info = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "nccl": None,
        "note": None,
        "nccl_mapped": mapped,
    }
    try:
        import torch.distributed as dist

        info["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
    except Exception:
        info["nccl_backend"] = False
    if torch.version.cuda is None:
        info["note"] = "CPU build of torch: it has no NCCL backend and loads no libnccl"
        return info
    try:
        version = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception as exc:
        info["note"] = f"torch.cuda.nccl.version() failed: {exc}"
    return info


def gpu_info(timeout: float = 30.0) -> dict:
    """GPUs as nvidia-smi lists them; `count` 0 and a `note` when there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {
            "count": 0,
            "devices": [],
            "driver": None,
            "note": "nvidia-smi not found: no NVIDIA GPU or driver visible on this machine",
        }
    query = "index,name,pci.bus_id,memory.total,driver_version"
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"count": 0, "devices": [], "driver": None, "note": f"nvidia-smi failed: {exc}"}
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()[:1]
        return {
            "count": 0,
            "devices": [],
            "driver": None,
            "note": f"nvidia-smi failed: {reason[0] if reason else done.returncode}",
        }
    devices = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            devices.append(
                {
                    "index": int(parts[0]) if parts[0].isdigit() else parts[0],
                    "name": parts[1],
                    "pci_bus_id": parts[2],
                    "memory_mib": int(parts[3]) if parts[3].isdigit() else parts[3],
                }
            )
    driver = done.stdout.split(",")[4].strip() if devices else None
    return {
        "count": len(devices),
        "devices": devices,
        "driver": driver,
        "note": None if devices else "nvidia-smi lists no GPU",
    }


def compute_capability(timeout: float = 30.0) -> str | None:
    """The first GPU's compute capability ("9.0"), or None (no GPU, or an old driver)."""
    caps = topology.compute_caps(timeout)
    return caps[0] if caps else None


def topology_info(topo_file: str | None = None) -> dict:
    """The parsed `nvidia-smi topo -m` (from `topo_file` or the local nvidia-smi).

    A bad `topo_file` raises NcclTuneError (the user named it); a local nvidia-smi whose
    output does not parse is reported in `note`.
    """
    from nccl_tune.errors import NcclTuneError

    names = caps = None  # another machine's GPUs are known only by what the file shows
    if topo_file is not None:
        text = fileio.read_text(
            topo_file, what="topology paste", max_bytes=topology.MAX_PASTE_BYTES, max_line=topology.MAX_PASTE_LINE
        )
        topo = topology.parse_topo(text, source=topo_file)
        vendor = None  # another machine's CPU is unknown
    else:
        text = topology.run_nvidia_smi_topo()
        if text is None:
            return {"source": None, "kind": None, "note": "nvidia-smi not found or failed: no topology on this machine"}
        try:
            topo = topology.parse_topo(text, source="nvidia-smi topo -m")
        except NcclTuneError as exc:
            return {"source": "nvidia-smi topo -m", "kind": None, "note": f"could not parse nvidia-smi topo -m: {exc}"}
        vendor = topology.local_cpu_vendor()
        names, caps = topology.gpu_names(), topology.compute_caps()
    out = topo.to_dict()
    try:
        # This machine's GPUs decide NVSwitch with or without NVLS (compute capability).
        out["kind"] = topology.classify(topo, vendor, names, caps)
        level = topology.default_p2p_level(vendor, len(topo.gpus))
        out["note"] = f"kind assumes NCCL's default P2P level {level}" + (
            "" if vendor else " (CPU vendor unknown; NCCL's default is PXB, SYS on AMD hosts with two GPUs or fewer)"
        )
    except NcclTuneError as exc:
        out["kind"] = None
        out["note"] = exc.message
    return out


def conf_files(
    environ: dict[str, str] | None = None,
    home: str | None = None,
    nccl_version: tuple[int, int, int] | None = None,
    known: linter.KnownNames | None = None,
    root: str = "",
    cwd: str | None = None,
) -> list[dict]:
    """The NCCL conf files NCCL would consult, what each sets and what takes effect.

    Each entry: path, role (NCCL_CONF_FILE | user | system), exists, read_by_nccl, sets
    (KEY -> VALUE as read), effective (the part neither the environment nor an earlier
    file overrides), findings (lint of the file), error. `root` and `cwd` read another
    process's files (/proc/PID/root, its working directory for a relative
    NCCL_CONF_FILE); paths are reported as that process sees them.
    """
    environ = dict(os.environ) if environ is None else environ
    home = os.path.expanduser("~") if home is None else home
    reads_conf_var = nccl_version is None or tuple(nccl_version) >= CONF_FILE_SINCE
    entries = []
    if environ.get("NCCL_CONF_FILE"):
        entries.append((environ["NCCL_CONF_FILE"], "NCCL_CONF_FILE", reads_conf_var))
    user_read = not (environ.get("NCCL_CONF_FILE") and reads_conf_var)
    entries.append((os.path.join(home, ".nccl.conf"), "user", user_read))
    entries.append(("/etc/nccl.conf", "system", True))
    taken = set(environ)
    out = []
    for path, role, read_by_nccl in entries:
        local = path if os.path.isabs(path) or cwd is None else os.path.join(cwd, path)
        local = root.rstrip("/") + local if root else local
        item = {
            "path": path,
            "role": role,
            "exists": os.path.isfile(local),
            "read_by_nccl": read_by_nccl,
            "sets": {},
            "effective": {},
            "findings": [],
            "error": None,
        }
        if item["exists"]:
            try:
                text = fileio.read_text(
                    local, what="conf file", max_bytes=conffile.MAX_CONF_BYTES, max_line=conffile.MAX_CONF_LINE
                )
                item["sets"] = read_like_nccl(text)
                item["findings"] = [f.to_dict() for f in linter.lint_text(text, path, known)]
            except Exception as exc:  # NcclTuneError: unreadable or over a cap; report, don't stop
                item["error"] = str(exc)
            else:
                if read_by_nccl:
                    item["effective"] = {k: v for k, v in item["sets"].items() if k not in taken}
                    taken |= set(item["sets"])
        out.append(item)
    return out


def env_info(environ: dict[str, str] | None = None, known: linter.KnownNames | None = None) -> dict:
    """The current NCCL_* variables and their lint findings."""
    variables = nccl_env(dict(os.environ) if environ is None else environ)
    findings = linter.lint_env(variables, "<environment>", known)
    return {"variables": variables, "findings": [f.to_dict() for f in findings]}


def torch_library(torch: dict, libraries: list) -> tuple[str | None, str]:
    """(path, how it was found) of the libnccl torch loads: the file `import torch` mapped
    (a pip CUDA torch links its NCCL wheel's), else a found file of torch's NCCL version,
    else None (NCCL linked into torch itself, or not among the files found)."""
    mapped = torch.get("nccl_mapped") or []
    if mapped:
        return mapped[0], "mapped into this process by import torch"
    same = [lib.path for lib in libraries if lib.version == torch.get("nccl")]
    if same:
        return same[0], f"the first file found of torch's NCCL version {torch.get('nccl')}"
    return None, (
        f"no file found of torch's NCCL version {torch.get('nccl')}: linked into torch, or outside the folders searched"
    )


def doctor_report(topo_file: str | None = None, with_torch: bool = True) -> dict:
    """Everything doctor shows, keys: nccl_libraries, torch, gpus, topology, conf_files, env."""
    # torch first: what `import torch` maps is only clear before this process loads any
    # libnccl itself (find_libraries asks each for its version).
    torch = torch_info() if with_torch else {"version": None, "note": "not inspected"}
    libraries = ncclinfo.find_libraries()
    known = linter.installed_names()
    if torch.get("nccl"):
        torch["nccl_library"], torch["nccl_library_basis"] = torch_library(torch, libraries)
    return {
        "nccl_libraries": [lib.to_dict() for lib in libraries],
        "torch": torch,
        "gpus": {**gpu_info(), "compute_capability": compute_capability()},
        "topology": topology_info(topo_file),
        "conf_files": conf_files(nccl_version=known.version_tuple, known=known),
        "env": env_info(known=known),
    }
