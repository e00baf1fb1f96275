"""TEST-ONLY stand-in for torchvision, for SGLang on a CPU-only torch (nccl-tune's tests).

SGLang imports torchvision at start-up (its multimodal processors and configs); the
torchvision wheels on PyPI for this torch link against CUDA torch and do not load
against the CPU build. The text-only path the tests run never calls it: this package
gives the module names SGLang imports, and every function or class raises
NotImplementedError naming itself when used (_nccl_tune_substitute.Missing). It reaches
the server only through PYTHONPATH (tests/sglang_cpu/substitutes); never install it.
"""

from _nccl_tune_substitute import announce, missing

announce("torchvision", "module names only, nothing implemented")
__version__ = "0.0.0+nccl-tune.test.substitute"


def __getattr__(name: str):
    return missing(__name__, name)
