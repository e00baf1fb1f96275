"""A corpus of hostile profile lines: each is refused by lint (exit 1, an error naming the
line), by exec (exit 2, nothing run), by every export, and by every command that reads
a profile. The forms issue 19 lists first (each passed lint and ran code before), then
more of the same kinds.
"""

from __future__ import annotations

import json
import os

import pytest
from test_recommend import P2P_LL, confirmed, flat, synth, write

from nccl_tune.cli import cli
from nccl_tune.decide import export, recommendation
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import conffile, grammar, profile
from nccl_tune.measure import grid

CMD = "touch canary"
ISSUE = [  # issue 19, "What was seen"
    f"X='a'$({CMD})'b'",
    f"X='a';{CMD};'b'",
    f'X="a";{CMD};"b"',
    f"X='a'`{CMD}`'b'",
    f"X='a'\"$({CMD})\"'b'",
    f"NCCL_DEBUG_FILE='a'$({CMD})'b'",
    f"NCCL_DEBUG_FILE='a';{CMD};'b'",
    f'NCCL_DEBUG_FILE="a";{CMD};"b"',
    f"NCCL_DEBUG_FILE='a'`{CMD}`'b'",
    f"NCCL_DEBUG_FILE='a'\"$({CMD})\"'b'",
    f"NCCL_PROTO=LL\\\n#$({CMD})",
    f"NCCL_PROTO=LL\\\n#;{CMD}",
    "LD_PRELOAD=/tmp/evil.so",
    "PATH=/tmp/evil",
    "BASH_ENV=/tmp/evil.sh",
]
MORE = [
    f"NCCL_DEBUG_FILE=$({CMD})",
    f"NCCL_DEBUG_FILE=`{CMD}`",
    f"NCCL_DEBUG_FILE=a;{CMD}",
    f"NCCL_DEBUG_FILE=a&{CMD}",
    f"NCCL_DEBUG_FILE=a|{CMD}",
    "NCCL_DEBUG_FILE=a>canary",
    "NCCL_DEBUG_FILE=a<canary",
    f"NCCL_DEBUG_FILE=a {CMD}",
    f"NCCL_PROTO= {CMD}",
    "NCCL_PROTO=LL\r",
    f"NCCL_PROTO=LL\r{CMD}",
    "NCCL_DEBUG_FILE=~/nccl.log",
    "NCCL_DEBUG_FILE=${HOME}/x",
    "NCCL_DEBUG_FILE=$HOME",
    "export LD_PRELOAD=/tmp/evil.so",
    "NCCL_NET_PLUGIN=/tmp/evil.so",
    "NCCL_TUNER_PLUGIN=/tmp/evil.so",
    "NCCL_IBVERBS_LIB=/tmp/evil.so",
    "NCCL_PROFILER_PLUGIN=/tmp/evil.so",
    "VLLM_NCCL_SO_PATH=/tmp/evil.so",
    "IFS=x",
    "PS4=$(id)",
    "SHELLOPTS=xtrace",
    "ENV=/tmp/evil.sh",
    "PYTHONPATH=/tmp/evil",
    "CUDA_DEVICE_MAX_CONNECTIONS=1",
    "nccl_proto=LL",
    "NCCL_PROTO=L\x00L",
    "NCCL_PROTO='LL'",
    "NCCL_PROTO=LL # fast",
    "NCCL_PROTO=^LL128;allreduce:LL",
    "  NCCL_PROTO=LL",
    "NCCL_PROTO =LL",
    "NCCL_PROTO=LL\u00a0",
    "NCCL_PROTO=L\u2028L",
    "NCCL_DEBUG_FILE=/tmp/\u00e9",
    "NCCL_DEBUG_FILE=a*b",
    "NCCL_X={a,b}",
    "# note \\\nNCCL_PROTO=LL",
    "# note\rLD_PRELOAD=/tmp/evil.so",
    "NCCL_DEBUG_FILE=" + "a" * 5000,
    "NCCL_PROTO",
    "=LL",
    "\x1b[2JNCCL_PROTO=LL",
]
CORPUS = ISSUE + MORE
HEAD = "# corpus\nNCCL_ALGO=Ring\n"  # the hostile line is line 3


