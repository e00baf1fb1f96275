"""Speculative decoding model: tau, conventions, Monte-Carlo check, best step count."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_tune.model.per_token import LatencyCurve, message_bytes
from nccl_tune.spec import accept as sa
from nccl_tune.spec import cycle as sd
from nccl_tune.spec import options as so
from nccl_tune.spec import verify as sv


def acceptance(**kwargs):
    """The planner's acceptance from option values (as spec-plan parses them)."""
    return so.parse_acceptance(**kwargs).build(10)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_iid_closed_form_equals_the_sum(rate, k):
    assert sa.tau_iid(rate, k) == pytest.approx(1 + sum(rate**i for i in range(1, k + 1)))
    assert sa.tau_from_reach([rate**i for i in range(1, k + 1)]) == pytest.approx(sa.tau_iid(rate, k))


@pytest.mark.parametrize("rate,k", [(0.6, 3), (0.85, 5), (0.95, 2)])
def test_monte_carlo_accept_reject_matches_closed_form(rate, k):
    cycles = 60000
    mean = sa.simulate_cycles([rate] * k, cycles, seed=1)
    expected = sa.tau_iid(rate, k)
    # The per-cycle token count is bounded by k + 1: 4 standard errors of at most (k+1)/2.
    assert abs(mean - expected) < 4 * ((k + 1) / 2) / math.sqrt(cycles)


