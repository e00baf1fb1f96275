"""Built-in tensor-parallel speculative decode loop: `torchrun -m integration.spec_loop`.

Greedy speculative decoding on the model of `integration.tp_model`: the draft proposes
k tokens one forward at a time, the target verifies k+1 positions in one forward, the
longest prefix where the draft matched the target's own choice is accepted plus the
target's next token (the bonus token), and both KV caches roll back to what was
accepted. `--steps 0` is plain decoding (one target forward per token).

Every cycle is timed like a serving profiler would: draft ms, verify ms and other ms
(acceptance and bookkeeping), their shares of the cycle, the accept length (bonus token
included, so plain decoding is 1.0), tok/s, and the number and size of the allreduces a
forward runs, so the per-token model can predict the time NCCL settings save.

    torchrun --nproc-per-node 2 -m integration.spec_loop --steps 2 --json

NCCL on CUDA GPUs, gloo on CPU. In float64 (the CPU default) the arithmetic is exact
(see tp_model), so speculative output equals plain greedy output bit for bit;
`--check-greedy` runs plain decoding as well and reports `matches_greedy`.
`--skip-allreduce` replaces every allreduce with a no-op to time compute alone; every
rank then holds rank 0's shards, so the ranks still take the same decisions (their
calls line up, see integration.commtime), but the tokens are wrong and the output says
`tokens_valid: false`.

Acceptance is decided once, on rank 0, and shared: every rank computes its own decision
(how many drafts it accepts and the bonus token), then one broadcast per cycle of
steps + 2 integers gives every rank rank 0's (counted among the loop's collectives:
`allreduces.decision_broadcasts_per_cycle`). Deciding alone is safe only while allreduce
results and GEMMs are bit-identical across ranks; where they are not (bf16 on GPUs of
different kinds, a nondeterministic kernel), a rank that accepted a different number
of drafts would run a different number of cycles and collectives than the others and
hang until NCCL's timeout. With the shared decision the ranks stay in step; a rank
that disagreed is counted (`acceptance.disagreed_cycles`, per rank) and named.
Test hook: SPEC_LOOP_FAULT="RANK:perturb" makes that rank's target choices wrong every
other cycle (a stand-in for a rank whose arithmetic differs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from integration import commtime
from integration.tp_model import DTYPE_NAMES, DTYPES, Collective, ModelShape, TPTransformer, build_models


@dataclass
class LoopConfig:
    """Everything one measurement depends on."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    vocab: int = 1024
    ffn: int = 0  # 0: 4 x hidden
    dtype: str = "auto"  # auto: float64 on CPU (exact), bfloat16 on CUDA
    steps: int = 2
    draft_layers: int = 0  # 0: a quarter of the target's layers (at least 1)
    draft_noise: float = 0.0
    draft_embedding: str = "shared"  # shared | own (a noisy copy)
    residual_scale: float = 0.25  # small: a few-layer draft then agrees often
    new_tokens: int = 64
    prompt_len: int = 16
    seed: int = 0
    runs: int = 1
    warmup_tokens: int = 16
    skip_allreduce: bool = False
    check_greedy: bool = False

    def resolved(self, device: torch.device) -> LoopConfig:
        """Defaults that depend on the device or the other sizes filled in."""
        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.type == "cuda" else "float64"
        return replace(
            self,
            dtype=DTYPE_NAMES[DTYPES[dtype]],
            ffn=self.ffn or 4 * self.hidden,
            draft_layers=self.draft_layers or max(1, self.layers // 4),
        )


@dataclass
class RunStats:
    """One generation: tokens and per-cycle timings (seconds)."""

    tokens: list[int]
    produced: int  # tokens produced by decode cycles (the prefill's token excluded)
    decode_s: float
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    other_s: list[float] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # accept length per cycle (with bonus)
    allreduces_per_cycle: list[int] = field(default_factory=list)
    collectives_per_cycle: list[int] = field(default_factory=list)  # + decision broadcasts
    disagreed: int = 0  # cycles whose own decision differed from rank 0's (then rank 0's ran)
    call_range: tuple[int, int] = (0, 0)  # the decode cycles' allreduce calls, first..end-1

    @property
    def cycles(self) -> int:
        """Decode cycles run."""
        return len(self.accepted)


def prompt_tokens(config: LoopConfig) -> list[int]:
    """The fixed prompt: token ids drawn from the seed (same on every rank)."""
    gen = torch.Generator().manual_seed(config.seed + 7919)
    return torch.randint(0, config.vocab, (config.prompt_len,), generator=gen).tolist()


def _argmax(logits: torch.Tensor) -> list[int]:
    # First index among equal maxima; .tolist() also waits for the device.
    return logits.argmax(dim=-1).tolist()


def decision_values(accepted: int, new: list[int], steps: int) -> list[int]:
    """One cycle's acceptance decision as steps + 2 integers (the same length on every
    rank, as a broadcast needs): the accepted draft count, then the accepted tokens and
    the bonus token, padded with -1."""
    return [accepted] + new + [-1] * (steps + 1 - len(new))


def decision_from(values: list[int], steps: int) -> tuple[int, list[int]]:
    """(accepted, new tokens) back from `decision_values`; raises ValueError on a value
    that no rank could have sent (a corrupt broadcast must not steer the loop)."""
    accepted = values[0] if values else -1
    if len(values) != steps + 2 or not 0 <= accepted <= steps:
        raise ValueError(f"acceptance decision {values!r} is not one of {steps} drafts")
    new = values[1 : accepted + 2]
    if any(t < 0 for t in new):
        raise ValueError(f"acceptance decision {values!r} holds no token")
    return accepted, new


def generate(
    target: TPTransformer,
    draft: TPTransformer,
    prompt: list[int],
    steps: int,
    new_tokens: int,
    collective: Collective,
    share: bool = False,
    perturb: bool = False,
) -> RunStats:
    """Greedy (speculative when steps > 0) generation of at least `new_tokens` tokens.

    `share`: every cycle's acceptance decision is rank 0's (Collective.share), so ranks
    whose arithmetic differs stay in step. `perturb` (a test hook) makes this rank's
    target choices wrong every other cycle.

    Invariants: the target cache holds positions [0, tlen) and the last generated token
    sits at position tlen; the draft cache holds [0, dlen) and `pending` are the tokens
    at positions dlen..tlen that the draft has not seen yet.
    """
    max_len = len(prompt) + new_tokens + steps + 2
    tcache, dcache = target.new_cache(max_len), draft.new_cache(max_len)
    seq = list(prompt)
    seq.append(_argmax(target.forward(prompt, tcache)[-1:])[0])  # prefill
    if steps:
        draft.forward(prompt, dcache)
    pending = [seq[-1]]
    stats = RunStats(tokens=[], produced=0, decode_s=0.0)
    start = time.perf_counter()
    first_call = collective.count
    while len(seq) - len(prompt) < new_tokens:
        count0, allreduces0 = collective.count, collective.allreduces
        t0 = time.perf_counter()
        proposals: list[int] = []
        inputs = pending
        for _ in range(steps):
            proposals.append(_argmax(draft.forward(inputs, dcache)[-1:])[0])
            inputs = proposals[-1:]
        t1 = time.perf_counter() if steps else t0  # plain decoding has no draft phase
        tlen = tcache.length
        choices = _argmax(target.forward([seq[-1]] + proposals, tcache))
        t2 = time.perf_counter()
        if perturb and stats.cycles % 2 == 0:
            choices = [(c + 1) % target.shape.vocab for c in choices]
        accepted = 0
        while accepted < steps and proposals[accepted] == choices[accepted]:
            accepted += 1
        new = proposals[:accepted] + [choices[accepted]]
        if share:
            mine = (accepted, new)
            accepted, new = decision_from(collective.share(decision_values(accepted, new, steps)), steps)
            stats.disagreed += (accepted, new) != mine
        seq.extend(new)
        tcache.length = tlen + accepted + 1  # roll back the rejected positions
        if steps:
            dcache.length = min(dcache.length, tlen + accepted + 1)
            pending = seq[dcache.length :]
        t3 = time.perf_counter()
        stats.draft_s.append(t1 - t0)
        stats.verify_s.append(t2 - t1)
        stats.other_s.append(t3 - t2)
        stats.accepted.append(len(new))
        stats.allreduces_per_cycle.append(collective.allreduces - allreduces0)
        stats.collectives_per_cycle.append(collective.count - count0)
    stats.decode_s = time.perf_counter() - start
    stats.call_range = (first_call, collective.count)
    stats.produced = len(seq) - len(prompt) - 1
    stats.tokens = seq[len(prompt) : len(prompt) + new_tokens]
    return stats


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    config: LoopConfig, runs: list[RunStats], world: int, backend: str, device: torch.device, greedy: list[int] | None
) -> dict:
    """The JSON record of a measurement (means over runs and cycles)."""
    draft = [x for r in runs for x in r.draft_s]
    verify = [x for r in runs for x in r.verify_s]
    other = [x for r in runs for x in r.other_s]
    accepted = [x for r in runs for x in r.accepted]
    cycles = sum(r.cycles for r in runs)
    step_ms = 1000.0 * sum(r.decode_s for r in runs) / cycles if cycles else None
    draft_ms, verify_ms, other_ms = (1000.0 * _mean(v) if v else None for v in (draft, verify, other))
    total = (draft_ms or 0.0) + (verify_ms or 0.0) + (other_ms or 0.0)
    elem = torch.tensor([], dtype=DTYPES[config.dtype]).element_size()
    per_target, per_draft = 2 * config.layers + 1, 2 * config.draft_layers + 1
    accept_len = _mean(accepted)
    runs_tok_s = [r.produced / r.decode_s for r in runs if r.decode_s > 0]
    tokens = runs[0].tokens if runs else []
    return {
        "engine": "builtin",
        "backend": backend,
        "device": device.type,
        "world_size": world,
        "layers": config.layers,
        "hidden": config.hidden,
        "heads": config.heads,
        "vocab": config.vocab,
        "ffn": config.ffn,
        "dtype": config.dtype,
        "exact": config.dtype == "float64",
        "steps": config.steps,
        "draft_layers": config.draft_layers,
        "draft_noise": config.draft_noise,
        "draft_embedding": config.draft_embedding,
        "residual_scale": config.residual_scale,
        "seed": config.seed,
        "prompt_len": config.prompt_len,
        "new_tokens": config.new_tokens,
        "runs": len(runs),
        "cycles": runs[0].cycles if runs else 0,
        "accept_len": accept_len,
        "accept_rate": (accept_len - 1) / config.steps if config.steps and accept_len else None,
        # vLLM's per-position form: the share of cycles whose drafts 1..i were all accepted
        "accept_per_pos": (
            [sum(1 for x in accepted if x - 1 >= i) / len(accepted) for i in range(1, config.steps + 1)]
            if accepted
            else []
        ),
        "tok_s": _mean(runs_tok_s),
        "runs_tok_s": runs_tok_s,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
        "other_ms": other_ms,
        "draft_step_ms": draft_ms / config.steps if config.steps and draft_ms is not None else None,
        "shares": {
            name: (value / total if total else None)
            for name, value in (("draft", draft_ms), ("verify", verify_ms), ("other", other_ms))
        },
        "step_ms": step_ms,
        "allreduces": {
            "per_target_forward": per_target,
            "per_draft_forward": per_draft,
            "per_cycle": per_target + config.steps * per_draft,
            "per_cycle_counted": _mean([x for r in runs for x in r.allreduces_per_cycle]),
            "decision_broadcasts_per_cycle": (1 if world > 1 else 0),
            "collectives_per_cycle_counted": _mean([x for r in runs for x in r.collectives_per_cycle]),
            "bytes_per_decode": config.hidden * elem,
            "bytes_per_verify": (config.steps + 1) * config.hidden * elem,
        },
        "skip_allreduce": config.skip_allreduce,
        "tokens_valid": not config.skip_allreduce,
        "matches_greedy": None if greedy is None else greedy == tokens,
        "tokens": tokens,
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "torch_nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCH_NCCL_")},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, **_nccl_versions(backend)},
    }


