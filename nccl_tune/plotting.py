"""matplotlib for the `--plot` options: imported on demand, drawn off-screen, saved safely."""

from __future__ import annotations

from nccl_tune.errors import NcclTuneError


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed); NcclTuneError naming the
    `plot` extra when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NcclTuneError("--plot needs matplotlib: pip install 'nccl-tune[plot]'") from None
    return plt


def save(fig, path: str, dpi: int) -> None:
    """Write `fig` to `path` and close it; an unwritable path is a one-line NcclTuneError."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise NcclTuneError(f"--plot: cannot write: {exc.strerror}", path=path) from None
    finally:
        plt.close(fig)
