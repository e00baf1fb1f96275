#!/usr/bin/env bash
# A GPU_SMOKE_STEP_RUNNER for tests of bench/gpu_smoke.sh on machines without a GPU.
#
#   smoke_step_runner.sh STEP CMD ARGS...
#
# SMOKE_FAKE holds "STEP=ACTION" words (a STEP of * matches any step); the first match
# decides, and a step that none matches is run:
#   run    run CMD ARGS... as the smoke would
#   pass   print "STEP: passed (stand-in)" and exit 0
#   fail   print "STEP: failed (stand-in)" on stderr and exit 1
#   sleep  sleep far past any bound (the smoke's timeout must stop it)
# Every call is appended to $SMOKE_FAKE_LOG (when set) as "STEP CMD ARGS...".
step=$1
shift
[ -n "${SMOKE_FAKE_LOG:-}" ] && echo "$step $*" >>"$SMOKE_FAKE_LOG"
action=run
for word in ${SMOKE_FAKE:-}; do
  key=${word%%=*}
  if [ "$key" = "$step" ] || [ "$key" = "*" ]; then
    action=${word#*=}
    break
  fi
done
case $action in
  run) exec "$@" ;;
  pass) echo "$step: passed (stand-in)"; exit 0 ;;
  fail) echo "$step: failed (stand-in)" >&2; exit 1 ;;
  sleep) exec sleep 3600 ;;
  *) echo "smoke_step_runner: unknown action '$action' for $step" >&2; exit 2 ;;
esac
