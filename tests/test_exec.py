"""exec: argv verbatim (no shell), exit code passed through, --clean, lint refusal."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import python_cmd, subprocess_env

pytestmark = pytest.mark.slow

# The child prints its argv, pid and NCCL_* environment as JSON, then exits with argv[1].
CHILD = (
    "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid(), "
    "'env': {k: v for k, v in os.environ.items() if k.startswith('NCCL_')}})); "
    "sys.exit(int(sys.argv[1]))"
)


def nccl_tune_exec(args, child_args, **extra_env):
    argv = python_cmd("-m", "nccl_tune", "exec", *args, "--", sys.executable, "-c", CHILD, *child_args)
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(**extra_env)
    )


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "p.env"
    path.write_text("# test\nNCCL_PROTO=LL\nNCCL_ALGO=Ring\n")
    return path


def test_argv_verbatim_env_applied_and_same_pid(profile_file):
    tricky = [
        "0",
        "two words",
        "'single'",
        '"double"',
        ";",
        "a;b",
        "$(echo hi)",
        "`id`",
        "$HOME",
        "*",
        "",
        "--",
        "--profile",
        "|",
        ">out",
    ]
    proc = nccl_tune_exec(["--profile", str(profile_file)], tricky, NCCL_DEBUG="WARN")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["argv"] == tricky
    assert data["env"] == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN"}
    assert data["pid"] == proc.pid  # exec replaces the process: `check --pid` sees the server
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nccl-tune exec: applied p.env: NCCL_PROTO=LL")


@pytest.mark.parametrize("code", [3, 42])
def test_exit_code_passes_through(profile_file, code):
    proc = nccl_tune_exec(["--profile", str(profile_file)], [str(code)])
    proc.communicate(timeout=60)
    assert proc.returncode == code


def test_clean_removes_foreign_nccl_vars_and_later_profiles_win(profile_file, tmp_path):
    second = tmp_path / "q.env"
    second.write_text("NCCL_ALGO=Tree\nNCCL_BUFFSIZE=1048576\n")
    proc = nccl_tune_exec(
        ["--clean", "--profile", str(profile_file), "--profile", str(second)],
        ["0"],
        NCCL_DEBUG="INFO",
        NCCL_P2P_DISABLE="1",
        NCCL_ALGO="Ring",
        OTHER_VAR="kept",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["env"] == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree", "NCCL_BUFFSIZE": "1048576"}
    assert "removed 2 other NCCL_* (NCCL_DEBUG NCCL_P2P_DISABLE)" in err


def test_without_clean_foreign_vars_stay(profile_file):
    proc = nccl_tune_exec(["--profile", str(profile_file)], ["0"], NCCL_DEBUG="INFO")
    out, _ = proc.communicate(timeout=60)
    assert json.loads(out)["env"]["NCCL_DEBUG"] == "INFO"


def test_refuses_profile_with_lint_errors(tmp_path):
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_PROTO=LL\nNCCL_NTHREADS=1000\n")
    proc = nccl_tune_exec(["--profile", str(bad)], ["0"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "bad.env:2" in err and "Traceback" not in err


def test_warnings_are_counted_not_refused(tmp_path):
    warn = tmp_path / "warn.env"
    warn.write_text("NCCL_PROTO=^LL\n")
    proc = nccl_tune_exec(["--profile", str(warn)], ["0"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "1 lint warning(s)" in err
    assert json.loads(out)["env"] == {"NCCL_PROTO": "^LL"}


def test_build_env_is_pure():
    from nccl_tune.commands.exec_ import build_env

    base = {"NCCL_A": "1", "NCCL_B": "2", "PATH": "/bin"}
    env, removed = build_env(base, {"NCCL_B": "3"}, clean=True)
    assert env == {"NCCL_B": "3", "PATH": "/bin"} and removed == ["NCCL_A"]
    assert base == {"NCCL_A": "1", "NCCL_B": "2", "PATH": "/bin"}


def test_shipped_profile_by_name():
    proc = nccl_tune_exec(["--profile", "pcie-8gpu-decode"], ["0"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert "applied pcie-8gpu-decode.env" in err
