"""`nccl-tune recommend`: latencies -> time saved per token; pick, plan, export.

Thin: parse options, call nccl_tune.decide.recommendation / specdec / tuner, render. Without
--results it shows the embedded default (the analytical model, labelled MODELLED).
"""

from __future__ import annotations

import shlex

import click

from nccl_tune import store
from nccl_tune.model import calibrate, costmodel, engines, per_token as model, references
from nccl_tune.decide import export, recommendation
from nccl_tune.spec import options as spec_options
from nccl_tune.commands.groups import speculative_options, usage, workload_options
from nccl_tune.errors import NcclTuneError
from nccl_tune.decide.recommendation import MODELLED
from nccl_tune.commands.recommend_render import MODEL_CALIBRATION, plot, render

ASSUMED_TOPOLOGY = costmodel.DEFAULT_TOPOLOGY
resolve_topology = costmodel.resolve_topology  # the one default, shared with validate and sweep
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


@click.command("recommend", cls=_ArgvCommand)
@workload_options(layers_required=True, batch_list=False, layers_help="Transformer layers.")
@click.option("--collectives-per-layer", type=click.IntRange(min=0), default=2, show_default=True,
              help="Allreduces per layer (attention out-projection, MLP/MoE down-projection).")
@click.option("--extra-collectives", type=click.IntRange(min=0), default=1, show_default=True,
              help="Allreduces per forward outside the layers (the vocab-parallel embedding).")
@click.option("--results", multiple=True, type=click.Path(dir_okay=False),
              help="Results file(s) (JSON Lines) from bench/sweep/import; repeatable.")
@click.option("--topology", type=click.Choice(["auto", *costmodel.TOPOLOGIES]), default="auto",
              show_default=True, help="Machine the model assumes without results (auto: detect).")
@click.option("--engine", type=click.Choice(["sglang", "vllm", "none"]), default="none",
              show_default=True, help="Serving engine: says which decode allreduces its own "
                                      "custom allreduce runs instead of NCCL.")
@click.option("--model", "model_path", type=click.Path(dir_okay=False),
              help="Without --results: a `model fit` file (constants fitted to your machine).")
@click.option("--baseline-tok-s", type=click.FloatRange(min=0, min_open=True),
              help="Decode tok/s (per sequence) with NCCL's defaults, to project tok/s.")
@click.option("--spec-steps", help="Plan speculative decoding over these draft step counts, e.g. 1-10.")
@speculative_options
@click.option("--verify-model", type=click.Choice(["auto", "interp", "moe", "dense"]), default="auto",
              show_default=True, help="Verify cost model (as spec-plan): auto = moe with --moe-experts.")
@click.option("--moe-experts", type=click.IntRange(min=1), help="Routed experts E of a MoE target.")
@click.option("--moe-topk", type=click.IntRange(min=1), help="Experts per token K of a MoE target.")
@click.option("--compute-per-token-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Extra verify compute per extra token without --verify-ms (MoE: > 0).")
@click.option("--draft-collectives", type=click.IntRange(min=0), default=None,
              help="Allreduces per draft step [default: collectives-per-layer + extra].")
@click.option("--extrapolate", is_flag=True, help="Extrapolate outside the measured sizes (and say so).")
@click.option("--export", "export_path", type=click.Path(dir_okay=False),
              help="Write the recommended profile (.env) here, atomically.")
@click.option("--export-conf", "conf_path", type=click.Path(dir_okay=False),
              help="Write the recommended profile as an NCCL conf file (NCCL_CONF_FILE) here.")
@click.option("--tuner-csv", "tuner_path", type=click.Path(dir_okay=False),
              help="Write rules for NCCL's example tuner plugin here.")
