"""validate --schedule: a vLLM per-batch-size speculative schedule against static step
counts, on a real vLLM server, at each concurrency.

Every configuration (each static k asked for, then the schedule) is one server launch
(vLLM reads its speculative config once); on it, for each concurrency c, `warmup`
uncounted rounds and then `runs` timed rounds of c streaming requests sent together
(integration.client.concurrent_round), each round between two /metrics scrapes. Per
concurrency: aggregate tok/s (a round's tokens / its wall time; t interval over rounds),
tok/s per request and TTFT (t intervals over requests), and from the metrics' deltas the
accept length, the per-position acceptance (Wilson intervals over the drafts) and the
mean drafted tokens per draft, which is the k the server really ran. The verdict per
concurrency is the schedule's aggregate tok/s against the best static k's (Welch
interval over rounds).

The schedule is confirmed active two ways: the server's log echoes the config with
`num_speculative_tokens_per_batch_size` (vLLM's "non-default args" line), and at each
concurrency where the schedule's k differs from its num_speculative_tokens the drafted
tokens per draft follow the schedule, not the maximum. Each (configuration,
concurrency) is appended to the results file as soon as it is measured.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from nccl_tune import fileio, stats, store
from nccl_tune.errors import NcclTuneError
from nccl_tune.spec import schedule as sched

SCHEDULE = "schedule"


@dataclass
class ScheduleRun:
    """What `validate --schedule` was asked to do."""

    server_args: list[str]
    schedule: dict  # the speculative config (spec-plan --export-vllm's file)
    schedule_path: str
    steps: list[int]  # the static step counts to compare with
    concurrency: list[int]
    runs: int = 3
    warmup: int = 1
    max_tokens: int = 64
    profile_env: dict = field(default_factory=dict)
    profile_name: str | None = None
    out: str = "validate.jsonl"
    log_dir: str = "."
    health_timeout: float = 900.0
    server_command: list[str] | None = None
    run_id: str = field(default_factory=store.new_run_id)


def read_schedule(path: str) -> dict:
    """The speculative config file, read by the input policy (nccl_tune.fileio), its
    schedule checked by vLLM's rules; NcclTuneError naming the file."""
    config = fileio.load_json(path, what="speculative config")
    if not isinstance(config, dict) or not (config.get("method") or config.get("model")):
        raise NcclTuneError("not a speculative config: no method or draft model", path=path)
    if not fileio.is_int(config.get("num_speculative_tokens")) or config["num_speculative_tokens"] < 1:
        raise NcclTuneError("num_speculative_tokens must be a positive integer", path=path)
    try:
        sched.validate(config.get(sched.KEY))
    except ValueError as exc:
        raise NcclTuneError(f"{sched.KEY}: {exc}", path=path) from None
    return config


def configurations(opts: ScheduleRun) -> list[tuple[str, int, list[str]]]:
    """(label, steps, server arguments) per launch: each static k with the user's
    speculative config (or the schedule's method and model), then the schedule."""
    from integration import vllm
    from integration.server import remove_options

    user = vllm.speculative_config(opts.server_args)
    base = {k: v for k, v in (user or opts.schedule).items() if k != sched.KEY}
    rest = remove_options(opts.server_args, [*vllm.SPEC_OPTIONS, *(o + ".*" for o in vllm.SPEC_OPTIONS)])
    out = []
    for k in opts.steps:
        config = {**base, "num_speculative_tokens": max(k, 1)}
        out.append((f"k={k}", k, [*rest, vllm.SPEC_OPTION, json.dumps(config)]))
    out.append(
        (SCHEDULE, opts.schedule["num_speculative_tokens"], [*rest, vllm.SPEC_OPTION, json.dumps(opts.schedule)])
    )
    return out


INTERVALS = (
    "geometric mean and 95% interval, Student's t on the log scale (tok/s and TTFT are "
    "positive: a plain t interval of a few values reaches below zero); aggregate tok/s "
    "over rounds, per request over requests; acceptance per position: Wilson over drafts"
)


def _interval(values: list[float]) -> tuple[float | None, list[float] | None]:
    values = [v for v in values if v > 0]
    if not values:
        return None, None
    mean, lo, hi = stats.positive_ci(values)
    return mean, ([lo, hi] if len(values) > 1 else None)


