"""Decode-step benchmark on a GPU, through Hugging Face's own model code
(LlamaForCausalLM / Qwen3ForCausalLM with a StaticCache): mpk against eager,
CUDA graphs and torch.compile inductor (mode="reduce-overhead"), all measured
in one process on the same weights and cache, and against the bandwidth
floor: (weight bytes + KV bytes read) / a device copy measured in the same run.

    python bench/decode.py --models llama-3.2-1b qwen3-8b --cache-tokens 512
    python bench/decode.py --models llama-3.2-1b --batch 4            # 4 sequences a step
    python bench/decode.py --models llama-3.2-1b --prefill 64         # 64-token chunks

Per variant: back-to-back device time (--steps steps timed with CUDA events,
median of --repeats) and per-call synchronised latency (each call followed by
a synchronisation, host clock, median), as a generate loop sees it. Before
mpk is timed, its steps pass the bf16 rule (docs/architecture.md) against a float32 copy of
the model. The cache's position counters are reset between repeats (untimed):
HF's StaticCache mutates them itself. --batch runs that many sequences per
step, --prefill that many tokens of each per step (a prompt chunk): the floor
is still every weight once plus the KV read, and each row also reports the
matmul TFLOP/s. A prompt chunk's steps are timed at the starting position
(--rewind, on by default for --prefill > 1): each step is the chunk after
--cache-tokens, not the next chunk of a prompt growing a chunk a step.
Results go to bench/results/decode-<gpu>.json (decode-bB-pP-<gpu>.json for
other shapes; bench/plot.py draws them).

An A/B of mpk's options in one process (the same weights, cache and peers):
a variant "mpk+NAME+..." is mpk with each lowering option NAME turned over
from the command line's setting, and each "-DNAME=VALUE" added to
$MPK_NVCC_EXTRA for its build:

    python bench/decode.py --models llama-3.2-1b --prefill 64 \
        --variants inductor-ro mpk mpk+round_gemm_inputs mpk+long_attention_chunks+-DMPK_ROWS_MMA=1"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from mpk import check, models
from mpk.models import cache_kw

RESULTS = Path(__file__).resolve().parent / "results"


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


def floor_bytes(model, live_tokens: int, batch: int = 1, tokens: int = 1) -> int:
    """Bytes a step must read: every weight once (the embedding table only the
    rows of its batch·tokens ids, unless it is also the LM head) plus the live
    KV cache of each sequence."""
    seen, total = set(), 0
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p is emb and emb is not head:
            total += batch * tokens * p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * live_tokens * batch * emb.element_size()
    return total + kv


def matmul_flops(model, batch: int, tokens: int) -> float:
    """Multiply-adds ×2 of a step's Linears (the LM head on every position, as
    HF computes it): what TFLOP/s is reported against (attention not counted)."""
    n = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))  # lm_head included
    return 2.0 * n * batch * tokens


class Rewind:
    """Moves the cache's position counters back by a step's tokens after each
    step (one multi-tensor kernel), so every timed step of a prompt chunk
    starts where the first did: `--prefill 512 --cache-tokens 0` times a
    512-token prompt, not the chunks of a prompt growing by 512 a step.
    Off (None counters): steps advance, as a decode loop does."""

    def __init__(self, cache, tokens: int, on: bool):
        counters = [getattr(layer, "cumulative_length", None) for layer in check._layers(cache)]
        self.counters = counters if on and all(isinstance(c, torch.Tensor) for c in counters) else None
        if on and self.counters is None:
            raise SystemExit("--rewind needs a cache whose layers count positions in a tensor (HF StaticCache)")
        self.tokens = tokens

    def __call__(self) -> None:
        if self.counters:
            torch._foreach_sub_(self.counters, self.tokens)


def back_to_back_ms(fn, cache, state, toks, steps: int, repeats: int, rewind: Rewind) -> float:
    """Median device milliseconds per step over `repeats` runs of `steps` steps."""
    times = []
    for r in range(repeats + 2):
        check.restore(cache, state)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn(input_ids=toks, **cache_kw(cache), use_cache=True)
            rewind()
        end.record()
        torch.cuda.synchronize()
        if r >= 2:  # warm-up runs
            times.append(start.elapsed_time(end) / steps)
    times.sort()
    return times[len(times) // 2]


def synchronised_us(fn, cache, state, toks, steps: int, rewind: Rewind) -> float:
    """Median host microseconds of a call followed by a synchronisation."""
    check.restore(cache, state)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(input_ids=toks, **cache_kw(cache), use_cache=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
        rewind()
    times.sort()
    return times[len(times) // 2]


def cuda_graph_step(model, cache, toks_shape, device):
    """The eager step captured once in a CUDA graph and replayed."""
    toks = torch.zeros(toks_shape, dtype=torch.long, device=device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model(input_ids=toks, **cache_kw(cache), use_cache=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        model(input_ids=toks, **cache_kw(cache), use_cache=True)

    def step(input_ids, **_):  # the cache and use_cache: the captured graph holds them
        toks.copy_(input_ids)
        g.replay()
    return step


RULE_STEPS = 4  # steps the bf16 rule checks
PEERS = ("eager", "cuda-graphs", "inductor-ro")


def mpk_variant(args, variant: str) -> tuple[dict, list[str]]:
    """The lowering options and extra nvcc flags of variant "mpk" or
    "mpk+NAME+-DNAME=VALUE+...": the command line's options with each NAME
    turned over, and the -D flags."""
    parts = variant.split("+")
    if parts[0] != "mpk":
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(PEERS)}, mpk or mpk+OPTION+...")
    opts, defines = check.lowering_options(args), []
    for part in parts[1:]:
        if part.startswith("-D"):
            defines.append(part)
        elif part in opts:
            opts[part] = not opts[part]
        else:
            raise SystemExit(f"variant {variant!r}: {part!r} is neither a lowering option ({', '.join(opts)}) nor -DNAME")
    return opts, defines


@contextmanager
def nvcc_defines(defines: list[str]):
    """$MPK_NVCC_EXTRA with defines added (part of the build cache's key), for one variant's compile."""
    old = os.environ.get("MPK_NVCC_EXTRA")
    if defines:
        os.environ["MPK_NVCC_EXTRA"] = " ".join(filter(None, [old, *defines]))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MPK_NVCC_EXTRA", None)
        else:
            os.environ["MPK_NVCC_EXTRA"] = old


def bf16_rule(name, model, fn, cache, state, prompt, max_len, toks_per_step: int = 1,
              steps: int = RULE_STEPS) -> list[str]:
    """Problems of mpk's steps under the bf16 rule (empty: passed)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(7)
    shape = tuple(prompt.shape[:1]) + (toks_per_step,)
    token_steps = [torch.randint(0, model.config.vocab_size, shape, generator=gen) for _ in range(steps)]
    check.restore(cache, state)
    eager = check._steps(model, cache, token_steps, device)
    check.restore(cache, state)
    got = check._steps(fn, cache, token_steps, device)
    check.restore(cache, state)
    return check._bf16_rule(model, name, prompt, state, token_steps, max_len, eager, got, log=print)


def bench_model(name: str, args, bw: float) -> list[dict]:
    device = torch.device("cuda")
    model = models.build(name, dtype=torch.bfloat16, device=device)
    B, P = args.batch, args.prefill
    # Every measurement starts from the filled cache; the bf16 rule runs RULE_STEPS steps.
    rewinding = args.rewind if args.rewind is not None else P > 1
    steps = RULE_STEPS if rewinding else max(args.steps, RULE_STEPS)
    max_len = args.capacity or args.cache_tokens + steps * P + 8
    if max_len < args.cache_tokens + steps * P:
        raise SystemExit(f"--capacity {max_len} leaves no room for {steps} steps of {P} token(s) after {args.cache_tokens}")
    prompt = torch.randint(0, model.config.vocab_size, (B, args.cache_tokens), generator=torch.Generator().manual_seed(1))
    cache = check._make_cache(model, max_len, device, prompt)
    state = check.snapshot(cache)
    rewind = Rewind(cache, P, rewinding)
    # The KV a step reads: the live length halfway through the timed steps.
    live = args.cache_tokens + (P if rewinding else args.steps * P // 2)
    floor_ms = floor_bytes(model, live, B, P) / bw * 1e3
    flops = matmul_flops(model, B, P)
    toks = torch.randint(0, model.config.vocab_size, (B, P), device=device)
    variants = {
        "eager": lambda: model,
        "cuda-graphs": lambda: cuda_graph_step(model, cache, (B, P), device),
        "inductor-ro": lambda: torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False),
    }
    rows = []
    for v in args.variants:
        torch.compiler.reset()
        row = {"model": name, "variant": v, "batch": B, "prefill": P, "cache_tokens": args.cache_tokens,
               "capacity": max_len, "rewind": rewinding, "floor_ms": floor_ms}
        opts, defines = mpk_variant(args, v) if v not in variants else (None, [])
        try:
            with torch.no_grad(), nvcc_defines(defines):
                check.restore(cache, state)
                fn = (variants[v]() if opts is None else
                      torch.compile(model, backend="mpk", fullgraph=True, dynamic=False, options=opts))
                fn(input_ids=toks, **cache_kw(cache), use_cache=True)  # compile / capture
                if opts is not None and args.check:
                    problems = bf16_rule(name, model, fn, cache, state, prompt, max_len, P)
                    row["bf16_rule"] = "PASS" if not problems else "FAIL: " + "; ".join(problems)
                    if problems:
                        raise RuntimeError(row["bf16_rule"])
                row["ms"] = back_to_back_ms(fn, cache, state, toks, args.steps, args.repeats, rewind)
                row["sync_us"] = synchronised_us(fn, cache, state, toks, args.steps, rewind)
                row["floor_frac"] = floor_ms / row["ms"]
                row["tflops"] = flops / (row["ms"] / 1e3) / 1e12
        except Exception as e:  # one failing variant must not hide the others
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    del model, cache
    torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    by = {(r["model"], r["variant"]): r for r in rows if "ms" in r}
    if rows:
        print(f"\nbatch {rows[0]['batch']}, {rows[0]['prefill']} token(s) a step, {rows[0]['cache_tokens']} cached")
    print(f"{'model':14} {'variant':12} {'ms/step':>8} {'sync us':>8} {'floor/time':>10} {'TFLOP/s':>8}  "
          f"{'mpk vs this (back to back / synchronised)':>40}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:14} {r['variant']:12} ERROR {r['error'][:100]}")
            continue
        mpk = by.get((r["model"], "mpk"))
        vs = f"{r['ms'] / mpk['ms']:.2f}x / {r['sync_us'] / mpk['sync_us']:.2f}x" if mpk else "-"
        print(f"{r['model']:14} {r['variant']:12} {r['ms']:8.3f} {r['sync_us']:8.0f} {r['floor_frac']:10.2f} "
              f"{r['tflops']:8.1f}  {vs:>40}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b"])
    p.add_argument("--variants", nargs="+", default=["eager", "cuda-graphs", "inductor-ro", "mpk"])
    p.add_argument("--cache-tokens", type=int, default=512, help="tokens already in the cache (live)")
    p.add_argument("--capacity", type=int, default=0,
                   help="cache capacity (default: cache tokens + max(steps, 4)·prefill + 8; 4·prefill when rewinding)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step")
    p.add_argument("--prefill", type=int, default=1, help="tokens of each sequence per step (a prompt chunk)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rewind", action=argparse.BooleanOptionalAction, default=None,
                   help="time every step at the starting position (the counters moved back after each step); "
                        "default: on for prompt chunks (--prefill > 1), off for decode")
    p.add_argument("--repeats", type=int, default=5)
    check.add_lowering_flags(p)
    p.add_argument("--no-check", dest="check", action="store_false", help="skip mpk's bf16-rule check")
    p.add_argument("--json", help="write all rows here (default: bench/results/decode-<gpu>.json)")
    args = p.parse_args(argv)
    for v in args.variants:  # a misspelt variant fails before any model loads
        if v not in PEERS:
            mpk_variant(args, v)
    check.ensure_backend_registered()
    bw = copy_bandwidth("cuda")
    gpu = torch.cuda.get_device_name()
    print(f"device {gpu}  copy bandwidth {bw / 1e12:.2f} TB/s (read+write)")
    rows = []
    for m in args.models:
        rows += bench_model(m, args, bw)
    print_table(rows)
    shape = "" if (args.batch, args.prefill) == (1, 1) else f"b{args.batch}-p{args.prefill}-"
    out = Path(args.json) if args.json else RESULTS / f"decode-{shape}{re.sub(r'[^A-Za-z0-9]+', '-', gpu).strip('-').lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": gpu, "copy_bandwidth": bw, "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
