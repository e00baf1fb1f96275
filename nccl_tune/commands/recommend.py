"""`nccl-tune recommend`: latencies -> time saved per token; pick, plan, export.

Thin: parse options, call nccl_tune.decide.recommendation / specdec / tuner, render. Without
--results it shows the embedded default (the analytical model, labelled MODELLED).
"""

from __future__ import annotations

import shlex

import click
from tabulate import tabulate

from nccl_tune import fileio, store, vocab
from nccl_tune.model import calibrate, costmodel, engines, per_token as model, references
from nccl_tune.decide import export, plotting, recommendation
from nccl_tune.spec import options as spec_options
from nccl_tune.commands import engine_option, nccl_target
from nccl_tune.commands.spec_plan import acceptance_options, parse_acceptance, usage
from nccl_tune.errors import NcclTuneError, NotWritten
from nccl_tune.decide.recommendation import MODELLED, SIMULATED

ASSUMED_TOPOLOGY = costmodel.DEFAULT_TOPOLOGY
resolve_topology = costmodel.resolve_topology  # the one default, shared with validate and sweep
# costmodel's doc: which constants were fitted to public tables.
MODEL_CALIBRATION = ("its host-memory per-hop and bandwidth and Simple-over-PCIe constants were "
                     "fitted to published tables, and real machines of one kind differ by 1.5x and more: "
                     "a published range (or a `model fit` of your machine) says by how much")
MEASURE_HINT = ("measure them with `nccl-tune sweep` (or `torchrun --nproc-per-node 8 -m "
                "microbench.allreduce`) and pass the results file with --results")


class _ArgvCommand(click.Command):
    """Keeps the raw arguments, so an exported profile can name the exact command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["nccl_tune.argv"] = list(args)
        return super().parse_args(ctx, args)


def _read(paths: tuple[str, ...]) -> list[dict]:
    records = store.read_records(paths, warn=lambda msg: click.echo(f"warning: {msg}", err=True))
    if not records:
        raise NcclTuneError("no results records to read", path=", ".join(paths))
    return records


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
               f"lat@{analysis.message_bytes}B us"] + (["range us"] if modelled else []) + [
               "comm ms/tok", "saving ms/tok" + ("" if modelled else f" [{_ci_label(analysis)}]")]
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
    base_line = ["-", base.label, trust(base) if modelled else "-", _fmt(base.latency_us, 2)] + (
        [_range_cell(base)] if modelled else []) + [_fmt(base.comm_ms), "0"]
    if baseline_tok_s:
        base_line.append(f"{baseline_tok_s:.1f}")
    rows.append(base_line + ["reference", ""])
    for i, row in enumerate(analysis.cells, start=1):
        mark = "*" if row is analysis.recommended else str(i)
        line = [mark, _short(row.label), trust(row), _fmt(row.latency_us, 2)] + (
            [_range_cell(row)] if modelled else []) + [_fmt(row.comm_ms), _saving_text(row, modelled)]
        if baseline_tok_s:
            line.append(f"{row.projected_range[0]:.0f}-{row.projected_range[1]:.0f}"
                        if row.projected_range else _fmt(row.projected_tok_s, 1))
        line += [row.verdict, "" if row.eligible else (row.reason or "")]
        rows.append(line)
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _range_cell(row) -> str:
    """A modelled row's range and whether its time is calibrated ('cal': a fit of this machine)."""
    if not row.latency_range:
        return "-"
    return (f"{row.latency_range[0]:.1f}-{row.latency_range[1]:.1f}"
            + (" cal" if row.calibrated else ""))


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
                 f"{recommendation.trust_words(rec)}")
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


