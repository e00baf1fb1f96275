"""How long `nccl-tune --help` and `nccl-tune lint --help` take, start to exit.

    python bench/cli_startup.py [--repeats 10]

Each is a fresh interpreter (`python -m nccl_tune ...`, this checkout first on
PYTHONPATH), timed wall-clock; prints every repeat and the median. The commands load
lazily and import no torch, so --help should stay well under a second (target: median
<= 0.5 s on an idle machine). The test suite checks only that torch is not imported
(tests/test_cli_errors.py); on a shared machine a time is noise, so it lives here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_command(argv: list[str], repeats: int) -> list[float]:
    """Wall-clock seconds of `repeats` fresh runs of `argv` (each must exit 0)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[:200]}")
    return times


def main() -> None:
    """Print the timings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    for label, extra in (("nccl-tune --help", ["--help"]), ("nccl-tune lint --help", ["lint", "--help"])):
        times = time_command([sys.executable, "-m", "nccl_tune", *extra], args.repeats)
        print(f"{label:24s} " + " ".join(f"{t:.3f}" for t in times) + f"  median {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
