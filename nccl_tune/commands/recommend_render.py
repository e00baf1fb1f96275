"""recommend's text output: the ranked table, header, summary, plot and the whole render.

Split from nccl_tune/commands/recommend.py (which keeps the options and the flow) so the
command module stays thin; nothing here decides anything.
"""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune.decide import plotting, recommendation
from nccl_tune.decide.recommendation import MODELLED, SIMULATED
from nccl_tune.model import references

# costmodel's doc: which constants were fitted to public tables.
MODEL_CALIBRATION = ("its host-memory per-hop and Simple-over-PCIe constants were fitted to "
                     "published tables, and real machines of one kind differ by 1.5x and more: "
                     "a published range (or a `model fit` of your machine) says by how much")
MEASURE_HINT = ("measure them with `nccl-tune sweep` (or `torchrun --nproc-per-node 8 -m "
                "microbench.allreduce`) and pass the results file with --results")

def _fmt(value, digits=3, sign=False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _basis_short(saving) -> str:
    if saving is None or saving.basis is None:
        return ""
    return {"rounds": f"r{saving.n_rounds}", "rounds (unpaired)": f"u{saving.n_rounds}",
            "iterations": "it"}.get(saving.basis, saving.basis)


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


def _short(label: str) -> str:
    return " ".join(part[5:] if part.startswith("NCCL_") else part for part in label.split(" "))


def _ci_label(analysis) -> str:
    """'95% CI', or the per-cell level when the family of cells forced a wider one."""
    level = analysis.cell_confidence
    return "CI" if level is None else f"{100 * level:.4g}% CI"


def _table(analysis, baseline_tok_s) -> str:
    modelled = analysis.source == MODELLED
    headers = ["#", "settings (NCCL_ omitted)", "trust" if not modelled else "NCCL runs (model)",
               f"lat@{analysis.message_bytes}B us", "comm ms/tok", "saving ms/tok"
               + ("" if modelled else f" [{_ci_label(analysis)}]")]
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
    base_line = ["-", base.label, trust(base) if modelled else "-", _fmt(base.latency_us, 2), _fmt(base.comm_ms), "0"]
    if baseline_tok_s:
        base_line.append(f"{baseline_tok_s:.1f}")
    rows.append(base_line + ["reference", ""])
    for i, row in enumerate(analysis.cells, start=1):
        mark = "*" if row is analysis.recommended else str(i)
        line = [mark, _short(row.label), trust(row), _fmt(row.latency_us, 2), _fmt(row.comm_ms),
                _saving_text(row, modelled)]
        if baseline_tok_s:
            line.append(f"{row.projected_range[0]:.0f}-{row.projected_range[1]:.0f}"
                        if row.projected_range else _fmt(row.projected_tok_s, 1))
        line += [row.verdict, "" if row.eligible else (row.reason or "")]
        rows.append(line)
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _summary_line(analysis, confidence: float, baseline_tok_s, force: bool = False) -> str:
    rec = analysis.recommended
    if rec is None:
        if analysis.source == MODELLED:
            return ("Keep NCCL's defaults: no setting saves time under the model on this topology.")
        return ("Keep NCCL's defaults: no cell's saving has an interval that excludes zero "
                + ("(--force: files asked for hold the best cell anyway, marked NOT significant)."
                   if force else "(--export, --export-conf and --tuner-csv write nothing without --force)."))
    s = rec.saving
    text = f"Recommended: {rec.label}: saves {s.saving_ms:.3f} ms/token"
    if analysis.source == MODELLED:
        text += (" (MODELLED, not measured; --force: files asked for are written, their headers "
                 "say so)" if force else " (MODELLED, not measured; export needs --force)")
    else:
        basis = {"rounds": f"{s.n_rounds} rounds, paired with the baseline",
                 "rounds (unpaired)": f"{s.n_rounds}+ rounds, unpaired",
                 "iterations": "iterations of one round: ignores drift between rounds"}[s.basis]
        family = (f", family-wise {confidence:.0%} over {analysis.family_size} cells (Bonferroni)"
                  if analysis.family_size > 1 else "")
        text += (f" ({_ci_label(analysis)} {s.ci_ms[0]:.3f} to {s.ci_ms[1]:.3f}{family}; {basis}); "
                 f"{'confirmed by NCCL log' if rec.trust == 'confirmed' else 'declared, not confirmed by NCCL log'}")
    if baseline_tok_s and rec.projected_range:
        text += (f"; {baseline_tok_s:.1f} -> {rec.projected_range[0]:.0f}-{rec.projected_range[1]:.0f} "
                 "tok/s over the published machines' range")
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
        lines.append("MODELLED, not measured: figures come from nccl-tune's analytical model of "
                     f"NCCL (NCCL's own cost constants plus guesses; {MODEL_CALIBRATION}); "
                     f"{MEASURE_HINT}.")
        lines.append(f"topology: {topo_note}; world size {analysis.world_size}")
    elif analysis.source == SIMULATED:
        lines.append("SIMULATED, not measured: these records come from the sweep's sim backend "
                     "(the cost model with noise), not from hardware.")
    if analysis.source != MODELLED:
        where = ", ".join(x for x in (analysis.gpus, f"topology {analysis.topology}"
                                      if analysis.topology else None,
                                      f"NCCL {analysis.nccl_version}" if analysis.nccl_version else None) if x)
        lines.append(f"{analysis.source}: {', '.join(source_files)} (backend {analysis.backend}, "
                     f"world size {analysis.world_size}{'; ' + where if where else ''})")
    lines.append(f"per token: {analysis.collectives} allreduces ({w.layers} layers x {w.per_layer} + "
                 f"{w.extra}) of {analysis.message_bytes} B ({w.tokens} token(s) x {w.hidden} x {w.dtype})")
    return lines + [f"note: {n}" for n in analysis.notes]


def plot(path, analysis, comp) -> None:
    """Save recommend's PNG: saving by cell (and tok/s against steps)."""
    plt = plotting.pyplot()
    rows = [r for r in analysis.cells if r.saving is not None]
    labels = [plotting.wrap(_short(r.label), 28) for r in rows]
    lines = sum(label.count("\n") + 1 for label in labels)
    panels = 2 if comp is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(7.5 * panels, max(3.5, 0.32 * lines + 2.0)))
    axes = axes if panels > 1 else [axes]
    ax = axes[0]
    values = [r.saving.saving_ms for r in rows]
    err = None
    if any(r.saving.ci_ms for r in rows):
        err = [[max(0.0, r.saving.saving_ms - r.saving.ci_ms[0]) if r.saving.ci_ms else 0 for r in rows],
               [max(0.0, r.saving.ci_ms[1] - r.saving.saving_ms) if r.saving.ci_ms else 0 for r in rows]]
    colors = ["tab:green" if r is analysis.recommended else "tab:gray" for r in rows]
    ax.barh(range(len(rows)), values, xerr=err, color=colors, capsize=3 if err else 0)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("saving per token (ms; NCCL_ omitted from names)" + ("; bars: intervals" if err else ""))
    ax.set_title(f"{analysis.source}: saving per token vs NCCL defaults"
                 + (" (green: recommended)" if analysis.recommended else ""))
    if comp is not None:
        ax2 = axes[1]
        plans = list(comp.baseline)  # k = 0 (plain decoding) included: the plan's reference
        ax2.plot([p.k for p in plans], [p.tok_s for p in plans], marker="o", label="NCCL defaults")
        if comp.recommended:
            rec = list(comp.recommended)
            ax2.plot([p.k for p in rec], [p.tok_s for p in rec], marker="o", label="recommended")
        ax2.set_xticks([p.k for p in plans],
                       ["0\nplain" if p.k == 0 else str(p.k) for p in plans])
        ax2.set_xlabel("draft steps k (0: plain decoding)")
        ax2.set_ylabel("tok/s")
        ax2.set_title("speculative decoding: tok/s against steps")
        ax2.grid(True, alpha=0.3)
        ax2.legend()
    notes = []
    if analysis.backend == "gloo":
        notes.append("gloo: NCCL settings do not affect gloo; differences between cells are noise")
    if analysis.source != recommendation.MEASURED:
        notes.append(f"{analysis.source.upper()}: not measured")
    if notes:
        plotting.caption(fig, "; ".join(notes))
    fig.tight_layout(rect=(0, 0.05 if notes else 0, 1, 1))
    plotting.save(fig, path, dpi=110)


