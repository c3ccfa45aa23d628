#!/usr/bin/python3
"""Warm opens of a cached file 10 directories deep, through a standalone mount, for one or
more stagefs builds alternated in the same run (A B A B ...): a Python loop of N open/close
(default 10,000) run as an unprivileged user (the daemon checks a non-root caller's access
on the source at every open) and as root (no check), reported as opens/s (medians of RUNS),
with the daemon's CPU time per open of the user's loop (steadier than wall time on a shared
machine).

Usage: bench_warm_open.py BUILD [BUILD2 ...]     env: N=10000 RUNS=5 DEPTH=10 RESULTS=bench/results
Writes RESULTS/bench_warm_open.md. Run as root; needs setpriv and fusermount3.
"""
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

LOOP = r"""
import os, sys, time
p, n = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
for _ in range(n):
    os.close(os.open(p, os.O_RDONLY))
print(n / (time.perf_counter() - t0))
"""


def opens_per_s(h, path, n, as_nobody):
    pre = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] if as_nobody else []
    r = h.run(pre + [sys.executable, "-c", LOOP, path, str(n)], cwd="/", timeout=600)
    return float(r.stdout.strip())


def main():
    builds = [os.path.abspath(b) for b in sys.argv[1:]]
    if not builds:
        sys.exit(__doc__)
    h = benchlib.enter(builds[0])
    n = int(os.environ.get("N", "10000"))
    runs = int(os.environ.get("RUNS", "5"))
    depth = int(os.environ.get("DEPTH", "10"))
    pwd.getpwuid(65534)
    work = h.Work("warm-open")
    results = {(b, who): [] for b in builds for who in ("user", "root")}
    cpu = {b: [] for b in builds}  # the daemon's CPU microseconds per open of the unprivileged user
    loadavg = open("/proc/loadavg").read().split()[:3]
    try:
        rel = os.path.join(*["d%d" % i for i in range(depth)], "f")
        with_dirs = os.path.join(work.src, os.path.dirname(rel))
        os.makedirs(with_dirs)
        with open(os.path.join(work.src, rel), "wb") as f:
            f.write(os.urandom(4096))
        os.chmod(os.path.join(work.src, rel), 0o644)
        for d in [work.src] + [os.path.join(work.src, *rel.split("/")[:k]) for k in range(1, depth + 1)]:
            os.chmod(d, 0o755)
        for r in range(runs):
            for b in builds:
                h.STAGEFS = os.path.join(b, "tools", "stagefs")
                cache = work.file("cache-%d" % builds.index(b))
                d = h.Daemon(work, cache)
                try:
                    d.wait_ready()
                    p = os.path.join(work.mnt, rel)
                    with open(p, "rb") as f:  # cached now
                        f.read()
                    c0 = benchlib.cpu_seconds([d.pid])
                    results[(b, "user")].append(opens_per_s(h, p, n, True))
                    cpu[b].append((benchlib.cpu_seconds([d.pid]) - c0) * 1e6 / n)
                    results[(b, "root")].append(opens_per_s(h, p, n, False))
                finally:
                    d.stop()
                h.log("run %d %s: user %.0f/s root %.0f/s" % (r, b, results[(b, "user")][-1],
                                                           results[(b, "root")][-1]))
    finally:
        work.cleanup()
    out_dir = os.environ.get("RESULTS", os.path.join(HERE, "results"))
    os.makedirs(out_dir, exist_ok=True)
    lines = ["# Warm opens of a cached file %d directories deep (standalone mount)" % depth, "",
             "%d open/close per run, %d runs alternated, medians (opens/s); load average at start: %s; %s" %
             (n, runs, " ".join(loadavg), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())), "",
             "| build | unprivileged user (opens/s) | daemon CPU per user open (us) | root (opens/s) |",
             "|---|---|---|---|"]
    for b in builds:
        u, rt = results[(b, "user")], results[(b, "root")]
        lines.append("| %s | %.0f (min %.0f, max %.0f) | %.1f | %.0f |" % (
            b, statistics.median(u), min(u), max(u), statistics.median(cpu[b]), statistics.median(rt)))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "bench_warm_open.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
