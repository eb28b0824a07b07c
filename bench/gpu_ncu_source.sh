#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's per-instruction warp-stall sampling
# (SourceCounters) for one decode step of $MODEL, exported per CUDA source
# line and per SASS instruction, so the stalls of each task body can be read
# (the module is built with -lineinfo).
#   MODEL=llama-3.2-1b OUT=outputs/ncu bash bench/gpu_ncu_source.sh
# ARGS go to bench/ncu_step.py: ARGS="--prefill 64" profiles a 64-token chunk
# (its GEMM streams and shared-K/V attention). bench/ncu_attribute.py then
# splits the samples by task body or source line (with a local build of the
# module.cu this copies back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-outputs/ncu}
MODEL=${MODEL:-llama-3.2-1b}
mkdir -p "$OUT"
MPK_PREBUILT_CORE=.prebuilt/libmpkcore.so python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
cp .prebuilt/libmpkcore.so python/mpk/
ncu --version | tail -1
R=$(mktemp -d)/prof
timeout 420 ncu -k regex:megakernel --launch-skip 3 --launch-count 1 --section SourceCounters \
  --section WarpStateStats --section SpeedOfLight --import-source yes -o "$R" \
  python3 bench/ncu_step.py --model "$MODEL" ${ARGS:-} >"$OUT/ncu_run.log" 2>&1
tail -3 "$OUT/ncu_run.log"
# the profiled module's source, to align the SASS with a local nvcc 13.0 build
cp "$(ls -t $(find "${MPK_CACHE_DIR:-$HOME/.cache/mpk}" -name module.cu) | head -1)" "$OUT/module.cu" 2>/dev/null
ncu -i "$R.ncu-rep" --page details >"$OUT/details.txt" 2>&1
for src in cuda sass; do
  ncu -i "$R.ncu-rep" --page source --csv --print-source "$src" >"$OUT/source_$src.csv" 2>"$OUT/source_$src.err"
  wc -c "$OUT/source_$src.csv"; head -c 300 "$OUT/source_$src.err"
done
gzip -f "$OUT"/source_*.csv
