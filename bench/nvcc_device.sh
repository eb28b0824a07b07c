#!/usr/bin/env bash
# Compile generated modules with the device machine's nvcc (13.0) before a
# device call: the pip nvcc here and in CI is the newest (13.5), and 13.0's
# front end can fail where 13.5's does not (its cudafe++ segfaulted on a
# generic lambda handed a lambda, fifty-second session: a lost device call).
# The first run installs nvcc 13.0 with its own headers into $NVCC13_VENV;
# each module.cu is compiled to an object with the module's flags (no link:
# these wheels have no static runtime to link against).
#   bench/nvcc_device.sh /tmp/out/module.cu [more.cu ...] [-- -DNAME=V ...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${NVCC13_VENV:-/tmp/nvcc13}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-nvvm==13.0.*"
fi
nvcc=$(find "$venv" -path '*cu13/bin/nvcc' | head -1)
"$nvcc" --version | tail -1
files=() flags=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; flags=("$@"); break; fi
  files+=("$1"); shift
done
rc=0
for f in "${files[@]}"; do
  if "$nvcc" -O3 -std=c++17 -Xcompiler -fPIC -lineinfo --expt-relaxed-constexpr \
    -gencode=arch=compute_90a,code=sm_90a -I"$PWD/csrc" "${flags[@]}" -c "$f" -o /dev/null; then
    echo "nvcc 13.0 ok: $f"
  else
    echo "nvcc 13.0 FAILED: $f"; rc=1
  fi
done
exit $rc
