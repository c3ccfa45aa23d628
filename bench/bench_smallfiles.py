#!/usr/bin/python3
"""A dataset of many small files read by NP ranks-as-nodes, each with its
own stagefs mount (one mount namespace per rank, tests/mount harness, mpirun on this machine).

Tree: FILES files of 4-64 KiB (random sizes and bytes, seed 11) in DIRS directories.
Readers: `tar cf - . | wc -c` (tar skips reading when its archive is /dev/null itself) and a
Python loop with 8 threads (os.walk, then open+read of every file).
Points, each reader, wall time until every rank finished:
  source x1      one process reading the tree from the source once (the yardstick)
  source xNP     NP processes at once reading the source directly
  stagefs        NP ranks, fresh caches, default --small-file-size (1M): batches by directory
  stagefs warm   the same mounts again (every file cached)
  no walks       the same as stagefs with --prefetch-siblings off: only the directories
                 opens ask for are staged (the behaviour before walks), cold only, same run
  synced         the same as stagefs with --sync-after 0: every batch synced before its files
                 appear (the behaviour before the unsynced log), same run
  old            --small-file-size 0 (one collective per file) on the first OLD_DIRS directories
                 only (a 20,000-file run at the old rate takes minutes), with stagefs on the
                 same subset for a same-run ratio
Each group point also prints the CPU seconds its daemons used in the cold pass, summed over
the ranks (steadier than wall time on a shared machine), and the threads they started
meanwhile (with perf).
Then, contended (CONTENDED_MBS, default 100; 0: skipped), as bench_contended.sh: the tree on
a source whose reads are limited to CONTENDED_MBS MB/s in total (ext4 on a loop device with
direct I/O, blkio cgroup), page cache dropped before each point, cold only:
  source x1      one process reading the tree once
  source xNP     NP processes, each reading a copy of its own (simulated nodes share one page
                 cache: readers of one copy would read the device once between them)
  stagefs        NP ranks, fresh caches: rank 0 reads the source once
  no walks       the same with --prefetch-siblings off
The first points use a source warm in the page cache (it was just written). Source and caches
live on a fresh journaled ext4 on a loop device, as on a node's NVMe (CACHE_FS=root: on
/var/tmp, this machine's root filesystem, an ext4 without a journal).
NODE_CPUS=C gives each rank-as-node (its daemon and its reader) C CPUs of its own (a cpu
cgroup quota, benchlib.NodeCpus), and the one-node yardstick (source x1) the same C: with
NP * C = the machine's cores, NP nodes are compared with one node as on a cluster, where
each node has its own cores. Unset (0): every process shares all cores. UNCONTENDED=0 skips
the warm-source points (the contended ones only). Usage:
  [CACHE_FS=ext4|root] [CONTENDED_MBS=100] [NODE_CPUS=0] [UNCONTENDED=1]
      bench_smallfiles.py BUILD_DIR [NP=4] [FILES=20000] [DIRS=100] [OLD_DIRS=10]
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

build = os.path.abspath(sys.argv[1])
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 4
nfiles = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
ndirs = int(sys.argv[4]) if len(sys.argv) > 4 else 100
old_dirs = int(sys.argv[5]) if len(sys.argv) > 5 else 10
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

h = benchlib.enter(build)
cache_fs = os.environ.get("CACHE_FS", "ext4")
contended_mbs = int(os.environ.get("CONTENDED_MBS", "100"))
remove_fs = benchlib.journaled_ext4() if cache_fs == "ext4" else (lambda: None)
node_cpus = float(os.environ.get("NODE_CPUS", "0"))
uncontended = os.environ.get("UNCONTENDED", "1") != "0"
cpus = benchlib.NodeCpus(np_, node_cpus)

def reader_cmd(kind, root):
    return benchlib.reader_cmd(kind, root, h.PYTHON)


def make_tree(src):
    return benchlib.make_tree(src, nfiles, ndirs)


def timed_parallel(cmds):
    """Runs the commands at once; wall time until all finished, and their outputs."""
    out = [None] * len(cmds)

    def one(i):
        out[i] = h.run(cmds[i], timeout=3600)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cmds))]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.monotonic() - t, [o.stdout.strip() for o in out]


def group_point(work, kind, args, src_note, warm=True):
    """A fresh group (fresh caches), every rank runs the reader on its mount at once; then the
    same again warm (unless warm=False). Returns (cold s, warm s, stats of rank 0); the
    daemons' CPU seconds of the cold pass go in the stats as "cold_cpu"."""
    for k in range(np_):
        shutil.rmtree(work.file("node%d" % k), ignore_errors=True)
    g = h.Group(work, np_, *args)
    try:
        g.wait_ready(timeout=120)
        for k in range(np_):
            cpus.join(k, g.pids[k])
        cpu0 = benchlib.cpu_seconds(g.pids)
        starts = benchlib.ThreadStarts(g.pids, work.file("threads.txt"))
        cold, outs = timed_parallel([g.nsenter(k) + cpus.wrap(k, reader_cmd(kind, g.mnt)) for k in range(np_)])
        cold_cpu = benchlib.cpu_seconds(g.pids) - cpu0
        cold_threads = starts.stop()
        warm, outs2 = (timed_parallel([g.nsenter(k) + cpus.wrap(k, reader_cmd(kind, g.mnt)) for k in range(np_)])
                       if warm else (0.0, []))
        stats = [g.stats(k) for k in range(np_)]
        print("  %-6s %-26s cold %7.2f s  warm %6.2f s  daemons' CPU (cold, all ranks) %6.2f s  threads started"
              " %s  transfers %s  outputs %s" % (kind, src_note, cold, warm, cold_cpu, cold_threads,
                                                 [s["transfers"] for s in stats], sorted(set(outs + outs2))),
              flush=True)
        stats[0]["cold_cpu"] = cold_cpu
        return cold, warm, stats[0]
    finally:
        problems = g.close()
        if problems:
            print("  group close:", problems, flush=True)


