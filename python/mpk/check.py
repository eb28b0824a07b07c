"""`python -m mpk check`: compile a model step with mpk and compare it with eager.

The model gets a StaticCache already holding --cache-tokens tokens (so the
cache tensors are real graph inputs); eager and mpk then run the same step(s)
from identical cache state and their logits and caches are compared. The model
is a named one (--model) or any local HF config (--config, random weights).
--mask passes a 2-D attention_mask over the whole cache, as serving code does;
with --batch > 1 it left-pads the rows by different amounts and passes the
position_ids generate would. The last line is `PASS rel_err=...` or `FAIL ...`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import models
from .errors import MpkError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FP32_REFERENCE_TOL = 1e-4
FP32_CUDA_TOL = 1e-3


@dataclass
class CheckResult:
    ok: bool
    line: str
    rel_err: float = float("nan")
    cache_err: float = float("nan")  # the KV cache after the steps, against eager's
    tasks: int = 0
    events: int = 0
    executed: int = 0
    core_ms: float = 0.0
    compiles: int = 0
    cold_s: float = 0.0      # first step: Dynamo + Go core + nvcc (or cache) + load + run
    warm_ms: float = 0.0     # mean of the later steps
    summary: dict = field(default_factory=dict)
    compiled: Any = None     # the compiled callable of the last compile (its summary, timings, module)


def add_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", default="tiny-llama", choices=models.MODELS)
    which.add_argument("--config", default=None, metavar="PATH",
                       help="any local HF config.json (or a directory holding one): random weights")
    p.add_argument("--target", default="reference", choices=("reference", "cuda"))
    p.add_argument("--prefill", type=int, default=1, metavar="N",
                   help="tokens per step (1: decode; 16: a 16-token prefill chunk)")
    p.add_argument("--seed", type=int, default=0, help="weights, tokens and executor order")
    p.add_argument("--exec-seed", type=int, default=None,
                   help="reference executor order only (default: --seed); the model stays the same")
    p.add_argument("--workers", type=int, default=None, help="num_workers (default: SM count / 132)")
    p.add_argument("--cache-tokens", type=int, default=64,
                   help="tokens already in the KV cache (0: a prompt's first chunk, with --prefill 2 or more)")
    p.add_argument("--capacity", type=int, default=0,
                   help="make the cache at least this long (a long cache, mostly empty: the mask's extent bounds it)")
    p.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                   help="model dtype (default: float32 for reference, bfloat16 for cuda)")
    p.add_argument("--steps", type=int, default=1, help="steps run back to back")
    add_lowering_flags(p)
    p.add_argument("--batch", type=int, default=1, help="sequences per step")
    p.add_argument("--mask", action="store_true",
                   help="pass a 2-D attention_mask over the whole cache (left-padded rows when --batch > 1)")


def ensure_backend_registered() -> None:
    """backend="mpk" resolves through the entry point once installed; when mpk
    runs from a source tree without installation, register it here."""
    from torch._dynamo.backends import registry
    try:
        registry.lookup_backend("mpk")
    except Exception:
        from .backend import mpk_backend
        registry.register_backend(name="mpk")(mpk_backend)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _layers(cache):
    return list(getattr(cache, "layers", []))


def snapshot(cache) -> list[dict]:
    """Copies of everything a step mutates: each layer's keys, values and
    position counter (a sliding-window layer also counts in a Python int)."""
    state = []
    for layer in _layers(cache):
        d = {}
        for attr in ("keys", "values", "cumulative_length", "cumulative_length_int"):
            v = getattr(layer, attr, None)
            if isinstance(v, torch.Tensor):
                d[attr] = v.detach().clone()
            elif isinstance(v, int):
                d[attr] = v
        state.append(d)
    return state


@torch.no_grad()
def restore(cache, state: list[dict]) -> None:
    """Writes a snapshot back in place, so the cache keeps its addresses."""
    for layer, d in zip(_layers(cache), state):
        for attr, v in d.items():
            if isinstance(v, torch.Tensor):
                getattr(layer, attr).copy_(v)
            else:
                setattr(layer, attr, v)


def _make_cache(model, max_len, device, tokens, **inputs):
    """A StaticCache of max_len filled eagerly with tokens (and inputs: the
    attention mask and position ids that go with them)."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    if tokens.shape[-1] == 0:  # an empty cache (a prompt's first chunk): its tensors made now, zeroed
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cache.early_initialization(tokens.shape[0], cfg.num_key_value_heads, head_dim, model.dtype, torch.device(device))
        return cache
    with torch.no_grad():
        model(input_ids=tokens.to(device), **models.cache_kw(cache), use_cache=True,
              **{k: v.to(device) for k, v in inputs.items()})
    return cache