def _nccl_versions(backend: str) -> dict:
    """The NCCL this process really runs (the mapped libnccl's ncclGetVersion beside
    torch's build version, microbench.nccllib); {"nccl": None} off NCCL."""
    if backend != "nccl":
        return {"nccl": None}
    from microbench import nccllib

    return nccllib.version_record(nccllib.build_version(torch), nccllib.loaded_library(), None)


def measure_many(
    configs: list[LoopConfig], group, rank: int, world: int, backend: str, device: torch.device
) -> list[dict]:
    """Build each configuration's models, warm each up, then time the runs in rounds:
    round r runs every configuration once, so drift in the machine's load hits all
    configurations alike instead of whichever ran last. One record per configuration."""
    setups = []
    stamp = world > 1 and device.type == "cpu"  # gloo on CPU: calls are synchronous on the host
    share = world > 1  # rank 0's acceptance decision on every rank (module docstring)
    perturb = fault(rank) == "perturb"
    for config in configs:
        collective = Collective(group if world > 1 else None, skip=config.skip_allreduce, stamp=stamp, device=device)
        shape = ModelShape(config.layers, config.hidden, config.heads, config.vocab, config.ffn)
        # Compute only: every rank holds rank 0's shards, so the ranks' (unsummed, wrong)
        # outputs agree, they take the same decisions and their calls line up one to one
        # as in a real run (same shapes, so the same compute).
        shard = 0 if config.skip_allreduce else rank
        target, draft = build_models(
            shape,
            config.draft_layers,
            config.draft_noise,
            config.seed,
            shard,
            world,
            DTYPES[config.dtype],
            device,
            collective,
            share_embedding=config.draft_embedding == "shared",
            residual_scale=config.residual_scale,
        )
        setups.append((config, collective, target, draft, prompt_tokens(config)))
    runs: list[list[RunStats]] = [[] for _ in setups]
    greedy: list[list[int] | None] = [None] * len(setups)
    with torch.inference_mode():
        for config, collective, target, draft, prompt in setups:
            if config.warmup_tokens:
                generate(target, draft, prompt, config.steps, config.warmup_tokens, collective, share, perturb)
        for r in range(max(c.runs for c in configs)):
            for i, (config, collective, target, draft, prompt) in enumerate(setups):
                if r < config.runs:
                    runs[i].append(
                        generate(target, draft, prompt, config.steps, config.new_tokens, collective, share, perturb)
                    )
        for i, (config, collective, target, draft, prompt) in enumerate(setups):
            if config.check_greedy and not config.skip_allreduce:
                plain = generate(target, draft, prompt, 0, config.new_tokens, collective, share, perturb)
                greedy[i] = plain.tokens
                runs[i][-1].disagreed += plain.disagreed
    records = []
    for i, (config, collective, *_rest) in enumerate(setups):
        record = summarize(config, runs[i], world, backend, device, greedy[i])
        record["comm_split"], record["comm_split_note"] = _comm_split(config, collective, runs[i], group, world, device)
        if world > 1:  # every rank must have taken the same decisions
            gathered: list = [None] * world
            disagreed = sum(r.disagreed for r in runs[i])
            dist.all_gather_object(gathered, (record["tokens"], record["nccl_env"], disagreed), group=group)
            record["ranks_agree"] = all(g[0] == gathered[0][0] for g in gathered)
            record["nccl_env_same_on_all_ranks"] = all(g[1] == gathered[0][1] for g in gathered)
            record["acceptance"] = acceptance_report([g[2] for g in gathered])
        records.append(record)
    return records


