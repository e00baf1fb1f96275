#!/usr/bin/env bash
# One-GPU smoke test of the CUDA/NCCL paths (NCCL backend, world size 1), under 10 minutes.
#
#   bash bench/gpu_smoke.sh            from a fresh clone on a machine with one GPU
#
# What world size 1 can and cannot show: NCCL does not run a collective on one rank
# (ncclEnqueueCheck takes ncclLaunchOneRank, src/enqueue.cc, src/device/onerank.cu): an
# in-place allreduce is a no-op, no algorithm is chosen and no per-collective TUNING
# line is logged. So this proves little about allreduce: it uses out-of-place
# all_gather (NCCL copies there), expects `effective.confirmed` None (nothing to
# confirm, never False), and checks what one GPU can:
#   (a) graph mode end to end on a fresh new_group under the gloo default group
#       (capture, replays, the exact check; the group destroyed and rebuilt per cell);
#   (b) a fresh communicator per cell and log attribution: log files of one process,
#       "Init COMPLETE" in each cell, "NCCL_PROTO set by environment to Simple" only in
#       the cell that set it;
#   (c) the libnccl mapped and its ncclGetVersion against torch.cuda.nccl.version(),
#       the log's version line, whether ncclResetDebugInit was found;
#   (d) timing sanity: samples positive and finite, graph per-op below eager, eager with
#       --ops-per-sample 10 (host-bound) against one op (device time) and the host
#       enqueue time the record gives;
#   (e) the built-in loop on NCCL: float64 --check-greedy gives matches_greedy true, a
#       bf16 run completes (at world 1 it runs no collective: CUDA only).
# Each launch is bounded (100 s, the loop 120 s: under 10 minutes in all). Prints PASS /
# FAIL / INFO lines and exits 1 when any check fails. Works offline: the
# checkout is used through PYTHONPATH (torch, numpy, scipy, click, tabulate must be there).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_PROTO NCCL_ALGO
OUT=$(mktemp -d /tmp/nccl-tune-smoke.XXXXXX)
SECONDS=0

echo "== environment (world size 1: NCCL runs no collective algorithm; see the header)"
nvidia-smi -L || echo "gpu_smoke: nvidia-smi not available"
"$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "torch built with nccl",
          ".".join(map(str, torch.cuda.nccl.version())))
EOF

bench() {  # bench NAME ARGS...: one torchrun launch of the microbench, bounded
  local name=$1; shift
  echo
  echo "== $name: microbench.allreduce $*"
  timeout 100 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 \
    -m microbench.allreduce --backend nccl --op all_gather --sizes 14336 --timeout 60 \
    --out "$OUT/$name.jsonl" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  echo "$?" >"$OUT/$name.rc"
  tail -n 5 "$OUT/$name.out"
  grep -v "^# nccl-log" "$OUT/$name.err" | tail -n 5
  echo "== $name: exit code $(cat "$OUT/$name.rc")"
}

loop() {  # loop NAME ARGS...: one torchrun launch of the built-in loop, bounded
  local name=$1; shift
  echo
  echo "== $name: integration.spec_loop $*"
  timeout 120 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 \
    -m integration.spec_loop --backend nccl --json "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  echo "$?" >"$OUT/$name.rc"
  tail -n 3 "$OUT/$name.err"
  echo "== $name: exit code $(cat "$OUT/$name.rc")"
}

cat >"$OUT/plan.json" <<'EOF'
{"run_id": "gpu-smoke-plan", "cells": [
  {"cell": "baseline", "env": {}, "comm_env": {}, "extra": {"isolation": "group"}},
  {"cell": "c-proto-simple", "env": {"NCCL_PROTO": "Simple"}, "comm_env": {"NCCL_PROTO": "Simple"},
   "extra": {"isolation": "group"}}
]}
EOF
bench graph --mode graph --graph-ops 10 --warmup 10 --iters 100 --verify-effective --show-nccl-log \
  --plan "$OUT/plan.json"
bench eager1 --mode eager --warmup 20 --iters 200 --verify-effective
bench eager10 --mode eager --warmup 20 --iters 200 --ops-per-sample 10 --verify-effective
loop loop64 --dtype float64 --check-greedy --new-tokens 32
loop loopbf16 --dtype bfloat16 --new-tokens 32

echo
echo "== checks (world size 1: these prove the CUDA paths, not NCCL's allreduce algorithms)"
"$PY" - "$OUT" <<'EOF'
import glob, json, math, os, re, sys

out = sys.argv[1]
failed = []


def say(status, what, detail=""):
    print(f"{status:4} {what}" + (f": {detail}" if detail else ""))
    if status == "FAIL":
        failed.append(what)


def rc(name):
    try:
        return int(open(os.path.join(out, name + ".rc")).read().strip())
    except (OSError, ValueError):
        return None


def records(name):
    try:
        return [json.loads(line) for line in open(os.path.join(out, name + ".jsonl")) if line.strip()]
    except OSError:
        return []


graph, eager1, eager10 = records("graph"), records("eager1"), records("eager10")
every = graph + eager1 + eager10
for name in ("graph", "eager1", "eager10"):
    if rc(name) != 0:
        say("FAIL", f"{name} launch", f"exit code {rc(name)}; see {out}/{name}.err")

# (a) graph mode end to end, two cells, each on its own group
cells = {r.get("cell"): r for r in graph}
ok = [r for r in graph if r.get("status") == "ok" and r.get("correct") is True]
say("PASS" if len(ok) == 2 and set(cells) == {"baseline", "c-proto-simple"} else "FAIL",
    "(a) graph all_gather, two cells on fresh groups: captured, replayed, exact",
    ", ".join(f"{r['cell']} {r.get('status')} correct={r.get('correct')}" for r in graph) or "no records")
