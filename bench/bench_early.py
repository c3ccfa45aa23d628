#!/usr/bin/python3
"""Reads before the copy ends (--read-during-copy on) vs an open that
waits for the whole verified copy (off), on NP ranks-as-nodes (one mount namespace each,
tests/mount harness, mpirun on this machine, --chunk-size 16M).

Per round (fresh caches, page cache dropped before each test), one mount group per mode, the
modes alternating in order from round to round (on off, off on, ...):
  big   node 0 (the source rank) and node 3 open a SIZE_MB random file at the same time (a
        barrier releases both readers); each reader prints monotonic timestamps: open()
        started, open() returned, first 4 KiB read, last byte read (sequential 1 MiB reads).
        The "materialized big.bin ... in X s" line of every rank (mpirun's log, tailed with
        timestamps) gives the copy's own time.
  sqsh  node 1 (not the source rank): `squashfuse MNT/image.sqsh DIR` then `ls DIR`; time from
        the start of squashfuse to the end of ls, and whether the image's copy was still
        running at that moment (the mount's stats right after ls, and when the materialized
        line appeared). squashfuse is unmounted on node 1 before the group stops.
Targets: first byte within 2 chunk-times (chunk-time = 16 MiB / (size / full
materialization time), the full time being the open() of the off mode); time to the last
byte through the early open <= 1.1 x the full materialization; squashfuse + ls < 1 s while
the copy still runs.

Inputs are made once: SIZE_MB of AES-CTR keystream (openssl) as src/big.bin, and a squashfs
image (no compression) of SQ_FILES files of SQ_FILE_MB random bytes as src/image.sqsh.
Needs 4 x (SIZE_MB + image) MiB of /var/tmp per group. The stagefs binary is copied into the
work dir first (a rebuild elsewhere cannot swap it mid-run). Usage:
  bench_early.py BUILD_DIR [NP=4] [SIZE_MB=4096] [ROUNDS=3] [SQ_FILES=40] [SQ_FILE_MB=50]
"""
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

build = os.path.abspath(sys.argv[1])
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 4
size_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
sq_files = int(sys.argv[5]) if len(sys.argv) > 5 else 40
sq_file_mb = int(sys.argv[6]) if len(sys.argv) > 6 else 50
CHUNK_MB = 16
MiB = 1 << 20
NODES_BIG = (0, 3) if np_ > 3 else (0, np_ - 1)
NODE_SQ = 1 if np_ > 1 else 0
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

h = benchlib.enter(build)

# On a node: wait for the barrier line, then open, read 4 KiB, read on to the end in 1 MiB
# reads; 32-byte samples every 64 MiB for a check against the source afterwards.
READER = r"""
import json, os, sys, time
path = sys.argv[1]
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
fd = os.open(path, os.O_RDONLY)
t_open = time.monotonic()
first = os.pread(fd, 4096, 0)
t_first = time.monotonic()
buf = bytearray(1 << 20)
mv = memoryview(buf)
off, samples = 0, {}
while True:
    n = os.preadv(fd, [mv], off)
    if n <= 0:
        break
    if (off >> 20) % 64 == 0 and off % (1 << 20) == 0:
        samples[off] = bytes(mv[:32]).hex()
    off += n
t_last = time.monotonic()
os.close(fd)
print(json.dumps({"t0": t0, "open": t_open - t0, "first": t_first - t0, "last": t_last - t0,
                  "bytes": off, "first_ok": len(first), "samples": samples}), flush=True)
"""

# On a node: squashfuse IMG DIR, then ls DIR; the mount's stats right after.
SQ = r"""
import json, os, subprocess, sys, time
img, d, mnt, err = sys.argv[1:5]
t0 = time.monotonic()
with open(err, "w") as e:
    r = subprocess.run(["squashfuse", img, d], stdin=subprocess.DEVNULL, stdout=e, stderr=e)
t_mounted = time.monotonic()
ls = subprocess.run(["ls", d], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
t_ls = time.monotonic()
st = json.loads(os.getxattr(mnt, "user.stagefs.stats"))
print(json.dumps({"t0": t0, "mounted": t_mounted - t0, "ls": t_ls - t0, "t_ls": t_ls, "rc": r.returncode,
                  "ls_rc": ls.returncode, "entries": len(ls.stdout.split()), "transfer": st.get("transfer")}),
      flush=True)
"""

