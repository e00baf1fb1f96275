"""`nccl-tune report`: per cell and size, the median p50, intervals, and verdicts vs baseline."""

from __future__ import annotations

import csv
import io

import click
from tabulate import tabulate

from nccl_tune import fileio, store, vocab
from nccl_tune.decide import plotting
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure.launch import summarize_error
from nccl_tune.decide.report import ADJUSTMENTS, GLOO_NOTE, latency_records, summarize
from nccl_tune.vocab import Provenance

SIMULATED_BANNER = "SIMULATED: these results come from the cost model (backend sim), not from a measurement"
CSV_FIELDS = ("cell", "label", "env", "op", "bytes", "world_size", "backend", "mode", "dtype",
              "machine", "status", "n_rounds",
              "p50_us", "ci_lo_us", "ci_hi_us", "ci_basis", "delta_us", "delta_ci_lo_us",
              "delta_ci_hi_us", "verdict", "p_value", "p_adjusted", "confirmed", "effective_algo",
              "effective_proto", "effective_channels", "flag", "simulated", "final", "rung", "errors",
              "provenance")


def observation_flag(summary) -> str | None:
    """Why a cell's requested settings cannot be trusted to have run, or None.

    NCCL records (and imports) whose log did not confirm the requested settings are
    flagged; the baseline requests nothing; gloo and sim observe nothing by nature (their
    provenance says so) and say so elsewhere.
    """
    if not summary.env or (summary.provenance is not None and not summary.provenance.observes_nccl):
        return None
    if summary.confirmed is False:
        return "contradicted: NCCL's log shows other settings than requested"
    if summary.confirmed is None:
        return "unverified: the requested settings were not seen in NCCL's log"
    return None


def _row_dict(s) -> dict:
    out = s.to_dict()
    out["flag"] = observation_flag(s)
    out["simulated"] = s.provenance is Provenance.SIMULATED
    return out


def _fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(pair, digits=2):
    return "-" if not pair else f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"


def _effective(s) -> str:
    e = s.observed_effective or {}  # what NCCL reported; '-' where no NCCL ran (sim, gloo)
    if not e:
        return "-"
    text = "/".join(str(e.get(k)) for k in ("algo", "proto") if e.get(k))
    return text + (f" ch{e['channels']}" if e.get("channels") else "")


def _group(s) -> tuple:
    return (s.op, s.world_size, s.backend, s.machine, s.mode, s.dtype, s.bytes, s.redop)


def group_title(s) -> str:
    """The heading of one comparison family: what was measured, how, and where."""
    how = ", ".join(x for x in (f"mode {s.mode}" if s.mode else None, s.dtype,
                                f"redop {s.redop}" if s.redop not in (None, "sum") else None) if x)
    title = f"{s.op}, {s.bytes} B, world {s.world_size}, backend {s.backend}"
    title += (f", {how}" if how else "") + (f"; {s.machine}" if s.machine else "")
    return title + (" (SIMULATED)" if s.backend == "sim" else "")


def ci_header(confidence: float) -> str:
    """The interval column's name at the confidence asked for: '95% CI', '99.9% CI'."""
    return f"{100 * confidence:.4g}% CI"


