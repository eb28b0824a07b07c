"""Time from "compile" to the first finished decode step, in a fresh process.

    python bench/warm_start.py --model qwen3-8b                   # torch.compile
    python bench/warm_start.py --model qwen3-8b --save step.mpk   # mpk.precompile, saved
    python bench/warm_start.py --model qwen3-8b --load step.mpk   # mpk.load in a new process

torch.compile: run it twice; the second run finds the exported graph, the Go
core's result and the nvcc module in mpk's caches, but Dynamo still traces the
model (the time is split into Dynamo, backend and first call).

--load: the warm start a later process gets from a precompiled step: no
Dynamo trace, the caches hit. The first steps are judged by the bf16 rule
(against a float32 copy of the model), so a fast load that computes the wrong
thing fails."""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402

import torch  # noqa: E402

import mpk  # noqa: E402
from mpk import backend, check  # noqa: E402
from mpk.models import cache_kw  # noqa: E402

T_IMPORTS = time.perf_counter()


def torch_compile(m, cache, name: str) -> None:
    check.ensure_backend_registered()
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
    compiled = []
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False, options={"on_compile": compiled.append})
    tok = torch.randint(0, m.config.vocab_size, (1, 1), device="cuda")
    with torch.no_grad():
        step(input_ids=tok, **cache_kw(cache), use_cache=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"{name}: torch.compile to first step {t2 - t1:.2f} s: "
          f"Dynamo {marks['backend'] - t1:.2f} s, backend {marks['backend_done'] - marks['backend']:.2f} s "
          f"({compiled[-1].timing()}), first call {t2 - marks['backend_done']:.2f} s")


def save(m, cache, name: str, path: str, device: str) -> None:
    tok = torch.randint(0, m.config.vocab_size, (1, 1), device=device)
    t1 = time.perf_counter()
    options = {"target": "cuda" if device == "cuda" else "reference"}
    step = mpk.precompile(m, path, input_ids=tok, **cache_kw(cache), use_cache=True, options=options)
    print(f"{name}: precompile and save {time.perf_counter() - t1:.2f} s ({step.graphs[-1].timing()})")


def load(m, cache, name: str, path: str, steps: int, device: str, max_len: int, setup_s: float) -> bool:
    state = check.snapshot(cache)
    toks = [torch.randint(0, m.config.vocab_size, (1, 1), generator=torch.Generator().manual_seed(7 + i))
            for i in range(steps)]
    t1 = time.perf_counter()
    step = mpk.load(m, path)
    t2 = time.perf_counter()
    times = []
    got = check._steps(step, cache, toks, device, times)
    first_done = t2 + times[0]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    print(f"{name}: WARM START {first_done - t1:.2f} s from mpk.load to the first step's logits: "
          f"load {t2 - t1:.2f} s ({step.graphs[-1].timing()}), first step {times[0]:.2f} s; "
          f"Dynamo graphs traced in this process: {graphs}; process start to logits "
          f"{first_done - T_START:.1f} s, of which imports {T_IMPORTS - T_START:.1f} s and the model and "
          f"its cache {setup_s:.1f} s")
    check.restore(cache, state)
    eager = check._steps(m, cache, toks, device)
    problems = check._bf16_rule(m, name, toks[0], state, toks, max_len, eager, got)
    for p in problems:
        print("FAIL", p)
    print(f"{name}: {steps} loaded steps judged by the bf16 rule: {'PASS' if not problems else 'FAIL'}")
    return not problems and graphs == 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--cache-tokens", type=int, default=512)
    p.add_argument("--save", metavar="PATH", help="precompile and save the step to PATH")
    p.add_argument("--load", metavar="PATH", help="load the step from PATH and time the first step")
    p.add_argument("--steps", type=int, default=4, help="steps judged after --load")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: the reference target (to try the script without a GPU)")
    a = p.parse_args()
    t0 = time.perf_counter()
    m, cache = check.decode_setup(a.model, a.cache_tokens, device=a.device)
    if a.device == "cuda":
        torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    print(f"{a.model}: model and cache {setup_s:.1f} s")
    if a.save:
        save(m, cache, a.model, a.save, a.device)
    elif a.load:
        return 0 if load(m, cache, a.model, a.load, a.steps, a.device, a.cache_tokens + 16, setup_s) else 1
    else:
        torch_compile(m, cache, a.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
