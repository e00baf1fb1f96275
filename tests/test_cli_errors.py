"""Bad input to lint / profiles / exec / check / doctor: exit 2, a clear message, no traceback."""

from __future__ import annotations

import subprocess

import pytest
from conftest import python_cmd, subprocess_env

pytestmark = pytest.mark.slow


def run(*args, cwd=None):
    return subprocess.run(
        python_cmd("-m", "nccl_tune", *args), capture_output=True, text=True, env=subprocess_env(), timeout=60, cwd=cwd
    )


@pytest.fixture
def files(tmp_path):
    (tmp_path / "good.env").write_text("NCCL_PROTO=LL\n")
    (tmp_path / "malformed.env").write_text("NCCL_PROTO=LL\nNCCL_ALGO = Ring\n")
    (tmp_path / "invalid.env").write_text("NCCL_NTHREADS=1000\n")
    (tmp_path / "topo.txt").write_text("no matrix here\n")
    (tmp_path / "binary.env").write_bytes(b"\xff\xfe\xfa")
    return tmp_path


# Tool errors (NcclTuneError): exactly one line naming the file, line or option.
ONE_LINE = [
    (["lint", "{d}/missing.env"], "missing.env: no such file"),
    (["lint", "{d}/binary.env"], "binary.env:1: not UTF-8 text"),
    (["profiles", "show", "no-such-profile"], "no-such-profile: no such file or shipped profile"),
    (["profiles", "show", "{d}/malformed.env"], "malformed.env:2: malformed line"),
    (["exec", "--profile", "{d}/missing.env", "--", "true"], "missing.env: no such file or shipped profile"),
    (["exec", "--profile", "{d}/malformed.env", "--", "true"], "malformed.env:2:"),
    (["exec", "--profile", "{d}/invalid.env", "--", "true"], "invalid.env:1:"),
    (["check", "--profile", "{d}/malformed.env", "--pid", "1"], "malformed.env:2: malformed line"),
    (["check", "--profile", "{d}/good.env", "--pid", "999999999"], "not in the range 1<=x<=4194304"),
    (["check", "--profile", "{d}/good.env", "--pid", "{gone}"], "no process with pid"),
    (["check", "--profile", "nope", "--pid", "1"], "nope: no such file or shipped profile"),
    (["doctor", "--topo-file", "{d}/missing.txt"], "missing.txt: no such file"),
    (["doctor", "--topo-file", "{d}/topo.txt"], "topo.txt: no nvidia-smi topo -m matrix"),
]


@pytest.mark.parametrize(
    "args,fragment", ONE_LINE, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(ONE_LINE)]
)
def test_tool_errors_are_one_line(files, args, fragment):
    gone = subprocess.Popen(["true"])  # a pid that existed and has exited
    gone.wait()
    done = run(*[a.format(d=files, gone=gone.pid) for a in args])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


# Usage errors (click): exit 2, click's usage text ending in one 'Error:' line.
USAGE = [
    ["lint"],
    ["lint", "--nope", "x.env"],
    ["profiles", "show"],
    ["profiles", "frobnicate"],
    ["exec", "--", "true"],  # no --profile
    ["exec", "--profile", "{d}/good.env"],  # no command
    ["check", "--profile", "{d}/good.env"],  # no --pid
    ["check", "--profile", "{d}/good.env", "--pid", "0"],
    ["check", "--profile", "{d}/good.env", "--pid", "abc"],
    ["doctor", "--topo-file"],
]


@pytest.mark.parametrize("args", USAGE, ids=[" ".join(a) for a in USAGE])
def test_usage_errors_exit_2(files, args):
    done = run(*[a.format(d=files) for a in args])
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("Error:")


def test_help_imports_no_torch():
    # How fast --help is, is measured by bench/cli_startup.py; here only what it imports.
    code = (
        "import sys; from nccl_tune.cli import cli\n"
        "for name in ('lint', 'profiles', 'exec', 'check', 'doctor'):\n"
        "    cli.get_command(None, name)\n"
        "try:\n    cli(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    done = subprocess.run(python_cmd("-c", code), capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "NO-TORCH"
    for name in ("lint", "profiles", "exec", "check", "doctor"):
        assert name in done.stdout
