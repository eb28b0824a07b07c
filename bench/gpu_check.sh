#!/usr/bin/env bash
# On the GPU machine (no Go, no network): install mpk with a prebuilt core, then
# the parts of the CUDA target's acceptance named by $PARTS (default: all):
#   pytest   the GPU test suite (pytest -m gpu)
#   check    `python -m mpk check --target cuda --steps $STEPS --cache-tokens $CACHE_TOKENS`
#            for each model in $MODELS
#   prefill  the same with --prefill 16 --steps 2 for each model in $PREFILL_MODELS
#   warm     warm start of $WARM_MODEL: bench/warm_start.py --save (mpk.precompile; cold, or
#            warm caches after `check`), then --load in a new process (timed and judged)
#   warm_tc  bench/warm_start.py twice through torch.compile (the second run re-traces Dynamo)
#   bench    bench/decode.py for $BENCH_MODELS
# Everything is tee'd to $OUT/ (the logs end up in $OUT/logs.tar.gz, beside
# summary.txt and bench.json); a failing part does not stop the others.
# Exit status: 0 when every part passed.
#
#   PARTS="check" MODELS="tiny-llama" OUT=outputs/gpu_check bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-outputs/gpu_check}
PARTS=${PARTS:-"pytest check prefill warm bench"}
MODELS=${MODELS:-"tiny-llama tiny-qwen3 llama-3.2-1b qwen3-0.6b qwen3-1.7b qwen3-8b"}
PREFILL_MODELS=${PREFILL_MODELS:-"tiny-llama llama-3.2-1b"}
WARM_MODEL=${WARM_MODEL:-qwen3-8b}
BENCH_MODELS=${BENCH_MODELS:-"qwen3-0.6b llama-3.2-1b"}
STEPS=${STEPS:-32}
CACHE_TOKENS=${CACHE_TOKENS:-512}
PY=${PYTHON:-python3}
TIMEOUT=${CHECK_TIMEOUT:-400}
mkdir -p "$OUT"
: >>"$OUT/summary.txt"
failed=0
note() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }
run() {  # run NAME CMD...: tee to $OUT/NAME.log, record the outcome, never stop the script
  local name=$1; shift
  echo "+ $*" | tee "$OUT/$name.log"
  local t0=$SECONDS
  timeout "$TIMEOUT" "$@" 2>&1 | tee -a "$OUT/$name.log" | tail -4
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then note "$name ok ($((SECONDS - t0)) s)"; else note "$name FAILED (exit $rc, $((SECONDS - t0)) s)"; failed=1; fi
  return 0
}
has() { [[ " $PARTS " == *" $1 "* ]]; }

# install: editable, with the prebuilt core; else the launcher into mpk's cache.
CORE=${MPK_PREBUILT_CORE:-.prebuilt/libmpkcore.so}
[ -f "$CORE" ] || CORE=python/mpk/libmpkcore.so
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  which nvcc && nvcc --version | tail -2 || ls /usr/local/cuda/bin/nvcc
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"
if [ ! -f "$CORE" ]; then
  note "no prebuilt core at .prebuilt/libmpkcore.so or python/mpk/libmpkcore.so (set MPK_PREBUILT_CORE)"
  exit 1
fi
if MPK_PREBUILT_CORE=$CORE "$PY" -m pip install --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1; then
  echo "installed (pip -e, core $CORE)"
else
  tail -20 "$OUT/install.log"
  note "pip install failed; building the launcher into mpk's cache and using PYTHONPATH=python"
  [ -f python/mpk/libmpkcore.so ] || cp "$CORE" python/mpk/libmpkcore.so
  PYTHONPATH=python "$PY" -c 'from mpk import build; build.load_launcher()' >>"$OUT/install.log" 2>&1 \
    || note "launcher build failed (mpk.build will try again on first use)"
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}

if has pytest; then run pytest_gpu "$PY" -m pytest -q -m gpu tests; fi
if has check; then
  for m in $MODELS; do
    run "check_$m" "$PY" -m mpk check --model "$m" --target cuda --dtype bfloat16 --steps "$STEPS" --cache-tokens "$CACHE_TOKENS"
  done
fi
if has prefill; then
  for m in $PREFILL_MODELS; do
    run "prefill_$m" "$PY" -m mpk check --model "$m" --target cuda --dtype bfloat16 --prefill 16 --steps 2 --cache-tokens "$CACHE_TOKENS"
  done
fi
if has warm; then
  step_file=$(mktemp -d)/$WARM_MODEL.mpk
  run "warm_save_$WARM_MODEL" "$PY" bench/warm_start.py --model "$WARM_MODEL" --save "$step_file"
  run "warm_load_$WARM_MODEL" "$PY" bench/warm_start.py --model "$WARM_MODEL" --load "$step_file"
  grep -h "WARM START\|bf16 rule" "$OUT/warm_load_$WARM_MODEL.log" | tee -a "$OUT/summary.txt"
fi
if has warm_tc; then
  run "warm_tc_cold_$WARM_MODEL" "$PY" bench/warm_start.py --model "$WARM_MODEL"
  run "warm_tc_$WARM_MODEL" "$PY" bench/warm_start.py --model "$WARM_MODEL"
fi
if has bench; then
  run bench "$PY" bench/decode.py --models $BENCH_MODELS --cache-tokens "$CACHE_TOKENS" --json "$OUT/decode.json"
fi

echo "---- summary"
cat "$OUT/summary.txt"
# The device tool returns at most 8 files: the logs travel as one archive.
(cd "$OUT" && ls ./*.log >/dev/null 2>&1 && tar -czf logs.tar.gz --remove-files ./*.log)
exit "$failed"
