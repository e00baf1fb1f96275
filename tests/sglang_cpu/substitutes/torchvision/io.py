"""TEST-ONLY: torchvision.io (see torchvision/__init__.py)."""

from _nccl_tune_substitute import missing


def __getattr__(name: str):
    return missing(__name__, name)