def test_monte_carlo_with_position_dependent_rates():
    conditional = [0.9, 0.8, 0.6, 0.5]
    reach = sa.reach_from_conditional(conditional)
    assert reach == pytest.approx([0.9, 0.72, 0.432, 0.216])
    mean = sa.simulate_cycles(conditional, 60000, seed=2)
    assert mean == pytest.approx(sa.tau_from_reach(reach), abs=0.03)


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(0.01, 0.99), k=st.integers(1, 10))
def test_accept_len_and_iid_rate_round_trip(rate, k):
    tau = sa.tau_iid(rate, k)
    assert sa.iid_rate_from_accept_len(tau, k) == pytest.approx(rate, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(tau_frac=st.floats(0.0, 1.0), k=st.integers(1, 10))
def test_tool_conventions_round_trip(tau_frac, k):
    tau = 1 + tau_frac * k  # any accept length in [1, k+1]
    for variant in (sa.SGLANG_RATE_DRAFTS, sa.SGLANG_RATE_TOTAL):
        rate = sa.sglang_accept_rate(tau, k, variant)
        assert sa.accept_len_from_sglang_rate(rate, k, variant) == pytest.approx(tau)
    assert sa.accept_len_from_vllm(tau) == tau
    assert sa.accept_len_from_vllm_rate(sa.vllm_draft_acceptance_rate(tau, k), k) == pytest.approx(tau)


def test_conventions_count_the_bonus_token():
    # Plain decoding (nothing accepted) is accept length 1.0 in SGLang and vLLM.
    assert sa.tau_iid(0.0, 4) == 1.0
    assert sa.sglang_accept_rate(1.0, 4) == 0.0  # recent SGLang: (L-1)/k
    assert sa.sglang_accept_rate(1.0, 4, sa.SGLANG_RATE_TOTAL) == pytest.approx(0.2)  # L/(k+1)
    assert sa.vllm_draft_acceptance_rate(5.0, 4) == 1.0  # everything accepted
    with pytest.raises(ValueError):
        sa.iid_rate_from_accept_len(0.5, 3)  # below 1: the bonus token was not counted


def _best_k(verify, rate=0.8, draft_ms=0.5):
    plans = sd.plan_steps(range(1, 11), lambda k: sa.tau_iid(rate, k), draft_ms, verify)
    return sd.best_step(plans).k


def test_best_k_moves_lower_when_verify_cost_rises_faster_with_tokens():
    flat = sv.measured_curve([(1, 10.0)])
    rising = sv.measured_curve([(1, 10.0), (4, 13.0)], linear_beyond=True)
    steep = sv.measured_curve([(1, 10.0), (4, 22.0)], linear_beyond=True)
    assert _best_k(flat) > _best_k(rising) > _best_k(steep)


def test_profile_that_flattens_comm_can_move_best_k_up():
    # comm(n) from two latency curves: the baseline's rises steeply with the verify size,
    # the profile's hardly at all; with the same compute, the best k rises under the profile.
    hidden, collectives = 7168, 123
    sizes = [message_bytes(n, hidden) for n in range(1, 12)]
    base = LatencyCurve.from_points([(b, 20 + b / 400) for b in sizes])
    prof = LatencyCurve.from_points([(b, 15 + b / 4000) for b in sizes])

    def verify(curve):
        return sv.VerifyCurve(
            sv.DENSE,
            ((1, 8.0),),
            8.0,
            0.05,
            covers_all=True,
            comm=lambda n: collectives * curve.at(message_bytes(n, hidden)) / 1000,
        )

    assert _best_k(verify(prof)) > _best_k(verify(base))


def test_plan_row_arithmetic():
    verify = sv.measured_curve([(1, 10.0), (3, 12.0)])
    plans = sd.plan_steps([0, 2], lambda k: sa.tau_iid(0.5, k), 1.0, verify, other_ms=0.5)
    plain, two = plans
    # plain decoding: one forward of one token, no per-cycle overhead of speculation
    assert (plain.tau, plain.cycle_ms, plain.tok_s) == (1.0, 10.0, pytest.approx(1000 / 10.0))
    own = sd.plan_steps([0], lambda k: 1.0, 1.0, verify, other_ms=0.5, decode_ms=9.0)[0]
    assert own.cycle_ms == 9.0 and own.other_ms == 0.0
    assert two.verify_ms == 12.0 and two.cycle_ms == pytest.approx(2 * 1.0 + 12.0 + 0.5)
    assert two.tok_s == pytest.approx(1000 * 1.75 / 14.5)
    assert not two.extrapolated and verify.extrapolated(5)


def test_plan_rows_by_hand_and_their_edges():
    # k = 2 with a 1.5 ms draft step: draft 2 x 1.5 = 3.0 ms, cycle 3.0 + 12.0 = 15.0 ms
    two = sd.plan_steps([2], lambda k: 2.0, 1.5, lambda n: 12.0)[0]
    assert (two.draft_ms, two.cycle_ms, two.tok_s) == (3.0, 15.0, pytest.approx(2000 / 15.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        two.k = 3  # rows are values where modules meet
    # a verify time without an `extrapolated` test is measured, never extrapolated
    assert not any(p.extrapolated for p in sd.plan_steps([0, 1], lambda k: 1.5, 1.0, lambda n: 9.0))
    # plain decoding is extrapolated only when priced by an extrapolated verify curve
    verify = sv.measured_curve([(2, 10.0), (3, 12.0)])  # 1 token lies outside
    assert sd.plan_steps([0], lambda k: 1.0, 1.0, verify)[0].extrapolated
    assert not sd.plan_steps([0], lambda k: 1.0, 1.0, verify, decode_ms=9.0)[0].extrapolated
    # any positive time is a time; zero is refused, for plain decoding and for a cycle
    assert sd.plan_steps([0], lambda k: 1.0, 0.0, lambda n: 0.5)[0].tok_s == pytest.approx(2000.0)
    assert sd.plan_steps([1], lambda k: 1.5, 0.0, lambda n: 0.5)[0].tok_s == pytest.approx(3000.0)
    with pytest.raises(ValueError, match="plain decoding"):
        sd.plan_steps([0], lambda k: 1.0, 0.0, lambda n: 0.0)
    with pytest.raises(ValueError, match="a cycle"):
        sd.plan_steps([1], lambda k: 1.5, 0.0, lambda n: 0.0)


def test_candidates_include_one_step_and_the_exact_floor():
    def row(k, tok_s):
        return sd.StepPlan(k, 1.0, 0.0, 1.0, 0.0, 1.0, tok_s)

    # k = 1 is the best speculative row; k = 2 sits exactly on the floor 100 x (1 - 0.5)
    plans = [row(0, 40.0), row(1, 100.0), row(2, 50.0), row(3, 49.0)]
    assert sd.candidate_steps(plans, rel_error=0.5) == [1, 2]
    assert sd.best_step(plans).k == 1
    # tok/s equal to 9 decimals (3e-10 apart: rounding noise of two arithmetic paths) tie: fewer steps
    assert sd.best_step([row(1, 100.0), row(2, 100.0 + 3e-10)]).k == 1


def test_candidates_from_intervals_reach_the_best_low_end_inclusively():
    def row(k, tok_s):
        return sd.StepPlan(k, 1.0, 0.0, 1.0, 0.0, 1.0, tok_s)

    plans = [row(0, 80.0), row(1, 100.0), row(2, 95.0), row(3, 70.0)]
    # the best (k = 1) was exact in every draw: its interval is one point, 100..100, and
    # it is its own candidate; k = 2's high end 100 reaches that floor exactly (a tie);
    # k = 0 tops out at 99.9 and k = 3 at 75, below it
    intervals = {0: (60.0, 99.9), 1: (100.0, 100.0), 2: (90.0, 100.0), 3: (65.0, 75.0)}
    assert sd.candidate_steps(plans, intervals=intervals) == [1, 2]
    # the floor is the best's low end (90), not its high end (110): k = 2 reaching 95 is a candidate
    wide = {**intervals, 1: (90.0, 110.0), 2: (85.0, 95.0)}
    assert sd.candidate_steps(plans, intervals=wide) == [0, 1, 2]
    # without intervals, the stated relative error (5% by default, docs/commands/spec-plan.md):
    # the floor is 100 x 0.95 = 95: k = 2 at 95.5 is a candidate, k = 3 at 94 is not
    assert sd.candidate_steps([row(1, 100.0), row(2, 95.5), row(3, 94.0)]) == [1, 2]


def test_decision_in_words_and_as_json():
    def row(k, tok_s):
        return sd.StepPlan(k, 1.0, 0.0, 1.0, 0.0, 1.0, tok_s)

    # k = 2 beats plain decoding: speculate, 150 / 100 = 1.50x
    spec = sd.decision([row(0, 100.0), row(1, 120.0), row(2, 150.0)])
    assert (spec["speculate"], spec["best_k"], spec["break_even_decode_ms"]) == (True, 2, None)
    assert spec["words"] == "speculate with k = 2 draft steps: 150.0 tok/s, 1.50x plain decoding"
    # plain decoding is fastest: do not speculate, and the best k >= 1 gives 90 / 100 = 0.90x
    plain = sd.decision([row(0, 100.0), row(1, 90.0), row(2, 80.0)])
    assert (plain["speculate"], plain["best_k"], plain["break_even_decode_ms"]) == (False, 0, None)
    assert (
        plain["words"]
        == "do not speculate: plain decoding is fastest (100.0 tok/s; the best speculative k = 1 gives 0.90x)"
    )
    # plain decoding not priced: k = 2 at 125 tok/s wins only if plain takes over 1000 / 125 = 8 ms
    unknown = sd.decision([row(1, 100.0), row(2, 125.0)])
    assert (unknown["speculate"], unknown["best_k"]) == (None, 2)
    assert unknown["break_even_decode_ms"] == pytest.approx(8.0)
    assert "plain decoding takes more than 8.000 ms per token (below 125.0 tok/s)" in unknown["words"]


def test_parsers_reject_bad_text():
    assert so.parse_steps("1-3,8") == [1, 2, 3, 8]
    for bad in ("0-3", "5-2", "a", "1,,2", "1-100"):
        with pytest.raises(ValueError):
            so.parse_steps(bad)
    assert so.parse_at("3.2@4", "x") == ([3.2], [4])
    assert so.parse_at("10,11@1,2", "x") == ([10.0, 11.0], [1, 2])
    with pytest.raises(ValueError):
        so.parse_at("10,11@1", "x")
    with pytest.raises(ValueError):
        sv.measured_curve([(1, 2.0), (1, 3.0)])


def test_acceptance_options_are_exclusive_and_checked():
    acc = acceptance(accept_len="3.0@4")
    assert acc.tau(4) == pytest.approx(3.0)
    assert acceptance(accept_rate=0.5).tau(2) == pytest.approx(1.75)
    per_pos = acceptance(accept_per_pos="0.9,0.7")
    assert per_pos.max_k == 2 and per_pos.tau(2) == pytest.approx(2.6)
    assert acceptance(accepted_drafts="2.0@4").tau(4) == pytest.approx(3.0)  # bonus added
    for kwargs in (
        {},
        {"accept_len": "3@4", "accept_rate": 0.5},
        {"accept_per_pos": "0.5,0.9"},
        {"accept_rate": 1.5},
        {"accept_len": "3"},
        {"accepted_drafts": "5@4"},
    ):
        with pytest.raises(ValueError):
            acceptance(**kwargs)


# ---------------------------------------------------------------- the spec-plan command


def _spec_plan(cli_runner, *args):
    from nccl_tune.cli import cli

    return cli_runner.invoke(cli, ["spec-plan", *args], catch_exceptions=False)


def test_spec_plan_json(cli_runner):
    import json

    result = _spec_plan(
        cli_runner,
        "--verify-ms",
        "11.3,11.6,12.4@1,2,4",
        "--draft-ms",
        "0.9",
        "--accept-len",
        "3.0@4",
        "--steps",
        "1-6",
        "--extrapolate",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [p["k"] for p in out["plans"]] == [0, 1, 2, 3, 4, 5, 6]
    plain = out["plans"][0]
    assert plain["tau"] == 1.0 and plain["tok_s"] == pytest.approx(1000 / 11.3)
    at4 = out["plans"][4]
    assert at4["tau"] == pytest.approx(3.0) and at4["extrapolated"]  # 5 tokens > 4 measured
    best = max(out["plans"][1:], key=lambda p: p["tok_s"])
    assert out["best_k"] == best["k"] and out["speedup"] == pytest.approx(best["tok_s"] / plain["tok_s"])
    conv = out["conventions"]
    assert conv["vllm_mean_acceptance_length"] == conv["accept_len"]


def test_spec_plan_text_and_errors(cli_runner):
    result = _spec_plan(cli_runner, "--verify-ms", "20", "--draft-ms", "1", "--accept-rate", "0.8")
    assert result.exit_code == 0 and "decision: speculate with k =" in result.output
    assert "flat" in result.output
    for args in (
        ["--verify-ms", "10,11", "--draft-ms", "1", "--accept-rate", "0.8"],
        ["--verify-ms", "10", "--draft-ms", "1"],
        ["--verify-ms", "10", "--draft-ms", "1", "--accept-per-pos", "0.9", "--steps", "1-3"],
        ["--verify-ms", "x", "--draft-ms", "1", "--accept-rate", "0.8"],
    ):
        bad = _spec_plan(cli_runner, *args)
        assert bad.exit_code == 2, args


# ---------------------------------------------------------------- option parsing (audit items)


def test_step_ranges_are_bounded_before_they_are_built():
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(ValueError, match=r"--spec-steps '1-2000000': more than 64"):
        so.parse_steps("1-2000000", "--spec-steps")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000  # a set of 2 million ints takes ~100 MB: never built
    with pytest.raises(ValueError, match="--spec-steps '1-99999999999999'"):
        so.parse_steps("1-99999999999999", "--spec-steps")


@pytest.mark.parametrize("text", ["x", "a-b", "0-3", "5-2", "1,,2", "1-65", "-3"])
def test_step_errors_name_the_option(text):
    with pytest.raises(ValueError) as info:
        so.parse_steps(text, "--spec-steps")
    assert str(info.value).startswith(f"--spec-steps '{text}':")


def test_verify_errors_name_the_option():
    for text in ("12,13", "12,x", "12,13@1", "0", "12,13@2,2"):
        with pytest.raises(ValueError) as info:
            so.verify_points(text, "--verify-ms")
        assert "--verify-ms" in str(info.value), text
    assert so.verify_points("11,12@1,3") == ([(1, 11.0), (3, 12.0)], False)
    assert so.verify_points("11") == ([(1, 11.0)], True)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--steps", "a-b"], "--steps 'a-b'"),
        (["--steps", "1-99999999999999"], "--steps '1-99999999999999'"),
        (["--verify-ms", "12,13"], "--verify-ms '12,13'"),
        (["--accept-rate", "1.5"], "--accept-rate"),
        (["--accept-per-pos", "0.5,0.9"], "--accept-per-pos"),
    ],
)
def test_spec_plan_errors_name_the_option(cli_runner, args, needle):
    base = {"--verify-ms": "12", "--draft-ms": "1", "--accept-rate": "0.5"}
    if "--accept-per-pos" in args:
        base.pop("--accept-rate")
    base.update(dict(zip(args[::2], args[1::2])))
    result = _spec_plan(cli_runner, *[x for kv in base.items() for x in kv])
    assert result.exit_code == 2 and needle in result.output, result.output


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(0.0, 1.0), k=st.integers(1, 10))
def test_sglang_and_vllm_rate_options_round_trip(rate, k):
    text = f"{rate!r}@{k}"
    acc = acceptance(sglang_accept_rate=text, sglang_convention=sa.SGLANG_RATE_DRAFTS)
    tau = acc.tau(k)
    assert tau == pytest.approx(sa.accept_len_from_sglang_rate(rate, k, sa.SGLANG_RATE_DRAFTS))
    assert sa.sglang_accept_rate(tau, k, sa.SGLANG_RATE_DRAFTS) == pytest.approx(rate, abs=1e-9)
    assert acc.at(k).accept_len == pytest.approx(tau)
    vllm = acceptance(vllm_acceptance_rate=text)
    assert vllm.tau(k) == pytest.approx(sa.accept_len_from_vllm_rate(rate, k))
    assert sa.vllm_draft_acceptance_rate(vllm.tau(k), k) == pytest.approx(rate, abs=1e-9)
    if rate >= 1 / (k + 1):  # earlier SGLang counted the bonus token: L = rate x (k + 1) >= 1
        old = acceptance(sglang_accept_rate=text, sglang_convention=sa.SGLANG_RATE_TOTAL)
        assert sa.sglang_accept_rate(old.tau(k), k, sa.SGLANG_RATE_TOTAL) == pytest.approx(rate, abs=1e-9)


def test_rate_options_are_checked_and_exclusive():
    with pytest.raises(ValueError, match="--sglang-accept-rate '0.1@4'"):  # L = 0.5 < 1
        acceptance(sglang_accept_rate="0.1@4", sglang_convention=sa.SGLANG_RATE_TOTAL)
    for kwargs in (
        {"sglang_accept_rate": "0.7"},
        {"sglang_accept_rate": "1.2@3"},
        {"vllm_acceptance_rate": "0.5@0"},
        {"vllm_acceptance_rate": "nan@2"},
        {"sglang_accept_rate": "0.5@2", "accept_rate": 0.5},
        {"sglang_accept_rate": "0.5@2"},
    ):  # no pair, no convention named: refused
        with pytest.raises(ValueError):
            acceptance(**kwargs)


def test_rate_options_in_spec_plan_and_recommend(cli_runner):
    import json

    from nccl_tune.cli import cli

    out = json.loads(
        _spec_plan(
            cli_runner,
            "--verify-ms",
            "12",
            "--draft-ms",
            "1",
            "--steps",
            "1-4",
            "--sglang-accept-rate",
            "0.7@3",
            "--sglang-rate-convention",
            "drafts",
            "--json",
        ).output
    )
    assert out["plans"][3]["tau"] == pytest.approx(1 + 0.7 * 3)
    assert "(L - 1) / k, SGLang after PR #23530" in out["acceptance"]["convention"]
    refused = _spec_plan(cli_runner, "--verify-ms", "12", "--draft-ms", "1", "--sglang-accept-rate", "0.7@3")
    assert refused.exit_code == 2 and "changed meaning" in refused.output
    out = json.loads(
        _spec_plan(
            cli_runner,
            "--verify-ms",
            "12",
            "--draft-ms",
            "1",
            "--steps",
            "1-4",
            "--sglang-accept-rate",
            "0.7@3",
            "--sglang-rate-convention",
            "total",
            "--json",
        ).output
    )
    assert out["plans"][3]["tau"] == pytest.approx(0.7 * 4)
    both = _spec_plan(cli_runner, "--verify-ms", "12", "--draft-ms", "1", "--accept-len", "2@2", "--accept-rate", "0.5")
    assert both.exit_code == 2 and "not several of these" in both.output
    rec = cli_runner.invoke(
        cli,
        [
            "recommend",
            "--layers",
            "61",
            "--topology",
            "pcie-shm",
            "--spec-steps",
            "1-4",
            "--vllm-acceptance-rate",
            "0.6@4",
            "--baseline-tok-s",
            "60",
            "--json",
        ],
    )
    assert rec.exit_code == 0, rec.output
    spec = json.loads(rec.output)["spec"]
    assert spec["baseline"][4]["tau"] == pytest.approx(1 + 0.6 * 4)


def test_spec_plan_extrapolates_verify_only_when_asked(cli_runner):
    import json

    args = ["--verify-ms", "11.3,11.6,12.4@1,2,4", "--draft-ms", "0.9", "--accept-len", "3.0@4", "--steps", "1-6"]
    out = json.loads(_spec_plan(cli_runner, *args, "--json").output)
    assert [p["k"] for p in out["plans"]] == [0, 1, 2, 3] and out["left_out_steps"] == [4, 5, 6]
    assert not any(p["extrapolated"] for p in out["plans"])
    text = _spec_plan(cli_runner, *args).output
    assert "steps left out" in text and "4, 5, 6" in text and "*" not in text
    text = _spec_plan(cli_runner, *args, "--extrapolate").output
    assert "EXTRAPOLATED" in text and "5 tokens (k = 4), 6 tokens (k = 5), 7 tokens (k = 6)" in text
    marked = [line.split()[0] for line in text.splitlines() if line[:1].isdigit() and "*" in line]
    assert marked == ["4", "5", "6"]
    # without plain decoding's time the plan ranks k >= 1 and says what decides (issue 21)
    no_plain = _spec_plan(
        cli_runner, "--verify-ms", "11.6,12.4@2,4", "--draft-ms", "0.9", "--accept-rate", "0.7", "--steps", "1-3"
    )
    assert no_plain.exit_code == 0 and "0 (plain)" not in no_plain.output
    assert "only if plain decoding takes more than" in no_plain.output
