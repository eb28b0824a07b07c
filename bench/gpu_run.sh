#!/usr/bin/env bash
# One device call: install with the prebuilt core, then the checks and
# benchmarks named by $JOBS (check:<model>[:<extra args>] | bench:<models>[:<extra args>]
# | trace:<model>: bench/trace.py, its JSON tarred to $OUT/trace_<model>.tgz).
# Logs go to $OUT; a failing job does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-outputs}
mkdir -p "$OUT"
MPK_PREBUILT_CORE=.prebuilt/libmpkcore.so python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
cp .prebuilt/libmpkcore.so python/mpk/
for job in ${JOBS:-check:tiny-llama}; do
  IFS=: read -r kind what extra <<<"$job"
  extra=${extra//,/ }
  echo "== $job"
  case $kind in
    check) timeout "${JOB_TIMEOUT:-200}" python3 -m mpk check --model "$what" --target cuda --dtype bfloat16 $extra >"$OUT/check_$what.log" 2>&1
           tail -2 "$OUT/check_$what.log" ;;
    bench) timeout "${JOB_TIMEOUT:-300}" python3 bench/decode.py --models ${what//+/ } $extra --json "$OUT/decode.json" >"$OUT/decode.log" 2>&1
           tail -8 "$OUT/decode.log" ;;
    trace) timeout "${JOB_TIMEOUT:-200}" python3 bench/trace.py --model "$what" $extra --json "trace_$what.json" >"$OUT/trace_$what.log" 2>&1
           tail -22 "$OUT/trace_$what.log"
           tar czf "$OUT/trace_$what.tgz" "trace_$what.json" 2>/dev/null ;;
  esac
done
