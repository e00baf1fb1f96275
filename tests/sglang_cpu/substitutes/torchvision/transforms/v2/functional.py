"""TEST-ONLY: a torchvision.transforms module (see torchvision/__init__.py)."""

from _nccl_tune_substitute import missing

from torchvision.transforms import InterpolationMode  # noqa: F401 - torchvision exports it here too


def __getattr__(name: str):
    return missing(__name__, name)