def _spec_table(comp, baseline_label: str, rec_label: str | None) -> str:
    headers = ["k", "tau", f"cycle ms ({baseline_label})", "tok/s"]
    rec = {p.k: p for p in comp.recommended or []}
    if rec:
        headers += [f"cycle ms ({rec_label})", "tok/s "]
    rows = []
    for p in comp.baseline:
        line = ["0 (plain)" if p.k == 0 else str(p.k), f"{p.tau:.3f}", f"{p.cycle_ms:.3f}",
                f"{p.tok_s:.1f}" + ("*" if p.extrapolated else "")]
        if rec:
            r = rec[p.k]
            line += [f"{r.cycle_ms:.3f}", f"{r.tok_s:.1f}" + ("*" if r.extrapolated else "")]
        rows.append(line)
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _plot(path, analysis, comp) -> None:
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


@click.command("recommend", cls=_ArgvCommand)
@click.option("--layers", type=vocab.Count(1, max=vocab.MAX_LAYERS), required=True, help="Transformer layers.")
@click.option("--collectives-per-layer", type=vocab.Count(0, max=vocab.MAX_COLLECTIVES), default=2, show_default=True,
              help="Allreduces per layer (attention out-projection, MLP/MoE down-projection).")
@click.option("--extra-collectives", type=vocab.Count(0, max=vocab.MAX_COLLECTIVES), default=1, show_default=True,
              help="Allreduces per forward outside the layers (the vocab-parallel embedding).")
@click.option("--hidden", type=vocab.Count(1, max=vocab.MAX_HIDDEN), default=7168, show_default=True)
@click.option("--dtype", default="bf16", show_default=True, help="Activation dtype of the allreduce.",
              type=click.Choice(list(model.DTYPE_BYTES), case_sensitive=False))
@click.option("--tp", type=vocab.Count(1, max=vocab.MAX_RANKS), default=None,
              help="Tensor-parallel world size [default: the results' world size; 8 when modelled].")
@click.option("--batch", type=vocab.Count(1, max=vocab.MAX_TOKENS), default=1, show_default=True,
              help="Sequences decoded together (tokens per decode forward).")
@click.option("--results", multiple=True, type=vocab.InputFile(),
              help="Results file(s) (JSON Lines) from bench/sweep/import; repeatable.")
@click.option("--topology", type=click.Choice(["auto", *costmodel.TOPOLOGIES]), default="auto",
              show_default=True, help="Machine the model assumes without results (auto: detect).")
@click.option("--engine", type=click.Choice(["sglang", "vllm", "none"]), default="none",
              show_default=True, help="Serving engine: which path carries each decode allreduce, "
                                      "read from the installed engine (cited rules otherwise).")
@engine_option.arch_option
@click.option("--model", "model_path", type=vocab.InputFile(),
              help="Without --results: a `model fit` file (constants fitted to your machine).")
@click.option("--baseline-tok-s", type=vocab.Finite(0, max=vocab.MAX_TOK_S, min_open=True),
              help="Decode tok/s (per sequence) with NCCL's defaults, to project tok/s.")
@click.option("--spec-steps", help="Plan speculative decoding over these draft step counts, e.g. 1-10.")
@acceptance_options
@click.option("--draft-ms", type=vocab.Finite(0, max=vocab.MAX_MS), help="Draft step time (ms) with NCCL's defaults.")
@click.option("--decode-ms", type=vocab.Finite(0, max=vocab.MAX_MS, min_open=True),
              help="Plain decoding's own time per token (ms) with NCCL's defaults [default: "
                   "1000 / --baseline-tok-s].")
@click.option("--verify-ms", help="Verify forward time(s) with NCCL's defaults: V or V1,V2@T1,T2 "
                                  "(T = tokens per sequence, k+1); the decode time is its 1-token point.")
@click.option("--verify-model", type=click.Choice(["auto", "interp", "moe", "dense"]), default="auto",
              show_default=True, help="Verify cost model (as spec-plan): auto = moe with --moe-experts.")
