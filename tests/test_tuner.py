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


def test_plugin_version_warnings_start_at_the_documented_releases():
    # docs/commands/recommend.md: the example plugin is fixed in 2.30.3 (older ones crash on
    # the flat cost table), and NCCL core loads v5/v6 plugins from 2.28.3.
    assert tuner.version_warnings(None, "x") == []  # an unknown version warns of nothing
    assert tuner.version_warnings((2, 30, 3), "x") == []
    (crash,) = tuner.version_warnings((2, 30, 2), "x")
    assert "CRASHES" in crash and "2.30.3" in crash
    assert len(tuner.version_warnings((2, 28, 3), "x")) == 1  # crashes, but is loaded
    assert "loads tuner interfaces v2-v4 only" in tuner.version_warnings((2, 28, 2), "x")[1]


def test_a_rule_note_lists_at_most_six_measured_sizes():
    def note(n):
        pts = [tuner.Point(1024 * (i + 1), "Ring", "LL", 1, "measured", True) for i in range(n)]
        (rule,) = tuner.tile(pts, "allreduce", 1, 8)
        return rule.note

    assert note(6) == "measured (measured at 1024, 2048, 3072, 4096, 5120, 6144 B)"
    assert note(7) == "measured (measured at 1024, 2048, 3072, 4096, 5120, 6144, ... B)"


def test_comment_lines_cut_long_words_without_losing_or_padding_anything():
    # A '#' line holds MAX_LINE_CHARS - 2 = 198 characters; a word is cut into pieces of
    # 198 - 6 = 192 so that "#   " continuation lines have room.
    exact = "a" * 192  # fits whole: "# " + 192 characters, no empty piece after it
    assert tuner.render([], [exact]).splitlines()[0] == "# " + exact
    word = "".join(chr(ord("a") + i % 26) for i in range(500))  # pieces 192 + 192 + 116
    lines = tuner.render([], [word]).splitlines()[:3]
    assert lines == ["# " + word[:192], "#    " + word[192:384], "#    " + word[384:]]


@pytest.mark.parametrize("extra", [",0", ",0,1"])
def test_parse_takes_the_plugins_optional_fields(extra):
    # NVIDIA/nccl plugins/tuner/example/plugin.c, loadConfig: 8 required fields, then
    # numPipeOps and regBuff (CONFIG_FIELDS_MAX = 10).
    (rule,) = tuner.parse("allreduce,0,10,ring,ll,1,1,8" + extra + "\n")
    assert rule == tuner.Rule("allreduce", 0, 10, "ring", "ll", 1, 1, 8)


def test_parse_refuses_an_eleventh_field():
    # plugin.c's tokenizer stops at CONFIG_FIELDS_MAX = 10 tokens, so an 11th field would
    # be dropped without a word: refused here instead.
    with pytest.raises(ValueError, match="line 1: expected 8-10"):
        tuner.parse("allreduce,0,10,ring,ll,1,1,8,0,1,7\n")


def test_the_half_way_size_is_the_floor_of_the_exact_geometric_mean():
    # points b - 2 and b, b = 2**30: (b - 1)**2 = b(b - 2) + 1, so sqrt(b(b - 2)) is just
    # under b - 1 and the first rule ends at b - 2 (a float sqrt rounds it up to b - 1).
    b = 2**30
    rules = tuner.rules_from_points([(b - 2, "Ring", "LL", 1), (b, "Ring", "Simple", 1)], 1, 8)
    assert [(r.min_bytes, r.max_bytes) for r in rules] == [(0, b - 2), (b - 1, tuner.MAX_BYTES)]
    # neighbours one byte apart: the first keeps its own size (isqrt(b(b - 1)) = b - 1)
    rules = tuner.rules_from_points([(b - 1, "Ring", "LL", 1), (b, "Ring", "Simple", 1)], 1, 8)
    assert [(r.min_bytes, r.max_bytes) for r in rules] == [(0, b - 1), (b, tuner.MAX_BYTES)]
    # a point at 0 B counts as 1 B: 0 and 2 meet at isqrt(1 x 2) = 1, so 1 B stays with 0 B
    rules = tuner.rules_from_points([(0, "Ring", "LL", 1), (2, "Ring", "Simple", 1)], 1, 8)
    assert [(r.min_bytes, r.max_bytes) for r in rules] == [(0, 1), (2, tuner.MAX_BYTES)]


def _padded_line(total):
    # a rule line of `total` bytes: spaces before the channel count (the plugin trims them)
    head, tail = "allreduce,0,1000,tree,simple,", "3,1,8"
    return head + " " * (total - len(head) - len(tail)) + tail


def test_parse_reads_lines_the_plugins_fgets_reads_whole():
    # plugin.c loadConfig: fgets(line, MAX_LINE_LENGTH = 256) takes at most 255 bytes, so a
    # 255-byte line is read whole (its newline comes next, alone, and is skipped as empty)
    # and a 256-byte one is cut (test_tuner_plugin.py shows both on the real plugin).
    (rule,) = tuner.parse(_padded_line(255) + "\n")
    assert rule == tuner.Rule("allreduce", 0, 1000, "tree", "simple", 3, 1, 8)
    with pytest.raises(ValueError, match="line 1: longer than the plugin's 256-byte line buffer"):
        tuner.parse(_padded_line(256) + "\n")


def test_render_allows_rule_lines_of_exactly_max_line_chars():
    # a rule line may be MAX_LINE_CHARS = 200 bytes long, not one more
    fixed = len("allreduce,0,,ring,ll,1,1,8")  # 26 bytes without max_bytes' digits
    exact = tuner.Rule("allreduce", 0, int("9" * (200 - fixed)), "ring", "ll", 1, 1, 8)
    assert len(exact.line()) == 200 and tuner.render([exact], []).splitlines()[-1] == exact.line()
    over = tuner.Rule("allreduce", 0, int("9" * (201 - fixed)), "ring", "ll", 1, 1, 8)
    with pytest.raises(ValueError, match="rule line too long"):
        tuner.render([over], [])


def test_gaps_include_the_last_size_alone():
    # rules up to MAX_BYTES - 1 leave exactly one size, MAX_BYTES itself, to one channel
    rules = tuner.rules_from_points([(1024, "Ring", "LL", 1)], 1, 8)
    short = [tuner.Rule("allreduce", 0, tuner.MAX_BYTES - 1, "ring", "ll", 1, 1, 8)]
    assert tuner.gaps(rules, "allreduce", 1, 8) == []
    assert tuner.gaps(short, "allreduce", 1, 8) == [(tuner.MAX_BYTES, tuner.MAX_BYTES)]


def test_comment_words_fill_a_line_to_exactly_198_characters():
    # _wrap_comment's limit is MAX_LINE_CHARS - 2 = 198: "# " + 100 + " " + 95 = 198 fits
    # one line; one character more moves the second word to a "#   " continuation line.
    assert tuner.render([], ["x" * 100 + " " + "y" * 95]).splitlines()[0] == "# " + "x" * 100 + " " + "y" * 95
    lines = tuner.render([], ["x" * 100 + " " + "y" * 96]).splitlines()[:2]
    assert lines == ["# " + "x" * 100, "#    " + "y" * 96]
