"""What a module's static schedule would do, without a GPU: read the task
table a build wrote (module.cu: each task's op, wait and trigger events, its
weight stream's bytes, the workers' queues), give every task a time from a
cost model, and run the queues as the runtime does (a worker takes its tasks
in order; a task starts when its worker is free and, one hop later, when its
event has all its triggers). Prints bench/trace.py's tables for the
simulated step, so two lowerings (options, cost-model knobs in gocore/lower)
can be compared before a device call spends time on them.

The costs are fitted to a measured trace (the forty-third session's
qwen3-8b 64-token chunk on the H200, bench/results/trace-s43-prefill64-
siblings-qwen3-8b.json.gz): a streamed task takes its staging plus its
weight bytes at the rate its kind ran at there (a pair's two weights, one
weight; x of 64 rows or of at most 32); other ops their label's mean task
there, or --costs' trace's. They describe that model's shapes on that
device; a simulated layer is a prediction to check, not a measurement.

    python -m mpk build --config CFG --prefill 64 --no-nvcc --out DIR
    python bench/simulate.py DIR/module.cu [--costs trace.json.gz] [--greedy]

(--greedy: each task on the worker that can start it first, as option
timed_schedule places them, whatever the module's queues say.) Set
MPK_GRAPH_CACHE=0 and a fresh MPK_CACHE_DIR when comparing builds of one
core library: its result cache keys the request and the library, not the
environment."""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict

from trace import report  # bench/trace.py

# Streamed tasks: us of staging, and KB a us of weights by (pair, x rows <= 32)
# (the s43 trace: the pair 1 MB in 62.6 us, over 32 rows 52.2; q, k, v and
# the down slices ~14-16 KB/us; o's 32-row streams 512 KB in 31 us).
STAGE_US = 2.5
RATE_KB_US = {(True, False): 17.4, (True, True): 21.2, (False, False): 15.0, (False, True): 17.9}
# Other ops: the s43 trace's mean task (us), by label; HOP_US the gap from an
# event's last trigger to a waiter's start on another worker.
LABEL_US = {"attention": 36.5, "attn_merge": 9.9, "rmsnorm": 6.5, "rmsnorm+rope": 14.0,
            "rmsnorm+rope+kv_write": 27.0, "kv_write": 28.2, "elementwise": 4.4, "embedding": 13.7,
            "mask_extent": 2.9, "linear_k_sum+residual": 7.6, "linear_k_sum+epilogue": 8.7,
            "linear_k_sum": 7.6, "relay": 0.4}
HOP_US = 1.5
OP_LINEAR = 4  # csrc/runtime/abi_gen.cuh OpKind


def array(src: str, name: str) -> str:
    """The initializer text of `name[...] = { ... };` in module.cu."""
    m = re.search(r"\b" + name + r"\[\d+\] = \{", src)
    if not m:
        raise SystemExit(f"no {name}[] in the module")
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[m.end():i - 1]


def parse(path: str):
    """ops (label, kind, rows of x), tasks (op, wait, trigger), the queues,
    events' trigger counts and each task's (stream bytes, paired)."""
    src = open(path).read()
    ops = []
    for m in re.finditer(r"/\* (\d+) (\S+) [^*]*\*/ \{(-?\d+), (?:[-\d.e+]+f?, ){14}\{-?\d+, -?\d+, -?\d+, -?\d+, -?\d+, \{(\d+)",
                         array(src, "ops")):
        ops.append((m.group(2), int(m.group(3)), int(m.group(4))))
    ints = lambda s: [int(x) for x in re.findall(r"-?\d+", s)]  # noqa: E731
    rows = re.findall(r"\{([^{}]*)\}", array(src, "tasks"))
    tasks = [tuple(ints(r)) for r in rows]  # op, lo, hi, wait, trigger
    starts, queue = ints(array(src, "queue_start")), ints(array(src, "queue"))
    queues = [queue[starts[w]:starts[w + 1]] for w in range(len(starts) - 1)]
    needed = ints(array(src, "event_needed"))
    streams = [ints(r) for r in re.findall(r"\{([^{}]*)\}", array(src, "streams"))]
    # weight bytes a task reads (tile pages: rows × the bytes of each row it
    # reads; else its bytes), and whether a pair's second weight follows
    stream = [(s[4] * s[5] if s[4] > 0 else s[3], s[8] >= 0) for s in streams]
    return ops, tasks, queues, needed, stream


