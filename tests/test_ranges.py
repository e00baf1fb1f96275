"""Ranges: the model's time times where published machines of a kind fall from it."""

from __future__ import annotations

import math

import pytest

from nccl_tune.model import costmodel, ranges
from nccl_tune.model import references as R

SIZES = (8192, 16384, 32768, 65536)


def _machine(name, kind, factor, nranks=8, env=None, **facts):
    """A table measuring `factor` x the model's own time at every size (eager, 1 GPU per process)."""
    env = dict(env or {})
    points = tuple((b, factor * ranges.model_us(kind, nranks, b, env, "eager", 1, facts.get("p2p"))) for b in SIZES)
    return R.Reference(name, kind, nranks, env, "eager", points, machine_id=name, gpus_per_process=1, **facts)


def test_timer_extra_is_one_launch_per_further_gpu_a_process_drives():
    p = costmodel.NCCL_PARAMS
    assert ranges.timer_extra_us("eager", 8, p) == pytest.approx(7 * p.launch_us)  # nccl-tests -g 8
    assert ranges.timer_extra_us("eager", 1, p) == 0.0  # torchrun: one launch, in the model
    assert ranges.timer_extra_us("graph", 8, p) == 0.0  # graph replay launches nothing


def test_offsets_are_each_machines_mean_log_ratio_to_the_model():
    refs = [_machine("a", "pcie-switch", 0.5), _machine("b", "pcie-switch", 2.0)]
    found = {o.machine: o for o in ranges.offsets(refs)}
    assert found["a"].mean == pytest.approx(math.log(0.5)) and found["a"].var == pytest.approx(0)
    assert found["b"].ratio == pytest.approx(2.0) and found["b"].points == len(SIZES)


def test_a_range_is_centred_on_the_machines_median_and_holds_them():
    refs = [_machine(n, "pcie-switch", f) for n, f in (("a", 0.8), ("b", 1.0), ("c", 1.25))]
    found = ranges.kind_range(refs, "pcie-switch", 8, 16384, {}, "eager")
    t_lo, t_hi = ranges.variant_times("pcie-switch", 8, 16384, {}, "eager")
    # median offset log(1.0): the interval is symmetric in log around the model's times
    assert math.log(found.low / t_lo) == pytest.approx(-math.log(found.high / t_hi))
    for factor in (0.8, 1.0, 1.25):
        assert found.covers(factor * t_lo) and found.covers(factor * t_hi)
    assert found.band.basis == "kind" and set(found.band.machines) == {"a", "b", "c"}


def test_nvswitch_with_and_without_nvls_share_one_range_where_the_model_gives_one_time():
    refs = [
        _machine("a100", "nvswitch", 1.1),
        _machine("h100", "nvswitch-nvls", 1.3),
        _machine("v100", "nvlink-mesh", 2.0),
    ]
    for nbytes in SIZES:
        a = ranges.kind_range(refs, "nvswitch", 8, nbytes, {}, None)
        b = ranges.kind_range(refs, "nvswitch-nvls", 8, nbytes, {}, None)
        assert ranges.model_us("nvswitch", 8, nbytes, {}, None) == ranges.model_us("nvswitch-nvls", 8, nbytes, {}, None)
        assert (a.low, a.high, a.band.machines) == (b.low, b.high, b.band.machines)
        assert "nvswitch" in a.band.kinds and "nvswitch-nvls" in a.band.kinds


def test_too_few_machines_of_a_kind_borrow_the_link_family_then_everyone():
    refs = [
        _machine("sw", "pcie-switch", 1.0),
        _machine("amd1", "pcie-amd-2s", 0.7),
        _machine("amd2", "pcie-amd-2s", 0.9),
    ]
    found = ranges.kind_range(refs, "pcie-switch", 8, 16384, {}, "eager")
    assert found.band.basis == "family" and set(found.band.machines) == {"sw", "amd1", "amd2"}
    nv = ranges.kind_range(refs, "nvswitch", 8, 16384, {}, "eager")
    assert nv.band.basis == "all"
    assert ranges.kind_range(refs[:1], "pcie-switch", 8, 16384) is None  # one machine: no range


