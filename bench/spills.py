"""Register spills of a generated module, without a GPU: compiles a module.cu
(from `python -m mpk build --no-nvcc --out DIR`) to a cubin with ptxas's
report and lists every function that spills, and with --sites the source
lines of its local-memory reloads (LDL), which are a round trip each where L1
misses (bench/NOTES.md, twenty-second session: the megakernel's task loop and
the RMSNorm staging lost 1-3% a model to them).

    python -m mpk build --model qwen3-8b --dtype bfloat16 --out /tmp/q8 --no-nvcc --cache-tokens 512
    python bench/spills.py /tmp/q8/module.cu --sites

nvcc: $MPK_NVCC or what mpk finds (use the H100 machine's version, 13.0, for
the same SASS); for --sites $MPK_NVDISASM, else nvdisasm beside nvcc or on PATH
(pip nvidia-cuda-nvdisasm)."""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mpk import build


def ptxas_spills(report: str) -> list[tuple[str, int, int]]:
    """(function, spill store bytes, spill load bytes) from ptxas -v output."""
    out, name = [], None
    for line in report.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            out.append((name, int(m.group(1)), int(m.group(2))))
            name = None
    return out


def reload_sites(sass: str) -> dict[str, collections.Counter]:
    """Per function, how many LDL instructions each source line has."""
    sites: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    fn, loc = None, None
    for line in sass.splitlines():
        m = re.match(r"\s*\.type\s+(\S+),@function", line)
        if m:
            fn = m.group(1).split("$")[-1]
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            loc = f"{Path(m.group(1)).name}:{m.group(2)}"
            continue
        if fn and re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+LDL", line):
            sites[fn][loc or "?"] += 1
    return sites


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("module", help="a generated module.cu")
    p.add_argument("--arch", default=build.DEFAULT_ARCH)
    p.add_argument("--sites", action="store_true", help="also list each spilling function's LDL source lines")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="a macro for the build (an A/B knob), repeatable")
    a = p.parse_args()
    nvcc = build.find_nvcc()
    if nvcc is None:
        sys.exit("no nvcc: pip install nvidia-cuda-nvcc (13.0 for the H100 machine's SASS) or set MPK_NVCC")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "module.cubin"
        cmd = [nvcc, "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", "-cubin", "-Xptxas", "-v",
               *(f"-D{d}" for d in a.defines), f"-gencode=arch=compute_{a.arch},code=sm_{a.arch}",
               f"-I{build.csrc_dir()}", a.module, "-o", str(cubin)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr[-2000:])
        spills = [s for s in ptxas_spills(r.stderr) if s[1] + s[2] > 0]
        sites = {}
        if a.sites:
            beside = Path(nvcc).with_name("nvdisasm")
            nvdisasm = os.environ.get("MPK_NVDISASM") or (str(beside) if beside.exists() else "nvdisasm")
            d = subprocess.run([nvdisasm, "-c", "-g", str(cubin)], capture_output=True, text=True, check=True)
            sites = reload_sites(d.stdout)
    print(f"{'stores':>7} {'loads':>6}  function")
    for name, st, ld in sorted(spills, key=lambda s: -(s[1] + s[2])):
        print(f"{st:7d} {ld:6d}  {name[:150]}")
        for loc, n in sorted(sites.get(name, {}).items(), key=lambda kv: -kv[1])[:8]:
            print(f"{'':16}{n:3d} LDL at {loc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
