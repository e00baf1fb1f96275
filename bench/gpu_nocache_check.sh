#!/usr/bin/env bash
# World-1 NCCL check of NCCL_NO_CACHE (isolation nocache), on a machine with one GPU.
#
#   bash bench/gpu_nocache_check.sh [OUTDIR]      (bench/gpu_smoke.sh calls it)
#
# One process (torchrun, one rank) creates two NCCL communicators one after the other
# (the microbench's --plan: one fresh process group per cell) with different
# NCCL_NTHREADS and NCCL_MAX_NCHANNELS, set per cell in the process environment, under
# NCCL_NO_CACHE=NCCL_MAX_NCHANNELS,NCCL_NTHREADS set at launch. NCCL's captured log
# (--show-nccl-log) must show both values of both variables ("set by environment"
# lines, NCCL 2.29.7+); without NCCL_NO_CACHE NCCL would read them once and keep the
# first cell's values. Prints the log lines checked and each record's effective.reread
# (whether the microbench's own confirmation agreed), and exits 1 when a value is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${1:-$(mktemp -d /tmp/nccl-tune-nocache.XXXXXX)}
mkdir -p "$OUT"
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_NTHREADS NCCL_MAX_NCHANNELS

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

echo "== nocache: NCCL_NO_CACHE=NCCL_MAX_NCHANNELS,NCCL_NTHREADS torchrun --nproc-per-node 1 -m microbench.allreduce --plan ..."
NCCL_NO_CACHE=NCCL_MAX_NCHANNELS,NCCL_NTHREADS timeout 240 "$PY" -m torch.distributed.run --standalone \
  --nproc-per-node=1 -m microbench.allreduce --backend nccl --verify-effective --show-nccl-log \
  --timeout 60 --mode eager --sizes 14336 --warmup 5 --iters 50 --plan "$OUT/nocache_plan.json" \
  --out "$OUT/nocache.jsonl" 2>"$OUT/nocache.stderr"
rc=$?
echo "== nocache: microbench exit code $rc"
"$PY" - "$OUT" "$rc" <<'CHECK'
import json, os, re, sys
out, rc = sys.argv[1], int(sys.argv[2])
log = open(os.path.join(out, "nocache.stderr"), errors="replace").read().splitlines()
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
    records = [json.loads(l) for l in open(os.path.join(out, "nocache.jsonl"))]
for r in records:
    eff = r.get("effective") or {}
    print(f"record {r['cell']}: status {r['status']}, versions {r.get('versions')}, "
          f"confirmed {eff.get('confirmed')}, reread {eff.get('reread')}")
if rc != 0 or missing or len(records) != 2:
    print("nocache check: FAILED: " + (f"missing in NCCL's log: {', '.join(missing)}" if missing
                                        else f"exit {rc}, {len(records)} records"))
    said = [l for l in log if l.startswith("microbench.allreduce:")]
    print("\n".join(said or log[-30:]))
    sys.exit(1)
print("nocache check: ok: both communicators read their own NCCL_NTHREADS and NCCL_MAX_NCHANNELS")
CHECK
