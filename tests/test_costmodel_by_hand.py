"""The cost model against numbers worked out by hand from NCCL's published tuning model.

Every expected value here is a literal with its arithmetic in a comment, taken from NCCL's
src/graph/tuning.cc (ncclTopoTuneModel, 2.2x-2.30; DESIGN.md section 5), never from the
module under test:

- baseLat (us), LL / LL128 / Simple: Ring 6.6 / 14.0 / 8.4, Tree 6.8 / 14.0 / 8.4.
- hwLat per hop (us): NVLink Ring .6 / 1.9 / 3.4, Tree .6 / 1.25 / 4.0;
  PCI Ring 1.0 / 2.5 / 5.7, Tree 1.0 / 1.9 / 4.0. NVLS: 25 us flat, no baseLat.
- Ring steps: `nsteps = allreduce ? 2(n-1) : reducescatter or allgather ? n-1 : n`;
  broadcast and reduce are charged one hop of latency when the channels share one ring.
  A ring all_gather passes each rank's block n-1 times round the ring (after n-1 steps
  every rank holds all n blocks); reduce_scatter is the same ring run backwards, and
  allreduce is one of each, 2(n-1). One node: latency = baseLat + nsteps x hwLat.
- One-node Tree allreduce: baseLat + 2 (n-1) x hwLat (the intra-node chain up and down).
- Bandwidth: bus = channels x per-channel bandwidth x (Ring LL .5); algorithm bandwidth =
  bus x n / nsteps for Ring. The per-channel bandwidth is this project's guess
  (costmodel.ModelParams.bw_per_channel, PCI_BW below): the one figure read from the code,
  because what is tested here is the latency side, not that guess.
"""

from __future__ import annotations

import pytest

from nccl_tune.model import costmodel as cm

PCI_BW = cm.NCCL_PARAMS.bw_per_channel["pci"]  # GB/s a channel moves over PCI (a guess)

# (op, nranks, algo, proto, link, expected us, the arithmetic)
LATENCY_TERMS = [
    ("all_gather", 8, "Ring", "LL", "pci", 13.6),  # 6.6 + 7 x 1.0
    ("reduce_scatter", 8, "Ring", "LL", "pci", 13.6),  # 6.6 + 7 x 1.0
    ("all_gather", 8, "Ring", "Simple", "pci", 48.3),  # 8.4 + 7 x 5.7
    ("reduce_scatter", 8, "Ring", "LL128", "nvlink", 27.3),  # 14.0 + 7 x 1.9
    ("all_gather", 8, "Ring", "Simple", "nvlink", 32.2),  # 8.4 + 7 x 3.4
    ("all_gather", 4, "Ring", "LL", "nvlink", 8.4),  # 6.6 + 3 x 0.6
    ("reduce_scatter", 2, "Ring", "Simple", "pci", 14.1),  # 8.4 + 1 x 5.7
    ("allreduce", 8, "Ring", "LL", "pci", 20.6),  # 6.6 + 14 x 1.0
    # broadcast and reduce: one hop when every channel runs the same ring (sameChannels,
    # as NCCL's search gets on one node); tuning.cc charges n hops only otherwise
    ("broadcast", 8, "Ring", "LL", "pci", 7.6),  # 6.6 + 1 x 1.0
    ("reduce", 8, "Ring", "Simple", "nvlink", 11.8),  # 8.4 + 1 x 3.4
    ("allreduce", 8, "Ring", "Simple", "pci", 88.2),  # 8.4 + 14 x 5.7
    ("allreduce", 4, "Ring", "LL128", "nvlink", 25.4),  # 14.0 + 6 x 1.9
    ("allreduce", 8, "Tree", "LL", "pci", 20.8),  # 6.8 + 14 x 1.0
    ("allreduce", 8, "Tree", "Simple", "nvlink", 64.4),  # 8.4 + 14 x 4.0
    ("allreduce", 2, "Tree", "LL128", "nvlink", 16.5),  # 14.0 + 2 x 1.25
    ("allreduce", 8, "NVLS", "Simple", "nvlink", 25.0),  # hwLat[NVLINK][NVLS] alone
    ("all_gather", 8, "NVLS", "Simple", "nvlink", 25.0),  # the same for every collective
]


@pytest.mark.parametrize("op,nranks,algo,proto,link,expected", LATENCY_TERMS)
def test_latency_term_is_nccls_base_plus_steps_times_hop(op, nranks, algo, proto, link, expected):
    assert cm.latency_term_us(op, nranks, algo, proto, link) == pytest.approx(expected)