def task_us(op, stream, label_us) -> float:
    if op is None:
        return label_us.get("relay", LABEL_US["relay"])
    label, kind, rows = op
    nbytes, paired = stream
    if kind == OP_LINEAR and nbytes > 0:
        return STAGE_US + nbytes * (2 if paired else 1) / 1024 / RATE_KB_US[(paired, rows <= 32)]
    if label in label_us:
        return label_us[label]
    return LABEL_US.get(label, 5.0)


def simulate(ops, tasks, queues, needed, stream, label_us, hop_us, greedy=False):
    """Records (wait, start, end, op, worker) in ns, in task order, as the
    trace writes them. Tasks run in id order: the linearization puts every
    trigger of an event before its waiters and keeps each queue's order."""
    worker_of = {}
    for w, q in enumerate(queues):
        for t in q:
            worker_of[t] = w
    free = [0.0] * len(queues)
    fired, ready, last = defaultdict(int), {}, defaultdict(float)
    triggered_on = defaultdict(set)  # event -> its triggers' workers (all on the waiter's: a local wait, no hop)
    recs = []
    for t, (op, _lo, _hi, wait, trigger) in enumerate(tasks):
        if wait >= 0 and wait not in ready:
            raise SystemExit(f"task {t} waits on event {wait} before its triggers ran")

        def start_on(v: int) -> float:
            if wait < 0:
                return free[v]
            return max(free[v], ready[wait] + (0.0 if triggered_on[wait] == {v} else hop_us))

        w = worker_of[t]
        if greedy:  # the worker that can start it first (ties: the round-robin one)
            w = min(range(len(free)), key=lambda v: (start_on(v), (v - t) % len(free)))
        begin, start = free[w], start_on(w)
        end = start + task_us(ops[op] if op >= 0 else None, stream[t], label_us)
        free[w] = end
        if trigger >= 0:
            fired[trigger] += 1
            triggered_on[trigger].add(w)
            last[trigger] = max(last[trigger], end)
            if fired[trigger] == needed[trigger]:
                ready[trigger] = last[trigger]  # its last trigger to end, not to come in task order
        recs.append((begin * 1e3, start * 1e3, end * 1e3, op, w))
    return recs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("module", help="a build's module.cu")
    p.add_argument("--costs", help="a trace's records (bench/trace.py --json): its labels' mean task times")
    p.add_argument("--hop", type=float, default=HOP_US, help="us from an event's last trigger to a remote waiter")
    p.add_argument("--greedy", action="store_true",
                   help="give each task the worker that can start it first (list scheduling), not the module's queues")
    a = p.parse_args()
    ops, tasks, queues, needed, stream = parse(a.module)
    label_us = dict(LABEL_US)
    if a.costs:
        with (gzip.open if a.costs.endswith(".gz") else open)(a.costs, "rt") as f:
            d = json.load(f)
        busy, count = defaultdict(float), defaultdict(int)
        for _w, s, e, op, _worker in d["records"]:
            label = d["labels"][op] if op >= 0 else "relay"
            busy[label] += (e - s) / 1e3
            count[label] += 1
        label_us.update({k: busy[k] / count[k] for k in busy})
    recs = simulate(ops, tasks, queues, needed, stream, label_us, a.hop, a.greedy)
    report(f"simulated {a.module}", recs, [o[0] for o in ops], None)


if __name__ == "__main__":
    main()
