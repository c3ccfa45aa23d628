#!/usr/bin/python3
"""Does a small file wait behind a large transfer? NP ranks-as-nodes (one
mount namespace each, tests/mount harness), one group with --nested-batches on and one with
off, in the same run. Per round, fresh files: the first open of a small file alone; then a
read of a whole large file (SIZE_MB) on rank 0 and, once its transfer is under way (rank 0's
status shows it), the first open of a small file of another directory on rank 1 (a batch).
Reports the small file's open time alone and behind the large transfer, the large file's
read time on node 0 (with the batch in it) and the large transfer's end on every node (a
round starts once the previous one's transfers ended everywhere), and the bytes each node's transfers streamed (the
chain: each node receives and passes on each byte once; a nested batch adds no bytes).
Usage: bench_hol.py BUILD_DIR [NP=4] [SIZE_MB=512] [ROUNDS=3]"""
import os
import statistics
import subprocess
import sys
import threading
import time

build = os.path.abspath(sys.argv[1])
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 4
size_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 512
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

h = benchlib.enter(build)
OPEN = "import sys; open(sys.argv[1], 'rb').close()"
READ = "import sys\nwith open(sys.argv[1], 'rb') as f:\n    while f.read(1 << 20): pass"


def run_mode(work, mode):
    for r in range(rounds):
        subprocess.run(["dd", "if=/dev/urandom", "of=%s/big-%s%d" % (work.src, mode, r), "bs=1M",
                        "count=%d" % size_mb, "status=none"], check=True)
        for kind in ("alone", "behind"):
            d = os.path.join(work.src, "%s-%s%d" % (kind, mode, r))
            os.mkdir(d)
            with open(os.path.join(d, "small.bin"), "wb") as f:
                f.write(os.urandom(64 * 1024))
    g = h.Group(work, np_, "--nested-batches", mode)
    try:
        g.wait_ready()
        res = {"alone": [], "behind": [], "big": [], "transfer": []}
        for r in range(rounds):
            t = time.monotonic()
            g.on(1, [h.PYTHON, "-c", OPEN, os.path.join(g.mnt, "alone-%s%d" % (mode, r), "small.bin")], timeout=600)
            res["alone"].append(time.monotonic() - t)
            big = {}

            def read_big():
                t0 = big["t0"] = time.monotonic()
                g.on(0, [h.PYTHON, "-c", READ, os.path.join(g.mnt, "big-%s%d" % (mode, r))], timeout=900)
                big["t"] = time.monotonic() - t0
            th = threading.Thread(target=read_big)
            th.start()
            deadline = time.monotonic() + 120
            while g.stats(0).get("transfer") is None and th.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)  # a bounded poll for the large transfer to be under way
            t = time.monotonic()
            g.on(1, [h.PYTHON, "-c", OPEN, os.path.join(g.mnt, "behind-%s%d" % (mode, r), "small.bin")], timeout=900)
            res["behind"].append(time.monotonic() - t)
            th.join()
            # The large transfer ends after node 0's read (the other nodes, the sync and the
            # rename): every node has run 3 transfers per round (two batches and the file)
            # before the next round starts, so no round waits for the one before.
            for k in range(np_):
                g.wait_transfers(k, 3 * (r + 1), timeout=900)
            res["big"].append(big.get("t", float("nan")))
            res["transfer"].append(time.monotonic() - big["t0"])
        stats = [g.stats(k) for k in range(np_)]
        return res, stats
    finally:
        g.close()


work = h.Work("bench-hol")
try:
    out = {}
    for mode in ("on", "off"):
        out[mode] = run_mode(work, mode)
    print("| --nested-batches | NP | large file | small open alone (s) | small open during the large "
          "transfer (s) | ratio | large file read on node 0 (s) | large transfer on every node (s) | "
          "nested batches | MiB streamed, per node |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in ("on", "off"):
        res, stats = out[mode]
        med = {k: statistics.median(v) for k, v in res.items()}
        sent = " / ".join("%.0f" % (s["bytes_broadcast"] / 2**20) for s in stats)
        print("| %s | %d | %d MiB | %.3f | %.3f | %.1fx | %.2f | %.2f | %d | %s |" % (
            mode, np_, size_mb, med["alone"], med["behind"], med["behind"] / med["alone"], med["big"], med["transfer"],
            stats[0].get("nested_batches", 0), sent))
    for mode in ("on", "off"):
        print("raw %s:" % mode, {k: ["%.3f" % x for x in v] for k, v in out[mode][0].items()})
finally:
    work.cleanup()
