"""`nccl-tune report`: per cell and size, the median p50, intervals, and verdicts vs baseline.

Summaries, flags and notes come from nccl_tune.decide.report, the plot from
nccl_tune.decide.plotting; this module reads the files and prints text, CSV or JSON."""

from __future__ import annotations

import click

from nccl_tune import fileio, store, vocab
from nccl_tune.commands.report_render import csv_text, json_row, print_text
from nccl_tune.decide import plotting
from nccl_tune.decide.report import ADJUSTMENTS, latency_records, report_notes, summarize
from nccl_tune.errors import NcclTuneError


@click.command("report")
@click.argument("results", nargs=-1, required=True, type=vocab.InputFile())
@click.option("--json", "as_json", is_flag=True, help="Print a list of per-(cell, size) objects.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@click.option(
    "--plot",
    "plot_path",
    metavar="FILE.png",
    type=vocab.OutputFile(vocab.OutputKind.PLOT),
    help="Latency vs size, log-log (matplotlib).",
)
@click.option("--confidence", default=0.95, show_default=True, type=vocab.Finite(0.5, max=0.999))
@click.option(
    "--adjust",
    default="bh",
    show_default=True,
    type=click.Choice(ADJUSTMENTS),
    help="Multiple-comparison adjustment of verdicts across the cells of each size.",
)
@click.option(
    "--include-pruned/--final-only",
    default=True,
    show_default=True,
    help="Show cells pruned by a search strategy (never judged).",
)
def report(results, as_json, as_csv, plot_path, confidence, adjust, include_pruned):
    """Summarise results: per cell and size, median p50 over rounds, intervals (--confidence),
    the difference to the baseline and a verdict; failed, timed-out and wrong cells listed.
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv are exclusive")
    if plot_path:  # the file really written (fileio's one suffix rule), refused before reading
        plot_path = str(fileio.check_output(plot_path, kind=fileio.OutputKind.PLOT, inputs=results, option="--plot"))
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
    if plot_path:
        drawn = plotting.plot_latency(summaries, plot_path)
        simulated = any(s.backend == "sim" for s in summaries)
        click.echo(
            f"plot: wrote {plot_path} ({drawn} cells)" + (" (simulated)" if simulated else ""), err=as_json or as_csv
        )
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json([json_row(s) for s in summaries])
    elif as_csv:
        click.echo(csv_text(summaries), nl=False)
    else:
        print_text(summaries, report_notes(summaries), confidence)