def test_no_range_is_wider_than_four_times_and_a_cut_range_says_so():
    refs = [_machine(n, "pcie-switch", f) for n, f in (("a", 0.2), ("b", 1.0), ("c", 5.0))]
    found = ranges.kind_range(refs, "pcie-switch", 8, 16384, {}, "eager")
    assert found.capped and found.width == pytest.approx(ranges.MAX_WIDTH)


@pytest.mark.parametrize(
    "low_facts, high_facts, asks",
    [
        ({"p2p": True}, {"p2p": False}, "nvidia-smi topo -p2p r"),
        ({"sockets": 1}, {"sockets": 2}, "different CPU sockets"),
        ({"p2p": True}, {"p2p": True}, "pcie.link.width"),  # nothing known tells them apart
    ],
)
def test_machines_more_than_3x_apart_give_the_question_that_splits_them(low_facts, high_facts, asks):
    refs = [_machine("fast", "pcie-switch", 0.5, **low_facts), _machine("slow", "pcie-switch", 2.0, **high_facts)]
    found = ranges.kind_range(refs, "pcie-switch", 8, 16384, {}, "eager")
    assert found.band.spread == pytest.approx(4.0) and asks in found.question
    close = [_machine("x", "pcie-switch", 0.8, p2p=True), _machine("y", "pcie-switch", 2.0, p2p=False)]
    assert ranges.kind_range(close, "pcie-switch", 8, 16384, {}, "eager").question is None  # 2.5x


def test_where_p2p_may_be_missing_the_range_spans_both_transports():
    # pcie-switch at NCCL's defaults uses P2P, unless the GPUs cannot (GeForce, stock driver).
    p2p = ranges.model_us("pcie-switch", 8, 16384, {}, "eager")
    shm = ranges.model_us("pcie-switch", 8, 16384, {}, "eager", p2p=False)
    assert shm > p2p
    assert ranges.variant_times("pcie-switch", 8, 16384, {}, "eager") == (p2p, shm)
    # pcie-direct at the defaults sends its PHB pairs through host memory anyway: one time.
    one = ranges.model_us("pcie-direct", 8, 16384, {}, "eager")
    assert ranges.variant_times("pcie-direct", 8, 16384, {}, "eager") == (one, one)


def test_a_range_follows_the_protocol_nccl_runs():
    refs = [_machine(n, "pcie-direct", f, nranks=4) for n, f in (("a", 0.8), ("b", 1.0), ("c", 1.2))]
    ll = ranges.kind_range(refs, "pcie-direct", 4, 16384, {"NCCL_PROTO": "LL"}, "eager")
    simple = ranges.kind_range(refs, "pcie-direct", 4, 16384, {"NCCL_PROTO": "Simple"}, "eager")
    assert simple.model_us > ll.model_us and simple.low > ll.low


def test_published_non_default_protocols_lie_in_their_kinds_range_built_without_their_machine():
    """The 4x L40S tables forced to LL128 and Simple (16 KB: 29.1 and 44.3 us published)."""
    refs = R.shipped()
    for name, measured in (("farmshare-4xl40s-proto-ll128", 29.08), ("farmshare-4xl40s-proto-simple", 44.28)):
        ref = next(r for r in refs if r.name == name)
        assert ref.at(16384) == measured
        found = ranges.kind_range(
            refs, ref.kind, 4, 16384, ref.env, "eager", ref.gpus_per_process, exclude_machine=ref.machine
        )
        assert ref.machine not in found.band.machines and found.covers(measured), found.to_dict()


def test_leave_one_machine_out_covers_at_least_90_percent_of_the_published_points():
    checks = ranges.leave_one_out(R.shipped())
    assert len(checks) >= 90 and all(c.range is not None for c in checks)
    covered = sum(c.covered for c in checks)
    assert covered / len(checks) >= 0.90, [c.name for c in checks if not c.covered]
    defaults = [c for c in ranges.leave_one_out(R.shipped(), defaults_only=True)]
    assert max(c.range.width for c in defaults) <= ranges.MAX_WIDTH * (1 + 1e-9)
