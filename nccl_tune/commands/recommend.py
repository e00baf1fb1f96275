"""`nccl-tune recommend`: latencies -> time saved per token; pick, plan, export.

Thin: options -> RecommendRequest -> nccl_tune.decide.recommend_run.run -> RecommendResult,
rendered as text (nccl_tune.commands.recommend_render) or --json (RecommendResult.to_dict).
Without --results the answer is the embedded analytical model (labelled MODELLED).
"""

from __future__ import annotations

import shlex

import click

from nccl_tune import fileio, vocab
from nccl_tune.commands import engine_option, nccl_target
from nccl_tune.commands.groups import speculative_options, usage, workload_options
from nccl_tune.decide.recommend_run import RecommendRequest, run
from nccl_tune.errors import NotWritten
from nccl_tune.model import costmodel, per_token
from nccl_tune.spec import options as spec_options


class _ArgvCommand(click.Command):
    """Keeps the raw arguments, so an exported profile can name the exact command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["nccl_tune.argv"] = list(args)
        return super().parse_args(ctx, args)


@click.command("recommend", cls=_ArgvCommand)
@workload_options(layers_required=True, batch_list=False, layers_help="Transformer layers.")
@click.option(
    "--collectives-per-layer",
    type=vocab.Count(0, max=vocab.MAX_COLLECTIVES),
    default=2,
    show_default=True,
    help="Allreduces per layer (attention out-projection, MLP/MoE down-projection).",
)
@click.option(
    "--extra-collectives",
    type=vocab.Count(0, max=vocab.MAX_COLLECTIVES),
    default=1,
    show_default=True,
    help="Allreduces per forward outside the layers (the vocab-parallel embedding).",
)
@click.option(
    "--results",
    multiple=True,
    type=vocab.InputFile(),
    help="Results file(s) (JSON Lines) from bench/sweep/import; repeatable.",
)
@click.option(
    "--topology",
    type=click.Choice(["auto", *costmodel.TOPOLOGIES]),
    default="auto",
    show_default=True,
    help="Machine the model assumes without results (auto: detect).",
)
@click.option(
    "--engine",
    type=click.Choice(["sglang", "vllm", "none"]),
    default="none",
    show_default=True,
    help="Serving engine: which path carries each decode allreduce, "
    "read from the installed engine (cited rules otherwise). SGLang's source is read "
    "from this Python's sglang, or from the package folder in NCCL_TUNE_SGLANG_ROOT.",
)
@engine_option.arch_option
@click.option(
    "--model",
    "model_path",
    type=vocab.InputFile(),
    help="Without --results: a `model fit` file (constants fitted to your machine).",
)
@click.option(
    "--baseline-tok-s",
    type=vocab.Finite(0, max=vocab.MAX_TOK_S, min_open=True),
    help="Decode tok/s (per sequence) with NCCL's defaults, to project tok/s.",
)
@click.option("--spec-steps", help="Plan speculative decoding over these draft step counts, e.g. 1-10.")
@speculative_options
@click.option(
    "--verify-model",
    type=click.Choice(["auto", "interp", "moe", "dense"]),
    default="auto",
    show_default=True,
    help="Verify cost model (as spec-plan): auto = moe with --moe-experts.",
)
@click.option("--moe-experts", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Routed experts E of a MoE target.")
@click.option("--moe-topk", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Experts per token K of a MoE target.")
@click.option(
    "--compute-per-token-ms",
    type=vocab.Finite(0, max=vocab.MAX_MS),
    default=0.0,
    show_default=True,
    help="Extra verify compute per extra token without --verify-ms (MoE: > 0).",
)
@click.option(
    "--draft-collectives",
    type=vocab.Count(0, max=vocab.MAX_COLLECTIVES),
    default=None,
    help="Allreduces per draft step [default: collectives-per-layer + extra].",
)
@click.option("--extrapolate", is_flag=True, help="Extrapolate outside the measured sizes (and say so).")
@click.option(
    "--export",
    "export_path",
    type=vocab.OutputFile(vocab.OutputKind.EXPORT),
    help="Write the recommended profile (.env) here, atomically.",
)
@click.option(
    "--export-conf",
    "conf_path",
    type=vocab.OutputFile(vocab.OutputKind.EXPORT),
    help="Write the recommended profile as an NCCL conf file (NCCL_CONF_FILE) here.",
)
@click.option(
    "--tuner-csv",
    "tuner_path",
    type=vocab.OutputFile(vocab.OutputKind.EXPORT),
    help="Write rules for NCCL's example tuner plugin here.",
)
@click.option("--force", is_flag=True, help="Write files even without a significant (or a measured) winner.")
@click.option(
    "--plot",
    "plot_path",
    type=vocab.OutputFile(vocab.OutputKind.PLOT),
    help="Save a PNG: saving by cell (and tok/s against steps). Needs the plot extra.",
)
@click.option("--confidence", type=vocab.Finite(0.5, max=0.999), default=0.95, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@nccl_target.nccl_version_option
@click.pass_context
def recommend(
    ctx,
    workload,
    collectives_per_layer,
    extra_collectives,
    results,
    topology,
    engine,
    arch,
    model_path,
    baseline_tok_s,
    spec_steps,
    spec,
    verify_model,
    moe_experts,
    moe_topk,
    compute_per_token_ms,
    draft_collectives,
    extrapolate,
    export_path,
    conf_path,
    tuner_path,
    force,
    plot_path,
    confidence,
    as_json,
    nccl_version,
):
    """Turn allreduce latencies into time saved per token; pick, plan and export a profile.

    With --results: cells ranked by the ms they save per token across all layers, with
    intervals from the rounds. Without: the embedded analytical model (MODELLED).
    """
    try:
        per_token.message_bytes(workload.batch, workload.hidden, workload.dtype)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dtype") from None
    if per_token.collectives_per_forward(workload.layers, collectives_per_layer, extra_collectives) == 0:
        raise click.BadParameter("no collectives per token", param_hint="--collectives-per-layer")
    steps = ()
    if spec_steps:
        steps = tuple(usage(spec_options.parse_steps, spec_steps, "--spec-steps"))
        _check_acceptance(spec, steps)
        if (moe_experts is None) != (moe_topk is None) or (moe_experts and moe_topk > moe_experts):
            raise click.UsageError("--moe-experts and --moe-topk go together (topk <= experts)")
    if results and model_path:
        raise click.BadParameter("--model applies to the model, not to --results", param_hint="--model")
    K = fileio.OutputKind
    outputs = fileio.check_outputs(  # before any work: none is an input, none another's file
        [
            ("--export", export_path, K.EXPORT),
            ("--export-conf", conf_path, K.EXPORT),
            ("--tuner-csv", tuner_path, K.EXPORT),
            ("--plot", plot_path, K.PLOT),
        ],
        inputs=[*results, model_path],
    )
    request = RecommendRequest(
        workload,
        collectives_per_layer,
        extra_collectives,
        tuple(results),
        topology,
        engine,
        engine_option.resolve_arch(arch, engine),
        model_path,
        baseline_tok_s,
        steps,
        spec,
        verify_model,
        moe_experts,
        moe_topk,
        compute_per_token_ms,
        draft_collectives,
        extrapolate,
        export_path,
        conf_path,
        tuner_path,
        str(outputs["--plot"]) if plot_path else None,
        force,
        confidence,
        nccl_version,
        "nccl-tune recommend " + shlex.join(ctx.meta.get("nccl_tune.argv", [])),
    )
    result = run(request, warn=lambda msg: click.echo(f"warning: {msg}", err=True))
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json(result.to_dict())
    else:
        from nccl_tune.commands.recommend_render import lines

        click.echo("\n".join(lines(result)))
    if result.refused:  # asked for and not written: exit 1 (nccl_tune.errors), after the answer
        raise NotWritten("; ".join(result.refused))


def _check_acceptance(spec, steps) -> None:
    """The acceptance model for --spec-steps builds (the planner's); UsageError naming the option."""
    if spec.timings.decode_points:
        raise click.UsageError(
            "--decode-ms: recommend plans one batch size (--batch); give D (spec-plan --batch plans several)"
        )
    acceptance = usage(spec.acceptance.build, max(steps))
    if acceptance.max_k is not None and steps[-1] > acceptance.max_k:
        raise click.UsageError(f"--accept-per-pos gives {acceptance.max_k} positions; --spec-steps goes to {steps[-1]}")
