"""Shared test helpers: repository paths, subprocess environments, real fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real public outputs beside the checkout (../shared/fixtures/real); tests skip without them.
REAL_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "real"
OWN_FIXTURES = Path(__file__).resolve().parent / "fixtures"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The current environment with this checkout first on PYTHONPATH and no NCCL_* vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def python_cmd(*args: str) -> list[str]:
    """argv running this interpreter (the one running the tests)."""
    return [sys.executable, *args]


@pytest.fixture
def real_fixtures() -> Path:
    """The folder of real public outputs; skips the test when it is absent."""
    if not REAL_FIXTURES.is_dir():
        pytest.skip(f"{REAL_FIXTURES} is absent")
    return REAL_FIXTURES


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """The tiny random Llama of tests/tiny_llama.py, made once per session (no download),
    for the tests against real vLLM and SGLang servers."""
    from tests import tiny_llama

    return tiny_llama.build(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture
def cli_runner():
    """A click CliRunner whose environment holds no NCCL_* variables."""
    from click.testing import CliRunner

    return CliRunner(env={k: None for k in os.environ if k.startswith("NCCL_")})
