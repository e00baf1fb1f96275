"""matplotlib for the `--plot` options: imported on demand, drawn off-screen, saved safely."""

from __future__ import annotations

from nccl_tune import fileio
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


def save(fig, path: str, dpi: int) -> str:
    """Write `fig` atomically (nccl_tune.fileio.replacing) and close it; returns the path
    written: `path` with fileio's one suffix rule (`.png` added unless matplotlib writes
    the suffix given). An unwritable path is a one-line NcclTuneError, and a failure
    leaves neither an empty nor a half-written image."""
    import matplotlib.pyplot as plt

    target = fileio.plot_path(path)
    try:
        with fileio.replacing(target) as temp:
            fig.savefig(temp, dpi=dpi, format=target.suffix[1:].lower())
    except NcclTuneError as exc:
        raise NcclTuneError(f"--plot: {exc.message}", path=str(target)) from None
    finally:
        plt.close(fig)
    return str(target)


def bytes_label(nbytes: float) -> str:
    """A byte count as people write it on an axis: 512, 1K, 14K, 1M (K = 1024, as
    nccl-tests and --sizes)."""
    value = float(nbytes)
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def plain_number(value: float) -> str:
    """A tick value as a plain number (20, 60, 150, 2500), never 2x10^1."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def byte_axis(axis, sizes=()) -> None:
    """Log-scale byte ticks labelled 1K / 14K / 1M: at the measured `sizes` when there are
    a dozen or fewer (so 14336 reads 14K where it was measured), else at powers of two."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    sizes = sorted({s for s in sizes if s and s > 0})
    if 0 < len(sizes) <= 12:
        axis.set_major_locator(FixedLocator(sizes))
    else:
        axis.set_major_locator(LogLocator(base=2, numticks=24))
    axis.set_major_formatter(FuncFormatter(lambda v, _: bytes_label(v)))
    axis.set_minor_formatter(NullFormatter())


def plain_axis(axis, values=()) -> None:
    """Log-scale value ticks as plain numbers (20, 50, 100, 200), never 2x10^1: ticks at
    1, 2 and 5 per decade when the data span up to three decades, else per decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = [v for v in values if v and v > 0]
    span = max(values) / min(values) if values else 1e9
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span < 1000 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))
    axis.set_minor_formatter(NullFormatter())


def wrap(label: str, width: int = 40) -> str:
    """A long cell label broken at spaces into lines of at most `width` characters."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width)) or label


def caption(fig, text: str) -> None:
    """A line of small text under the plot (what the figures are: gloo noise, modelled)."""
    fig.text(0.01, 0.005, text, fontsize=8, ha="left", va="bottom", color="dimgray", wrap=True)