work = h.Work("bench-smallfiles")
res = {}
try:
    full = work.src
    total = make_tree(full)
    # The old-behaviour subset: the first old_dirs directories, in a source of their own.
    subset = work.file("subset")
    os.mkdir(subset)
    sub_files = 0
    for d in range(old_dirs):
        shutil.copytree(os.path.join(full, "d%03d" % d), os.path.join(subset, "d%03d" % d))
        sub_files += len(os.listdir(os.path.join(subset, "d%03d" % d)))
    subprocess.run(["sync"], check=True)  # the tree's writeback before the first point, not during it
    print("tree: %d files, %d bytes, %d dirs; subset %d files in %d dirs; NP %d; cache fs %s; CPUs per node %s;"
          " load %s; %s" %
          (nfiles, total, ndirs, sub_files, old_dirs, np_, cache_fs, node_cpus or "all (shared)",
           open("/proc/loadavg").read().split()[0], time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())),
          flush=True)
    # Not reported: the first group pass on the fresh filesystem came out 25-40 % slower than
    # the same pass later in the run (more writes: the filesystem's first use of its block
    # groups), whichever variant ran first; this pass takes that cost.
    group_point(work, "tar", [], "warm-up pass (not reported)", warm=False)
    for kind in ("tar", "py8") if uncontended else ():
        r = {}
        r["source_x1"], _ = timed_parallel([cpus.wrap(0, reader_cmd(kind, full))])
        r["source_xnp"], _ = timed_parallel([cpus.wrap(k, reader_cmd(kind, full)) for k in range(np_)])
        print("  %-6s source x1 %.2f s, source x%d %.2f s" % (kind, r["source_x1"], np_, r["source_xnp"]), flush=True)
        r["stagefs"], r["stagefs_warm"], r["stats"] = group_point(work, kind, [], "stagefs (batches), full")
        r["stagefs_cpu"] = r["stats"]["cold_cpu"]
        r["synced"], _, _ = group_point(work, kind, ["--sync-after", "0"], "--sync-after 0, full")
        r["nowalk"], _, _ = group_point(work, kind, ["--prefetch-siblings", "off"], "no walks, full", warm=False)
        # Same-run subset: batches vs one collective per file.
        work.src = subset
        r["sub_source_x1"], _ = timed_parallel([cpus.wrap(0, reader_cmd(kind, subset))])
        r["sub_stagefs"], _, sub_stats = group_point(work, kind, [], "stagefs (batches), subset")
        r["sub_old"], _, r["old_stats"] = group_point(work, kind, ["--small-file-size", "0"], "old (0), subset")
        r["sub_stagefs_cpu"], r["sub_old_cpu"] = sub_stats["cold_cpu"], r["old_stats"]["cold_cpu"]
        work.src = full
        res[kind] = r
    if res:
        print()
        print("| reader | source x1 | source x%d | stagefs x%d cold | --prefetch-siblings off | --sync-after 0 | warm |"
              " stagefs / source x1 |"
              " / source x%d | subset (%d files): source x1 | stagefs | old (--small-file-size 0) | old / stagefs |"
              " old, whole tree (est.) / stagefs |" % (np_, np_, np_, sub_files))
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for kind, r in res.items():
            print("| %s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.1fx | %.1fx | %.2f s | %.2f s | %.2f s (%.1f ms/file)"
                  " | %.1fx | %.1fx |" %
                  (kind, r["source_x1"], r["source_xnp"], r["stagefs"], r["nowalk"], r["synced"], r["stagefs_warm"],
                   r["stagefs"] / r["source_x1"], r["stagefs"] / r["source_xnp"], r["sub_source_x1"], r["sub_stagefs"],
                   r["sub_old"], 1000 * r["sub_old"] / sub_files, r["sub_old"] / r["sub_stagefs"],
                   r["sub_old"] * nfiles / sub_files / r["stagefs"]))
    contended = {}
    if contended_mbs > 0:
        thr, remove_thr = benchlib.throttled_fs("%dG" % max(4, (total * (np_ + 2)) // (1 << 30) + 2), contended_mbs)
        try:
            for k in range(np_):
                shutil.copytree(full, os.path.join(thr, "node%d" % k))
            shutil.copytree(full, os.path.join(thr, "src"))
            print("contended source: reads limited to %d MB/s in total; load %s" %
                  (contended_mbs, open("/proc/loadavg").read().split()[0]), flush=True)
            work.src = os.path.join(thr, "src")
            for kind in ("tar", "py8"):
                c = {}
                benchlib.drop_caches()
                c["source_x1"], _ = timed_parallel([cpus.wrap(0, reader_cmd(kind, os.path.join(thr, "node0")))])
                benchlib.drop_caches()
                c["source_xnp"], _ = timed_parallel([cpus.wrap(k, reader_cmd(kind, os.path.join(thr, "node%d" % k)))
                                                     for k in range(np_)])
                benchlib.drop_caches()
                c["stagefs"], _, _ = group_point(work, kind, [], "contended, stagefs", warm=False)
                benchlib.drop_caches()
                c["nowalk"], _, _ = group_point(work, kind, ["--prefetch-siblings", "off"], "contended, no walks",
                                                warm=False)
                print("  %-6s contended: source x1 %.2f s, source x%d %.2f s, stagefs x%d %.2f s (no walks %.2f s)" %
                      (kind, c["source_x1"], np_, c["source_xnp"], np_, c["stagefs"], c["nowalk"]), flush=True)
                contended[kind] = c
        finally:
            work.src = full
            remove_thr()
        print()
        print("| contended (%d MB/s) | source x1 | source x%d (each its own copy) | stagefs x%d | no walks |"
              " stagefs / source x1 | no walks / source x1 | stagefs / source x%d |" % (contended_mbs, np_, np_, np_))
        print("|---|---|---|---|---|---|---|---|")
        for kind, c in contended.items():
            print("| %s | %.2f s | %.2f s | %.2f s | %.2f s | %.2fx | %.2fx | %.2fx |" %
                  (kind, c["source_x1"], c["source_xnp"], c["stagefs"], c["nowalk"], c["stagefs"] / c["source_x1"],
                   c["nowalk"] / c["source_x1"], c["stagefs"] / c["source_xnp"]))
    print()
    print("raw:", json.dumps({k: {x: y for x, y in v.items() if "stats" not in x} for k, v in res.items()}),
          json.dumps(contended))
finally:
    work.cleanup()
    cpus.remove()
    remove_fs()