confirmed = {r.get("cell"): (r.get("effective") or {}).get("confirmed") for r in every}
say("PASS" if every and all(v is None for v in confirmed.values()) else "FAIL",
    "(a) effective.confirmed is None at world 1 (nothing ran to confirm, never False)", str(confirmed))

# (b) log files of one process; Init COMPLETE per cell; PROTO only in its cell
by_cell, files = {}, set()
for line in open(os.path.join(out, "graph.err"), errors="replace"):
    m = re.match(r"# nccl-log (\S+) (\S+): (.*)$", line.rstrip("\n"))
    if m:
        by_cell.setdefault(m.group(1), []).append(m.group(3))
        files.add(m.group(2))
pids = {f.split(".")[-2] for f in files if f.count(".") >= 3}
say("PASS" if files and len(pids) == 1 else "FAIL", "(b) NCCL log files of one process (%p)",
    f"{sorted(files)}")
for cell in ("baseline", "c-proto-simple"):
    lines = by_cell.get(cell, [])
    say("PASS" if any("Init COMPLETE" in x for x in lines) else "FAIL",
        f"(b) cell {cell}: a communicator of its own (Init COMPLETE in its lines)", f"{len(lines)} lines")
proto = {cell: any("NCCL_PROTO set by environment to Simple" in x for x in lines)
         for cell, lines in by_cell.items()}
say("PASS" if proto.get("c-proto-simple") and not proto.get("baseline") else "FAIL",
    "(b) 'NCCL_PROTO set by environment to Simple' only in the cell that set it", str(proto))

# (c) the libnccl loaded
v = (graph or eager1 or [{}])[0].get("versions") or {}
log = (graph or [{}])[0].get("nccl_log") or {}
say("PASS" if v.get("nccl_library") and v.get("nccl_library_version") else "FAIL",
    "(c) libnccl mapped and its ncclGetVersion",
    f"{v.get('nccl_library')} {v.get('nccl_library_version')} ({v.get('nccl_source')})")
say("INFO", "(c) torch.cuda.nccl.version() / NCCL's log line",
    f"{v.get('nccl_build')} / {v.get('nccl_log')}" + (f"; DIFFER: {v['nccl_note']}" if v.get("nccl_note") else "; same"))
say("INFO", "(c) ncclResetDebugInit", f"{log.get('reset_debug_init')}: {log.get('note')}; "
    f"per-collective lines {log.get('per_collective_lines')}")

# (d) timing sanity
samples = [s for r in every for s in (r.get("samples_us") or [])]
say("PASS" if samples and all(math.isfinite(s) and s > 0 for s in samples) else "FAIL",
    "(d) every sample positive and finite", f"{len(samples)} samples")
methods = {r.get("timing_method") for r in every}
say("PASS" if methods == {"device-aligned"} else "FAIL", "(d) timing_method recorded", str(methods))
p50 = lambda rs: (rs[0].get("lat_us") or {}).get("p50") if rs and rs[0].get("status") == "ok" else None
g, e1, e10 = p50([r for r in graph if r.get("cell") == "baseline"]), p50(eager1), p50(eager10)
say("PASS" if g and e1 and g < e1 else "FAIL", "(d) graph per-op p50 below eager p50", f"graph {g} us, eager {e1} us")
host = ((eager1 or [{}])[0].get("timing") or {}).get("host_enqueue_us")
head = ((eager1 or [{}])[0].get("timing") or {}).get("head_start_us")
if e1 and e10 and host:
    near = 0.5 * host <= e10 <= 2.0 * host + e1
    say("PASS" if e10 > e1 and near else "FAIL",
        "(d) --ops-per-sample 10 moves the eager p50 to about the host enqueue time (host-bound)",
        f"1 op {e1:.2f} us (device time after the head start of {head} us), 10 ops {e10:.2f} us "
        f"per op, host enqueue {host:.2f} us per op")
else:
    say("FAIL", "(d) eager medians and host enqueue time", f"1 op {e1}, 10 ops {e10}, host {host}")

# (e) the built-in loop
for name, want in (("loop64", True), ("loopbf16", None)):
    try:
        rec = json.loads([l for l in open(os.path.join(out, name + ".out")) if l.startswith("{")][-1])
    except (OSError, IndexError, ValueError):
        rec = None
    if rc(name) != 0 or rec is None:
        say("FAIL", f"(e) {name}", f"exit code {rc(name)}; see {out}/{name}.err")
    elif want:
        say("PASS" if rec.get("matches_greedy") is True and rec.get("backend") == "nccl" else "FAIL",
            "(e) float64 --check-greedy on NCCL: matches_greedy", f"{rec.get('matches_greedy')}, "
            f"tok/s {rec.get('tok_s'):.1f}, nccl {rec.get('versions', {}).get('nccl')}")
    else:
        say("PASS" if rec.get("dtype") == "bfloat16" else "FAIL", "(e) bf16 run completes",
            f"tok/s {rec.get('tok_s'):.1f}, accept len {rec.get('accept_len')}")

print(f"\n{len(failed)} check(s) failed" + (": " + "; ".join(failed) if failed else ""))
sys.exit(1 if failed else 0)
EOF
status=$?
# ---- begin: NCCL_NO_CACHE check (issue 15; bench/gpu_nocache_check.sh) ----
echo
echo "== nocache (world 1): two communicators, different NCCL_NTHREADS / NCCL_MAX_NCHANNELS"
bash bench/gpu_nocache_check.sh "$OUT/nocache" || status=1
# ---- end: NCCL_NO_CACHE check ----

echo
echo "gpu_smoke: outputs in $OUT; ${SECONDS} s; overall status $status"
exit $status
