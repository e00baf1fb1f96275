"""SGLang on CPU for the tests: its own virtual environment, the test-only substitutes, and
the arguments a TP=2 server of the tiny Llama needs on 2 cores.

`./install.sh --sglang-cpu` makes the environment (.venv-sglang at the checkout's root, or
$NCCLTUNE_SGLANG_VENV; kept apart from the tool's Python so SGLang's pins never change
what vLLM needs). The server is a subprocess started with that environment's python, so
the tests themselves run in the tool's Python. `substitutes/` (test-only torchvision
and sgl_kernel stand-ins, and a sitecustomize that gives SGLang's torch_native attention
the speculative verify path it lacks; see substitutes/README.md) reach the server only
through its PYTHONPATH.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO_ROOT, subprocess_env

VENV = Path(os.environ.get("NCCLTUNE_SGLANG_VENV") or REPO_ROOT / ".venv-sglang")
PYTHON = VENV / "bin" / "python"
SUBSTITUTES = Path(__file__).resolve().parent / "substitutes"
# SGLang's CPU engine on 2 cores: one core per TP rank ("0|1"), as SGLang's CPU docs ask
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


def missing() -> str | None:
    """Why SGLang cannot be started here (a skip reason), or None."""
    if not PYTHON.is_file():
        return f"no SGLang environment at {VENV} (./install.sh --sglang-cpu makes it)"
    if not any((VENV / "lib").glob("python3*/site-packages/sglang/launch_server.py")):
        return f"{VENV} has no sglang"
    if (os.cpu_count() or 1) < 2:
        return "TP=2 on SGLang's CPU engine needs 2 cores"
    return None


def command() -> list[str]:
    """argv that starts SGLang's server with the environment's python."""
    return [str(PYTHON), "-m", "sglang.launch_server"]


def env_vars() -> dict[str, str]:
    """What the server's environment needs beyond the caller's: the substitutes on
    PYTHONPATH (alone: the checkout's packages are not the server's business) and the
    CPU engine's switches."""
    return {"PYTHONPATH": str(SUBSTITUTES), **CPU_ENV}


def server_env() -> dict[str, str]:
    """A whole environment for the server (no NCCL_*; see tests.conftest.subprocess_env)."""
    return subprocess_env(**env_vars())


# NGRAM speculative decoding (prompt lookup: no draft model) with 4 draft tokens, as issue 25
# tried it by hand (with --mem-fraction-static 0.3); its verify forward runs through the
# test-only tree attention of substitutes/_nccl_tune_tree_verify.py.
NGRAM = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4")


def server_args(model: str, ngram: bool = False) -> list[str]:
    """SGLang arguments for the tiny Llama on 2 CPU ranks: torch attention and sampling (no
    CPU kernels needed), no grammar backend, a small KV cache, /metrics on, and a decode
    line every 4 steps so short runs still log their throughput; with `ngram`, NGRAM
    speculative decoding (validate's --steps replaces its draft-token count)."""
    return [
        "--model-path",
        model,
        "--device",
        "cpu",
        "--tp",
        "2",
        "--disable-overlap-schedule",
        "--attention-backend",
        "torch_native",
        "--sampling-backend",
        "pytorch",
        "--grammar-backend",
        "none",
        "--max-total-tokens",
        "4096",
        "--mem-fraction-static",
        "0.3" if ngram else "0.05",
        "--enable-metrics",
        "--decode-log-interval",
        "4",
        *(NGRAM if ngram else ()),
    ]
