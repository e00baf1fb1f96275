"""A stand-in for an inference server, to try `nccl-tune check` without a GPU.

    python examples/server_with_two_workers.py [SECONDS]

Starts two "workers" (processes that only sleep), as a server spawns its TP workers:
the first inherits this process's environment; the second is started with
NCCL_P2P_LEVEL removed, as a launcher that rewrites its workers' environment would do.
Prints "server PID, workers PID PID", then waits SECONDS (default 30) and stops them.

    nccl-tune exec --clean --profile pcie-8gpu-decode -- python examples/server_with_two_workers.py 30 &
    nccl-tune check --profile pcie-8gpu-decode --pid PID --tree   # the second worker: MISMATCH
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def main() -> int:
    """Start the two workers, wait, stop them."""
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    sleeper = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    first = subprocess.Popen(sleeper)
    dropped = {k: v for k, v in os.environ.items() if k != "NCCL_P2P_LEVEL"}
    second = subprocess.Popen(sleeper, env=dropped)
    print(f"server {os.getpid()}, workers {first.pid} {second.pid}", flush=True)
    try:
        time.sleep(seconds)
    finally:
        for worker in (first, second):
            worker.kill()
            worker.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
