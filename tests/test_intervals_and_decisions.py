"""Intervals decided in one place (stats) and one decision rule for search and recommend.

- a latency interval never reaches below 0 (stats.positive_ci, on the log scale);
- too few rounds: no interval (said in words), never 0.000-10^15;
- the interval column follows --confidence;
- ties go to the cell that sets fewer variables, in sweep's pick as in recommend's;
- halving brings a finalist's minimal part back to the final rung, so it can win;
- report shows a halving run's rows once each, pruned rows (baseline too) by rung.
"""

from __future__ import annotations

import math

import factories
import pytest

from nccl_tune import stats, store
from nccl_tune.cli import cli
from nccl_tune.decide import report
from nccl_tune.measure import search
from nccl_tune.measure.grid import Cell
from nccl_tune.store import BASELINE


def _rec(cell, env, round_, p50, **extra):
    return factories.record(
        env,
        14336,
        p50=p50,
        round_=round_,
        cell=cell,
        backend="gloo",
        world_size=2,
        host="h",
        samples_us=[p50 * 0.99, p50, p50 * 1.01],
        **extra,
    )


# ---------------------------------------------------------------- latency intervals


def test_positive_ci_stays_above_zero_where_the_plain_t_interval_does_not():
    rounds = [200.0, 2510.0, 6000.0]  # three noisy rounds around a 2510 us median
    _, plain_lo, _ = stats.t_ci(rounds)
    assert plain_lo < 0  # what report used to print
    centre, lo, hi = stats.positive_ci(rounds)
    assert 0 < lo < centre < hi
    assert lo < 2510.0 < hi
    with pytest.raises(ValueError):
        stats.positive_ci([1.0, 0.0, 2.0])


def test_report_interval_of_noisy_rounds_is_positive():
    records = [_rec(BASELINE, {}, r, p) for r, p in enumerate([200.0, 2510.0, 6000.0], start=1)]
    (summary,) = report.summarize(records)
    assert summary.ci_basis == "rounds"
    assert summary.ci_us[0] > 0 and summary.ci_us[0] < summary.p50_us < summary.ci_us[1]


def test_final_verdict_with_two_rounds_gives_no_interval():
    records = []
    for r in (1, 2):
        records += [_rec(BASELINE, {}, r, 100.0), _rec("c-a", {"NCCL_PROTO": "LL"}, r, 90.0 + r)]
    best, winner, score, ci = search.final_verdict(records, ["c-a"])
    assert best == "c-a" and not winner and ci is None and score < 1


