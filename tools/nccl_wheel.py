"""Which NCCL wheel ./install.sh adds beside torch: none where torch brings its own.

nccl-tune reads a libnccl without running it (doctor, lint: ncclGetVersion and the
NCCL_* names in the library; neither needs a GPU). A CUDA build of torch from PyPI
requires its own NCCL wheel (torch 2.11.0: `nvidia-nccl-cu13==2.28.9; platform_system ==
"Linux"`, from its published metadata), and nvidia-nccl-cu12 and nvidia-nccl-cu13 both
install the same file, nvidia/nccl/lib/libnccl.so.2: adding the other CUDA major's wheel
would overwrite the libnccl torch loads. So, from installed metadata only (nothing is
imported, so a test can present any torch as metadata):

- an NCCL wheel is installed already, or torch requires one: add nothing;
- torch is a CUDA or ROCm build that requires none (NCCL linked in, a system libnccl,
  RCCL): add nothing (a second libnccl would only be one torch does not load);
- torch is a CPU build (`+cpu`, no NVIDIA requirement), or not installed: the `nccl`
  extra of pyproject.toml (nvidia-nccl-cu12), so doctor and lint have a libnccl to read.

    python3 tools/nccl_wheel.py [--path DIR]...

prints the extra to install (`nccl`) or an empty line on stdout, and why on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from importlib import metadata

EXTRA = "nccl"  # pyproject.toml: [project.optional-dependencies] nccl = ["nvidia-nccl-cu12"]
_NCCL_WHEEL = re.compile(r"^nvidia-nccl-cu\d+$")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it (lower case, runs of -_. as one -)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def required_names(requires: list[str] | None) -> list[str]:
    """Normalized names of the unconditional requirements (those not behind an extra)."""
    out = []
    for requirement in requires or []:
        marker = requirement.partition(";")[2]
        if "extra" in marker:
            continue
        match = _NAME.match(requirement)
        if match:
            out.append(normalize(match.group(1)))
    return out


@dataclass(frozen=True)
class Choice:
    """The extra to install (None: nothing) and why."""

    extra: str | None
    why: str


def choose(torch_version: str | None, torch_requires: list[str] | None, installed: list[str]) -> Choice:
    """The NCCL wheel decision (module docstring) for a torch of `torch_version` (None: not
    installed) requiring `torch_requires`, with the distributions `installed`."""
    present = sorted(n for n in map(normalize, installed) if _NCCL_WHEEL.match(n))
    if present:
        return Choice(None, f"keeping the installed {', '.join(present)}")
    if torch_version is None:
        return Choice(EXTRA, "no torch installed: nvidia-nccl-cu12, for doctor and lint")
    required = required_names(torch_requires)
    brought = [n for n in required if _NCCL_WHEEL.match(n)]
    if brought:
        return Choice(None, f"torch {torch_version} brings {brought[0]}: no second NCCL wheel")
    local = torch_version.partition("+")[2]
    if local.startswith(("cu", "rocm")) or any(n.startswith(("nvidia-", "cuda-")) for n in required):
        return Choice(
            None,
            f"torch {torch_version} is a GPU build without an NCCL wheel "
            "(its NCCL is linked in or the system's): no second libnccl",
        )
    return Choice(
        EXTRA, f"torch {torch_version} is a CPU build: nvidia-nccl-cu12, so doctor and lint have a libnccl to read"
    )


def from_metadata(paths: list[str] | None = None) -> Choice:
    """`choose` for the distributions found on `paths` (default: sys.path)."""
    dists = list(metadata.distributions(path=paths) if paths else metadata.distributions())
    names = [d.metadata["Name"] or "" for d in dists]
    torch = next((d for d in dists if normalize(d.metadata["Name"] or "") == "torch"), None)
    return choose(torch.version if torch else None, torch.requires if torch else None, names)


def main(argv: list[str] | None = None) -> int:
    """Print the extra (or an empty line) on stdout and the reason on stderr."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="append", help="look for distributions here, not on sys.path")
    args = parser.parse_args(argv)
    choice = from_metadata(args.path)
    print(choice.extra or "")
    print(f"NCCL wheel: {choice.why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
