#!/usr/bin/python3
"""`stagectl prefetch` of an image on NP ranks-as-nodes (one mount
namespace each, tests/mount harness) vs the same materialization triggered by an open.
Alternates the two, ROUNDS times each, a fresh file of SIZE_MB every time; reports medians
and their ratio. Usage: bench_prefetch.py BUILD_DIR [NP=4] [SIZE_MB=1024] [ROUNDS=3]"""
import os
import statistics
import subprocess
import sys
import time

build = os.path.abspath(sys.argv[1])
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 4
size_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

h = benchlib.enter(build)
stagectl = os.path.join(build, "tools", "stagectl")
work = h.Work("bench-prefetch")
g = None
try:
    for r in range(rounds):
        for kind in ("prefetch", "open"):
            subprocess.run(["dd", "if=/dev/urandom", "of=%s/%s%d" % (work.src, kind, r), "bs=1M",
                            "count=%d" % size_mb, "status=none"], check=True)
    g = h.Group(work, np_)
    g.wait_ready()
    res = {"prefetch": [], "open": []}
    for r in range(rounds):
        for kind in ("prefetch", "open"):
            path = os.path.join(g.mnt, "%s%d" % (kind, r))
            cmd = [stagectl, "prefetch", g.mnt, path] if kind == "prefetch" else \
                [h.PYTHON, "-c", "import sys; open(sys.argv[1], 'rb').close()", path]
            t = time.monotonic()
            g.on(0, cmd, timeout=600)
            res[kind].append(time.monotonic() - t)
    p, o = statistics.median(res["prefetch"]), statistics.median(res["open"])
    print("| NP | size | prefetch s (median of %d) | open s | prefetch/open |" % rounds)
    print("|---|---|---|---|---|")
    print("| %d | %d MiB | %.2f | %.2f | %.2f |" % (np_, size_mb, p, o, p / o))
    print("raw:", {k: ["%.2f" % x for x in v] for k, v in res.items()})
finally:
    if g:
        g.close()
    work.cleanup()
