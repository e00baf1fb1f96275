"""`nccl-tune logs summarize LOG`: throughput and accept length from a server log."""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune.cli import emit_json


NO_DECODE = ("no decode lines found (no SGLang 'Decode batch' line and no vLLM metrics line): "
             "nothing to summarize")


@click.group("logs")
def logs() -> None:
    """Read SGLang (0.2 to 0.5.x and later) and vLLM server logs."""


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


@logs.command("summarize")
@click.argument("log", type=click.Path(dir_okay=False))
@click.option("--idle-gap", type=float, default=None, show_default="5 s",
              help="A decode line this long after the previous one is the first after idle "
                   "(its throughput carries the idle time) and is left out.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def summarize(log: str, idle_gap: float | None, as_json: bool) -> None:
    """Decode lines, gen throughput mean/median, accept length and rate, and the
    speculative settings the server ran with (from its server_args line)."""
    from integration.logs import DEFAULT_IDLE_GAP_S, summarize_file

    if idle_gap is not None and idle_gap <= 0:
        raise click.BadParameter("must be positive", param_hint="--idle-gap")
    summary = summarize_file(log, DEFAULT_IDLE_GAP_S if idle_gap is None else idle_gap)
    no_decode = summary["decode_lines"] == 0 and summary["engine"] != "vllm"
    if no_decode:
        summary["note"] = NO_DECODE
    if as_json:
        emit_json(summary)
        return
    if no_decode:
        click.echo(f"{log}: {NO_DECODE}")
        spec = summary["speculative"]
        if summary["server_args"]:
            click.echo("speculative (server_args): "
                       + (", ".join(f"{k}={v}" for k, v in spec.items()) if spec else "off"))
        return
    engine = summary["engine"] or "unknown (no decode or speculative lines found)"
    rows = [
        ("engine", engine),
        ("decode lines", summary["decode_lines"]),
        ("gen throughput mean (tok/s)", _fmt(summary["gen_throughput_mean"])),
        ("gen throughput median (tok/s)", _fmt(summary["gen_throughput_median"])),
        ("lines used / left out after idle",
         f"{summary['gen_throughput_lines']} / {summary['excluded_after_idle']}"),
        *((f"  left out: {reason}", count) for reason, count in (summary.get("excluded") or {}).items()),
        ("accept len mean", _fmt(summary["accept_len_mean"])),
        ("accept rate mean", _fmt(summary["accept_rate_mean"])),
    ]
    if summary["graph_share"] is not None:
        rows.append(("lines with graphs on", _fmt(summary["graph_share"], ".0%")))
    if summary["sources"]:
        rows.append(("ranks logging", ", ".join(summary["sources"])))
    spec = summary["speculative"]
    if spec:
        rows.append(("speculative (server_args)", ", ".join(f"{k}={v}" for k, v in spec.items())))
    elif summary["server_args"]:
        rows.append(("speculative (server_args)", "off"))
    click.echo(f"{log}")
    click.echo(tabulate(rows, tablefmt="plain"))
