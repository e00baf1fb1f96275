"""Profiles: the reader never evaluates or crashes, the writer round-trips and is atomic."""

from __future__ import annotations

import os
import string

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import profile
from nccl_tune.live.profile import parse_profile, render_profile

SAFE_CHARS = string.ascii_letters + string.digits + "_.,:^%/+-="  # the grammar's, written out
keys = st.from_regex(r"NCCL_[A-Z0-9_]{1,24}", fullmatch=True).filter(lambda k: not k.endswith("_PLUGIN"))
values = st.text(alphabet=SAFE_CHARS, max_size=40)
# Printable text (what a comment line may hold), without a trailing backslash.
printable = st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Co", "Cn", "Zl", "Zp", "Zs")) | st.just(" ")
prov_keys = st.from_regex(r"[A-Za-z][A-Za-z0-9 _-]{0,15}", fullmatch=True).map(str.strip).filter(bool)
prov_values = st.text(alphabet=printable, max_size=60).map(lambda t: t.strip().rstrip("\\").strip())
notes = st.lists(st.text(alphabet=printable, max_size=50).map(lambda t: t.rstrip("\\ ")), max_size=4)


@hsettings(max_examples=300, deadline=None)
@given(
    env=st.dictionaries(keys, values, max_size=12),
    provenance=st.dictionaries(prov_keys, prov_values, max_size=6),
    free=notes,
)
def test_any_valid_profile_round_trips(env, provenance, free):
    text = render_profile(env, provenance, free)
    back = parse_profile(text)
    assert back.env == env and list(back.env) == list(env)
    assert back.provenance == provenance


@hsettings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_parses_or_names_the_line(text):
    try:
        parse_profile(text, path="x.env")
    except NcclTuneError as exc:
        assert exc.line is not None and 1 <= exc.line <= text.count("\n") + 1
        assert str(exc).startswith(f"x.env:{exc.line}: malformed line")


@hsettings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "NCCL_PROTO=LL",
                "# c",
                "",
                "export NCCL_A=1",
                "NCCL_B='x y'",
                "\x0c# ff",
                "NCCL_C=1\r",
                "# a\u2028b",
                "bad line",
            ]
        ),
        max_size=20,
    )
)
def test_line_numbers_count_newlines_only(lines):
    text = "".join(line + "\n" for line in lines)
    parsed = profile.grammar.parse_lines(text)
    assert len(parsed) == len(lines)
    for number, raw in enumerate(lines, start=1):
        assert parsed[number - 1].number == number and parsed[number - 1].raw == raw


def test_read_forms():
    text = (
        "# nccl-tune profile\n# source: measured\n# gpus: 8x X\n\nexport NCCL_PROTO=LL\n"
        "NCCL_ALGO=Ring\nNCCL_DEBUG=INFO\nNCCL_ALGO=Tree\n  \t\n"
    )
    prof = parse_profile(text, "p.env")
    assert prof.env == {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree"}
    assert prof.lines == {"NCCL_PROTO": 5, "NCCL_DEBUG": 7, "NCCL_ALGO": 8}
    assert prof.provenance == {"source": "measured", "gpus": "8x X"}
    assert profile.grammar.parse_lines(text)[4].exported


def test_reader_refuses_what_would_run_and_never_evaluates(tmp_path):
    marker = tmp_path / "ran"
    for line in (f"NCCL_A=$(touch {marker})", "NCCL_B=${HOME}", f"NCCL_C=`touch {marker}`"):
        with pytest.raises(NcclTuneError) as info:
            parse_profile(f"# x\n{line}\n", "p.env")
        assert info.value.line == 2
    assert not marker.exists()


@pytest.mark.parametrize(
    "line,why",
    [
        ("NCCL_PROTO = LL", "a blank before '='"),
        ("NCCL_PROTO= LL", "a blank after '='"),
        ("NCCL-PROTO=LL", "is not a variable name"),
        ("=LL", "missing name"),
        ("just words", "expected NAME=VALUE"),
        ("NCCL_PROTO='LL", "a quote"),
        ("NCCL_PROTO='LL'", "a quote"),
        ("NCCL_PROTO=L\x01L", "a control character (U+0001)"),
        ("NCCL_PROTO=LL\r", "a carriage return"),
        ("LD_PRELOAD=/tmp/evil.so", "LD_PRELOAD is not an NCCL variable"),
        ("NCCL_NET_PLUGIN=/tmp/evil.so", "load a shared library"),
        (" NCCL_PROTO=LL", "a blank at the start of the line"),
        ("# trailing \\", "ending in a backslash"),
    ],
)
def test_malformed_lines_name_their_line(line, why):
    with pytest.raises(NcclTuneError) as info:
        parse_profile(f"# header\nNCCL_ALGO=Ring\n{line}\n", path="f.env")
    assert info.value.line == 3 and why in str(info.value)
    assert str(info.value).startswith("f.env:3: malformed line: ")


def test_provenance_stops_at_separator_and_body():
    text = render_profile({"NCCL_A": "1"}, {"source": "x"}, ["note: not provenance"])
    assert parse_profile(text).provenance == {"source": "x"}
    assert parse_profile("# a: 1\nNCCL_A=1\n# b: 2\n").provenance == {"a": "1"}


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_A": "x y"},
        {"NCCL_A": "a;b"},
        {"NCCL_A": "$(id)"},
        {"NCCL_A-B": "1"},
        {"NCCL_A": "'q'"},
        {"LD_PRELOAD": "/x.so"},
        {"PATH": "/tmp"},
        {"NCCL_TUNER_PLUGIN": "x.so"},
    ],
)
def test_render_refuses_what_cannot_be_written(env):
    with pytest.raises(NcclTuneError):
        render_profile(env)


