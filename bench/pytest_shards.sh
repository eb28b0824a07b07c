#!/usr/bin/env bash
# Runs the GPU tests pytest selects with "$@" (a path and its -k/-m options)
# in PYTEST_SHARDS processes at once (4 by default; 1: one process, as
# before). A GPU test's time is mostly its module's nvcc build, one core
# each, and the device machine has 16 (a session's 15 tests took 330 s
# serially); the kernels share the GPU by time slices, and the build cache
# locks an entry two processes want. Shard i runs every PYTEST_SHARDS-th
# selected test and logs to LOG.i; the failures and each shard's summary go
# to stdout. Exit status 0 when every shard passed.
#   bench/pytest_shards.sh LOG tests/test_cuda.py -k "gemm or pair"
set -uo pipefail
log=$1
shift
shards=${PYTEST_SHARDS:-4}
pytest=(python3 -m pytest -q -m gpu -p no:cacheprovider)
mapfile -t ids < <("${pytest[@]}" --collect-only "$@" 2>"$log.collect" | grep '::')
if [ "${#ids[@]}" -eq 0 ]; then
  echo "no GPU test selected by: $*"
  tail -5 "$log.collect"
  exit 1
fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
for ((s = 0; s < shards && s < ${#ids[@]}; s++)); do
  mine=()
  for ((i = s; i < ${#ids[@]}; i += shards)); do mine+=("${ids[i]}"); done
  "${pytest[@]}" "${mine[@]}" >"$log.$s" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for ((s = 0; s < ${#pids[@]}; s++)); do
  grep -E '^(FAILED|ERROR) ' "$log.$s"
  echo "shard $s: $(tail -1 "$log.$s")"
done
exit $rc
