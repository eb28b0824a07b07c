"""Where a megakernel's warps stall, by task body or by source line, from an
Nsight Compute per-instruction export (bench/gpu_ncu_source.sh).

ncu's SASS export (source_sass.csv.gz) names no function or source line per
instruction; a local build of the profiled module.cu with the device's
compiler gives both, instruction for instruction (an nvcc of another minor
version matched 59% in the thirty-first session: pin nvcc, nvvm and crt to
the device's, e.g. `pip install 'nvidia-cuda-nvcc==13.0.*' 'nvidia-nvvm==13.0.*'
'nvidia-cuda-crt==13.0.*'`, and go back afterwards):

    nvcc -O3 -std=c++17 --expt-relaxed-constexpr -lineinfo -cubin \\
      -gencode=arch=compute_90a,code=sm_90a -Icsrc module.cu -o m.cubin
    nvdisasm -c -gi m.cubin > m.sass
    python bench/ncu_attribute.py source_sass.csv.gz m.sass --by function
    python bench/ncu_attribute.py source_sass.csv.gz m.sass --by line --top 40

Task variants are `__noinline__` functions (`mpk_gen::variantN`), so --by
function splits the samples by task body; --by line by (file, line, the line
it is inlined at), --function NAME keeps one function's instructions. Each
row: the share of all warp samples, its top stall reasons as shares of all
samples, and the local-memory loads and stores it executed (warp
instructions: spills and indexed arrays; each a round trip to L2 where L1
misses, as a 64-token chunk's V write showed in the thirty-sixth session; a
spin loop's reloads count once a poll)."""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
import sys

_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
_LINE = re.compile(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')


def short_name(label: str) -> str:
    """The innermost name of a label's last mangled symbol: variant14 for
    $..._ZN7mpk_gen9variant14ERK...: (a task body), store_elem, megakernel."""
    sym = label.rstrip(":").split("$")[-1].split(".text.")[-1]
    if not sym.startswith("_ZN"):
        return sym[:40]
    names, i = [], 3
    while i < len(sym) and sym[i].isdigit():
        j = i
        while sym[j].isdigit():
            j += 1
        n = int(sym[i:j])
        names.append(sym[j:j + n])
        i = j + n
    return names[-1] if names else sym[:40]


def read_sass(path: str) -> list[tuple[str, str, str]]:
    """(instruction, function, source line) per instruction of nvdisasm -c -gi's output."""
    out, fn, line = [], "?", "?"
    for l in open(path):
        if (l.startswith("$") or l.startswith(".text.")) and l.rstrip().endswith(":"):
            fn = short_name(l.strip())
            continue
        m = _LINE.match(l)
        if m:
            line = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
            if m.group(3):
                line += f" @ {m.group(3).split('/')[-1]}:{m.group(4)}"
            continue
        m = _INSTR.match(l)
        if m:
            out.append((m.group(2).strip(), fn, line))
    return out


def opcode(text: str) -> str:
    t = text.split()
    if t and t[0].startswith("@"):
        t = t[1:]
    return t[0] if t else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", help="ncu's source_sass.csv(.gz) (bench/gpu_ncu_source.sh)")
    p.add_argument("sass", help="nvdisasm -c -gi of the same module built with the device's nvcc")
    p.add_argument("--by", choices=("function", "line"), default="function")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--function", help="only this function's instructions (a short name: variant8, attention_decode)")
    a = p.parse_args(argv)
    opener = gzip.open if a.csv.endswith(".gz") else open
    rows = list(csv.reader(opener(a.csv, "rt")))
    hdr, data = rows[1], rows[2:]
    local = read_sass(a.sass)
    mismatched = sum(opcode(x[0]) != opcode(r[1]) for x, r in zip(local, data))
    if len(local) != len(data) or mismatched > len(data) // 100:
        print(f"the local build does not match the profile: {len(local)} instructions against {len(data)}, "
              f"{mismatched} opcodes differ (build module.cu with the device's nvcc, nvvm and crt)", file=sys.stderr)
        return 1
    col = {h: i for i, h in enumerate(hdr)}
    samples, executed = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[samples] or 0) for r in data) or 1
    by, why, lmem = collections.Counter(), collections.defaultdict(collections.Counter), collections.Counter()
    for (text, fn, line), r in zip(local, data):
        if a.function and fn != a.function:
            continue
        key = fn if a.by == "function" else line
        by[key] += int(r[samples] or 0)
        for h in reasons:
            why[key][h[6:]] += int(r[col[h]] or 0)
        if opcode(text).split(".")[0] in ("LDL", "STL"):
            lmem[key] += int(r[executed] or 0)
    for key, n in by.most_common(a.top):
        top = ", ".join(f"{k}={v / total:.1%}" for k, v in why[key].most_common(4) if v)
        print(f"{n / total:6.1%}  {key:40s}  {top}" + (f"  local={lmem[key]:,}" if lmem[key] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
