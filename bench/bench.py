"""Decode-step benchmark on a GPU: mpk against eager, CUDA graphs and inductor
(mode="reduce-overhead"), all measured in one run, and against the bandwidth
floor: (weight bytes + KV bytes read) / measured copy bandwidth.

    python bench/bench.py --models qwen3-0.6b llama-3.2-1b --cache-tokens 512

Each variant runs `--steps` decode steps back to back (the position advances),
timed with CUDA events; the cache's position counters are reset between
repeats (untimed), as HF's StaticCache mutates them itself."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from mpk import check, models


def copy_bandwidth(device) -> float:
    """Bytes per second of a large device-to-device copy (read + write)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * n * 10 / (start.elapsed_time(end) / 1e3)


def floor_bytes(model, cache_tokens: int) -> int:
    """Bytes a batch-1 decode step must read: every weight once (the embedding
    table only one row, unless it is also the LM head) plus the KV cache."""
    seen, total = set(), 0
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p is emb and emb is not head:
            total += p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * cache_tokens * emb.element_size()
    return total + kv


def time_steps(fn, model, cache, state, steps: int, repeats: int, device) -> float:
    """Median milliseconds per step over `repeats` runs of `steps` steps."""
    toks = torch.randint(0, model.config.vocab_size, (1, 1), device=device)
    times = []
    for r in range(repeats + 2):
        check.restore(cache, state)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn(input_ids=toks, past_key_values=cache, use_cache=True)
        end.record()
        torch.cuda.synchronize()
        if r >= 2:  # warm-up runs
            times.append(start.elapsed_time(end) / steps)
    times.sort()
    return times[len(times) // 2]


def cuda_graph_step(model, cache, device):
    """Eager step captured once in a CUDA graph and replayed."""
    toks = torch.zeros((1, 1), dtype=torch.long, device=device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model(input_ids=toks, past_key_values=cache, use_cache=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        model(input_ids=toks, past_key_values=cache, use_cache=True)

    def step(input_ids, past_key_values, use_cache):
        toks.copy_(input_ids)
        g.replay()
    return step


def bench_model(name: str, args, bw: float) -> list[dict]:
    device = torch.device("cuda")
    model = models.build(name, dtype=torch.bfloat16, device=device)
    max_len = args.cache_tokens + args.steps + 8
    prompt = torch.randint(0, model.config.vocab_size, (1, args.cache_tokens))
    cache = check._make_cache(model, max_len, device, prompt)
    state = check.snapshot(cache)
    floor_ms = floor_bytes(model, args.cache_tokens + args.steps // 2) / bw * 1e3
    variants = {
        "eager": lambda: model,
        "cuda-graphs": lambda: cuda_graph_step(model, cache, device),
        "inductor-ro": lambda: torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False),
        "mpk": lambda: torch.compile(model, backend="mpk", fullgraph=True, dynamic=False),
    }
    rows = []
    for v in args.variants:
        torch.compiler.reset()
        try:
            with torch.no_grad():
                check.restore(cache, state)
                fn = variants[v]()
                ms = time_steps(fn, model, cache, state, args.steps, args.repeats, device)
            rows.append({"model": name, "variant": v, "ms": ms, "floor_ms": floor_ms, "floor_frac": floor_ms / ms})
        except Exception as e:  # one failing variant must not hide the others
            rows.append({"model": name, "variant": v, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(json.dumps(rows[-1]), flush=True)
    del model, cache
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b"])
    p.add_argument("--variants", nargs="+", default=["eager", "cuda-graphs", "inductor-ro", "mpk"])
    p.add_argument("--cache-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write all rows here")
    args = p.parse_args(argv)
    check.ensure_backend_registered()
    bw = copy_bandwidth("cuda")
    print(f"device {torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.2f} TB/s (read+write)")
    rows = []
    for m in args.models:
        rows += bench_model(m, args, bw)
    eager = {r["model"]: r["ms"] for r in rows if r.get("variant") == "eager" and "ms" in r}
    print(f"\n{'model':14} {'variant':12} {'ms/step':>9} {'floor/time':>10} {'vs eager':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:14} {r['variant']:12} ERROR {r['error'][:80]}")
            continue
        sp = eager.get(r["model"], float("nan")) / r["ms"]
        print(f"{r['model']:14} {r['variant']:12} {r['ms']:9.3f} {r['floor_frac']:10.2f} {sp:8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
