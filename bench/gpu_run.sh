#!/usr/bin/env bash
# One device call: install with the prebuilt core, then the checks and
# benchmarks named by $JOBS, each a word KIND:WHAT[:ARGS] (ARGS comma-separated):
#   check:<model>      python -m mpk check --target cuda --dtype bfloat16
#   bench:<m1+m2..>    bench/decode.py (JSON bench_<n>.json)
#   trace:<model>      bench/trace.py (JSON trace_<n>_<model>.json)
#   pytest:<path>      pytest -m gpu on that path (a ~ in ARGS is a space: -k,batch~or~steps),
#                      in PYTEST_SHARDS processes at once (bench/pytest_shards.sh; 4 by default)
#   host:<model>       bench/host_time.py: host time of one call (JSON host_<model>.json)
#   env:<NAME>:<VALUE> export NAME=VALUE for the jobs after it (e.g. MPK_NVCC_EXTRA)
#   core:<file>        use .prebuilt/<file> as the Go core for the jobs after it (an A/B of core builds)
#   cu:<file>          build bench/<file> (a standalone micro-benchmark) with nvcc for sm_90a and run it
#                      (its stdout line-buffered: a run the timeout kills keeps the rows it printed)
# Logs and JSON go to $OUT/results.tgz (the device returns few files), written
# again after every job, so a call cut off by the device's time limit still
# returns the jobs that finished; each job's last lines are printed (do not
# pipe the call into tail: a cut-off call then prints nothing). A failing job
# does not stop the others.
# Each job's timeout is JOB_TIMEOUT (else its kind's default).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-outputs}
W=$(mktemp -d)
mkdir -p "$OUT"
MPK_PREBUILT_CORE=.prebuilt/libmpkcore.so python3 -m pip install --no-build-isolation --no-deps -e . >"$W/install.log" 2>&1 || tail -5 "$W/install.log"
cp .prebuilt/libmpkcore.so python/mpk/
# The micro-benchmarks build first, all at once (one nvcc a core each; the
# device host has 16), each into cu_<n> by its job's number.
n=0
for job in ${JOBS:-check:tiny-llama}; do
  IFS=: read -r kind what extra <<<"$job"
  n=$((n + 1))
  [ "$kind" = cu ] || continue
  { echo "nvcc flags: ${extra//,/ }"
    nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc ${extra//,/ } "bench/$what" \
      -o "$W/cu_$n"; } >"$W/cu_${n}_${what%.cu}.log" 2>&1 &
done
wait
n=0
for job in ${JOBS:-check:tiny-llama}; do
  # DEADLINE (seconds since the start): later jobs are skipped, so the
  # results still come back within the device call's limit.
  if [ -n "${DEADLINE:-}" ] && [ "$SECONDS" -ge "$DEADLINE" ]; then echo "== $job skipped (DEADLINE)"; continue; fi
  IFS=: read -r kind what extra <<<"$job"
  extra=${extra//,/ }
  n=$((n + 1))
  echo "== $job"
  case $kind in
    env) # a relative path that exists is made absolute (nvcc runs elsewhere)
      [[ -n $extra && $extra != /* && -e $extra ]] && extra=$PWD/$extra
      export "$what=$extra"; echo "$what=$extra" ;;
    core) cp ".prebuilt/$what" python/mpk/libmpkcore.so; echo "core .prebuilt/$what" ;;
    check) timeout "${JOB_TIMEOUT:-300}" python3 -m mpk check --model "$what" --target cuda --dtype bfloat16 $extra >"$W/check_${n}_$what.log" 2>&1
           tail -1 "$W/check_${n}_$what.log" ;;
    bench) timeout "${JOB_TIMEOUT:-500}" python3 bench/decode.py --models ${what//+/ } $extra --json "$W/bench_$n.json" >"$W/bench_$n.log" 2>&1
           tail -12 "$W/bench_$n.log" ;;
    trace) timeout "${JOB_TIMEOUT:-200}" python3 bench/trace.py --model "$what" $extra --json "$W/trace_${n}_$what.json" >"$W/trace_${n}_$what.log" 2>&1
           tail -60 "$W/trace_${n}_$what.log" ;;
    host) timeout "${JOB_TIMEOUT:-500}" python3 bench/host_time.py --model "$what" $extra --json "$W/host_$what.json" >"$W/host_$what.log" 2>&1
          tail -9 "$W/host_$what.log" ;;
    cu) [ -x "$W/cu_$n" ] &&
          timeout "${JOB_TIMEOUT:-200}" stdbuf -oL "$W/cu_$n" >>"$W/cu_${n}_${what%.cu}.log" 2>&1
        tail -40 "$W/cu_${n}_${what%.cu}.log" ;;
    pytest) args=()
            for a in $extra; do args+=("${a//\~/ }"); done
            timeout "${JOB_TIMEOUT:-500}" bash bench/pytest_shards.sh "$W/pytest_$n.log" "$what" "${args[@]}" >"$W/pytest_$n.summary" 2>&1
            tail -12 "$W/pytest_$n.summary" ;;
  esac
  tar czf "$OUT/results.tgz" -C "$W" .
done
tar czf "$OUT/results.tgz" -C "$W" .