FAULT_VAR = "SPEC_LOOP_FAULT"


def fault(rank: int) -> str | None:
    """The SPEC_LOOP_FAULT kind asked of this rank ("RANK:perturb"), or None."""
    parts = os.environ.get(FAULT_VAR, "").split(":")
    return parts[1] if len(parts) == 2 and parts[0] == str(rank) else None


def acceptance_report(disagreed_by_rank: list[int]) -> dict:
    """How the ranks' own acceptance decisions compared with rank 0's, which all ran."""
    out = {"decided_by": "rank 0, broadcast every cycle", "disagreed_cycles": list(disagreed_by_rank), "message": None}
    bad = [(r, n) for r, n in enumerate(disagreed_by_rank) if n]
    if bad:
        out["message"] = (
            "rank(s) "
            + ", ".join(f"{r} ({n} cycle{'s' if n != 1 else ''})" for r, n in bad)
            + " decided differently from rank 0: their allreduce results or GEMMs are "
            "not bit-identical to rank 0's; rank 0's decisions were used, so the ranks "
            "stayed in step"
        )
    return out


def _comm_split(
    config: LoopConfig, collective: Collective, runs: list[RunStats], group, world: int, device: torch.device
) -> tuple[dict | None, str | None]:
    """Every rank's call stamps split into collective time and the wait for the slowest
    rank (or, compute only, the wait a synchronised run would have), integration.commtime,
    weighted by cycles over the runs. Collective over the group: every rank must call it.
    (None, why) where host stamps cannot tell."""
    if world < 2:
        return None, "one rank: no collective to split"
    if device.type != "cpu":
        return None, "collectives run asynchronously on the GPU: host stamps cannot time them"
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (socket.gethostname(), collective.stamps), group=group)
    if len({host for host, _ in gathered}) > 1:
        return None, "ranks on several hosts: their clocks cannot be compared"
    stamps = [s for _, s in gathered]
    split = commtime.straggler_estimate if config.skip_allreduce else commtime.synchronised_split
    total = sum(r.cycles for r in runs)
    if not total:
        return None, "no decode cycles"
    parts = [(split(stamps, *r.call_range, r.cycles), r.cycles) for r in runs if r.cycles]
    return {key: sum(p[key] * n for p, n in parts) / total for key in parts[0][0]}, None


