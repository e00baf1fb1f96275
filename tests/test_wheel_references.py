"""The published range from an installed wheel: the figures ship with the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_an_installed_wheel_prints_the_published_range_with_no_shared_folder(tmp_path, cli_runner):
    """Build a wheel of this checkout, install it in a fresh virtual environment far from any
    ../shared, and ask `nccl-tune recommend --layers 61` there: same range as here."""
    from nccl_tune.cli import cli

    # No PYTHONPATH: the checkout on it would make pip see nccl_tune as installed already.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NCCL_TUNE_REFERENCES", "PYTHONPATH") and not k.startswith("NCCL_")
    }
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO_ROOT),
        ],
        check=True,
        timeout=600,
        env=env,
    )
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300, env=env
    )
    python = venv / "bin" / "python"
    wheel = next(wheels.glob("nccl_tune-*.whl"))
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", "-q", str(wheel)],
        check=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    where = subprocess.run(
        [str(python), "-c", "import nccl_tune; print(nccl_tune.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    )
    installed = Path(where.stdout.strip()).resolve()
    assert venv.resolve() in installed.parents
    assert not any((parent / "shared").exists() for parent in installed.parents)
    done = subprocess.run(
        [str(venv / "bin" / "nccl-tune"), "recommend", "--layers", "61", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    there = json.loads(done.stdout)["published_range"]
    here = json.loads(cli_runner.invoke(cli, ["recommend", "--layers", "61", "--json"]).output)
    assert there["machines"] and there == here["published_range"]
