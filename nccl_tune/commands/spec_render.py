"""spec-plan's text output: per batch size the rows, the decision, the candidates."""

from __future__ import annotations

from tabulate import tabulate

HEADERS = ["k", "tau", "draft ms", "verify ms", "cycle ms", "tok/s", "vs plain", "note"]


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _row(p, plain, best, cands) -> list:
    mark = ", ".join(
        x
        for x in (
            "best" if p is best else "",
            "candidate" if p.k in cands else "",
            "extrapolated" if p.extrapolated else "",
        )
        if x
    )
    star = "*" if p.extrapolated else ""
    return [
        "0 (plain)" if p.k == 0 else p.k,
        f"{p.tau:.3f}",
        _fmt(p.draft_ms),
        _fmt(p.verify_ms) + (star if p.verify_ms is not None else ""),
        f"{p.cycle_ms:.3f}" + (star if p.verify_ms is None else ""),
        f"{p.tok_s:.1f}",
        f"{p.tok_s / plain.tok_s:.2f}x" if plain else "-",
        mark,
    ]


def _extrapolation(batch, kind: str) -> list[str]:
    extrap = [p for p in batch.plans if p.extrapolated]
    if not extrap:
        return []
    if kind == "cycle-fit":
        return [
            "EXTRAPOLATED (rows marked *): the fitted cycle time at k = "
            + ", ".join(str(p.k) for p in extrap)
            + ", outside the measured step counts"
        ]
    return [
        f"EXTRAPOLATED (rows marked *; verify {kind}): forward time at "
        + ", ".join(
            f"{batch.batch * (p.k + 1)} tokens (k = {p.k}" + (", plain decoding)" if p.k == 0 else ")") for p in extrap
        )
        + " beyond the measured points"
    ]


def batch_lines(batch, result, several: bool) -> list[str]:
    """The table and the decision of one batch size."""
    lines = []
    plain = batch.plain
    if several:
        lines.append(f"\nbatch {batch.batch} (tokens per verify = {batch.batch} x (k+1); tok/s per sequence)")
    rows = [_row(p, plain, batch.best, batch.candidates) for p in batch.plans]
    lines.append(tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True))
    if batch.left_out:
        lines.append(
            "steps left out (forward time beyond the measured token counts; "
            "--extrapolate or a verify model): " + ", ".join("0 (plain)" if k == 0 else str(k) for k in batch.left_out)
        )
    lines += _extrapolation(batch, result.verify_model["kind"])
    decision = batch.decision
    lines.append(
        f"decision: {decision['words']}" + (" - its row is EXTRAPOLATED (*)" if batch.best.extrapolated else "")
    )
    if batch.span:
        lines.append(
            f"one measured point: best k {batch.span['best_k_all_per_step']} if the cycle "
            f"is all per-step cost, {batch.span['best_k_all_fixed']} if all fixed"
        )
    how = (
        "any split one measured point allows"
        if batch.span
        else "their tok/s intervals (from the inputs' +-H) reach the best's"
        if batch.intervals
        else f"within {100 * result.rel_error:g}% of the best"
    )
    lines.append(
        f"candidates ({how}): {', '.join(map(str, batch.candidates))}; the measured sweep decides: {batch.validate}"
    )
    if batch.span and batch.span["measure_k"] is not None:
        lines.append(
            f"to decide: measure tok/s at k = {batch.span['measure_k']} (--measured-tok-s "
            "X@K): two points separate the fixed from the per-step cost"
        )
    return lines


def render(result) -> str:
    """spec-plan's text output."""
    lines = [
        f"plain decoding: {result.verify_model['plain_decoding']}",
        f"acceptance: {result.acceptance.description}",
        f"verify: {result.verify_model['description']}",
    ]
    for batch in result.batches:
        lines += batch_lines(batch, result, len(result.batches) > 1)
    conv = result.to_dict()["conventions"]
    if conv["k"]:
        lines.append(
            f"at k = {conv['k']}: accept length {conv['accept_len']:.3f} (bonus included; "
            f"accepted drafts {conv['accepted_drafts']:.3f}); SGLang accept rate "
            f"{conv['sglang_accept_rate']:.3f} as (L-1)/k, "
            f"{conv['sglang_accept_rate_total']:.3f} as L/(k+1); vLLM draft acceptance "
            f"rate {conv['vllm_draft_acceptance_rate']:.3f}"
        )
    lines += [consistency_line(row) for row in result.consistency]
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


