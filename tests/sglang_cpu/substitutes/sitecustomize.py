"""TEST-ONLY start-up hook for SGLang's processes in nccl-tune's tests.

Python imports `sitecustomize` at start-up from its path; this folder reaches a test
server only through its PYTHONPATH (tests/sglang_cpu), so this runs in that server's
processes and nowhere else. It changes nothing at start-up: it registers an import hook
that, once SGLang's torch_native attention backend module has been imported, gives it
the tree-mask verify path of _nccl_tune_tree_verify.py (see there; a process that runs
a verify batch through it says so on stderr). No other module is touched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_TARGET = "sglang.srt.layers.attention.torch_native_backend"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds _TARGET as Python's own path finder does, and wraps its loader so that the
    verify path is installed right after the module ran."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenInstall(spec.loader)
        return spec


class _ThenInstall(importlib.abc.Loader):
    """The real loader (every other method is its own), then the install step."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        import _nccl_tune_tree_verify

        _nccl_tune_tree_verify.install(module)


if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())
