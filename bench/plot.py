"""Draws what bench/decode.py and bench/trace.py wrote (run anywhere with
matplotlib; the GPU machine need not have it):

    python bench/plot.py decode bench/results/decode-nvidia-h100-80gb-hbm3.json   # -> .png beside it
    python bench/plot.py trace trace.json bench/results/timeline-llama-3.2-1b.png"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot_decode(path: Path, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if "ms" in r]
    names = list(dict.fromkeys(r["model"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 4.2))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs, ys = [], []
        for j, m in enumerate(names):
            r = next((r for r in rows if r["model"] == m and r["variant"] == v), None)
            if r:
                xs.append(j + (i - (len(variants) - 1) / 2) * width)
                ys.append(r["floor_ms"] / r["ms"])
        ax.bar(xs, ys, width, label=v)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("fraction of the bandwidth floor (higher is better)")
    ax.set_title(f"decode, batch 1, back to back: {data['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_trace(path: Path, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    labels = data["labels"]
    recs = data["records"]
    kinds = sorted({labels[op] if op >= 0 else "relay" for _, _, _, op, _ in recs})
    cmap = plt.get_cmap("tab20")
    color = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    workers = 1 + max(r[4] for r in recs)
    fig, ax = plt.subplots(figsize=(16, 9))
    for w, s, e, op, worker in recs:
        ax.broken_barh([(s / 1e3, max(e - s, 1) / 1e3)], (worker - 0.4, 0.8),
                       facecolors=color[labels[op] if op >= 0 else "relay"])
        if s > w:  # the wait before the task
            ax.broken_barh([(w / 1e3, (s - w) / 1e3)], (worker - 0.1, 0.2), facecolors="0.85")
    ax.set_xlabel("us from the first task's wait")
    ax.set_ylabel("worker (SM)")
    ax.set_ylim(-1, workers)
    ax.set_title(f"{data['model']} decode step on {data.get('device', '?')}: tasks by op (colour), waits (grey)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[k]) for k in kinds]
    ax.legend(handles, kinds, fontsize=7, ncol=4, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("decode", "trace"):
        print(__doc__)
        return 2
    src = Path(argv[1])
    out = Path(argv[2]) if len(argv) > 2 else src.with_suffix(".png")
    (plot_decode if argv[0] == "decode" else plot_trace)(src, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
