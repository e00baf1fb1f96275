"""validate --schedule's pure parts: round summaries with intervals, verdicts per
concurrency, the evidence that the schedule ran, the launches it makes, refusals; and
validate's planner note when plain decoding wins. The real server run is in
tests/test_vllm_real.py (slow)."""

from __future__ import annotations

import json

import pytest

from integration import schedule_validate as sv
from nccl_tune.errors import NcclTuneError
from nccl_tune.stats import wilson_ci

NGRAM = {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIG = {**NGRAM, "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 64, 1]]}


@pytest.mark.parametrize(
    "x,n,lo,hi", [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)]
)
def test_wilson_interval_matches_newcombe_1998(x, n, lo, hi):
    # Newcombe, "Two-sided confidence intervals for the single proportion", Statistics in
    # Medicine 17 (1998) 857-872, Table II, method 3 (score interval without correction)
    p, got_lo, got_hi = wilson_ci(x, n)
    assert p == x / n and (got_lo, got_hi) == pytest.approx((lo, hi), abs=5e-5)


def _round(agg, tok_s, ttft, spec=None):
    return {"aggregate_tok_s": agg, "requests": [{"tok_s": t, "ttft_s": f} for t, f in zip(tok_s, ttft)], "spec": spec}


def test_round_summary_intervals_and_acceptance():
    # aggregates 100 and 110 on the log scale: mean (ln 100 + ln 110) / 2 -> geometric mean
    # sqrt(11000) = 104.88; sd of the logs ln(1.1) / sqrt 2 = 0.067393, se 0.047655,
    # t(0.975, 1) = 12.7062 -> x/ exp(0.60551) = 1.83223: [57.24, 192.16].
    # position 1: 0.5 of 100 drafts + 31/163 of 163 drafts = 81 of 263 (Newcombe's example).
    rounds = [
        _round(
            100.0,
            [50.0, 50.0],
            [0.1, 0.3],
            {
                "drafts": 100,
                "draft_tokens": 100,
                "accepted_tokens": 50,
                "per_position": [0.5],
                "generation_tokens": 250,
            },
        ),
        _round(
            110.0,
            [55.0, 55.0],
            [0.1, 0.3],
            {
                "drafts": 163,
                "draft_tokens": 163,
                "accepted_tokens": 31,
                "per_position": [31 / 163],
                "generation_tokens": 294,
            },
        ),
    ]
    s = sv.summarize_rounds(rounds)
    assert s["aggregate_tok_s"] == pytest.approx(104.881, abs=1e-3)
    assert s["aggregate_tok_s_ci"] == pytest.approx([57.243, 192.164], abs=0.01)
    assert s["request_tok_s"] == pytest.approx((50 * 50 * 55 * 55) ** 0.25)
    assert s["ttft_s"] == pytest.approx(0.03**0.5)  # geometric mean of 0.1, 0.3, 0.1, 0.3
    assert s["accept_len"] == pytest.approx(1 + 81 / 263) and s["draft_tokens_per_draft"] == 1.0
    pos = s["per_position"][0]
    assert pos["acceptance"] == pytest.approx(81 / 263) and pos["ci"] == pytest.approx([0.2553, 0.3662], abs=5e-5)
    # request-steps: generated 544 minus accepted 81 = 463; 263 of them carried drafts
    assert s["drafted_share_of_steps"] == pytest.approx(263 / 463)


def test_the_drafts_tell_whether_the_schedule_ran():
    assert sv.follows(1, 3, {"draft_tokens_per_draft": 49 / 47}) is True  # the probe's batch 4
    assert sv.follows(1, 3, {"draft_tokens_per_draft": 2.9}) is False
    assert sv.follows(3, 3, {"draft_tokens_per_draft": 3.0}) is None
    assert sv.follows(0, 2, {"drafted_share_of_steps": 0.04}) is True
    assert sv.follows(0, 2, {"drafted_share_of_steps": 0.6}) is False
    ran = {
        "by_concurrency": {1: {"draft_tokens_per_draft": 3.0}, 4: {"draft_tokens_per_draft": 1.04}},
        "log_shows_schedule": True,
    }
    dyn = sv.dynamic_evidence(ran, CONFIG, [1, 4])
    assert dyn["active"] is True and dyn["by_concurrency"][4]["schedule_k"] == 1
    assert dyn["by_concurrency"][1]["follows_schedule"] is None
    assert sv.dynamic_evidence({**ran, "log_shows_schedule": False}, CONFIG, [1, 4])["active"] is False
    assert sv.dynamic_evidence(ran, CONFIG, [1])["active"] is None  # k = max there: cannot tell


def test_verdict_per_concurrency_against_the_best_static_k():
    def conf(label, steps, by):
        return {
            "label": label,
            "steps": steps,
            "by_concurrency": {
                c: {"aggregate_tok_s": sum(v) / len(v), "runs_aggregate_tok_s": v} for c, v in by.items()
            },
        }

    results = [
        conf("k=1", 1, {1: [100, 102, 101], 4: [300, 305, 302]}),
        conf("k=3", 3, {1: [130, 131, 129], 4: [250, 255, 252]}),
        conf("schedule", 3, {1: [130, 128, 131], 4: [340, 345, 342]}),
    ]
    v = sv.verdicts(results, [1, 4])
    assert v[1]["best_static"] == "k=3" and v[1]["verdict"] == "no significant difference"
    assert v[4]["best_static"] == "k=1" and v[4]["verdict"] == "schedule beat the best static k"
    assert v[4]["ratio"] == pytest.approx(342.333 / 302.333, rel=1e-4)


def test_launches_keep_the_users_method_and_the_schedule(tmp_path):
    opts = sv.ScheduleRun(
        ["--model", "m", "--speculative-config", json.dumps({**NGRAM, "num_speculative_tokens": 2})],
        CONFIG,
        "s.json",
        [0, 2],
        [1, 4],
    )
    launches = sv.configurations(opts)
    assert [(label, k) for label, k, _ in launches] == [("k=0", 0), ("k=2", 2), ("schedule", 3)]
    static = json.loads(launches[1][2][-1])
    assert static == {**NGRAM, "num_speculative_tokens": 2}
    assert json.loads(launches[2][2][-1]) == CONFIG and launches[2][2][:2] == ["--model", "m"]
    # without a speculative config in --server-args the static runs take the schedule's method
    bare = sv.configurations(sv.ScheduleRun(["--model", "m"], CONFIG, "s.json", [1], [1]))
    assert json.loads(bare[0][2][-1]) == {**NGRAM, "num_speculative_tokens": 1}


@pytest.mark.parametrize(
    "text,needle",
    [
        ("{", "not JSON"),
        ('{"num_speculative_tokens": 2}', "no method"),
        (json.dumps({**CONFIG, "num_speculative_tokens_per_batch_size": [[1, 4, 2], [4, 8, 1]]}), "overlap"),
        (json.dumps({**CONFIG, "num_speculative_tokens_per_batch_size": [[2, 4, 2]]}), "start at 1"),
    ],
)
def test_bad_schedule_files_are_named(tmp_path, text, needle):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(NcclTuneError, match=needle) as info:
        sv.read_schedule(str(path))
    assert str(path) in str(info.value)


def test_validate_schedule_refusals_exit_2(cli_runner, tmp_path):
    from nccl_tune.cli import cli

    good = tmp_path / "s.json"
    good.write_text(json.dumps(CONFIG))
    base = ["validate", "--server-args", "--model m", "--server-command", "python -m nothing"]
    for args, needle in (
        (["--schedule", str(good)], "--engine vllm"),
        (["--engine", "vllm", "--concurrency", "1,4"], "--schedule"),
        (["--engine", "vllm", "--schedule", str(good), "--concurrency", "0"], "--concurrency"),
        (["--engine", "vllm", "--schedule", str(tmp_path / "none.json")], "none.json"),
    ):
        result = cli_runner.invoke(cli, [*base, *args])
        assert result.exit_code == 2 and needle in result.output, (args, result.output)


def test_validate_planner_note_says_do_not_speculate():
    from integration import validate as lib

    # plain 2.0 ms per token (500 tok/s); k = 1: 1.2 accept length over 0.5 + 2.5 + 0.1 =
    # 3.1 ms -> 387 tok/s; k = 2: 1.3 over 1.0 + 2.8 + 0.1 = 3.9 ms -> 333 tok/s: plain wins
    runs = {
        0: {"step_ms": 2.0, "verify_ms": 1.9, "tok_s": 500.0},
        1: {"verify_ms": 2.5, "draft_ms": 0.5, "other_ms": 0.1, "accept_len": 1.2, "tok_s": 380.0},
        2: {"verify_ms": 2.8, "draft_ms": 1.0, "other_ms": 0.1, "accept_len": 1.3, "tok_s": 330.0},
    }
    measured = {
        (label, k): {"status": "ok", "runs_tok_s": [r["tok_s"]] * 3, **r}
        for label in ("baseline", "profile")
        for k, r in runs.items()
    }
    planned = lib.plan_steps_from_runs(measured, [0, 1, 2], {"baseline": 0, "profile": 0})
    base = planned["baseline"]
    assert base["best_k"] == 0 and base["speculate"] is False and base["measured_best_in_candidates"]
    assert "do not speculate" in base["note"]