def test_tiny_all_gather_costs_its_latency_term():
    # 8 bytes on one channel: transfer = 8 B / (PCI_BW x .5 x 8/7, several GB/s) < 0.01 us,
    # so the time is the latency term, 6.6 + 7 x 1.0 = 13.6 us (LL over PCI P2P).
    t = cm.op_time_us("all_gather", 8, 8, "Ring", "LL", "pci", channels=1)
    assert t == pytest.approx(13.6, abs=0.01)
    t = cm.op_time_us("reduce_scatter", 8, 8, "Ring", "LL", "pci", channels=1)
    assert t == pytest.approx(13.6, abs=0.01)


def test_simple_over_pcie_times_with_the_fitted_constants_per_ring_step():
    # For the time (not NCCL's estimate) Simple over PCIe uses this project's fit, 15 us +
    # 1.5 us per ring step (ModelParams.pcie_simple_time, fitted to 2x L40S and 8x 5090
    # results), and through host memory each step also pays SHM's extra over PCI for
    # Simple, 6.7 - 5.7 = 1.0 us. all_gather on 8 ranks has 7 steps.
    assert cm.latency_term_us("all_gather", 8, "Ring", "Simple", "pci", for_time=True) == pytest.approx(
        25.5
    )  # 15 + 7 x 1.5
    assert cm.latency_term_us("all_gather", 8, "Ring", "Simple", "shm", for_time=True) == pytest.approx(
        32.5
    )  # 15 + 7 x (1.5 + 1.0)
    assert cm.latency_term_us("allreduce", 8, "Ring", "Simple", "shm", for_time=True) == pytest.approx(
        50.0
    )  # 15 + 14 x (1.5 + 1.0)


# Where NCCL's estimate switches from Ring/LL to Ring/Simple on 8 ranks of the `pcie` kind
# (2 channels; LL128 off on PCIe; Tree only for allreduce, and it loses there: its
# bandwidth is x .92 x .5 and a correction factor <= 1 against Ring's n/nsteps = 8/14):
#   LL:     baseLat + nsteps x hwLat + B / (2 x PCI_BW x .5 x 8/nsteps)
#   Simple: baseLat + nsteps x hwLat + B / (2 x PCI_BW      x 8/nsteps)
# LL's bandwidth is half Simple's, so they are equal where B = (Simple's latency - LL's)
# x Simple's bandwidth:
#   all_gather (7 steps): (8.4 + 7 x 5.7) - (6.6 + 7 x 1.0) = 48.3 - 13.6 = 34.7 us
#   allreduce (14 steps): (8.4 + 14 x 5.7) - (6.6 + 14 x 1.0) = 88.2 - 20.6 = 67.6 us
# (With n instead of n-1 steps all_gather's gap would be 39.4 us: the switch 13.5% later.)
SWITCH = {"all_gather": (34.7, 7), "reduce_scatter": (34.7, 7), "allreduce": (67.6, 14)}


@pytest.mark.parametrize("op", sorted(SWITCH))
def test_nccl_switches_to_simple_where_the_hand_sum_says(op):
    gap_us, nsteps = SWITCH[op]
    switch = gap_us * 2 * PCI_BW * 8 / nsteps * 1e3  # GB/s = 1e3 bytes per us
    topo = cm.topology("pcie")
    for factor, proto in ((0.9, "LL"), (0.97, "LL"), (1.03, "Simple"), (1.1, "Simple")):
        choice = cm.choose(op, int(switch * factor), 8, {}, topo)
        assert (choice.algo, choice.proto) == ("Ring", proto), (factor, switch)


def test_the_designs_log_example_runs_on_one_channel():
    # DESIGN.md section 5 quotes NCCL's log "AllReduce: 14336 Bytes -> Algo RING proto LL
    # channel{Lo..Hi}={0..0}". enqueue.cc drops channels while bytes < channels x threads
    # x threshold (Ring LL: 8 x nRanks = 64 B per thread): 14336 < 2 x 512 x 64 = 65536,
    # so 1 channel; then threads halve while 14336 < 1 x nt x 64: 512 -> 256 -> 128
    # (14336 >= 128 x 64 = 8192 stops it).
    assert cm.launch_shape(14336, "Ring", "LL", 2, 512, 8) == (1, 128)
    # 57344 B (4 tokens): 57344 < 65536 -> 1 channel; 57344 >= 512 x 64 = 32768 -> 512.
    assert cm.launch_shape(57344, "Ring", "LL", 2, 512, 8) == (1, 512)
    # 16 MiB keeps both channels and all threads: 16777216 >= 65536.
    assert cm.launch_shape(16 << 20, "Ring", "LL", 2, 512, 8) == (2, 512)


