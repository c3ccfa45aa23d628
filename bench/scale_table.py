#!/usr/bin/env python3
"""Tables for bench_scale.sh: scale_table.py RAW.csv [MD]

Prints the measurement tables (markdown). With MD, writes them to MD, keeping whatever MD holds
after a line '<!-- analysis -->' (the hand-written model and projection survive a re-run).
"""
import csv
import math
import sys

MARK = "<!-- analysis -->"


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return math.nan


def fmt(v, d=2):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"


def main():
    raw = sys.argv[1]
    lines = open(raw).read().splitlines()
    head = [l for l in lines if l.startswith("#")]
    rows = list(csv.DictReader([l for l in lines if not l.startswith("#")]))
    out = []
    out.append("# bench_scale: staging time against the node count (netns cluster, shaped links)\n")
    out.append(f"Produced by `bench/bench_scale.sh` (raw runs: `bench/results/{raw.split('/')[-1]}`).")
    for h in head:
        out.append(f"Run: `{h.lstrip('# ')}`")
    if rows:
        r0 = rows[0]
        out.append(f"\nFile {int(r0['bytes']) / 2**20:.0f} MiB, every link shaped to {r0['rate']} both ways, "
                   "one rank per simulated node, source = node 1. T = wall time of the command (mpirun "
                   "start to end for stage-bcast, so it includes MPI start-up; first-open read time for "
                   "stagefs; download time for pull). Sent = bytes out of a node's eth0 / file size.\n")
    variants = []
    for r in rows:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    # Repeated runs (APPEND=1) of one variant and N: the run with the median wall time (the
    # lower middle for an even count) stands for all of them; the table says how many.
    groups = {}
    for r in rows:
        groups.setdefault((r["variant"], int(r["nodes"])), []).append(r)
    by = {k: sorted(g, key=lambda r: num(r["wall_s"]))[(len(g) - 1) // 2] for k, g in groups.items()}
    runs = {k: len(g) for k, g in groups.items()}
    nodes = sorted({int(r["nodes"]) for r in rows})

    out.append("## Time T(N) in seconds, and T(N)/T(2)\n")
    out.append("| variant | " + " | ".join(f"N={n}" for n in nodes) + " | T(max N)/T(2) |")
    out.append("|---|" + "---|" * (len(nodes) + 1))
    for v in variants:
        cells = []
        t2 = num(by[(v, 2)]["wall_s"]) if (v, 2) in by else math.nan
        for n in nodes:
            r = by.get((v, n))
            if r is None:
                cells.append("")
                continue
            t = num(r["wall_s"])
            bad = "" if r["ok"] == "1" else " (FAILED)"
            ratio = f" ({t / t2:.2f}x)" if not math.isnan(t2) and n != 2 and t2 > 0 else ""
            many = f" [{runs[(v, n)]} runs]" if runs[(v, n)] > 1 else ""
            cells.append(f"{fmt(t)}{ratio}{bad}{many}")
        last = by.get((v, nodes[-1]))
        tail = fmt(num(last["wall_s"]) / t2) if last is not None and t2 > 0 else "-"
        out.append(f"| {v} | " + " | ".join(cells) + f" | {tail} |")

    out.append("\n## stage-bcast's own timing (seconds, after MPI start-up): total / copy phase\n")
    out.append("| variant | " + " | ".join(f"N={n}" for n in nodes) + " |")
    out.append("|---|" + "---|" * len(nodes))
    for v in variants:
        if not v.startswith("sb-"):
            continue
        cells = []
        for n in nodes:
            r = by.get((v, n))
            cells.append("" if r is None else f"{fmt(num(r['tool_total_s']))} / {fmt(num(r['tool_copy_s']))}")
        out.append(f"| {v} | " + " | ".join(cells) + " |")

    out.append("\n## Bytes sent / file size: source node (node 1) / busiest node / all nodes together\n")
    out.append("| variant | " + " | ".join(f"N={n}" for n in nodes) + " |")
    out.append("|---|" + "---|" * len(nodes))
    for v in variants:
        cells = []
        for n in nodes:
            r = by.get((v, n))
            cells.append("" if r is None else
                         f"{fmt(num(r['src_sent_x']))} / {fmt(num(r['max_sent_x']))} / {fmt(num(r['sum_sent_x']))}")
        out.append(f"| {v} | " + " | ".join(cells) + " |")

    out.append("\n## CPU seconds per rank (user+sys): source rank / busiest rank / mean\n")
    out.append("| variant | " + " | ".join(f"N={n}" for n in nodes) + " |")
    out.append("|---|" + "---|" * len(nodes))
    for v in variants:
        if not v.startswith("sb-"):
            continue
        cells = []
        for n in nodes:
            r = by.get((v, n))
            cells.append("" if r is None else
                         f"{fmt(num(r['cpu_src_s']))} / {fmt(num(r['cpu_max_s']))} / {fmt(num(r['cpu_mean_s']))}")
        out.append(f"| {v} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if len(sys.argv) > 2:
        keep = ""
        try:
            old = open(sys.argv[2]).read()
            if MARK in old:
                keep = old[old.index(MARK):]
        except OSError:
            pass
        with open(sys.argv[2], "w") as f:
            f.write(text + ("\n" + keep if keep else ""))


if __name__ == "__main__":
    main()
