"""Does the per-token model predict a real TP decode loop? Prints predicted vs measured.

For two model sizes, on gloo at world 2 (CPU), this runs:

1. the built-in TP speculative decode loop (`integration.spec_loop`, issue "Integration")
   as it is, and again with `--skip-allreduce` (compute only: every allreduce a no-op);
2. the allreduce microbench (`microbench.allreduce`) at the loop's message sizes, with
   `--gap-us` set to the loop's mean compute between two allreduces (from the
   compute-only run) and `--ops-per-sample 10`.

Then it predicts, per decode cycle (k draft steps + one verify of k+1 tokens):

    collectives = k x per_draft_forward x lat(decode bytes)
                  + per_target_forward x lat(verify bytes)          (nccl_tune.model.per_token)
    cycle       = compute-only cycle + straggler wait + collectives

and compares with what the loop measured: its cycle, and the time its collectives took
from the last rank's arrival until all were done (every rank's host stamps,
integration.commtime). The straggler wait (ranks waiting for the slowest one's compute)
is estimated from the compute-only run's per-rank segments, as in the bulk-synchronous
model; the loop's own figure is printed beside it. Target: within 15%, judged on the
paired errors: each repeat's prediction against its own loop run, the median over the
repeats (the medians of each side are printed too).

Why this way, on this kind of machine: gloo's latency on a small VM is mostly scheduler
wake-ups, and how long a wake-up takes depends on what the core did before (busy or
idle). Collectives timed back to back, or each after a barrier, see other wake-ups than
the loop's collectives, which come after compute; the difference of two loop runs
(full minus compute-only) also charges the collectives with the compute's skew between
ranks and with compute slowed by the communication threads. `--gap-us` gives the
microbench the loop's rhythm, and the last-arrival time on both sides leaves the
ranks' compute imbalance out of the collective's cost. The difference of the two loop
runs is still printed, for comparison.

Approximation, stated: a draft forward after a rejection carries the few pending tokens
at once; the prediction counts every draft allreduce at one token's size.

    python bench/model_fit.py            # two sizes, 5 repeats: about 7 minutes on 2 cores
    python bench/model_fit.py --json

Exit codes: 0 all within target, 1 outside target, 2 a part is missing or failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nccl_tune.model import per_token as model  # noqa: E402  (after the path is set)

TARGET = 0.15
WORLD = 2
SIZES = [  # (name, spec_loop size options)
    ("small", ["--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "512"]),
    ("large", ["--layers", "8", "--hidden", "1024", "--heads", "8", "--vocab", "1024"]),
]
LOOP_COMMON = [
    "--steps",
    "2",
    "--new-tokens",
    "48",
    "--runs",
    "3",
    "--warmup-tokens",
    "8",
    "--backend",
    "gloo",
    "--device",
    "cpu",
    "--json",
]
LOOP_KEYS = (
    "backend",
    "world_size",
    "layers",
    "hidden",
    "steps",
    "accept_len",
    "tok_s",
    "draft_ms",
    "verify_ms",
    "other_ms",
    "cycles",
    "allreduces",
    "comm_split",
)
MICRO_ITERS = "100"
MICRO_OPS_PER_SAMPLE = "10"  # ten gapped collectives per aligned sample, see the module doc


class Missing(Exception):
    """A part of the project this benchmark needs is not in this checkout."""


def require_parts() -> None:
    """Fail with a clear message when the loop or the microbench has not landed."""
    missing = []
    if importlib.util.find_spec("integration.spec_loop") is None:
        missing.append('the built-in TP loop `integration/spec_loop.py` (issue "Integration", helper h5)')
    if importlib.util.find_spec("microbench.allreduce") is None:
        missing.append("the allreduce microbench `microbench/allreduce.py` (helper h2)")
    if missing:
        raise Missing(
            "bench/model_fit.py cannot run: missing "
            + " and ".join(missing)
            + ". No figures are made up in their place."
        )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def torchrun(module: str, args: list[str], timeout: float = 600) -> str:
    """Run `module` under torchrun at world 2; stdout, or Missing/RuntimeError on failure."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        "-m",
        module,
        *args,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"{module} timed out after {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-5:])
        if "unrecognized arguments" in err:
            raise Missing(f"{module} does not take the options this benchmark needs:\n{tail}")
        raise RuntimeError(f"{module} exited {proc.returncode}:\n{tail}")
    return out


