#!/usr/bin/env bash
# GPU smoke test of microbench.allreduce on a one-GPU machine (NCCL, world size 1).
#
#   bash bench/gpu_smoke.sh            from a fresh clone; finishes in a minute or two
#
# Runs the microbench with the NCCL backend in graph and eager modes with
# --verify-effective (NCCL's own log captured and parsed), then a two-cell --plan
# (baseline and NCCL_PROTO=Simple, one fresh communicator each), and prints the
# records (without the per-iteration samples) and the captured NCCL log lines.
# Works offline: where nccl-tune is not installed yet, it is installed without
# dependencies (torch, numpy, scipy, click and tabulate must already be there, as on
# the nvidia-h200 image); the checkout is used through PYTHONPATH in any case.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE
OUT=$(mktemp -d /tmp/nccl-tune-smoke.XXXXXX)
status=0

echo "== environment"
# Install only where nccl-tune is not installed yet (a fresh machine), so running this in a
# development environment never replaces its install; PYTHONPATH makes this checkout win.
if ! (cd /tmp && env -u PYTHONPATH "$PY" -c "import nccl_tune" >/dev/null 2>&1); then
  if ! "$PY" -m pip install --no-deps --no-build-isolation -q -e . >"$OUT/pip.log" 2>&1; then
    echo "gpu_smoke: 'pip install --no-deps -e .' failed (see $OUT/pip.log); using PYTHONPATH=$PWD"
  fi
fi
nvidia-smi -L || echo "gpu_smoke: nvidia-smi not available"
"$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "nccl", ".".join(map(str, torch.cuda.nccl.version())))
EOF

run() {  # run NAME ARGS...: one torchrun launch, bounded, its exit code reported
  local name=$1; shift
  echo
  echo "== $name: torchrun --nproc-per-node 1 -m microbench.allreduce $*"
  timeout 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 \
    -m microbench.allreduce --backend nccl --verify-effective --show-nccl-log --timeout 60 \
    --out "$OUT/$name.jsonl" "$@"
  local rc=$?
  echo "== $name: exit code $rc"
  [ "$rc" -eq 0 ] || status=1
}

run graph --mode graph --tokens 1,4 --warmup 20 --iters 200 --graph-ops 10
run eager --mode eager --tokens 1,4 --warmup 20 --iters 200

cat >"$OUT/plan.json" <<'EOF'
{"run_id": "gpu-smoke-plan", "cells": [
  {"cell": "baseline", "env": {}, "comm_env": {}, "round": 0, "iters": null, "warmup": null,
   "extra": {"isolation": "group"}},
  {"cell": "c-proto-simple", "env": {"NCCL_PROTO": "Simple"}, "comm_env": {"NCCL_PROTO": "Simple"},
   "round": 0, "iters": null, "warmup": null, "extra": {"isolation": "group"}}
]}
EOF
run plan --mode graph --sizes 14336 --warmup 10 --iters 100 --plan "$OUT/plan.json"

echo
echo "== records (samples_us left out)"
"$PY" - "$OUT" <<'EOF'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    print("--", os.path.basename(path))
    for line in open(path):
        record = json.loads(line)
        record.pop("samples_us", None)
        print(json.dumps(record, sort_keys=True))
EOF
# ---- begin: NCCL_NO_CACHE check (issue 15; bench/gpu_nocache_check.sh) ----
echo
echo "== nocache (world 1): two communicators, different NCCL_NTHREADS / NCCL_MAX_NCHANNELS"
bash bench/gpu_nocache_check.sh "$OUT/nocache" || status=1
# ---- end: NCCL_NO_CACHE check ----

echo
echo "gpu_smoke: outputs in $OUT; overall status $status"
exit $status
