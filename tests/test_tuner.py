"""Tuner-plugin CSV: NCCL's example plugin format, explicit channels, valid names."""

from __future__ import annotations

import pytest

from nccl_tune.nccl import tuner

FIXTURE = "tests/fixtures/tuner/example_plugin_format.conf"


def test_rules_tile_every_size_and_split_where_the_winner_changes():
    points = [
        (1024, "Ring", "LL", 1),
        (4096, "Ring", "LL", 1),
        (16384, "Tree", "LL", 2),
        (65536, "Tree", "LL", 2),
        (1048576, "Ring", "Simple", 2),
    ]
    rules = tuner.rules_from_points(points, nnodes=1, nranks=8)
    assert [(r.min_bytes, r.max_bytes, r.algorithm, r.protocol, r.channels) for r in rules] == [
        (0, 8192, "ring", "ll", 1),
        (8193, 262144, "tree", "ll", 2),
        (262145, tuner.MAX_BYTES, "ring", "simple", 2),
    ]
    assert all(r.nnodes == 1 and r.nranks == 8 for r in rules)
    assert tuner.gaps(rules, "allreduce", 1, 8) == []
    assert tuner.gaps(rules, "allgather", 1, 8) == [(0, tuner.MAX_BYTES)]
    assert tuner.gaps(rules, "allreduce", 1, 4) == [(0, tuner.MAX_BYTES)]
    assert tuner.gaps(rules[:1] + rules[2:], "allreduce", 1, 8) == [(8193, 262144)]
    # First match wins; the plugin's nNodes/nRanks must match the communicator.
    assert tuner.first_match(rules, "allreduce", 14336, 1, 8).algorithm == "tree"
    assert tuner.first_match(rules, "allreduce", 1 << 40, 1, 8).protocol == "simple"
    assert tuner.first_match(rules, "allreduce", 14336, 1, 4) is None


def test_tile_notes_say_where_each_row_comes_from():
    pts = [
        tuner.Point(0, "Ring", "LL", 1, "NCCL's own choice, MODELLED for pcie"),
        tuner.Point(14336, "Ring", "LL", 1, "measured winner (NCCL's log)", True),
        tuner.Point(57344, "Ring", "LL", 1, "measured winner (NCCL's log)", True),
    ]
    rules = tuner.tile(pts, "allreduce", 1, 8)
    assert [r.note for r in rules] == [
        "NCCL's own choice, MODELLED for pcie",
        "measured winner (NCCL's log) (measured at 14336, 57344 B)",
    ]
    text = tuner.render(rules, [])
    assert "# allreduce 120-18446744073709551615 B: measured winner" in text
    assert tuner.parse(text) == rules


@pytest.mark.parametrize("point", [(14336, None, "LL", 1), (14336, "Ring", None, 1)])
def test_a_point_without_a_choice_is_refused(point):
    with pytest.raises(ValueError, match="no algorithm/protocol"):
        tuner.rules_from_points([point], 1, 8)


@pytest.mark.parametrize("channels", [None, -1, 0])
def test_rules_always_need_an_explicit_channel_count(channels):
    with pytest.raises(ValueError, match="explicit channel count"):
        tuner.rules_from_points([(14336, "Ring", "LL", channels)], 1, 8)


def test_names_are_the_plugins_lower_case_names():
    assert tuner.plugin_algorithm("NVLSTree") == "nvls_tree"
    assert tuner.plugin_algorithm("CollNetDirect") == "collnet_direct"
    assert tuner.plugin_protocol("Simple") == "simple" and tuner.plugin_protocol("LL128") == "ll128"
    with pytest.raises(ValueError):
        tuner.plugin_algorithm("Butterfly")


def test_render_parses_back_with_the_plugins_rules():
    rules = tuner.rules_from_points([(14336, "Ring", "LL", 1), (57344, "Tree", "LL", 2)], 1, 8)
    header = [
        "x " * 150,
        "Load: export NCCL_TUNER_PLUGIN=... and NCCL_TUNER_CONFIG_FILE=...",
        "command: nccl-tune recommend --tuner-csv /" + "very-long-dir/" * 40 + "t.csv",
    ]
    text = tuner.render(rules, header)
    assert all(len(line.encode()) <= 200 for line in text.splitlines())  # 256-byte fgets buffer
    assert all(line.startswith("#") or line.count(",") == 7 for line in text.splitlines())
    assert tuner.parse(text) == rules


def test_parse_accepts_the_example_plugin_format(request):
    text = (request.config.rootpath / FIXTURE).read_text()
    rules = tuner.parse(text)
    assert len(rules) == 4
    assert rules[0] == tuner.Rule("allreduce", 0, 65536, "tree", "simple", 2, 1, -1)


@pytest.mark.parametrize(
    "line",
    [
        "allreduce,0,10,ring,ll,1,1",
        "allreduce,0,10,RING,ll,1,1,8",
        "allreduce,0,10,ring,LL,1,1,8",
        "allreduce,0,x,ring,ll,1,1,8",
        "allgatherv,0,10,ring,ll,1,1,8",
        "allreduce,,10,ring,ll,1,1,8",
    ],
)
def test_parse_rejects_what_the_plugin_would_misread(line):
    with pytest.raises(ValueError, match="line 1"):
        tuner.parse(line + "\n")
