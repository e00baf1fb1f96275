"""`nccl-tune logs summarize LOG...`: throughput and accept length from server logs (SGLang,
vLLM V0/V1) or saved /metrics scrapes, one summary per file; `nccl-tune logs nccl LOG...
[--profile P.env]`: what NCCL's own log says it read and ran (logic: nccl_tune.nccl.nccllog)."""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune import vocab
from nccl_tune.cli import emit_json
from nccl_tune.live import envcheck

NO_DECODE = "no decode lines found (no SGLang 'Decode batch' line and no vLLM metrics line): nothing to summarize"


@click.group("logs")
def logs() -> None:
    """Read SGLang (0.2 to 0.5.x and later) and vLLM server logs, and NCCL's own log."""


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


@logs.command("summarize")
@click.argument("files", nargs=-1, required=True, type=vocab.InputFile())
@click.option(
    "--idle-gap",
    type=vocab.Finite(0, max=vocab.MAX_SECONDS, min_open=True),
    default=None,
    show_default="5 s",
    help="A decode line this long after the previous one is the first after idle "
    "(its throughput carries the idle time) and is left out.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summaries as a JSON list, one object per file (one shape however many files are given).",
)
def summarize(files: tuple[str, ...], idle_gap: float | None, as_json: bool) -> None:
    """Decode lines, gen throughput mean/median, accept length and rate, and the
    speculative settings the server ran with (from its server_args line). Reads SGLang
    logs, vLLM logs (V1 `Engine 000:` stats lines, V0 and V1 speculative metrics lines)
    and saved /metrics scrapes (curl -s URL/metrics > FILE)."""
    from integration.logs import DEFAULT_IDLE_GAP_S, summarize_file

    if idle_gap is not None and idle_gap <= 0:
        raise click.BadParameter("must be positive", param_hint="--idle-gap")
    gap = DEFAULT_IDLE_GAP_S if idle_gap is None else idle_gap
    summaries = [summarize_file(path, gap) for path in files]  # all read before any output
    for summary in summaries:
        if summary["decode_lines"] == 0 and summary["engine"] != "vllm" and not summary.get("kind"):
            summary["note"] = NO_DECODE
    if as_json:
        emit_json(summaries)
        return
    for i, summary in enumerate(summaries):
        if i:
            click.echo("")
        _render(summary)


def _render(summary: dict) -> None:
    log = summary["log"]
    if summary.get("kind") == "metrics scrape":
        spec = summary.get("metrics") or {}
        rows = [
            ("engine", summary["engine"] or "unknown"),
            ("kind", f"/metrics scrape ({summary['samples']} samples; counters since the server started)"),
            ("accept len", _fmt(spec.get("accept_len"))),
            ("accept rate", _fmt(spec.get("accept_rate"))),
        ]
        if spec.get("per_position"):
            rows.append(("per-position acceptance", ", ".join(f"{p:.3f}" for p in spec["per_position"])))
        if spec.get("drafts") is not None:
            rows.append(
                (
                    "drafts / draft tokens / accepted",
                    f"{spec['drafts']:.0f} / {spec['draft_tokens']:.0f} / {spec['accepted_tokens']:.0f}",
                )
            )
        if not spec:
            rows.append(("speculative", "no speculative-decoding metrics in the scrape"))
        click.echo(log)
        click.echo(tabulate(rows, tablefmt="plain"))
        return
    if summary.get("note") == NO_DECODE:
        click.echo(f"{log}: {NO_DECODE}")
        spec = summary["speculative"]
        if summary["server_args"]:
            click.echo(
                "speculative (server_args): " + (", ".join(f"{k}={v}" for k, v in spec.items()) if spec else "off")
            )
        return
    engine = summary["engine"] or "unknown (no decode or speculative lines found)"
    rows = [
        ("engine", engine),
        ("decode lines", summary["decode_lines"]),
        ("gen throughput mean (tok/s)", _fmt(summary["gen_throughput_mean"])),
        ("gen throughput median (tok/s)", _fmt(summary["gen_throughput_median"])),
        ("lines used / left out after idle", f"{summary['gen_throughput_lines']} / {summary['excluded_after_idle']}"),
        *((f"  left out: {reason}", count) for reason, count in (summary.get("excluded") or {}).items()),
        ("accept len mean", _fmt(summary["accept_len_mean"])),
        ("accept rate mean", _fmt(summary["accept_rate_mean"])),
    ]
    if summary["graph_share"] is not None:
        rows.append(("lines with graphs on", _fmt(summary["graph_share"], ".0%")))
    if summary["sources"]:
        rows.append(("ranks logging", ", ".join(summary["sources"])))
    spec = summary["speculative"]
    if spec:
        rows.append(("speculative (server_args)", ", ".join(f"{k}={v}" for k, v in spec.items())))
    elif summary["server_args"]:
        rows.append(("speculative (server_args)", "off"))
    if summary.get("substitutes"):
        rows.append(("TEST-ONLY substitutes loaded", ", ".join(summary["substitutes"]) + " (not SGLang's own kernels)"))
    vllm = summary.get("vllm") or {}
    if vllm.get("per_position_mean"):
        rows.append(("per-position acceptance (mean)", ", ".join(f"{p:.3f}" for p in vllm["per_position_mean"])))
    click.echo(f"{log}")
    click.echo(tabulate(rows, tablefmt="plain"))


