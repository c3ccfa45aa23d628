#!/usr/bin/python3
"""What a pass over a dataset costs the daemons, build against build: NP ranks-as-nodes (one
mount namespace each, tests/mount harness), a fresh cache per round, every rank reading the
whole tree at once, cold (the copies are made) then warm (every file cached). For each pass:
wall time, the daemons' CPU seconds summed over the ranks, and the threads they started
(perf stat, task:task_newtask). Rounds alternate the builds, so both see the same machine.
Written for the FUSE worker pool: with libfuse keeping only 4 idle workers, parallel readers
made the daemons start and end a thread for a good share of their requests.
Tree: FILES files of 4-64 KiB in DIRS directories (benchlib.make_tree), on a fresh journaled
ext4 on a loop device (benchlib.journaled_ext4), as bench_smallfiles.py.
Usage: bench_threads.py BUILD_A [BUILD_B] [NP=2] [ROUNDS=2] [FILES=20000] [DIRS=100]
  READERS="tar py8" (tar of the tree; a Python loop with 8 threads). EXTRA: stagefs options."""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

args = sys.argv[1:]
builds = [os.path.abspath(a) for a in args if os.path.isdir(a)]
nums = [int(a) for a in args if a.isdigit()]
np_, rounds, nfiles, ndirs = (nums + [2, 2, 20000, 100][len(nums):])[:4]
h = benchlib.enter(builds[0])
remove_fs = benchlib.journaled_ext4()
readers = os.environ.get("READERS", "tar py8").split()
extra = os.environ.get("EXTRA", "").split()


def one_pass(g, kind, out):
    """Every rank reads the tree at once: (wall s, daemons' CPU s, threads started)."""
    c0 = benchlib.cpu_seconds(g.pids)
    starts = benchlib.ThreadStarts(g.pids, out)
    t = time.monotonic()
    procs = [subprocess.Popen(g.nsenter(k) + benchlib.reader_cmd(kind, g.mnt, h.PYTHON), stdout=subprocess.PIPE)
             for k in range(np_)]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    wall = time.monotonic() - t
    threads = starts.stop()
    if any(p.returncode for p in procs) or len(set(outs)) != 1:
        raise AssertionError("readers failed or disagree: %s" % outs)
    return wall, benchlib.cpu_seconds(g.pids) - c0, threads


work = h.Work("bench-threads")
rows = []
try:
    total = benchlib.make_tree(work.src, nfiles, ndirs)
    subprocess.run(["sync"], check=True)
    print("tree: %d files, %d bytes, %d dirs; NP %d; load %s; %s" %
          (nfiles, total, ndirs, np_, open("/proc/loadavg").read().split()[0],
           time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())), flush=True)
    for rnd in range(rounds):
        for kind in readers:
            for b in builds:
                h.STAGEFS = os.path.join(b, "tools", "stagefs")
                for k in range(np_):
                    shutil.rmtree(work.file("node%d" % k), ignore_errors=True)
                g = h.Group(work, np_, *extra)
                try:
                    g.wait_ready(timeout=120)
                    cold = one_pass(g, kind, work.file("threads.txt"))
                    warm = one_pass(g, kind, work.file("threads.txt"))
                finally:
                    problems = g.close()
                    if problems:
                        print("  group close:", problems, flush=True)
                rows.append((b, kind, cold, warm))
                print("  round %d %-4s %-30s cold %6.2f s CPU %6.2f s threads %5s | warm %6.2f s CPU %5.2f s threads %5s"
                      % ((rnd, kind, b[-30:]) + cold + warm), flush=True)
finally:
    work.cleanup()
    remove_fs()
