"""matplotlib for the `--plot` options: imported on demand, drawn off-screen, saved safely;
and report's latency plot (`plot_latency`)."""

from __future__ import annotations

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.store import BASELINE


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
        raise type(exc)(f"--plot: {exc.message}", path=str(target)) from None  # WriteFailed stays exit 1
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


def plot_latency(summaries, path: str, title: str | None = None) -> int:
    """Latency against size (log-log), one line per cell, the baseline emphasised.

    Returns the number of lines drawn. Needs matplotlib (the `plot` extra).
    """
    plt = pyplot()
    curves: dict[tuple, list] = {}
    for s in summaries:
        if s.status == "ok" and s.final and s.p50_us and s.bytes > 0:
            curves.setdefault((s.cell, s.label, s.op, s.world_size, s.backend, s.machine, s.mode, s.dtype), []).append(
                s
            )
    if not curves:
        raise NcclTuneError("--plot: no successful final measurements to plot")
    contexts = {k[2:] for k in curves}
    if len(contexts) > 1:  # several machines or set-ups: say which line is which
        curves = {(k[0], f"{k[1]} [{k[5]}, {k[6]}, {k[7]}, world {k[3]}]", *k[2:]): v for k, v in curves.items()}
    ranked = sorted(curves, key=lambda k: min(x.p50_us for x in curves[k]))
    labelled = set(ranked[:8]) | {k for k in curves if k[0] == BASELINE}
    fig, ax = plt.subplots(figsize=(10, 6.5))
    all_p50 = []
    for key in ranked:
        points = sorted(curves[key], key=lambda x: x.bytes)
        xs, ys = [p.bytes for p in points], [p.p50_us for p in points]
        all_p50 += ys + [v for p in points if p.ci_us for v in p.ci_us]
        baseline = key[0] == BASELINE
        shown = baseline or key in labelled
        (line,) = ax.plot(
            xs,
            ys,
            marker="o",
            color="black" if baseline else None,
            linewidth=3.0 if baseline else 1.0,
            alpha=1.0 if shown else 0.35,
            zorder=3 if baseline else 2,
            label=wrap(key[1], 45) if key in labelled else None,
        )
        if shown and any(p.ci_us for p in points):  # the interval of each p50
            # the interval is of the geometric mean over rounds, the point the median: the
            # median can sit just outside it, so the bar is clipped at the point
            err = [
                [max(0.0, p.p50_us - p.ci_us[0]) if p.ci_us else 0 for p in points],
                [max(0.0, p.ci_us[1] - p.p50_us) if p.ci_us else 0 for p in points],
            ]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                fmt="none",
                ecolor=line.get_color(),
                elinewidth=1.0,
                capsize=3,
                alpha=0.8,
                zorder=line.get_zorder(),
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    sizes = sorted({p.bytes for v in curves.values() for p in v})
    byte_axis(ax.xaxis, sizes)
    if len(sizes) == 1:  # one size: a readable span around it, not matplotlib's default
        ax.set_xlim(sizes[0] / 2, sizes[0] * 2)
    plain_axis(ax.yaxis, all_p50)
    ax.set_xlabel("message size (bytes; K = 1024)")
    ax.set_ylabel("p50 latency (us); bars: intervals")
    simulated = any(k[4] == "sim" for k in curves)
    ax.set_title((title or "allreduce latency by NCCL settings") + (" (SIMULATED)" if simulated else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    notes = []
    if any(k[4] == "gloo" for k in curves):
        notes.append("gloo: NCCL settings do not affect gloo; differences between lines are noise")
    if simulated:
        notes.append("simulated: drawn from the cost model, not measured")
    if notes:
        caption(fig, "; ".join(notes))
    fig.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
    save(fig, path, dpi=120)
    return len(curves)