def consistency_line(row: dict) -> str:
    """One reconciliation row as text."""
    pred = row.get("predicted")
    head = (
        f"{'agrees' if row['agrees'] else 'DISAGREES' if row['agrees'] is False else 'unchecked'}: "
        f"{row['input']}" + (f" (predicted {pred:.3f})" if isinstance(pred, float) else "")
    )
    parts = [head]
    for need in row.get("would_have_to", []):
        text = f"{need['input']} would have to be {need['value']:.3f}, not {need['given']:.3f}" + (
            f" ({need['from']})" if need.get("from") else ""
        )
        if need.get("agrees_with"):
            text += "; " + ", ".join(need["agrees_with"]) + " agrees with that"
        parts.append(text)
    if row.get("note"):
        parts.append(row["note"])
    return "; ".join(parts)


def export_lines(info: dict | None) -> list[str]:
    """What --export-vllm did."""
    if not info:
        return []
    if not info["written"]:
        return [f"export-vllm: {info['path']} not written: {info['reason']}"]
    cfg = info["config"]
    return [
        f"export-vllm: wrote {info['path']}: num_speculative_tokens {cfg['num_speculative_tokens']}, "
        f"num_speculative_tokens_per_batch_size {cfg['num_speculative_tokens_per_batch_size']} "
        f"(checked by {info['checked_by']})"
    ] + [f"note: {n}" for n in info["notes"]]


def compare_table(comp, baseline_label: str, rec_label: str | None) -> str:
    """recommend's table: cycle and tok/s per k under the baseline and the recommended cell."""
    headers = ["k", "tau", f"cycle ms ({baseline_label})", "tok/s"]
    rec = {p.k: p for p in comp.recommended or []}
    if rec:
        headers += [f"cycle ms ({rec_label})", "tok/s "]
    rows = []
    for p in comp.baseline:
        line = [
            "0 (plain)" if p.k == 0 else str(p.k),
            f"{p.tau:.3f}",
            f"{p.cycle_ms:.3f}",
            f"{p.tok_s:.1f}" + ("*" if p.extrapolated else ""),
        ]
        if rec:
            r = rec[p.k]
            line += [f"{r.cycle_ms:.3f}", f"{r.tok_s:.1f}" + ("*" if r.extrapolated else "")]
        rows.append(line)
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def compare_lines(comp, acceptance: str, rec_label: str | None) -> list[str]:
    """recommend --spec-steps as text: the table, the decision under each cell, candidates,
    assumptions, what was left out or extrapolated."""
    lines = [f"Speculative decoding ({acceptance}):", compare_table(comp, "baseline", rec_label and "recommended")]
    lines.append(f"decision under the baseline: {comp.decision('baseline')['words']}")
    if comp.recommended:
        lines.append(f"decision under the recommended cell: {comp.decision('recommended')['words']}")
    spec = comp.to_dict()
    cands = spec["candidates_recommended"] or spec["candidates_baseline"]
    if cands:
        lines.append(
            f"candidates (within {100 * comp.rel_error:g}% of the best): "
            f"{', '.join(map(str, cands))}; the measured sweep decides: "
            f"{spec['validate_command']}"
        )
    lines += [f"assumption: {note}" for note in comp.assumptions]
    if comp.skipped:
        lines.append(
            "steps left out (verify size outside the measured range; --extrapolate): "
            + ", ".join(map(str, comp.skipped))
        )
    if comp.skipped_verify:
        lines.append(
            "steps left out (verify token count beyond the --verify-ms points; "
            "--extrapolate): " + ", ".join(map(str, comp.skipped_verify))
        )
    note = comp.extrapolation_note()
    return lines + ([note] if note else [])
