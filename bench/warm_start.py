"""Time from torch.compile to the first finished decode step, in a fresh
process: run it twice; the second run finds the exported graph and the module
in mpk's caches and measures a warm start (Dynamo + graph cache + Go core +
nvcc cache hit + load + one step).

    python bench/warm_start.py --model qwen3-8b"""

from __future__ import annotations

import argparse
import time

import torch

from mpk import backend, check


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--cache-tokens", type=int, default=512)
    a = p.parse_args()
    check.ensure_backend_registered()
    t0 = time.perf_counter()
    m, cache = check.decode_setup(a.model, a.cache_tokens)
    torch.cuda.synchronize()
    marks = {}
    inner = backend._mpk_backend

    def timed_backend(*args, **kw):  # Dynamo's trace ends where the backend is called
        marks["backend"] = time.perf_counter()
        try:
            return inner(*args, **kw)
        finally:
            marks["backend_done"] = time.perf_counter()

    backend._mpk_backend = timed_backend
    t1 = time.perf_counter()
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False)
    tok = torch.randint(0, m.config.vocab_size, (1, 1), device="cuda")
    with torch.no_grad():
        step(input_ids=tok, past_key_values=cache, use_cache=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"{a.model}: model+cache {t1 - t0:.1f} s; compile to first step {t2 - t1:.2f} s: "
          f"Dynamo {marks['backend'] - t1:.2f} s, backend {marks['backend_done'] - marks['backend']:.2f} s "
          f"({backend.last_compiled.timing()}), first call {t2 - marks['backend_done']:.2f} s")


if __name__ == "__main__":
    main()
