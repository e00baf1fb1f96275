"""Per-token model: interpolation, refusal to extrapolate, savings and their intervals."""

from __future__ import annotations

import factories
import numpy as np
import pytest

from nccl_tune import store
from nccl_tune.model import per_token as model

DECODE = 14336


def test_message_bytes_and_collectives():
    assert model.message_bytes(1, 7168, "bf16") == 14336
    assert model.message_bytes(4, 7168, "bf16") == 57344
    assert model.collectives_per_forward(61) == 123
    with pytest.raises(ValueError):
        model.dtype_bytes("int3")


def test_loglog_interpolation_is_exact_for_a_power_law():
    curve = model.LatencyCurve.from_points([(b, 3.0 * b**0.5) for b in (1024, 4096, 65536)])
    for b in (1024, 2048, 3000, 20000, 65536):
        assert curve.at(b) == pytest.approx(3.0 * b**0.5)


def test_refuses_to_extrapolate_unless_asked():
    curve = model.LatencyCurve.from_points([(8192, 20.0), (16384, 22.0)])
    with pytest.raises(model.OutOfRangeError, match="outside the measured range"):
        curve.at(57344)
    assert curve.at(57344, extrapolate=True) > 22.0
    assert curve.at(4096, extrapolate=True) < 20.0


def test_public_report_arithmetic():
    # The public 8x PCIe report: 62.9 tok/s with NCCL's defaults, 88.8 tok/s tuned, i.e.
    # 1000/62.9 - 1000/88.8 = 4.637 ms per token, over 2 x 61 + 1 = 123 allreduces of
    # 14336 B: 37.7 us each. The model's defaults (2 per layer + 1) must give 123 calls,
    # the saving of a 37.7 us faster allreduce must be that 4.637 ms, and projecting it
    # onto 62.9 tok/s must give the report's 88.8 back.
    measured_ms = 1000 / 62.9 - 1000 / 88.8
    per_call_us = 37.7
    base = model.LatencyCurve.from_points([(DECODE, 60.0)])
    prof = model.LatencyCurve.from_points([(DECODE, 60.0 - per_call_us)])
    saving = model.predicted_saving_ms(base, prof, 1, 61, 7168)
    assert saving == pytest.approx(measured_ms, abs=0.01)
    assert model.predicted_saving_ms(base, prof, 1, 61, 7168, extra=0) == pytest.approx(
        saving * 122 / 123
    )  # the embedding's allreduce is the 123rd
    assert model.projected_tok_s(62.9, saving) == pytest.approx(88.8, abs=0.05)
    with pytest.raises(ValueError):
        model.projected_tok_s(62.9, 16.0)  # more than the whole time per token


def _records(env, lat_fn, rounds, drift, noise, seed, sizes=(8192, 14336, 28672), samples=30):
    return factories.sweep_records(
        [(env, lat_fn)], sizes, rounds=rounds, drift=drift, noise=noise, seed=seed, samples=samples
    )


def _pair(rounds, seed=0, noise=0.3, drift_sd=1.0, gain=5.0):
    drift = np.random.default_rng(seed + 100).normal(0, drift_sd, rounds)
    base = _records({}, lambda b: 20 + b / 1000, rounds, drift, noise, seed)
    cell = _records(
        {"NCCL_P2P_LEVEL": "SYS"},
        lambda b: 20 - gain + b / 1000,
        rounds,
        drift + np.random.default_rng(seed + 7).normal(0, 0.4, rounds),
        noise,
        seed + 1,
    )
    return base, cell


def test_saving_paired_by_round_and_scaled_by_collectives():
    base, cell = _pair(6)
    est = model.estimate_saving(base, cell, DECODE, collectives=123)
    assert est.basis == model.BASIS_ROUNDS and est.n_rounds == 6
    assert est.saving_ms == pytest.approx(5.0 * 123 / 1000, abs=0.1)
    assert est.ci_ms[0] < est.saving_ms < est.ci_ms[1] and est.excludes_zero
    assert len(est.per_round_ms) == 6 and not est.extrapolated


def test_interval_shrinks_with_more_rounds():
    widths = []
    for rounds in (3, 6, 24):
        base, cell = _pair(rounds, seed=3)
        est = model.estimate_saving(base, cell, DECODE, collectives=123)
        widths.append(est.ci_ms[1] - est.ci_ms[0])
    assert widths[0] > widths[1] > widths[2]


def test_one_round_uses_iterations_and_says_so():
    base, cell = _pair(1)
    est = model.estimate_saving(base, cell, DECODE, collectives=123)
    assert est.basis == model.BASIS_ITERATIONS and est.n_rounds == 1 and est.per_round_ms is None

    # The centre: the difference of the 30-sample medians at 14336 B, x 123 calls / 1000.
    def at_decode(records):
        return [x for r in records if r["bytes"] == DECODE for x in r["samples_us"]]

    centre = (np.median(at_decode(base)) - np.median(at_decode(cell))) * 123 / 1000
    assert est.saving_ms == pytest.approx(centre)
    # The interval from the iterations: the standard error of a median of 30 samples of
    # sd 0.3 us is about 1.2533 x 0.3 / sqrt(30) = 0.069 us, of the difference 0.097 us,
    # so 95% is about +-0.19 us per call, +-0.023 ms over 123 calls.
    lo, hi = est.ci_ms
    assert lo < est.saving_ms < hi
    assert 0.012 < (hi - lo) / 2 < 0.035


def test_interpolated_decode_size_between_measured_sizes():
    base, cell = _pair(5, gain=4.0)
    est = model.estimate_saving(base, cell, 20000, collectives=100)  # between 14336 and 28672
    assert est.saving_ms == pytest.approx(0.4, abs=0.06)
    with pytest.raises(model.OutOfRangeError):
        model.estimate_saving(base, cell, 57344, collectives=100)
    far = model.estimate_saving(base, cell, 57344, collectives=100, extrapolate=True)
    assert far.extrapolated


def test_single_values_give_no_interval():
    base = [store.make_record(env={}, bytes=DECODE, lat_us={"p50": 60.0}, round=0, backend="nccl-tests")]
    cell = [
        store.make_record(env={"NCCL_PROTO": "LL"}, bytes=DECODE, lat_us={"p50": 22.0}, round=0, backend="nccl-tests")
    ]
    est = model.estimate_saving(base, cell, DECODE, collectives=122)
    assert est.saving_ms == pytest.approx(4.636) and est.ci_ms is None and not est.excludes_zero


def test_failed_records_do_not_count():
    base, cell = _pair(4)
    broken = [dict(r, status="failed", lat_us={"p50": 1.0}) for r in cell]
    assert model.estimate_saving(base, broken, DECODE, collectives=10) is None