def summarize_rounds(rounds: list[dict]) -> dict:
    """One concurrency's figures over its timed rounds (see the module doc)."""
    requests = [r for rnd in rounds for r in rnd["requests"]]
    agg, agg_ci = _interval([rnd["aggregate_tok_s"] for rnd in rounds])
    per, per_ci = _interval([r["tok_s"] for r in requests])
    ttft, ttft_ci = _interval([r["ttft_s"] for r in requests if r["ttft_s"] is not None])
    out = {
        "rounds": len(rounds),
        "requests": len(requests),
        "intervals": INTERVALS,
        "aggregate_tok_s": agg,
        "aggregate_tok_s_ci": agg_ci,
        "runs_aggregate_tok_s": [rnd["aggregate_tok_s"] for rnd in rounds],
        "request_tok_s": per,
        "request_tok_s_ci": per_ci,
        "ttft_s": ttft,
        "ttft_s_ci": ttft_ci,
        "accept_len": None,
        "drafts": 0,
        "draft_tokens_per_draft": None,
        "drafted_share_of_steps": 0.0 if any(r.get("spec") for r in rounds) else None,
        "per_position": None,
    }
    specs = [rnd["spec"] for rnd in rounds if rnd.get("spec") and rnd["spec"].get("drafts")]
    drafts = sum(s["drafts"] for s in specs)
    if drafts:
        accepted = sum(s["accepted_tokens"] for s in specs)
        out.update(
            drafts=drafts,
            accept_len=1.0 + accepted / drafts,
            draft_tokens_per_draft=sum(s["draft_tokens"] for s in specs) / drafts,
        )
        generated = sum(s.get("generation_tokens") or 0.0 for s in specs)
        if generated > accepted:  # request-steps = generated - accepted (each emits 1 + accepted)
            out["drafted_share_of_steps"] = drafts / (generated - accepted)
        counts: dict[int, float] = {}
        for s in specs:
            for i, share in enumerate(s.get("per_position") or []):
                counts[i] = counts.get(i, 0.0) + share * s["drafts"]
        out["per_position"] = [
            {"position": i + 1, "acceptance": p, "ci": [lo, hi]}
            for i in sorted(counts)
            for p, lo, hi in [stats.wilson_ci(counts[i], drafts)]
        ]
    return out


