"""`nccl-tune spec-plan`: the draft step-count planner on its own, from profiler numbers.

Thin: options -> nccl_tune.spec.planner.PlanRequest -> plan -> render. The planner,
its conventions and its models live in nccl_tune.spec_* (see nccl_tune/spec/cycle.py).
"""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune import vocab
from nccl_tune.model.per_token import DTYPE_BYTES
from nccl_tune.live import envcheck
from nccl_tune.spec import accept as sa
from nccl_tune.spec import options as so

ACCEPT_LEN_HELP = ("Accept length L@K counting the bonus token (SGLang's `accept len`, vLLM's mean "
                   "acceptance length) at K draft steps; repeatable, one per K.")
DRAFTS_HELP = ("Accepted drafts per cycle A@K, bonus token NOT counted (a per-cycle profiler's "
               "count; accept length = A + 1); repeatable.")
SGLANG_RATE_HELP = ("SGLang's `accept rate` R@K (topk 1); repeatable. Its meaning changed in "
                    "python/sglang/srt/managers/scheduler_metrics_mixin.py (log_decode_stats): "
                    "L/(k+1) from sgl-project/sglang PR #11572 (2025-10-13), (L-1)/k from PR "
                    "#23530 (2026-04-23). With --accept-len at the same K the convention is "
                    "inferred from the pair.")
SGLANG_CONVENTION_HELP = ("How to read --sglang-accept-rate: auto = infer from an --accept-len at "
                          "the same K (refused without one); drafts = (L-1)/k (releases after PR "
                          "#23530); total = L/(k+1) (PR #11572 until #23530).")
VLLM_RATE_HELP = ("vLLM's draft acceptance rate R@K (accepted / drafted); accept length = 1 + R x "
                  "K; repeatable.")
PER_POS_HELP = ("Per-position acceptance p1,p2,... (vLLM's spec_decode_num_accepted_tokens_per_pos "
                "/ spec_decode_num_drafts): position-dependent tau.")


def acceptance_options(command):
    """The acceptance options spec-plan and recommend share."""
    options = [
        click.option("--accept-len", multiple=True, help=ACCEPT_LEN_HELP),
        click.option("--accepted-drafts", multiple=True, help=DRAFTS_HELP),
        click.option("--accept-rate", type=vocab.Finite(0, max=1), help="iid per-token draft acceptance probability "
                                                       "(none of the engines' averages)."),
        click.option("--accept-per-pos", help=PER_POS_HELP),
        click.option("--sglang-accept-rate", multiple=True, help=SGLANG_RATE_HELP),
        click.option("--sglang-rate-convention",
                     type=click.Choice([sa.SGLANG_RATE_AUTO, *sa.SGLANG_CONVENTION_WORDS]),
                     default=sa.SGLANG_RATE_AUTO, show_default=True, help=SGLANG_CONVENTION_HELP),
        click.option("--vllm-acceptance-rate", multiple=True, help=VLLM_RATE_HELP),
    ]
    for option in reversed(options):
        command = option(command)
    return command


ACCEPTANCE_KEYS = ("accept_len", "accepted_drafts", "accept_rate", "accept_per_pos",
                   "sglang_accept_rate", "vllm_acceptance_rate", "sglang_rate_convention")