# NCCL 2.29.7's own tuning table, as it printed it for 2 ranks on 2 nodes (one rank per
# node, NET/Socket; ../shared/fixtures/real/nccl_debug/nccl2.29.7_tuning_table_bytes_algo_
# proto.txt, lines 10-12, Ring columns "latency/bandwidth"). With one rank per node every
# ring step crosses the network and tuning.cc charges it the Tree network latency
# (hwLat[NET][Tree] = 5.0 / 8.5 / 14.0 us, "with ppn=1 latencies are fully exposed"), so
# the table shows the step counts directly: AllGather and ReduceScatter one step (n-1),
# AllReduce two (2(n-1)):
#   AllGather     Ring LL 11.6 = 6.6 + 1 x 5.0   LL128 22.5 = 14.0 + 1 x 8.5   Simple 22.4 = 8.4 + 1 x 14.0
#   AllReduce     Ring LL 16.6 = 6.6 + 2 x 5.0   LL128 31.0 = 14.0 + 2 x 8.5   Simple 36.4 = 8.4 + 2 x 14.0
# The model's latency term, given that per-step latency as a link, must print the same.
NCCL_2_29_7_TABLE = {
    ("all_gather", "LL"): 11.6,
    ("all_gather", "LL128"): 22.5,
    ("all_gather", "Simple"): 22.4,
    ("reduce_scatter", "LL"): 11.6,
    ("reduce_scatter", "LL128"): 22.5,
    ("reduce_scatter", "Simple"): 22.4,
    ("allreduce", "LL"): 16.6,
    ("allreduce", "LL128"): 31.0,
    ("allreduce", "Simple"): 36.4,
}


@pytest.mark.parametrize("op,proto", sorted(NCCL_2_29_7_TABLE))
def test_latency_term_reproduces_nccls_printed_table(op, proto):
    net_step = {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}  # tuning.cc hwLat[NET][Tree]
    params = cm.NCCL_PARAMS.perturbed(
        hw_lat={**cm.NCCL_PARAMS.hw_lat, "net": {("Ring", p): v for p, v in net_step.items()}}
    )
    got = cm.latency_term_us(op, 2, "Ring", proto, "net", params)
    assert got == pytest.approx(NCCL_2_29_7_TABLE[(op, proto)])


# NCCL tuning.cc treeCorrectionFactor (2.2x+), one per power of two from 64 B (index
# log2(bytes >> 6)), rows LL / LL128 / Simple, copied from NCCL's source:
TREE_CORRECTION = {
    "LL": (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    "LL128": (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
    ),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
    ),
}


@pytest.mark.parametrize("proto", sorted(TREE_CORRECTION))
def test_tree_estimate_applies_nccls_correction_factor_per_power_of_two(proto):
    # NCCL's view of the `nvlink` kind (16 channels, its usual graph), 2 ranks, allreduce:
    # latency = Tree baseLat + 2 x hwLat[NVLink][Tree] (LL 6.8 + 2 x .6 = 8.0, LL128 14.0 +
    # 2 x 1.25 = 16.5, Simple 8.4 + 2 x 4.0 = 16.4); bus = 16 x NVLINK_BW x (tuning.cc one
    # node: .92 / 3.8 for LL, capped at llMaxBw 87.7; .92 x 7/9 for LL128; .92 for Simple);
    # Tree's algorithm bandwidth is bus x .5, times the factor of the size's row.
    nvlink_bw = cm.NCCL_PARAMS.bw_per_channel["nvlink"]  # this project's guess, as PCI_BW
    latency = {"LL": 8.0, "LL128": 16.5, "Simple": 16.4}[proto]
    bus = 16 * nvlink_bw * {"LL": 0.92 / 3.8, "LL128": 0.92 * 7 / 9, "Simple": 0.92}[proto]
    bus = min(bus, 87.7) if proto == "LL" else bus
    topo = cm.topology("nvlink")
    for index, factor in enumerate(TREE_CORRECTION[proto]):
        for nbytes in (64 << index, (128 << index) - 1):  # the whole power-of-two bucket
            expected = latency + nbytes / (bus * 0.5 * factor * 1e3)  # GB/s = 1e3 B/us
            got = cm.nccl_estimate_us("allreduce", nbytes, 2, "Tree", proto, topo, 16)
            assert got == pytest.approx(expected), (nbytes, factor)
    # outside the table (below 64 B, from 64 B << 23 = 512 MiB): no correction
    for nbytes in (32, 64 << 23):
        expected = latency + nbytes / (bus * 0.5 * 1e3)
        assert cm.nccl_estimate_us("allreduce", nbytes, 2, "Tree", proto, topo, 16) == pytest.approx(expected)