def _print_text(summaries, notes: list[str], confidence: float = 0.95) -> None:
    for note in notes:
        click.echo(note)
    keys = []
    for s in summaries:
        if _group(s) not in keys:
            keys.append(_group(s))
    for key in keys:
        rows = [s for s in summaries if _group(s) == key]
        click.echo("\n" + group_title(rows[0]))
        table = []
        for s in rows:
            verdict = (s.status if s.status != "ok" else s.verdict or
                       ("baseline" if s.cell == store.BASELINE else "pruned" if not s.final else "-"))
            flag = observation_flag(s)
            table.append([s.row_label, s.n_rounds, _fmt(s.p50_us), _interval(s.ci_us),
                          _fmt(s.delta_us), _interval(s.delta_ci_us), verdict, _effective(s),
                          ("! " + flag.split(":")[0]) if flag else ""])
        click.echo(tabulate(table, headers=["settings", "rounds", "p50 us", ci_header(confidence),
                                            "delta us", "delta CI", "verdict", "effective",
                                            "observed"]))
    bad = [s for s in summaries if s.status != "ok"]
    if bad:
        click.echo("\nFailed, timed-out and wrong cells (never candidates):")
        for s in bad:
            firsts = list(dict.fromkeys(summarize_error(e) for e in s.errors if e.strip()))
            text = "; ".join(firsts[:3]) + (f"; and {len(firsts) - 3} more" if len(firsts) > 3 else "")
            click.echo(f"  {s.status:8s} {s.label} @ {s.bytes} B: {text}")
    flagged = sorted({s.label for s in summaries if observation_flag(s)})
    if flagged:
        click.echo(f"\n{len(flagged)} cell(s) flagged '!': the requested setting was not observed "
                   "in NCCL's own log (unverified) or was contradicted by it.")


def _write_csv(summaries) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        e = s.observed_effective or {}
        writer.writerow({
            "cell": s.cell, "label": s.label, "env": " ".join(f"{k}={v}" for k, v in s.env.items()),
            "op": s.op, "bytes": s.bytes, "world_size": s.world_size, "backend": s.backend,
            "mode": s.mode, "dtype": s.dtype, "machine": s.machine,
            "status": s.status, "n_rounds": s.n_rounds, "p50_us": s.p50_us,
            "ci_lo_us": s.ci_us[0] if s.ci_us else None, "ci_hi_us": s.ci_us[1] if s.ci_us else None,
            "ci_basis": s.ci_basis, "delta_us": s.delta_us,
            "delta_ci_lo_us": s.delta_ci_us[0] if s.delta_ci_us else None,
            "delta_ci_hi_us": s.delta_ci_us[1] if s.delta_ci_us else None,
            "verdict": s.verdict, "p_value": s.p_value, "p_adjusted": s.p_adjusted,
            "confirmed": s.confirmed, "effective_algo": e.get("algo"),
            "effective_proto": e.get("proto"), "effective_channels": e.get("channels"),
            "flag": observation_flag(s), "simulated": s.backend == "sim", "final": s.final, "rung": s.rung,
            "errors": " | ".join(summarize_error(x) for x in s.errors if x.strip()),
            "provenance": s.provenance.value if s.provenance else None})
    return buffer.getvalue()


def plot_latency(summaries, path: str, title: str | None = None) -> int:
    """Latency against size (log-log), one line per cell, the baseline emphasised.

    Returns the number of lines drawn. Needs matplotlib (the `plot` extra).
    """
    plt = plotting.pyplot()
    curves: dict[tuple, list] = {}
    for s in summaries:
        if s.status == "ok" and s.final and s.p50_us and s.bytes > 0:
            curves.setdefault((s.cell, s.label, s.op, s.world_size, s.backend, s.machine, s.mode,
                               s.dtype), []).append(s)
    if not curves:
        raise NcclTuneError("--plot: no successful final measurements to plot")
    contexts = {k[2:] for k in curves}
    if len(contexts) > 1:  # several machines or set-ups: say which line is which
        curves = {(k[0], f"{k[1]} [{k[5]}, {k[6]}, {k[7]}, world {k[3]}]", *k[2:]): v
                  for k, v in curves.items()}
    ranked = sorted(curves, key=lambda k: min(x.p50_us for x in curves[k]))
    labelled = set(ranked[:8]) | {k for k in curves if k[0] == store.BASELINE}
    fig, ax = plt.subplots(figsize=(10, 6.5))
    all_p50 = []
    for key in ranked:
        points = sorted(curves[key], key=lambda x: x.bytes)
        xs, ys = [p.bytes for p in points], [p.p50_us for p in points]
        all_p50 += ys + [v for p in points if p.ci_us for v in p.ci_us]
        baseline = key[0] == store.BASELINE
        shown = baseline or key in labelled
        line, = ax.plot(xs, ys, marker="o", color="black" if baseline else None,
                        linewidth=3.0 if baseline else 1.0, alpha=1.0 if shown else 0.35,
                        zorder=3 if baseline else 2,
                        label=plotting.wrap(key[1], 45) if key in labelled else None)
        if shown and any(p.ci_us for p in points):  # the interval of each p50
            # the interval is of the geometric mean over rounds, the point the median: the
            # median can sit just outside it, so the bar is clipped at the point
            err = [[max(0.0, p.p50_us - p.ci_us[0]) if p.ci_us else 0 for p in points],
                   [max(0.0, p.ci_us[1] - p.p50_us) if p.ci_us else 0 for p in points]]
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=line.get_color(), elinewidth=1.0,
                        capsize=3, alpha=0.8, zorder=line.get_zorder())
    ax.set_xscale("log")
    ax.set_yscale("log")
    sizes = sorted({p.bytes for v in curves.values() for p in v})
    plotting.byte_axis(ax.xaxis, sizes)
    if len(sizes) == 1:  # one size: a readable span around it, not matplotlib's default
        ax.set_xlim(sizes[0] / 2, sizes[0] * 2)
    plotting.plain_axis(ax.yaxis, all_p50)
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
        plotting.caption(fig, "; ".join(notes))
    fig.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
    plotting.save(fig, path, dpi=120)
    return len(curves)