def test_render_refuses_bad_provenance():
    with pytest.raises(NcclTuneError):
        render_profile({}, {"a:b": "c"})
    with pytest.raises(NcclTuneError):
        render_profile({}, {"a": "line\nbreak"})
    with pytest.raises(NcclTuneError):  # a CR ends the line for systemd: the rest would be read
        render_profile({}, {"a": "x\rLD_PRELOAD=/x.so"})
    with pytest.raises(NcclTuneError):  # systemd < v254 would join the next line to the comment
        render_profile({"NCCL_PROTO": "LL"}, {"a": "x \\"})


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "p.env"
    target.write_text("old\n")
    profile.write_profile(str(target), {"NCCL_PROTO": "LL"}, {"source": "test"})
    assert profile.load_profile(str(target)).env == {"NCCL_PROTO": "LL"}
    assert sorted(os.listdir(tmp_path)) == ["p.env"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_write_refusal_keeps_the_old_file(tmp_path):
    target = tmp_path / "p.env"
    target.write_text("NCCL_PROTO=LL\n")
    with pytest.raises(NcclTuneError):
        profile.write_profile(str(target), {"NCCL_PROTO": "a b"})
    assert target.read_text() == "NCCL_PROTO=LL\n"


def test_write_into_missing_folder_is_a_tool_error(tmp_path):
    with pytest.raises(NcclTuneError) as info:
        fileio.write_atomic(str(tmp_path / "nope" / "p.env"), "A=1\n")
    assert "nope" in str(info.value)


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(NcclTuneError) as info:
        profile.load_profile(str(tmp_path / "missing.env"))
    assert "missing.env" in str(info.value) and "No such file" in str(info.value)
    binary = tmp_path / "bin.env"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(NcclTuneError):
        profile.load_profile(str(binary))


def test_nccl_env_filters_and_sorts():
    assert profile.nccl_env({"B": "1", "NCCL_Z": "z", "NCCL_A": "a"}) == {"NCCL_A": "a", "NCCL_Z": "z"}


def test_shipped_profile_is_found_and_round_trips():
    names = [p.stem for p in profile.list_shipped()]
    assert "pcie-8gpu-decode" in names
    path = profile.resolve_profile("pcie-8gpu-decode")
    assert profile.resolve_profile("pcie-8gpu-decode.env") == path
    text = path.read_text()
    prof = profile.parse_profile(text, str(path))
    assert prof.env == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
    for needle in ("public report", "RTX PRO 6000 Blackwell", "62.9", "88.8", "not measured here"):
        assert needle in text
    lines = text.splitlines()
    note_lines = lines[lines.index("#") + 1 : lines.index("")]
    free = [line[2:] for line in note_lines]
    assert render_profile(prof.env, prof.provenance, free) == text


def test_resolve_profile_errors(tmp_path):
    own = tmp_path / "mine.env"
    own.write_text("A=1\n")
    assert profile.resolve_profile(str(own)) == own
    with pytest.raises(NcclTuneError) as info:
        profile.resolve_profile("no-such-profile")
    assert "pcie-8gpu-decode" in str(info.value)


def test_caps_sit_at_their_documented_values():
    grammar = profile.grammar
    ok = "".join(f"NCCL_V{i}=1\n" for i in range(256))
    assert len(parse_profile(ok).env) == 256
    with pytest.raises(NcclTuneError) as info:
        parse_profile(ok + "NCCL_V256=1\n", "v.env")
    assert info.value.line == 257
    grammar.check_env({f"NCCL_V{i}": "1" for i in range(256)}, "x")
    with pytest.raises(NcclTuneError):
        grammar.check_env({f"NCCL_V{i}": "1" for i in range(257)}, "x")
    # Lines: 4094 bytes and the '\n' fit one 4095-byte fgets read of NCCL's conf reader.
    assert parse_profile("#" + "x" * 4093 + "\n").env == {}
    for line in ("#" + "x" * 4094, "#" + "\u00e9" * 2047):  # 4095 bytes (2048 characters)
        with pytest.raises(NcclTuneError, match="4095 bytes"):
            parse_profile(line + "\n")
    with pytest.raises(NcclTuneError, match="at most 4094"):
        render_profile({}, {"note": "x" * 5000})
    assert parse_profile("NCCL_DEBUG_FILE=" + "a" * 1023 + "\n").env
    with pytest.raises(NcclTuneError, match="a value of 1024 characters"):
        parse_profile("NCCL_DEBUG_FILE=" + "a" * 1024 + "\n")


def test_prefixes_need_a_name_after_them_and_the_last_line_needs_no_newline():
    for line in ("NCCL_=1", "TORCH_NCCL_=1", "VLLM_ALLREDUCE_USE_=1"):
        with pytest.raises(NcclTuneError, match="not an NCCL variable"):
            parse_profile(line + "\n")
    assert parse_profile("# x\nNCCL_PROTO=LL").env == {"NCCL_PROTO": "LL"}
    assert parse_profile("").env == {} and parse_profile("\n").env == {}


def test_line_count_cap_and_messages_name_a_variable_once():
    grammar = profile.grammar
    assert parse_profile("\n" * 4095 + "# last, no newline").env == {}  # 4096 lines
    with pytest.raises(NcclTuneError, match="4097 lines"):
        parse_profile("\n" * 4096 + "# one too many")
    assert grammar.render_comment("x" * 4092) == "# " + "x" * 4092  # 4094 bytes: written
    with pytest.raises(NcclTuneError) as info:
        grammar.check_env({"LD_PRELOAD": "/x.so"}, "results cell c-1")
    assert str(info.value).startswith("results cell c-1: LD_PRELOAD is not an NCCL variable")
    with pytest.raises(NcclTuneError) as info:
        grammar.check_env({"NCCL_DEBUG_FILE": "a" * 2000}, "exec")
    assert str(info.value) == (
        "exec: NCCL_DEBUG_FILE: a value of 2000 characters (at most 1023, the longest NCCL reads from a conf file)"
    )


def test_the_allow_list_cannot_be_widened_in_place():
    import dataclasses

    grammar = profile.grammar
    entry = grammar.allowed_entry("VLLM_ALLREDUCE_USE_FLASHINFER")
    assert entry is not None and entry.values is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.values = ".*"  # a caller may not loosen the values an engine switch takes
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.pattern = "*"
    assert grammar.allowed_entry("VLLM_ALLREDUCE_USE_FLASHINFER") == entry and hash(entry) == hash(entry)


def test_file_line_and_name_caps_at_their_edges():
    # 4096 comment lines of 64 bytes ('#', 62 characters, '\n') = 262144 bytes = 256 KiB: accepted
    assert parse_profile(("#" + "x" * 62 + "\n") * 4096).env == {}
    with pytest.raises(NcclTuneError, match=r"larger than 256 KiB: not a profile"):
        parse_profile(("#" + "x" * 62 + "\n") * 4095 + "#" + "x" * 63 + "\n")  # 262145 bytes
    # the cap is on bytes: 'é' is 2 bytes in UTF-8, so 64-byte lines of 33 characters
    assert parse_profile(("#" + "\u00e9" * 31 + "\n") * 4096).env == {}  # 262144 bytes, 135168 characters
    with pytest.raises(NcclTuneError, match="larger than 256 KiB"):
        parse_profile(("#" + "\u00e9" * 31 + "\n") * 4095 + "#" + "\u00e9" * 31 + "x\n")  # 262145 bytes
    # a last line ending in '\n' starts no further line: "\n" x 4096 is 4096 lines
    assert parse_profile("\n" * 4096).env == {}
    with pytest.raises(NcclTuneError, match="4097 lines"):
        parse_profile("\n" * 4097)
    # names: at most 128 characters ('NCCL_' and 123 more is 128)
    assert parse_profile("NCCL_" + "A" * 123 + "=1\n").env == {"NCCL_" + "A" * 123: "1"}
    with pytest.raises(NcclTuneError, match=r"a name of 129 characters \(at most 128\)"):
        parse_profile("NCCL_" + "A" * 124 + "=1\n")


def test_the_writer_refuses_a_bad_name_or_a_bad_value_and_an_overlong_comment():
    grammar = profile.grammar
    assert grammar.render_assignment("NCCL_PROTO", "LL") == "NCCL_PROTO=LL"
    with pytest.raises(NcclTuneError, match="cannot write LD_PRELOAD: LD_PRELOAD is not an NCCL variable"):
        grammar.render_assignment("LD_PRELOAD", "x.so")  # a value the grammar takes, a name it does not
    with pytest.raises(NcclTuneError, match="cannot write NCCL_PROTO: value 'LL;x' holds"):
        grammar.render_assignment("NCCL_PROTO", "LL;x")  # a name it takes, a value it does not
    # '# ' and 4093 characters is 4095 bytes, one over MAX_LINE_BYTES (4094)
    with pytest.raises(NcclTuneError, match=r"a comment line of 4095 bytes \(at most 4094\)"):
        grammar.render_comment("x" * 4093)
