#!/usr/bin/env bash
# One-GPU smoke test of the CUDA/NCCL paths (NCCL backend, world size 1), within a deadline.
#
#   bash bench/gpu_smoke.sh            from a checkout on a machine with one GPU
#
# Runs from the checkout through PYTHONPATH and installs nothing: torch (a CUDA build, with
# the libnccl its wheel brings), numpy, scipy, click and tabulate must be there. No network.
#
# What world size 1 can and cannot show: NCCL does not run a collective on one rank
# (ncclEnqueueCheck takes ncclLaunchOneRank, src/enqueue.cc, src/device/onerank.cu): an
# in-place allreduce enqueues nothing, an out-of-place all_gather is one copy, no
# algorithm is chosen and no per-collective TUNING line is logged. So this proves little
# about allreduce: it uses out-of-place all_gather, expects `effective.confirmed` None
# (nothing to confirm, never False), reports comparisons between modes as INFO (no
# verdict), and checks what one GPU can:
#   preflight: init_process_group("nccl"), one all_gather, destroy, within 5 s, with
#       NCCL_DEBUG=WARN (bench/smoke/preflight.py); without a CUDA device every step is
#       SKIPped and the run passes; if NCCL fails here, nothing else runs;
#   (a) graph mode end to end on a fresh new_group under the gloo default group
#       (capture, replays, the exact check; the group destroyed and rebuilt per cell);
#   (b) a fresh communicator per cell and log attribution: log files of one process,
#       "Init COMPLETE" in each cell, "NCCL_PROTO set by environment to Simple" only in
#       the cell that set it;
#   (c) the libnccl mapped and its ncclGetVersion against torch.cuda.nccl.version(),
#       the log's version line, whether ncclResetDebugInit was found;
#   (d) timing sanity: samples positive and finite; the measured head start of one-op
#       eager samples covered the host's enqueue; INFO: graph per-op against eager, and
#       --ops-per-sample 10 (host-bound) against one op and the host enqueue time;
#   nocache: bench/gpu_nocache_check.sh (NCCL 2.29.7+; SKIP on an older NCCL);
#   (e) the built-in loop on NCCL: float64 --check-greedy gives matches_greedy true, a
#       bf16 run completes (at world 1 it runs no collective: CUDA only).
# Prints PASS / FAIL / CUT / SKIP / INFO lines (bench/smoke/checks.py), then, for every
# step that failed or was cut, what it said itself: each worker's own error line, the
# last line of a Python traceback, NCCL's WARN lines (bench/smoke/digest.py), not
# torchrun's ChildFailedError block. Exits 1 when anything failed or was cut, else 0.
#
# Time: the whole run ends within GPU_SMOKE_DEADLINE_S seconds (default 540, under the
# 600 s a command may run on the GPU machines). Each step runs under `timeout` with the
# smaller of its own bound and what the deadline leaves after FINAL_S (the checks and the
# archive) and KILL_S (timeout's grace before SIGKILL); a step with under MIN_STEP_S left
# is not started (CUT). So the summary is printed even when a step is cut.
#
# Outputs: a folder /tmp/nccl-tune-smoke.XXXXXX (every step's stdout, stderr, exit code,
# records and kept NCCL log, and smoke.log, this script's own output). When $OUT is set
# (the GPU machines bring back only what is under it), the folder is also written there
# as one archive, gpu-smoke.tar.gz.
#
# For tests: GPU_SMOKE_STEP_RUNNER names a program run as `RUNNER STEP CMD ARGS...` in
# place of `CMD ARGS...` for every step (preflight, graph, eager1, eager10, nocache and,
# inside it, nocache-launch, loop64, loopbf16), still under the step's bound;
# tests/smoke_step_runner.sh is one (each step can run, pass, fail or sleep).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_PROTO NCCL_ALGO
DEADLINE=${GPU_SMOKE_DEADLINE_S:-540}
KILL_S=10       # timeout's grace between SIGTERM and SIGKILL: torchrun passes SIGTERM on
                # to its workers (each in a session of its own, which SIGKILL of torchrun
                # would not reach) and waits for them
FINAL_S=30      # kept for the checks (at most 15 s) and the archive (at most 10 s)
MIN_STEP_S=10   # a step with less left is not started
W=$(mktemp -d /tmp/nccl-tune-smoke.XXXXXX)
SECONDS=0
STOP=""         # why the remaining steps are skipped (no GPU, the preflight failed)

say() { printf '%s\n' "$*" | tee -a "$W/smoke.log"; }

