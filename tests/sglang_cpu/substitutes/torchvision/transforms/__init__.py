"""TEST-ONLY: torchvision.transforms names (see torchvision/__init__.py)."""

import enum

from _nccl_tune_substitute import missing


class InterpolationMode(enum.Enum):
    """The names of torchvision's enum (its values are its strings); nothing uses them here."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name: str):
    return missing(__name__, name)
