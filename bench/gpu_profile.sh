#!/usr/bin/env bash
# On the GPU machine: where the megakernel's warps stall (Nsight Compute's
# warp-state and source counters for one decode step of $MODEL), and the
# decode step time with 2, 3 and 4 weight pages in flight per worker.
#   MODEL=llama-3.2-1b OUT=outputs/profile bash bench/gpu_profile.sh
# ARGS go to bench/ncu_step.py (e.g. ARGS="--prefill 64").
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-outputs/profile}
MODEL=${MODEL:-llama-3.2-1b}
mkdir -p "$OUT"
cp .prebuilt/libmpkcore.so python/mpk/ 2>/dev/null
python3 -c "from mpk import build; build.load_launcher()" >"$OUT/launcher.log" 2>&1 || tail -5 "$OUT/launcher.log"
for f in ${INFLIGHT:-2 3 4}; do
  echo "== $f pages in flight"
  MPK_NVCC_EXTRA="-DMPK_INFLIGHT_PAGES=$f" timeout 300 python3 bench/decode.py --models "$MODEL" --variants mpk \
    --repeats 3 --no-check --json "$OUT/inflight$f.json" 2>&1 | grep -E "^$MODEL|Error" | tail -2
done
if [ -n "${NCU:-1}" ] && command -v ncu >/dev/null; then
  # Why warps are not issuing, per issued instruction (stall reasons).
  timeout 400 ncu -k regex:megakernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 bench/ncu_step.py --model "$MODEL" ${ARGS:-} >"$OUT/ncu.txt" 2>&1
  grep -E "stalled|Duration|DRAM Throughput" "$OUT/ncu.txt" | sort -k3 -n -r | head -30
fi
