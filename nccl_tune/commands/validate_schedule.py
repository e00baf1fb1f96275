"""`nccl-tune validate --schedule FILE --concurrency 1,4,8`: the schedule mode of validate.

Thin: checks the request (engine vllm, the schedule file by vLLM's rules, the static
step counts, the concurrencies), calls integration.schedule_validate.run, renders a
table per concurrency, the verdicts and the evidence that the schedule was active.
"""

from __future__ import annotations

import os
import sys

import click
from tabulate import tabulate

from nccl_tune.errors import RunFailed


def _ci(value, ci, spec=".1f") -> str:
    if value is None:
        return "-"
    return format(value, spec) + (f" [{format(ci[0], spec)}, {format(ci[1], spec)}]" if ci else "")


def _positions(summary: dict) -> str:
    pos = summary.get("per_position") or []
    return ", ".join(f"{p['acceptance']:.2f} [{p['ci'][0]:.2f}, {p['ci'][1]:.2f}]" for p in pos) or "-"


def render(result: dict) -> str:
    """Per concurrency: each configuration's figures with intervals, then the verdict."""
    lines = [
        f"validate --schedule {result['schedule_file']} on engine vllm: schedule "
        f"{result['schedule']} (num_speculative_tokens {result['num_speculative_tokens']}) "
        f"against static k = {', '.join(map(str, result['steps']))}; {result['runs']} rounds "
        f"x {result['max_tokens']} tokens per request at each concurrency"
    ]
    headers = [
        "config",
        "aggregate tok/s [95% CI]",
        "tok/s per request",
        "TTFT ms",
        "accept len",
        "drafted/draft",
        "acceptance per position [95% CI]",
    ]
    for c in result["concurrency"]:
        rows = []
        for conf in result["configurations"]:
            s = conf["by_concurrency"].get(c) or conf["by_concurrency"].get(str(c))
            if not s:
                rows.append([conf["label"], conf["status"], "-", "-", "-", "-", "-"])
                continue
            ttft = [1000 * v for v in s["ttft_s_ci"]] if s["ttft_s_ci"] else None
            rows.append(
                [
                    conf["label"],
                    _ci(s["aggregate_tok_s"], s["aggregate_tok_s_ci"]),
                    _ci(s["request_tok_s"], s["request_tok_s_ci"]),
                    _ci(None if s["ttft_s"] is None else 1000 * s["ttft_s"], ttft, ".0f"),
                    "-" if s["accept_len"] is None else f"{s['accept_len']:.2f}",
                    "-" if s["draft_tokens_per_draft"] is None else f"{s['draft_tokens_per_draft']:.2f}",
                    _positions(s),
                ]
            )
        lines += [f"\nconcurrency {c}", tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)]
        v = result["verdicts"][c]
        lines.append(f"verdict at concurrency {c}: {v['verdict']} ({v['detail']})")
    for conf in result["configurations"]:
        if conf["status"] != "ok":
            lines.append(f"failed: {conf['label']}: {conf['error']}")
    dyn = result["dynamic"]
    lines.append(
        f"schedule active: {dyn['active']} ({dyn['note']}; log echoes the schedule: "
        f"{dyn['log']}; "
        + ", ".join(
            f"concurrency {c}: schedule k {row['schedule_k']}, drafted per draft "
            f"{'-' if row['draft_tokens_per_draft'] is None else format(row['draft_tokens_per_draft'], '.2f')}"
            for c, row in dyn["by_concurrency"].items()
        )
        + ")"
    )
    lines.append(f"results appended to {result['out']}")
    return "\n".join(lines)


def run_schedule(params: dict, steps: list[int]) -> None:
    """Validate a vLLM schedule (see the module doc) from validate's parsed options;
    exit code 1 when nothing was measured."""
    from integration import schedule_validate as lib
    from integration import validate as vlib
    from integration.validate_request import check_engine
    from nccl_tune import fileio, vocab
    from nccl_tune.cli import emit_json
    from nccl_tune.commands.groups import usage

    if params["engine"] != "vllm":
        raise click.UsageError("--schedule is vLLM's num_speculative_tokens_per_batch_size: use --engine vllm")
    if not params["schedule_path"]:
        raise click.UsageError("--concurrency goes with --schedule FILE (spec-plan --export-vllm)")
    concurrency = vocab.parse_counts(params["concurrency_text"] or "1", "--concurrency", 1024)
    command = vlib.split_args(params["server_command"], "--server-command") or None
    server_args = vlib.split_args(params["server_args"], "--server-args")
    usage(check_engine, "vllm", server_args, command is not None)  # vLLM installed, --server-args given
    env, name, profile_file = {}, None, None
    if params["profile_path"]:
        from nccl_tune.live.profile import load_profile, resolve_profile

        loaded = load_profile(str(resolve_profile(params["profile_path"])))
        env, name, profile_file = dict(loaded.env), loaded.name, loaded.path
    opts = lib.ScheduleRun(
        server_args,
        lib.read_schedule(params["schedule_path"]),
        params["schedule_path"],
        steps,
        concurrency,
        params["runs"],
        params["warmup"],
        params["max_tokens"],
        env,
        name,
        health_timeout=params["health_timeout"],
        server_command=command,
    )
    opts.out = params["out"] or f"validate-{opts.run_id}.jsonl"
    fileio.check_output(
        opts.out, kind=fileio.OutputKind.RESULTS, option="--out", inputs=[profile_file, params["schedule_path"]]
    )
    opts.log_dir = os.path.dirname(os.path.abspath(opts.out))
    total = len(steps) + 1
    with (
        fileio.ResultsLock(opts.out, option="--out"),
        click.progressbar(length=total, label=f"validate --schedule ({total} launches)", file=sys.stderr) as bar,
    ):
        result = lib.run(opts, on_config=lambda label: bar.update(1))
    if params["as_json"]:
        emit_json(result)
    else:
        click.echo(render(result))
    if not any(conf["by_concurrency"] for conf in result["configurations"]):
        raise RunFailed(f"validate --schedule: every configuration failed; the server logs are in {opts.log_dir}")
