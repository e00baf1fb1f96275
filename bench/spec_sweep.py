"""Step-count sweep of the built-in TP speculative decode loop: measured best k vs the planner.

Runs `integration.spec_loop` on gloo at world 2 (CPU), draft steps 0..6, at two draft
noise levels (how far the draft's weights are perturbed, i.e. how often it is accepted),
all in one torchrun launch, and prints per step count: measured tok/s, accept length
(bonus token included), draft / verify / other ms per cycle, and the planner's predicted
tok/s. The planner (nccl_tune.spec.planner.plan_from_loop, the one spec-plan, recommend
and validate use) gets the loop's own measured plain decode time (k = 0), verify times at
1..7 tokens, draft step and other time (means over k >= 1) and its measured per-position
acceptance (from the k = 6 run), and answers a best k and candidates (within the stated
5% relative error). Target: the measured best is among the candidates in every run, with
at most 3 candidates.

Measured tok/s is the median over runs of wall-clock tok/s of the decode loop (the loop
interleaves the runs of all step counts in rounds, so load drift on a shared machine
hits them alike). On a contended machine the figures are noisy: say so when quoting them.

    python bench/spec_sweep.py            # a few minutes on 2 CPU cores
    python bench/spec_sweep.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nccl_tune.spec import planner as spec_planner  # noqa: E402,F401  (fail early if the tree is broken)

STEPS = [0, 1, 2, 3, 4, 5, 6]
MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1024", "--draft-layers", "1"]


def run_sweep(noise: list[float], new_tokens: int, runs: int, timeout: float) -> list[dict]:
    """One torchrun launch (2 ranks, gloo) measuring every (noise, steps) pair."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "integration.spec_loop",
        *MODEL,
        "--backend",
        "gloo",
        "--device",
        "cpu",
        "--new-tokens",
        str(new_tokens),
        "--runs",
        str(runs),
        "--warmup-tokens",
        "16",
        "--sweep-steps",
        ",".join(map(str, STEPS)),
        "--sweep-noise",
        ",".join(map(str, noise)),
        "--json",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"spec_sweep: no result after {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SystemExit("spec_sweep: the loop failed:\n" + "\n".join(err.strip().splitlines()[-5:]))
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["sweep"]


def predict(records: dict[int, dict]) -> dict:
    """The planner on the loop's own measurements (see the module doc)."""
    from nccl_tune.spec.planner import plan_from_loop

    loop = {k: {**r, "tok_s": r["tok_s_median"]} for k, r in records.items()}
    result = plan_from_loop(loop, [k for k in STEPS if k]).to_dict()
    return {
        "plans": {p["k"]: p for p in result["plans"]},
        "best_k": result["best_k"],
        "candidates": result["candidates"],
        "acceptance": result["acceptance"]["description"],
        "verify_model": result["verify_model"]["description"],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print the tables (or JSON)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noise", default="0.25,1.5", help="two draft-noise levels")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    noise = [float(x) for x in args.noise.split(",")]
    sweep = run_sweep(noise, args.new_tokens, args.runs, args.timeout)
    result = []
    for level in noise:
        records = {r["steps"]: r for r in sweep if r["draft_noise"] == level}
        for r in records.values():
            r["tok_s_median"] = statistics.median(r["runs_tok_s"])
        measured_best = max(records.values(), key=lambda r: r["tok_s_median"])["steps"]
        prediction = predict(records)
        result.append(
            {
                "draft_noise": level,
                "measured_best_k": measured_best,
                "predicted_best_k": prediction["best_k"],
                "candidates": prediction["candidates"],
                "best_in_candidates": measured_best in prediction["candidates"],
                "prediction": prediction,
                "rows": [
                    {
                        k: records[s][k]
                        for k in (
                            "steps",
                            "tok_s_median",
                            "runs_tok_s",
                            "accept_len",
                            "draft_ms",
                            "verify_ms",
                            "other_ms",
                            "step_ms",
                            "accept_per_pos",
                        )
                    }
                    for s in STEPS
                ],
            }
        )
    if args.json:
        print(json.dumps({"model": MODEL, "backend": "gloo", "world_size": 2, "levels": result}))
        return 0
    first = sweep[0]
    print(
        f"built-in loop, gloo, world 2, {first['dtype']}: layers {first['layers']}, hidden "
        f"{first['hidden']}, heads {first['heads']}, vocab {first['vocab']}; draft "
        f"{first['draft_layers']} layer; {args.new_tokens} tokens x {args.runs} runs per step count; "
        "planner: nccl_tune.spec.planner on the loop's own decode/verify/draft times and "
        "per-position acceptance (k = 6 run), candidates within 5%"
    )
    for level in result:
        plans = level["prediction"]["plans"]
        table = [
            [
                r["steps"],
                f"{r['tok_s_median']:.1f}",
                f"{r['accept_len']:.2f}",
                f"{r['draft_ms']:.2f}",
                f"{r['verify_ms']:.2f}",
                f"{r['other_ms']:.3f}",
                f"{plans[r['steps']]['tok_s']:.1f}",
                "candidate" if r["steps"] in level["candidates"] else "",
            ]
            for r in level["rows"]
        ]
        print(f"\ndraft noise {level['draft_noise']}")
        print(
            tabulate(
                table,
                headers=[
                    "steps",
                    "tok/s (median)",
                    "accept len",
                    "draft ms",
                    "verify ms",
                    "other ms",
                    "predicted tok/s",
                    "",
                ],
                tablefmt="simple",
            )
        )
        cands = level["candidates"]
        print(
            f"measured best k = {level['measured_best_k']}; planner: best k = "
            f"{level['predicted_best_k']}, candidates {', '.join(map(str, cands))} "
            f"({'contains' if level['best_in_candidates'] else 'MISSES'} the measured best; "
            f"{len(cands)} candidate(s))"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
