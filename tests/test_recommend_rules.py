"""The recommendation rules one at a time, on hand-made rows and a stand-in latency model,
so each expected figure is arithmetic on the inputs (bench/mutation_check.py, issue 24)."""

from __future__ import annotations

import dataclasses

import pytest
from test_recommend import P2P, analyze, confirmed, flat, synth

from nccl_tune import stats
from nccl_tune.decide import recommendation
from nccl_tune.errors import NcclTuneError
from nccl_tune.model import costmodel
from nccl_tune.model.per_token import LatencyCurve, SavingEstimate
from nccl_tune.vocab import Provenance

LL_RING = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
LL = {"NCCL_PROTO": "LL"}


def _row(env, saving_ms, ci_ms=None, per_round_ms=None) -> recommendation.CellRow:
    row = recommendation.CellRow(cell=str(sorted(env.items())), env=dict(env), eligible=True)
    row.saving = SavingEstimate(saving_ms, ci_ms, None, 3, per_round_ms)
    return row


def _stand_in_model(monkeypatch, uncalibrated: dict, fitted_us: float = 70.0) -> None:
    """costmodel.latency_us as a table: `uncalibrated` maps a cell label to its us (the
    defaults under ''); with `params` every cell takes `fitted_us` (a fit that sees no
    difference)."""

    def latency_us(nbytes, nranks, topology_name, env=None, op="allreduce", params=None, mode=None):
        if params is not None:
            return fitted_us
        return uncalibrated[recommendation.cell_label(env or {}) if env else ""]

    monkeypatch.setattr(costmodel, "latency_us", latency_us)


def test_modelled_savings_within_two_percent_tie_and_go_to_fewer_variables(monkeypatch):
    ll_ring, ll = recommendation.cell_label(LL_RING), recommendation.cell_label(LL)
    _stand_in_model(monkeypatch, {"": 50.0, ll_ring: 40.0, ll: 40.1})
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=200, candidates=(LL_RING, LL)
    )
    saving = {recommendation.cell_label(r.env): r.saving.saving_ms for r in a.cells}
    assert saving[ll_ring] == pytest.approx(2.0)  # 200 x (50 - 40) us / 1000
    assert saving[ll] == pytest.approx(1.98)  # 200 x (50 - 40.1) us / 1000
    # |2.0 - 1.98| = 0.02 <= TIE_FRACTION 0.02 x 2.0 = 0.04: a tie, so the one-variable cell
    assert a.recommended.env == LL
    # the table's saving at the size, for modelled rows the curves' difference in ms
    assert a.saving_ms_at(a.recommended, 14336) == pytest.approx(1.98)  # 200 x 9.9 / 1000

    _stand_in_model(monkeypatch, {"": 50.0, ll_ring: 40.0, ll: 40.25})
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=200, candidates=(LL_RING, LL)
    )
    # 2.0 against 1.95 (200 x 9.75 / 1000): 0.05 > 0.04 (2.5%, over 2%), no tie, the larger saving wins
    assert a.recommended.env == LL_RING


def test_modelled_verdicts_need_one_percent_of_the_baselines_comm_time(monkeypatch):
    near, slower, faster = {"NCCL_PROTO": "Simple"}, {"NCCL_ALGO": "Tree"}, LL
    label = recommendation.cell_label
    # defaults 50 us x 200 / 1000 = 10 ms; 1% of it is 0.1 ms
    _stand_in_model(monkeypatch, {"": 50.0, label(near): 50.2, label(slower): 51.0, label(faster): 49.0})
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=200, candidates=(near, slower, faster)
    )
    by_env = {label(r.env): r for r in a.cells}
    # 200 x -0.2 / 1000 = -0.04 ms: within 0.1 ms, no difference
    assert by_env[label(near)].verdict == "no difference (modelled)"
    assert by_env[label(near)].reason == "no modelled saving"
    # 200 x -1 / 1000 = -0.2 ms < -0.1 ms: slower; 200 x 1 / 1000 = 0.2 ms > 0.1 ms: faster
    assert (by_env[label(slower)].verdict, by_env[label(slower)].reason) == ("slower (modelled)", "slower")
    assert by_env[label(faster)].verdict == "faster (modelled)" and a.recommended.env == faster


def test_a_fit_that_did_not_calibrate_the_pair_compares_the_uncalibrated_model(monkeypatch):
    _stand_in_model(monkeypatch, {"": 50.0, recommendation.cell_label(LL): 40.0}, fitted_us=70.0)
    fit = dataclasses.replace(costmodel.NCCL_PARAMS, pair_lat_scale={"NVLS/Simple": 1.0})  # not Ring/LL
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=64, candidates=(LL,), params=fit
    )
    (row,) = a.cells
    assert row.calibrated is False
    assert row.comm_ms == pytest.approx(4.48)  # the fit's figure: 64 x 70 us / 1000
    assert row.saving.saving_ms == pytest.approx(0.64)  # uncalibrated: 64 x (50 - 40) us / 1000
    assert row.verdict == "faster (modelled)" and a.recommended is row