step() {  # step NAME NOMINAL_S CMD...: CMD under the smaller of NOMINAL_S and what is left
  local name=$1 nominal=$2 bound rc
  shift 2
  echo "$name" >>"$W/steps.txt"
  if [ -n "$STOP" ]; then
    echo "$STOP" >"$W/$name.skip"
    say "== $name: SKIP ($STOP)"
    return 77
  fi
  bound=$(( DEADLINE - FINAL_S - KILL_S - SECONDS ))
  [ "$bound" -gt "$nominal" ] && bound=$nominal
  if [ "$bound" -lt "$MIN_STEP_S" ]; then
    echo "not started: ${bound} s left before the ${DEADLINE} s deadline (${SECONDS} s elapsed)" >"$W/$name.cut"
    say "== $name: CUT ($(cat "$W/$name.cut"))"
    return 124
  fi
  echo "$bound" >"$W/$name.bound"
  local runner=()
  [ -n "${GPU_SMOKE_STEP_RUNNER:-}" ] && runner=("$GPU_SMOKE_STEP_RUNNER" "$name")
  say ""
  say "== $name (bound ${bound} s, ${SECONDS} s elapsed): $*"
  GPU_SMOKE_STEP_BOUND_S=$bound timeout -k "$KILL_S" "$bound" ${runner[@]+"${runner[@]}"} "$@" \
    >"$W/$name.out" 2>"$W/$name.err"
  rc=$?
  echo "$rc" >"$W/$name.rc"
  grep -v "^# nccl-log" "$W/$name.out" | tail -n 4 | tee -a "$W/smoke.log"
  say "== $name: exit code $rc after ${SECONDS} s"
  return $rc
}

bench() {  # bench NAME ARGS...: one torchrun launch of the microbench
  local name=$1
  shift
  mkdir -p "$W/$name.nccl"
  step "$name" 100 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 \
    -m microbench.allreduce --backend nccl --op all_gather --sizes 14336 --timeout 60 \
    --keep-nccl-log "$W/$name.nccl" --out "$W/$name.jsonl" "$@"
}

loop() {  # loop NAME ARGS...: one torchrun launch of the built-in loop (NCCL's WARN lines on stderr)
  local name=$1
  shift
  step "$name" 120 env NCCL_DEBUG=WARN "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node=1 -m integration.spec_loop --backend nccl --json "$@"
}

say "gpu_smoke: deadline ${DEADLINE} s; outputs in $W"
step preflight 90 "$PY" -m bench.smoke.preflight
case $? in
  0) ;;
  77) STOP=$(sed -n 's/^SKIP (\(.*\))$/\1/p' "$W/preflight.out" | tail -n 1)
      STOP=${STOP:-no CUDA device} ;;
  *) STOP="the preflight failed: NCCL does not work here (see its lines below)" ;;
esac

cat >"$W/plan.json" <<'EOF'
{"run_id": "gpu-smoke-plan", "cells": [
  {"cell": "baseline", "env": {}, "comm_env": {}, "extra": {"isolation": "group"}},
  {"cell": "c-proto-simple", "env": {"NCCL_PROTO": "Simple"}, "comm_env": {"NCCL_PROTO": "Simple"},
   "extra": {"isolation": "group"}}
]}
EOF
bench graph --mode graph --graph-ops 10 --warmup 10 --iters 100 --verify-effective --show-nccl-log \
  --plan "$W/plan.json"
bench eager1 --mode eager --warmup 20 --iters 200 --verify-effective
bench eager10 --mode eager --warmup 20 --iters 200 --ops-per-sample 10 --verify-effective
step nocache 240 bash bench/gpu_nocache_check.sh "$W/nocache"
loop loop64 --dtype float64 --check-greedy --new-tokens 32
loop loopbf16 --dtype bfloat16 --new-tokens 32

say ""
timeout -k 3 12 "$PY" -m bench.smoke.checks "$W" 2>&1 | tee -a "$W/smoke.log"
status=${PIPESTATUS[0]}
[ "$status" = 0 ] || [ "$status" = 1 ] || { say "gpu_smoke: the checks themselves failed (exit code $status)"; status=1; }

archive=""
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  say "gpu_smoke: ${SECONDS} s; overall status $status; archiving $W into $OUT/gpu-smoke.tar.gz"
  if timeout -k 2 8 tar -czf "$OUT/gpu-smoke.tar.gz" -C "$(dirname "$W")" "$(basename "$W")"; then
    archive="; archive $OUT/gpu-smoke.tar.gz"
  else
    archive="; the archive could not be written in $OUT"
  fi
fi
say "gpu_smoke: outputs in $W$archive; ${SECONDS} s of the ${DEADLINE} s deadline; overall status $status"
exit "$status"
