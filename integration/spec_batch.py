"""The built-in speculative decode loop at batch sizes > 1: `torchrun -m integration.spec_batch`.

B sequences (prompts drawn from seeds) decode together as a serving engine batches them:
each draft step is one draft forward of every sequence's next token, each verify one
target forward of B x (k + 1) tokens (integration.tp_model.TPTransformer.forward_many:
the GEMMs and allreduces on all tokens at once, attention per sequence), and every
sequence accepts its own prefix plus its bonus token (greedy, as integration.spec_loop;
rank 0's decisions are shared so the ranks stay in step). The batch stays full until
every sequence has its tokens. Per (batch, k): tok/s per sequence (tokens / B / decode
time) per run, the mean cycle's draft / verify / other ms (and each run's), the mean step
of plain decoding (k = 0), accept length and per-position acceptance over all sequences'
cycles.

    torchrun --nproc-per-node 2 -m integration.spec_batch --batches 1,4,8 --sweep-steps 0,1,2,3,4 --json

Runs are interleaved in rounds over all (batch, k), so drift in a shared machine's load
hits every configuration alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from integration.spec_loop import _setup, decision_from, decision_values
from integration.tp_model import DTYPES, Collective, ModelShape, build_models


@dataclass
class BatchRun:
    """One generation of a batch: per-cycle timings (s) and accept lengths per sequence."""

    produced: int = 0
    decode_s: float = 0.0
    cycles: int = 0
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    other_s: list[float] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # per sequence per cycle, bonus included
    tokens: list[list[int]] = field(default_factory=list)  # each sequence's first new tokens


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """One prompt per sequence, drawn from seed + i (the same on every rank)."""
    out = []
    for i in range(batch):
        gen = torch.Generator().manual_seed(seed + 7919 + 104729 * i)
        out.append(torch.randint(0, vocab, (length,), generator=gen).tolist())
    return out


def _last_argmax(logits: list[torch.Tensor]) -> list[int]:
    return torch.stack([x[-1] for x in logits]).argmax(dim=-1).tolist()


def generate_batch(
    target, draft, batch_prompts: list[list[int]], steps: int, new_tokens: int, collective: Collective, share: bool
) -> BatchRun:
    """Greedy speculative (steps > 0) or plain decoding of a batch until every sequence
    has `new_tokens` tokens (see the module doc)."""
    b = len(batch_prompts)
    # the batch runs until its slowest sequence has new_tokens: a sequence that accepts
    # every draft meanwhile grows by up to steps + 1 tokens a cycle
    max_len = max(len(p) for p in batch_prompts) + (steps + 1) * (new_tokens + 1) + 4
    tcaches = [target.new_cache(max_len) for _ in range(b)]
    dcaches = [draft.new_cache(max_len) for _ in range(b)]
    seqs = [list(p) for p in batch_prompts]
    first = _last_argmax(target.forward_many([list(p) for p in batch_prompts], tcaches))
    for seq, token in zip(seqs, first):
        seq.append(token)
    if steps:
        draft.forward_many([list(p) for p in batch_prompts], dcaches)
    pending = [[seq[-1]] for seq in seqs]
    start_len = [len(p) for p in batch_prompts]
    run = BatchRun()
    start = time.perf_counter()
    while min(len(s) - n for s, n in zip(seqs, start_len)) < new_tokens:
        t0 = time.perf_counter()
        proposals: list[list[int]] = [[] for _ in range(b)]
        inputs = pending
        for _ in range(steps):
            picks = _last_argmax(draft.forward_many(inputs, dcaches))
            for props, pick in zip(proposals, picks):
                props.append(pick)
            inputs = [[pick] for pick in picks]
        t1 = time.perf_counter() if steps else t0
        tlens = [c.length for c in tcaches]
        verified = target.forward_many([[seq[-1]] + props for seq, props in zip(seqs, proposals)], tcaches)
        choices = [x.argmax(dim=-1).tolist() for x in verified]
        t2 = time.perf_counter()
        decisions = []
        for props, chosen in zip(proposals, choices):
            accepted = 0
            while accepted < steps and props[accepted] == chosen[accepted]:
                accepted += 1
            decisions.append((accepted, props[:accepted] + [chosen[accepted]]))
        if share:  # rank 0's decisions for every sequence, one broadcast
            flat = [v for a, new in decisions for v in decision_values(a, new, steps)]
            flat = collective.share(flat)
            width = steps + 2
            decisions = [decision_from(flat[i * width : (i + 1) * width], steps) for i in range(b)]
        for i, (accepted, new) in enumerate(decisions):
            seqs[i].extend(new)
            tcaches[i].length = tlens[i] + accepted + 1
            if steps:
                dcaches[i].length = min(dcaches[i].length, tlens[i] + accepted + 1)
                pending[i] = seqs[i][dcaches[i].length :]
            else:
                pending[i] = [seqs[i][-1]]
            run.accepted.append(len(new))
        t3 = time.perf_counter()
        run.draft_s.append(t1 - t0)
        run.verify_s.append(t2 - t1)
        run.other_s.append(t3 - t2)
        run.cycles += 1
    run.decode_s = time.perf_counter() - start
    run.produced = sum(len(s) - n - 1 for s, n in zip(seqs, start_len))
    run.tokens = [s[n : n + new_tokens] for s, n in zip(seqs, start_len)]
    return run


def summarize(batch: int, steps: int, runs: list[BatchRun]) -> dict:
    """The record of one (batch, k): tok/s per run and its median; the mean cycle's draft,
    verify, other and whole time (ms), overall and per run; accept length and per-position
    acceptance over all sequences' cycles."""

    def ms(values):  # the mean cycle: tok/s per run is tokens over the summed cycles
        return 1000.0 * statistics.fmean(values) if values else None

    accepted = [a for r in runs for a in r.accepted]
    cycle_s = [d + v + o for r in runs for d, v, o in zip(r.draft_s, r.verify_s, r.other_s)]
    per_seq = [r.produced / batch / r.decode_s for r in runs if r.decode_s > 0]
    return {
        "batch": batch,
        "steps": steps,
        "runs_tok_s": per_seq,
        "tok_s_median": statistics.median(per_seq) if per_seq else None,
        "aggregate_tok_s_median": statistics.median(x * batch for x in per_seq) if per_seq else None,
        "draft_ms": ms([x for r in runs for x in r.draft_s]),
        "verify_ms": ms([x for r in runs for x in r.verify_s]),
        "other_ms": ms([x for r in runs for x in r.other_s]),
        "step_ms": ms(cycle_s),
        # each run's mean cycle: how much the timings move from run to run
        "runs_verify_ms": [ms(r.verify_s) for r in runs],
        "runs_draft_ms": [ms(r.draft_s) for r in runs],
        "runs_other_ms": [ms(r.other_s) for r in runs],
        "runs_step_ms": [ms([d + v + o for d, v, o in zip(r.draft_s, r.verify_s, r.other_s)]) for r in runs],
        "accept_len": statistics.fmean(accepted) if accepted else None,
        "accept_per_pos": [sum(1 for a in accepted if a - 1 >= i) / len(accepted) for i in range(1, steps + 1)]
        if accepted
        else [],
    }


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="python -m integration.spec_batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--draft-noise", type=float, default=0.25)
    p.add_argument("--residual-scale", type=float, default=0.25)
    p.add_argument("--batches", default="1,4,8")
    p.add_argument("--sweep-steps", default="0,1,2,3,4")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="gloo")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        args.batches = [int(x) for x in args.batches.split(",")]
        args.sweep_steps = [int(x) for x in args.sweep_steps.split(",")]
    except ValueError:
        p.error("--batches and --sweep-steps take integers, e.g. 1,4,8")
    if min(args.batches) < 1 or min(args.sweep_steps) < 0:
        p.error("batch sizes start at 1, step counts at 0")
    return args