MAT_RE = re.compile(r"\[stagefs \S+ r(\d+)\] info: materialized (\S+) \((\d+) bytes\) in ([0-9.]+) s")


class LogWatch(threading.Thread):
    """Tails mpirun's log, stamping each line with time.monotonic() when it shows up."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.lines, self.lock, self.stop_ev = path, [], threading.Lock(), threading.Event()
        self.start()

    def run(self):
        pos, part = 0, b""
        while not self.stop_ev.is_set():
            try:
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    data = f.read()
            except OSError:
                data = b""
            if data:
                pos += len(data)
                now = time.monotonic()
                *full, part = (part + data).split(b"\n")
                with self.lock:
                    self.lines += [(now, ln.decode(errors="replace")) for ln in full]
            self.stop_ev.wait(0.01)

    def materialized(self, rel):
        with self.lock:
            out = []
            for t, ln in self.lines:
                m = MAT_RE.search(ln)
                if m and m.group(2) == rel:
                    out.append({"t": t, "rank": int(m.group(1)), "secs": float(m.group(4))})
            return out

    def wait_materialized(self, rel, n, timeout):
        return h.wait_for(lambda: (lambda m: m if len(m) >= n else None)(self.materialized(rel)),
                          timeout, "%d 'materialized %s' lines" % (n, rel))

    def close(self):
        self.stop_ev.set()
        self.join()


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def make_inputs(work):
    t = time.monotonic()
    key, iv = "00112233445566778899aabbccddeeff", "0102030405060708090a0b0c0d0e0f10"
    keystream = ["openssl", "enc", "-aes-128-ctr", "-K", key, "-iv", iv, "-in", "/dev/zero"]
    big = os.path.join(work.src, "big.bin")
    subprocess.run("%s 2>/dev/null | head -c %d > %s" % (" ".join(keystream), size_mb * MiB, big),
                   shell=True, check=True)
    assert os.path.getsize(big) == size_mb * MiB
    sqin = work.file("sqin")
    os.mkdir(sqin)
    ks = subprocess.Popen(["openssl", "enc", "-aes-128-ctr", "-K", key[::-1], "-iv", iv, "-in", "/dev/zero"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for i in range(sq_files):
        with open(os.path.join(sqin, "f%02d.bin" % i), "wb") as f:
            left = sq_file_mb * MiB
            while left:
                b = ks.stdout.read(min(left, 4 * MiB))
                f.write(b)
                left -= len(b)
    ks.kill()
    ks.wait()
    img = os.path.join(work.src, "image.sqsh")
    subprocess.run(["mksquashfs", sqin, img, "-noappend", "-noI", "-noD", "-noF", "-noX", "-no-progress",
                    "-processors", "2"], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(sqin)
    subprocess.run(["sync"], check=True)
    return time.monotonic() - t, os.path.getsize(img)


def check_samples(path, samples):
    with open(path, "rb") as f:
        for off, hx in samples.items():
            f.seek(int(off))
            if f.read(32).hex() != hx:
                return False
    return True


def big_test(g, lw, mode):
    """Both readers released together; returns {node: reader result} plus the copy's times."""
    path = os.path.join(g.mnt, "big.bin")
    procs = {k: g.spawn(k, [h.PYTHON, "-c", READER, path]) for k in NODES_BIG}
    for k, p in procs.items():
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise AssertionError("reader on node %d: %r %s" % (k, line, p.stderr.read()))
    for p in procs.values():
        p.stdin.write("\n")
        p.stdin.flush()
    res = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise AssertionError("reader on node %d exited %d: %s" % (k, p.returncode, err[-2000:]))
        res[k] = json.loads(out.strip().splitlines()[-1])
    mat = lw.wait_materialized("big.bin", np_, 600)
    t0 = min(r["t0"] for r in res.values())
    out = {"nodes": {}, "copy_s": max(m["secs"] for m in mat),
           "copy_logged_at": max(m["t"] for m in mat) - t0,
           "spread_ms": 1000 * (max(r["t0"] for r in res.values()) - t0)}
    src = os.path.join(g.src, "big.bin")
    for k, r in res.items():
        ok = r["bytes"] == size_mb * MiB and r["first_ok"] == 4096 and check_samples(src, r["samples"])
        if not ok:
            raise AssertionError("node %d read wrong data (%d bytes)" % (k, r["bytes"]))
        out["nodes"][k] = {x: r[x] for x in ("open", "first", "last")}
    return out


