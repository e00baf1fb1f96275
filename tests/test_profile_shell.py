"""Profiles under real bash (`set -a; . f.env`) and the `profiles` commands' success paths.

bash is the oracle here: what a shell really does with a file, not what our reader
thinks it does. An exported profile must give a sourcing shell exactly its variables;
a value the linter calls dangerous really runs a command under bash (so the finding is
right), and nccl-tune itself never runs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import REPO_ROOT

from nccl_tune.cli import cli
from nccl_tune.live import lint

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")

# Before and after sourcing, in one shell: the difference is what the file exported.
_SOURCE = 'env -0 > "$2"; set -a; . "$1"; set +a; env -0 > "$3"'


def _sourced_diff(tmp_path, path) -> dict[str, str]:
    before, after = tmp_path / "before.env0", tmp_path / "after.env0"
    done = subprocess.run(
        [BASH, "--noprofile", "--norc", "-c", _SOURCE, "bash", str(path), str(before), str(after)],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr

    def read(p):
        items = [item.split("=", 1) for item in p.read_bytes().decode().split("\0") if item]
        return {k: v for k, v in items}

    old, new = read(before), read(after)
    return {k: v for k, v in new.items() if old.get(k) != v and k != "_"}


def _file_assignments(path) -> dict[str, str]:
    """KEY=VALUE lines read with str.partition: the test's own reading, not the project's."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value
    return out


@needs_bash
def test_exported_profile_sourced_by_bash_gives_exactly_its_variables(tmp_path, cli_runner):
    out = tmp_path / "pcie8.env"
    result = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-shm", "--export", str(out), "--force"]
    )
    assert result.exit_code == 0, result.output
    expected = _file_assignments(out)
    assert expected and all(k.startswith("NCCL_") for k in expected)
    assert _sourced_diff(tmp_path, out) == expected


@needs_bash
def test_shipped_profile_sourced_by_bash(tmp_path):
    path = REPO_ROOT / "profiles" / "pcie-8gpu-decode.env"
    assert _sourced_diff(tmp_path, path) == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }


@needs_bash
@pytest.mark.parametrize("value", ["$(touch {marker})", "`touch {marker}`", "x;touch {marker}"])
def test_a_dangerous_value_runs_under_bash_and_never_under_nccl_tune(tmp_path, cli_runner, value):
    marker = tmp_path / "ran"
    path = tmp_path / "bad.env"
    path.write_text(f"NCCL_PROTO=LL\nNCCL_DEBUG_FILE={value.format(marker=marker)}\n")
    findings = lint.lint_text(path.read_text(), str(path))
    assert any(f.severity == lint.ERROR and f.variable == "NCCL_DEBUG_FILE" for f in findings)
    # nccl-tune: read, linted, shown, refused by exec; the command never runs
    for args in (["lint", str(path)], ["profiles", "show", str(path)], ["exec", "--profile", str(path), "--", "true"]):
        cli_runner.invoke(cli, args)
        assert not marker.exists(), args
    refused = cli_runner.invoke(cli, ["exec", "--profile", str(path), "--", "true"])
    assert refused.exit_code == 2 and "lint error" in refused.output
    # bash: the linter was right, sourcing it runs the command
    _sourced_diff(tmp_path, path)
    assert marker.exists()


def test_profiles_list_success(cli_runner):
    shipped = sorted((REPO_ROOT / "profiles").glob("*.env"))
    assert shipped
    result = cli_runner.invoke(cli, ["profiles", "list", "--json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)
    assert [e["name"] for e in entries] == [p.stem for p in shipped]
    for entry, path in zip(entries, shipped):
        assert entry["variables"] == len(_file_assignments(path))
        assert entry["summary"] and entry["summary"] != "(no provenance)"
    text = cli_runner.invoke(cli, ["profiles", "list"])
    assert text.exit_code == 0
    assert "pcie-8gpu-decode" in text.output and "62.9 -> 88.8 tok/s" in text.output


def test_profiles_show_success(cli_runner):
    path = REPO_ROOT / "profiles" / "pcie-8gpu-decode.env"
    result = cli_runner.invoke(cli, ["profiles", "show", "pcie-8gpu-decode", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["env"] == _file_assignments(path) and data["lint"] == []
    assert data["scope"]["NCCL_PROTO"] == "communicator" and data["scope"]["NCCL_NTHREADS"] == "process"
    assert data["provenance"]["measured"].startswith("62.9 tok/s")
    text = cli_runner.invoke(cli, ["profiles", "show", str(path)])
    assert text.exit_code == 0
    assert "NCCL_P2P_LEVEL=SYS  [process]" in text.output and "0 error(s), 0 warning(s)" in text.output