def main(argv=None) -> int:
    """Every rank runs this; rank 0 prints one JSON object (records by batch and k)."""
    import torch.distributed as dist

    args = parse_args(argv)
    group, rank, world, backend, device = _setup(args)
    try:
        dtype = DTYPES["float64" if device.type == "cpu" else "bfloat16"]
        shape = ModelShape(args.layers, args.hidden, args.heads, args.vocab, 4 * args.hidden)
        collective = Collective(group if world > 1 else None, device=device)
        target, draft = build_models(
            shape,
            args.draft_layers,
            args.draft_noise,
            args.seed,
            rank,
            world,
            dtype,
            device,
            collective,
            residual_scale=args.residual_scale,
        )
        configs = [(b, k) for b in args.batches for k in args.sweep_steps]
        runs: dict[tuple[int, int], list[BatchRun]] = {c: [] for c in configs}
        with torch.inference_mode():
            for b, k in configs:
                generate_batch(
                    target,
                    draft,
                    prompts(b, args.prompt_len, args.vocab, args.seed),
                    k,
                    args.warmup_tokens,
                    collective,
                    world > 1,
                )
            for _ in range(args.runs):
                for b, k in configs:
                    runs[(b, k)].append(
                        generate_batch(
                            target,
                            draft,
                            prompts(b, args.prompt_len, args.vocab, args.seed),
                            k,
                            args.new_tokens,
                            collective,
                            world > 1,
                        )
                    )
        if rank == 0:
            records = [summarize(b, k, runs[(b, k)]) for b, k in configs]
            out = {
                "backend": backend,
                "world_size": world,
                "layers": args.layers,
                "hidden": args.hidden,
                "heads": args.heads,
                "vocab": args.vocab,
                "draft_layers": args.draft_layers,
                "draft_noise": args.draft_noise,
                "new_tokens": args.new_tokens,
                "runs": args.runs,
                "records": records,
            }
            print(json.dumps(out) if args.json else out, flush=True)
        return 0
    finally:
        if group is not None:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
