"""recommend's text output: the header (where the figures come from), the published
range of a modelled answer, the table, the verdict line, the speculative plan and the files."""

from __future__ import annotations

from tabulate import tabulate

from nccl_tune.decide import recommendation
from nccl_tune.decide.recommend_run import MODEL_CALIBRATION, RecommendResult
from nccl_tune.decide.recommendation import MODELLED, SIMULATED, short_label

MEASURE_HINT = (
    "measure them with `nccl-tune sweep` (or `torchrun --nproc-per-node 8 -m "
    "microbench.allreduce`) and pass the results file with --results"
)


def _fmt(value, digits=3, sign=False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _basis_short(saving) -> str:
    if saving is None or saving.basis is None:
        return ""
    return {"rounds": f"r{saving.n_rounds}", "rounds (unpaired)": f"u{saving.n_rounds}", "iterations": "it"}.get(
        saving.basis, saving.basis
    )


def _saving_text(row, modelled: bool) -> str:
    s = row.saving
    if s is None:
        return "-"
    text = _fmt(s.saving_ms, sign=True)
    if modelled:
        return text
    if s.ci_ms is not None:
        text += f" [{_fmt(s.ci_ms[0], sign=True)}, {_fmt(s.ci_ms[1], sign=True)}] {_basis_short(s)}"
    return text + (" extrap" if s.extrapolated else "")


def _ci_label(analysis) -> str:
    """'95% CI', or the per-cell level when the family of cells forced a wider one."""
    level = analysis.cell_confidence
    return "CI" if level is None else f"{100 * level:.4g}% CI"


def _table(analysis, baseline_tok_s) -> str:
    modelled = analysis.source == MODELLED
    headers = (
        [
            "#",
            "settings (NCCL_ omitted)",
            "trust" if not modelled else "NCCL runs (model)",
            f"lat@{analysis.message_bytes}B us",
        ]
        + (["range us"] if modelled else [])
        + ["comm ms/tok", "saving ms/tok" + ("" if modelled else f" [{_ci_label(analysis)}]")]
    )
    if baseline_tok_s:
        headers.append("tok/s")
    headers += ["verdict", "why not"]

    def trust(row):
        if modelled:
            e = row.effective or {}
            return f"{e.get('algo')}/{e.get('proto')} x{e.get('channels')} {e.get('detail', '').split()[-1]}"
        return row.trust

    rows = []
    base = analysis.baseline
    base_line = (
        ["-", base.label, trust(base) if modelled else "-", _fmt(base.latency_us, 2)]
        + ([_range_cell(base)] if modelled else [])
        + [_fmt(base.comm_ms), "0"]
    )
    if baseline_tok_s:
        base_line.append(f"{baseline_tok_s:.1f}")
    rows.append(base_line + ["reference", ""])
    for i, row in enumerate(analysis.cells, start=1):
        mark = "*" if row is analysis.recommended else str(i)
        line = (
            [mark, short_label(row.label), trust(row), _fmt(row.latency_us, 2)]
            + ([_range_cell(row)] if modelled else [])
            + [_fmt(row.comm_ms), _saving_text(row, modelled)]
        )
        if baseline_tok_s:
            line.append(
                f"{row.projected_range[0]:.0f}-{row.projected_range[1]:.0f}"
                if row.projected_range
                else _fmt(row.projected_tok_s, 1)
            )
        line += [row.verdict, "" if row.eligible else (row.reason or "")]
        rows.append(line)
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _range_cell(row) -> str:
    """A modelled row's range and whether its time is calibrated ('cal': a fit of this machine)."""
    if not row.latency_range:
        return "-"
    return f"{row.latency_range[0]:.1f}-{row.latency_range[1]:.1f}" + (" cal" if row.calibrated else "")


def _summary_line(analysis, confidence: float, baseline_tok_s, force: bool = False) -> str:
    rec = analysis.recommended
    if rec is None:
        if analysis.source == MODELLED:
            return "Keep NCCL's defaults: no setting saves time under the model on this topology."
        return "Keep NCCL's defaults: no cell's saving has an interval that excludes zero " + (
            "(--force: files asked for hold the best cell anyway, marked NOT significant)."
            if force
            else "(--export, --export-conf and --tuner-csv write nothing without --force)."
        )
    s = rec.saving
    text = f"Recommended: {rec.label}: saves {s.saving_ms:.3f} ms/token"
    if analysis.source == MODELLED:
        text += (
            " (MODELLED, not measured; --force: files asked for are written, their headers say so)"
            if force
            else " (MODELLED, not measured; export needs --force)"
        )
    else:
        basis = {
            "rounds": f"{s.n_rounds} rounds, paired with the baseline",
            "rounds (unpaired)": f"{s.n_rounds}+ rounds, unpaired",
            "iterations": "iterations of one round: ignores drift between rounds",
        }[s.basis]
        family = (
            f", family-wise {confidence:.0%} over {analysis.family_size} cells (Bonferroni)"
            if analysis.family_size > 1
            else ""
        )
        text += (
            f" ({_ci_label(analysis)} {s.ci_ms[0]:.3f} to {s.ci_ms[1]:.3f}{family}; {basis}); "
            f"{recommendation.trust_words(rec)}"
        )
    if baseline_tok_s and rec.projected_range:
        text += (
            f"; {baseline_tok_s:.1f} -> {rec.projected_range[0]:.0f}-{rec.projected_range[1]:.0f} "
            "tok/s over the published machines' range"
        )
    elif baseline_tok_s and rec.projected_tok_s:
        text += f"; {baseline_tok_s:.1f} -> {rec.projected_tok_s:.1f} tok/s"
        if rec.projected_ci:
            text += f" [{rec.projected_ci[0]:.1f}, {rec.projected_ci[1]:.1f}]"
    if s.extrapolated:
        text += "; EXTRAPOLATED beyond the measured sizes"
    return text


def _header(analysis, topo_note: str, w, source_files) -> list[str]:
    lines = []
    if analysis.source == MODELLED:
        lines.append(
            "MODELLED, not measured: figures come from nccl-tune's analytical model of "
            f"NCCL (NCCL's own cost constants plus guesses; {MODEL_CALIBRATION}); "
            f"{MEASURE_HINT}."
        )
        lines.append(f"topology: {topo_note}; world size {analysis.world_size}")
    elif analysis.source == SIMULATED:
        lines.append(
            "SIMULATED, not measured: these records come from the sweep's sim backend "
            "(the cost model with noise), not from hardware."
        )
    if analysis.source != MODELLED:
        where = ", ".join(
            x
            for x in (
                analysis.gpus,
                f"topology {analysis.topology}" if analysis.topology else None,
                f"NCCL {analysis.nccl_version}" if analysis.nccl_version else None,
            )
            if x
        )
        lines.append(
            f"{analysis.source}: {', '.join(source_files)} (backend {analysis.backend}, "
            f"world size {analysis.world_size}{'; ' + where if where else ''})"
        )
    lines.append(
        f"per token: {analysis.collectives} allreduces ({w.layers} layers x {w.per_layer} + "
        f"{w.extra}) of {analysis.message_bytes} B ({w.tokens} token(s) x {w.hidden} x {w.dtype})"
    )
    return lines + [f"note: {n}" for n in analysis.notes]


MAX_PRUNED_SHOWN = 8  # the best-measured pruned cells; the rest only in --json


def _published_lines(analysis, published) -> list[str]:
    found = published.to_dict()
    lines = [
        f"range: at {analysis.message_bytes} B NCCL's defaults take "
        f"{published.low:.1f}-{published.high:.1f} us on {analysis.topology} machines "
        f"(the model's {published.model_us:.1f} us x where {len(found['machines'])} "
        f"{found['basis']} fall from the model, 90% for a machine not among them"
        + ("; cut to 4x" if published.capped else "")
        + f": {', '.join(found['machines'])}). "
        "Each row's range is its own time's; tok/s ranges apply the model's relative "
        "saving to the defaults' range."
    ]
    if published.question:
        lines.append(
            f"these machines differ by {published.band.spread:.2f}x; the question that "
            f"splits them: {published.question}"
        )
    return lines


def lines(result: RecommendResult) -> list[str]:
    """recommend's text output, line by line."""
    req, analysis, comp = result.request, result.analysis, result.comparison
    out = _header(analysis, result.topology_note, result.workload, req.results)
    if result.published is not None:
        out += _published_lines(analysis, result.published)
    out += ["", _table(analysis, req.baseline_tok_s)]
    if analysis.source != MODELLED:
        out.append(
            "saving: baseline minus cell, ms per token, on the [CI] basis: rN = N rounds "
            "paired with the baseline, uN = unpaired rounds, it = iterations of one round "
            "(ignores drift); tok/s and the speculative plan use this saving. It is the mean of "
            "the per-round differences, while lat and comm are medians over rounds: a few "
            "outlying rounds pull the mean (and widen its interval), so the two can "
            "disagree"
        )
    if analysis.pruned:
        shown = analysis.pruned[:MAX_PRUNED_SHOWN]
        more = len(analysis.pruned) - len(shown)
        out += [
            "",
            f"Not final ({len(analysis.pruned)} cells pruned early in a search; never "
            "recommended; --json lists all): "
            + "; ".join(f"{r.label} ({_fmt(r.latency_us, 2)} us)" for r in shown)
            + (f"; ... and {more} more" if more else ""),
        ]
    out += ["", _summary_line(analysis, req.confidence, req.baseline_tok_s, req.force)]
    if comp is not None:
        from nccl_tune.commands.spec_render import compare_lines

        rec_label = analysis.recommended.label if analysis.recommended else None
        out += ["", *compare_lines(comp, result.acceptance.description, rec_label)]
    for kind, info in result.files.items():
        out.append(
            f"{kind}: wrote {info['path']}" if info.get("written") else f"{kind}: {info['path']} {info['reason']}"
        )
    return out