def _log_has_schedule(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return any("non-default args" in line and sched.KEY in line for line in handle)
    except OSError:
        return False


def measure(opts: ScheduleRun, label: str, steps: int, args: list[str], on_result=None) -> dict:
    """One launch: every concurrency's rounds; {"status", "error", "by_concurrency", ...}."""
    from integration import client, metrics, vllm
    from integration.server import Server, ServerError

    log_path = os.path.join(opts.log_dir, f"{opts.run_id}-{label.replace('=', '')}.log")
    server = Server(
        vllm.ENGINE,
        args,
        profile_env=opts.profile_env,
        steps=steps,
        log_path=log_path,
        health_timeout=opts.health_timeout,
        command=opts.server_command,
    )
    result = {
        "label": label,
        "steps": steps,
        "log": log_path,
        "server_argv": server.argv,
        "status": "ok",
        "error": None,
        "by_concurrency": {},
    }
    with server:
        try:
            server.wait_ready()
            check = server.check_env()  # the workers carry the profile (or no NCCL_*)
            result["env_ok"], result["env_problems"] = check.ok, check.problems()
            model = client.served_model(server.url)
            for c in opts.concurrency:
                for w in range(opts.warmup):
                    client.concurrent_round(server.url, model, opts.max_tokens, c, -1 - w)
                rounds = []
                for r in range(opts.runs):
                    before = metrics.try_scrape(server.url)
                    runs, wall = client.concurrent_round(server.url, model, opts.max_tokens, c, r)
                    after = metrics.try_scrape(server.url)
                    spec = metrics.speculative(metrics.delta(before, after)) if before and after else None
                    rounds.append(
                        {
                            "aggregate_tok_s": sum(x.tokens for x in runs) / wall,
                            "wall_s": wall,
                            "requests": [asdict(x) for x in runs],
                            "spec": spec,
                        }
                    )
                summary = summarize_rounds(rounds)
                result["by_concurrency"][c] = summary
                if on_result:
                    on_result(label, steps, c, summary, rounds)
        except ServerError as exc:
            result.update(status="failed", error=exc.short)
        except client.ClientError as exc:
            result.update(
                status="failed", error=str(exc) + ("" if server.running() else f" (the server exited; log: {log_path})")
            )
    result["log_shows_schedule"] = _log_has_schedule(log_path)
    return result


def verdicts(results: list[dict], concurrency: list[int]) -> dict[int, dict]:
    """Per concurrency: the best static k by aggregate tok/s and the schedule against it."""
    out = {}
    schedule = next((r for r in results if r["label"] == SCHEDULE), None)
    for c in concurrency:
        static = [
            r
            for r in results
            if r["label"] != SCHEDULE and c in r["by_concurrency"] and r["by_concurrency"][c]["aggregate_tok_s"]
        ]
        if not static or not schedule or c not in schedule["by_concurrency"]:
            out[c] = {"verdict": "unknown", "detail": "not measured"}
            continue
        best = max(static, key=lambda r: r["by_concurrency"][c]["aggregate_tok_s"])
        a = schedule["by_concurrency"][c]["runs_aggregate_tok_s"]
        b = best["by_concurrency"][c]["runs_aggregate_tok_s"]
        ratio = schedule["by_concurrency"][c]["aggregate_tok_s"] / best["by_concurrency"][c]["aggregate_tok_s"]
        entry = {"best_static": best["label"], "best_static_k": best["steps"], "ratio": ratio, "diff_ci": None}
        if len(a) < 2 or len(b) < 2:
            entry.update(verdict="unknown", detail="at least 2 rounds per configuration are needed")
        else:
            _, lo, hi = stats.welch_t_ci(a, b)
            entry["diff_ci"] = [lo, hi]
            entry["verdict"] = (
                "schedule beat the best static k"
                if lo > 0
                else "schedule lost to the best static k"
                if hi < 0
                else "no significant difference"
            )
            entry["detail"] = f"{ratio:.3f}x of {best['label']}, difference 95% CI [{lo:+.1f}, {hi:+.1f}] tok/s"
        out[c] = entry
    return out


def follows(want: int, top: int, summary: dict) -> bool | None:
    """Did the drafts at one concurrency follow the schedule's k (`want`) rather than its
    maximum (`top`)? None where the two are equal (nothing to tell). A k >= 1 shows in the
    drafted tokens per draft (vLLM counts a draft per request-step that carried drafts); a
    k of 0 in the share of request-steps that carried drafts at all (ramp-up and ramp-down
    of a round run at smaller batch sizes, so a few remain: under a quarter counts)."""
    if want == top:
        return None
    if want == 0:
        share = summary.get("drafted_share_of_steps")
        return None if share is None else share < 0.25
    seen = summary.get("draft_tokens_per_draft")
    return None if seen is None else abs(seen - want) < abs(seen - top)


def dynamic_evidence(schedule_result: dict | None, config: dict, concurrency: list[int]) -> dict:
    """Was the schedule active? The log's echo of the config, and per concurrency the
    drafts against the schedule's k and the static maximum (`follows`)."""
    if not schedule_result:
        return {"active": None, "log": None, "by_concurrency": {}, "note": "not measured"}
    top = config["num_speculative_tokens"]
    rows, telling = {}, []
    for c in concurrency:
        summary = schedule_result["by_concurrency"].get(c) or {}
        want = sched.k_at(config[sched.KEY], c, top)
        verdict = follows(want, top, summary) if summary else None
        if verdict is not None:
            telling.append(verdict)
        rows[c] = {
            "schedule_k": want,
            "draft_tokens_per_draft": summary.get("draft_tokens_per_draft"),
            "drafted_share_of_steps": summary.get("drafted_share_of_steps"),
            "follows_schedule": verdict,
        }
    log = schedule_result.get("log_shows_schedule")
    active = None if not telling else (all(telling) and bool(log))
    note = (
        "the server's log echoes the schedule and the drafts follow it"
        if active
        else "the drafts did not follow the schedule (or the log does not echo it)"
        if active is False
        else "no concurrency where the schedule's k differs from num_speculative_tokens: the "
        "metrics cannot tell it from a static k"
    )
    return {"active": active, "log": log, "by_concurrency": rows, "note": note}


def record(opts: ScheduleRun, label: str, steps: int, c: int, summary: dict, rounds: list) -> dict:
    """The results-file record of one (configuration, concurrency)."""
    return store.make_record(
        run_id=opts.run_id,
        env=dict(opts.profile_env),
        op="spec_decode_concurrency",
        world_size=None,
        status="ok",
        label=label,
        engine="vllm",
        steps=None if label == SCHEDULE else steps,
        concurrency=c,
        profile=opts.profile_name,
        source="measured",
        tok_s=summary["aggregate_tok_s"],
        tok_s_ci=summary["aggregate_tok_s_ci"],
        runs_tok_s=summary["runs_aggregate_tok_s"],
        accept_len=summary["accept_len"],
        max_tokens=opts.max_tokens,
        schedule=opts.schedule if label == SCHEDULE else None,
        detail={"summary": summary, "rounds": rounds},
    )


def run(opts: ScheduleRun, on_config=None) -> dict:
    """Measure every configuration, then the verdicts and the evidence."""
    results = []

    def keep(label, steps, c, summary, rounds):
        store.append_record(opts.out, record(opts, label, steps, c, summary, rounds))

    started = time.time()
    for label, steps, args in configurations(opts):
        results.append(measure(opts, label, steps, args, keep))
        if on_config:
            on_config(label)
    schedule_result = next((r for r in results if r["label"] == SCHEDULE), None)
    return {
        "run_id": opts.run_id,
        "engine": "vllm",
        "schedule_file": opts.schedule_path,
        "schedule": opts.schedule[sched.KEY],
        "num_speculative_tokens": opts.schedule["num_speculative_tokens"],
        "steps": opts.steps,
        "concurrency": opts.concurrency,
        "runs": opts.runs,
        "max_tokens": opts.max_tokens,
        "profile": opts.profile_name,
        "out": opts.out,
        "configurations": results,
        "verdicts": verdicts(results, opts.concurrency),
        "dynamic": dynamic_evidence(schedule_result, opts.schedule, opts.concurrency),
        "seconds": time.time() - started,
    }