def test_sweep_summary_says_too_few_rounds(cli_runner, tmp_path):
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--topology",
            "pcie",
            "--set",
            "NCCL_PROTO=LL",
            "--rounds",
            "2",
            "--out",
            str(tmp_path / "r.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "too few rounds (2) for an interval: --rounds 3 or more" in result.output
    assert "interval 0.000" not in result.output


def test_report_interval_header_follows_confidence(cli_runner, tmp_path):
    path = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--topology",
            "pcie",
            "--set",
            "NCCL_PROTO=LL",
            "--rounds",
            "3",
            "--out",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    shown = cli_runner.invoke(cli, ["report", str(path), "--confidence", "0.9"])
    assert shown.exit_code == 0, shown.output
    assert "90% CI" in shown.output and "95% CI" not in shown.output


# ---------------------------------------------------------------- one decision rule

SMALL = {"NCCL_P2P_LEVEL": "SYS"}
BIG = {**SMALL, "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_NTHREADS": "512"}


def test_ties_go_to_fewer_variables_in_the_sweeps_pick():
    small, big = store.cell_id(SMALL), store.cell_id(BIG)
    records = []
    for r, (a, b) in enumerate([(90.0, 89.5), (91.0, 89.6), (89.0, 89.4)], start=1):
        records += [_rec(BASELINE, {}, r, 100.0), _rec(small, SMALL, r, a), _rec(big, BIG, r, b)]
    finalists = [small, big]
    # by median alone the superset is best ...
    assert search.final_verdict(records, finalists)[0] == big
    # ... but the two are tied, so the cell that sets one variable is picked, as recommend does
    best, winner, _, _ = search.final_verdict(records, finalists, n_vars={small: 1, big: 4})
    assert best == small and winner


def test_stats_tied_needs_rounds():
    assert stats.tied({1: 1.0, 2: 1.1}, {1: 1.05, 2: 1.0}) is None
    assert stats.tied({1: 1.0, 2: 1.1, 3: 0.9}, {1: 1.05, 2: 1.0, 3: 0.95}) is True
    assert stats.tied({1: 1.0, 2: 1.01, 3: 0.99}, {1: 2.0, 2: 2.01, 3: 1.99}) is False


def test_minimal_parts_brings_back_a_finalists_best_proper_part():
    envs = {
        "big": BIG,
        "small": SMALL,
        "other": {"NCCL_PROTO": "LL"},
        "alien": {"NCCL_ALGO": "Tree"},
        "broken": {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"},
    }
    scores = {"big": 0.8, "alien": 0.9, "broken": math.inf, "other": 1.1, "small": 1.2}
    ranked = sorted(scores, key=scores.get)
    # the failed part never comes back; of the rest, the best-scoring part of the finalist
    assert search.minimal_parts(["big"], ranked, scores, envs) == ["other"]
    assert search.minimal_parts(["big", "other"], ranked, scores, envs) == ["small"]
    assert search.minimal_parts(["alien"], ranked, scores, envs) == []


def test_halving_measures_a_pruned_minimal_part_in_the_final_and_it_wins():
    """SYS alone scores badly in the brief first rung (noise) and would be pruned; the
    cell that adds three variables to it survives. In full measurement both are equal:
    the minimal profile must reach the final rung and win the tie."""
    small, big = Cell(dict(SMALL)), Cell(dict(BIG))
    fillers = [Cell({"NCCL_BUFFSIZE": str(1 << (20 + i))}) for i in range(10)]
    cells = [Cell({}), small, big, *fillers]

    def p50(request) -> float:
        rung = request.extra["rung"]
        if request.cell.id == BASELINE:
            return 100.0
        if request.cell.id == small.id:
            return 150.0 if rung == 0 else 80.0 + 0.1 * (request.round % 3)
        if request.cell.id == big.id:
            return 80.0 + 0.1 * ((request.round + 1) % 3)
        return 95.0 + int(request.cell.env["NCCL_BUFFSIZE"]).bit_length() * 0.1

    def measure(requests):
        return [
            {
                "cell": q.cell.id,
                "env": q.cell.env,
                "round": q.round,
                "bytes": 14336,
                "status": "ok",
                "lat_us": {"p50": p50(q)},
                **q.extra,
            }
            for q in requests
        ]

    outcome = search.run_halving(cells, measure, search.Ledger(1, 200), rounds=3)
    assert small.id not in outcome.pruned  # brought back: no longer listed as pruned
    assert small.id in outcome.finalists and big.id in outcome.finalists
    assert outcome.best == small.id


# ---------------------------------------------------------------- report on halving results


def test_report_shows_halving_rows_once_each_labelled_by_rung(cli_runner, tmp_path):
    path = tmp_path / "h.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--topology",
            "pcie",
            "--search",
            "halving",
            "--rounds",
            "3",
            "--set",
            "NCCL_PROTO=default,LL,Simple",
            "--set",
            "NCCL_ALGO=default,Ring,Tree",
            "--set",
            "NCCL_P2P_LEVEL=default,SYS",
            "--sizes",
            "14336",
            "--out",
            str(path),
        ],
    )
    assert result.exit_code == 0, result.output
    summaries = report.summarize(list(store.iter_records(str(path))))
    labels = [s.row_label for s in summaries]
    assert len(labels) == len(set(labels)), labels  # no two rows alike
    finals = {s.cell for s in summaries if s.final}
    assert not any(s.cell in finals and not s.final for s in summaries if s.cell != BASELINE)
    assert "baseline (NCCL defaults) [rung 0]" in labels
    assert "baseline (NCCL defaults)" in labels  # the final rung's
    shown = cli_runner.invoke(cli, ["report", str(path)])
    assert "baseline (NCCL defaults) [rung 0]" in shown.output
