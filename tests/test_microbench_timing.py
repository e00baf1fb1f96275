"""CPU timers of the microbench: one aligned call per sample, or several back to back."""

from __future__ import annotations

import time

import pytest

from microbench import options, timing


def test_cpu_eager_divides_back_to_back_calls():
    calls, aligns = [], []
    now = [0.0]

    def op():
        calls.append(1)
        now[0] += 0.002  # each call takes 2 ms of the test's own clock

    samples = timing.cpu_eager(op, lambda: aligns.append(1), iters=3, per_sample=4, clock=lambda: now[0])
    assert len(calls) == 12 and len(aligns) == 3
    # each sample is the time per call: 2 ms, not the 8 ms of the four together
    assert samples == pytest.approx([2000.0] * 3)


def test_cpu_eager_one_call_per_sample_by_default():
    calls = []
    samples = timing.cpu_eager(lambda: calls.append(1), lambda: None, iters=5)
    assert len(samples) == 5 and len(calls) == 5


def test_ops_per_sample_must_be_positive():
    with pytest.raises(Exception, match="--ops-per-sample"):
        options.parse_args(["--ops-per-sample", "0"])
    assert options.parse_args(["--ops-per-sample", "10"]).ops_per_sample == 10


def test_spin_keeps_busy_for_the_gap():
    start = time.perf_counter()
    timing.spin(0.003)
    assert time.perf_counter() - start >= 0.003
    ticks = iter([0.0, 0.5, 1.0, 1.5])  # a fake clock: spins until it passes the end
    timing.spin(1.2, clock=lambda: next(ticks))
    assert next(ticks, None) is None


def test_cpu_gapped_stamps_each_call_after_its_gap():
    calls, aligns = [], []
    stamps = timing.cpu_gapped(
        lambda: calls.append(time.perf_counter()), lambda: aligns.append(1), iters=3, per_sample=2, gap_s=0.002
    )
    assert len(stamps) == 2 * 3 * 2 and len(calls) == 6 and len(aligns) == 3
    enters, exits = stamps[0::2], stamps[1::2]
    assert all(e <= c <= x for e, c, x in zip(enters, calls, exits))
    # every call comes a gap of busy compute after the previous one ended
    assert all(enters[i] - exits[i - 1] >= 0.002 - 1e-9 for i in range(1, 6))


def test_last_arrival_latency_leaves_the_wait_for_a_late_rank_out():
    # two ops per sample; rank 1 arrives 5 units late at the first op
    rank0 = [0.0, 7.0, 10.0, 12.0]  # enter, exit, enter, exit
    rank1 = [5.0, 7.5, 10.5, 12.5]
    # op 1: last arrival 5 -> last exit 7.5 = 2.5; op 2: 10.5 -> 12.5 = 2; mean 2.25 s
    assert timing.last_arrival_us([rank0, rank1], per_sample=2) == [pytest.approx(2.25e6)]
    assert timing.last_arrival_us([rank0, rank1], per_sample=1) == [pytest.approx(2.5e6), pytest.approx(2.0e6)]
    with pytest.raises(ValueError, match="unequal or partial"):
        timing.last_arrival_us([rank0, rank1[:2]], per_sample=1)
    with pytest.raises(ValueError, match="unequal or partial"):
        timing.last_arrival_us([rank0, rank1], per_sample=3)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_gap_must_be_a_finite_non_negative_number(value):
    with pytest.raises(Exception, match="--gap-us"):
        options.parse_args(["--gap-us", value])
    assert options.parse_args(["--gap-us", "250"]).gap_us == 250.0