MAX_PRUNED_SHOWN = 8  # the best-measured pruned cells; the rest only in --json


def _published_lines(analysis, published) -> list[str]:
    lo, hi = published.measured
    return [f"published: at {analysis.message_bytes} B, {len(published.machines)} reference machine(s) "
            f"of kind {analysis.topology} with {analysis.world_size} GPUs measured {lo:.1f}-{hi:.1f} us "
            f"({published.basis}; mostly eager nccl-tests-style timers): "
            f"{', '.join(published.machines)}; range {published.low:.1f}-{published.high:.1f} us "
            f"(widened to the {references.RANGE_MAX_RATIO}x machines of one kind differ by). "
            f"The modelled default: {analysis.baseline.latency_us:.1f} us. tok/s ranges apply the "
            "model's relative saving to that range."]


def render(analysis, comp, acceptance, written, topo_note, workload, baseline_tok_s, confidence,
           results, published=None, force: bool = False) -> None:
    """recommend's text output."""
    for line in _header(analysis, topo_note, workload, results):
        click.echo(line)
    if published is not None:
        for line in _published_lines(analysis, published):
            click.echo(line)
    click.echo()
    click.echo(_table(analysis, baseline_tok_s))
    if analysis.source != MODELLED:
        click.echo("saving: baseline minus cell, ms per token, on the [CI] basis: rN = N rounds "
                   "paired with the baseline, uN = unpaired rounds, it = iterations of one round "
                   "(ignores drift); tok/s and the speculative plan use this saving (lat and comm "
                   "are medians over rounds, so their difference can differ slightly)")
    if analysis.pruned:
        click.echo()
        shown = analysis.pruned[:MAX_PRUNED_SHOWN]
        more = len(analysis.pruned) - len(shown)
        click.echo(f"Not final ({len(analysis.pruned)} cells pruned early in a search; never "
                   "recommended; --json lists all): "
                   + "; ".join(f"{r.label} ({_fmt(r.latency_us, 2)} us)" for r in shown)
                   + (f"; ... and {more} more" if more else ""))
    click.echo()
    click.echo(_summary_line(analysis, confidence, baseline_tok_s, force))
    if comp is not None:
        from nccl_tune.commands.spec_render import compare_lines

        click.echo()
        rec_label = analysis.recommended.label if analysis.recommended else None
        for line in compare_lines(comp, acceptance.description, rec_label):
            click.echo(line)
    for kind, info in written.items():
        if info.get("written"):
            click.echo(f"{kind}: wrote {info['path']}")
        else:
            click.echo(f"{kind}: {info['path']} {info['reason']}")
