#!/usr/bin/env bash
# On the GPU machine (no Go, no network): install mpk with a prebuilt core, run
# the GPU tests, then `python -m mpk check --target cuda --steps $STEPS` for each
# model in $MODELS. Everything is tee'd to $OUT/; a failing model does not stop
# the others. Exit status: 0 when every step passed.
#
#   MODELS="tiny-llama tiny-qwen3" STEPS=32 OUT=outputs/gpu_check bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-outputs/gpu_check}
MODELS=${MODELS:-"tiny-llama tiny-qwen3"}
STEPS=${STEPS:-32}
PY=${PYTHON:-python3}
TIMEOUT=${CHECK_TIMEOUT:-900}
mkdir -p "$OUT"
: >"$OUT/summary.txt"
failed=0
note() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }
run() {  # run NAME CMD...: tee to $OUT/NAME.log, record the outcome, never stop the script
  local name=$1; shift
  echo "+ $*" | tee "$OUT/$name.log"
  timeout "$TIMEOUT" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then note "$name ok"; else note "$name FAILED (exit $rc)"; failed=1; fi
  return 0
}

# (a) install: editable, with the prebuilt core; else the launcher in place.
CORE=${MPK_PREBUILT_CORE:-.prebuilt/libmpkcore.so}
[ -f "$CORE" ] || CORE=python/mpk/libmpkcore.so
{
  nvidia-smi || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  which nvcc && nvcc --version | tail -2 || ls /usr/local/cuda/bin/nvcc
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"
if [ ! -f "$CORE" ]; then
  note "no prebuilt core at .prebuilt/libmpkcore.so or python/mpk/libmpkcore.so (set MPK_PREBUILT_CORE)"
  exit 1
fi
if MPK_PREBUILT_CORE=$CORE "$PY" -m pip install --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1; then
  note "installed (pip -e, core $CORE)"
else
  tail -20 "$OUT/install.log"
  note "pip install failed; building the launcher in place and using PYTHONPATH=python"
  [ -f python/mpk/libmpkcore.so ] || cp "$CORE" python/mpk/libmpkcore.so
  ext=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  # shellcheck disable=SC2046
  c++ -O2 -std=c++17 -shared -fPIC $("$PY" -m pybind11 --includes) -Icsrc \
    csrc/launcher/launcher.cpp -o "python/mpk/_launcher$ext" -ldl >>"$OUT/install.log" 2>&1 \
    || note "launcher build failed (mpk.build will try again on first use)"
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}

# (b) the GPU test suite
run pytest_gpu "$PY" -m pytest -q -m gpu tests

# (c) per model: the generated sources (kept for reading), then the check
for m in $MODELS; do
  run "build_$m" "$PY" -m mpk build --model "$m" --out "$OUT/build_$m"
  run "check_$m" "$PY" -m mpk check --model "$m" --target cuda --steps "$STEPS"
done

echo "---- summary"
cat "$OUT/summary.txt"
exit "$failed"