def measure(config: LoopConfig, group, rank: int, world: int, backend: str, device: torch.device) -> dict:
    """Build the models, warm up, time `config.runs` generations, summarize."""
    return measure_many([config], group, rank, world, backend, device)[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (names match the JSON keys)."""
    d = LoopConfig()
    p = argparse.ArgumentParser(prog="python -m integration.spec_loop", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--ffn", type=int, default=d.ffn, help="MLP width (default 4 x hidden)")
    p.add_argument(
        "--dtype",
        default=d.dtype,
        choices=["auto", *DTYPES],
        help="auto: float64 on CPU (exact arithmetic), bfloat16 on CUDA",
    )
    p.add_argument("--steps", type=int, default=d.steps, help="draft steps k (0: plain decoding)")
    p.add_argument(
        "--draft-layers",
        type=int,
        default=d.draft_layers,
        help="draft = the target's first N layers (default a quarter)",
    )
    p.add_argument(
        "--draft-noise",
        type=float,
        default=d.draft_noise,
        help="relative Gaussian noise on the draft's weights (0: exact copy)",
    )
    p.add_argument("--draft-embedding", choices=["shared", "own"], default=d.draft_embedding)
    p.add_argument(
        "--residual-scale",
        type=float,
        default=d.residual_scale,
        help="scale of each layer's output projections (how much a layer changes the stream)",
    )
    p.add_argument("--new-tokens", type=int, default=d.new_tokens)
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--runs", type=int, default=d.runs, help="timed generations")
    p.add_argument("--warmup-tokens", type=int, default=d.warmup_tokens)
    p.add_argument(
        "--skip-allreduce",
        action="store_true",
        help="replace every allreduce with a no-op (compute-only time; tokens invalid)",
    )
    p.add_argument(
        "--check-greedy", action="store_true", help="also run plain greedy decoding and report matches_greedy"
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--sweep-steps", default=None, help="comma list of step counts measured in this one launch")
    p.add_argument("--sweep-noise", default=None, help="comma list of draft-noise levels measured in this one launch")
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    args = p.parse_args(argv)
    for name in ("layers", "hidden", "heads", "vocab", "new_tokens", "prompt_len", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("steps", "ffn", "draft_layers", "warmup_tokens"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    if args.draft_noise < 0:
        p.error("--draft-noise must not be negative")
    try:
        args.sweep_steps = _number_list(args.sweep_steps, int, "--sweep-steps", "integers, e.g. 0,1,2")
        args.sweep_noise = _number_list(args.sweep_noise, float, "--sweep-noise", "numbers, e.g. 0,0.5")
    except ValueError as exc:
        p.error(str(exc))
    return args


def _number_list(text: str | None, kind, option: str, example: str) -> list | None:
    """A comma list of non-negative `kind` values (None when the option is absent)."""
    if text is None:
        return None
    values = [kind(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 0:
        raise ValueError(f"{option} {text!r}: give non-negative {example}")
    return values


def config_from_args(args: argparse.Namespace) -> LoopConfig:
    """A LoopConfig from parsed options."""
    names = LoopConfig.__dataclass_fields__
    return LoopConfig(**{k: v for k, v in vars(args).items() if k in names})


def _setup(args) -> tuple[object, int, int, str, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = args.device == "cuda" or (args.device == "auto" and args.backend != "gloo" and torch.cuda.is_available())
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    group = None
    if "MASTER_ADDR" in os.environ or world > 1:
        try:  # device_id binds the NCCL communicator to this GPU eagerly (newer torch)
            dist.init_process_group(backend=backend, **({"device_id": device} if use_cuda else {}))
        except TypeError:
            dist.init_process_group(backend=backend)
        group = dist.group.WORLD
        world, rank = dist.get_world_size(), dist.get_rank()
    return group, rank, world, backend, device


def _print_text(record: dict) -> None:
    s = record["shares"]
    fmt = lambda v, spec=".3f": "-" if v is None else format(v, spec)  # noqa: E731
    print(
        f"spec_loop {record['backend']} world {record['world_size']} {record['dtype']}: "
        f"layers {record['layers']} hidden {record['hidden']} heads {record['heads']} "
        f"vocab {record['vocab']}; steps {record['steps']}, draft {record['draft_layers']} "
        f"layer{'s' if record['draft_layers'] != 1 else ''}, noise {record['draft_noise']}"
    )
    print(
        f"  tok/s {fmt(record['tok_s'], '.1f')}  accept len {fmt(record['accept_len'], '.2f')}  "
        f"cycle {fmt(record['step_ms'])} ms = draft {fmt(record['draft_ms'])} "
        f"({fmt(s['draft'], '.0%')}) + verify {fmt(record['verify_ms'])} "
        f"({fmt(s['verify'], '.0%')}) + other {fmt(record['other_ms'])} ({fmt(s['other'], '.0%')})"
    )
    a = record["allreduces"]
    print(
        f"  allreduces: {a['per_target_forward']} per target forward, {a['per_draft_forward']} "
        f"per draft forward, {a['per_cycle']} per cycle (counted {fmt(a['per_cycle_counted'], '.1f')})"
        + (
            f" + {a['decision_broadcasts_per_cycle']} acceptance broadcast"
            if a.get("decision_broadcasts_per_cycle")
            else ""
        )
        + "; "
        + f"{a['bytes_per_decode']} B per decode, {a['bytes_per_verify']} B per verify"
    )
    split = record.get("comm_split")
    if split and "collective_ms" in split:
        print(
            f"  per cycle (all ranks' host clocks): collectives {split['collective_ms']:.3f} ms "
            f"from last arrival to done, waiting for the slowest rank's compute "
            f"{split['straggler_ms']:.3f} ms; {split['in_collective_ms']:.3f} ms inside "
            f"collectives per rank"
        )
    elif split:
        print(
            f"  per cycle: ranks would wait {split['straggler_ms']:.3f} ms for the slowest "
            f"had they synchronised at each allreduce"
        )
    if not record["tokens_valid"]:
        print("  allreduces skipped: compute-only timing, tokens are not valid")
    message = (record.get("acceptance") or {}).get("message")
    if message:
        print(f"  warning: {message}")
    if record["matches_greedy"] is not None:
        print(f"  matches plain greedy decoding: {record['matches_greedy']}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: every rank runs this; rank 0 prints."""
    args = parse_args(argv)
    group, rank, world, backend, device = _setup(args)
    try:
        base = config_from_args(args).resolved(device)
        configs = [base]
        if args.sweep_steps is not None or args.sweep_noise is not None:
            configs = [
                replace(base, steps=k, draft_noise=noise)
                for noise in (args.sweep_noise or [base.draft_noise])
                for k in (args.sweep_steps or [base.steps])
            ]
        try:
            records = measure_many(configs, group, rank, world, backend, device)
        except ValueError as exc:  # a size that does not fit: one line, exit 2
            if rank == 0:
                print(f"spec_loop: {exc}", file=sys.stderr)
            return 2
        if rank == 0:
            if args.json:
                out = records[0] if len(records) == 1 else {"sweep": records}
                print(json.dumps(out), flush=True)
            else:
                for record in records:
                    _print_text(record)
        return 0
    finally:
        if group is not None:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
