#!/usr/bin/python3
"""Two (or more) stagefs builds alternated in one run (A B A B ...) on NP ranks-as-nodes (one
mount namespace and one cache each, tests/mount harness, mpirun on this machine), each round
with fresh caches and a fresh group per build:
  first open   node 0 opens a FILE_MB file no node holds and reads it whole: from the open to
               its last byte (the broadcast to every node included: the open returns when the
               copy may be read)
  dataset      every node tars a tree of FILES files of 4-64 KiB in DIRS directories at once
               (batches by directory): from the start to the last node's end
The builds' order alternates by round (A B, B A). Reports medians per build and, per round, each build's time over the first build's. A
refactor's check that nothing slowed: ratios near 1 on a shared machine mean "within noise".

Usage: bench_ab_group.py BUILD_A BUILD_B [...]   env: NP=4 FILE_MB=256 FILES=4000 DIRS=40
       RUNS=5 RESULTS=bench/results NAME=bench_ab_group
"""
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402


def env_int(name, default):
    return int(os.environ.get(name, str(default)))


def first_open(g, path):
    t0 = time.perf_counter()
    g.on(0, ["dd", "if=" + path, "of=/dev/null", "bs=1M", "status=none"], timeout=600)
    return time.perf_counter() - t0


def dataset(g, root):
    t0 = time.perf_counter()
    procs = [subprocess.Popen(g.nsenter(k) + benchlib.reader_cmd("tar", root), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for k in range(g.np)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError("tar failed: %s" % err.decode(errors="replace")[-300:])
    return time.perf_counter() - t0


def one_group(h, build, src, np_, measure):
    """A fresh work dir whose source is src (a symlink), a group of np_ ranks of build, one
    measurement, everything ended."""
    h.STAGEFS = os.path.join(build, "tools", "stagefs")
    work = h.Work("ab")
    os.rmdir(work.src)
    os.symlink(src, work.src)
    g = h.Group(work, np_)
    try:
        g.wait_ready()
        # The last measurement's copies are still being written back: settle that first, so
        # no build pays for the one before it.
        subprocess.run(["sync"], check=True)
        return measure(g, work.mnt)
    finally:
        problems = g.close()
        if problems:
            print("  (teardown: %s)" % problems[:1], file=sys.stderr)
        work.cleanup()


def main():
    builds = [os.path.abspath(b) for b in sys.argv[1:]]
    if len(builds) < 2:
        sys.exit(__doc__)
    h = benchlib.enter(builds[0])
    np_, file_mb, files, dirs, runs = (env_int("NP", 4), env_int("FILE_MB", 256), env_int("FILES", 4000),
                                       env_int("DIRS", 40), env_int("RUNS", 5))
    data = h.Work("ab-source")
    loadavg = open("/proc/loadavg").read().split()[:3]
    try:
        tree = os.path.join(data.src, "tree")
        benchlib.make_tree(tree, files, dirs)
        big = os.path.join(data.src, "big.bin")
        subprocess.run(["dd", "if=/dev/urandom", "of=" + big, "bs=1M", "count=%d" % file_mb, "status=none"],
                       check=True)
        subprocess.run(["chmod", "-R", "a+rX", data.src], check=True)
        points = {
            "first open": lambda g, mnt: first_open(g, os.path.join(mnt, "big.bin")),
            "dataset": lambda g, mnt: dataset(g, os.path.join(mnt, "tree")),
        }
        res = {(p, b): [] for p in points for b in builds}
        for r in range(runs):
            for p, fn in points.items():
                for b in (builds if r % 2 == 0 else builds[::-1]):  # A B, then B A: no build always first
                    s = one_group(h, b, data.src, np_, fn)
                    res[(p, b)].append(s)
                    print("round %d %-10s %s: %.3f s" % (r + 1, p, b, s), flush=True)
    finally:
        data.cleanup()
    lines = ["## Two builds alternated: a first open and a dataset on %d ranks-as-nodes" % np_, "",
             "`%s load=%s nproc=%d` builds: %s" % (time.strftime("%Y-%m-%dT%H:%M:%S"), " ".join(loadavg),
                                                  os.cpu_count(), ", ".join(builds)), "",
             "| point | build | n | median s | min | max | per-round ratio to the first build | median ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for p in points:
        base = res[(p, builds[0])]
        for b in builds:
            v = res[(p, b)]
            ratios = [x / y for x, y in zip(v, base)]
            lines.append("| %s | %s | %d | %.3f | %.3f | %.3f | %s | %.3f |" % (
                p, b, len(v), statistics.median(v), min(v), max(v), " ".join("%.2f" % x for x in ratios),
                statistics.median(ratios)))
    # A build that ran first in its round against the other that ran first (and second against
    # second): what the order of a round costs (the page cache, writeback) drops out.
    lines += ["", "| point | build | median s when first in its round | median s when second |", "|---|---|---|---|"]
    for p in points:
        for i, b in enumerate(builds):
            first = [v for r, v in enumerate(res[(p, b)]) if (r % 2 == 0) == (i == 0)]
            second = [v for r, v in enumerate(res[(p, b)]) if (r % 2 == 0) != (i == 0)]
            fmt = lambda xs: "%.3f (%d)" % (statistics.median(xs), len(xs)) if xs else "-"
            lines.append("| %s | %s | %s | %s |" % (p, b, fmt(first), fmt(second)))
    lines += ["", "first open: a %d MiB file opened and read whole on node 0 (dd bs=1M), no node holding it. "
              "dataset: %d files of 4-64 KiB in %d directories, tar'ed on every node at once. Source and "
              "caches on this machine's disk (the source in page cache for every build alike); a fresh group "
              "and fresh caches for every measurement." % (file_mb, files, dirs)]
    out = os.path.join(os.environ.get("RESULTS", os.path.join(HERE, "results")),
                       os.environ.get("NAME", "bench_ab_group") + ".md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("results: %s" % out)


if __name__ == "__main__":
    main()
