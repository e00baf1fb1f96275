"""The built-in TP speculative decode loop: in-process logic and torchrun at world 2 (gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from integration import spec_loop
from integration.tp_model import Arithmetic, Collective, ModelShape, build_models, round_to_grid
from tests.conftest import REPO_ROOT, subprocess_env

TINY = ["--layers", "2", "--hidden", "32", "--heads", "2", "--vocab", "64", "--prompt-len", "6", "--warmup-tokens", "2"]


def _torchrun(*args: str, timeout: float = 120) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "integration.spec_loop",
        *TINY,
        *args,
        "--json",
    ]
    # A session of its own, so a hang is ended with every rank, not just torchrun.
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout  # one JSON object, printed by rank 0 only
    return json.loads(lines[0])


def _models(world_noise=0.0, draft_layers=2, dtype=torch.float64):
    shape = ModelShape(layers=2, hidden=32, heads=2, vocab=64, ffn=128)
    collective = Collective()
    target, draft = build_models(
        shape,
        draft_layers,
        world_noise,
        seed=3,
        rank=0,
        world=1,
        dtype=dtype,
        device=torch.device("cpu"),
        collective=collective,
        residual_scale=0.25,
    )
    return target, draft, collective


def test_rounding_grid_is_exact_and_bounded():
    x = torch.tensor([0.1, -40.0, 3.14159, 1e-9], dtype=torch.float64)
    y = round_to_grid(x, 10, 32.0)
    assert torch.all(y * 1024 == torch.round(y * 1024))
    assert y.abs().max() <= 32.0
    assert round_to_grid(y, 10, 32.0).equal(y)  # idempotent


def test_verify_logits_equal_one_at_a_time_logits_bit_for_bit():
    """The reason speculative output equals greedy output: a token's logits do not depend
    on how many tokens share its forward (exact arithmetic in float64)."""
    target, _, _ = _models()
    tokens = [5, 17, 33, 2, 60, 9, 41]
    batched_cache, single_cache = target.new_cache(16), target.new_cache(16)
    batched = target.forward(tokens[:3], batched_cache)
    batched = torch.cat([batched, target.forward(tokens[3:], batched_cache)])
    single = torch.cat([target.forward([t], single_cache) for t in tokens])
    assert torch.equal(batched, single)


def test_generate_in_process_matches_greedy_and_counts_allreduces():
    target, draft, collective = _models(world_noise=0.5, draft_layers=1)
    prompt = [1, 2, 3, 4]
    plain = spec_loop.generate(target, draft, prompt, 0, 40, collective)
    spec = spec_loop.generate(target, draft, prompt, 3, 40, collective)
    assert spec.tokens == plain.tokens and len(spec.tokens) == 40
    assert all(1 <= a <= 4 for a in spec.accepted)
    # 2 x 2 + 1 per target forward, 2 x 1 + 1 per draft forward, 3 draft forwards a cycle
    assert set(spec.allreduces_per_cycle) == {5 + 3 * 3}
    assert set(plain.allreduces_per_cycle) == {5}
    assert plain.accepted == [1] * plain.cycles


def test_rollback_when_every_draft_is_accepted():
    """A draft identical to the target accepts all k tokens each cycle, so the next draft
    forward must carry two unseen tokens (the last draft and the bonus)."""
    target, draft, collective = _models(world_noise=0.0, draft_layers=2)
    prompt = [7, 8, 9]
    spec = spec_loop.generate(target, draft, prompt, 4, 31, collective)
    plain = spec_loop.generate(target, draft, prompt, 0, 31, collective)
    assert spec.accepted == [5] * spec.cycles
    assert spec.tokens == plain.tokens


def test_bad_sizes_are_refused_in_one_line():
    with pytest.raises(ValueError, match="multiple of the world size"):
        ModelShape(2, 36, 3, 64, 128).check(2)
    with pytest.raises(ValueError, match="not a multiple of heads"):
        ModelShape(2, 30, 4, 64, 128).check(1)
    proc = subprocess.run(
        [sys.executable, "-m", "integration.spec_loop", "--hidden", "30", "--heads", "4"],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["spec_loop: hidden 30 is not a multiple of heads 4"]


def test_non_exact_dtype_runs_and_says_so():
    target, draft, collective = _models(dtype=torch.float32)
    assert not Arithmetic(torch.float32).exact
    out = spec_loop.generate(target, draft, [1, 2], 2, 8, collective)
    assert len(out.tokens) == 8


@pytest.mark.slow
def test_world2_speculative_equals_greedy_with_consistent_timing():
    r = _torchrun(
        "--steps",
        "3",
        "--draft-noise",
        "0.5",
        "--draft-layers",
        "1",
        "--new-tokens",
        "24",
        "--runs",
        "2",
        "--check-greedy",
    )
    assert r["backend"] == "gloo" and r["world_size"] == 2 and r["exact"] is True
    assert r["matches_greedy"] is True and r["ranks_agree"] is True
    assert len(r["tokens"]) == 24 and r["tokens_valid"] is True
    # allreduces per step as designed: 2 per layer + 1 (embedding) per forward
    ar = r["allreduces"]
    assert ar["per_target_forward"] == 5 and ar["per_draft_forward"] == 3
    assert ar["per_cycle"] == 5 + 3 * 3 and ar["per_cycle_counted"] == ar["per_cycle"]
    assert ar["bytes_per_decode"] == 32 * 8 and ar["bytes_per_verify"] == 4 * 32 * 8
    # each share is its own phase's (a swapped or stale share fails), every phase took
    # time, and the phases are disjoint parts of the cycle: together no longer than it
    # (a bound, not a wall-clock tolerance: loop overhead on a loaded machine is free)
    parts = r["draft_ms"] + r["verify_ms"] + r["other_ms"]
    assert r["shares"] == pytest.approx(
        {"draft": r["draft_ms"] / parts, "verify": r["verify_ms"] / parts, "other": r["other_ms"] / parts}
    )
    assert r["draft_ms"] > 0 and r["verify_ms"] > 0 and r["other_ms"] > 0
    assert parts <= r["step_ms"] * (1 + 1e-9)
    assert 1.0 <= r["accept_len"] <= 4.0
    assert len(r["runs_tok_s"]) == 2 and r["tok_s"] > 0
    for key in (
        "backend",
        "world_size",
        "layers",
        "hidden",
        "heads",
        "vocab",
        "dtype",
        "steps",
        "draft_layers",
        "draft_noise",
        "new_tokens",
        "cycles",
        "accept_len",
        "tok_s",
        "draft_ms",
        "verify_ms",
        "other_ms",
        "step_ms",
    ):
        assert key in r
    # every rank's stamps split the collectives' time (integration.commtime)
    split = r["comm_split"]
    assert r["comm_split_note"] is None
    # every collective is stamped: the allreduces and rank 0's acceptance broadcast
    assert ar["decision_broadcasts_per_cycle"] == 1
    assert ar["collectives_per_cycle_counted"] == ar["per_cycle_counted"] + 1
    assert split["calls_per_cycle"] == pytest.approx(ar["collectives_per_cycle_counted"])
    assert 0 < split["collective_ms"] < r["step_ms"]
    # inside a call a rank pays the collective plus its wait for the last to arrive
    assert split["in_collective_ms"] > 0 and abs(split["straggler_ms"]) < r["step_ms"]


@pytest.mark.slow
def test_world2_acceptance_falls_as_draft_noise_rises():
    out = _torchrun("--steps", "3", "--draft-layers", "2", "--new-tokens", "40", "--sweep-noise", "0,0.3,1.5")
    by_noise = {rec["draft_noise"]: rec for rec in out["sweep"]}
    accept = [by_noise[n]["accept_len"] for n in (0.0, 0.3, 1.5)]
    assert accept[0] == 4.0  # an exact copy of the target: every draft accepted
    assert accept[0] > accept[1] > accept[2]
    tokens = {tuple(rec["tokens"]) for rec in out["sweep"]}
    assert len(tokens) == 1  # the draft changes the speed, never the output


@pytest.mark.slow
def test_world2_skip_allreduce_marks_tokens_invalid():
    r = _torchrun("--steps", "0", "--new-tokens", "8", "--skip-allreduce")
    assert r["skip_allreduce"] is True and r["tokens_valid"] is False
    assert r["matches_greedy"] is None
    assert r["allreduces"]["per_cycle_counted"] == 5  # counted, though not run


@pytest.mark.slow
def test_world2_skip_allreduce_keeps_the_ranks_in_step():
    # Speculative and compute only: with their own shards the ranks' unsummed outputs
    # would differ and they would accept different drafts; every rank holds rank 0's.
    r = _torchrun("--steps", "3", "--draft-layers", "1", "--new-tokens", "16", "--skip-allreduce")
    assert r["ranks_agree"] is True and r["tokens_valid"] is False
    est = r["comm_split"]
    assert set(est) == {"straggler_ms", "calls_per_cycle"} and est["straggler_ms"] >= 0
    assert est["calls_per_cycle"] == pytest.approx(r["allreduces"]["collectives_per_cycle_counted"])


def test_acceptance_decision_round_trips_and_rejects_corrupt_values():
    values = spec_loop.decision_values(1, [42, 7], steps=3)
    assert values == [1, 42, 7, -1, -1] and len(values) == 3 + 2  # one length on every rank
    assert spec_loop.decision_from(values, 3) == (1, [42, 7])
    assert spec_loop.decision_from(spec_loop.decision_values(0, [9], 0), 0) == (0, [9])
    for bad in ([4, 1, 2, 3, 4], [1, 42, -1, -1, -1], [1, 2]):
        with pytest.raises(ValueError, match="acceptance decision"):
            spec_loop.decision_from(bad, 3)


def test_acceptance_report_names_the_ranks_that_disagreed():
    assert spec_loop.acceptance_report([0, 0])["message"] is None
    report = spec_loop.acceptance_report([0, 5, 0, 1])
    assert report["disagreed_cycles"] == [0, 5, 0, 1]
    assert "rank(s) 1 (5 cycles), 3 (1 cycle) decided differently" in report["message"]


@pytest.mark.slow
def test_world2_perturbed_rank_follows_rank_0s_decisions_without_hanging():
    """Rank 1's target choices are made wrong every other cycle (SPEC_LOOP_FAULT): alone it
    would accept other drafts, run other cycle counts and hang; with rank 0's decision
    broadcast each cycle both ranks stay in step and the disagreement is named."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "integration.spec_loop",
        *TINY,
        "--steps",
        "3",
        "--draft-layers",
        "2",
        "--new-tokens",
        "24",
        "--check-greedy",
        "--json",
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(OMP_NUM_THREADS="1", SPEC_LOOP_FAULT="1:perturb"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    r = json.loads(line)
    assert r["ranks_agree"] is True and r["matches_greedy"] is True  # rank 0's tokens ran
    disagreed = r["acceptance"]["disagreed_cycles"]
    assert disagreed[0] == 0 and disagreed[1] > 0
    assert "rank(s) 1 (" in r["acceptance"]["message"]
    assert r["allreduces"]["decision_broadcasts_per_cycle"] == 1
