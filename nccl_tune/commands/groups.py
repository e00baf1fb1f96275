"""Option groups shared by spec-plan, recommend and validate, each defined once.

Each group is a click decorator that adds its options and hands the command one small
frozen dataclass instead of a dozen loose arguments (defined in the library, where the
requests that carry them are: nccl_tune.spec.options, nccl_tune.model.per_token):

    @speculative_options()          -> spec: SpecInputs (acceptance forms and timings)
    @workload_options(...)          -> workload: Workload (layers, hidden, dtype, tp, batch)

Parsing errors are one click.UsageError line naming the option (exit code 2).
"""

from __future__ import annotations

import functools

import click

from nccl_tune import vocab
from nccl_tune.model.per_token import DTYPE_BYTES, Workload
from nccl_tune.spec import accept as sa
from nccl_tune.spec import options as so
from nccl_tune.spec.options import SpecInputs

ACCEPT_LEN_HELP = (
    "Accept length L@K counting the bonus token (SGLang's `accept len`, vLLM's mean "
    "acceptance length) at K draft steps; repeatable, one per K."
)
DRAFTS_HELP = (
    "Accepted drafts per cycle A@K, bonus token NOT counted (a per-cycle profiler's "
    "count; accept length = A + 1); repeatable."
)
SGLANG_RATE_HELP = (
    "SGLang's `accept rate` R@K (topk 1); repeatable. Its meaning changed in "
    "python/sglang/srt/managers/scheduler_metrics_mixin.py (log_decode_stats): "
    "L/(k+1) from sgl-project/sglang PR #11572 (2025-10-13), (L-1)/k from PR "
    "#23530 (2026-04-23). With --accept-len at the same K the convention is "
    "inferred from the pair."
)
SGLANG_CONVENTION_HELP = (
    "How to read --sglang-accept-rate: auto = infer from an --accept-len at "
    "the same K (refused without one); drafts = (L-1)/k (releases after PR "
    "#23530); total = L/(k+1) (PR #11572 until #23530)."
)
VLLM_RATE_HELP = "vLLM's draft acceptance rate R@K (accepted / drafted); accept length = 1 + R x K; repeatable."
PER_POS_HELP = (
    "Per-position acceptance p1,p2,... (vLLM's spec_decode_num_accepted_tokens_per_pos "
    "/ spec_decode_num_drafts): position-dependent tau."
)
DECODE_HELP = (
    "Plain decoding's own time per step (ms), without speculation: D or D+-H at batch "
    "1, or D1,D2,...@B1,B2,... at batch sizes B (two or more fit the saturation point). "
    "Needed only to decide whether plain decoding wins."
)
VERIFY_HELP = (
    "Verify forward time: V (flat: the same at every token count) or V1,V2,...@T1,T2,... "
    "at T tokens per forward (k+1 at batch 1). Measured points are interpolated; step "
    "counts beyond them are left out unless --extrapolate or a verify model "
    "(--moe-experts, --verify-model dense) extends them, marked *."
)
OTHER_HELP = (
    "Per speculative cycle time outside draft and verify (draft re-extend, tree, "
    "acceptance); not charged to plain decoding. T or T+-H."
)
ACCEPTANCE_KEYS = (
    "accept_len",
    "accepted_drafts",
    "accept_rate",
    "accept_per_pos",
    "sglang_accept_rate",
    "vllm_acceptance_rate",
    "sglang_rate_convention",
)
TIMING_KEYS = ("decode_ms", "verify_ms", "draft_ms", "other_ms")
WORKLOAD_KEYS = ("layers", "hidden", "dtype", "tp", "batch")


