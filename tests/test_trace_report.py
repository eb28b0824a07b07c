"""bench/trace.py's chain of dependent stages, on synthetic records (no GPU):
the layer period, each stage's span, side-by-side ops grouped, and the hops."""

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("bench_trace", Path(__file__).parent.parent / "bench" / "trace.py")
trace = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(trace)


def layers(n: int, period_ns: int = 40_000):
    """n layers of: attention (32 tasks) 0-10 us, o 12-15, q and k side by
    side 16-20 and 16-21, a 1-task op (not a stage) at 30; so the hops are 2,
    1 and (to the next attention) 19 us."""
    labels, recs = [], []
    for i in range(n):
        t = i * period_ns
        for name, start, end, tasks in (("rope+attention", 0, 10, 32), ("linear", 12, 15, 132),
                                        ("q", 16, 20, 66), ("k", 16, 21, 66), ("kv_write", 30, 31, 1)):
            op = len(labels)
            labels.append(name)
            recs += [(t + start * 1000, t + start * 1000, t + end * 1000, op, w) for w in range(tasks)]
    return labels, recs


def test_layer_chain(capsys):
    labels, recs = layers(8)
    # landed, stall, staged and dots ns: q's tasks staged at 1 or 2 us (1.5 on average), dots at 3
    ring = [(0, 0, (1000 if w % 2 else 2000) if labels[op] == "q" else 0, 3000 if labels[op] == "q" else 0)
            for _, _, _, op, w in recs]
    trace.layer_chain(recs, labels, ring)
    out = capsys.readouterr().out
    assert "layer period 40.0 us (min 40.0, max 40.0)" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line and line.split()[0] in
            ("rope+attention", "linear", "q", "k", "next")}
    assert rows["linear"] == ["12.0", "15.0", "3.00", "0.00", "0.00", "2.0"]
    assert rows["q"] == ["16.0", "20.0", "4.00", "1.50", "3.00", "1.0"]
    assert rows["k"] == ["16.0", "21.0", "5.00", "0.00", "0.00"]  # beside q: no hop of its own
    assert rows["next"] == ["attention", "40.0", "19.0"]
    assert "hops in all: 22.0 us a layer" in out


def test_layer_chain_without_ring(capsys):
    labels, recs = layers(8)
    trace.layer_chain(recs, labels)  # records from before the ring columns: dashes, not zeros
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line}
    assert rows["q"] == ["16.0", "20.0", "4.00", "-", "-", "1.0"]


def test_layer_chain_needs_layers(capsys):
    labels, recs = layers(4)  # too few to leave middle layers out of the first and last two
    trace.layer_chain(recs, labels)
    assert capsys.readouterr().out == ""


def test_preamble(capsys):
    # Step start at 100 us: an embedding, a relay (op -1), a mask op that waited
    # behind another task, then the first attention and a later layer's op.
    labels = ["embedding", "elementwise", "rope+attention", "linear"]
    us = 1000
    recs = [(100 * us, 101 * us, 105 * us, 0, 0), (100 * us, 101 * us, 104 * us, 0, 1),
            (100 * us, 106 * us, 107 * us, -1, 2), (103 * us, 110 * us, 118 * us, 1, 3),
            (118 * us, 120 * us, 130 * us, 2, 4), (130 * us, 131 * us, 140 * us, 3, 5)]
    trace.preamble(recs, labels)
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if "#" in line}
    assert rows == {"embedding#0": ["2", "0.0", "1.0", "5.0"], "elementwise#1": ["1", "3.0", "10.0", "18.0"],
                    "rope+attention#2": ["1", "18.0", "20.0", "30.0"]}