def sq_test(g, lw, work, mode):
    d = work.file("sq%d" % NODE_SQ)
    os.makedirs(d, exist_ok=True)
    img = os.path.join(g.mnt, "image.sqsh")
    mounted = False
    try:
        r = g.on(NODE_SQ, [h.PYTHON, "-c", SQ, img, d, g.mnt, work.file("squashfuse.err")], timeout=1800)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        mounted = res["rc"] == 0
        if res["rc"] != 0 or res["ls_rc"] != 0 or res["entries"] != sq_files:
            raise AssertionError("squashfuse/ls on node %d: %s %s" % (NODE_SQ, res, h.tail(work.file("squashfuse.err"))))
        mat = lw.wait_materialized("image.sqsh", np_, 600)
        mine = [m for m in mat if m["rank"] == NODE_SQ][0]
        tr = res["transfer"]
        running = bool(tr and tr.get("path") == "image.sqsh")
        return {"mounted": res["mounted"], "ls": res["ls"], "copy_s": max(m["secs"] for m in mat),
                "logged_after_ls_s": mine["t"] - res["t_ls"], "running_at_ls": running,
                "done_at_ls": (tr["bytes_done"] / tr["bytes_total"]) if running and tr["bytes_total"] else None}
    finally:
        if mounted:
            g.on(NODE_SQ, ["fusermount3", "-u", d], timeout=60)


def group_round(work, mode, r, log):
    for k in range(np_):
        shutil.rmtree(work.file("node%d" % k), ignore_errors=True)
    g = h.Group(work, np_, "--chunk-size", "%dM" % CHUNK_MB, "--read-during-copy", mode)
    lw = None
    try:
        g.wait_ready()
        lw = LogWatch(g.log_path)
        drop_caches()
        load_big = loadavg()
        big = big_test(g, lw, mode)
        big["load"] = load_big
        drop_caches()
        load_sq = loadavg()
        sq = sq_test(g, lw, work, mode)
        sq["load"] = load_sq
        log("round %d %-3s big: %s" % (r, mode, json.dumps(big)))
        log("round %d %-3s sqsh: %s" % (r, mode, json.dumps(sq)))
        return big, sq
    except BaseException:
        work.dump_logs()
        raise
    finally:
        if lw:
            lw.close()
        problems = g.close()
        if problems:
            log("group close: %s" % problems)
        for k in range(np_):
            shutil.rmtree(work.file("node%d" % k), ignore_errors=True)


def stats(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs, unit="s", p=3):
    m, lo, hi = stats(xs)
    return "%.*f %s (%.*f-%.*f)" % (p, m, unit, p, lo, p, hi)