@logs.command("nccl")
@click.argument("logs_", metavar="LOG...", nargs=-1, required=True, type=vocab.InputFile())
@click.option(
    "--profile",
    "profile_path",
    type=envcheck.PROFILE,
    help="Profile (.env, .conf or shipped name): confirm every variable in every rank.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def nccl(logs_: tuple[str, ...], profile_path: str | None, as_json: bool) -> None:
    """Per rank and communicator: NCCL version, variables NCCL read, channels, rings,
    transports per peer, tuner plugin, per-collective choices by size; with --profile,
    every profile variable confirmed or flagged per rank (exit 1 when one is not).

    Give one file per process (NCCL_DEBUG_FILE=path.%h.%p) or a server log with the
    ranks interleaved; NCCL_DEBUG=INFO, and NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING for the
    per-collective lines.
    """
    import sys

    from nccl_tune.live.profile import load_profile, resolve_profile
    from nccl_tune.nccl import nccllog

    env = load_profile(str(resolve_profile(profile_path))).env if profile_path else None
    report = nccllog.analyze(list(logs_), env)
    if as_json:
        emit_json(report)
    else:
        for line in render_nccl(report):
            click.echo(line)
    check = report["profile_check"]
    sys.exit(1 if check is not None and not check["ok"] else 0)


def _transports(rank: dict) -> str:
    return ", ".join(f"{t['peer']}:{t['transport']}" for t in rank["transports"]) or "-"


def render_nccl(report: dict) -> list[str]:
    """The text of `logs nccl`: ranks table, variables, choices, profile check, warnings."""
    ranks = report["ranks"]
    rows = []
    for r in ranks:
        tuner = r["tuner_plugin"]
        rows.append(
            [
                r["process"],
                "-" if r["rank"] is None else f"{r['rank']}/{r['nranks']}",
                r["comm"] or "-",
                f"{r['library']} {r['version'] or '?'}",
                _fmt(r["channels"], "d"),
                _transports(r),
                (tuner["name"] if tuner and tuner["loaded"] else "none" if tuner else "-"),
            ]
        )
    out = [
        f"{report['processes']} process(es), {len(ranks)} rank entr(ies) in {len(report['files'])} file(s)",
        tabulate(rows, headers=["process", "rank", "comm", "version", "channels", "transports (peer:via)", "tuner"]),
    ]
    seen_env: dict[str, str] = {}
    for r in ranks:
        if r["process"] in seen_env:
            continue
        words = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(none logged)"
        seen_env[r["process"]] = words
        out.append(f"{r['process']}: set by environment: {words}")
    out.append(f"conf files: {ranks[0]['conf_files']}" if ranks else "")
    choices: dict[tuple, set] = {}
    for r in ranks:
        for c in r["choices"]:
            key = (
                c["func"] or "(unnamed)",
                c["bytes"],
                f"{c['algo']}/{c['proto']}",
                "-" if c["channels"] is None else str(c["channels"]),
            )
            choices.setdefault(key, set()).add(r["process"] if r["rank"] is None else str(r["rank"]))
    if choices:
        out.append("")
        out.append("per-collective choice (NCCL's TUNING lines):")
        out.append(
            tabulate(
                [[f, b, ap, ch, ", ".join(sorted(who))] for (f, b, ap, ch), who in sorted(choices.items())],
                headers=["collective", "bytes", "algo/proto", "channels", "ranks"],
            )
        )
    check = report["profile_check"]
    if check is not None:
        out.append("")
        out.append(
            "profile check: " + ("every variable confirmed in every process" if check["ok"] else "NOT confirmed")
        )
        for v in check["variables"]:
            line = f"  {v['name']}={v['expected']}: {v['status']}"
            if v["different"]:
                line += " (" + ", ".join(f"{p} read {val}" for p, val in v["different"].items()) + ")"
            if v["missing"] and v["status"] == "missing":
                line += f" in {len(v['missing'])} of {check['processes']}: " + ", ".join(v["missing"][:8])
            out.append(line)
        notes = dict.fromkeys(v["note"] for v in check["variables"] if v.get("note") and v["status"] != "confirmed")
        out.extend(f"  note: {n}" for n in notes)
    for w in report["warnings"]:
        out.append(f"warning [{w['process']}]: {w['message']}")
    return out
