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
