"""What grouping by process scope saves: launches and wall time of one sweep, two ways;
and what NCCL_NO_CACHE (isolation nocache) saves on top.

    python bench/sweep_cost.py [--nproc 2] [--iters 20] [--rounds 1] [--json]

Runs the same grid twice through `nccl-tune sweep` on gloo (world 2 by default):
NCCL_PROTO {LL, LL128, Simple} x NCCL_ALGO {Ring, Tree} plus the baseline (7 cells),
two sizes (14,336 and 57,344 bytes: 1 and 4 decode tokens at hidden 7168, bf16), once
with `--isolation process` (one launch per cell) and once grouped (the default: one
launch per combination of process-scoped settings, here a single one). Prints the
launches and wall time of each and their ratios. Targets: grouped needs at least 3x
fewer launches and at least 2x less wall time.

Then the isolations side by side (`nccl-tune sweep --dry-run --json` planned for NCCL
2.30.7 with --nccl-version): the launches of the built-in decode grid under process,
group and nocache (target: nocache at most 1/20 of one launch per cell), and the
measured gloo wall time of each isolation on a smaller grid with cached variables
(NCCL_PROTO {LL,Simple} x NCCL_NTHREADS {256,512} x NCCL_BUFFSIZE {16777216,default}
plus the baseline: 9 cells; target: the wall time falls with the launches).

Gloo ignores NCCL settings, so this measures the sweep's own cost (torchrun start-up,
imports, rendezvous, process groups), which is what grouping saves on NCCL too.
Needs microbench.allreduce with --plan support; fails with one line if it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = ["--set", "NCCL_PROTO=LL,LL128,Simple", "--set", "NCCL_ALGO=Ring,Tree"]
SIZES = "14336,57344"
TARGET_LAUNCHES, TARGET_WALL = 3.0, 2.0
ISOLATION_GRID = [
    "--set",
    "NCCL_PROTO=LL,Simple",
    "--set",
    "NCCL_NTHREADS=256,512",
    "--set",
    "NCCL_BUFFSIZE=16777216,default",
]
PLAN_VERSION = "2.30.7"
TARGET_NOCACHE_SHARE = 1 / 20


def microbench_ready() -> str | None:
    """None when microbench.allreduce accepts --plan, else why not."""
    sys.path.insert(0, ROOT)
    try:
        import importlib.util

        from microbench import options  # torch-free

        if importlib.util.find_spec("microbench.allreduce") is None:
            return "microbench/allreduce.py is missing"
        if "--plan" not in options.build_parser().format_help():
            return "microbench.allreduce has no --plan option"
    except ImportError as exc:
        return f"cannot import the microbench ({exc})"
    return None


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def decode_plan() -> dict:
    """Launches of the built-in decode grid under each isolation, planned for NCCL 2.30.7."""
    cmd = [
        sys.executable,
        "-m",
        "nccl_tune",
        "sweep",
        "--grid",
        "decode",
        "--topology",
        "none",
        "--backend",
        "nccl",
        "--nccl-version",
        PLAN_VERSION,
        "--dry-run",
        "--json",
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"sweep_cost: the decode-grid dry run failed (exit {done.returncode}): "
            + (done.stderr or done.stdout)[-2000:]
        )
    plan = json.loads(done.stdout)
    counts = plan["launches_by_isolation"]
    return {
        "cells": len(plan["cells"]),
        "nccl": PLAN_VERSION,
        "auto": plan["isolation"],
        **counts,
        "nocache_share": round(counts["nocache"] / counts["process"], 4),
        "target_met": counts["nocache"] <= TARGET_NOCACHE_SHARE * counts["process"],
    }


def run_sweep(isolation: str, args, work: str, grid=None, tag: str = "") -> dict:
    """One sweep through the CLI; its JSON summary plus the measured wall time."""
    out = os.path.join(work, f"{isolation}{tag}.jsonl")
    cmd = [
        sys.executable,
        "-m",
        "nccl_tune",
        "sweep",
        *(grid or GRID),
        "--sizes",
        SIZES,
        "--backend",
        "gloo",
        "--topology",
        "none",
        "--nproc",
        str(args.nproc),
        "--iters",
        str(args.iters),
        "--warmup",
        "2",
        "--rounds",
        str(args.rounds),
        "--isolation",
        isolation,
        "--out",
        out,
        "--json",
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(
            f"sweep_cost: the {isolation} sweep failed (exit {done.returncode}):\n"
            + (done.stderr or done.stdout)[-2000:]
        )
    summary = json.loads(done.stdout)
    if summary["failures"]:
        sys.exit(f"sweep_cost: the {isolation} sweep recorded failures: {summary['failures']}")
    return {
        "isolation": isolation,
        "launches": summary["launches"],
        "cells": summary["cells_measured"],
        "records": summary["records_written"],
        "wall_s": round(wall, 2),
    }


def main() -> None:
    """Run both sweeps and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    problem = microbench_ready()
    if problem:
        sys.exit(f"sweep_cost: cannot run: {problem} (the sweep launches microbench.allreduce)")
    decode = decode_plan()
    with tempfile.TemporaryDirectory() as work:
        process = run_sweep("process", args, work)
        grouped = run_sweep("group", args, work)
        isolations = [
            run_sweep(name, args, work, ISOLATION_GRID, "-cached") for name in ("process", "group", "nocache")
        ]
    result = {
        "grid": "NCCL_PROTO {LL,LL128,Simple} x NCCL_ALGO {Ring,Tree} + baseline",
        "sizes": SIZES,
        "backend": "gloo",
        "world_size": args.nproc,
        "rounds": args.rounds,
        "process": process,
        "grouped": grouped,
        "launch_ratio": round(process["launches"] / grouped["launches"], 2),
        "wall_ratio": round(process["wall_s"] / grouped["wall_s"], 2),
    }
    result["targets_met"] = result["launch_ratio"] >= TARGET_LAUNCHES and result["wall_ratio"] >= TARGET_WALL
    walls = [row["wall_s"] for row in isolations]
    result["decode_grid"] = decode
    result["isolations"] = {
        "grid": "NCCL_PROTO {LL,Simple} x NCCL_NTHREADS {256,512} x NCCL_BUFFSIZE {16777216,default} + baseline",
        "rows": isolations,
        "wall_falls": walls[0] > walls[1] > walls[2],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"grid: {result['grid']}; sizes {SIZES} B; gloo, world {args.nproc}; "
        f"{args.rounds} round(s), {args.iters} iterations"
    )
    print(f"{'isolation':<12}{'cells':>7}{'launches':>10}{'wall s':>9}")
    for row in (process, grouped):
        print(f"{row['isolation']:<12}{row['cells']:>7}{row['launches']:>10}{row['wall_s']:>9.1f}")
    print(
        f"launches: {result['launch_ratio']}x fewer grouped (target >= {TARGET_LAUNCHES}x); "
        f"wall time: {result['wall_ratio']}x less (target >= {TARGET_WALL}x): "
        + ("targets met" if result["targets_met"] else "TARGET MISSED")
    )
    print(
        f"\ndecode grid (built-in, {decode['cells']} cells), launches planned for NCCL "
        f"{PLAN_VERSION} (auto picks {decode['auto']}):"
    )
    print(
        f"  process {decode['process']}, group {decode['group']}, nocache {decode['nocache']}: "
        f"nocache needs {decode['nocache_share']:.2%} of one launch per cell (target <= "
        f"{TARGET_NOCACHE_SHARE:.0%}): " + ("target met" if decode["target_met"] else "TARGET MISSED")
    )
    print(f"\nisolations on gloo, world {args.nproc}: {result['isolations']['grid']}")
    print(f"{'isolation':<12}{'cells':>7}{'launches':>10}{'wall s':>9}")
    for row in isolations:
        print(f"{row['isolation']:<12}{row['cells']:>7}{row['launches']:>10}{row['wall_s']:>9.1f}")
    print(
        "wall time falls with the launches: " + ("yes" if result["isolations"]["wall_falls"] else "NO (noisy machine?)")
    )


if __name__ == "__main__":
    main()