def test_measured_ties_without_shared_rounds_use_the_interval_reaching_the_best():
    best = _row({**P2P, "NCCL_NTHREADS": "512"}, 2.0, (1.5, 2.5))
    reaches = _row(P2P, 1.8, (1.2, 2.1))  # its upper end 2.1 >= the best's 2.0: tied
    assert recommendation.pick([best, reaches]) is reaches
    touches = _row(P2P, 1.8, (1.2, 2.0))  # its upper end is the best's 2.0: it reaches it, tied
    assert recommendation.pick([best, touches]) is touches
    short = _row(P2P, 1.8, (1.2, 1.9))  # 1.9 < 2.0: not tied
    no_interval = _row(LL, 1.99)  # no interval: never tied
    assert recommendation.pick([best, short]) is best
    assert recommendation.pick([best, no_interval]) is best


def test_a_world_of_one_rank_is_refused_and_an_unknown_world_is_not():
    with pytest.raises(NcclTuneError, match="world of one rank"):
        recommendation.check_world(1, "--tp")
    assert recommendation.check_world(None, "--tp") is None
    assert recommendation.check_world(2, "--tp") is None


def test_default_model_sizes_are_256_bytes_to_4_mib():
    powers = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288]
    powers += [1048576, 2097152, 4194304]  # 2^8 .. 2^22
    assert recommendation.default_model_sizes() == powers
    assert recommendation.default_model_sizes([14336, 0, -5]) == sorted([*powers, 14336])


def test_a_cell_identical_to_the_baseline_is_not_faster():
    # no noise, no drift: every round's saving is exactly 0, so the interval is (0, 0)
    records = synth([({}, flat(60), {}), (P2P, flat(60), {})], noise=0.0, drift_sd=0.0)
    a = analyze(records)
    (row,) = a.cells
    assert row.saving.ci_ms == (0.0, 0.0)
    assert row.verdict == stats.NO_DIFFERENCE and row.reason == "interval includes zero"
    assert a.recommended is None


def test_a_faster_cell_that_does_not_lint_clean_is_not_recommended():
    bad = {"NCCL_NTHREADS": "100"}  # not a multiple of 32
    a = analyze(synth([({}, flat(60), {}), (bad, flat(24), {})]))
    (row,) = a.cells
    assert row.verdict == stats.FASTER
    assert row.reason.startswith("does not lint clean: NCCL_NTHREADS: ") and "multiple of 32" in row.reason
    assert not row.eligible and a.recommended is None


def test_a_rows_repr_leaves_out_its_curve_and_records():
    row = recommendation.CellRow(cell="c", env={}, curve=LatencyCurve.from_points([(256, 1.0), (512, 2.0)]))
    row.records = [{"p50_us": 1.0}]
    assert "curve=" not in repr(row) and "records=" not in repr(row) and "cell='c'" in repr(row)


def test_the_row_shows_what_nccl_reported_at_the_decode_size_else_at_the_first_size():
    def by_size(nbytes):
        return confirmed("Tree") if nbytes == 14336 else confirmed("Ring")

    a = analyze(synth([({}, flat(60), {}), (P2P, flat(24), by_size)]))
    assert a.cells[0].effective["algo"] == "Tree"  # measured at 14336 B: that size's report
    # 10000 B lies between the measured 8192 and 14336 B: no report there, the first one (8192 B) stands
    a = analyze(synth([({}, flat(60), {}), (P2P, flat(24), by_size)]), nbytes=10000)
    assert a.cells[0].effective is not None and a.cells[0].effective["algo"] == "Ring"


def test_a_stopped_search_without_a_pruned_baseline_names_the_cells_alone():
    records = synth([(P2P, flat(24), {})])
    for r in records:
        r["final"] = False
    with pytest.raises(NcclTuneError) as info:
        analyze(records)
    message = str(info.value)
    assert "never reached its final rung" in message and "best pruned cells at 14336 B: NCCL_P2P_LEVEL=SYS (" in message
    assert "against the baseline" not in message


def test_results_holding_one_baseline_record_keep_the_defaults():
    a = analyze(synth([({}, flat(60), {})], rounds=1, sizes=(14336,)))
    assert a.cells == [] and a.recommended is None and a.provenance is Provenance.NCCL


