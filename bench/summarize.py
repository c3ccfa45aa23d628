#!/usr/bin/env python3
"""Summarize a bench/ raw CSV: medians per variant and ratios between variants.

Usage:
  summarize.py RAW.csv OUT.md --title TITLE --metric COL [--cols C1,C2] \
      [--ratio 'LABEL=VARIANT_A/VARIANT_B'] ... [--target 'LABEL<=1.0'] ... [--note TEXT] ...

RAW.csv: lines starting with '#' are comments; the first other line is the header; it must
have the columns 'round' and 'variant' (and, by convention, 'loadavg'). For every variant the
table shows n, median, min and max of --metric and the medians of --cols. A ratio is reported
two ways: median(A)/median(B), and the median over rounds of A_r/B_r (paired: both runs of a
round were interleaved, so they saw similar background load). --target LABEL<=X or LABEL>=X
marks the ratio as met/missed (judged on the ratio of medians). Prints the markdown and
writes it to OUT.md. Python stdlib only.
"""
import argparse
import csv
import statistics
import sys


def fnum(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--title", required=True)
    ap.add_argument("--metric", required=True)
    ap.add_argument("--unit", default="s")
    ap.add_argument("--cols", default="")
    ap.add_argument("--ratio", action="append", default=[])
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--append", action="store_true", help="append to OUT.md instead of replacing it")
    ap.add_argument("--only", default="", help="comma-separated variants to include (default: all)")
    a = ap.parse_args()

    comments, rows = [], []
    with open(a.raw) as f:
        lines = [ln for ln in f if ln.strip()]
    body = []
    for ln in lines:
        (comments if ln.startswith("#") else body).append(ln)
    only = [v for v in a.only.split(",") if v]
    for r in csv.DictReader(body):
        if not only or r["variant"] in only:
            rows.append(r)
    variants = []
    for r in rows:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    cols = [c for c in a.cols.split(",") if c]

    def vals(variant, col):
        return [v for v in (fnum(r.get(col)) for r in rows if r["variant"] == variant) if v is not None]

    def by_round(variant, col):
        return {r["round"]: fnum(r.get(col)) for r in rows if r["variant"] == variant and fnum(r.get(col)) is not None}

    out = [f"## {a.title}", ""]
    for c in comments:
        out.append(f"`{c.strip().lstrip('# ')}`  ")
    out.append("")
    hdr = ["variant", "n", f"median {a.metric} ({a.unit})", "min", "max"] + [f"median {c}" for c in cols]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    med = {}
    for v in variants:
        xs = vals(v, a.metric)
        if not xs:
            out.append(f"| {v} | 0 | (no successful run) | | |" + " |" * len(cols))
            continue
        med[v] = statistics.median(xs)
        extra = []
        for c in cols:
            cs = vals(v, c)
            extra.append(f"{statistics.median(cs):.3f}" if cs else "")
        out.append(f"| {v} | {len(xs)} | {med[v]:.3f} | {min(xs):.3f} | {max(xs):.3f} | " + " | ".join(extra) + (" |" if extra else ""))
    out.append("")

    targets = {}
    for t in a.target:
        for op in ("<=", ">="):
            if op in t:
                lab, x = t.split(op)
                targets[lab.strip()] = (op, float(x))
    if a.ratio:
        out.append("| ratio | median(A)/median(B) | median of per-round A/B | per-round | target | met? |")
        out.append("|---|---|---|---|---|---|")
        for spec in a.ratio:
            lab, expr = spec.split("=", 1)
            va, vb = expr.split("/")
            if va not in med or vb not in med:
                out.append(f"| {lab} ({va} / {vb}) | n/a | n/a | | | |")
                continue
            rm = med[va] / med[vb]
            ra, rb = by_round(va, a.metric), by_round(vb, a.metric)
            paired = [ra[k] / rb[k] for k in ra if k in rb and rb[k]]
            pm = statistics.median(paired) if paired else float("nan")
            tg, met = "", ""
            if lab in targets:
                op, x = targets[lab]
                tg = f"{op} {x:g}"
                met = "yes" if (rm <= x if op == "<=" else rm >= x) else "**no**"
            per = " ".join(f"{p:.2f}" for p in paired)
            out.append(f"| {lab} ({va} / {vb}) | {rm:.3f} | {pm:.3f} | {per} | {tg} | {met} |")
        out.append("")
    for n in a.note:
        out.append(n)
        out.append("")
    text = "\n".join(out)
    with open(a.out, "a" if a.append else "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