@click.command("report")
@click.argument("results", nargs=-1, required=True, type=vocab.InputFile())
@click.option("--json", "as_json", is_flag=True, help="Print a list of per-(cell, size) objects.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@click.option("--plot", "plot_path", metavar="FILE.png", type=vocab.OutputFile(vocab.OutputKind.PLOT),
              help="Latency vs size, log-log (matplotlib).")
@click.option("--confidence", default=0.95, show_default=True, type=vocab.Finite(0.5, max=0.999))
@click.option("--adjust", default="bh", show_default=True, type=click.Choice(ADJUSTMENTS),
              help="Multiple-comparison adjustment of verdicts across the cells of each size.")
@click.option("--include-pruned/--final-only", default=True, show_default=True,
              help="Show cells pruned by a search strategy (never judged).")
def report(results, as_json, as_csv, plot_path, confidence, adjust, include_pruned):
    """Summarise results: per cell and size, median p50 over rounds, intervals (--confidence),
    the difference to the baseline and a verdict; failed, timed-out and wrong cells listed.
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv are exclusive")
    if plot_path:  # the file really written (fileio's one suffix rule), refused before reading
        plot_path = str(fileio.check_output(plot_path, kind=fileio.OutputKind.PLOT, inputs=results,
                                            option="--plot"))
    warnings: list[str] = []
    records = store.read_records(results, warnings.append)
    for message in warnings:
        click.echo(f"warning: {message}", err=True)
    if not records:
        raise NcclTuneError(f"no records in {', '.join(results)}")
    records = latency_records(records, lambda m: click.echo(f"warning: {m}", err=True))
    summaries = summarize(records, confidence=confidence, adjust=adjust)
    if not include_pruned:
        summaries = [s for s in summaries if s.final]
    backends = {s.backend for s in summaries}
    notes = []
    if "sim" in backends:
        notes.append(SIMULATED_BANNER)
    if "gloo" in backends:
        notes.append(GLOO_NOTE)
    if not any(s.cell == store.BASELINE for s in summaries):
        notes.append("no baseline records: no differences or verdicts can be given")
    if plot_path:
        drawn = plot_latency(summaries, plot_path)
        click.echo(f"plot: wrote {plot_path} ({drawn} cells)" + (" (simulated)" if "sim" in backends else ""),
                   err=as_json or as_csv)
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json([_row_dict(s) for s in summaries])
    elif as_csv:
        click.echo(_write_csv(summaries), nl=False)
    else:
        _print_text(summaries, notes, confidence)