def parse_acceptance(kwargs: dict) -> so.AcceptanceInput:
    """The shared acceptance options (popped from a command's kwargs); UsageError naming one."""
    values = {key: kwargs.pop(key) for key in ACCEPTANCE_KEYS}
    try:
        return so.parse_acceptance(values["accept_len"], values["accepted_drafts"],
                                   values["accept_rate"], values["accept_per_pos"],
                                   values["sglang_accept_rate"], values["vllm_acceptance_rate"],
                                   values["sglang_rate_convention"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def usage(fn, *args, **kwargs):
    """fn(...) with ValueError turned into one click.UsageError line."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def engines_kinds() -> list[str]:
    """The cost model's topology kinds (spec-plan's --topology choices)."""
    from nccl_tune.model import costmodel

    return list(costmodel.TOPOLOGIES)


def _engine_notes(engine: str, kind: str | None, tp: int, steps, hidden: int = 7168,
                  dtype: str = "bf16") -> list[str]:
    """Whether the engine's decode and verify allreduces bypass NCCL (nccl_tune.model.engines)."""
    from nccl_tune.model import engines, per_token as model

    if engine == "none":
        return []
    if kind is None:
        return [f"engine {engine}: on NVLink machines (and two PCIe GPUs with P2P) its custom "
                f"allreduce, not NCCL, runs allreduces below {engines.MAX_BYTES[engine]} B, so "
                f"NCCL settings do not change them; {engines.TO_NCCL[engine]} sends them through "
                "NCCL (pass --topology to decide for your machine)"]
    sizes = [model.message_bytes(k + 1, hidden, dtype) for k in [0, *steps]]
    return engines.notes(engine, kind, tp, sizes) + [
        f"(sizes: verify of k+1 tokens at hidden {hidden}, {dtype})"]


@click.command("spec-plan")
@click.option("--decode-ms", help="Plain decoding's own time per token (ms), without speculation; "
                                  "D or D+-H (an interval).")
@click.option("--verify-ms", help="Verify forward time: V (flat: the same at every token count) or "
                                  "V1,V2,...@T1,T2,... at T tokens per forward (k+1 at batch 1). "
                                  "Measured points are interpolated; step counts beyond them are "
                                  "left out unless --extrapolate or a verify model (--moe-experts, "
                                  "--verify-model dense) extends them, marked *.")
@click.option("--draft-ms", help="Time of one draft step (ms); T or T+-H.")
@acceptance_options
@click.option("--steps", default="1-10", show_default=True, help="Step counts to compare, e.g. 1-10 or 2,4,6.")
@click.option("--other-ms", default="0", show_default=True,
              help="Per speculative cycle time outside draft and verify (draft re-extend, tree, "
                   "acceptance); not charged to plain decoding. T or T+-H.")
@click.option("--verify-model", type=click.Choice(["auto", "interp", "moe", "dense"]), default="auto",
              show_default=True, help="auto: moe with --moe-experts, else the measured points (interp).")
@click.option("--moe-experts", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Routed experts E of a MoE target.")
@click.option("--moe-topk", type=vocab.Count(1, max=vocab.MAX_EXPERTS), help="Experts per token K of a MoE target.")
@click.option("--layers", type=vocab.Count(1, max=vocab.MAX_LAYERS),
              help="Target layers: adds comm(n) (2 per layer + 1 allreduces, nccl_tune.model.per_token) from "
                   "the cost model to the verify model (MODELLED).")
@click.option("--hidden", type=vocab.Count(1, max=vocab.MAX_HIDDEN), default=7168, show_default=True)
@click.option("--dtype", default="bf16", show_default=True,
              type=click.Choice(list(DTYPE_BYTES), case_sensitive=False))
@click.option("--tp", type=vocab.Count(1, max=vocab.MAX_RANKS), default=8, show_default=True)
@click.option("--topology", type=click.Choice(sorted(engines_kinds())), default=None,
              help="Machine kind: what the comm(n) cost model assumes with --layers (default "
                   "pcie-shm), and what decides the engine's allreduce path with --engine.")
@click.option("--profile", "profile_path", default=None, type=envcheck.PROFILE,
              help="NCCL profile the timings were measured under (comm(n) with --layers; named in "
                   "the validate command).")
@click.option("--measured-tok-s", multiple=True,
              help="Measured tok/s X@K (K = 0: plain decoding); repeatable. Each is predicted from "
                   "the other inputs and disagreements are reported.")
@click.option("--fit", is_flag=True,
              help="Fit the free parameters to --measured-tok-s: the acceptance when none is given, "
                   "else the verify curve; with no timings, the cycle's growth with k.")
@click.option("--rel-error", type=vocab.Finite(0, max=0.5), default=0.05, show_default=True,
              help="Stated relative error of a predicted tok/s: candidates lie within it of the best "
                   "(unless inputs carry +-H intervals: then candidates are the k whose interval "
                   "reaches the best's).")
@click.option("--tolerance", type=vocab.Finite(0, max=0.5), default=0.05, show_default=True,
              help="Relative disagreement beyond which a measured tok/s is reported.")
@click.option("--batch", "batch_text", default="1", show_default=True,
              help="Batch sizes to plan, e.g. 1,8,32 (tokens per verify = batch x (k+1)).")
@click.option("--extrapolate", is_flag=True,
              help="Extend measured verify points linearly beyond their token counts (rows marked *).")
@click.option("--engine", type=click.Choice(["sglang", "vllm", "none"]), default="none",
              show_default=True, help="Serving engine: say whether its allreduces bypass NCCL "
                                      "(decided with --topology and --tp).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def spec_plan(decode_ms, verify_ms, draft_ms, steps, other_ms, verify_model, moe_experts, moe_topk,
              layers, hidden, dtype, tp, topology, profile_path, measured_tok_s, fit, rel_error,
              tolerance, batch_text, extrapolate, engine, as_json, **acceptance):
    """Plan the speculative draft step count from decode/draft/verify timings and acceptance.

    tau(k) = 1 + sum of per-position acceptance (bonus token included); cycle = k x draft
    + verify(k+1) + other; tok/s = 1000 x tau / cycle. Plain decoding (k = 0) is priced by
    its own decode time. The answer is the best k and the candidates within the
    uncertainty; the measured sweep (the validate command printed) decides.
    """
    from nccl_tune.spec.planner import PlanError, PlanRequest, plan

    accept_in = parse_acceptance(acceptance)
    step_list = usage(so.parse_steps, steps, "--steps")
    batches = usage(so.parse_steps, batch_text, "--batch", noun="batch size",
                    maximum=4096)
    points, flat = usage(so.verify_points, verify_ms) if verify_ms else ([], False)
    halves = {"verify": usage(so.verify_halves, verify_ms) if verify_ms else {}}
    decode_ms, halves["decode_ms"] = usage(so.scalar, decode_ms, "--decode-ms", 0.0, True)
    draft_ms, halves["draft_ms"] = usage(so.scalar, draft_ms, "--draft-ms")
    other_ms, halves["other_ms"] = usage(so.scalar, other_ms, "--other-ms")
    measured = [usage(so.value_at, t, "--measured-tok-s", "86.7@5", 0) for t in measured_tok_s]
    if any(not x > 0 for x, _ in measured):
        raise click.UsageError("--measured-tok-s: tok/s must be positive")
    if (moe_experts is None) != (moe_topk is None):
        raise click.UsageError("--moe-experts and --moe-topk go together")
    if moe_experts is not None and moe_topk > moe_experts:
        raise click.UsageError("--moe-topk cannot exceed --moe-experts")
    env, comm, comm_note = None, None, None
    if profile_path:
        from nccl_tune.live.profile import load_profile, resolve_profile

        env = dict(load_profile(str(resolve_profile(profile_path))).env)
    if layers:
        from nccl_tune.spec import verify as spec_verify

        comm, comm_note = usage(spec_verify.modelled_comm, layers, hidden, dtype, tp,
                                 topology or "pcie-shm", env)
    req = PlanRequest(step_list, accept_in, decode_ms, points, flat, draft_ms, other_ms,
                      verify_model, moe_experts, moe_topk, comm, comm_note, extrapolate,
                      [(k, x) for x, k in measured], fit, rel_error, tolerance, batches,
                      profile_path, halves)
    try:
        result = plan(req)
    except PlanError as exc:
        raise click.UsageError(str(exc)) from None
    engine_notes = _engine_notes(engine, topology, tp, step_list, hidden, dtype)
    if as_json:
        from nccl_tune.cli import emit_json

        out = result.to_dict()
        out["engine_notes"] = engine_notes
        emit_json(out)
        return
    click.echo(render(result))
    for line in engine_notes:
        click.echo(f"note: {line}")


def _row(p, plain, best, cands):
    mark = ", ".join(x for x in ("best" if p is best else "", "candidate" if p.k in cands else "",
                                 "extrapolated" if p.extrapolated else "") if x)
    fmt = (lambda v: "-" if v is None else f"{v:.3f}")
    star = "*" if p.extrapolated else ""
    return ["0 (plain)" if p.k == 0 else p.k, f"{p.tau:.3f}", fmt(p.draft_ms),
            fmt(p.verify_ms) + (star if p.verify_ms is not None else ""),
            f"{p.cycle_ms:.3f}" + (star if p.verify_ms is None else ""),
            f"{p.tok_s:.1f}", f"{p.tok_s / plain.tok_s:.2f}x", mark]


def render(result) -> str:
    """spec-plan's text output."""
    lines = [f"plain decoding: {result.verify_model['plain_decoding']}",
             f"acceptance: {result.acceptance.description}",
             f"verify: {result.verify_model['description']}"]
    for batch in result.batches:
        plain = batch.plans[0]
        if len(result.batches) > 1:
            lines.append(f"\nbatch {batch.batch} (tokens per verify = {batch.batch} x (k+1); tok/s "
                         "per sequence)")
        rows = [_row(p, plain, batch.best, batch.candidates) for p in batch.plans]
        lines.append(tabulate(rows, headers=["k", "tau", "draft ms", "verify ms", "cycle ms",
                                             "tok/s", "vs plain", "note"],
                              tablefmt="simple", disable_numparse=True))
        if batch.left_out:
            lines.append("steps left out (verify time beyond the measured token counts; "
                         "--extrapolate or a verify model): " + ", ".join(map(str, batch.left_out)))
        extrap = [p for p in batch.plans if p.extrapolated]
        if extrap and result.verify_model["kind"] == "cycle-fit":
            lines.append("EXTRAPOLATED (rows marked *): the fitted cycle time at k = "
                         + ", ".join(str(p.k) for p in extrap) + ", outside the measured step counts")
        elif extrap:
            lines.append(f"EXTRAPOLATED (rows marked *; verify {result.verify_model['kind']}): verify "
                         "time at " + ", ".join(f"{batch.batch * (p.k + 1)} tokens (k = {p.k})"
                                                for p in extrap) + " beyond the verify points")
        best = batch.best
        lines.append(f"best: k = {best.k} draft steps, {best.tok_s:.1f} tok/s "
                     f"({best.tok_s / plain.tok_s:.2f}x plain decoding)"
                     + (" - its row is EXTRAPOLATED (*): beyond the verify points" if best.extrapolated
                        else ""))
        how = ("their tok/s intervals (from the inputs' +-H) reach the best's"
               if batch.intervals else f"within {100 * result.rel_error:g}% of the best")
        lines.append(f"candidates ({how}): "
                     f"{', '.join(map(str, batch.candidates))}; the measured sweep decides: "
                     f"{batch.validate}")
    conv = result.to_dict()["conventions"]
    lines.append(f"at k = {conv['k']}: accept length {conv['accept_len']:.3f} (bonus included; "
                 f"accepted drafts {conv['accepted_drafts']:.3f}); SGLang accept rate "
                 f"{conv['sglang_accept_rate']:.3f} as (L-1)/k, {conv['sglang_accept_rate_total']:.3f} "
                 f"as L/(k+1); vLLM draft acceptance rate {conv['vllm_draft_acceptance_rate']:.3f}")
    for row in result.consistency:
        lines.append(_consistency_line(row))
    for note in result.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _consistency_line(row: dict) -> str:
    pred = row.get("predicted")
    head = (f"{'agrees' if row['agrees'] else 'DISAGREES' if row['agrees'] is False else 'unchecked'}: "
            f"{row['input']}" + (f" (predicted {pred:.3f})" if isinstance(pred, float) else ""))
    parts = [head]
    for need in row.get("would_have_to", []):
        text = (f"{need['input']} would have to be {need['value']:.3f}, not {need['given']:.3f}"
                + (f" ({need['from']})" if need.get("from") else ""))
        if need.get("agrees_with"):
            text += "; " + ", ".join(need["agrees_with"]) + " agrees with that"
        parts.append(text)
    if row.get("note"):
        parts.append(row["note"])
    return "; ".join(parts)