# The `shm` per-hop latencies are this model's guess: PCI's (tuning.cc hwLat[PCI]) plus
# 0.3 us (LL), 0.5 (LL128) and 1.0 (Simple), for Ring and Tree alike (module docstring).
SHM_HOPS = {
    ("Ring", "LL"): 1.3,  # 1.0 + .3
    ("Ring", "LL128"): 3.0,  # 2.5 + .5
    ("Ring", "Simple"): 6.7,  # 5.7 + 1.0
    ("Tree", "LL"): 1.3,  # 1.0 + .3
    ("Tree", "LL128"): 2.4,  # 1.9 + .5
    ("Tree", "Simple"): 5.0,  # 4.0 + 1.0
}


@pytest.mark.parametrize("algo,proto", sorted(SHM_HOPS))
def test_shm_hops_are_pcis_plus_the_documented_extra(algo, proto):
    # allreduce on 8 ranks: baseLat + 14 hops (NCCL's estimate path, for_time=False)
    base = {"Ring": (6.6, 14.0, 8.4), "Tree": (6.8, 14.0, 8.4)}[algo][("LL", "LL128", "Simple").index(proto)]
    expected = base + 14 * SHM_HOPS[(algo, proto)]
    assert cm.latency_term_us("allreduce", 8, algo, proto, "shm") == pytest.approx(expected)


def test_transfer_time_uses_24_gb_s_per_pcie_channel():
    # NCCL topo.cc ncclTopoAddPci: a PCI link is width x speed / 80 GB/s, and kvDictPciGen
    # gives "16 GT/s" (Gen4) 120, so x16 Gen4 = 16 x 120 / 80 = 24 GB/s per channel.
    # Ring/LL allreduce, 8 ranks, 2 channels: bus = 2 x 24 x .5 = 24 GB/s (under llMaxBw),
    # algorithm bandwidth = 24 x 8 / 14 GB/s; 1 MiB more costs 1048576 x 14 / (8 x 24 x 1e3)
    # = 76.4587 us more (the latency and channel terms cancel in the difference).
    t1 = cm.op_time_us("allreduce", 1 << 20, 8, "Ring", "LL", "pci", channels=2)
    t2 = cm.op_time_us("allreduce", 2 << 20, 8, "Ring", "LL", "pci", channels=2)
    assert t2 - t1 == pytest.approx(76.4587, abs=1e-3)


def test_nvls_algorithm_bandwidth_is_five_sixths_of_the_bus():
    # tuning.cc: NVLS converts bus to algorithm bandwidth with ratio 5/6 (Ring n/nsteps,
    # Tree .5). 1 channel of NVLINK_BW: 1e6 B more costs 1e6 / (NVLINK_BW x 5/6 x 1e3) us.
    nvlink_bw = cm.NCCL_PARAMS.bw_per_channel["nvlink"]
    t1 = cm.op_time_us("allreduce", 1_000_000, 8, "NVLS", "Simple", "nvlink", channels=1)
    t2 = cm.op_time_us("allreduce", 2_000_000, 8, "NVLS", "Simple", "nvlink", channels=1)
    assert t2 - t1 == pytest.approx(1e6 / (nvlink_bw * 5 / 6 * 1e3))
    assert t1 == pytest.approx(25.0 + 1e6 / (nvlink_bw * 5 / 6 * 1e3))  # hwLat[NVLINK][NVLS] 25 us


def test_small_buffsize_adds_one_scaled_hop_per_extra_simple_slot():
    # Ring/Simple allreduce over NVLink, 8 ranks, 2 channels, NCCL_BUFFSIZE 65536: a slot is
    # 65536 / 8 = 8192 B; 1 MiB gives each channel and rank 1048576 / 16 = 65536 B = 8 slots,
    # so 7 extra hops of hwLat 3.4 us = 23.8 us, and with lat_scale 2 every latency doubles:
    # 47.6 us (the default buffer, 4 MiB / 8 = 512 KiB per slot, has no extra slot).
    scaled = cm.NCCL_PARAMS.perturbed(lat_scale=2.0)
    for params, extra in ((cm.NCCL_PARAMS, 23.8), (scaled, 47.6)):
        small = cm.op_time_us("allreduce", 1 << 20, 8, "Ring", "Simple", "nvlink", 2, buffsize=65536, params=params)
        default = cm.op_time_us("allreduce", 1 << 20, 8, "Ring", "Simple", "nvlink", 2, params=params)
        assert small - default == pytest.approx(extra)