def usage(fn, *args, **kwargs):
    """fn(...) with ValueError turned into one click.UsageError line."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _stack(command, options):
    for option in reversed(options):
        command = option(command)
    return command


def acceptance_options(command):
    """The acceptance options (every form engines and profilers print)."""
    return _stack(
        command,
        [
            click.option("--accept-len", multiple=True, help=ACCEPT_LEN_HELP),
            click.option("--accepted-drafts", multiple=True, help=DRAFTS_HELP),
            click.option(
                "--accept-rate",
                type=vocab.Finite(0, max=1),
                help="iid per-token draft acceptance probability (none of the engines' averages).",
            ),
            click.option("--accept-per-pos", help=PER_POS_HELP),
            click.option("--sglang-accept-rate", multiple=True, help=SGLANG_RATE_HELP),
            click.option(
                "--sglang-rate-convention",
                type=click.Choice([sa.SGLANG_RATE_AUTO, *sa.SGLANG_CONVENTION_WORDS]),
                default=sa.SGLANG_RATE_AUTO,
                show_default=True,
                help=SGLANG_CONVENTION_HELP,
            ),
            click.option("--vllm-acceptance-rate", multiple=True, help=VLLM_RATE_HELP),
        ],
    )


def parse_acceptance(kwargs: dict) -> so.AcceptanceInput:
    """The acceptance options (popped from a command's kwargs); UsageError naming one."""
    values = {key: kwargs.pop(key) for key in ACCEPTANCE_KEYS}
    return usage(
        so.parse_acceptance,
        values["accept_len"],
        values["accepted_drafts"],
        values["accept_rate"],
        values["accept_per_pos"],
        values["sglang_accept_rate"],
        values["vllm_acceptance_rate"],
        values["sglang_rate_convention"],
    )


def speculative_options(command):
    """Acceptance forms and timings (decode, verify, draft, other ms) -> `spec: SpecInputs`."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        acceptance = parse_acceptance(kwargs)
        times = [kwargs.pop(key) for key in TIMING_KEYS]
        kwargs["spec"] = SpecInputs(acceptance, usage(so.parse_timings, *times))
        return command(*args, **kwargs)

    return _stack(
        acceptance_options(run),
        [
            click.option("--decode-ms", help=DECODE_HELP),
            click.option("--verify-ms", help=VERIFY_HELP),
            click.option("--draft-ms", help="Time of one draft step (ms); T or T+-H."),
            click.option("--other-ms", default="0", show_default=True, help=OTHER_HELP),
        ],
    )


def workload_options(
    names: tuple[str, ...] = WORKLOAD_KEYS,
    *,
    layers_required: bool = False,
    hidden_default: int | None = 7168,
    tp_default: int | None = None,
    batch_list: bool = True,
    layers_help: str = "Transformer layers of the target.",
):
    """The workload options in `names` -> `workload: Workload` (absent ones keep defaults).

    `batch_list`: --batch takes a list of batch sizes (spec-plan) instead of one (recommend)."""
    options = {
        "layers": click.option(
            "--layers", type=vocab.Count(1, max=vocab.MAX_LAYERS), required=layers_required, help=layers_help
        ),
        "hidden": click.option(
            "--hidden",
            type=vocab.Count(1, max=vocab.MAX_HIDDEN),
            default=hidden_default,
            show_default=hidden_default is not None,
            help="Hidden size of the target (allreduce bytes per token / dtype).",
        ),
        "dtype": click.option(
            "--dtype",
            default="bf16",
            show_default=True,
            type=click.Choice(list(DTYPE_BYTES), case_sensitive=False),
            help="Activation dtype of the allreduce.",
        ),
        "tp": click.option(
            "--tp",
            type=vocab.Count(1, max=vocab.MAX_RANKS),
            default=tp_default,
            show_default=tp_default is not None,
            help="Tensor-parallel world size.",
        ),
        "batch": (
            click.option(
                "--batch",
                default="1",
                show_default=True,
                help="Batch sizes to plan, e.g. 1,8,32 (tokens per verify = batch x (k+1)).",
            )
            if batch_list
            else click.option(
                "--batch",
                type=vocab.Count(1, max=vocab.MAX_TOKENS),
                default=1,
                show_default=True,
                help="Sequences decoded together (tokens per decode forward).",
            )
        ),
    }

    def decorate(command):
        @functools.wraps(command)
        def run(*args, **kwargs):
            given = {key: kwargs.pop(key) for key in names}
            batch = given.pop("batch", None)
            if batch is None:
                batches = (1,)
            elif batch_list:
                batches = tuple(usage(so.parse_steps, batch, "--batch", noun="batch size", maximum=4096))
            else:
                batches = (batch,)
            kwargs["workload"] = Workload(batches=batches, **{"hidden": hidden_default, **given})
            return command(*args, **kwargs)

        return _stack(run, [options[name] for name in names])

    return decorate
