"""recommend's `--plot`: the saving per token of each cell (with its interval), and tok/s
against the draft step count when `--spec-steps` planned speculation."""

from __future__ import annotations

from nccl_tune.decide import plotting
from nccl_tune.decide.recommendation import MEASURED, Analysis, short_label


def plot_saving(path: str, analysis: Analysis, comp=None) -> None:
    """Save the PNG: one bar per cell (green: recommended); `comp`, a
    nccl_tune.spec.profile_steps.SpecComparison, adds tok/s against steps."""
    plt = plotting.pyplot()
    rows = [r for r in analysis.cells if r.saving is not None]
    labels = [plotting.wrap(short_label(r.label), 28) for r in rows]
    lines = sum(label.count("\n") + 1 for label in labels)
    panels = 2 if comp is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(7.5 * panels, max(3.5, 0.32 * lines + 2.0)))
    axes = axes if panels > 1 else [axes]
    ax = axes[0]
    values = [r.saving.saving_ms for r in rows]
    err = None
    if any(r.saving.ci_ms for r in rows):
        err = [
            [max(0.0, r.saving.saving_ms - r.saving.ci_ms[0]) if r.saving.ci_ms else 0 for r in rows],
            [max(0.0, r.saving.ci_ms[1] - r.saving.saving_ms) if r.saving.ci_ms else 0 for r in rows],
        ]
    colors = ["tab:green" if r is analysis.recommended else "tab:gray" for r in rows]
    ax.barh(range(len(rows)), values, xerr=err, color=colors, capsize=3 if err else 0)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("saving per token (ms; NCCL_ omitted from names)" + ("; bars: intervals" if err else ""))
    ax.set_title(
        f"{analysis.source}: saving per token vs NCCL defaults"
        + (" (green: recommended)" if analysis.recommended else "")
    )
    if comp is not None:
        _steps_panel(axes[1], comp)
    notes = []
    if analysis.backend == "gloo":
        notes.append("gloo: NCCL settings do not affect gloo; differences between cells are noise")
    if analysis.source != MEASURED:
        notes.append(f"{analysis.source.upper()}: not measured")
    if notes:
        plotting.caption(fig, "; ".join(notes))
    fig.tight_layout(rect=(0, 0.05 if notes else 0, 1, 1))
    plotting.save(fig, path, dpi=110)


def _steps_panel(ax, comp) -> None:
    plans = list(comp.baseline)  # k = 0 (plain decoding) included: the plan's reference
    ax.plot([p.k for p in plans], [p.tok_s for p in plans], marker="o", label="NCCL defaults")
    if comp.recommended:
        rec = list(comp.recommended)
        ax.plot([p.k for p in rec], [p.tok_s for p in rec], marker="o", label="recommended")
    ax.set_xticks([p.k for p in plans], ["0\nplain" if p.k == 0 else str(p.k) for p in plans])
    ax.set_xlabel("draft steps k (0: plain decoding)")
    ax.set_ylabel("tok/s")
    ax.set_title("speculative decoding: tok/s against steps")
    ax.grid(True, alpha=0.3)
    ax.legend()