# NCCL's path types in order (src/graph/topo.h PATH_LOC 0 ... PATH_SYS 9); P2P is used
# while the pair's path is no farther than NCCL_P2P_LEVEL (paths.cc ncclTopoCheckP2p).
PATH_ORDER = ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"]


def test_p2p_level_compares_paths_in_nccls_order():
    import dataclasses

    for path in PATH_ORDER:
        topo = dataclasses.replace(cm.topology("pcie"), p2p_path=path)
        for level in PATH_ORDER:
            want = "shm" if PATH_ORDER.index(path) > PATH_ORDER.index(level) else "pci"
            assert cm.effective_link(topo, {"NCCL_P2P_LEVEL": level}) == want, (path, level)


def test_ring_bandwidth_per_protocol_over_nvlink():
    # Ring allreduce, 8 ranks, 16 channels of NVLINK_BW: bus = 16 x NVLINK_BW x (tuning.cc
    # LL .5, capped at llMaxBw 87.7 GB/s; LL128 .92; Simple 1), algorithm bandwidth = bus x
    # 8/14; 1 MiB more costs 1048576 x 14 / (8 x bus x 1e3) us. With NVLINK_BW 20: LL's
    # 160 GB/s is capped to 87.7, LL128 moves 294.4 and Simple 320.
    nvlink_bw = cm.NCCL_PARAMS.bw_per_channel["nvlink"]
    for proto, bus in (
        ("LL", min(16 * nvlink_bw * 0.5, 87.7)),
        ("LL128", 16 * nvlink_bw * 0.92),
        ("Simple", 16 * nvlink_bw),
    ):
        t1 = cm.op_time_us("allreduce", 1 << 20, 8, "Ring", proto, "nvlink", 16)
        t2 = cm.op_time_us("allreduce", 2 << 20, 8, "Ring", proto, "nvlink", 16)
        assert t2 - t1 == pytest.approx(1048576 * 14 / (8 * bus * 1e3)), proto


def test_bandwidth_calibration_multiplies_the_per_channel_bandwidth():
    # `model fit`'s bandwidth factors: bw_scale per protocol times pair_bw_scale per
    # (algorithm, protocol). Ring/LL over PCI, 8 ranks, 1 channel: bus = 24 x .5 = 12 GB/s;
    # with both factors 2 it is 48 GB/s, so 1 MiB more costs 1048576 x 14 / (8 x 48e3) =
    # 38.2293 us instead of 152.917 us.
    fitted = cm.NCCL_PARAMS.perturbed(bw_scale={"LL": 2.0, "LL128": 1.0, "Simple": 1.0}, pair_bw_scale={"Ring/LL": 2.0})
    for params, extra in ((cm.NCCL_PARAMS, 152.917), (fitted, 38.2293)):
        t1 = cm.op_time_us("allreduce", 1 << 20, 8, "Ring", "LL", "pci", 1, params=params)
        t2 = cm.op_time_us("allreduce", 2 << 20, 8, "Ring", "LL", "pci", 1, params=params)
        assert t2 - t1 == pytest.approx(extra, abs=1e-3)


def test_a_one_channel_pool_launches_one_channel():
    # enqueue.cc starts from the communicator's channels: a pool of 1 (NCCL_MAX_NCHANNELS=1)
    # launches 1 channel at any size, with all its threads for a large one (16 MiB >= 512 x 64).
    assert cm.launch_shape(16 << 20, "Ring", "Simple", 1, 512, 8) == (1, 512)
    assert cm.launch_shape(16 << 20, "Ring", "LL", 0, 512, 8) == (1, 512)  # never fewer than 1


def test_auto_topology_uses_a_detected_kind_the_model_knows(monkeypatch):
    from nccl_tune.nccl import topology as topo_mod

    monkeypatch.setattr(topo_mod, "detect_kind", lambda: "nvswitch")
    assert cm.resolve_topology("auto") == ("nvswitch", "nvswitch (detected)")
    monkeypatch.setattr(topo_mod, "detect_kind", lambda: "infiniband-pod")
    name, how = cm.resolve_topology("auto")
    assert name == cm.DEFAULT_TOPOLOGY and "detected 'infiniband-pod', which the model does not know" in how
