"""Best step count per batch size: the built-in loop measured, the planner's prediction.

Runs `integration.spec_batch` (the built-in TP speculative loop, batched) on gloo at world
2 (CPU) at batch 1, 4 and 8 and k = 0..4, all in one torchrun launch with the runs
interleaved, and prints per (batch, k) the measured tok/s per sequence (median over runs)
next to the planner's prediction, and per batch size the planner's candidates and
whether the measured best is among them. Target: in every batch size, with at most 3
candidates.

What the planner is given is what a user has from a batch-1 profile plus plain decoding
at a few batch sizes (not the verify times at batch > 1, which it predicts):

- plain decoding's step time at batch 1, 4 and 8 (the k = 0 runs): --decode-ms D1,D4,D8@1,4,8,
  which also fits the saturation point (nccl_tune.spec.saturation);
- the verify times at k + 1 tokens from the batch-1 runs (mean cycles), the draft step
  and other time (means over the batch-1 runs with k >= 1) and the per-position
  acceptance of the batch-1 k = 4 run;
- each timing's run-to-run interval (+-H, the 95% t interval of the runs' mean
  cycles), so the candidates are the k whose predicted tok/s interval reaches the best's;
- --verify-model dense: fixed + per-token x n fitted by least squares to all those
  forward times (on a shared CPU single points scatter by tens of percent, so a fit, not
  interpolation between them), with the saturation term; rows beyond the measured token
  counts are extrapolated and marked.

    python bench/spec_batches.py            # several minutes on 2 CPU cores
    python bench/spec_batches.py --json

On a shared machine the timings are noisy: say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nccl_tune.spec import planner as spec_planner  # noqa: E402  (fail early if the tree is broken)
from nccl_tune.spec.options import AcceptanceInput  # noqa: E402

BATCHES = [1, 4, 8]
STEPS = [0, 1, 2, 3, 4]
MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1024", "--draft-layers", "1"]


def run_loop(args) -> dict:
    """One torchrun launch (2 ranks, gloo) measuring every (batch, k)."""
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
        "integration.spec_batch",
        *MODEL,
        "--draft-noise",
        str(args.noise),
        "--backend",
        "gloo",
        "--device",
        "cpu",
        "--batches",
        ",".join(map(str, BATCHES)),
        "--sweep-steps",
        ",".join(map(str, STEPS)),
        "--new-tokens",
        str(args.new_tokens),
        "--runs",
        str(args.runs),
        "--json",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"spec_batches: no result after {args.timeout:.0f} s") from None
    if proc.returncode != 0:
        from integration.validate import last_error_line

        raise SystemExit(f"spec_batches: the loop failed: {last_error_line(err, out)}")
    return json.loads([x for x in out.splitlines() if x.startswith("{")][-1])


def half(values: list[float]) -> float:
    """Half-width of the 95% t interval of the runs' values (their mean's uncertainty)."""
    from nccl_tune import stats

    if len(values) < 2:
        return 0.0
    mean, lo, hi = stats.t_ci(values)
    return (hi - lo) / 2


def request(records: dict[tuple[int, int], dict]) -> spec_planner.PlanRequest:
    """The planner's inputs from the batch-1 runs and plain decoding at each batch size,
    each timing with its run-to-run interval (+-H: the planner's candidates are then the k
    whose tok/s interval reaches the best's)."""
    one = {k: records[(1, k)] for k in STEPS if k}
    draft = sum(r["draft_ms"] / k for k, r in one.items()) / len(one)
    other = sum(r["other_ms"] for r in one.values()) / len(one)
    reach = sorted(records[(1, max(STEPS))]["accept_per_pos"], reverse=True)
    halves = {
        "decode_ms": half(records[(1, 0)]["runs_step_ms"]),
        "draft_ms": sum(half(r["runs_draft_ms"]) / k for k, r in one.items()) / len(one),
        "other_ms": sum(half(r["runs_other_ms"]) for r in one.values()) / len(one),
        "verify": {k + 1: half(r["runs_verify_ms"]) for k, r in one.items()},
        "decode_points": {b: half(records[(b, 0)]["runs_step_ms"]) for b in BATCHES if b > 1},
    }
    return spec_planner.PlanRequest(
        [k for k in STEPS if k],
        AcceptanceInput(per_pos=tuple(reach)),
        records[(1, 0)]["step_ms"],
        [(k + 1, r["verify_ms"]) for k, r in sorted(one.items())],
        False,
        draft,
        other,
        verify_model="dense",
        extrapolate=True,
        batches=list(BATCHES),
        halves=halves,
        decode_points=[(b, records[(b, 0)]["step_ms"]) for b in BATCHES if b > 1],
    )


def measured_ties(records, batch: int) -> list[int]:
    """The k whose runs' tok/s cannot be told from the measured best's (their 95% t
    intervals overlap): on a shared machine the argmax alone is not a measurement."""
    from nccl_tune import stats

    ci = {k: stats.t_ci(records[(batch, k)]["runs_tok_s"])[1:] for k in STEPS}
    best = max(STEPS, key=lambda k: records[(batch, k)]["tok_s_median"])
    return sorted(k for k in STEPS if ci[k][1] >= ci[best][0] and ci[best][1] >= ci[k][0])


def main(argv: list[str] | None = None) -> int:
    """Run the loop, plan, print the table (or JSON)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noise", type=float, default=0.25, help="draft noise (how often it is accepted)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    loop = run_loop(args)
    records = {(r["batch"], r["steps"]): r for r in loop["records"]}
    result = spec_planner.plan(request(records))
    rows, summary = [], []
    for bp in result.batches:
        predicted = {p.k: p for p in bp.plans}
        measured = {k: records[(bp.batch, k)]["tok_s_median"] for k in STEPS}
        best = max(measured, key=measured.get)
        ties = measured_ties(records, bp.batch)
        summary.append(
            {
                "batch": bp.batch,
                "measured_best_k": best,
                "predicted_best_k": bp.best.k,
                "candidates": bp.candidates,
                "best_in_candidates": best in bp.candidates,
                "measured_ties": ties,
                "tie_in_candidates": bool(set(ties) & set(bp.candidates)),
                "measured_tok_s": measured,
                "predicted_tok_s": {k: p.tok_s for k, p in predicted.items()},
                "extrapolated": [k for k, p in predicted.items() if p.extrapolated],
            }
        )
        for k in STEPS:
            r = records[(bp.batch, k)]
            pred = predicted.get(k)
            rows.append(
                [
                    bp.batch,
                    k,
                    f"{measured[k]:.1f}",
                    "-" if pred is None else f"{pred.tok_s:.1f}" + ("*" if pred.extrapolated else ""),
                    f"{r['accept_len']:.2f}",
                    f"{r['verify_ms']:.2f}",
                    f"{r['draft_ms']:.2f}",
                    ", ".join(
                        x
                        for x in (
                            "measured best" if k == best else "",
                            "predicted best" if k == bp.best.k else "",
                            "candidate" if k in bp.candidates else "",
                        )
                        if x
                    ),
                ]
            )
    if args.json:
        print(
            json.dumps(
                {
                    "loop": {k: v for k, v in loop.items() if k != "records"},
                    "records": loop["records"],
                    "batches": summary,
                    "verify_model": result.verify_model,
                    "notes": result.notes,
                }
            )
        )
        return 0
    print(
        f"built-in loop batched, gloo, world 2, float64: layers {loop['layers']}, hidden "
        f"{loop['hidden']}, draft {loop['draft_layers']} layer, draft noise {loop['draft_noise']}; "
        f"{loop['new_tokens']} tokens per sequence x {loop['runs']} runs per (batch, k); tok/s per "
        "sequence (median over runs); planner given batch-1 timings and plain decoding at each "
        "batch size (* = extrapolated verify)"
    )
    print(
        tabulate(
            rows,
            headers=["batch", "k", "measured tok/s", "predicted", "accept len", "verify ms", "draft ms", ""],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    print(f"verify: {result.verify_model['description']}")
    for s in summary:
        print(
            f"batch {s['batch']}: measured best k = {s['measured_best_k']} (runs cannot tell it "
            f"from k = {', '.join(map(str, s['measured_ties']))}), planner best "
            f"{s['predicted_best_k']}, candidates {', '.join(map(str, s['candidates']))} "
            f"({'contains' if s['best_in_candidates'] else 'MISSES'} the measured best; "
            f"{len(s['candidates'])} candidate(s))"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