def _file(tmp_path, line: str):
    path = tmp_path / "bad.env"
    path.write_text(HEAD + line + "\n", encoding="utf-8", newline="")
    return path


def _env_of(line: str) -> dict[str, str]:
    """The variable the line tries to set, as a results record could carry it."""
    body = line.removeprefix("export ")
    name, _, value = body.partition("=")
    return {name: value}


@pytest.mark.parametrize("line", CORPUS, ids=[repr(x)[:40] for x in CORPUS])
def test_lint_refuses_naming_the_line(tmp_path, cli_runner, line):
    path = _file(tmp_path, line)
    result = cli_runner.invoke(cli, ["lint", "--json", str(path)])
    assert result.exit_code == 1, result.output
    errors = [f for f in json.loads(result.stdout) if f["severity"] == "error"]
    assert errors and errors[0]["line"] == 3 and errors[0]["path"] == str(path)
    assert "a" * 100 not in result.output  # a long value is never echoed


@pytest.mark.parametrize("line", CORPUS, ids=[repr(x)[:40] for x in CORPUS])
def test_exec_refuses_and_runs_nothing(tmp_path, cli_runner, monkeypatch, line):
    ran = []
    monkeypatch.setattr(os, "execvpe", lambda *args: ran.append(args))
    monkeypatch.chdir(tmp_path)
    path = _file(tmp_path, line)
    result = cli_runner.invoke(cli, ["exec", "--profile", str(path), "--", "touch", "canary"])
    assert result.exit_code == 2 and ran == [] and not (tmp_path / "canary").exists()
    assert f"{path}:3: error" in result.output and len(result.output.strip().splitlines()) == 1
    assert "a" * 100 not in result.output  # a long value is named, never echoed


SETS = [line for line in CORPUS if "=" in line]  # lines that try to set a variable


@pytest.mark.parametrize("line", SETS, ids=[repr(x)[:40] for x in SETS])
def test_no_writer_writes_it(line):
    env = _env_of(line)
    for write_ in (profile.render_profile, conffile.render_conf):
        with pytest.raises(NcclTuneError):
            write_(env)


@pytest.fixture(scope="module")
def analysis():
    records = synth([({}, flat(60), {}), (P2P_LL, flat(22), confirmed())])
    return recommendation.analyze_records(records, nbytes=14336, collectives=123)


@pytest.mark.parametrize("line", SETS, ids=[repr(x)[:40] for x in SETS])
def test_recommend_exports_refuse_whatever_the_results_say(tmp_path, analysis, line):
    # A recommended row whose env came from a hostile results file: every export refuses.
    workload = export.Workload(layers=61, per_layer=2, extra=1, tokens=1, hidden=7168, dtype="bf16")
    row = analysis.recommended
    saved = row.env
    row.env = _env_of(line)
    try:
        for conf in (False, True):
            with pytest.raises(NcclTuneError):
                export.write_profile(str(tmp_path / "p.env"), analysis, workload, "cmd", conf=conf)
        with pytest.raises(NcclTuneError):
            export.write_tuner_csv(str(tmp_path / "t.csv"), analysis, "pcie-shm", "cmd")
    finally:
        row.env = saved
    assert os.listdir(tmp_path) == []


