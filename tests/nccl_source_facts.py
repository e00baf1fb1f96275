"""Facts about NCCL's source that the catalogue (nccl_tune.nccl.settings) rests on, read
from a git mirror of github.com/NVIDIA/nccl: for each release tag, which files mention
NCCL_NO_CACHE, which variable names NCCL_PARAM defines, and whether paths.cc keeps
NCCL_P2P_LEVEL in a static. Facts (names and yes/no), not NCCL's code.

    python3 tests/nccl_source_facts.py /path/to/nccl/mirror > tests/fixtures/nccl_source/facts.json

tests/test_nocache.py checks the catalogue against the shipped file everywhere (CI has
no mirror and no network to GitHub), and the shipped file against a mirror where there
is one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

TAGS = ("v2.29.3-1", "v2.29.7-1", "v2.30.7-1")
_NAME_RE = re.compile(r'"([A-Z0-9_]+)"')


def _git(mirror: str, *args: str) -> str:
    return subprocess.run(["git", "-C", mirror, *args], capture_output=True, text=True, timeout=120).stdout


def facts(mirror: str, tag: str) -> dict:
    """The facts of one tag of the mirror."""
    no_cache = sorted(
        line.split(":", 1)[1] for line in _git(mirror, "grep", "-l", "NO_CACHE", tag, "--", "src").splitlines()
    )
    params = _git(mirror, "grep", "-h", "NCCL_PARAM(", tag, "--", "src")
    names = sorted({name for line in params.splitlines() for name in _NAME_RE.findall(line)})
    paths = _git(mirror, "show", f"{tag}:src/graph/paths.cc")
    return {
        "no_cache_files": no_cache,
        "param_names": names,
        "static_p2p_level": "static int ncclTopoUserP2pLevel" in paths,
    }


def all_facts(mirror: str) -> dict:
    """The shipped file's content."""
    return {
        "source": "git tags of github.com/NVIDIA/nccl, read by tests/nccl_source_facts.py",
        "tags": {tag: facts(mirror, tag) for tag in TAGS},
    }


if __name__ == "__main__":
    json.dump(all_facts(sys.argv[1]), sys.stdout, indent=1)
    sys.stdout.write("\n")
