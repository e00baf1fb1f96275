"""`nccl-tune report`'s output: the text tables, CSV and JSON rows of the summaries
nccl_tune.decide.report computes."""

from __future__ import annotations

import csv
import io

import click
from tabulate import tabulate

from nccl_tune import store
from nccl_tune.decide.report import observation_flag
from nccl_tune.measure.launch import summarize_error
from nccl_tune.vocab import Provenance

CSV_FIELDS = (
    "cell",
    "label",
    "env",
    "op",
    "bytes",
    "world_size",
    "backend",
    "mode",
    "dtype",
    "machine",
    "status",
    "n_rounds",
    "p50_us",
    "ci_lo_us",
    "ci_hi_us",
    "ci_basis",
    "delta_us",
    "delta_ci_lo_us",
    "delta_ci_hi_us",
    "verdict",
    "p_value",
    "p_adjusted",
    "confirmed",
    "effective_algo",
    "effective_proto",
    "effective_channels",
    "flag",
    "simulated",
    "final",
    "rung",
    "errors",
    "provenance",
)


def json_row(s) -> dict:
    """One summary as --json prints it: its fields, the observation flag, and whether it is simulated."""
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
    how = ", ".join(
        x
        for x in (
            f"mode {s.mode}" if s.mode else None,
            s.dtype,
            f"redop {s.redop}" if s.redop not in (None, "sum") else None,
        )
        if x
    )
    title = f"{s.op}, {s.bytes} B, world {s.world_size}, backend {s.backend}"
    title += (f", {how}" if how else "") + (f"; {s.machine}" if s.machine else "")
    return title + (" (SIMULATED)" if s.provenance is Provenance.SIMULATED else "")


def ci_header(confidence: float) -> str:
    """The interval column's name at the confidence asked for: '95% CI', '99.9% CI'."""
    return f"{100 * confidence:.4g}% CI"


def print_text(summaries, notes: list[str], confidence: float = 0.95) -> None:
    """The notes, then one table per comparison family, the failed cells and the flag legend."""
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
            verdict = (
                s.status
                if s.status != "ok"
                else s.verdict or ("baseline" if s.cell == store.BASELINE else "pruned" if not s.final else "-")
            )
            flag = observation_flag(s)
            table.append(
                [
                    s.row_label,
                    s.n_rounds,
                    _fmt(s.p50_us),
                    _interval(s.ci_us),
                    _fmt(s.delta_us),
                    _interval(s.delta_ci_us),
                    verdict,
                    _effective(s),
                    ("! " + flag.split(":")[0]) if flag else "",
                ]
            )
        click.echo(
            tabulate(
                table,
                headers=[
                    "settings",
                    "rounds",
                    "p50 us",
                    ci_header(confidence),
                    "delta us",
                    "delta CI",
                    "verdict",
                    "effective",
                    "observed",
                ],
            )
        )
    bad = [s for s in summaries if s.status != "ok"]
    if bad:
        click.echo("\nFailed, timed-out and wrong cells (never candidates):")
        for s in bad:
            firsts = list(dict.fromkeys(summarize_error(e) for e in s.errors if e.strip()))
            text = "; ".join(firsts[:3]) + (f"; and {len(firsts) - 3} more" if len(firsts) > 3 else "")
            click.echo(f"  {s.status:8s} {s.label} @ {s.bytes} B: {text}")
    flagged = sorted({s.label for s in summaries if observation_flag(s)})
    if flagged:
        click.echo(
            f"\n{len(flagged)} cell(s) flagged '!': the requested setting was not observed "
            "in NCCL's own log (unverified) or was contradicted by it."
        )


def csv_text(summaries) -> str:
    """The summaries as CSV, one row per (cell, size), columns CSV_FIELDS."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        e = s.observed_effective or {}
        writer.writerow(
            {
                "cell": s.cell,
                "label": s.label,
                "env": " ".join(f"{k}={v}" for k, v in s.env.items()),
                "op": s.op,
                "bytes": s.bytes,
                "world_size": s.world_size,
                "backend": s.backend,
                "mode": s.mode,
                "dtype": s.dtype,
                "machine": s.machine,
                "status": s.status,
                "n_rounds": s.n_rounds,
                "p50_us": s.p50_us,
                "ci_lo_us": s.ci_us[0] if s.ci_us else None,
                "ci_hi_us": s.ci_us[1] if s.ci_us else None,
                "ci_basis": s.ci_basis,
                "delta_us": s.delta_us,
                "delta_ci_lo_us": s.delta_ci_us[0] if s.delta_ci_us else None,
                "delta_ci_hi_us": s.delta_ci_us[1] if s.delta_ci_us else None,
                "verdict": s.verdict,
                "p_value": s.p_value,
                "p_adjusted": s.p_adjusted,
                "confirmed": s.confirmed,
                "effective_algo": e.get("algo"),
                "effective_proto": e.get("proto"),
                "effective_channels": e.get("channels"),
                "flag": observation_flag(s),
                "simulated": s.provenance is Provenance.SIMULATED,  # the one provenance field, as --json
                "final": s.final,
                "rung": s.rung,
                "errors": " | ".join(summarize_error(x) for x in s.errors if x.strip()),
                "provenance": s.provenance.value if s.provenance else None,
            }
        )
    return buffer.getvalue()
