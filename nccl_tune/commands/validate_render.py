"""`nccl-tune validate`'s text output (the A/B of a profile): the table, best step counts,
notes and the verdict."""

from __future__ import annotations

from tabulate import tabulate

from nccl_tune.commands.ranges_render import range_notes

VERDICT_WORDS = {
    "helps": "the profile helps",
    "hurts": "the profile hurts",
    "no significant difference": "the profile makes no significant difference",
    "unknown": "no verdict",
}


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _tok_s(row: dict) -> str:
    if row["tok_s"] is None:
        return row["status"] or "-"
    ci = row["tok_s_ci"]
    return f"{row['tok_s']:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _range(row: dict) -> str:
    found = row.get("predicted_saving_range_ms")
    return "-" if not found else f"{found[0]:+.3f} to {found[1]:+.3f}"


def _calibrated(row: dict) -> str:
    return {True: "yes", False: "no"}.get(row.get("prediction_calibrated"), "-")


def range_lines(result: dict) -> list[str]:
    """What a modelled prediction's range rests on (nothing for a measured one)."""
    rows = result.get("prediction_ranges")
    if not rows:
        return []
    return [
        (
            "predicted range: the model's relative saving applied to the range of NCCL's "
            "defaults at each size (as recommend's tok/s ranges); calibrated: yes only where "
            "a `model fit` (--model) calibrated every time it rests on"
        ),
        *range_notes(rows),
    ]


def render(result: dict) -> str:
    """The validation table, best step counts, notes and verdict as text."""
    ranged = any(r.get("prediction_calibrated") is not None for r in result["rows"])
    table = []
    for r in result["rows"]:
        speed = "" if r["speedup"] is None else f"{r['speedup']:.3f}x"
        if r["verdict"]:
            speed += f" ({r['verdict']})"
        table.append(
            [
                r["steps"],
                r["config"],
                _tok_s(r),
                _fmt(r["accept_len"]),
                _fmt(r["draft_ms"], ".3f"),
                _fmt(r["verify_ms"], ".3f"),
                speed or "-",
                _fmt(r["measured_saving_ms"], "+.3f"),
                _fmt(r["predicted_saving_ms"], "+.3f"),
                _fmt(r["prediction_error_ms"], "+.3f"),
            ]
            + ([_range(r), _calibrated(r)] if ranged else [])
        )
    kind = result.get("prediction_kind")
    headers = [
        "steps",
        "config",
        "tok/s mean [95% CI]",
        "accept len",
        "draft ms",
        "verify ms",
        "speedup vs baseline",
        "saved ms/tok",
        f"predicted ({kind})" if kind else "predicted",
        "difference",
    ] + (["predicted range", "calibrated"] if ranged else [])
    lines = [
        f"validate {result['profile']} on engine {result['engine']} "
        f"({result['backend'] or '?'}, {result['world_size']} ranks), {result['runs']} runs x "
        f"{result['max_tokens']} tokens per configuration",
        tabulate(table, headers=headers, tablefmt="simple"),
        *range_lines(result),
    ]
    for r in result["rows"]:
        if r["status"] != "ok" and r.get("error"):
            lines.append(f"{r['status']}: {r['config']} at steps {r['steps']}: {_short(r['error'])}")
    for r in result["rows"]:
        if r.get("nccl_check"):
            lines.append(f"NCCL log, {r['config']} at steps {r['steps']}: {r['nccl_check']['summary']}")
    best = result["best_steps"]
    lines.append(f"best step count: baseline {best['baseline']}, profile {best['profile']}")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    lines.append(f"verdict: {VERDICT_WORDS.get(result['verdict'], result['verdict'])} ({result['verdict_detail']})")
    lines.append(f"results appended to {result['out']}")
    return "\n".join(lines)
