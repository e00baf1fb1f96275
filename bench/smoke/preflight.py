"""Five seconds that say whether NCCL works on this machine at all (bench/gpu_smoke.sh).

Prints the machine (nvidia-smi -L, torch and its CUDA, the GPU, the libnccl this process
mapped and its ncclGetVersion against torch's build version), then, at world size 1 with
NCCL_DEBUG=WARN on stderr (so NCCL's own reason shows): init_process_group("nccl"), one
out-of-place all_gather (NCCL copies the buffer; an in-place one enqueues nothing),
synchronize, destroy_process_group. That part has BUDGET_S: a VM without a network
interface NCCL likes may hang in its bootstrap (which falls back to loopback there), and
the smoke should stop then, with this message, not minutes later.

Exit codes: 0 NCCL works; 77 no CUDA device (the automake code for a skipped test: the
smoke then skips every GPU step and passes); 1 NCCL failed (the line says how); 124 the
NCCL part did not finish within BUDGET_S.

    python -m bench.smoke.preflight
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

BUDGET_S = 5.0
SKIP = 77
TIMEOUT = 124


def say(text: str) -> None:
    """One line on stdout, flushed (the smoke reads it even if the process is killed)."""
    print(f"preflight: {text}", flush=True)


def gpus() -> str:
    """nvidia-smi -L, or why there is none (bounded: a wedged driver hangs nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return done.stdout.strip() or done.stderr.strip() or f"nvidia-smi exit code {done.returncode}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _expire() -> None:
    say(
        f"FAILED: NCCL init, one all_gather and destroy did not finish within {BUDGET_S:.0f} s "
        "(NCCL's WARN lines, if any, are on stderr)"
    )
    os._exit(TIMEOUT)


def nccl_round_trip(torch) -> float:
    """init_process_group("nccl") at world 1, one all_gather, destroy; returns the seconds
    it took. Raises on failure (a wrong result included)."""
    import torch.distributed as dist

    torch.cuda.set_device(0)
    start = time.monotonic()
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{_free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=BUDGET_S),
    )
    try:
        x = torch.arange(1024, dtype=torch.float32, device="cuda")
        out = torch.empty_like(x)
        dist.all_gather_into_tensor(out, x)
        torch.cuda.synchronize()
        if not torch.equal(out, x):
            raise RuntimeError("all_gather at world 1 returned a buffer unlike its input")
    finally:
        dist.destroy_process_group()
    return time.monotonic() - start


def main() -> int:
    """Run the preflight; returns the exit code (see the module docstring)."""
    for name in ("NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS"):
        os.environ.pop(name, None)
    os.environ["NCCL_DEBUG"] = "WARN"  # WARN lines to stderr, nothing else
    say(f"gpus: {gpus()}")
    import torch

    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}")
    if not torch.cuda.is_available():
        print(f"SKIP (no CUDA device: torch {torch.__version__}, CUDA {torch.version.cuda})", flush=True)
        return SKIP
    from microbench import nccllib

    lib = nccllib.loaded_library()
    say(
        f"device {torch.cuda.get_device_name(0)}; libnccl {lib['path']} ncclGetVersion "
        f"{lib['version']}; torch built with NCCL {nccllib.build_version(torch)}"
        + (f"; {lib['error']}" if lib.get("error") else "")
    )
    import torch.distributed as dist

    if not dist.is_nccl_available():
        say("FAILED: this torch has no NCCL backend (torch.distributed.is_nccl_available() is False)")
        return 1
    torch.zeros(1, device="cuda:0")  # the CUDA context first: the budget is NCCL's alone
    timer = threading.Timer(BUDGET_S, _expire)
    timer.daemon = True
    timer.start()
    try:
        took = nccl_round_trip(torch)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        say(f"FAILED: NCCL at world size 1: {type(exc).__name__}: {text[0] if text else ''}")
        for line in text[1:6]:
            say(f"  {line}")
        return 1
    finally:
        timer.cancel()
    say(f"ok: NCCL init, one all_gather and destroy at world size 1 in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