def left_pads(batch: int, cache_tokens: int) -> list[int]:
    """Left padding per row of a padded batch: none on row 0, up to half the
    filled cache on the last, so every row sees a different mask."""
    return [b * (cache_tokens // 2) // max(batch - 1, 1) for b in range(batch)]


@dataclass
class Plan:
    """What a check feeds the model: the prompt that fills the cache and each
    step's inputs, all on the CPU."""
    fill: torch.Tensor
    fill_inputs: dict
    steps: list[dict]


def plan_inputs(vocab: int, batch: int, cache_tokens: int, prefill: int, steps: int, mask: bool,
                max_len: int, seed: int) -> Plan:
    """Random tokens; with mask, a 2-D attention_mask over the whole cache
    (ones on every real token so far, zeros on left padding and the unused
    tail) and, for a padded batch, position_ids that skip the padding."""
    gen = torch.Generator().manual_seed(seed + 1)
    fill = torch.randint(0, vocab, (batch, cache_tokens), generator=gen)
    pads = left_pads(batch, cache_tokens) if mask and batch > 1 else [0] * batch
    fill_inputs = {}
    if mask:
        m = torch.ones(batch, cache_tokens, dtype=torch.long)
        for b, p in enumerate(pads):
            m[b, :p] = 0
        fill_inputs["attention_mask"] = m
        if batch > 1:
            fill_inputs["position_ids"] = (m.cumsum(-1) - 1).clamp_min(0)
    plan = Plan(fill, fill_inputs, [])
    for s in range(steps):
        step = {"input_ids": torch.randint(0, vocab, (batch, prefill), generator=gen)}
        if mask:
            start = cache_tokens + s * prefill
            m = torch.zeros(batch, max_len, dtype=torch.long)
            for b, p in enumerate(pads):
                m[b, p:start + prefill] = 1
            step["attention_mask"] = m
            if batch > 1:
                step["position_ids"] = torch.stack([torch.arange(start - p, start - p + prefill) for p in pads])
        plan.steps.append(step)
    return plan


def decode_setup(name: str, cache_tokens: int, dtype=torch.bfloat16, device="cuda", extra: int = 16, seed: int = 0,
                 batch: int = 1):
    """A model with seeded random weights and a StaticCache already holding
    `cache_tokens` tokens of `batch` sequences (room for `extra` more): what
    the benchmarks start from."""
    model = models.build(name, dtype=dtype, device=device, seed=seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch, cache_tokens),
                           generator=torch.Generator().manual_seed(seed + 1))
    return model, _make_cache(model, cache_tokens + extra, device, prompt)


def _steps(fn, cache, steps: list, device, times: list | None = None):
    """Runs the steps (each token ids or a dict of inputs) back to back (the
    cache position advances); logits per step. `times` gets each step's wall
    time in seconds (the .cpu() syncs)."""
    import time
    out = []
    with torch.no_grad():
        for step in steps:
            inputs = step if isinstance(step, dict) else {"input_ids": step}
            inputs = {k: v.to(device) for k, v in inputs.items()}
            t0 = time.perf_counter()
            r = fn(**inputs, **models.cache_kw(cache), use_cache=True)
            out.append(r.logits.float().cpu().clone())
            if times is not None:
                times.append(time.perf_counter() - t0)
    return out


def run_check(model: str = "tiny-llama", target: str = "reference", prefill: int = 1, seed: int = 0,
              workers: int | None = None, cache_tokens: int = 64, dtype: str | None = None,
              steps: int = 1, log: Callable[[str], None] = print, exec_seed: int | None = None,
              batch: int = 1, mask: bool = False, capacity: int = 0, options: dict | None = None) -> CheckResult:
    """Runs the check; logs the summary and the result line; returns the result.
    `model` is a named model or a path to a local HF config; `capacity` > 0
    makes the cache at least that long (most of it empty); `options` are more
    mpk options for the compile."""
    compiled: list = []  # what the backend compiled, through the on_compile option
    try:
        return _run_check(model, target, prefill, seed, workers, cache_tokens, dtype, steps, log,
                          seed if exec_seed is None else exec_seed, batch, mask, capacity, compiled, options)
    except MpkError as e:
        if compiled and (compiled[-1].summary or {}).get("text"):
            log(compiled[-1].summary["text"].rstrip("\n"))
        log(f"mpk error ({e.kind}): {e}")
        res = CheckResult(False, f"FAIL mpk error ({e.kind}): {e.message}")
        log(res.line)
        return res


def _run_check(name, target, prefill, seed, workers, cache_tokens, dtype, steps, log, exec_seed,
               batch, mask, capacity, compiled: list, options: dict | None = None) -> CheckResult:
    ensure_backend_registered()
    dtype = dtype or ("float32" if target == "reference" else "bfloat16")
    device = "cpu" if target == "reference" else "cuda"
    if device == "cuda":
        if not torch.cuda.is_available():
            res = CheckResult(False, "FAIL target cuda needs a CUDA device")
            log(res.line)
            return res
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if prefill < 1 or steps < 1 or batch < 1 or cache_tokens < 0 or cache_tokens == 0 and (mask or prefill < 2):
        raise ValueError("--prefill, --steps and --batch must be positive, --cache-tokens too unless the step is a "
                         "prompt's first chunk (--prefill 2 or more, no --mask)")

    torch.manual_seed(seed)
    m = models.build(name, dtype=DTYPES[dtype], device=device, seed=seed)
    max_len = max(cache_tokens + prefill * steps, capacity)
    max_len = (max_len + 63) // 64 * 64
    plan = plan_inputs(m.config.vocab_size, batch, cache_tokens, prefill, steps, mask, max_len, seed)
    fill, token_steps = plan.fill, plan.steps

    cache = _make_cache(m, max_len, device, fill, **plan.fill_inputs)
    state = snapshot(cache)
    if not state or "keys" not in state[0] or "cumulative_length" not in state[0]:
        raise RuntimeError("this transformers version's StaticCache has no keys/values/"
                           "cumulative_length per layer; mpk check does not know how to reset it")

    eager = _steps(m, cache, token_steps, device)
    eager_cache = snapshot(cache)
    restore(cache, state)

    opts = {**(options or {}), "target": target, "seed": exec_seed, "on_compile": compiled.append}
    if target == "cuda":  # surface a kernel abort at the step that caused it; NaN-fill outputs
        opts.update(sync=True, poison=True)
    if workers is not None:
        opts["num_workers"] = workers
    torch._dynamo.reset()
    compiled_model = torch.compile(m, backend="mpk", options=opts, fullgraph=True, dynamic=False)
    times: list[float] = []
    got = _steps(compiled_model, cache, token_steps, device, times)
    compiles = len(compiled)
    mpk_cache = snapshot(cache)
    fn = compiled[-1] if compiled else None
    if fn is None:
        res = CheckResult(False, "FAIL mpk backend was not called (nothing compiled)")
        log(res.line)
        return res

    summary = getattr(fn, "summary", {}) or {}
    if summary.get("text"):
        log(summary["text"].rstrip("\n"))
    err = max(rel_err(g, e) for g, e in zip(got, eager))
    cache_err = max(rel_err(a[k].float(), b[k].float()) for a, b in zip(mpk_cache, eager_cache)
                    for k in ("keys", "values"))
    pos_ok = all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                 for a, b in zip(mpk_cache, eager_cache) for k in a if k.startswith("cumulative_length"))
    last = getattr(fn, "last_run", None) or {}
    res = CheckResult(False, "", rel_err=err, cache_err=cache_err, tasks=int(summary.get("tasks", 0)),
                      events=int(summary.get("events", 0)), executed=int(last.get("executed", 0)),
                      core_ms=float(summary.get("core_ms", 0.0)), summary=summary)
    res.compiles, res.cold_s, res.compiled = compiles, times[0], fn
    res.warm_ms = 1e3 * sum(times[1:]) / len(times[1:]) if len(times) > 1 else float("nan")
    timing = fn.timing() if hasattr(fn, "timing") else f"core {res.core_ms:.1f} ms"
    log(f"compiles: {compiles} in {steps} step(s); cold step {res.cold_s:.2f} s ({timing}); "
        f"warm step {res.warm_ms:.3f} ms")
    stats = (f"rel_err={err:.3e} cache_err={cache_err:.3e} tasks={res.tasks} events={res.events} "
             f"executed={res.executed} core_ms={res.core_ms:.1f} compiles={compiles}")

    if dtype == "float32":
        tol = FP32_REFERENCE_TOL if target == "reference" else FP32_CUDA_TOL
        problems = []
        if not err < tol:
            problems.append(f"logits rel_err {err:.3e} >= {tol:.0e}")
        if not cache_err < tol:
            problems.append(f"KV cache rel_err {cache_err:.3e} >= {tol:.0e} (cache not written in place?)")
        if not pos_ok:
            problems.append("cache position counters differ from eager")
    else:
        problems = _bf16_rule(m, name, fill, state, token_steps, max_len, eager, got, log)
    if compiles != 1:
        problems.append(f"{compiles} compiles in {steps} steps (want 1: a later step recompiled)")
    res.ok = not problems
    res.line = f"PASS {stats}" if res.ok else f"FAIL {'; '.join(problems)} ({stats})"
    log(res.line)
    return res


