"""The planner's decisions (issue 21): plain decoding as a candidate, plain decoding's time
only where it decides, one measured point spanning both explanations, --batch marking and
saturation, and vLLM's per-batch-size schedule. Expected figures are derived by hand in the
comments (tau, cycle and tok/s from DESIGN.md section 6), never taken from the code."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_tune.spec import options as so
from nccl_tune.spec import schedule
from nccl_tune.spec.planner import PlanError, PlanRequest, plan

SWEEPS = Path(__file__).resolve().parent / "fixtures" / "spec_sweeps"
SWEEP_FILES = [
    "vllm_issue20780_llama31_8b_eagle1.csv",
    "vllm_issue20780_llama31_8b_eagle3.csv",
    "vllm_pr16035_llama3_8b_eagle.csv",
    "kimi_k25_eagle3_pcie.csv",
]


def spec_plan(cli_runner, *args, code: int = 0) -> dict | str:
    from nccl_tune.cli import cli

    result = cli_runner.invoke(cli, ["spec-plan", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return json.loads(result.output) if "--json" in args and code == 0 else result.output


def tok(out: dict) -> dict[int, float]:
    return {p["k"]: p["tok_s"] for p in out["plans"]}


# ---------------------------------------------------------------- the four decisions


def test_plain_decoding_wins_and_the_answer_is_do_not_speculate(cli_runner):
    # The case. iid rate a from 1.1@2: a + a^2 = 0.1 -> a = 0.09161, tau(1) = 1.09161.
    # verify: (1, 10) and (3, 30) -> 20 ms at 2 tokens. k = 1: 1000 x 1.09161 / (1 + 20) = 52.0;
    # k = 2: 1000 x 1.1 / (2 + 30) = 34.4; plain 1000 / 10 = 100.0: do not speculate.
    args = ["--decode-ms", "10", "--verify-ms", "30@3", "--draft-ms", "1", "--accept-len", "1.1@2", "--steps", "1-2"]
    out = spec_plan(cli_runner, *args, "--json")
    assert out["best_k"] == 0 and out["speculate"] is False
    assert tok(out) == pytest.approx({0: 100.0, 1: 51.98, 2: 34.375}, abs=0.01)
    assert out["decision"].startswith("do not speculate")
    assert out["candidates"] == [0] and out["validate_command"].endswith("--steps 0,1")
    text = spec_plan(cli_runner, *args)
    assert (
        "decision: do not speculate: plain decoding is fastest (100.0 tok/s; the best "
        "speculative k = 1 gives 0.52x)" in text
    )
    # --batch 1,2: at batch 2 plain decoding is the 2-token forward, 20 ms (50 tok/s); k = 1
    # verifies 4 tokens (40 ms, extrapolated) with a draft step of 1 x 20 / 10 = 2 ms:
    # 1000 x 1.09161 / 42 = 26.0 tok/s. Plain wins at both.
    batch = spec_plan(cli_runner, *args, "--batch", "1,2", "--extrapolate", "--json")
    assert [b["best_k"] for b in batch["batches"]] == [0, 0]
    assert tok(batch["batches"][1]) == pytest.approx({0: 50.0, 1: 25.99, 2: 17.19}, abs=0.01)


def test_without_plain_decoding_the_plan_says_what_decides(cli_runner):
    # iid a from 2.0@2: a + a^2 = 1 -> a = 0.618034, tau(1) = 1.618034. Verify (2, 11), (3, 12).
    # k = 1: 1618.034 / (0.5 + 11) = 140.70; k = 2: 2000 / (1 + 12) = 153.85 -> best k = 2;
    # plain decoding wins below 1000 / 153.85 = 6.5 ms per token.
    args = ["--verify-ms", "11,12@2,3", "--draft-ms", "0.5", "--accept-len", "2.0@2", "--steps", "1-2"]
    out = spec_plan(cli_runner, *args, "--json")
    assert out["speculate"] is None and out["best_k"] == 2 and out["plain_tok_s"] is None
    assert tok(out) == pytest.approx({1: 140.70, 2: 153.85}, abs=0.01)
    assert out["break_even_decode_ms"] == pytest.approx(6.5)
    assert "more than 6.500 ms per token" in out["decision"]
    assert spec_plan(cli_runner, *args, "--decode-ms", "6", "--json")["speculate"] is False
    assert spec_plan(cli_runner, *args, "--decode-ms", "7", "--json")["speculate"] is True


def test_two_measured_points_plan_without_plain_decoding(cli_runner):
    # iid rate 0.6: tau = 1.6, 1.96, 2.176, 2.3056 at k = 1..4. Cycles implied: 1600 / 100 = 16,
    # 1960 / 112 = 17.5 -> cycle(k) = 14.5 + 1.5 k. k = 3: 2176 / 19 = 114.53 (best);
    # k = 4: 2305.6 / 20.5 = 112.47; within 5% (>= 108.80): k = 2, 3, 4.
    args = ["--accept-rate", "0.6", "--measured-tok-s", "100@1", "--measured-tok-s", "112@2", "--fit", "--steps", "1-4"]
    out = spec_plan(cli_runner, *args, "--json")
    assert out["best_k"] == 3 and out["speculate"] is None and out["candidates"] == [2, 3, 4]
    assert tok(out) == pytest.approx({1: 100.0, 2: 112.0, 3: 114.526, 4: 112.468}, abs=0.001)
    assert out["break_even_decode_ms"] == pytest.approx(19.0 / 2.176)


def test_one_measured_point_spans_both_explanations_and_names_the_next_measurement(cli_runner):
    # iid 0.6, plain 10 ms, 110 tok/s at k = 1 -> cycle 1600 / 110 = 14.545 ms. All per-step:
    # a = 10, b = 4.545: k = 1 110, k = 2 1960 / 19.09 = 102.7 -> best 1 (plain 100). All
    # fixed: 14.545 flat: tok/s = 68.75 tau = 110, 134.8, 149.6, 158.5 -> best 4. The middle
    # split (b = 2.273): k = 2 1960 / 16.82 = 116.5 (best), where the ends differ by 31%.
    args = ["--decode-ms", "10", "--accept-rate", "0.6", "--measured-tok-s", "110@1", "--fit", "--steps", "1-4"]
    out = spec_plan(cli_runner, *args, "--json")
    span = out["one_point_span"]
    assert span["best_k_all_per_step"] == 1 and span["best_k_all_fixed"] == 4
    assert out["candidates"] == [1, 2, 3, 4] and span["measure_k"] == 2 and out["best_k"] == 2
    assert span["per_step_ms"] == pytest.approx([0.0, 0.6 / 0.132], rel=1e-6)
    lo, hi = out["tok_s_intervals"]["4"]
    assert (lo, hi) == pytest.approx((2305.6 / (10 + 4 * 4.54545), 2305.6 / 14.54545), rel=1e-4)
    text = spec_plan(cli_runner, *args)
    assert "to decide: measure tok/s at k = 2" in text and "ONE measured point" in text
    # the second point decides: cycle(2) = 1960 / 120 = 16.333 -> b = 1.788, one fit, no span
    both = spec_plan(cli_runner, *args, "--measured-tok-s", "120@2", "--json")
    assert both["one_point_span"] is None and both["fit"]["cycle_ms_per_step"] == pytest.approx(1.7879, abs=1e-3)
    # without plain decoding one point bounds nothing: asked for, with the reason
    assert "--decode-ms" in spec_plan(cli_runner, *args[2:], code=2)


def test_batch_rows_beyond_the_verify_points_are_marked_plain_row_included(cli_runner):
    # points (1, 10), (2, 12), (3, 14): 10 + 2 (n - 1) ms, linear beyond with --extrapolate;
    # iid 0.55: tau(1) = 1.55. batch 1: 1550 / (1 + 12) = 119.2 > 100 -> k = 1. batch 2: plain =
    # 12 ms (a measured point), k = 1 verifies 4 tokens: 16 ms*, draft 1 x 12 / 10 = 1.2 ms:
    # 1550 / 17.2 = 90.12 > 83.33 -> k = 1. batch 4: plain = 16 ms* (62.5 tok/s), k = 1
    # verifies 8 tokens: 24 ms*, draft 1.6: 1550 / 25.6 = 60.55 -> do not speculate.
    args = [
        "--decode-ms",
        "10",
        "--verify-ms",
        "12,14@2,3",
        "--draft-ms",
        "1",
        "--accept-rate",
        "0.55",
        "--steps",
        "1",
        "--batch",
        "1,2,4",
    ]
    out = spec_plan(cli_runner, *args, "--extrapolate", "--json")
    b1, b2, b4 = out["batches"]
    assert [p["extrapolated"] for p in b2["plans"]] == [False, True]
    assert [p["extrapolated"] for p in b4["plans"]] == [True, True]
    assert tok(b2) == pytest.approx({0: 1000 / 12, 1: 1550 / 17.2}, abs=1e-9)
    assert tok(b4) == pytest.approx({0: 62.5, 1: 1550 / 25.6}, abs=1e-9)
    assert (b1["best_k"], b2["best_k"], b4["best_k"]) == (1, 1, 0)
    text = spec_plan(cli_runner, *args, "--extrapolate")
    assert "forward time at 4 tokens (k = 0, plain decoding), 8 tokens (k = 1) beyond" in text
    # without --extrapolate nothing at batch 4 is covered: refused, naming the way out
    assert "--extrapolate" in spec_plan(cli_runner, *args, code=2)


def test_saturation_and_per_sequence_cost_make_the_best_k_fall_fitted_from_batch_times(cli_runner):
    # flat verify 10 ms (points (1, 10), (2, 10)), free drafts, iid 0.5: tau = 2 - 0.5^k.
    # n_sat = 8: batch 1 verifies <= 5 tokens, 10 ms: tok/s = 100 tau -> k = 4 (193.75).
    # batch 8 verifies 8 (k + 1) tokens: 10 x 8 (k + 1) / 8 = 10 (k + 1) ms: tok/s =
    # 100 tau / (k + 1) = 75, 58.3, ... while plain (8 tokens, 10 ms) is 100 -> k = 0.
    base = [
        "--verify-ms",
        "10@2",
        "--draft-ms",
        "0",
        "--accept-rate",
        "0.5",
        "--steps",
        "1-4",
        "--batch",
        "1,8",
        "--extrapolate",
    ]
    sat = spec_plan(cli_runner, "--decode-ms", "10", *base, "--saturation-tokens", "8", "--json")
    assert [b["best_k"] for b in sat["batches"]] == [4, 0]
    assert tok(sat["batches"][1]) == pytest.approx({0: 100.0, 1: 75.0, 2: 1750 / 30, 3: 1875 / 40, 4: 1937.5 / 50})
    # the default (295 tokens, H100) is far beyond 40 tokens: the verify stays 10 ms, k = 4
    default = spec_plan(cli_runner, "--decode-ms", "10", *base, "--json")
    assert [b["best_k"] for b in default["batches"]] == [4, 4]
    assert "H100" in default["verify_model"]["saturation"]
    # plain decoding at batch 1, 8, 16: 10, 10, 20 ms: no per-sequence cost fits 10 at batch 8
    # and 20 at 16 (a line through both misses each); the knee does: compute-bound from
    # 16 x 10 / 20 = 8 tokens, with no per-sequence cost
    fitted = spec_plan(cli_runner, "--decode-ms", "10,10,20@1,8,16", *base, "--json")
    assert fitted["verify_model"]["saturation_tokens"] == pytest.approx(8.0, rel=0.03)
    assert fitted["verify_model"]["saturation"].startswith("FITTED")
    assert [b["best_k"] for b in fitted["batches"]] == [4, 0]
    # plain decoding at batch 1, 4, 8: 10, 13, 17 ms over a flat 10 ms curve: each sequence
    # beyond the first costs s = (3 x 3 + 7 x 7) / (3^2 + 7^2) = 1 ms, a straight line, so no
    # knee. At batch 8 k = 1 verifies 16 tokens over 8 sequences: 10 + 7 x 1 = 17 ms, and the
    # (free) draft: 1000 x 1.5 / 17 = 88.2 tok/s against plain (measured) 1000 / 17 = 58.8.
    per_seq = spec_plan(cli_runner, "--decode-ms", "10,13,17@1,4,8", *base, "--json")
    assert per_seq["verify_model"]["per_sequence_ms"] == pytest.approx(1.0)
    assert per_seq["verify_model"]["saturation_tokens"] == 295.0
    assert tok(per_seq["batches"][1])[0] == pytest.approx(1000 / 17)
    assert tok(per_seq["batches"][1])[1] == pytest.approx(1500 / 17)


@settings(max_examples=60, deadline=None)
@given(
    decode=st.floats(2.0, 40.0),
    v1=st.floats(0.5, 2.0),
    slope=st.floats(0.0, 3.0),
    draft=st.floats(0.0, 3.0),
    other=st.floats(0.0, 2.0),
    rate=st.floats(0.0, 0.99),
    batch=st.sampled_from([1, 2, 8]),
)
def test_the_best_plan_is_never_worse_than_plain_decoding_by_its_own_prediction(
    decode, v1, slope, draft, other, rate, batch
):
    points = [(t, decode * v1 + slope * t) for t in (2, 6, 48)]
    req = PlanRequest(
        list(range(1, 6)),
        so.parse_acceptance(accept_rate=rate),
        decode,
        points,
        False,
        draft,
        other,
        batches=[batch],
        extrapolate=True,
    )
    try:
        result = plan(req)
    except PlanError:
        return  # e.g. a curve that is not positive: refused, not planned
    b = result.batches[0]
    assert b.plain is not None and b.best.tok_s >= b.plain.tok_s
    assert (b.decision["speculate"] is False) == (b.best.k == 0)
    # best_step ties plans equal to 9 decimals (and takes the fewer steps), so a deeper k
    # may exceed the best by less than that (1.4e-11 tok/s at a 0.2% acceptance rate)
    assert all(round(p.tok_s, 9) <= round(b.best.tok_s, 9) for p in b.plans)


# ---------------------------------------------------------------- public step sweeps


def load_sweep(name: str) -> list[dict]:
    with open(SWEEPS / name, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _inputs(name):
    rows = load_sweep(name)
    plain = next(float(r["tok_s"]) for r in rows if r["k"] == "0")
    spec = [r for r in rows if r["k"] != "0"]
    if name.startswith("kimi"):  # the report's per-cycle profiler count (bonus not counted)
        acc = so.parse_acceptance(
            accepted_drafts=tuple(f"{float(r['accept_len']) - 1:.4f}@{r['k']}" for r in spec if r["accept_len"])
        )
    else:
        acc = so.parse_acceptance(accept_len=tuple(f"{r['accept_len']}@{r['k']}" for r in spec))
    tok_s = {int(r["k"]): float(r["tok_s"]) for r in spec}
    steps = sorted(tok_s) if len(tok_s) > 2 else list(range(1, 7))
    best = max([0, *tok_s], key=lambda k: plain if k == 0 else tok_s[k])
    return plain, acc, tok_s, steps, best


@pytest.mark.parametrize("name,k", [(n, k) for n in SWEEP_FILES for k in _inputs(n)[2]])
def test_public_sweep_one_measured_point_keeps_the_measured_best(name, k):
    plain, acc, tok_s, steps, best = _inputs(name)
    req = PlanRequest(steps, acc, 1000.0 / plain, measured=[(k, tok_s[k])], fit=True)
    out = plan(req).to_dict()
    assert best in out["candidates"], (k, out["candidates"])
    assert out["one_point_span"]["measured_k"] == k


@pytest.mark.parametrize("name,pair", [(n, p) for n in SWEEP_FILES for p in itertools.combinations(_inputs(n)[2], 2)])
def test_public_sweep_two_points_without_plain_decoding(name, pair):
    plain, acc, tok_s, steps, best = _inputs(name)
    req = PlanRequest(steps, acc, None, measured=[(k, tok_s[k]) for k in pair], fit=True)
    out = plan(req).to_dict()
    best_spec = max(tok_s, key=tok_s.get)
    assert best_spec in out["candidates"] and out["speculate"] is None
    # and the break-even against the measured plain decoding gives the measured verdict
    assert (1000.0 / plain > out["break_even_decode_ms"]) == (best != 0)


# ---------------------------------------------------------------- vLLM's schedule


def test_schedule_merges_equal_neighbours_and_starts_at_one():
    assert schedule.ranges([(1, 4), (2, 4), (4, 2), (8, 2), (16, 0)]) == [[1, 3, 4], [4, 15, 2], [16, 16, 0]]
    assert schedule.ranges([(2, 3), (8, 1)]) == [[1, 7, 3], [8, 8, 1]]
    assert schedule.ranges([(1, 2), (4, 2)]) == [[1, 4, 2]]
    for bad in ([[2, 4, 1]], [[1, 4, 1], [4, 8, 2]], [[1, 4, -1]], [[1, 0, 1]], [], [[1, 2]]):
        with pytest.raises(ValueError):
            schedule.check(bad)


def test_schedule_round_trip_through_vllms_own_rules(tmp_path):
    module, how = schedule.vllm_rules()
    if module is None:
        pytest.skip(how)
    ranges = schedule.ranges([(1, 4), (2, 4), (4, 2), (16, 0)])
    assert schedule.validate(ranges) == ([(1, 3, 4), (4, 15, 2), (16, 16, 0)], how)
    assert "validate_and_normalize_dynamic_sd_schedule" in how
    cfg = schedule.config(
        {"method": "ngram", "prompt_lookup_max": 4, "num_speculative_tokens": 9, schedule.KEY: [[1, 1, 1]]}, ranges
    )
    assert cfg == {
        "method": "ngram",
        "prompt_lookup_max": 4,
        "num_speculative_tokens": 4,
        schedule.KEY: [[1, 3, 4], [4, 15, 2], [16, 16, 0]],
    }
    back = json.loads(json.dumps(cfg))[schedule.KEY]
    # vLLM's scheduler expands it per batch size (up to max_num_seqs = 20): k = 0 from 16 on
    lookup = module.build_dynamic_sd_schedule_lookup(back, 20, cfg["num_speculative_tokens"])
    assert lookup[1:] == [4] * 3 + [2] * 12 + [0] * 5
    for bad in ([[2, 3, 1]], [[1, 3, 1], [3, 5, 1]]):  # both rule sets refuse the same
        with pytest.raises(ValueError):
            module.validate_and_normalize_dynamic_sd_schedule(bad)
        with pytest.raises(ValueError):
            schedule.validate(bad)
    with pytest.raises(ValueError, match="do not speculate"):
        schedule.config({"method": "ngram"}, [[1, 8, 0]])


def test_spec_plan_exports_the_schedule_with_a_zero_range(cli_runner, tmp_path):
    # the --batch case above: k = 1 at batch 1 and 2, k = 0 (plain) at 4 -> [[1, 3, 1], [4, 4, 0]]
    target = tmp_path / "spec.json"
    base = tmp_path / "base.json"
    base.write_text('{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}')
    args = [
        "--decode-ms",
        "10",
        "--verify-ms",
        "12,14@2,3",
        "--draft-ms",
        "1",
        "--accept-rate",
        "0.55",
        "--steps",
        "1",
        "--batch",
        "1,2,4",
        "--extrapolate",
        "--export-vllm",
        str(target),
    ]
    assert "--speculative-config-base" in spec_plan(cli_runner, *args, code=2)
    out = spec_plan(cli_runner, *args, "--speculative-config-base", str(base), "--json")
    written = json.loads(target.read_text())
    assert written == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 1,
        schedule.KEY: [[1, 3, 1], [4, 4, 0]],
    }
    assert out["export_vllm"]["written"] and out["export_vllm"]["config"] == written
    text = spec_plan(cli_runner, *args, "--speculative-config-base", '{"method": "ngram"}')
    assert f"export-vllm: wrote {target}" in text and "[[1, 3, 1], [4, 4, 0]]" in text
    assert "--speculative-config-base" in spec_plan(
        cli_runner, *args, "--speculative-config-base", '{"num_speculative_tokens": 2}', code=2
    )


def test_recommend_spec_steps_says_do_not_speculate_in_json_text_and_the_profile(cli_runner, tmp_path):
    from nccl_tune.cli import cli
    from nccl_tune.live import profile

    # the same inputs as the first case: plain 100 tok/s beats k = 1 (52.0) and k = 2 (34.4)
    # under the baseline, and still under the recommended cell (every forward saves the same
    # comm time at these sizes, so plain decoding stays ahead)
    args = [
        "recommend",
        "--layers",
        "61",
        "--topology",
        "pcie-shm",
        "--spec-steps",
        "1-2",
        "--decode-ms",
        "10",
        "--verify-ms",
        "30@3",
        "--draft-ms",
        "1",
        "--accept-len",
        "1.1@2",
    ]
    out = json.loads(cli_runner.invoke(cli, [*args, "--json"]).output)["spec"]
    assert out["best_k_baseline"] == 0 and out["speculate_baseline"] is False
    assert out["baseline"][0]["tok_s"] == pytest.approx(100.0)
    assert [p["tok_s"] for p in out["baseline"]] == pytest.approx([100.0, 51.98, 34.375], abs=0.01)
    assert out["speculate_recommended"] is False
    target = tmp_path / "p.env"
    text = cli_runner.invoke(cli, [*args, "--export", str(target), "--force"]).output
    assert "decision under the baseline: do not speculate" in text
    said = profile.load_profile(str(target)).provenance["speculative"]
    assert said.startswith("do not speculate: plain decoding is fastest")
