"""`nccl-tune spec-plan`: the draft step-count planner on its own, from profiler numbers."""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune import specdec

SGLANG_RATE_HELP = ("SGLang's averaged `accept rate` R@K, logged with K draft steps (topk 1); "
                    "converted to an accept length under --sglang-rate-convention.")
SGLANG_CONVENTION_HELP = ("How SGLang computed the accept rate: drafts = (accept len - 1) / steps "
                          "(recent releases), total = accept len / (steps + 1) (earlier releases).")
VLLM_RATE_HELP = ("vLLM's draft acceptance rate R@K (accepted / drafted tokens) with K speculative "
                  "tokens; accept length = 1 + R x K.")


def acceptance_options(command):
    """The acceptance options spec-plan and recommend share (at most one may be given)."""
    options = [
        click.option("--accept-len", help="Accept length L@K, bonus token included (SGLang accept "
                                          "len, vLLM mean acceptance length), measured at K draft steps."),
        click.option("--accept-rate", type=float, help="iid per-token draft acceptance probability."),
        click.option("--accept-per-pos",
                     help="Per-position acceptance p1,p2,... (vLLM's per-position rates)."),
        click.option("--sglang-accept-rate", help=SGLANG_RATE_HELP),
        click.option("--sglang-rate-convention", type=click.Choice(list(specdec.SGLANG_CONVENTION_WORDS)),
                     default=specdec.SGLANG_RATE_DRAFTS, show_default=True, help=SGLANG_CONVENTION_HELP),
        click.option("--vllm-acceptance-rate", help=VLLM_RATE_HELP),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def parse_plan_inputs(steps: str, steps_option: str, accept_len, accept_rate, accept_per_pos,
                      sglang_accept_rate, vllm_acceptance_rate, sglang_rate_convention):
    """(step counts, acceptance) from the shared options; click.UsageError naming the option."""
    try:
        step_list = specdec.parse_steps(steps, steps_option)
        acceptance = specdec.acceptance_from_options(
            accept_len, accept_rate, accept_per_pos, sglang_accept_rate, vllm_acceptance_rate,
            sglang_rate_convention)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if acceptance.max_k is not None and step_list[-1] > acceptance.max_k:
        raise click.UsageError(f"--accept-per-pos gives {acceptance.max_k} positions; "
                               f"{steps_option} goes to {step_list[-1]}")
    return step_list, acceptance


def parse_verify(verify_ms: str):
    """--verify-ms as specdec verify points; click.UsageError naming the option."""
    try:
        return specdec.verify_from_option(verify_ms, "--verify-ms")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def engines_kinds() -> list[str]:
    """The cost model's topology kinds (spec-plan's --topology choices)."""
    from nccl_tune import costmodel

    return list(costmodel.TOPOLOGIES)


def _engine_notes(engine: str, kind: str | None, tp: int, steps) -> list[str]:
    """Whether the engine's decode and verify allreduces bypass NCCL (nccl_tune.engines)."""
    from nccl_tune import engines, model

    if engine == "none":
        return []
    if kind is None:
        return [f"engine {engine}: on NVLink machines (and two PCIe GPUs with P2P) its custom "
                f"allreduce, not NCCL, runs allreduces below {engines.MAX_BYTES[engine]} B, so "
                f"NCCL settings do not change them; {engines.TO_NCCL[engine]} sends them through "
                "NCCL (pass --topology to decide for your machine)"]
    sizes = [model.message_bytes(k + 1, 7168, "bf16") for k in [0, *steps]]
    return engines.notes(engine, kind, tp, sizes) + [
        "(sizes: verify of k+1 tokens at hidden 7168, bf16)"]


@click.command("spec-plan")
@click.option("--verify-ms", required=True,
              help="Verify forward time: V (flat in tokens) or V1,V2,...@T1,T2,... measured at T "
                   "tokens per sequence (k+1); linear between points, extrapolated (marked) beyond.")
@click.option("--draft-ms", type=click.FloatRange(min=0), required=True, help="Time of one draft step (ms).")
@acceptance_options
@click.option("--steps", default="1-10", show_default=True, help="Step counts to compare, e.g. 1-10 or 2,4,6.")
@click.option("--other-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Per-cycle time outside draft and verify (sampling, scheduling).")
@click.option("--extrapolate", is_flag=True,
              help="Extrapolate the verify time linearly beyond the measured token counts (rows "
                   "marked *); without it those step counts are left out.")
@click.option("--engine", type=click.Choice(["sglang", "vllm", "none"]), default="none",
              show_default=True, help="Serving engine: say whether its allreduces bypass NCCL.")
@click.option("--topology", "engine_topology", default=None,
              type=click.Choice(sorted(engines_kinds())),
              help="With --engine: the machine kind (NVLink or PCIe decides the engine's path).")
@click.option("--tp", type=click.IntRange(min=1), default=8, show_default=True,
              help="With --engine: tensor-parallel size.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def spec_plan(verify_ms, draft_ms, accept_len, accept_rate, accept_per_pos, sglang_accept_rate,
              sglang_rate_convention, vllm_acceptance_rate, steps, other_ms, extrapolate, engine,
              engine_topology, tp, as_json):
    """Plan the speculative draft step count from draft/verify timings and acceptance.

    tau(k) = 1 + sum of per-position acceptance (bonus token included); cycle = k x draft
    + verify(k+1) + other; tok/s = 1000 x tau / cycle. k = 0 is plain decoding.
    """
    step_list, acceptance = parse_plan_inputs(
        steps, "--steps", accept_len, accept_rate, accept_per_pos, sglang_accept_rate,
        vllm_acceptance_rate, sglang_rate_convention)
    verify = parse_verify(verify_ms)
    # model.py's contract: beyond what was measured, refuse unless asked, then say so.
    beyond = [k for k in [0, *step_list] if verify.extrapolated(k + 1)]
    if beyond and not extrapolate:
        if 0 in beyond:
            raise click.UsageError(f"--verify-ms '{verify_ms}' has no point at 1 token (plain "
                                   "decoding): add one, or pass --extrapolate")
        step_list = [k for k in step_list if k not in beyond]
        if not step_list:
            raise click.UsageError(f"--verify-ms '{verify_ms}' covers none of --steps '{steps}' "
                                   "(k + 1 tokens per sequence): measure those or pass --extrapolate")
    left_out = beyond if not extrapolate else []
    try:
        plans = specdec.plan_steps([0, *step_list], acceptance.tau, draft_ms, verify, other_ms)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    plain = plans[0]
    best = specdec.best_step(plans[1:])
    extrapolated = {p.k: p.k + 1 for p in plans if p.extrapolated}
    note = ("EXTRAPOLATED (--extrapolate; rows marked *): verify time at "
            + ", ".join(f"{t} tokens (k = {k})" for k, t in extrapolated.items())
            + f" beyond the measured token counts {_counts(verify)}") if extrapolated else None
    skipped_note = (f"steps left out (k + 1 tokens beyond the measured token counts "
                    f"{_counts(verify)}; --extrapolate): {', '.join(map(str, left_out))}"
                    if left_out else None)
    engine_notes = _engine_notes(engine, engine_topology, tp, step_list)
    if as_json:
        from dataclasses import asdict

        from nccl_tune.cli import emit_json

        emit_json({"source": "given", "acceptance": acceptance.description,
                   "iid_rate": acceptance.rate, "verify_points": [list(p) for p in verify.points],
                   "draft_ms": draft_ms, "other_ms": other_ms,
                   "plans": [asdict(p) for p in plans], "best_k": best.k, "best_tok_s": best.tok_s,
                   "plain_tok_s": plain.tok_s, "speedup": best.tok_s / plain.tok_s,
                   "skipped_steps": left_out,
                   "extrapolated_verify_tokens": {str(k): t for k, t in extrapolated.items()},
                   "extrapolation_note": note,
                   "conventions": _conventions(acceptance, best.k), "engine_notes": engine_notes})
        return
    for line in engine_notes:
        click.echo(f"note: {line}")
    click.echo(f"acceptance: {acceptance.description}")
    flat = len(verify.points) == 1
    click.echo("verify: " + (f"{verify.points[0][1]:g} ms for any token count (flat: dense-like; give "
                             "V1,V2@T1,T2 for a verify that rises with tokens)" if flat else
                             ", ".join(f"{m:g} ms @ {t} tokens" for t, m in verify.points)))
    rows = []
    for p in plans:
        rows.append(["0 (plain)" if p.k == 0 else p.k, f"{p.tau:.3f}", f"{p.draft_ms:.3f}",
                     f"{p.verify_ms:.3f}" + ("*" if p.extrapolated else ""), f"{p.cycle_ms:.3f}",
                     f"{p.tok_s:.1f}", f"{p.tok_s / plain.tok_s:.2f}x",
                     "<- best" if p is best else ""])
    click.echo(tabulate(rows, headers=["k", "tau", "draft ms", "verify ms", "cycle ms", "tok/s",
                                       "vs plain", ""], tablefmt="simple", disable_numparse=True))
    for line in (note, skipped_note):
        if line:
            click.echo(line)
    click.echo(f"best: k = {best.k} draft steps, {best.tok_s:.1f} tok/s "
               f"({best.tok_s / plain.tok_s:.2f}x plain decoding)")
    conv = _conventions(acceptance, best.k)
    click.echo(f"at k = {best.k}: accept length {conv['accept_len']:.3f}; SGLang accept rate "
               f"{conv['sglang_accept_rate']:.3f} (recent; {conv['sglang_accept_rate_total']:.3f} in "
               f"releases that count the bonus token); vLLM draft acceptance rate "
               f"{conv['vllm_draft_acceptance_rate']:.3f}")


def _counts(verify) -> str:
    return "-".join(str(t) for t in (verify.points[0][0], verify.points[-1][0]))


def _conventions(acceptance, k: int) -> dict:
    tau = acceptance.tau(k)
    return {"k": k, "accept_len": tau,
            "sglang_accept_rate": specdec.sglang_accept_rate(tau, k, specdec.SGLANG_RATE_DRAFTS),
            "sglang_accept_rate_total": specdec.sglang_accept_rate(tau, k, specdec.SGLANG_RATE_TOTAL),
            "vllm_mean_acceptance_length": tau,
            "vllm_draft_acceptance_rate": specdec.vllm_draft_acceptance_rate(tau, k)}
