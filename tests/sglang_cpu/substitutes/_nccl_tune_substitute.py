"""Shared by the TEST-ONLY substitutes in this folder (sgl_kernel, torchvision).

`announce` writes one line to stderr per process and package, so the server's log (and
every nccl-tune output that reads it: validate's records and notes, logs summarize)
shows that the run used a substitute and not SGLang's own kernels. `missing` stands for
a name the substitute does not implement: using it raises NotImplementedError naming it.
"""

from __future__ import annotations

import os
import sys

# The exact text integration.logs recognises (SUBSTITUTE_MARKER there); keep them equal.
MARKER = "nccl-tune TEST-ONLY SUBSTITUTE"
HERE = os.path.dirname(os.path.abspath(__file__))
_announced: set[str] = set()


def announce(package: str, what: str) -> None:
    """Say once per process that `package` is this folder's substitute."""
    if package in _announced:
        return
    _announced.add(package)
    print(f"{MARKER}: {package} ({what}) from {HERE}, pid {os.getpid()}", file=sys.stderr, flush=True)


class NotImplementedBySubstitute(NotImplementedError):
    """A name the test-only substitute does not provide was used."""


class Missing:
    """A name the substitute does not implement: calling it (or anything reached through
    it) raises NotImplementedBySubstitute with the full name. Attribute access is allowed,
    since SGLang evaluates some defaults (e.g. `InterpolationMode.BICUBIC`) at import."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name: str) -> Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedBySubstitute(
            f"{self._qualname} is not implemented by nccl-tune's test-only substitute ({HERE})"
        )

    def __repr__(self) -> str:
        return f"<not implemented by the test-only substitute: {self._qualname}>"


def missing(module: str, name: str) -> Missing:
    """For a module's __getattr__: dunder names stay AttributeErrors (import machinery,
    pickling, hasattr probes of special names); every other name is a Missing."""
    if name.startswith("__"):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return Missing(f"{module}.{name}")
