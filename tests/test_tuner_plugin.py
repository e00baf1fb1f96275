"""Every tuner CSV nccl-tune writes, loaded into NCCL's REAL example tuner plugin (2.30.7).

The plugin is built with gcc from ../shared/fixtures/real/nccl_tuner_example_2.30.7 and
driven by tests/tuner_harness/harness.c the way NCCL core calls it (flat cost table,
nChannels starting at 0, the cheapest entry >= 0 wins). For each CSV kind (modelled,
measured, sim, 2-node) every collective at every probed size must get the intended
algorithm, protocol and channels, and nothing may fall through to the plugin's
one-channel default.
"""

from __future__ import annotations

import factories
import pytest
import tuner_plugin

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.nccl import tuner

OPS = {
    "allreduce": "allreduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
SIZES = (8192, 14336, 28672, 57344)
P2P_LL = {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    return tuner_plugin.build(tmp_path_factory.mktemp("tuner_plugin"))


def synth(env_lat, world=8, nnodes=1, rounds=5, seed=0, algo_above="Ring", nccl="2.30.7"):
    """Records of a sweep: baseline at 60 us, the cell faster (24 us) at all but 8192 B, with
    NCCL's log reporting Tree/LL on 2 channels at <= 14336 B and Ring/LL on 1 above."""

    def effective(nbytes):
        algo, ch = ("Tree", 2) if nbytes <= 14336 else (algo_above, 1)
        return {"effective": {"algo": algo, "proto": "LL", "channels": ch, "confirmed": True, "detail": "log"}}

    cells = [
        (env, (lambda b: 24.0 if b != 8192 else 60.0) if fast else (lambda b: 60.0), effective if fast else {})
        for env, fast in env_lat
    ]
    return factories.sweep_records(
        cells,
        SIZES,
        rounds=rounds,
        noise=0.4,
        drift_sd=1.5,
        seed=seed,
        samples=25,
        world_size=world,
        nnodes=nnodes,
        versions={"nccl": nccl, "torch": "2.8", "cuda": "12.9"},
        gpus=["NVIDIA RTX PRO 6000"] * world,
        topology="pcie-shm",
    )


def csv_rows(text):
    return [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]


def boundary_probes(text):
    """Every rule's edges and their neighbours, 0 and SIZE_MAX, for every collective."""
    probes = set()
    for coll in OPS:
        probes |= {(coll, 0), (coll, tuner.MAX_BYTES), (coll, 1 << 30), (coll, 64 << 20), (coll, 1 << 24)}
    for row in csv_rows(text):
        lo, hi = int(row[1]), int(row[2])
        probes |= {(row[0], lo), (row[0], hi), (row[0], max(lo - 1, 0)), (row[0], min(hi + 1, tuner.MAX_BYTES))}
    return sorted(probes)


def disabled_by(env):
    """(func, algo, proto) triples NCCL core marks IGNORE under `env` on a one-node PCIe
    machine: what NCCL_ALGO / NCCL_PROTO disable, LL128 (off by default on PCIe), NVLS,
    NVLSTree, CollNet (no NVSwitch / one node / no CollNet) and PAT (one rank per node only)."""
    from nccl_tune.nccl import settings

    out = []
    for coll, f in tuner_plugin.FUNC.items():
        algos = settings.allowed_algorithms(env.get("NCCL_ALGO"), coll)
        protos = settings.allowed_protocols(env.get("NCCL_PROTO"), coll)
        for a, plugin_algo in enumerate(tuner_plugin.ALGO):
            for p, plugin_proto in enumerate(tuner_plugin.PROTO):
                name_a = {v: k for k, v in tuner.ALGORITHM_NAMES.items()}[plugin_algo]
                name_p = {v: k for k, v in tuner.PROTOCOL_NAMES.items()}[plugin_proto]
                off = (
                    name_a not in algos
                    or name_p not in protos
                    or name_a in ("NVLS", "NVLSTree", "CollNetDirect", "CollNetChain", "PAT")
                    or (name_p == "LL128" and "LL128" not in (env.get("NCCL_PROTO") or ""))
                )
                if off:
                    out.append((f, a, p))
    return out


def assert_no_one_channel_fallthrough(answers):
    missed = [(a.collective, a.nbytes) for a in answers if not a.applied or a.channels < 1]
    assert not missed, f"fell through to the plugin's one-channel default: {missed[:10]}"


# NCCL's choice at 16 MiB and 1 GiB, worked out by hand from tuning.cc (not from the cost
# model under test). At these sizes the latency terms (tens of us) are noise beside the
# transfer (ms), so the widest bandwidth wins: Ring's algorithm bandwidth is bus x n/nsteps
# (8/14 for allreduce), Tree's bus x .92 x .5 x a correction factor <= 1 (about .46), and
# LL moves half of Simple's bytes (x .5), LL128 is off on PCIe. So Ring/Simple, or Ring/LL
# where NCCL_PROTO=LL leaves only LL. Channels: the pool of 2 the `pcie` kinds search
# finds (kinds.py), kept because 16 MiB >= 2 channels x 256 threads x 64 B (Simple) and
# >= 2 x 512 x 8 x 8 (Ring LL), enqueue.cc's thresholds.
LARGE = (1 << 24, 1 << 30)
RING_SIMPLE_2 = ("ring", "simple", 2)
RING_LL_2 = ("ring", "ll", 2)


def expect_large(answers, expected, ops=OPS):
    """At 16 MiB and 1 GiB every collective in `ops` gets the hand-derived `expected`."""
    checked = [a for a in answers if a.collective in ops and a.nbytes in LARGE]
    assert {(a.collective, a.nbytes) for a in checked} == {(c, b) for c in ops for b in LARGE}
    for a in checked:
        assert (a.algorithm, a.protocol, a.channels) == expected, a


def test_modelled_csv_covers_every_collective_and_size(plugin, tmp_path, cli_runner):
    csv = tmp_path / "modelled.conf"
    result = cli_runner.invoke(
        cli,
        ["recommend", "--layers", "61", "--topology", "pcie", "--tuner-csv", str(csv), "--force"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    text = csv.read_text()
    assert all(len(line.encode()) <= 200 for line in text.splitlines())
    answers = plugin.query(csv, 8, 1, boundary_probes(text), disabled_by({}))
    assert_no_one_channel_fallthrough(answers)
    expect_large(answers, RING_SIMPLE_2)
    # The 64 MiB allreduce the old CSV left on one channel now runs NCCL's modelled choice.
    big = next(a for a in answers if a.collective == "allreduce" and a.nbytes == 64 << 20)
    assert (big.algorithm, big.protocol, big.channels) == RING_SIMPLE_2
    # Another communicator shape matches nothing: one channel, as the header warns.
    other = plugin.query(csv, 4, 1, [("allreduce", 14336)], disabled_by({}))
    assert not other[0].applied and other[0].channels == 1
    assert "nNodes=1 nRanks=8 only" in text and "runs every collective on ONE channel" in text


def test_measured_csv_applies_the_measured_winner_and_nccls_choice_elsewhere(plugin, tmp_path, cli_runner):
    path = tmp_path / "r.jsonl"
    store.append_records(str(path), synth([({}, False), (P2P_LL, True)]))
    csv = tmp_path / "measured.conf"
    result = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", str(path), "--tuner-csv", str(csv)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    text = csv.read_text()
    answers = plugin.query(csv, 8, 1, boundary_probes(text) + [("allreduce", b) for b in SIZES], disabled_by(P2P_LL))
    assert_no_one_channel_fallthrough(answers)
    got = {(a.collective, a.nbytes): (a.algorithm, a.protocol, a.channels) for a in answers}
    assert got[("allreduce", 14336)] == ("tree", "ll", 2)  # measured winner, NCCL's log
    assert got[("allreduce", 28672)] == ("ring", "ll", 1)
    assert got[("allreduce", 57344)] == ("ring", "ll", 1)
    # 8192 B: not faster, so NCCL's own choice under the cell's settings, as its log showed.
    assert got[("allreduce", 8192)] == ("tree", "ll", 2)
    assert "not faster: NCCL's own choice, from NCCL's log (measured at 8192 B)" in text
    assert all(a.protocol == "ll" for a in answers)  # within what NCCL_PROTO=LL allows
    expect_large(answers, RING_LL_2)
    assert "measured winner (NCCL's log)" in text and "NCCL's own choice, MODELLED" in text
    assert all(len(line.encode()) <= 200 for line in text.splitlines())


def test_sim_csv(plugin, tmp_path, cli_runner):
    out = tmp_path / "sim.jsonl"
    sweep = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--topology",
            "pcie-shm",
            "--set",
            "NCCL_P2P_LEVEL=default,SYS",
            "--tokens",
            "1,4",
            "--rounds",
            "3",
            "--out",
            str(out),
        ],
    )
    assert sweep.exit_code == 0, sweep.output
    csv = tmp_path / "sim.conf"
    result = cli_runner.invoke(
        cli,
        ["recommend", "--layers", "61", "--results", str(out), "--tuner-csv", str(csv), "--force"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    text = csv.read_text()
    assert "SIMULATED" in text
    env = {"NCCL_P2P_LEVEL": "SYS"}
    answers = plugin.query(csv, 8, 1, boundary_probes(text), disabled_by(env))
    assert_no_one_channel_fallthrough(answers)
    expect_large(answers, RING_SIMPLE_2)
    sim = {r["bytes"]: r["effective"] for r in store.read_records([str(out)]) if r["env"] == env}
    got = {a.nbytes: a for a in plugin.query(csv, 8, 1, [("allreduce", b) for b in sim])}
    for b, eff in sim.items():
        assert (got[b].algorithm, got[b].protocol, got[b].channels) == (
            tuner.ALGORITHM_NAMES[eff["algo"]],
            tuner.PROTOCOL_NAMES[eff["proto"]],
            eff["channels"],
        )
    # And what the sim reported is NCCL's choice by hand (DESIGN.md's log example): with
    # 2 channels of 24 GB/s (the model's PCI figure), at 14336 B Ring/LL 6.6 + 14 x 1.0 +
    # 14336 B / (2 x 24 x .5 x 8/14 = 13.71 GB/s) = 21.65 us beats Tree/LL 6.8 + 14 x 1.0 +
    # 14336 / (2 x 24 x .92 / 3.8 x .5 x .7 = 4.07 GB/s) = 24.3 and Simple's 64.4 or 88.2 us
    # of latency alone; at 57344 B 24.8 against 34.9. One channel: both sizes are below
    # 2 channels x 512 threads x 64 B = 65536 B (enqueue.cc).
    assert {b: (got[b].algorithm, got[b].protocol, got[b].channels) for b in sim} == {
        14336: ("ring", "ll", 1),
        57344: ("ring", "ll", 1),
    }


def test_two_node_csv_matches_the_two_node_communicator(plugin, tmp_path, cli_runner):
    path = tmp_path / "r2.jsonl"
    store.append_records(str(path), synth([({}, False), (P2P_LL, True)], world=16, nnodes=2))
    csv = tmp_path / "two_node.conf"
    result = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", str(path), "--tuner-csv", str(csv)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    text = csv.read_text()
    assert {(row[6], row[7]) for row in csv_rows(text)} == {("2", "16")}
    answers = plugin.query(csv, 16, 2, boundary_probes(text) + [("allreduce", 14336)], disabled_by(P2P_LL))
    assert_no_one_channel_fallthrough(answers)
    assert next(a for a in answers if a.nbytes == 14336 and a.collective == "allreduce") == tuner_plugin.Answer(
        "allreduce", 14336, "tree", "ll", 2, True
    )
    # The same rules on a one-node communicator of 8 ranks match nothing.
    one = plugin.query(csv, 8, 1, [("allreduce", 14336)], disabled_by(P2P_LL))
    assert not one[0].applied and one[0].channels == 1


def test_a_collective_without_rules_is_refused_unless_forced(plugin, tmp_path, cli_runner):
    # NCCL_ALGO=Tree: the model knows no Tree for allgather/reducescatter/broadcast/reduce.
    tree = {"NCCL_P2P_LEVEL": "SYS", "NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}
    path = tmp_path / "t.jsonl"
    store.append_records(str(path), synth([({}, False), (tree, True)], algo_above="Tree"))
    csv = tmp_path / "tree.conf"
    args = ["recommend", "--layers", "61", "--results", str(path), "--tuner-csv", str(csv)]
    result = cli_runner.invoke(cli, args, catch_exceptions=False)
    assert not csv.exists()
    assert "would run every allgather" in result.output and "ONE channel" in result.output
    result = cli_runner.invoke(cli, args + ["--force"], catch_exceptions=False)
    assert csv.exists() and "NO RULE (runs on ONE channel): every allgather" in csv.read_text()
    answers = plugin.query(csv, 8, 1, [("allreduce", 14336), ("allgather", 14336)], disabled_by(tree))
    assert answers[0].applied and not answers[1].applied and answers[1].channels == 1


def test_a_csv_for_an_older_nccl_says_its_plugin_crashes(tmp_path, cli_runner):
    path = tmp_path / "old.jsonl"
    store.append_records(str(path), synth([({}, False), (P2P_LL, True)], nccl="2.29.7"))
    csv = tmp_path / "old.conf"
    cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", str(path), "--tuner-csv", str(csv)], catch_exceptions=False
    )
    text = csv.read_text().replace("\n#    ", " ")
    assert "WARNING: the results were measured with NCCL 2.29.7: the example plugin of NCCL 2.29.7 CRASHES" in text
    assert "2.30.3" in text.splitlines()[0]


def test_old_nccl_versions_are_warned_about():
    assert tuner.version_warnings((2, 30, 7), "x") == []
    assert "CRASHES" in tuner.version_warnings((2, 29, 7), "x")[0]
    assert len(tuner.version_warnings((2, 27, 5), "x")) == 2


def test_the_real_plugin_reads_a_255_byte_line_whole_and_cuts_a_256_byte_one(plugin, tmp_path):
    # tuner.parse refuses lines from 256 bytes on because fgets(line, 256) cuts them; the
    # real plugin applies a 255-byte rule and loses the last byte of a 256-byte one.
    head, tail = "allreduce,0,1000,tree,simple,", "3,1,8"
    for total, applied in ((255, True), (256, False)):
        line = head + " " * (total - len(head) - len(tail)) + tail
        csv = tmp_path / f"line{total}.conf"
        csv.write_text(line + "\n")
        (answer,) = plugin.query(csv, 8, 1, [("allreduce", 100)])
        assert answer.applied is applied, total
        assert (answer.algorithm, answer.protocol, answer.channels) == ("tree", "simple", 3) or not applied
