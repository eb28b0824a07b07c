"""Host time of one call of a compiled decode step, with the GPU kept busy so
that no call waits for it: what a call costs the CPU before the GPU can run it.

    python bench/host_time.py --model qwen3-8b --json host.json

Each variant is compiled, warmed up, then timed in batches: a long
torch.cuda._sleep is queued first, then --calls calls each timed with
time.perf_counter (the GPU is still sleeping when the batch ends, or the batch
is run again with a longer sleep); the cache is restored between batches. The
table gives the median over all timed calls (and the 10th and 90th
percentiles). Rows (--variants mpk gives the first two):

  mpk own         the compiled graph's callable alone (CudaGraph, from the
                  on_compile option) on the arguments Dynamo passes it
  mpk             the whole torch.compile(backend="mpk") call: Dynamo's guards
                  and bytecode around mpk's callable
  mpk.load        the whole call of a step saved by mpk.precompile and loaded
                  with mpk.load
  mpk.load, no guard check
                  the same step loaded with check_guards=False (unsafe opt-in:
                  Dynamo's guard check on the first call only; what the saved
                  guards cost)
  mpk, no module guards
                  the whole torch.compile call with torch's unsafe opt-in guard
                  filter skip_guard_on_all_nn_modules_unsafe (variant
                  mpk-guard-filter; not run by default)
  inductor-ro     torch.compile(mode="reduce-overhead"): the whole call
  dynamo only     torch.compile with a backend that runs nothing after its
                  first call (bench/dynamo_floor.py's replay_backend): the
                  floor under any backend's whole call (variant dynamo-only;
                  not run by default)

Issue 11's targets on the H100 (qwen3-8b): mpk own <= 30 us, the whole
torch.compile call <= 150 us, the whole mpk.load call <= 50 us."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

import mpk
from mpk import check, compiled
from mpk.models import cache_kw

from decode import RESULTS
from dynamo_floor import replay_backend

TARGETS_US = {"mpk own": 30.0, "mpk": 150.0, "mpk.load": 50.0}
VARIANTS = ("mpk", "mpk.load", "inductor-ro")  # mpk times its own callable too
CHOICES = VARIANTS + ("mpk-guard-filter", "dynamo-only")


def sleep_cycles_per_ms() -> float:
    """GPU clock cycles torch.cuda._sleep spins per millisecond."""
    torch.cuda._sleep(1_000_000)  # warm
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def busy_batch(call, calls: int, cycles: int) -> list[float] | None:
    """Host seconds of each of `calls` calls queued behind a sleep of
    `cycles`; None when the GPU finished the sleep before the last call."""
    torch.cuda._sleep(cycles)
    slept = torch.cuda.Event()
    slept.record()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    busy = not slept.query()
    torch.cuda.synchronize()
    return times if busy else None


def host_times(call, cache, state, calls: int, repeats: int, cycles_per_ms: float) -> list[float]:
    """Microseconds of every timed call, over `repeats` busy batches."""
    out = []
    sleep_ms = 50.0
    while len(out) < calls * repeats:
        check.restore(cache, state)
        times = busy_batch(call, calls, int(sleep_ms * cycles_per_ms))
        if times is None:  # the GPU went idle: sleep longer
            sleep_ms *= 2
            if sleep_ms > 10_000:
                raise RuntimeError("the GPU finished a 10 s sleep before the batch ended")
            continue
        out += [t * 1e6 for t in times]
    return out


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def capture_args(fn, step) -> tuple:
    """The arguments Dynamo passes the compiled graph `fn` in one call of step()."""
    seen = []
    cls = type(fn)
    plain = cls.__call__

    def spy(self, *args):
        if self is fn:
            seen.append(args)
        return plain(self, *args)
    cls.__call__ = spy
    try:
        step()
    finally:
        cls.__call__ = plain
    if not seen:
        raise RuntimeError("the step did not call its compiled graph")
    return seen[-1]


def variant_calls(name: str, model, cache, tok, workdir: Path) -> list[tuple[str, object]]:
    """(label, call) pairs to time for one variant, compiled and warmed up."""
    kw = dict(input_ids=tok, **cache_kw(cache), use_cache=True)
    if name == "mpk":
        graphs = []
        cm = torch.compile(model, backend="mpk", fullgraph=True, dynamic=False,
                           options={"target": "cuda", "on_compile": graphs.append})
        cm(**kw)
        if len(graphs) != 1 or not isinstance(graphs[0], compiled.CompiledGraph):
            raise RuntimeError(f"expected one compiled graph, got {len(graphs)}")
        fn = graphs[0]
        args = capture_args(fn, lambda: cm(**kw))
        print(f"  the compiled graph takes {len(args)} arguments", flush=True)
        return [("mpk own", lambda: fn(*args)), ("mpk", lambda: cm(**kw))]
    if name == "mpk.load":
        path = str(workdir / "step.mpk")
        mpk.precompile(model, path, **kw, options={"target": "cuda"})
        step = mpk.load(model, path)
        step(**kw)
        unguarded = mpk.load(model, path, check_guards=False)  # unsafe opt-in: guards on the first call only
        unguarded(**kw)
        return [("mpk.load", lambda: step(**kw)), ("mpk.load, no guard check", lambda: unguarded(**kw))]
    if name == "mpk-guard-filter":
        cm = torch.compile(model, backend="mpk", fullgraph=True, dynamic=False,
                           options={"target": "cuda",
                                    "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        cm(**kw)
        return [("mpk, no module guards", lambda: cm(**kw))]
    if name == "dynamo-only":
        cm = torch.compile(model, backend=replay_backend, fullgraph=True, dynamic=False)
        cm(**kw)
        return [("dynamo only", lambda: cm(**kw))]
    if name == "inductor-ro":
        cm = torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False)
        for _ in range(3):  # cudagraph trees record after warm-up calls
            cm(**kw)
        return [("inductor-ro", lambda: cm(**kw))]
    raise ValueError(f"unknown variant {name!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=CHOICES)
    p.add_argument("--cache-tokens", type=int, default=512)
    p.add_argument("--calls", type=int, default=32, help="calls per busy batch")
    p.add_argument("--repeats", type=int, default=20, help="batches per variant")
    p.add_argument("--json", help="write the rows here (default: bench/results/host-<model>-<gpu>.json)")
    args = p.parse_args(argv)
    check.ensure_backend_registered()
    gpu = torch.cuda.get_device_name()
    cycles_per_ms = sleep_cycles_per_ms()
    print(f"device {gpu}, torch {torch.__version__}, {args.model}, {args.cache_tokens} cached tokens")
    model, cache = check.decode_setup(args.model, args.cache_tokens, extra=args.calls + 8)
    state = check.snapshot(cache)
    tok = torch.randint(0, model.config.vocab_size, (1, 1), device="cuda")
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        for v in args.variants:
            torch.compiler.reset()
            check.restore(cache, state)
            try:
                for label, call in variant_calls(v, model, cache, tok, Path(tmp)):
                    us = host_times(call, cache, state, args.calls, args.repeats, cycles_per_ms)
                    row = {"variant": label, "median_us": percentile(us, 0.5), "p10_us": percentile(us, 0.1),
                           "p90_us": percentile(us, 0.9), "calls": len(us)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            except Exception as e:  # one failing variant must not hide the others
                rows.append({"variant": v, "error": f"{type(e).__name__}: {str(e)[:400]}"})
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.model}: host time of one call, GPU kept busy (us)")
    print(f"{'variant':26} {'median':>8} {'p10':>8} {'p90':>8} {'target':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:26} ERROR {r['error'][:100]}")
            continue
        t = TARGETS_US.get(r["variant"])
        mark = "" if t is None else f"{t:8.0f} {'ok' if r['median_us'] <= t else 'OVER'}"
        print(f"{r['variant']:26} {r['median_us']:8.1f} {r['p10_us']:8.1f} {r['p90_us']:8.1f} {mark}")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    out = Path(args.json) if args.json else RESULTS / f"host-{args.model}-{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": gpu, "torch": torch.__version__, "model": args.model,
                               "cache_tokens": args.cache_tokens, "targets_us": TARGETS_US, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
