"""`nccl-tune spec-plan`: the draft step-count planner on its own, from profiler numbers.

Thin: options (the shared groups of nccl_tune.commands.groups) -> PlanRequest -> plan ->
render (nccl_tune.commands.spec_render); --export-vllm writes vLLM's per-batch-size
schedule (nccl_tune.spec.schedule). The planner and its models live in nccl_tune.spec.
"""

from __future__ import annotations

import click

from nccl_tune import vocab
from nccl_tune.commands import engine_option
from nccl_tune.commands.groups import speculative_options, usage, workload_options
from nccl_tune.live import envcheck
from nccl_tune.spec import options as so
from nccl_tune.spec import plan_context as ctx


def engines_kinds() -> list[str]:
    """The cost model's topology kinds (spec-plan's --topology choices)."""
    from nccl_tune.model import costmodel

    return list(costmodel.TOPOLOGIES)


@click.command("spec-plan")
@speculative_options
@click.option(
    "--steps",
    default="1-10",
    show_default=True,
    help="Step counts to compare, e.g. 1-10 "
    "or 2,4,6 (plain decoding, k = 0, is always compared when its time is known).",
)
@click.option(
    "--verify-model",
    type=click.Choice(["auto", "interp", "moe", "dense"]),
    default="auto",
    show_default=True,
    help="auto: moe with --moe-experts, else the measured points (interp).",
)
@click.option("--moe-experts", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Routed experts E of a MoE target.")
@click.option("--moe-topk", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Experts per token K of a MoE target.")
@workload_options(
    tp_default=8,
    layers_help="Target layers: adds comm(n) (2 per layer + 1 "
    "allreduces, nccl_tune.model.per_token) from the cost model to the verify model "
    "(MODELLED).",
)
@click.option(
    "--topology",
    type=click.Choice(sorted(engines_kinds())),
    default=None,
    help="Machine kind: what the comm(n) cost model assumes with --layers (default "
    "pcie-shm), and what decides the engine's allreduce path with --engine.",
)
@click.option(
    "--profile",
    "profile_path",
    default=None,
    type=envcheck.PROFILE,
    help="NCCL profile the timings were measured under (comm(n) with --layers; named in the validate command).",
)
@click.option(
    "--measured-tok-s",
    multiple=True,
    help="Measured tok/s X@K (K = 0: plain decoding); repeatable. Each is predicted from "
    "the other inputs and disagreements are reported.",
)
@click.option(
    "--fit",
    is_flag=True,
    help="Fit the free parameters to --measured-tok-s: the acceptance when none is given, "
    "else the verify curve; with no timings, the cycle's growth with k (two points "
    "fix it; one point gives the range both explanations allow).",
)
@click.option(
    "--rel-error",
    type=vocab.Finite(0, max=0.5),
    default=0.05,
    show_default=True,
    help="Stated relative error of a predicted tok/s: candidates lie within it of the best "
    "(unless inputs carry +-H intervals: then candidates are the k whose interval "
    "reaches the best's).",
)
@click.option(
    "--tolerance",
    type=vocab.Finite(0, max=0.5),
    default=0.05,
    show_default=True,
    help="Relative disagreement beyond which a measured tok/s is reported.",
)
@click.option(
    "--saturation-tokens",
    type=vocab.Finite(1, max=vocab.MAX_TOKENS),
    default=None,
    help="Tokens per forward at which the verify turns compute-bound: your GPU's peak "
    "FLOP/s / bandwidth (bytes/s) x bytes per weight / 2 [default: fitted from "
    "--decode-ms at two or more batch sizes, else 295, the H100 SXM ridge point].",
)
@click.option(
    "--extrapolate",
    is_flag=True,
    help="Extend measured verify points linearly beyond their token counts (rows marked *).",
)
@click.option(
    "--engine",
    type=click.Choice(["sglang", "vllm", "none"]),
    default="none",
    show_default=True,
    help="Serving engine: say whether its allreduces bypass NCCL, "
    "read from the installed engine (cited rules otherwise; "
    "decided with --topology, --tp and --arch). SGLang's source is read from this "
    "Python's sglang, or from the package folder in NCCL_TUNE_SGLANG_ROOT "
    "(e.g. .venv-sglang/lib/python3.11/site-packages/sglang).",
)
@engine_option.arch_option
@click.option(
    "--export-vllm",
    "export_path",
    type=vocab.OutputFile(vocab.OutputKind.EXPORT),
    default=None,
    help="Write vLLM's speculative config with num_speculative_tokens_per_batch_size "
    "(the best k per --batch size, merged ranges) here, atomically.",
)
@click.option(
    "--speculative-config-base",
    "config_base",
    default=None,
    type=vocab.InputFile(names=lambda text: text.lstrip().startswith("{"), missing="neither a JSON object nor a file"),
    help="Your speculative config (JSON, or a file): method and draft model fields kept in --export-vllm's file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def spec_plan(
    spec,
    steps,
    verify_model,
    moe_experts,
    moe_topk,
    workload,
    topology,
    profile_path,
    measured_tok_s,
    fit,
    rel_error,
    tolerance,
    saturation_tokens,
    extrapolate,
    engine,
    arch,
    export_path,
    config_base,
    as_json,
):
    """Plan the speculative draft step count from decode/draft/verify timings and acceptance.

    tau(k) = 1 + sum of per-position acceptance (bonus token included); cycle = k x draft
    + verify(k+1) + other; tok/s = 1000 x tau / cycle. Plain decoding (k = 0) is priced by
    its own decode time and is a candidate like any other: when it wins, the answer is "do
    not speculate". The measured sweep (the validate command printed) decides.
    """
    from nccl_tune.spec import schedule
    from nccl_tune.spec.planner import PlanError, PlanRequest, plan

    step_list = usage(so.parse_steps, steps, "--steps")
    measured = [usage(so.value_at, t, "--measured-tok-s", "86.7@5", 0) for t in measured_tok_s]
    if any(not x > 0 for x, _ in measured):
        raise click.UsageError("--measured-tok-s: tok/s must be positive")
    if (moe_experts is None) != (moe_topk is None):
        raise click.UsageError("--moe-experts and --moe-topk go together")
    if moe_experts is not None and moe_topk > moe_experts:
        raise click.UsageError("--moe-topk cannot exceed --moe-experts")
    if export_path and not config_base:
        raise click.UsageError(
            "--export-vllm needs --speculative-config-base (your method and "
            "draft model; the schedule only sets the step counts)"
        )
    base = usage(schedule.read_base, config_base) if config_base else None
    env = ctx.profile_env(profile_path)  # read (a bad profile refused) even when comm(n) is not modelled
    comm, comm_note = usage(ctx.modelled_comm, workload, topology, env if workload.layers or engine != "none" else None)
    t = spec.timings
    req = PlanRequest(
        step_list,
        spec.acceptance,
        t.decode_ms,
        list(t.verify_points),
        t.verify_flat,
        t.draft_ms,
        t.other_ms,
        verify_model,
        moe_experts,
        moe_topk,
        comm,
        comm_note,
        extrapolate,
        [(k, x) for x, k in measured],
        fit,
        rel_error,
        tolerance,
        list(workload.batches),
        profile_path,
        t.halves(),
        decode_points=list(t.decode_points),
        saturation_tokens=saturation_tokens,
    )
    try:
        result = plan(req)
    except PlanError as exc:
        raise click.UsageError(str(exc)) from None
    exported = usage(schedule.export, export_path, base, result.batches) if export_path else None
    comm_model = ctx.comm_model(comm, result, workload, topology, env)
    cc = engine_option.resolve_arch(arch, engine)
    engine_notes, engine_report = ctx.engine_path(engine, topology, workload, step_list, cc, env)
    if as_json:
        from nccl_tune.cli import emit_json

        out = result.to_dict()
        out["comm_model"] = comm_model
        out["engine_notes"] = engine_notes
        out["engine"] = engine_report
        out["export_vllm"] = exported
        emit_json(out)
        return
    from nccl_tune.commands.ranges_render import comm_lines
    from nccl_tune.commands.spec_render import export_lines, render

    click.echo(render(result))
    for line in comm_lines(comm_model):
        click.echo(line)
    for line in engine_notes:
        click.echo(f"note: {line}")
    for line in export_lines(exported):
        click.echo(line)