def run_loop(size_args: list[str], skip: bool) -> dict:
    """One loop measurement (rank 0's JSON object)."""
    out = torchrun("integration.spec_loop", size_args + LOOP_COMMON + (["--skip-allreduce"] if skip else []))
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if len(lines) != 1:
        raise RuntimeError(f"integration.spec_loop printed {len(lines)} JSON objects, expected 1")
    record = json.loads(lines[0])
    absent = [k for k in LOOP_KEYS if k not in record]
    if absent:
        raise Missing(f"integration.spec_loop's JSON lacks {', '.join(absent)}")
    if skip and record.get("tokens_valid") is not False:
        raise RuntimeError("--skip-allreduce did not mark its tokens invalid: was it honoured?")
    return record


def run_microbench(sizes: list[int], gap_us: float) -> dict[int, dict]:
    """lat_us summary per size from the microbench's records, gloo at world 2, with
    `gap_us` of busy compute before each collective."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "micro.jsonl")
        torchrun(
            "microbench.allreduce",
            [
                "--sizes",
                ",".join(map(str, sizes)),
                "--dtype",
                "fp32",
                "--backend",
                "gloo",
                "--iters",
                MICRO_ITERS,
                "--ops-per-sample",
                MICRO_OPS_PER_SAMPLE,
                "--gap-us",
                f"{gap_us:.1f}",
                "--out",
                out,
            ],
        )
        from nccl_tune import store

        records = store.read_records([out])
    lat = {
        int(r["bytes"]): r["lat_us"]
        for r in records
        if (r.get("status") or "ok") == "ok" and (r.get("lat_us") or {}).get("mean")
    }
    if set(lat) != set(sizes):
        raise RuntimeError(f"microbench measured {sorted(lat)}, expected {sorted(sizes)}")
    return lat


def compute_gap_us(compute: dict) -> float:
    """Mean compute between two collective calls of the loop (its allreduces and the
    acceptance broadcast), from its compute-only run (us)."""
    ar = compute["allreduces"]
    return 1000.0 * cycle_ms(compute) / ar.get("collectives_per_cycle_counted", ar["per_cycle_counted"])


def cycle_ms(record: dict) -> float:
    """Mean time of one decode cycle (draft + verify + other), ms."""
    return record["draft_ms"] + record["verify_ms"] + record["other_ms"]


def predict(full: dict, compute: dict, lat: dict[int, float]) -> dict:
    """Predicted collectives and cycle time from the microbench and the compute-only run.

    `lat` is the microbench's MEAN latency per size: the loop reports mean times per
    cycle, and a mean of sums is the sum of means (p50s would not add up).
    """
    ar = full["allreduces"]
    k = full["steps"]
    decode_b, verify_b = int(ar["bytes_per_decode"]), int(ar["bytes_per_verify"])
    curve = model.LatencyCurve.from_points(lat.items(), label="gloo microbench")
    draft_comm = k * ar["per_draft_forward"] * curve.at(decode_b) / 1000.0
    verify_comm = ar["per_target_forward"] * curve.at(verify_b) / 1000.0
    # The acceptance broadcast (steps + 2 int64 values) is not measured by the microbench:
    # priced as the smallest allreduce measured, a model, not a measurement.
    decision_comm = ar.get("decision_broadcasts_per_cycle", 0) * curve.at(min(lat)) / 1000.0
    predicted_comm = draft_comm + verify_comm + decision_comm
    # the loop's own split of its collectives (integration.commtime): last arrival -> done
    measured_comm = full["comm_split"]["collective_ms"]
    # compute only, plus the wait for the slowest rank had the ranks synchronised
    straggler = compute["comm_split"]["straggler_ms"]
    predicted_cycle = cycle_ms(compute) + straggler + predicted_comm
    return {
        "layers": full["layers"],
        "hidden": full["hidden"],
        "steps": k,
        "decode_bytes": decode_b,
        "verify_bytes": verify_b,
        "lat_mean_us": {str(b): v for b, v in sorted(lat.items())},
        "allreduces_per_cycle": k * ar["per_draft_forward"] + ar["per_target_forward"],
        "compute_cycle_ms": cycle_ms(compute),
        "predicted_straggler_ms": straggler,
        "measured_straggler_ms": full["comm_split"]["straggler_ms"],
        "difference_comm_ms": cycle_ms(full) - cycle_ms(compute),
        # the rest of the full run's cycle: its compute, which the compute-only run predicts
        "full_run_compute_ms": cycle_ms(full) - measured_comm - full["comm_split"]["straggler_ms"],
        "predicted_comm_ms": predicted_comm,
        "measured_comm_ms": measured_comm,
        "comm_error": (predicted_comm - measured_comm) / measured_comm if measured_comm > 0 else None,
        "predicted_verify_ms": compute["verify_ms"] + verify_comm,
        "measured_verify_ms": full["verify_ms"],
        "predicted_draft_ms": compute["draft_ms"] + draft_comm,
        "measured_draft_ms": full["draft_ms"],
        "predicted_cycle_ms": predicted_cycle,
        "measured_cycle_ms": cycle_ms(full),
        "cycle_error": (predicted_cycle - cycle_ms(full)) / cycle_ms(full),
        "accept_len": full["accept_len"],
        "tok_s": full["tok_s"],
    }


def measure_size(size_args: list[str], repeats: int) -> dict:
    """Compute-only loop, microbench, full loop, microbench again, `repeats` times; medians.

    Repeating spreads slow phases of a shared machine over all parts alike; the two
    microbench runs bracket the full loop in time (their mean is the repeat's latency),
    so a drift in the machine's wake-up latency hits both sides of the comparison.
    """
    fulls, computes, micros, gaps = [], [], [], []
    for _ in range(repeats):
        computes.append(run_loop(size_args, skip=True))
        ar = computes[-1]["allreduces"]
        sizes = sorted({int(ar["bytes_per_decode"]), int(ar["bytes_per_verify"])})
        gaps.append(compute_gap_us(computes[-1]))
        before = run_microbench(sizes, gaps[-1])
        fulls.append(run_loop(size_args, skip=False))
        after = run_microbench(sizes, gaps[-1])
        micros.append({b: {key: (before[b][key] + after[b][key]) / 2 for key in ("mean", "p50")} for b in sizes})
    full, compute = dict(fulls[-1]), dict(computes[-1])
    for key in ("draft_ms", "verify_ms", "other_ms"):
        full[key] = statistics.median(r[key] for r in fulls)
        compute[key] = statistics.median(r[key] for r in computes)
    full["comm_split"] = {
        k: statistics.median(r["comm_split"][k] for r in fulls)
        for k in ("collective_ms", "straggler_ms", "in_collective_ms")
    }
    compute["comm_split"] = {"straggler_ms": statistics.median(r["comm_split"]["straggler_ms"] for r in computes)}
    lat = {b: statistics.median(m[b]["mean"] for m in micros) for b in micros[0]}
    row = predict(full, compute, lat)
    row["gap_us"] = [round(g, 1) for g in gaps]
    # The same prediction within each repeat, from its own loop runs and the microbench
    # runs that bracket them: the machine drifts between repeats, and these pairs are
    # what the bracketing matches up, so the verdict is their median (the paired error,
    # as harness_overhead's median of paired ratios).
    repeats = [predict(f, c, {b: v["mean"] for b, v in m.items()}) for f, c, m in zip(fulls, computes, micros)]
    row["per_repeat_comm_error"] = [p["comm_error"] for p in repeats]
    row["per_repeat_cycle_error"] = [p["cycle_error"] for p in repeats]
    comm_errors = [e for e in row["per_repeat_comm_error"] if e is not None]
    row["paired_comm_error"] = statistics.median(comm_errors) if comm_errors else None
    row["paired_cycle_error"] = statistics.median(row["per_repeat_cycle_error"])
    row["spread"] = {
        "cycle_ms": [round(cycle_ms(r), 3) for r in fulls],
        "compute_cycle_ms": [round(cycle_ms(r), 3) for r in computes],
        "lat_mean_us": {str(b): [round(m[b]["mean"], 1) for m in micros] for b in micros[0]},
        "lat_p50_us": {str(b): [round(m[b]["p50"], 1) for m in micros] for b in micros[0]},
    }
    return row


def render(rows: list[dict]) -> str:
    """A plain table of predicted against measured."""
    lines = [
        f"model fit: per-token model vs the built-in TP loop, gloo world {WORLD} (CPU); "
        f"target |paired error| <= {TARGET:.0%}",
        f"{'size':<22}{'allreduce mean us':<22}{'comm ms/cycle':<26}{'cycle ms':<26}",
        f"{'':<22}{'decode / verify':<22}{'pred / meas (err)':<26}{'pred / meas (err)':<26}",
    ]
    for r in rows:
        lat = list(r["lat_mean_us"].values())
        lat_text = " / ".join(f"{v:.1f}" for v in (lat if len(lat) > 1 else lat * 2))
        comm = f"{r['predicted_comm_ms']:.3f} / {r['measured_comm_ms']:.3f} ({_pct(r['comm_error'])})"
        cyc = f"{r['predicted_cycle_ms']:.3f} / {r['measured_cycle_ms']:.3f} ({_pct(r['cycle_error'])})"
        lines.append(
            f"{r['name'] + ' L' + str(r['layers']) + ' H' + str(r['hidden']):<22}{lat_text:<22}{comm:<26}{cyc:<26}"
        )
    lines.append("(medians of the repeats on each side; the verdict uses the paired errors below)")
    for r in rows:
        lines.append(
            f"{r['name']}: {r['allreduces_per_cycle']} allreduces per cycle (k={r['steps']}), "
            f"{r['decode_bytes']} B decode / {r['verify_bytes']} B verify; compute-only cycle "
            f"{r['compute_cycle_ms']:.3f} ms; accept len {r['accept_len']:.2f}"
        )
        lines.append(
            f"  microbench gap {r['gap_us']} us; straggler wait ms/cycle predicted "
            f"{r['predicted_straggler_ms']:.3f}, measured {r['measured_straggler_ms']:.3f}; "
            f"full minus compute-only cycle {r['difference_comm_ms']:.3f} ms"
        )
        lines.append(
            f"  compute ms/cycle: compute-only run {r['compute_cycle_ms']:.3f}, full run "
            f"{r['full_run_compute_ms']:.3f} (its cycle less collectives and straggler wait)"
        )
        errors = ", ".join(_pct(e) for e in r["per_repeat_comm_error"])
        lines.append(f"  comm error within each repeat: {errors}; paired (median) {_pct(r['paired_comm_error'])}")
        errors = ", ".join(_pct(e) for e in r["per_repeat_cycle_error"])
        lines.append(f"  cycle error within each repeat: {errors}; paired (median) {_pct(r['paired_cycle_error'])}")
        sp = r["spread"]
        lines.append(
            f"  runs: cycle ms {sp['cycle_ms']}, compute-only {sp['compute_cycle_ms']}, "
            f"allreduce mean us {sp['lat_mean_us']}, p50 us {sp['lat_p50_us']}"
        )
    return "\n".join(lines)


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Five: single repeats on a 2-core VM scatter by +-30% (printed per repeat); the median
    # of five is what the target is judged on.
    parser.add_argument("--repeats", type=int, default=5, help="loop runs per size and variant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        require_parts()
        rows = []
        for name, size_args in SIZES:
            row = measure_size(size_args, args.repeats)
            row["name"] = name
            rows.append(row)
    except Missing as exc:
        print(f"model_fit: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"model_fit: failed: {exc}", file=sys.stderr)
        return 2
    within = all(
        abs(r["paired_cycle_error"]) <= TARGET
        and r["paired_comm_error"] is not None
        and abs(r["paired_comm_error"]) <= TARGET
        for r in rows
    )
    if args.json:
        print(json.dumps({"target": TARGET, "within_target": within, "sizes": rows}, indent=2))
    else:
        print(render(rows))
        print("within target" if within else "OUTSIDE target")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