def test_a_results_file_with_ld_preload_exports_nothing(tmp_path, cli_runner):
    poisoned = {**P2P_LL, "LD_PRELOAD": "/tmp/evil.so"}
    path = write(tmp_path, synth([({}, flat(60), {}), (poisoned, flat(20), confirmed())]))
    out = {"--export": tmp_path / "p.env", "--export-conf": tmp_path / "p.conf", "--tuner-csv": tmp_path / "t.csv"}
    for force in ([], ["--force"]):
        args = ["recommend", "--layers", "61", "--results", path, "--json", *force]
        for option, target in out.items():
            args += [option, str(target)]
        result = cli_runner.invoke(cli, args)
        assert not any(p.exists() for p in out.values()), result.output
        data = json.loads(result.stdout)
        cell = next(c for c in data["cells"] if "LD_PRELOAD" in c["env"])
        assert "LD_PRELOAD is not an NCCL variable" in cell["reason"]
        assert data["recommended"] is None


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--pid", str(os.getpid())],
        ["profiles", "show"],
        ["validate", "--steps", "1"],
        ["logs", "nccl", "LOG"],
        [
            "spec-plan",
            "--accept-rate",
            "0.7",
            "--decode-ms",
            "10",
            "--verify-ms",
            "12",
            "--draft-ms",
            "1",
            "--layers",
            "61",
        ],
    ],
)
def test_every_reader_refuses_a_profile_off_the_allow_list(tmp_path, cli_runner, args):
    path = _file(tmp_path, "LD_PRELOAD=/tmp/evil.so")
    (tmp_path / "LOG").write_text("")
    if args[:2] == ["profiles", "show"]:
        full = [*args, str(path)]
    elif args[0] == "logs":
        full = [*args[:2], str(tmp_path / "LOG"), "--profile", str(path)]
    else:
        full = [*args, "--profile", str(path)]
    result = cli_runner.invoke(cli, full)
    assert result.exit_code == 2, result.output
    assert f"{path}:3: malformed line: LD_PRELOAD is not an NCCL variable" in result.output


def test_profiles_convert_refuses(tmp_path, cli_runner):
    path = _file(tmp_path, "LD_PRELOAD=/tmp/evil.so")
    result = cli_runner.invoke(
        cli, ["profiles", "convert", str(path), "--to", "conf", "-o", str(tmp_path / "out.conf")]
    )
    assert result.exit_code == 2 and not (tmp_path / "out.conf").exists()


@pytest.mark.parametrize(
    "item",
    ["LD_PRELOAD=/tmp/evil.so", "NCCL_NET_PLUGIN=/tmp/x.so", f"NCCL_DEBUG_FILE=$({CMD})", "NCCL_PROTO=LL|Simple;x"],
)
def test_sweep_cells_refuse_even_with_allow_unknown(cli_runner, item):
    with pytest.raises(NcclTuneError):
        grid.spec_from_sets([item])
    result = cli_runner.invoke(cli, ["sweep", "--set", item, "--allow-unknown", "--backend", "sim", "--dry-run"])
    assert result.exit_code == 2, result.output


def test_a_plan_or_env_option_off_the_grammar_is_refused(tmp_path):
    from microbench import options
    from nccl_tune.measure import importers

    with pytest.raises(NcclTuneError):
        options.parse_plan({"cells": [{"cell": "c", "env": {"LD_PRELOAD": "/x.so"}}]}, "plan.json")
    with pytest.raises(NcclTuneError):
        importers.parse_env_option("NCCL_DEBUG_FILE='$(id)'")


def test_caps_refuse_huge_input_fast(tmp_path, cli_runner):
    import time

    big = tmp_path / "big.env"
    big.write_bytes(b"# x\n" * (50 * 1024 * 1024 // 4))  # 50 MB
    many = tmp_path / "many.env"
    many.write_text("".join(f"NCCL_V{i}=1\n" for i in range(100_000)))
    for path in (big, many):
        start = time.perf_counter()
        result = cli_runner.invoke(cli, ["lint", str(path)])
        assert result.exit_code == 2 and "a profile may have" in result.output, result.output
        assert time.perf_counter() - start < 1.0
    lines = "".join(f"NCCL_V{i}=1\n" for i in range(grammar.MAX_VARIABLES + 1))
    with pytest.raises(NcclTuneError) as info:
        profile.parse_profile(lines, "v.env")
    assert info.value.line == grammar.MAX_VARIABLES + 1
