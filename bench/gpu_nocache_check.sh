#!/usr/bin/env bash
# World-1 NCCL check of NCCL_NO_CACHE (isolation nocache), on a machine with one GPU.
#
#   bash bench/gpu_nocache_check.sh [OUTDIR]      (bench/gpu_smoke.sh calls it)
#
# First the gate (python -m bench.smoke.gate): NCCL_NO_CACHE exists from NCCL 2.29.7; on
# an older libnccl (ncclGetVersion of the one torch loads) it prints
# `SKIP (NCCL X has no NCCL_NO_CACHE)` and exits 0. The rule is the one `nccl-tune sweep`
# plans isolation nocache with (nccl_tune.nccl.settings.no_cache_supported).
#
# Then one process (torchrun, one rank) creates two NCCL communicators one after the
# other (the microbench's --plan: one fresh process group per cell) with different
# NCCL_NTHREADS and NCCL_MAX_NCHANNELS, set per cell in the process environment, under
# NCCL_NO_CACHE=NCCL_MAX_NCHANNELS,NCCL_NTHREADS set at launch. NCCL's captured log
# (--show-nccl-log) must show both values of both variables ("set by environment"
# lines); without NCCL_NO_CACHE NCCL would read them once and keep the first cell's
# values. Prints the log lines checked and each record's effective.reread (whether the
# microbench's own confirmation agreed), and exits 1 when a value is missing, with what
# the worker and NCCL said (bench.smoke.digest; the NCCL log is kept in OUTDIR).
#
# Time: everything within GPU_SMOKE_STEP_BOUND_S seconds (default 300; the smoke passes
# what its deadline leaves). GPU_SMOKE_STEP_RUNNER, when set, runs the launch as
# `$GPU_SMOKE_STEP_RUNNER nocache-launch CMD...` (see bench/gpu_smoke.sh; tests use it).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${1:-$(mktemp -d /tmp/nccl-tune-nocache.XXXXXX)}
mkdir -p "$OUT/nocache.nccl"
BUDGET=${GPU_SMOKE_STEP_BOUND_S:-300}
SECONDS=0
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_NTHREADS NCCL_MAX_NCHANNELS NCCL_NO_CACHE

gate_bound=$(( BUDGET - 5 < 60 ? BUDGET - 5 : 60 ))
if [ "$gate_bound" -lt 5 ]; then  # (timeout 0 would mean no bound at all)
  echo "nocache check: FAILED: cut: ${BUDGET} s is too little to start"
  exit 1
fi
timeout -k 5 "$gate_bound" "$PY" -m bench.smoke.gate 2>"$OUT/gate.err"
gate=$?
case $gate in
  0) ;;
  77) exit 0 ;;
  *) echo "nocache check: FAILED: the gate could not tell the NCCL version (exit code $gate)"
     "$PY" -m bench.smoke.digest "$OUT/gate.err"
     exit 1 ;;
esac

cat >"$OUT/nocache_plan.json" <<'PLAN'
{"run_id": "gpu-nocache-check", "no_cache": ["NCCL_MAX_NCHANNELS", "NCCL_NTHREADS"], "cells": [
  {"cell": "c-nthreads256-ch2", "env": {"NCCL_NTHREADS": "256", "NCCL_MAX_NCHANNELS": "2"},
   "comm_env": {"NCCL_NTHREADS": "256", "NCCL_MAX_NCHANNELS": "2"}, "round": 0,
   "extra": {"isolation": "nocache"}},
  {"cell": "c-nthreads512-ch4", "env": {"NCCL_NTHREADS": "512", "NCCL_MAX_NCHANNELS": "4"},
   "comm_env": {"NCCL_NTHREADS": "512", "NCCL_MAX_NCHANNELS": "4"}, "round": 0,
   "extra": {"isolation": "nocache"}}
]}
PLAN

# What is left, less 25 s: timeout's 10 s grace and the check below (at most 12 s); the
# launch's own nominal bound is 240 s.
bound=$(( BUDGET - SECONDS - 25 ))
[ "$bound" -gt 240 ] && bound=240
if [ "$bound" -lt 10 ]; then
  echo "nocache check: FAILED: cut: ${bound} s left of its ${BUDGET} s after the gate"
  exit 1
fi
runner=()
[ -n "${GPU_SMOKE_STEP_RUNNER:-}" ] && runner=("$GPU_SMOKE_STEP_RUNNER" nocache-launch)
echo "== nocache (bound ${bound} s): NCCL_NO_CACHE=NCCL_MAX_NCHANNELS,NCCL_NTHREADS torchrun --nproc-per-node 1 -m microbench.allreduce --plan ..."
NCCL_NO_CACHE=NCCL_MAX_NCHANNELS,NCCL_NTHREADS timeout -k 10 "$bound" ${runner[@]+"${runner[@]}"} \
  "$PY" -m torch.distributed.run --standalone \
  --nproc-per-node=1 -m microbench.allreduce --backend nccl --verify-effective --show-nccl-log \
  --keep-nccl-log "$OUT/nocache.nccl" \
  --timeout 60 --mode eager --sizes 14336 --warmup 5 --iters 50 --plan "$OUT/nocache_plan.json" \
  --out "$OUT/nocache.jsonl" 2>"$OUT/nocache.stderr"
rc=$?
echo "== nocache: microbench exit code $rc"
timeout -k 2 10 "$PY" - "$OUT" "$rc" <<'CHECK'
import json, os, re, sys
from bench.smoke.digest import digest, read_lines
out, rc = sys.argv[1], int(sys.argv[2])
try:
    log = open(os.path.join(out, "nocache.stderr"), errors="replace").read().splitlines()
except OSError:
    log = []
nccl = [l for l in log if l.startswith("# nccl-log ")]
wanted = [("NCCL_NTHREADS", "256"), ("NCCL_NTHREADS", "512"),
          ("NCCL_MAX_NCHANNELS", "2"), ("NCCL_MAX_NCHANNELS", "4")]
for line in nccl:
    if "set by environment" in line or "caching" in line:
        print(line)
missing = [f"{n}={v}" for n, v in wanted
           if not any(re.search(rf"{n} set by environment to {v}\.?$", l) for l in nccl)]
records = []
if os.path.exists(os.path.join(out, "nocache.jsonl")):
    records = [json.loads(l) for l in open(os.path.join(out, "nocache.jsonl")) if l.strip()]
for r in records:
    eff = r.get("effective") or {}
    print(f"record {r['cell']}: status {r['status']}, versions {r.get('versions')}, "
          f"confirmed {eff.get('confirmed')}, reread {eff.get('reread')}")
if rc != 0 or missing or len(records) != 2:
    print("nocache check: FAILED: " + (f"missing in NCCL's log: {', '.join(missing)}" if missing
                                        else f"exit {rc}, {len(records)} records"))
    said = digest(read_lines([os.path.join(out, "nocache.stderr"), os.path.join(out, "nocache.nccl")]))
    print("\n".join("  " + l for l in said) or "  (nothing in its output says why)")
    sys.exit(1)
print("nocache check: ok: both communicators read their own NCCL_NTHREADS and NCCL_MAX_NCHANNELS")
CHECK
