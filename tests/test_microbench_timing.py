"""CPU timers of the microbench: one aligned call per sample, or several back to back."""

from __future__ import annotations

import time

import pytest

from microbench import options, timing


def test_cpu_eager_divides_back_to_back_calls():
    calls, aligns = [], []

    def op():
        calls.append(1)
        time.sleep(0.002)

    samples = timing.cpu_eager(op, lambda: aligns.append(1), iters=3, per_sample=4)
    assert len(samples) == 3 and len(calls) == 12 and len(aligns) == 3
    # each sample is the time per call: ~2 ms, not the ~8 ms of the four together
    assert all(1500 < s < 6000 for s in samples)


def test_cpu_eager_one_call_per_sample_by_default():
    calls = []
    samples = timing.cpu_eager(lambda: calls.append(1), lambda: None, iters=5)
    assert len(samples) == 5 and len(calls) == 5


def test_ops_per_sample_must_be_positive():
    with pytest.raises(Exception, match="--ops-per-sample"):
        options.parse_args(["--ops-per-sample", "0"])
    assert options.parse_args(["--ops-per-sample", "10"]).ops_per_sample == 10
