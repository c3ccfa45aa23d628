#!/usr/bin/python3
"""How fast a handle opened during the copy reads once the copy is complete
(the daemon serves it from the copy: FUSE READ requests), vs a handle opened afterwards
(kernel passthrough where it works, else splice), vs reading the cached copy directly.

One standalone mount; per round a fresh file of SIZE_MB: open it (returns during the copy),
wait until the transfer is done, drop the page cache, read it whole through the early
handle, through a new handle and the cache file directly (the order rotates per round; the
page cache dropped before each). 1 MiB reads. Reports medians of ROUNDS and the ratios.
Usage: bench_live_readpath.py BUILD_DIR [SIZE_MB=1024] [ROUNDS=3]"""
import os
import statistics
import subprocess
import sys
import time

build = os.path.abspath(sys.argv[1])
size_mb = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

h = benchlib.enter(build)
MiB = 1 << 20


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_fd(fd):
    t = time.monotonic()
    off = 0
    while True:
        n = len(os.pread(fd, MiB, off))
        if n == 0:
            break
        off += n
    return time.monotonic() - t, off


work = h.Work("bench-live-readpath")
d = None
res = {"early handle": [], "new handle": [], "cache file": []}
try:
    cache = work.file("cache")
    d = h.Daemon(work, cache)
    d.wait_ready()
    for r in range(rounds):
        name = "f%d" % r
        subprocess.run(["dd", "if=/dev/urandom", "of=%s/%s" % (work.src, name), "bs=1M", "count=%d" % size_mb,
                        "status=none"], check=True)
        early = os.open(os.path.join(d.mnt, name), os.O_RDONLY)
        h.wait_for(lambda: d.stats()["transfers"] == r + 1, 600, "the copy of %s" % name)
        assert d.stats()["opens_during_copy"] == r + 1, d.stats()
        order = ["early handle", "new handle", "cache file"]
        order = order[r % 3:] + order[:r % 3]  # each reader first once in 3 rounds
        for kind in order:
            drop_caches()
            if kind == "early handle":
                fd = early
            else:
                fd = os.open(os.path.join(d.mnt, name) if kind == "new handle" else os.path.join(cache, "data", name),
                             os.O_RDONLY)
            secs, n = read_fd(fd)
            assert n == size_mb * MiB
            res[kind].append(secs)
            if kind != "early handle":
                os.close(fd)
        os.close(early)
    s = d.stats()
    med = {k: statistics.median(v) for k, v in res.items()}
    print("## live read path: %d MiB, cold page cache, medians of %d (read path of new handles: %s)" %
          (size_mb, rounds, s["read_path"]))
    print()
    print("| reader | median s | MB/s | / cache file |")
    print("|---|---|---|---|")
    for k, v in med.items():
        print("| %s | %.2f | %.0f | %.2f |" % (k, v, size_mb * MiB / v / 1e6, v / med["cache file"]))
    print()
    print("raw:", {k: ["%.2f" % x for x in v] for k, v in res.items()})
finally:
    if d:
        d.stop()
    work.cleanup()