@click.option("--moe-experts", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Routed experts E of a MoE target.")
@click.option("--moe-topk", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Experts per token K of a MoE target.")
@click.option("--compute-per-token-ms", type=vocab.Finite(0, max=vocab.MAX_MS), default=0.0, show_default=True,
              help="Extra verify compute per extra token without --verify-ms (MoE: > 0).")
@click.option("--draft-collectives", type=vocab.Count(0, max=vocab.MAX_COLLECTIVES), default=None,
              help="Allreduces per draft step [default: collectives-per-layer + extra].")
@click.option("--other-ms", type=vocab.Finite(0, max=vocab.MAX_MS), default=0.0, show_default=True,
              help="Per speculative cycle time outside draft and verify; not charged to plain decoding.")
@click.option("--extrapolate", is_flag=True, help="Extrapolate outside the measured sizes (and say so).")
@click.option("--export", "export_path", type=vocab.OutputFile(vocab.OutputKind.EXPORT),
              help="Write the recommended profile (.env) here, atomically.")
@click.option("--export-conf", "conf_path", type=vocab.OutputFile(vocab.OutputKind.EXPORT),
              help="Write the recommended profile as an NCCL conf file (NCCL_CONF_FILE) here.")
@click.option("--tuner-csv", "tuner_path", type=vocab.OutputFile(vocab.OutputKind.EXPORT),
              help="Write rules for NCCL's example tuner plugin here.")
@click.option("--force", is_flag=True, help="Write files even without a significant (or a measured) winner.")
@click.option("--plot", "plot_path", type=vocab.OutputFile(vocab.OutputKind.PLOT),
              help="Save a PNG: saving by cell (and tok/s against steps). Needs the plot extra.")
@click.option("--confidence", type=vocab.Finite(0.5, max=0.999), default=0.95, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@nccl_target.nccl_version_option
@click.pass_context
def recommend(ctx, layers, collectives_per_layer, extra_collectives, hidden, dtype, tp, batch, results,
              topology, engine, arch, model_path, baseline_tok_s, spec_steps, draft_ms, decode_ms, verify_ms, verify_model,
              moe_experts, moe_topk, compute_per_token_ms, draft_collectives, other_ms, extrapolate,
              export_path, conf_path, tuner_path, force, plot_path, confidence, as_json, nccl_version,
              **acceptance_opts):
    """Turn allreduce latencies into time saved per token; pick, plan and export a profile.

    With --results: cells ranked by the ms they save per token across all layers, with
    intervals from the rounds. Without: the embedded analytical model (MODELLED).
    """
    try:
        nbytes = model.message_bytes(batch, hidden, dtype)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dtype") from None
    collectives = model.collectives_per_forward(layers, collectives_per_layer, extra_collectives)
    if collectives == 0:
        raise click.BadParameter("no collectives per token", param_hint="--collectives-per-layer")
    steps = acceptance = verify_points = None
    accept_in = parse_acceptance(acceptance_opts)
    if spec_steps:
        steps = usage(spec_options.parse_steps, spec_steps, "--spec-steps")
        acceptance = _spec_acceptance(accept_in, steps)
        if verify_ms:
            verify_points, _ = usage(spec_options.verify_points, verify_ms)
        if (moe_experts is None) != (moe_topk is None) or (moe_experts and moe_topk > moe_experts):
            raise click.UsageError("--moe-experts and --moe-topk go together (topk <= experts)")
    topo_name, topo_note = resolve_topology(topology)
    extra_sizes = [model.message_bytes((k + 1) * batch, hidden, dtype) for k in (steps or [])]
    if results and model_path:
        raise click.BadParameter("--model applies to the model, not to --results", param_hint="--model")
    K = fileio.OutputKind
    outputs = fileio.check_outputs(  # before any work: none is an input, none another's file
        [("--export", export_path, K.EXPORT), ("--export-conf", conf_path, K.EXPORT),
         ("--tuner-csv", tuner_path, K.EXPORT), ("--plot", plot_path, K.PLOT)],
        inputs=[*results, model_path])
    plot_path = str(outputs["--plot"]) if plot_path else None
    published = None
    if results:
        analysis = recommendation.analyze_records(
            _read(results), nbytes=nbytes, collectives=collectives, tp=tp, extrapolate=extrapolate,
            baseline_tok_s=baseline_tok_s, confidence=confidence)
        if analysis.topology in costmodel.TOPOLOGIES:
            topo_name = analysis.topology
    else:
        loaded = None
        if model_path:
            loaded = calibrate.load(model_path)
            topo_name, topo_note = loaded.topology, f"{loaded.topology} (from {model_path})"
        analysis = recommendation.analyze_model(
            topology_name=topo_name, nranks=tp or (loaded.nranks if loaded else 8), nbytes=nbytes,
            collectives=collectives, baseline_tok_s=baseline_tok_s, extra_sizes=extra_sizes,
            params=loaded.params if loaded else None)
        analysis.topology_note = topo_note
        if loaded:
            analysis.notes.insert(0, loaded.describe())
        published = references.attach_published_range(analysis, topo_name, baseline_tok_s, loaded)
    engine_report = engines.report(engine, analysis.topology or topo_name,
                                   analysis.world_size or tp or 8, [nbytes, *extra_sizes],
                                   cc=engine_option.resolve_arch(arch, engine))
    analysis.notes.extend(engine_report.lines)
    comp = None
    if steps:
        from nccl_tune.spec.profile_steps import compare_profiles

        comp = compare_profiles(
            analysis, steps=steps, tau=acceptance.tau, hidden=hidden, dtype=dtype, batch=batch,
            layers=layers, baseline_tok_s=baseline_tok_s, decode_ms=decode_ms,
            verify_points=verify_points, verify_model=verify_model, experts=moe_experts,
            topk=moe_topk, compute_per_token_ms=compute_per_token_ms, draft_ms=draft_ms,
            draft_collectives=(collectives_per_layer + extra_collectives
                               if draft_collectives is None else draft_collectives),
            other_ms=other_ms, extrapolate=extrapolate, profile=export_path)
    workload = export.Workload(layers, collectives_per_layer, extra_collectives, batch, hidden, dtype)
    command = "nccl-tune recommend " + shlex.join(ctx.meta.get("nccl_tune.argv", []))
    written = {}
    target, target_notes = None, ()
    if export_path or conf_path or tuner_path:  # exports name and are checked against a release
        target = nccl_target.target(nccl_version)
        row = export.export_row(analysis, force)[0]
        target_notes = nccl_target.check_export(row.env if row else None, analysis.nccl_version, target)
        analysis.notes.extend([f"exports {nccl_target.used(target)}", *target_notes])
    if export_path:
        written["export"] = export.write_profile(
            export_path, analysis, workload, command, force=force, topology_note=topo_note,
            baseline_tok_s=baseline_tok_s, confidence=confidence, target=target,
            target_notes=target_notes)
    if conf_path:
        written["export_conf"] = export.write_profile(
            conf_path, analysis, workload, command, force=force, topology_note=topo_note,
            baseline_tok_s=baseline_tok_s, confidence=confidence, conf=True, target=target,
            target_notes=target_notes)
    if tuner_path:
        written["tuner_csv"] = export.write_tuner_csv(tuner_path, analysis, topo_name, command,
                                                      force=force, target=target)
    if plot_path:
        _plot(plot_path, analysis, comp)
        written["plot"] = {"path": plot_path, "written": True}
    if as_json:
        from nccl_tune.cli import emit_json

        out = analysis.to_dict()
        out["topology_note"] = topo_note if analysis.source == MODELLED else None
        out["model_calibration"] = MODEL_CALIBRATION if analysis.source == MODELLED else None
        out["published_range"] = published.to_dict() if published else None
        out["engine"] = {"name": engine, **engine_report.to_dict()}
        out["acceptance"] = acceptance.description if acceptance else None
        out["acceptance_detail"] = acceptance.to_dict() if acceptance else None
        out["spec"] = comp.to_dict() if comp else None
        out["files"] = written
        out["nccl_target"] = target.to_dict() if target else None
        emit_json(out)
    else:
        _render(analysis, comp, acceptance, written, topo_note, workload, baseline_tok_s, confidence,
                results, published, force)
    refused = [f"{FILE_OPTIONS[kind]} {info['path']} {info['reason']}"
               for kind, info in written.items() if not info.get("written")]
    if refused:  # asked for and not written: exit 1 (nccl_tune.errors), after the answer
        raise NotWritten("; ".join(refused))


FILE_OPTIONS = {"export": "--export", "export_conf": "--export-conf", "tuner_csv": "--tuner-csv",
                "plot": "--plot"}


def _spec_acceptance(accept_in, steps):
    """The acceptance model for --spec-steps (the planner's); UsageError naming the option."""
    acceptance = usage(accept_in.build, max(steps))
    if acceptance.max_k is not None and steps[-1] > acceptance.max_k:
        raise click.UsageError(f"--accept-per-pos gives {acceptance.max_k} positions; "
                               f"--spec-steps goes to {steps[-1]}")
    return acceptance


MAX_PRUNED_SHOWN = 8  # the best-measured pruned cells; the rest only in --json


def _published_lines(analysis, published) -> list[str]:
    found = published.to_dict()
    lines = [f"range: at {analysis.message_bytes} B NCCL's defaults take "
             f"{published.low:.1f}-{published.high:.1f} us on {analysis.topology} machines "
             f"(the model's {published.model_us:.1f} us x where {len(found['machines'])} "
             f"{found['basis']} fall from the model, 90% for a machine not among them"
             + ("; cut to 4x" if published.capped else "") + f": {', '.join(found['machines'])}). "
             "Each row's range is its own time's; tok/s ranges apply the model's relative "
             "saving to the defaults' range."]
    if published.question:
        lines.append(f"these machines differ by {published.band.spread:.2f}x; the question that "
                     f"splits them: {published.question}")
    return lines


def _render(analysis, comp, acceptance, written, topo_note, workload, baseline_tok_s, confidence,
            results, published=None, force: bool = False) -> None:
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
        click.echo()
        click.echo(f"Speculative decoding ({acceptance.description}):")
        rec_label = analysis.recommended.label if analysis.recommended else None
        click.echo(_spec_table(comp, "baseline", rec_label and "recommended"))
        best_b, best_r = comp.best("baseline"), comp.best("recommended")
        line = f"best k: {best_b.k} under the baseline ({best_b.tok_s:.1f} tok/s)" if best_b else ""
        if best_r:
            line += f"; {best_r.k} under the recommended cell ({best_r.tok_s:.1f} tok/s)"
        click.echo(line)
        spec = comp.to_dict()
        cands = spec["candidates_recommended"] or spec["candidates_baseline"]
        if cands:
            click.echo(f"candidates (within {100 * comp.rel_error:g}% of the best): "
                       f"{', '.join(map(str, cands))}; the measured sweep decides: "
                       f"{spec['validate_command']}")
        for note in comp.assumptions:
            click.echo(f"assumption: {note}")
        if comp.skipped:
            click.echo("steps left out (verify size outside the measured range; --extrapolate): "
                       + ", ".join(map(str, comp.skipped)))
        if comp.skipped_verify:
            click.echo("steps left out (verify token count beyond the --verify-ms points; "
                       "--extrapolate): " + ", ".join(map(str, comp.skipped_verify)))
        note = comp.extrapolation_note()
        if note:
            click.echo(note)
    for kind, info in written.items():
        if info.get("written"):
            click.echo(f"{kind}: wrote {info['path']}")
        else:
            click.echo(f"{kind}: {info['path']} {info['reason']}")
