"""Whether bench/gpu_nocache_check.sh can run here: does the libnccl loaded honour
NCCL_NO_CACHE?

The version is the one this process really uses: after `import torch` (a CUDA torch maps
its libnccl then), the mapped libnccl's own ncclGetVersion (microbench.nccllib.
loaded_library), else torch's build version. The rule is nccl_tune.nccl.settings'
`no_cache_supported`, the same function `nccl-tune sweep` applies to choose isolation
nocache (nccl_tune.measure.sweepplan.resolve_isolation), so the check and the planner decide
alike from the same version. Before 2.29.7 NCCL has no NCCL_NO_CACHE: every NCCL_PARAM
is read once per process (one static per parameter; "set by environment" is logged on
the first load only), so the check's second communicator could not show its own values.

Prints `RUN (NCCL X has NCCL_NO_CACHE, from 2.29.7)` and exits 0, or
`SKIP (NCCL X has no NCCL_NO_CACHE)` (or why no version is known) and exits 77.

    python -m bench.smoke.gate
"""

from __future__ import annotations

import sys

from nccl_tune.nccl import ncclinfo, settings

SKIP = 77


def decide(version: str | None, source: str = "") -> tuple[bool, str]:
    """(run?, the line to print) for the NCCL `version` ('2.28.9'; None: unknown)."""
    since = ".".join(map(str, settings.NO_CACHE_SINCE))
    supported = settings.no_cache_supported(ncclinfo.parse_version(version))
    if supported is None:
        return False, f"SKIP (no NCCL version known: {source or 'no libnccl loaded'})"
    if not supported:
        return False, f"SKIP (NCCL {version} has no NCCL_NO_CACHE)"
    return True, f"RUN (NCCL {version} has NCCL_NO_CACHE, from {since})"


def loaded_version() -> tuple[str | None, str]:
    """(version, where it came from) of the NCCL this process uses after `import torch`."""
    import torch

    from microbench import nccllib

    lib = nccllib.loaded_library()
    if lib["version"]:
        return lib["version"], f"ncclGetVersion of {lib['path']}"
    build = nccllib.build_version(torch)
    if build:
        return build, f"torch {torch.__version__}'s build version (no libnccl mapped: {lib['error']})"
    return None, f"torch {torch.__version__} maps no libnccl and has no NCCL"


def main() -> int:
    """Print the version, its source and the decision; 0 to run, 77 to skip."""
    version, source = loaded_version()
    print(f"nocache gate: NCCL {version or '-'} ({source})", flush=True)
    run, line = decide(version, source)
    print(line, flush=True)
    return 0 if run else SKIP


if __name__ == "__main__":
    sys.exit(main())
