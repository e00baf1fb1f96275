"""Step-count sweep of the built-in TP speculative decode loop: measured vs predicted best k.

Runs `integration.spec_loop` on gloo at world 2 (CPU), draft steps 0..5, at two draft
noise levels (how far the draft's weights are perturbed, i.e. how often it is accepted),
all in one torchrun launch, and prints per step count: tok/s, accept length (bonus
token included), draft / verify / other ms per cycle. Then, per noise level, the
measured best step count and the one the speculative decoding model predicts
(nccl_tune.specdec, DESIGN.md section 6) from the k = 0 and k = 1 runs only:

    a         = iid per-token acceptance with tau(1) = accept length at k = 1
    t_draft   = draft ms per step at k = 1
    t_verify  = verify ms at 1 token (k = 0) and 2 tokens (k = 1), linear beyond
    t_other   = other ms at k = 1
    tok/s(k)  = 1000 x tau(k) / (k x t_draft + t_verify(k + 1) + t_other)

so the prediction for k = 2..5 is out of sample. Measured tok/s is the median over runs
of wall-clock tok/s of the decode loop (the loop interleaves the runs of all step counts
in rounds, so load drift on a shared machine hits them alike).

    python bench/spec_sweep.py            # about a minute on 2 CPU cores
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

from nccl_tune import specdec  # noqa: E402

STEPS = [0, 1, 2, 3, 4, 5]
MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1024",
         "--draft-layers", "1"]


def run_sweep(noise: list[float], new_tokens: int, runs: int, timeout: float) -> list[dict]:
    """One torchrun launch (2 ranks, gloo) measuring every (noise, steps) pair."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "integration.spec_loop", *MODEL, "--backend", "gloo", "--device", "cpu",
           "--new-tokens", str(new_tokens), "--runs", str(runs), "--warmup-tokens", "16",
           "--sweep-steps", ",".join(map(str, STEPS)),
           "--sweep-noise", ",".join(map(str, noise)), "--json"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"spec_sweep: no result after {timeout:.0f} s")
    if proc.returncode != 0:
        raise SystemExit("spec_sweep: the loop failed:\n" + "\n".join(err.strip().splitlines()[-5:]))
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["sweep"]


def predict(records: dict[int, dict]) -> dict:
    """specdec's plan for k = 0..5, calibrated on the k = 0 and k = 1 measurements."""
    k0, k1 = records[0], records[1]
    rate = specdec.iid_rate_from_accept_len(min(max(k1["accept_len"], 1.0), 2.0), 1)
    verify = specdec.MeasuredVerify.from_lists([1, 2], [k0["verify_ms"], k1["verify_ms"]])
    plans = specdec.plan_steps(STEPS, lambda k: specdec.tau_iid(rate, k), k1["draft_ms"], verify,
                               k1["other_ms"])
    best = specdec.best_step(plans)
    return {"rate": rate, "draft_step_ms": k1["draft_ms"], "verify_1_ms": k0["verify_ms"],
            "verify_2_ms": k1["verify_ms"], "other_ms": k1["other_ms"],
            "plans": {p.k: {"tau": p.tau, "cycle_ms": p.cycle_ms, "tok_s": p.tok_s,
                            "extrapolated": p.extrapolated} for p in plans},
            "best_k": best.k}


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
        result.append({"draft_noise": level, "measured_best_k": measured_best,
                       "predicted_best_k": prediction["best_k"], "prediction": prediction,
                       "rows": [{k: records[s][k] for k in ("steps", "tok_s_median", "runs_tok_s",
                                                           "accept_len", "draft_ms", "verify_ms",
                                                           "other_ms", "step_ms")}
                                for s in STEPS]})
    if args.json:
        print(json.dumps({"model": MODEL, "backend": "gloo", "world_size": 2, "levels": result}))
        return 0
    first = sweep[0]
    print(f"built-in loop, gloo, world 2, {first['dtype']}: layers {first['layers']}, hidden "
          f"{first['hidden']}, heads {first['heads']}, vocab {first['vocab']}; draft "
          f"{first['draft_layers']} layer; {args.new_tokens} tokens x {args.runs} runs per step count")
    for level in result:
        plans = level["prediction"]["plans"]
        table = [[r["steps"], f"{r['tok_s_median']:.1f}", f"{r['accept_len']:.2f}", f"{r['draft_ms']:.2f}",
                  f"{r['verify_ms']:.2f}", f"{r['other_ms']:.3f}",
                  f"{plans[r['steps']]['tok_s']:.1f}" + (" *" if plans[r["steps"]]["extrapolated"] else "")]
                 for r in level["rows"]]
        print(f"\ndraft noise {level['draft_noise']}")
        print(tabulate(table, headers=["steps", "tok/s (median)", "accept len", "draft ms", "verify ms",
                                       "other ms", "predicted tok/s"], tablefmt="simple"))
        pr = level["prediction"]
        print(f"measured best k = {level['measured_best_k']}, predicted best k = {level['predicted_best_k']} "
              f"(specdec, calibrated on k=0,1: iid acceptance {pr['rate']:.2f}, draft step "
              f"{pr['draft_step_ms']:.2f} ms, verify {pr['verify_1_ms']:.2f}/{pr['verify_2_ms']:.2f} ms "
              f"at 1/2 tokens; * = verify time extrapolated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