def float32_copy(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """A float32 copy of `model`: the same weights (bf16 values upcast exactly),
    so the judge differs from the bf16 model only in how it computes, not in
    what it computes with."""
    device = next(model.parameters()).device
    ref = models.build(name, dtype=torch.float32, device=device)
    src = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    with torch.no_grad():
        for k, t in [*ref.named_parameters(remove_duplicate=False), *ref.named_buffers()]:
            t.copy_(src[k])
    return ref


def judge_near_tie(judge: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """Per row: whether the judge's logit of the picked token is within one
    bf16 spacing (at the judge's top logit) of that top, so that the two
    round to neighbouring or equal bf16 values."""
    top = judge.float().max(-1).values
    spacing = torch.exp2(torch.floor(torch.log2(top.abs().clamp_min(1e-30))) - 7)
    return top - judge.float().gather(-1, picked.unsqueeze(-1)).squeeze(-1) <= spacing


def _bf16_rule(m, name, fill, state, token_steps, max_len, eager, got, log=print) -> list[str]:
    """The bf16 rule (docs/architecture.md, Correctness): judge against a float32 copy of the model on the
    same inputs: the same tokens, and the same cache contents (the bf16 cache
    as the steps found it, upcast), so the judge measures the steps alone."""
    ref = float32_copy(m, name)
    device = next(m.parameters()).device
    cache = _make_cache(ref, max_len, device, fill[:, :1])  # allocates; restore overwrites it all
    restore(cache, state)
    judge = _steps(ref, cache, token_steps, device)
    del ref, cache
    problems, log_ties, eager_off, errs = [], [], [], []
    for i, (j, e, g) in enumerate(zip(judge, eager, got)):
        e_err, g_err = rel_err(e, j), rel_err(g, j)
        errs.append((g_err, e_err))
        tol = max(2e-2, 1.5 * e_err)
        if not g_err <= tol:
            problems.append(f"step {i}: |mpk-fp32|/|fp32| = {g_err:.3e} > {tol:.3e} (eager {e_err:.3e})")
        ga, ja, ea = g.argmax(-1), j.argmax(-1), e.argmax(-1)
        if not bool((ea == ja).all()):
            eager_off.append(i)
        # bf16 logits tie often (8-bit mantissa, ~150k tokens near zero with
        # random weights) and argmax then takes the lowest index; a tie at the
        # top of mpk's logits with the fp32 or eager token counts as agreement.
        top = g.max(-1, keepdim=True).values
        tied = (g.gather(-1, ja.unsqueeze(-1)) == top).squeeze(-1) | (g.gather(-1, ea.unsqueeze(-1)) == top).squeeze(-1)
        # So does a token the float32 judge itself cannot tell from its top
        # one at bf16's resolution (a prompt's hundreds of rows hold a few).
        tied |= judge_near_tie(j, ga)
        if not bool(((ga == ja) | (ga == ea) | tied).all()):
            problems.append(f"step {i}: argmax {ga.flatten().tolist()} differs from fp32 {ja.flatten().tolist()} "
                            f"and eager {ea.flatten().tolist()} (mpk logits there: "
                            f"{g.gather(-1, ga.unsqueeze(-1)).flatten().tolist()} vs "
                            f"{g.gather(-1, ja.unsqueeze(-1)).flatten().tolist()}; fp32: "
                            f"{j.gather(-1, ga.unsqueeze(-1)).flatten().tolist()} vs "
                            f"{j.gather(-1, ja.unsqueeze(-1)).flatten().tolist()})")
        elif not bool(((ga == ja) | (ga == ea)).all()):
            log_ties.append(i)
    g_max, e_max = max(g for g, _ in errs), max(e for _, e in errs)
    log(f"against the float32 copy: mpk rel_err max {g_max:.3e} (mean {sum(g for g, _ in errs) / len(errs):.3e}), "
        f"eager bf16 max {e_max:.3e} (mean {sum(e for _, e in errs) / len(errs):.3e})")
    if log_ties:
        log(f"argmax matched through a bf16 tie at the top of mpk's logits at step(s) {log_ties}")
    if eager_off:
        log(f"eager bf16's own argmax differs from fp32 at step(s) {eager_off} of {len(judge)}")
    return problems


# The lowering options' flags (README, Options): (option, on by default,
# what turning it over does). A flag turns the option's default over:
# --no-NAME for one on by default, --NAME for one off.
LOWERING_FLAGS = (
    ("prefill_rows", True, "a sequence's masked prompt chunk then runs the prompt attention"),
    ("split_k", True, "a Linear whose x is too large for one weight stream then runs as blocks of rows"),
    ("gemm", True, "a Linear whose x has 32 rows or more (a prompt chunk) then runs as a tile stream, slices of K "
                   "or blocks of rows"),
    ("wgmma", True, "those GEMM streams with bf16 weights and an fp32 x multiply on Hopper's wgmma (x split into "
                    "hi + lo in registers, 64-row swizzled weight pages) instead of mma.sync"),
    ("gemm_row_blocks", True, "a GEMM stream with too few weight rows for the workers (a 64-token chunk's q, k, v "
                               "and o projections) then runs as slices of K and a stage of their sums rather than "
                               "blocks of 32 rows of x"),
    ("gemm_siblings", True, "each of a run of sibling GEMM streams (a 64-token chunk's q, k and v projections) is "
                             "then cut as if it ran alone, filling every worker by itself, rather than the run's "
                             "cuts chosen together for one stage"),
    ("long_attention_chunks", True, "a prompt chunk's attention with shared K and V then takes a tile of 64 "
                                     "positions a task rather than chunks long enough for its tasks to fit one wave "
                                     "of the workers"),
    ("round_gemm_inputs", False, "the x of each GEMM stream (a prompt chunk's normed hidden states, attention "
                                 "output, SiLU-mul) stays in the weights' dtype, rounded as eager rounds it, rather "
                                 "than fp32: half the bytes and half the multiplies (off until timed on the GPU)"),
    ("coarse_events", True, "every task then waits on exactly the producer tasks it reads, through empty relay tasks "
                            "where a producer feeds many sets"),
    ("fresh_rows", True, "a decode attention then waits for separate RoPE and KV-cache write tasks"),
    ("pair_linears", True, "a gate projection then runs as its own stage before the up projection that reads it"),
    ("pair_gemm", True, "a prompt chunk's gate and up GEMM streams then run as two stages, each staging every "
                        "block of x for its own weight's rows (pair_linears pairs them: one task streams both "
                        "weights' rows, half the x bytes a weight byte)"),
    ("balance_gemm_tail", True, "a GEMM stream whose tasks end in a short last round on the workers (qwen3-8b's "
                                "64-token chunk: the gate and up pair's 192 tasks on 132 workers) then runs that "
                                "round as it does the others, rather than its weight rows as two streams over halves "
                                "of x's rows, side by side"),
    ("kv_pages", True, "a single sequence's decode attention then reads its K and V rows from the cache itself, in "
                       "chunks of a round of every warp, after its inputs are ready"),
    ("weight_affinity", False, "the blocks of rows of a prompt chunk's Linear that read the same weight rows run on "
                               "one worker or a few, one after another (off: the GEMMs are bound by the tensor cores, "
                               "not by HBM, and a 512-token chunk ran 10%% faster round-robin)"),
    ("arena_reuse", True, "every temporary then keeps arena bytes of its own"),
    ("timed_schedule", True, "a GEMM stream's tasks then go to the workers round-robin rather than to the worker "
                             "that can start each first by estimated task times, and the GEMM stream after a stage "
                             "with a short last round (qwen3-8b's 64-token chunk: the down projection after the "
                             "gate/up pair) is cut as if it ran alone rather than into K slices that fill that "
                             "round's idle workers"),
    ("split_rows", True, "a Linear whose x is too tall for one weight stream then reads its weights once per row"),
    ("split_gemm_x", True, "the x of each wgmma GEMM stream (a prompt chunk's normed hidden states, attention "
                           "output, SiLU-mul) then stays fp32, split into bf16 hi and lo in registers by every "
                           "warpgroup that multiplies it, rather than stored as the two planes by the op that "
                           "makes it and staged by tensor-map copies as wgmma's B operand"),
    ("gemm_batch", False, "a Linear with bf16 weights whose x has 4 to 31 rows (a decode batch) and whose tasks "
                          "cover the workers with K whole (the gate and up projections, the LM head) runs as a wgmma "
                          "GEMM stream (x's split rows as wgmma's B, N as small as 16) rather than a tile stream "
                          "(off: slower at batch 4 to 16 with every Linear so, and in this form +7.7% at batch 8 "
                          "and +3.2% at 16 on llama-3.2-1b)"),
    ("kv_pages_batch", True, "a decode batch's attention takes kv_pages' layout too: a task a chunk of one row's KV "
                             "head (chunks enough to fill the workers in one round), its K and V pages streamed "
                             "through the ring ahead of its queries and taken a round of rows at a time "
                             "(llama-3.2-1b batch 8 -5.5%, batch 16 -8.9%)"),
    ("tile_x_parts", True, "a tile stream's plain x too large to leave the worker's weight ring as many pages as "
                           "the other streams leave it (the down projection at batch 8: 8 rows of 8,192) is staged "
                           "in parts of K, one after another, its pages part by part (llama-3.2-1b batch 8 -3.4%)"),
    ("pair_tiles", True, "pair_linears pairs tile streams too (a decode batch's gate and up projections): a task "
                         "stages x once and streams each row group's pages of both weights, one dependent stage "
                         "fewer a layer (llama-3.2-1b batch 8 -1.8%, batch 16 -1.8%; qwen3-8b batch 8 -1.5%)"),
    ("wide_x_parts", False, "tile_x_parts for every tile stream: a normed x (the deferred norm's sums of squares "
                            "added part by part), a pair's, and tasks of any number of row groups (their sums added "
                            "in shared memory part by part), so no x shrinks the ring (batch 16's 4 pages, qwen3-8b "
                            "batch 8's 5; slower at llama-3.2-1b batch 16, 2.110 against 1.859 ms, and -1.8% "
                            "at qwen3-8b batch 8 on the H200)"),
    ("kv_swizzle", False, "a decode batch's kv_pages chunks land through tensor maps, 128-byte swizzled, so the "
                          "tensor-core attention rounds read K and V rows without bank conflicts (8-way with plain "
                          "rows; the rounds alone 29-36% faster in bench/attn_round_mma.cu; off until timed in "
                          "the megakernel)"),
)


def add_lowering_flags(p: argparse.ArgumentParser) -> None:
    """The flags of LOWERING_FLAGS; lowering_options reads them back as
    torch.compile options."""
    for name, on, effect in LOWERING_FLAGS:
        flag = ("--no-" if on else "--") + name.replace("_", "-")
        # (argparse formats help with %: a measured "-5.5%" stays literal)
        p.add_argument(flag, dest=name, action="store_false" if on else "store_true",
                       help=f"turn {'off' if on else 'on'} option {name}: {effect}".replace("%", "%%"))


def lowering_options(a: argparse.Namespace) -> dict:
    return {name: getattr(a, name) for name, _, _ in LOWERING_FLAGS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpk check", description=__doc__)
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        res = run_check(a.config or a.model, a.target, a.prefill, a.seed, a.workers, a.cache_tokens, a.dtype,
                        a.steps, exec_seed=a.exec_seed, batch=a.batch, mask=a.mask, capacity=a.capacity,
                        options=lowering_options(a))
    except Exception as e:  # the last line must say FAIL, whatever broke
        import traceback
        traceback.print_exc()
        print(f"FAIL {type(e).__name__}: {e}".splitlines()[0])
        return 1
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