@click.option("--force", is_flag=True, help="Write files even without a significant (or a measured) winner.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Save a PNG: saving by cell (and tok/s against steps). Needs the plot extra.")
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def recommend(ctx, workload, collectives_per_layer, extra_collectives, results, topology, engine,
              model_path, baseline_tok_s, spec_steps, spec, verify_model, moe_experts, moe_topk,
              compute_per_token_ms, draft_collectives, extrapolate, export_path, conf_path,
              tuner_path, force, plot_path, confidence, as_json):
    """Turn allreduce latencies into time saved per token; pick, plan and export a profile.

    With --results: cells ranked by the ms they save per token across all layers, with
    intervals from the rounds. Without: the embedded analytical model (MODELLED).
    """
    layers, hidden, dtype, tp, batch = (workload.layers, workload.hidden, workload.dtype,
                                        workload.tp, workload.batch)
    try:
        nbytes = model.message_bytes(batch, hidden, dtype)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dtype") from None
    collectives = model.collectives_per_forward(layers, collectives_per_layer, extra_collectives)
    if collectives == 0:
        raise click.BadParameter("no collectives per token", param_hint="--collectives-per-layer")
    steps = acceptance = None
    if spec_steps:
        steps = usage(spec_options.parse_steps, spec_steps, "--spec-steps")
        acceptance = _spec_acceptance(spec, steps)
        if (moe_experts is None) != (moe_topk is None) or (moe_experts and moe_topk > moe_experts):
            raise click.UsageError("--moe-experts and --moe-topk go together (topk <= experts)")
    topo_name, topo_note = resolve_topology(topology)
    extra_sizes = [model.message_bytes((k + 1) * batch, hidden, dtype) for k in (steps or [])]
    if results and model_path:
        raise click.BadParameter("--model applies to the model, not to --results", param_hint="--model")
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
        else:
            published = references.attach_published_range(analysis, topo_name, baseline_tok_s)
    engine_notes = engines.notes(engine, analysis.topology or topo_name,
                                 analysis.world_size or tp or 8, [nbytes, *extra_sizes])
    analysis.notes.extend(engine_notes)
    comp = None
    if steps:
        from nccl_tune.spec.profile_steps import compare_profiles

        t = spec.timings
        comp = compare_profiles(
            analysis, steps=steps, acceptance=spec.acceptance, hidden=hidden, dtype=dtype,
            batch=batch, layers=layers, baseline_tok_s=baseline_tok_s, decode_ms=t.decode_ms,
            verify_points=list(t.verify_points), verify_model=verify_model, experts=moe_experts,
            topk=moe_topk, compute_per_token_ms=compute_per_token_ms, draft_ms=t.draft_ms,
            draft_collectives=(collectives_per_layer + extra_collectives
                               if draft_collectives is None else draft_collectives),
            other_ms=t.other_ms, extrapolate=extrapolate, profile=export_path, halves=t.halves())
    sizes = export.Workload(layers, collectives_per_layer, extra_collectives, batch, hidden, dtype)
    command = "nccl-tune recommend " + shlex.join(ctx.meta.get("nccl_tune.argv", []))
    written = {}
    said = _spec_words(comp)
    if export_path:
        written["export"] = export.write_profile(
            export_path, analysis, sizes, command, force=force, topology_note=topo_note,
            baseline_tok_s=baseline_tok_s, confidence=confidence, speculative=said)
    if conf_path:
        written["export_conf"] = export.write_profile(
            conf_path, analysis, sizes, command, force=force, topology_note=topo_note,
            baseline_tok_s=baseline_tok_s, confidence=confidence, conf=True, speculative=said)
    if tuner_path:
        written["tuner_csv"] = export.write_tuner_csv(tuner_path, analysis, topo_name, command,
                                                      force=force)
    if plot_path:
        plot(plot_path, analysis, comp)
        written["plot"] = {"path": plot_path, "written": True}
    if as_json:
        from nccl_tune.cli import emit_json

        out = analysis.to_dict()
        out["topology_note"] = topo_note if analysis.source == MODELLED else None
        out["model_calibration"] = MODEL_CALIBRATION if analysis.source == MODELLED else None
        out["published_range"] = published.to_dict() if published else None
        out["engine"] = {"name": engine, "notes": engine_notes}
        out["acceptance"] = acceptance.description if acceptance else None
        out["acceptance_detail"] = acceptance.to_dict() if acceptance else None
        out["spec"] = comp.to_dict() if comp else None
        out["files"] = written
        emit_json(out)
    else:
        render(analysis, comp, acceptance, written, topo_note, sizes, baseline_tok_s, confidence,
                results, published, force)


def _spec_words(comp) -> str | None:
    """The exported profile's `# speculative:` line: the planner's decision under this profile."""
    if comp is None:
        return None
    which = "recommended" if comp.recommended else "baseline"
    return (f"{comp.decision(which)['words']} (planned by recommend --spec-steps under the "
            f"{which} cell; the measured sweep decides: nccl-tune validate)")


def _spec_acceptance(spec, steps):
    """The acceptance model for --spec-steps (the planner's); UsageError naming the option."""
    if spec.timings.decode_points:
        raise click.UsageError("--decode-ms: recommend plans one batch size (--batch); give D "
                               "(spec-plan --batch plans several)")
    acceptance = usage(spec.acceptance.build, max(steps))
    if acceptance.max_k is not None and steps[-1] > acceptance.max_k:
        raise click.UsageError(f"--accept-per-pos gives {acceptance.max_k} positions; "
                               f"--spec-steps goes to {steps[-1]}")
    return acceptance


