#!/usr/bin/python3
"""Issue 11 item 4: does a small file wait behind a large transfer? NP ranks-as-nodes (one
mount namespace each, tests/mount harness). Per round, fresh files: the first open of a small
file alone; then the first open of a large file (SIZE_MB) on rank 0 and, once its transfer
is running (the coordinator's stats show it), the first open of a small file on rank 1.
Reports the small file's open time alone and behind the large transfer, and the large
transfer's time. Usage: bench_hol.py BUILD_DIR [NP=4] [SIZE_MB=512] [ROUNDS=3]"""
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
work = h.Work("bench-hol")
g = None
try:
    for r in range(rounds):
        subprocess.run(["dd", "if=/dev/urandom", "of=%s/big%d" % (work.src, r), "bs=1M",
                        "count=%d" % size_mb, "status=none"], check=True)
        for kind in ("alone", "behind"):
            d = os.path.join(work.src, "%s%d" % (kind, r))
            os.mkdir(d)
            with open(os.path.join(d, "small.bin"), "wb") as f:
                f.write(os.urandom(64 * 1024))
    g = h.Group(work, np_)
    g.wait_ready()
    res = {"alone": [], "behind": [], "big": []}
    for r in range(rounds):
        t = time.monotonic()
        g.on(1, [h.PYTHON, "-c", OPEN, os.path.join(g.mnt, "alone%d" % r, "small.bin")], timeout=600)
        res["alone"].append(time.monotonic() - t)

        big = {}

        def open_big():
            t0 = time.monotonic()
            g.on(0, [h.PYTHON, "-c", OPEN, os.path.join(g.mnt, "big%d" % r)], timeout=600)
            big["t"] = time.monotonic() - t0
        th = threading.Thread(target=open_big)
        th.start()
        deadline = time.monotonic() + 120
        while g.stats(0).get("transfer") is None and th.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)  # a bounded poll for the large transfer to be under way
        t = time.monotonic()
        g.on(1, [h.PYTHON, "-c", OPEN, os.path.join(g.mnt, "behind%d" % r, "small.bin")], timeout=600)
        res["behind"].append(time.monotonic() - t)
        th.join()
        res["big"].append(big.get("t", float("nan")))
    med = {k: statistics.median(v) for k, v in res.items()}
    print("| NP | large file | small open alone (s) | small open behind the large transfer (s) | "
          "large transfer (s) |")
    print("|---|---|---|---|---|")
    print("| %d | %d MiB | %.3f | %.3f | %.2f |" % (np_, size_mb, med["alone"], med["behind"], med["big"]))
    print("raw:", {k: ["%.3f" % x for x in v] for k, v in res.items()})
finally:
    if g:
        g.close()
    work.cleanup()
