#!/usr/bin/env bash
# Setup + main job: install mpk (building the Go core, or copying
# $MPK_PREBUILT_CORE) and check a tiny Llama against eager on the CPU reference
# target; on a machine with CUDA, also the cuda target and a benchmark against
# eager, CUDA graphs and inductor.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[hf,test]'
python3 -m mpk check --model tiny-llama --target reference
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  python3 -m mpk check --model tiny-llama --target cuda
  python3 bench/decode.py --models tiny-llama --steps 16
fi