def main():
    def log(msg):
        print(msg, flush=True)

    work = h.Work("bench-early")
    try:
        bindir = work.file("bin")
        os.mkdir(bindir)
        shutil.copy2(os.path.join(build, "tools", "stagefs"), os.path.join(bindir, "stagefs"))
        h.STAGEFS = os.path.join(bindir, "stagefs")
        version = subprocess.run([h.STAGEFS, "--version"], capture_output=True, text=True,
                                 check=True).stdout.strip()  # fails on a binary copied mid-link
        rev = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short",
                              "HEAD"], capture_output=True, text=True).stdout.strip()
        log("# %s UTC, git %s, stagefs %s, host %s, NP %d, big %d MiB, image %d x %d MiB, rounds %d, load %s" %
            (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), rev, version, socket.gethostname(), np_, size_mb,
             sq_files, sq_file_mb, rounds, loadavg()))
        gen_s, img_size = make_inputs(work)
        log("inputs made in %.1f s; image.sqsh %d bytes (%.0f MiB)" % (gen_s, img_size, img_size / MiB))
        res = {"on": [], "off": []}
        t_start = time.monotonic()
        for r in range(rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                res[mode].append(group_round(work, mode, r, log))
        log("measured in %.0f s; load at the end %s" % (time.monotonic() - t_start, loadavg()))

        on_big = [b for b, _ in res["on"]]
        off_big = [b for b, _ in res["off"]]
        on_sq = [s for _, s in res["on"]]
        off_sq = [s for _, s in res["off"]]
        # The full materialization alone: the open() of the off mode (per node; max of the two).
        full = [max(b["nodes"][k]["open"] for k in NODES_BIG) for b in off_big]
        full_med = statistics.median(full)
        chunk_time = full_med * CHUNK_MB / size_mb
        log("")
        log("## %d MiB file, nodes %s open together (median of %d, min-max)" % (size_mb, NODES_BIG, rounds))
        log("full materialization alone (off: open() duration, slower node): %s; its log line: %s" %
            (fmt(full), fmt([b["copy_s"] for b in off_big])))
        log("chunk-time = 16 MiB / (size / full) = %.3f s; target first byte <= 2 chunk-times = %.3f s" %
            (chunk_time, 2 * chunk_time))
        log("")
        log("| node | mode | open() returned | first 4 KiB | last byte | last byte / full (ratio of medians) |")
        log("|---|---|---|---|---|---|")
        for k in NODES_BIG:
            for mode, bl in (("on", on_big), ("off", off_big)):
                last = [b["nodes"][k]["last"] for b in bl]
                log("| %d | %s | %s | %s | %s | %.3f |" % (
                    k, mode, fmt([b["nodes"][k]["open"] for b in bl]), fmt([b["nodes"][k]["first"] for b in bl]),
                    fmt(last), statistics.median(last) / full_med))
        log("")
        log("on: first byte / chunk-time: %s" % ", ".join(
            "node %d %.2f" % (k, statistics.median([b["nodes"][k]["first"] for b in on_big]) / chunk_time)
            for k in NODES_BIG))
        log("on: the copy's own time (log line, slowest rank) %s vs off %s; opens sent %.1f ms apart at most" %
            (fmt([b["copy_s"] for b in on_big]), fmt([b["copy_s"] for b in off_big]),
             max(b["spread_ms"] for b in on_big + off_big)))
        log("off: read after the open (last - first): %s" % ", ".join(
            "node %d %s" % (k, fmt([b["nodes"][k]["last"] - b["nodes"][k]["first"] for b in off_big]))
            for k in NODES_BIG))
        log("per round last byte (on) / open (off, same node), round by round: %s" % "; ".join(
            "node %d %s" % (k, " ".join("%.3f" % (a["nodes"][k]["last"] / b["nodes"][k]["open"])
                                        for a, b in zip(on_big, off_big))) for k in NODES_BIG))
        log("per round the copy's own time (log) on / off: %s" % " ".join(
            "%.3f" % (a["copy_s"] / b["copy_s"]) for a, b in zip(on_big, off_big)))
        log("")
        log("## squashfuse + ls on node %d (image %.0f MiB, median of %d, min-max)" % (NODE_SQ, img_size / MiB,
                                                                                   rounds))
        log("")
        log("| mode | squashfuse returned | squashfuse + ls | image copy (log, slowest rank) | "
            "copy still running at ls end | copy logged after ls by |")
        log("|---|---|---|---|---|---|")
        for mode, sl in (("on", on_sq), ("off", off_sq)):
            log("| %s | %s | %s | %s | %d of %d | %s |" % (
                mode, fmt([s["mounted"] for s in sl]), fmt([s["ls"] for s in sl]), fmt([s["copy_s"] for s in sl]),
                sum(s["running_at_ls"] for s in sl), len(sl), fmt([s["logged_after_ls_s"] for s in sl])))
        log("")
        log("ls on / ls off = %.3f; ls on / image copy (on) = %.3f" % (
            statistics.median([s["ls"] for s in on_sq]) / statistics.median([s["ls"] for s in off_sq]),
            statistics.median([s["ls"] for s in on_sq]) / statistics.median([s["copy_s"] for s in on_sq])))
        log("fraction of the image copied when ls ended (on): %s" % [
            None if s["done_at_ls"] is None else round(s["done_at_ls"], 3) for s in on_sq])
        log("loads (1/5/15 min) per test: big %s; sqsh %s" % (
            [b["load"] for b in on_big + off_big], [s["load"] for s in on_sq + off_sq]))
        log("raw: " + json.dumps(res))
    finally:
        work.cleanup()


main()
