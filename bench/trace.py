"""Where a decode step's time goes inside the megakernel: compile with
options={"trace": True}, run a few steps, read each task's wait/start/end
timestamps from the module, and print time per op kind, the timeline of the
ops of one layer in the middle (when its tasks started and ended), and the
chain of dependent stages averaged over the middle layers (the layer period
and the hops between stages). With --json, the records are written for
bench/plot.py's per-worker timeline and for --from-json, which prints the
same tables again from them, anywhere (no GPU).

    python bench/trace.py --model qwen3-0.6b --json trace.json
    python bench/trace.py --from-json trace.json"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
from collections import defaultdict


def main() -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--from-json")
    known, _ = pre.parse_known_args()
    if known.from_json:  # the tables again, from a --json run's records (or bench/results' .json.gz): no torch or mpk
        with (gzip.open if known.from_json.endswith(".gz") else open)(known.from_json, "rt") as f:
            d = json.load(f)
        recs = [tuple(r) for r in d["records"]]
        ring = [tuple(r) for r in d.get("ring", [])] or None  # older records have no ring columns
        report(d["model"], recs, d["labels"], ring)
        return
    import torch

    from decode import Rewind  # bench/decode.py: a prompt chunk's steps at its starting position
    from mpk import check
    from mpk.models import cache_kw
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--cache-tokens", type=int, default=512)
    p.add_argument("--capacity", type=int, default=0, help="cache capacity (default: cache tokens + 4·prefill + 12)")
    p.add_argument("--batch", type=int, default=1, help="sequences a step")
    p.add_argument("--prefill", type=int, default=1, help="tokens of each sequence a step (a prompt chunk)")
    p.add_argument("--rewind", action=argparse.BooleanOptionalAction, default=None,
                   help="run every step at the starting position, as bench/decode.py times it "
                        "(default: on for prompt chunks)")
    p.add_argument("--json", help="write the step's task records here")
    p.add_argument("--from-json", help="print the tables from records a --json run wrote (no GPU)")
    check.add_lowering_flags(p)
    a = p.parse_args()
    check.ensure_backend_registered()
    extra = a.capacity - a.cache_tokens if a.capacity else 4 * a.prefill + 12
    if extra < 4 * a.prefill:
        raise SystemExit("--capacity must leave room for the 4 traced steps")
    m, cache = check.decode_setup(a.model, a.cache_tokens, extra=extra, batch=a.batch)
    compiled = []
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False,
                         options={"trace": True, "on_compile": compiled.append, **check.lowering_options(a)})
    tok = torch.randint(0, m.config.vocab_size, (a.batch, a.prefill), device="cuda")
    rewind = Rewind(cache, a.prefill, a.rewind if a.rewind is not None else a.prefill > 1)
    with torch.no_grad():
        for i in range(4):
            step(input_ids=tok, **cache_kw(cache), use_cache=True)
            if i < 3:  # the traced (last) step starts where the first did
                rewind()
    torch.cuda.synchronize()
    fn = compiled[-1]
    labels = fn.summary["op_labels"]
    lib = ctypes.CDLL(str(fn.build.path))  # the module the launcher loaded (same handle)
    lib.mpk_trace.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    n = fn.module.num_tasks
    # wait, start, end, (worker << 32 | op), (stall_ns << 32 | landed), (dots_ns << 32 | staged_ns):
    # TraceRecord in runtime/module.cuh
    W = 6
    buf = (ctypes.c_uint64 * (W * n))()
    got = lib.mpk_trace(buf, n)
    if got != n:
        raise SystemExit(f"trace returned {got} of {n} records")
    recs = [(buf[W * i], buf[W * i + 1], buf[W * i + 2], ctypes.c_int32(buf[W * i + 3] & 0xffffffff).value,
             buf[W * i + 3] >> 32) for i in range(n)]
    # pages landed at the start, stall ns, x staged and dots done (ns from the start)
    ring = [(buf[W * i + 4] & 0xffffffff, buf[W * i + 4] >> 32, buf[W * i + 5] & 0xffffffff, buf[W * i + 5] >> 32)
            for i in range(n)]
    t0 = min(r[0] for r in recs)
    report(a.model, recs, labels, ring)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "labels": labels, "device": torch.cuda.get_device_name(),
                       "records": [[w - t0, s - t0, e - t0, op, worker] for w, s, e, op, worker in recs],
                       "ring": [list(r) for r in ring]}, f)
        print(f"wrote {a.json}")


def report(model, recs, labels, ring) -> None:
    """Prints the time per op kind, one layer's timeline and the layers' chain
    (ring: per task, pages landed, stall, staged and dots ns; None if not recorded)."""
    t0 = min(r[0] for r in recs)
    t1 = max(r[2] for r in recs)
    busy, wait, count = defaultdict(float), defaultdict(float), defaultdict(int)
    per_worker_busy, per_worker_wait = defaultdict(float), defaultdict(float)
    for w, s, e, op, worker in recs:
        label = labels[op] if op >= 0 else "relay"
        busy[label] += (e - s) / 1e3
        wait[label] += (s - w) / 1e3
        count[label] += 1
        per_worker_busy[worker] += (e - s) / 1e3
        per_worker_wait[worker] += (s - w) / 1e3
    span = (t1 - t0) / 1e3
    workers = len(per_worker_busy)
    print(f"{model}: step span {span:.1f} us over {workers} workers; mean busy {sum(per_worker_busy.values()) / workers:.1f} us, "
          f"mean waiting {sum(per_worker_wait.values()) / workers:.1f} us per worker")
    print(f"{'op kind':28} {'tasks':>6} {'busy us (sum)':>14} {'mean us':>8} {'wait us (sum)':>14}")
    for label in sorted(busy, key=lambda k: -busy[k]):
        print(f"{label:28} {count[label]:6d} {busy[label]:14.1f} {busy[label] / count[label]:8.2f} {wait[label]:14.1f}")
    preamble(recs, labels)
    layer_timeline(recs, labels, ring or [(0, 0, 0, 0)] * len(recs))
    layer_chain(recs, labels, ring)


def preamble(recs, labels) -> None:
    """Prints the ops the step runs before its first attention (op ids below
    the attention's, relays left out): each one's tasks, first start, last end
    and first wait, us from the step's start. The first attention starts when
    the last of the chains it waits on (the q/k/v projections, the mask's
    extent, RoPE's angles) ends."""
    attention = [op for _, _, _, op, _ in recs if op >= 0 and "attention" in labels[op]]
    if not attention:
        return
    first = min(attention)
    t0 = min(r[0] for r in recs)
    spans = defaultdict(lambda: [0, float("inf"), 0.0, float("inf")])  # tasks, start, end, wait
    for w, s, e, op, _ in recs:
        if 0 <= op <= first:
            sp = spans[op]
            sp[0] += 1
            sp[1], sp[2], sp[3] = min(sp[1], s - t0), max(sp[2], e - t0), min(sp[3], w - t0)
    print("\nthe preamble (ops before the first attention; us from the step's start)")
    print(f"{'op':34} {'tasks':>6} {'waited':>8} {'start':>8} {'end':>8}")
    for op in sorted(spans):
        n, start, end, waited = spans[op]
        print(f"{labels[op] + '#' + str(op):34} {n:6d} {waited / 1e3:8.1f} {start / 1e3:8.1f} {end / 1e3:8.1f}")


def layer_timeline(recs, labels, ring) -> None:
    """The ops between the middle two attention ops (one layer), in op order:
    tasks, when the first started and the last ended (us from the layer's
    attention's first start), the mean task time, and for the weight ring the mean pages
    landed ahead of a task at its start, its first warp's wait for pages, and
    (streamed tasks) when x was staged and the dots done, from its start."""
    attn = [i for i, l in enumerate(labels) if l.split("+")[-1] == "attention"]  # "rope+attention" with fresh_rows
    if len(attn) < 2:
        return
    lo, hi = attn[len(attn) // 2 - 1], attn[len(attn) // 2]
    by_op = defaultdict(list)
    for (w, s, e, op, worker), r in zip(recs, ring):
        if lo <= op < hi:
            by_op[op].append((w, s, e, *r))
    if not by_op:
        return
    # From the layer's attention: ops of the preamble (RoPE's cos and sin, the
    # mask) fall in the range by program order but run at the step's start.
    t0 = min(r[1] for r in by_op[lo])
    print(f"\none layer (ops {lo}..{hi - 1}; us from its attention's first start, negative: the step's preamble)")
    print(f"{'op':34} {'tasks':>5} {'first start':>11} {'last end':>9} {'mean us':>8} "
          f"{'landed':>6} {'stall us':>8} {'staged':>6} {'dots':>6}")
    for op in sorted(by_op):
        rs = by_op[op]
        mean = lambda i: sum(r[i] for r in rs) / len(rs)  # noqa: E731
        print(f"{labels[op] + '#' + str(op):34} {len(rs):5d} {(min(r[1] for r in rs) - t0) / 1e3:11.1f} "
              f"{(max(r[2] for r in rs) - t0) / 1e3:9.1f} {sum(r[2] - r[1] for r in rs) / len(rs) / 1e3:8.2f} "
              f"{mean(3):6.1f} {mean(4) / 1e3:8.2f} {mean(5) / 1e3:6.2f} {mean(6) / 1e3:6.2f}")


def layer_chain(recs, labels, ring=None, min_tasks: int = 32) -> None:
    """The chain of dependent stages of a layer, averaged over the middle
    layers (all but the first two and the last two): for each op between one
    attention op and the next with at least min_tasks tasks (a stage spread
    over the workers), when its first task started and its last ended (us
    from the attention's first start), its mean task, and (from ring: a
    task's pages landed, stall, staged and dots ns) when its tasks had x
    staged and the dots done on average, from their start; ops whose spans
    overlap run side by side (q, k and v), and a hop is the gap from a group's
    last end to the next group's first start. Also the layer period (from one
    attention's first start to the next's)."""
    attn = [i for i, l in enumerate(labels) if l.split("+")[-1] == "attention"]
    if len(attn) < 6:
        return
    first, last, busy, tasks = {}, {}, defaultdict(float), defaultdict(int)
    staged, dots = defaultdict(float), defaultdict(float)
    for (_, s, e, op, _), r in zip(recs, ring or [(0, 0, 0, 0)] * len(recs)):
        first[op], last[op] = min(first.get(op, s), s), max(last.get(op, e), e)
        busy[op] += e - s
        tasks[op] += 1
        staged[op] += r[2]
        dots[op] += r[3]
    layers = range(2, len(attn) - 2)
    periods = [(first[attn[i + 1]] - first[attn[i]]) / 1e3 for i in layers]
    print(f"\nthe layers' chain (mean over layers {layers.start}..{layers.stop - 1}; us from the attention's first start)")
    print(f"layer period {sum(periods) / len(periods):.1f} us (min {min(periods):.1f}, max {max(periods):.1f})")
    # position in the layer -> start, end, mean task, staged, dots (sums over the layers)
    rows = defaultdict(lambda: [0.0] * 5)
    names = {}
    for i in layers:
        a0 = first[attn[i]]
        for op in range(attn[i], attn[i + 1]):
            if tasks.get(op, 0) < min_tasks:
                continue
            r = rows[op - attn[i]]
            r[0] += (first[op] - a0) / 1e3
            r[1] += (last[op] - a0) / 1e3
            for j, total in ((2, busy), (3, staged), (4, dots)):
                r[j] += total[op] / tasks[op] / 1e3
            names[op - attn[i]] = labels[op]
    n = len(layers)
    stages = sorted(([v / n for v in r] + [names[k]] for k, r in rows.items()), key=lambda r: r[0])
    print(f"{'op':34} {'start':>7} {'end':>7} {'mean us':>8} {'staged':>7} {'dots':>7} {'hop us':>7}")
    group_end, hops = None, 0.0
    for start, end, mean, st, dt, name in stages:
        hop = ""
        if group_end is not None and start >= group_end:  # a new group: the gap from the last one's end
            hop = f"{start - group_end:7.1f}"
            hops += start - group_end
            group_end = end
        else:
            group_end = end if group_end is None else max(group_end, end)
        st, dt = (f"{st:7.2f}", f"{dt:7.2f}") if ring else ("-", "-")  # records without ring columns
        print(f"{name:34} {start:7.1f} {end:7.1f} {mean:8.2f} {st:>7} {dt:>7} {hop:>7}")
    to_next = sum(periods) / len(periods) - group_end
    print(f"{'next attention':34} {sum(periods) / len(periods):7.1f} {'':7} {'':8} {'':7} {'':7} {to_next:7.1f}")
    print(f"hops in all: {hops + to_next:.1f} us a layer")


if __name__ == "__main__":
    main()