def test_the_gpus_named_are_those_of_most_records():
    records = synth([({}, flat(60), {}), (P2P, flat(24), {})])  # 5 rounds x 2 cells x 4 sizes = 40 records
    for r in records[:15]:
        r["gpus"] = "NVIDIA H100"  # written as one string
    # 25 records list 8 x 'NVIDIA RTX PRO 6000', 15 say 'NVIDIA H100': 25 > 15
    assert analyze(records).gpus == "8x NVIDIA RTX PRO 6000"
    for r in records[15:22]:
        r["gpus"] = "NVIDIA H100"
    assert analyze(records).gpus == "NVIDIA H100"  # 22 > 18


def test_modelled_savings_exactly_two_percent_apart_tie():
    # TIE_FRACTION 0.02 x 50 ms = 1.0 ms exactly, and 50 - 49 = 1.0: on the boundary, a tie,
    # so the one-variable cell wins
    two, one = _row(LL_RING, 50.0), _row(LL, 49.0)
    assert recommendation.pick([two, one], modelled=True) is one
    assert recommendation.pick([two, _row(LL, 48.9)], modelled=True) is two  # 1.1 > 1.0: no tie


def test_records_of_two_backends_keep_the_preferred_one_and_say_so():
    nccl = synth([({}, flat(60), {}), (P2P, flat(24), {})])
    gloo = synth([({}, flat(600), {}), (P2P, flat(590), {})], backend="gloo")
    a = analyze(nccl + gloo)
    assert a.backend == "nccl"
    assert "using backend nccl; records of gloo left out" in a.notes
    assert not any("left out" in n for n in analyze(nccl).notes)  # one backend: nothing to say


def test_a_modelled_saving_rests_on_no_measured_rounds(monkeypatch):
    _stand_in_model(monkeypatch, {"": 50.0, recommendation.cell_label(LL): 40.0})
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=100, candidates=(LL,)
    )
    (row,) = a.cells
    # 100 x (50 - 40) us / 1000 = 1.0 ms, from the model: no interval, no basis, 0 rounds
    assert (row.saving.saving_ms, row.saving.ci_ms, row.saving.basis, row.saving.n_rounds) == (1.0, None, None, 0)


def test_force_does_not_export_a_cell_that_saves_nothing():
    # identical cells, no noise: the one cell's saving is exactly 0 ms, which saves nothing
    a = analyze(synth([({}, flat(60), {}), (P2P, flat(60), {})], noise=0.0, drift_sd=0.0))
    (row,) = a.cells
    assert row.saving.saving_ms == 0.0
    best, _, why = recommendation.export_row(a, force=True)
    assert best is None and why == "not written: no cell saves time, even without a significant interval"


def test_a_fit_that_calibrated_the_pair_compares_its_own_figures(monkeypatch):
    def latency_us(nbytes, nranks, topology_name, env=None, op="allreduce", params=None, mode=None):
        if params is not None:  # the fit: 60 us at the defaults, 45 us with LL
            return 45.0 if env else 60.0
        return 40.0 if env else 50.0  # uncalibrated: 50 and 40 us

    monkeypatch.setattr(costmodel, "latency_us", latency_us)
    monkeypatch.setattr(costmodel, "is_calibrated", lambda params, algo, proto: True)
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=64, candidates=(LL,), params=costmodel.NCCL_PARAMS
    )
    (row,) = a.cells
    assert row.calibrated is True
    assert row.saving.saving_ms == pytest.approx(0.96)  # the fit's: 64 x (60 - 45) us / 1000, not 64 x 10 / 1000


def test_a_cell_nccl_confirmed_in_every_record_is_confirmed():
    a = analyze(synth([({}, flat(60), {}), (P2P, flat(24), confirmed())]))
    assert a.cells[0].confirmed is True  # every record's effective says confirmed: True
    a = analyze(synth([({}, flat(60), {}), (P2P, flat(24), {})]))
    assert a.cells[0].confirmed is None  # no record says either way


def test_a_fit_that_calibrated_only_one_side_compares_the_uncalibrated_model(monkeypatch):
    def latency_us(nbytes, nranks, topology_name, env=None, op="allreduce", params=None, mode=None):
        if params is not None:
            return 45.0 if env else 60.0
        return 40.0 if env else 50.0

    asked = []

    def is_calibrated(params, algo, proto):  # the baseline is priced first: not calibrated; the cell is
        asked.append((algo, proto))
        return len(asked) > 1

    monkeypatch.setattr(costmodel, "latency_us", latency_us)
    monkeypatch.setattr(costmodel, "is_calibrated", is_calibrated)
    a = recommendation.analyze_model(
        topology_name="pcie-shm", nranks=8, nbytes=14336, collectives=64, candidates=(LL,), params=costmodel.NCCL_PARAMS
    )
    (row,) = a.cells
    assert row.calibrated is True and len(asked) == 2
    assert row.saving.saving_ms == pytest.approx(0.64)  # like with like: 64 x (50 - 40) us / 1000, not the fit's 0.96
