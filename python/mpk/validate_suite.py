"""`python -m mpk validate-suite`: the validator's adversarial mutant suite.

Runs in the Go core (mpk_validate_suite): n task graphs with one injected fault
each (cycles, dropped waits, partial joins on shared counters, reads before
writes, out-of-range ids, queue-order deadlocks, random graphs), each labelled
safe or unsafe by an independent oracle that executes it under adversarial
interleavings, then judged by the static validator; plus real lowerings, which
must be accepted. Prints the table; the last line reads
`validate-suite: unsafe=<n> rejected=<n> false_accepts=<n> real_accepted=<a>/<b>`.
Exit status 0 when there are no false accepts and every real lowering is accepted.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import sys
from pathlib import Path
from typing import Sequence

from . import core

DEFAULT_REAL = Path(__file__).resolve().parents[2] / "gocore" / "testdata"


def _real_requests(paths: Sequence[str]) -> list[dict]:
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files += sorted(p.glob("*.json")) + sorted(p.glob("*.json.zst")) + sorted(p.glob("*.req.zst"))
        else:
            files.append(p)
    return [{"name": f.name.removesuffix(".zst").removesuffix(".json").removesuffix(".req"),
             "data": base64.b64encode(f.read_bytes()).decode()} for f in files]


def run_suite(n: int, seed: int = 1, real: Sequence[str] = ()) -> dict:
    """Runs the suite in the Go core and returns its result (see SuiteResult in
    gocore/cmd/libmpkcore/suite.go): table, unsafe, rejected, false_accepts,
    false_rejects, real_accepted, real_total."""
    lib = core._load()
    fn = lib.mpk_validate_suite
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    fn.restype = None
    req = json.dumps({"real": _real_requests(real)}).encode()
    out, out_len = ctypes.c_void_p(), ctypes.c_size_t()
    fn(n, seed, req, len(req), ctypes.byref(out), ctypes.byref(out_len))
    res = core._take(lib, out, out_len)
    if not res.get("ok"):
        err = res.get("error") or {}
        raise RuntimeError(f"validate-suite failed: {err.get('message')}\n{err.get('hint', '')}")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpk validate-suite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="number of mutants (default 5000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--real", nargs="*", default=None,
                    help="real compile requests (files or directories); default: gocore/testdata if present")
    args = ap.parse_args(argv)
    real = args.real if args.real is not None else ([str(DEFAULT_REAL)] if DEFAULT_REAL.is_dir() else [])
    res = run_suite(args.n, args.seed, real)
    print(res["table"])
    ok = res["false_accepts"] == 0 and res["real_accepted"] == res["real_total"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
