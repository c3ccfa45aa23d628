#!/usr/bin/python3
"""Plots of the benchmark results, from the raw CSV files in bench/results/.

    bench/plot.py [RESULTS_DIR]        (default: bench/results next to this script)

Writes, next to the CSV files it reads:
  scale.png      staging time against the node count (bench_scale.raw.csv, 100 Mbit/s links;
                 bench_scale_50mbit.raw.csv, 50 Mbit/s), the median of the runs at each point
  contended.png  four nodes reading one image from a throttled source: every node reading the
                 source vs stagefs (bench_contended.raw.csv), median and every round

Needs matplotlib (Debian: apt-get install -y python3-matplotlib). Not a test: nothing runs it.
Lines starting with '#' in a CSV are run headers and are skipped.
"""
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def medians(path, key, value):
    """{variant: {key: median of value}} over the rows that completed (ok == 1, if present)."""
    runs = defaultdict(lambda: defaultdict(list))
    for r in rows(path):
        if r.get("ok", "1") != "1" or r[value] in ("", "nan"):
            continue
        runs[r["variant"]][int(r[key])].append(float(r[value]))
    return {v: {k: statistics.median(xs) for k, xs in sorted(d.items())} for v, d in runs.items()}


SCALE_LABELS = {
    "sb-chain": "stage-bcast, chain (default)",
    "sb-tree": "stage-bcast, tree",
    "sb-mpi": "stage-bcast, MPI_Bcast",
    "fs-chain": "stagefs first open, chain (default)",
    "fs-mpi": "stagefs first open, MPI_Bcast",
    "pull": "every node reads the source",
}
SCALE_STYLE = {
    "sb-chain": dict(color="tab:blue", marker="o"),
    "fs-chain": dict(color="tab:green", marker="s"),
    "sb-tree": dict(color="tab:purple", marker="^", linestyle="--"),
    "sb-mpi": dict(color="tab:orange", marker="v", linestyle="--"),
    "fs-mpi": dict(color="tab:brown", marker="D", linestyle=":"),
    "pull": dict(color="tab:red", marker="x", linestyle=":"),
}


def plot_scale(results):
    panels = [("bench_scale.raw.csv", 100), ("bench_scale_50mbit.raw.csv", 50)]
    panels = [(results / f, mbit) for f, mbit in panels if (results / f).exists()]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.0), squeeze=False)
    for ax, (path, mbit) in zip(axes[0], panels):
        med = medians(path, "nodes", "wall_s")
        size = int(rows(path)[0]["bytes"])
        one_link = size * 8 / (mbit * 1e6)
        for variant in SCALE_LABELS:
            if variant not in med:
                continue
            pts = {n: t for n, t in med[variant].items() if n >= 2}  # N = 1: no network at all
            ax.plot(list(pts), list(pts.values()), label=SCALE_LABELS[variant], **SCALE_STYLE[variant])
        ax.axhline(one_link, color="grey", linewidth=1)
        ax.annotate(f"one transfer over one link: {one_link:.2f} s", (16, one_link), xytext=(0, -12),
                    textcoords="offset points", fontsize=8, color="grey", ha="right")
        ax.set_xscale("log", base=2)
        ax.set_xticks([2, 4, 8, 16])
        ax.set_xticklabels(["2", "4", "8", "16"])
        ax.set_xlabel("nodes")
        ax.set_ylabel("seconds (median of the runs)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{size >> 20} MiB onto N nodes, {mbit} Mbit/s links")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Staging time against the node count (netns cluster on one 2-vCPU machine)\n"
                 "stage-bcast: wall clock including mpirun; stagefs: first open on every node", fontsize=10)
    fig.tight_layout()
    out = results / "scale.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


CONTENDED = [
    ("baseline", "every node reads\nthe shared source", "tab:red"),
    ("stagefs-disk", "stagefs,\ncaches on disk", "tab:blue"),
    ("stagefs-tmpfs", "stagefs,\ncaches on tmpfs", "tab:green"),
]


def plot_contended(results):
    path = results / "bench_contended.raw.csv"
    if not path.exists():
        return None
    by = defaultdict(list)
    for r in rows(path):
        by[r["variant"]].append(float(r["seconds"]))
    present = [c for c in CONTENDED if by.get(c[0])]
    base = statistics.median(by["baseline"]) if by.get("baseline") else None
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (variant, label, color) in enumerate(present):
        xs = by[variant]
        med = statistics.median(xs)
        ax.bar(i, med, color=color, alpha=0.75, width=0.6)
        ax.plot([i] * len(xs), xs, "k.", markersize=5)
        text = f"{med:.1f} s"
        if base and variant != "baseline":
            text += f"\n{base / med:.2f}x faster"
        ax.annotate(text, (i, med / 2), ha="center", va="center", fontsize=10, color="white", weight="bold")
    ax.set_xticks(range(len(present)))
    ax.set_xticklabels([c[1] for c in present])
    ax.set_ylabel("seconds until all 4 nodes have read the image")
    ax.set_ylim(0, max(max(by[c[0]]) for c in present) * 1.25)
    ax.set_title("4 nodes read one 1 GiB image from a source limited to 200 MB/s\n"
                 "(bars: median; dots: each round; ideal ratio: the node count, 4)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    out = results / "contended.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main():
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results"
    made = [p for p in (plot_scale(results), plot_contended(results)) if p]
    for p in made:
        print(p)
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
