"""The step planner on real deployments: the public Kimi-K2.5 report end to end, MoE verify,
acceptance conventions, reconciliation, --fit, candidates, --batch, and public step sweeps."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from nccl_tune.spec import accept as sa
from nccl_tune.spec import cycle as sd
from nccl_tune.spec import options as so
from nccl_tune.spec import verify as sv
from nccl_tune.spec.planner import PlanError, PlanRequest, plan

SWEEPS = Path(__file__).resolve().parent / "fixtures" / "spec_sweeps"
REPORT = [
    "--decode-ms",
    "11.26",
    "--verify-ms",
    "21.7@6",
    "--draft-ms",
    "0.138",
    "--other-ms",
    "0.29",
    "--accepted-drafts",
    "0.95@5",
    "--moe-experts",
    "384",
    "--moe-topk",
    "8",
    "--steps",
    "1-10",
]


def spec_plan(cli_runner, *args) -> dict:
    from nccl_tune.cli import cli

    result = cli_runner.invoke(cli, ["spec-plan", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def row(out: dict, text: str) -> dict:
    return next(r for r in out["consistency"] if r["input"] == text)


# ---------------------------------------------------------------- the public report, end to end


def test_the_report_case_end_to_end(cli_runner):
    out = spec_plan(cli_runner, *REPORT)
    assert out["plain_tok_s"] == pytest.approx(88.8, rel=0.01)
    assert 2 in out["candidates"] and len(out["candidates"]) <= 4
    assert out["verify_model"]["kind"] == "moe"
    assert "bonus token not counted" in out["acceptance"]["convention"]
    plans = {p["k"]: p for p in out["plans"]}
    # the verify curve meets both given points: 1 token (decode) and 6 tokens (5 steps)
    assert plans[5]["cycle_ms"] == pytest.approx(0.69 + 21.70 + 0.29)
    assert plans[0]["cycle_ms"] == pytest.approx(11.26)  # no --other-ms, no verify time
    assert not plans[5]["extrapolated"] and plans[6]["extrapolated"]
    for p in out["plans"]:
        assert set(p) >= {"k", "tau", "cycle_ms", "tok_s", "extrapolated"}
    assert f"--steps 0,{','.join(map(str, out['candidates']))}" in out["validate_command"]


def test_the_report_flags_the_accept_length_a_measured_tok_s_contradicts(cli_runner):
    out = spec_plan(cli_runner, *REPORT[:8], *REPORT[10:], "--accept-len", "1.62@5", "--measured-tok-s", "86.7@5")
    r = row(out, "--measured-tok-s 86.7@5")
    assert r["agrees"] is False and r["predicted"] == pytest.approx(71.4, abs=0.1)
    need = r["would_have_to"][0]
    assert need["input"].startswith("accept length at k = 5") and need["value"] == pytest.approx(1.97, abs=0.01)
    # with the profiler's count as well: it agrees with the measurement, 1.62 is flagged
    both = spec_plan(cli_runner, *REPORT, "--accept-len", "1.62@5", "--measured-tok-s", "86.7@5")
    assert row(both, "--accept-len 1.62@5")["agrees"] is False
    assert row(both, "--measured-tok-s 86.7@5")["agrees"] is True
    assert both["acceptance"]["points"][0]["source"] == "--accepted-drafts 0.95@5"


def test_the_report_infers_sglang_accept_len_over_k_plus_1(cli_runner):
    out = spec_plan(cli_runner, *REPORT[:8], *REPORT[10:], "--accept-len", "1.62@5", "--sglang-accept-rate", "0.27@5")
    r = row(out, "--sglang-accept-rate 0.27@5")
    assert r["agrees"] is True and "L / (k + 1)" in r["note"]
    variant, predicted = sa.infer_sglang_convention(1.62, 0.27, 5)
    assert variant == sa.SGLANG_RATE_TOTAL and predicted[sa.SGLANG_RATE_DRAFTS] == pytest.approx(0.124)
    # the inferred convention carries over to a rate at another K
    acc = so.parse_acceptance(accept_len=("1.62@5",), sglang_accept_rate=("0.27@5", "0.4@2"))
    assert [(p.k, round(p.accept_len, 6)) for p in acc.points] == [(5, 1.62), (2, 1.2)]


def test_text_output_labels_every_column_and_the_best_row(cli_runner):
    from nccl_tune.cli import cli

    text = cli_runner.invoke(cli, ["spec-plan", *REPORT, "--steps", "6-8"]).output
    header = next(line for line in text.splitlines() if line.startswith("k "))
    assert header.split()[-1] == "note"
    # 6-8 steps all lose to plain decoding (79.3 tok/s and less against 88.8): say so
    assert "EXTRAPOLATED (rows marked *" in text and "decision: do not speculate" in text
    assert "--other-ms is charged to speculative cycles only" in text
    slow_plain = ["--decode-ms", "30", *REPORT[2:]]  # plain 33.3 tok/s: k = 6 wins
    text = cli_runner.invoke(cli, ["spec-plan", *slow_plain, "--steps", "6-8"]).output
    assert "decision: speculate with k = 6" in text and "its row is EXTRAPOLATED" in text


# ---------------------------------------------------------------- models against simulation


@pytest.mark.parametrize("tokens,experts,topk", [(1, 384, 8), (3, 384, 8), (6, 64, 6), (20, 16, 2)])
def test_distinct_experts_formula_matches_simulated_routing(tokens, experts, topk):
    expected = sv.expected_experts(tokens, experts, topk)
    simulated = sv.simulate_distinct_experts(tokens, experts, topk, 4000, seed=tokens)
    assert simulated == pytest.approx(expected, rel=0.02)


def test_position_dependent_tau_from_lengths_meets_every_point_and_simulation():
    points = [(2, 1.89), (4, 2.08), (7, 2.2)]
    reach, notes = sa.reach_from_points(points, 10)
    assert not notes and all(b <= a + 1e-12 for a, b in zip(reach, reach[1:]))
    for k, length in points:
        assert sa.tau_from_reach(reach, k) == pytest.approx(length, abs=1e-6)
    conditional = [reach[0]] + [b / a for a, b in zip(reach, reach[1:])]
    mean = sa.simulate_cycles(conditional[:7], 60000, seed=4)
    assert mean == pytest.approx(sa.tau_from_reach(reach, 7), abs=0.02)
    one, _ = sa.reach_from_points([(5, 1.95)], 5)
    rate = sa.iid_rate_from_accept_len(1.95, 5)
    assert one == pytest.approx([rate**i for i in range(1, 6)], abs=1e-6)


def test_moe_fit_is_exact_through_two_points_and_comm_moves_every_n():
    pts = [(1, 11.26), (6, 21.7)]
    curve = sv.fit_curve(sv.MOE, pts, experts=384, topk=8)
    assert curve(1) == pytest.approx(11.26) and curve(6) == pytest.approx(21.7)
    # concave: the first extra tokens cost most (new experts), linear would under-price 2-3
    linear = sv.measured_curve(pts)
    assert curve(2) > linear(2) and curve(3) > linear(3)
    assert curve(3) - curve(2) > curve(6) - curve(5)
    # a profile that lowers comm(n) lowers the verify at the points' fit, and differently per n
    slow = sv.fit_curve(sv.MOE, pts, experts=384, topk=8, comm=lambda n: 4.0 + 0.2 * n)
    fast = sv.fit_curve(sv.MOE, pts, experts=384, topk=8, comm=lambda n: 1.0 + 0.05 * n)
    saving = {n: (slow(n) - slow.comm(n) + fast.comm(n)) for n in (1, 3, 6)}
    assert saving[3] < slow(3) and len({round(slow(n) - saving[n], 6) for n in (1, 3, 6)}) == 3
    dense = sv.fit_curve(sv.DENSE, [(1, 10.0), (2, 11.0), (4, 13.0)])
    assert dense(3) == pytest.approx(12.0) and dense.residual_ms == pytest.approx(0.0, abs=1e-9)


def test_measured_points_are_never_silently_extrapolated(cli_runner):
    out = spec_plan(
        cli_runner,
        "--decode-ms",
        "10",
        "--verify-ms",
        "11,12@2,3",
        "--draft-ms",
        "0.5",
        "--accept-rate",
        "0.7",
        "--steps",
        "1-5",
    )
    assert [p["k"] for p in out["plans"]] == [0, 1, 2] and out["left_out_steps"] == [3, 4, 5]
    ext = spec_plan(
        cli_runner,
        "--decode-ms",
        "10",
        "--verify-ms",
        "11,12@2,3",
        "--draft-ms",
        "0.5",
        "--accept-rate",
        "0.7",
        "--steps",
        "1-5",
        "--extrapolate",
    )
    assert [p["extrapolated"] for p in ext["plans"]] == [False, False, False, True, True, True]


def test_other_ms_is_not_charged_to_plain_decoding(cli_runner):
    base = [
        "--decode-ms",
        "10",
        "--verify-ms",
        "12@4",
        "--draft-ms",
        "0.5",
        "--accept-rate",
        "0.7",
        "--moe-experts",
        "64",
        "--moe-topk",
        "4",
        "--steps",
        "1-3",
    ]
    a, b = spec_plan(cli_runner, *base), spec_plan(cli_runner, *base, "--other-ms", "2")
    assert a["plain_tok_s"] == b["plain_tok_s"] == pytest.approx(100.0)
    assert b["plans"][2]["cycle_ms"] == pytest.approx(a["plans"][2]["cycle_ms"] + 2)


# ---------------------------------------------------------------- --fit and --batch


def test_fit_verify_shape_and_acceptance(cli_runner):
    base = [
        "--decode-ms",
        "11.26",
        "--verify-ms",
        "21.7@6",
        "--draft-ms",
        "0.138",
        "--other-ms",
        "0.29",
        "--moe-experts",
        "384",
        "--moe-topk",
        "8",
        "--steps",
        "1-6",
    ]
    acc = spec_plan(cli_runner, *base, "--measured-tok-s", "86.7@5", "--measured-tok-s", "93.9@2", "--fit")
    assert acc["fit"]["fitted"] == "acceptance"
    assert acc["acceptance"]["points"][1]["accept_len"] == pytest.approx(86.7 * 22.68 / 1000)
    shape = spec_plan(cli_runner, *base, "--accepted-drafts", "0.95@5", "--measured-tok-s", "93.9@2", "--fit")
    assert shape["fit"]["fitted"] == "verify curve" and "FITTED" in " ".join(shape["notes"])
    assert [p[0] for p in shape["verify_model"]["points"]] == [1, 3, 6]


def test_batch_plans_each_batch_size(cli_runner):
    out = spec_plan(
        cli_runner,
        "--decode-ms",
        "10",
        "--verify-ms",
        "12,20,40@4,16,64",
        "--draft-ms",
        "0.4",
        "--accept-rate",
        "0.7",
        "--moe-experts",
        "64",
        "--moe-topk",
        "4",
        "--steps",
        "1-4",
        "--batch",
        "1,8",
    )
    assert [b["batch"] for b in out["batches"]] == [1, 8]
    b8 = out["batches"][1]
    curve = sv.fit_curve(sv.MOE, [(1, 10), (4, 12), (16, 20), (64, 40)], experts=64, topk=4)
    assert b8["plans"][1]["verify_ms"] == pytest.approx(curve(16))
    assert b8["plans"][0]["cycle_ms"] == pytest.approx(curve(8))
    assert out["best_k"] == out["batches"][0]["best_k"]
    # MoE: 8 sequences already touch most of the 64 experts, so extra draft tokens are cheap;
    # dense: each extra token costs the same, 8 times over at batch 8, so k cannot rise
    dense = spec_plan(
        cli_runner,
        "--decode-ms",
        "10",
        "--verify-ms",
        "12,20,40@4,16,64",
        "--draft-ms",
        "0.4",
        "--accept-rate",
        "0.7",
        "--verify-model",
        "dense",
        "--steps",
        "1-4",
        "--batch",
        "1,8",
    )
    assert dense["batches"][1]["best_k"] <= dense["batches"][0]["best_k"]
    assert b8["best_k"] >= out["batches"][0]["best_k"]


def test_bad_input_names_the_option(cli_runner):
    from nccl_tune.cli import cli

    for args, needle in (
        (["--decode-ms", "10", "--verify-ms", "12@4", "--accept-rate", "0.5"], "--draft-ms"),
        (["--decode-ms", "10", "--draft-ms", "1", "--accept-rate", "0.5"], "--verify-ms"),
        (
            ["--verify-ms", "12@4", "--draft-ms", "1", "--accept-rate", "0.5", "--moe-experts", "8", "--moe-topk", "2"],
            "--decode-ms",
        ),
        (
            [
                "--decode-ms",
                "10",
                "--verify-ms",
                "12@4",
                "--draft-ms",
                "1",
                "--accept-rate",
                "0.5",
                "--moe-experts",
                "8",
            ],
            "--moe-topk",
        ),
        (["--decode-ms", "10", "--measured-tok-s", "x@2", "--fit", "--accept-rate", "0.5"], "--measured-tok-s"),
    ):
        result = cli_runner.invoke(cli, ["spec-plan", *args])
        assert result.exit_code == 2 and needle in result.output, (args, result.output)


# ---------------------------------------------------------------- candidates hold the truth


def _truth(rng):
    experts = rng.choice([64, 128, 256, 384])
    topk = rng.choice([2, 4, 8])
    curve = sv.VerifyCurve(
        sv.MOE, ((1, 1.0),), rng.uniform(5, 15), rng.uniform(0.02, 0.4), experts, min(topk, experts), covers_all=True
    )
    conditional = sorted((rng.uniform(0.4, 0.95) for _ in range(8)), reverse=True)
    reach = sa.reach_from_conditional(conditional)
    return curve, reach, rng.uniform(0.05, 1.0), rng.uniform(0.0, 1.0)


@pytest.mark.parametrize("seed", range(40))
def test_candidates_contain_the_true_best_under_input_noise(seed):
    rng = random.Random(seed)
    curve, reach, draft, other = _truth(rng)
    true = sd.plan_steps(range(0, 9), lambda k: sa.tau_from_reach(reach, k), draft, curve, other, curve(1))
    true_best = sd.best_step(true[1:]).k

    def noisy(x):
        return x * (1 + rng.uniform(-0.02, 0.02))

    points = [(n, noisy(curve(n))) for n in (2, 5, 9)]
    per_pos = ",".join(f"{noisy(p) if i else p:.6f}" for i, p in enumerate(reach))
    acc = so.parse_acceptance(
        accept_per_pos=",".join(f"{v:.6f}" for v in sorted((float(x) for x in per_pos.split(",")), reverse=True))
    )
    req = PlanRequest(
        list(range(1, 9)), acc, noisy(curve(1)), points, False, noisy(draft), other, "moe", curve.experts, curve.topk
    )
    result = plan(req)
    cands = result.batches[0].candidates
    assert true_best in cands, (seed, true_best, cands)
    assert len(cands) < 6  # an answer, not every step count


# ---------------------------------------------------------------- public step sweeps


def load_sweep(name: str) -> list[dict]:
    with open(SWEEPS / name, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


SWEEP_FILES = [
    "vllm_issue20780_llama31_8b_eagle1.csv",
    "vllm_issue20780_llama31_8b_eagle3.csv",
    "vllm_pr16035_llama3_8b_eagle.csv",
    "kimi_k25_eagle3_pcie.csv",
]


def _sweep_cases():
    import itertools

    for name in SWEEP_FILES:
        ks = [int(r["k"]) for r in load_sweep(name) if r["k"] != "0"]
        for pair in itertools.combinations(ks, 2):
            yield name, pair


@pytest.mark.parametrize("name,pair", list(_sweep_cases()))
def test_public_sweep_best_is_a_candidate_from_plain_accept_lengths_and_two_points(name, pair):
    # given plain decode time, the accept lengths and tok/s at two step counts (no timings)
    rows = load_sweep(name)
    plain = next(float(r["tok_s"]) for r in rows if r["k"] == "0")
    spec = [r for r in rows if r["k"] != "0"]
    measured_best = int(max(spec, key=lambda r: float(r["tok_s"]))["k"])
    if name.startswith("kimi"):  # the report's per-cycle profiler count (bonus not counted)
        acc = so.parse_acceptance(
            accepted_drafts=tuple(f"{float(r['accept_len']) - 1:.4f}@{r['k']}" for r in spec if r["accept_len"])
        )
    else:
        acc = so.parse_acceptance(accept_len=tuple(f"{r['accept_len']}@{r['k']}" for r in spec))
    tok = {int(r["k"]): float(r["tok_s"]) for r in spec}
    steps = sorted(tok) if len(tok) > 2 else list(range(1, 7))
    req = PlanRequest(steps, acc, 1000.0 / plain, measured=[(k, tok[k]) for k in pair], fit=True)
    result = plan(req).to_dict()
    assert measured_best in result["candidates"], (pair, result["candidates"])
    assert len(result["candidates"]) <= min(5, len(steps))
    assert result["fit"]["fitted"] == "cycle growth"
    assert all(r["agrees"] for r in result["consistency"] if r["input"].startswith("--measured"))


def test_public_sweep_kimi_cycle_fit_from_two_of_its_points_predicts_the_third(cli_runner):
    # plain 88.8, accept 0.95 + 1 at 5 steps, tok/s at 2 and 5 steps: no timings at all
    out = spec_plan(
        cli_runner,
        "--decode-ms",
        f"{1000 / 88.8:.4f}",
        "--accepted-drafts",
        "0.95@5",
        "--measured-tok-s",
        "93.9@2",
        "--measured-tok-s",
        "86.7@5",
        "--fit",
    )
    assert out["best_k"] in out["candidates"] and 2 in out["candidates"]
    assert len(out["candidates"]) <= 4
    with pytest.raises(PlanError):
        plan(PlanRequest([1, 2], so.parse_acceptance(accept_rate=0.5), 10.0))  # nothing to price


# ---------------------------------------------------------------- one planner for every command


def _loop_runs():
    # a loop's own measurements by step count (what integration.spec_loop reports)
    return {
        0: {"step_ms": 2.0, "verify_ms": 1.9, "tok_s": 500.0},
        1: {
            "verify_ms": 2.2,
            "draft_ms": 0.5,
            "other_ms": 0.1,
            "accept_len": 1.8,
            "tok_s": 570.0,
            "accept_per_pos": [0.8],
        },
        2: {
            "verify_ms": 2.4,
            "draft_ms": 1.0,
            "other_ms": 0.1,
            "accept_len": 2.4,
            "tok_s": 600.0,
            "accept_per_pos": [0.8, 0.6],
        },
        3: {
            "verify_ms": 2.7,
            "draft_ms": 1.5,
            "other_ms": 0.1,
            "accept_len": 2.7,
            "tok_s": 590.0,
            "accept_per_pos": [0.8, 0.6, 0.3],
        },
    }


def test_validate_spec_plan_and_the_bench_share_the_planner(cli_runner):
    from integration import validate as lib
    from nccl_tune.spec.planner import plan_from_loop

    runs = _loop_runs()
    loop = plan_from_loop(runs).to_dict()
    # plain decoding's time (2.0 ms) is the verify curve's 1-token point, then the k + 1 verifies
    assert loop["verify_model"]["points"] == [[1, 2.0], [2, 2.2], [3, 2.4], [4, 2.7]]
    cli = spec_plan(
        cli_runner,
        "--decode-ms",
        "2.0",
        "--verify-ms",
        "2.2,2.4,2.7@2,3,4",
        "--draft-ms",
        "0.5",
        "--other-ms",
        "0.1",
        "--accept-per-pos",
        "0.8,0.6,0.3",
        "--steps",
        "1-3",
    )
    assert [p["tok_s"] for p in loop["plans"]] == pytest.approx([p["tok_s"] for p in cli["plans"]])
    assert loop["candidates"] == cli["candidates"]
    measured = {
        (label, k): {"status": "ok", "runs_tok_s": [r["tok_s"]] * 3, **r}
        for label in ("baseline", "profile")
        for k, r in runs.items()
    }
    planned = lib.plan_steps_from_runs(measured, [0, 1, 2, 3], {"baseline": 2, "profile": 2})
    assert planned["baseline"]["candidates"] == loop["candidates"]
    assert planned["baseline"]["measured_best_in_candidates"] == (2 in loop["candidates"])
    assert "planner on the baseline runs" in planned["baseline"]["note"]
    # SGLang runs report no timings: no plan, nothing made up
    sglang = {key: {**m, "verify_ms": None} for key, m in measured.items()}
    assert lib.plan_steps_from_runs(sglang, [0, 1, 2, 3], {"baseline": 2}) == {}


def test_recommend_plans_with_the_same_planner(cli_runner):
    from nccl_tune.cli import cli

    args = [
        "--decode-ms",
        "15.9",
        "--verify-ms",
        "16.4,17.5@2,4",
        "--draft-ms",
        "1.4",
        "--other-ms",
        "0.3",
        "--accept-len",
        "2.9@4",
        "--steps",
        "1-3",
    ]
    alone = spec_plan(cli_runner, *args)
    rec = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-shm", "--json", "--spec-steps", "1-3", *args[:-2]]
    )
    assert rec.exit_code == 0, rec.output
    spec = json.loads(rec.output)["spec"]
    assert [p["tok_s"] for p in spec["baseline"]] == pytest.approx([p["tok_s"] for p in alone["plans"]])
    assert spec["baseline"][0]["cycle_ms"] == pytest.approx(15.9)  # no --other-ms on plain decoding
    assert spec["candidates_baseline"] == alone["candidates"]
    # the profile's saving enters through comm(n) at every n: plain and every verify get faster
    assert all(r["verify_ms"] < b["verify_ms"] for r, b in zip(spec["recommended"], spec["baseline"]))
    assert spec["validate_command"].startswith("nccl-tune validate --profile ")


def test_candidates_from_the_inputs_intervals(cli_runner):
    base = [
        "--verify-ms",
        "21.7+-0.5@6",
        "--draft-ms",
        "0.138",
        "--other-ms",
        "0.29",
        "--moe-experts",
        "384",
        "--moe-topk",
        "8",
        "--steps",
        "1-6",
    ]
    narrow = spec_plan(cli_runner, "--decode-ms", "11.26+-0.01", "--accepted-drafts", "0.95+-0.01@5", *base)
    wide = spec_plan(cli_runner, "--decode-ms", "11.26+-0.5", "--accepted-drafts", "0.95+-0.3@5", *base)
    for out in (narrow, wide):
        assert out["uncertainty"].startswith("the inputs' intervals")
        for p in out["plans"]:
            lo, hi = out["tok_s_intervals"][str(p["k"])]
            assert lo <= p["tok_s"] <= hi
    assert set(narrow["candidates"]) < set(wide["candidates"])
    assert 2 in narrow["candidates"]
    exact = spec_plan(
        cli_runner, "--decode-ms", "11.26", "--accepted-drafts", "0.95@5", *base[2:], "--verify-ms", "21.7@6"
    )
    assert exact["tok_s_intervals"] is None and exact["uncertainty"] == "stated relative error"
    assert so.split_interval("1.62\u00b10.05@5", "x") == ("1.62@5", [0.05])
    with pytest.raises(ValueError, match="--decode-ms"):
        so.scalar("11+-x", "--decode-ms")


# ---------------------------------------------------------------- rules the planner decides


def _req(**kwargs) -> PlanRequest:
    base = {"steps": [1], "acceptance": so.parse_acceptance(accept_rate=0.7), "draft_ms": 0.5}
    return PlanRequest(**{**base, **kwargs})


def test_plain_decoding_row_and_the_draft_step_per_batch_size():
    # decode 9 ms of its own; the verify at 1 token is 10 ms, at 4 tokens 16 ms (interp)
    result = plan(_req(decode_ms=9.0, verify_points=[(1, 10.0), (4, 16.0)], batches=[1, 2]))
    one, two = result.batches
    # batch 1: plain decoding is its own decode time (9 ms, not the 10 ms verify at 1 token)
    assert (one.plain.tau, one.plain.cycle_ms, one.plain.tok_s) == (1.0, 9.0, pytest.approx(1000 / 9.0))
    # batch 2: a forward of 2 tokens over 2 sequences, 10 + (16 - 10) x (2 - 1) / (4 - 1) = 12 ms
    assert (two.plain.tau, two.plain.cycle_ms) == (1.0, pytest.approx(12.0))
    # and the draft step grows as the target's forward does: 0.5 x 12 / 10 = 0.6 ms
    assert one.plans[1].draft_ms == pytest.approx(0.5) and two.plans[1].draft_ms == pytest.approx(0.6)
    # no --fit asked: no note about what --fit did not fit
    assert not any("--fit" in note for note in result.notes)
    fit = plan(_req(decode_ms=9.0, verify_points=[(1, 10.0), (4, 16.0)], fit=True))
    assert "--fit: nothing was fitted (give --measured-tok-s X@K at some K >= 1)" in fit.notes


def test_moe_model_needs_both_experts_and_topk():
    for experts, topk in ((8, None), (None, 2)):
        with pytest.raises(PlanError, match="--moe-experts E and --moe-topk K"):
            plan(_req(decode_ms=10.0, verify_points=[(4, 12.0)], verify_model="moe", experts=experts, topk=topk))


def test_saturation_starts_from_the_first_measured_forward_without_a_decode_time():
    # no plain decoding time: the saturation line's one-forward time is the curve at its
    # first point, 10 ms at 2 tokens (the default knee 295 tokens)
    result = plan(_req(steps=[1, 2], verify_points=[(2, 10.0), (3, 12.0)]))
    assert "saturation: at least 10.000 ms x n / 295" in result.verify_model["description"]
    # and plain decoding is not priced (not left out): the plan ranks k >= 1 only
    assert result.batches[0].plain is None and result.batches[0].left_out == []


def test_flat_compute_verify_names_its_slope():
    flat = plan(_req(decode_ms=10.0, compute_per_token_ms=0.0))
    assert "plain decoding's compute, flat in tokens" in flat.verify_model["description"]
    sloped = plan(_req(decode_ms=10.0, compute_per_token_ms=0.25))
    assert "plain decoding's compute + 0.25 ms per extra token" in sloped.verify_model["description"]
    # k = 1 verifies 2 tokens: 10 + 0.25 x (2 - 1) = 10.25 ms (1 token: plain decoding's 10 ms)
    assert sloped.batches[0].plans[1].verify_ms == pytest.approx(10.25)
    # with comm(n) = 1 + 0.5 n ms apart: compute 10 - 1.5 = 8.5 ms, so 2 tokens take
    # 8.5 + 0.25 + comm(2) = 8.5 + 0.25 + 2.0 = 10.75 ms
    comm = plan(_req(decode_ms=10.0, compute_per_token_ms=0.25, comm=lambda n: 1.0 + 0.5 * n))
    assert comm.batches[0].plans[1].verify_ms == pytest.approx(10.75)
    # a stated model for every token count: no row is extrapolated
    assert not any(p.extrapolated for r in (flat, sloped) for p in r.batches[0].plans)


def test_batch_without_timings_is_refused_from_batch_two():
    req = _req(decode_ms=10.0, draft_ms=None, measured=[(1, 120.0), (2, 130.0)], fit=True, batches=[1, 2])
    with pytest.raises(PlanError, match="--batch needs verify timings"):
        plan(req)


def test_cycle_fit_through_two_points_meets_them_and_marks_the_rest():
    # a line through the two implied cycle times passes through both: the plan's tok/s at
    # k = 2 and k = 5 are the measured 93.9 and 86.7 whatever the acceptance; k = 2 and 5
    # (the fitted range's ends) are not extrapolated, k = 1 and 6 are
    req = PlanRequest(
        [1, 2, 3, 4, 5, 6],
        so.parse_acceptance(accepted_drafts=("0.95@5",)),
        1000 / 88.8,
        measured=[(2, 93.9), (5, 86.7)],
        fit=True,
    )
    plans = {p.k: p for p in plan(req).batches[0].plans}
    assert plans[2].tok_s == pytest.approx(93.9) and plans[5].tok_s == pytest.approx(86.7)
    assert plans[0].tok_s == pytest.approx(88.8)
    assert [k for k, p in sorted(plans.items()) if p.extrapolated] == [1, 6]


def test_fitted_accept_length_is_clamped_to_one_and_k_plus_one():
    # a flat 10 ms verify, no draft or other time: the implied accept length is tok/s x 10 / 1000
    flat = {"decode_ms": 10.0, "verify_points": [(1, 10.0), (2, 10.0), (3, 10.0)], "draft_ms": 0.0, "fit": True}
    none = so.parse_acceptance()
    low = plan(_req(**flat, acceptance=none, measured=[(1, 50.0)]))  # 0.5 -> at least 1 (the bonus token)
    assert low.fit["accept_len"] == {"1": 1.0}
    high = plan(_req(**flat, acceptance=none, steps=[2], measured=[(2, 400.0)]))  # 4.0 -> at most k + 1 = 3
    assert high.fit["accept_len"] == {"2": 3.0}


def test_measure_next_is_the_best_step_count_when_the_splits_disagree_there():
    from nccl_tune.spec.planner import _measure_next

    def row(k, tok_s):
        return sd.StepPlan(k, 1.0, None, None, 0.0, 1.0, tok_s)

    one_best = [row(0, 100.0), row(1, 120.0), row(2, 110.0), row(3, 100.0)]
    two_best = [row(0, 100.0), row(1, 110.0), row(2, 120.0), row(3, 100.0)]
    wide = {0: (100.0, 100.0), 1: (100.0, 140.0), 2: (90.0, 130.0), 3: (100.0, 100.0)}
    # measured at k = 3; the best k >= 1 is k = 1, whose range 100..140 is wider than
    # 2 x 5% (140 > 110): measure it (k = 2's range is as wide, but it is not the best)
    assert _measure_next(one_best, [1, 2, 3], wide, 3, 0.05) == 1
    # measured at k = 1, the best is k = 2 with a wide range: measure k = 2 (not k = 3, the farthest)
    assert _measure_next(two_best, [1, 2, 3], wide, 1, 0.05) == 2
    # a range of exactly twice the stated error (100..150 at 25%) is not more than it: the farthest
    assert _measure_next(two_best, [1, 2, 3], {**wide, 2: (100.0, 150.0)}, 1, 0.25) == 3
    # a narrow range at the best (118..122 < 1.1 x 118): the candidate farthest from the measured k
    assert _measure_next(two_best, [1, 2, 3], {**wide, 2: (118.0, 122.0)}, 1, 0.05) == 3
    # the best is the measured k itself: the other candidate farthest from it
    assert _measure_next(one_best, [1, 2, 3], wide, 1, 0.05) == 3
    assert _measure_next(one_best, [2, 3], {**wide, 1: (118.0, 122.0)}, 3, 0.05) == 2
    # only the measured k (and plain decoding) among the candidates: nothing to measure next
    assert _measure_next(one_best, [0, 3], wide, 3, 0.05) is None


def test_intervals_are_the_two_and_a_half_percent_points_of_the_draws(monkeypatch):
    from types import SimpleNamespace

    from nccl_tune.spec import planner

    def fake_plan(draws):
        values = iter(range(draws - 1, -1, -1))  # draw i gives tok/s draws - 1 - i: 0..draws-1 in all

        def one(_req):
            return SimpleNamespace(batches=[SimpleNamespace(batch=1, plans=[SimpleNamespace(k=0, tok_s=next(values))])])

        return one

    req = _req(decode_ms=10.0, verify_points=[(4, 12.0)], halves={"decode_ms": 0.5})
    # 400 draws by default (the JSON's "uncertainty" says "95% of 400 draws"), valued
    # 0..399: 2.5% of them (10) below the low end, 10 above the high end
    monkeypatch.setattr(planner, "plan", fake_plan(400))
    assert planner._intervals(req) == {1: {0: (10, 389)}}
    # 20 draws: 2.5% is half a draw each side, rounded to none: the lowest and the highest
    monkeypatch.setattr(planner, "plan", fake_plan(20))
    assert planner._intervals(req, draws=20) == {1: {0: (0, 19)}}


def test_one_point_span_names_the_best_k_at_each_end():
    # per position 0.8, 0.7, 0.354: tau(1) = 1.8, tau(2) = 2.5, tau(3) = 2.854; measured
    # 150 tok/s at k = 1: a cycle of 1000 x 1.8 / 150 = 12 ms; plain decoding 10 ms
    req = PlanRequest(
        [1, 2, 3], so.parse_acceptance(accept_per_pos="0.8,0.7,0.354"), 10.0, measured=[(1, 150.0)], fit=True
    )
    result = plan(req)
    span = result.batches[0].span
    # all per-step (10 + 2k ms): k = 2 gives 2500 / 14 = 178.57, k = 3 2854 / 16 = 178.38;
    # the next split (per step 2 x 39/40 = 1.95: 10.05 + 1.95k) already favours k = 3
    # (2854 / 15.9 = 179.50 against 2500 / 13.95 = 179.21); all fixed (12 ms): k = 3
    assert (span["best_k_all_per_step"], span["best_k_all_fixed"]) == (2, 3)
    # the plan and the fit shown are the middle split: per step (2 + 0) / 2 = 1 ms, fixed 12 - 1 = 11 ms
    assert (result.fit["cycle_ms_per_step"], result.fit["cycle_ms_fixed"]) == (pytest.approx(1.0), pytest.approx(11.0))


def test_fit_implies_the_verify_time_a_measured_tok_s_leaves():
    from dataclasses import replace

    # tau(2) = 2.0 at 100 tok/s: a 20 ms cycle, less 2 x 0.5 ms of drafts: a 19 ms verify of 3 tokens
    req = _req(
        steps=[2],
        acceptance=so.parse_acceptance(accept_len=("2.0@2",)),
        decode_ms=10.0,
        verify_points=[(2, 11.0)],
        verify_model="dense",
        measured=[(2, 100.0)],
        fit=True,
    )
    assert plan(req).fit["implied_points"] == [[3, pytest.approx(19.0)]]
    # a small model: 2000 tok/s leave 1000 x 2 / 2000 - 2 x 0.05 = 0.9 ms for the verify, a time;
    # 40000 tok/s would leave 0.05 - 0.1 < 0: no verify time, nothing fitted
    small = {"decode_ms": 0.4, "verify_points": [(2, 0.45)], "draft_ms": 0.05}
    assert plan(replace(req, **small, measured=[(2, 2000.0)])).fit["implied_points"] == [[3, pytest.approx(0.9)]]
    assert plan(replace(req, **small, measured=[(2, 40000.0)])).fit is None


def test_interval_draws_keep_the_accept_length_within_one_and_k_plus_one(monkeypatch):
    from types import SimpleNamespace

    from nccl_tune.spec import planner

    drawn = []

    def fake_plan(draw):
        drawn.extend(p.accept_len for p in draw.acceptance.points)
        return SimpleNamespace(batches=[])

    monkeypatch.setattr(planner, "plan", fake_plan)
    # an accept length counts the bonus token: at k = 2 it lies in [1, 3] (accept.py's
    # AcceptancePoint check); draws of 2.9 +- 0.5 beyond 3 count as 3, of 1.2 +- 0.5 below 1 as 1
    for text, end in (("2.9+-0.5@2", 3.0), ("1.2+-0.5@2", 1.0)):
        drawn.clear()
        planner._intervals(_req(steps=[2], acceptance=so.parse_acceptance(accept_len=(text,))), draws=400)
        assert len(drawn) == 400 and all(1.0 <= a <= 3.0 for a in drawn) and end in drawn


def test_a_loop_without_plain_decoding_is_refused():
    from nccl_tune.spec.planner import plan_from_loop

    runs = _loop_runs()
    del runs[0]
    with pytest.raises(PlanError, match=r"plain decoding \(k = 0\) was not measured"):
        plan_from_loop(runs)


def test_interval_draws_of_times_stay_positive(monkeypatch):
    from dataclasses import replace
    from types import SimpleNamespace

    from nccl_tune.spec import planner

    drawn = []

    def fake_plan(draw):
        drawn.append((draw.decode_ms, draw.verify_points[0][1], draw.decode_points[0][1], draw.draft_ms, draw.other_ms))
        return SimpleNamespace(batches=[])

    monkeypatch.setattr(planner, "plan", fake_plan)
    # every time drawn around 0.5 +- 1: a forward's time (decode, verify, decode at a batch
    # size) is kept at 1e-6 ms at least, a draft step's and the other time at 0
    halves = {"decode_ms": 1.0, "draft_ms": 1.0, "other_ms": 1.0, "verify": {3: 1.0}, "decode_points": {2: 1.0}}
    req = _req(decode_ms=0.5, verify_points=[(3, 0.5)], decode_points=[(2, 0.5)], draft_ms=0.5, other_ms=0.5)
    planner._intervals(replace(req, halves=halves), draws=400)
    lows = [min(column) for column in zip(*drawn)]
    assert lows == [1e-6, 1e-6, 1e-6, 0.0, 0.0]


def test_plain_decoding_from_a_measured_tok_s_at_zero_steps():
    # --measured-tok-s 100@0 is plain decoding at 1000 / 100 = 10 ms per token
    req = _req(verify_points=[(2, 12.0)], measured=[(0, 100.0)])
    result = plan(req)
    assert result.verify_model["plain_decoding"] == "10 ms per token from --measured-tok-s 100@0"
    assert result.batches[0].plain.cycle_ms == pytest.approx(10.0)


def test_per_sequence_cost_from_plain_decoding_at_batch_sizes():
    # the 1-sequence curve: 10 ms at 1 token, 17 ms at 8 (1 ms per token); plain decoding at
    # batch 4 takes 16 ms against the curve's 13 ms at 4 tokens: 3 ms over 3 more sequences
    req = _req(decode_ms=10.0, verify_points=[(8, 17.0)], decode_points=[(4, 16.0)], batches=[1, 4])
    result = plan(req)
    assert result.verify_model["per_sequence_ms"] == pytest.approx(1.0)
    assert "from plain decoding's times at batch 1 (10 ms), 4 (16 ms)" in result.verify_model["saturation"]
    assert result.batches[1].plain.cycle_ms == 16.0
