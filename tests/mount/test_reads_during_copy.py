#!/usr/bin/python3
"""Reads before the copy ends (ctest label "mount").

Usage: test_reads_during_copy.py STAGEFS [NP [MPIRUN ARGS...]] [-- UNITTEST ARGS (classes)]

The copy is held at a known point instead of throttled by time: STAGE_TEST_HOLD=mid-file
with STAGE_TEST_HOLD_BLOCK=1 stops the source rank's writer thread after its second chunk
until the test removes the hold file (the daemon's other threads keep serving). So "the
copy is still running" is a fact the test controls, and nothing sleeps to synchronize.

  Standalone  an open returns while the copy is held; the head reads at once; a read of
              the tail and one straddling the written edge wait (they cannot complete while
              held) and, once released, return the source's bytes; random 4 KiB reads and an
              mmap compare byte for byte; with --read-during-copy off the open waits.
              A copy that fails halfway (the source shrinks while held): reads of chunks
              that arrived still return the bytes, reads of missing chunks fail with EIO,
              nothing is published.
  Group       (NP ranks) the same early open on a node that is not the source: its reads
              of the tail go up the chain as wants and come back with the source's bytes.
Run as `test_reads_during_copy.py probe PATH SRC` (on a node), it opens PATH, prints "opened", checks
the head, then reads the tail and the written edge in threads, printing "waiting" and then,
after a line on stdin, the outcome of each read, of 200 random 4 KiB reads and of an mmap
read, compared with SRC.
"""
import errno
import mmap
import os
import random
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import stagefs_harness as h  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
SCRIPT = os.path.abspath(__file__)
CHUNK = 1 * MiB


def probe(path, src):
    """Interactive reader for a node (see the module's docstring). Exit status 0 iff every
    read matched the source."""
    want = open(src, "rb").read()
    fd = os.open(path, os.O_RDONLY)
    print("opened", flush=True)
    ok = os.pread(fd, 4096, 0) == want[:4096]
    print("head", "ok" if ok else "bad", flush=True)
    got = {}
    edge = 2 * CHUNK - 100  # chunks 1 and 2: chunk 2 is not written while the copy is held

    def rd(name, off, n):
        try:
            got[name] = os.pread(fd, n, off) == want[off:off + n]
        except OSError as e:
            got[name] = "errno %d" % e.errno

    threads = [threading.Thread(target=rd, args=("tail", len(want) - 5000, 8192)),
               threading.Thread(target=rd, args=("edge", edge, 200))]
    for t in threads:
        t.start()
    print("waiting", flush=True)
    sys.stdin.readline()
    for t in threads:
        t.join()
    for name in ("tail", "edge"):
        print(name, "ok" if got.get(name) is True else "bad %s" % got.get(name), flush=True)
        ok = ok and got.get(name) is True
    rng = random.Random(5)
    bad = 0
    for _ in range(200):
        off = rng.randrange(0, len(want) - 4096)
        bad += os.pread(fd, 4096, off) != want[off:off + 4096]
    print("random", "ok" if bad == 0 else "bad %d" % bad, flush=True)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    mm = m[:] == want
    m.close()
    print("mmap", "ok" if mm else "bad", flush=True)
    os.close(fd)
    return 0 if ok and bad == 0 and mm else 1


def expect_probe(test, p):
    """Runs the probe's dialogue: opened and head ok while the copy is held, then released."""
    test.assertEqual(p.stdout.readline().strip(), "opened", p.stderr.read() if p.poll() is not None else "")
    test.assertEqual(p.stdout.readline().strip(), "head ok")
    test.assertEqual(p.stdout.readline().strip(), "waiting")


class Standalone(h.MountTestCase):
    def start(self, size, *args):
        data = os.urandom(size)
        with open(os.path.join(self.work.src, "big"), "wb") as f:
            f.write(data)
        with h.Hold(self, "mid-file") as held:
            d = self.daemon(self.work.file("cache"), "--chunk-size", "1M", *args).wait_ready()
        return d, held.file, data

    def test_reads_of_every_pattern_during_a_held_copy(self):
        d, hold, _ = self.start(24 * MiB)
        p = h.subprocess.Popen([h.PYTHON, SCRIPT, "probe", os.path.join(d.mnt, "big"),
                                os.path.join(self.work.src, "big")],
                               stdin=h.subprocess.PIPE, stdout=h.subprocess.PIPE, stderr=h.subprocess.PIPE,
                               text=True)
        try:
            h.wait_for(lambda: d.stats()["opens_during_copy"] == 1, 30, "the open to return during the copy")
            expect_probe(self, p)
            h.wait_for(lambda: os.path.exists(hold), 30, "the copy to reach the hold")
            s = d.stats()
            self.assertEqual(s["transfers"], 0, s)  # the copy is not done: the open came early
            self.assertEqual(s["opens_during_copy"], 1, s)
            self.assertTrue(os.path.exists(hold))
            os.unlink(hold)
            p.stdin.write("go\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, out + err)
        self.assertEqual(out.split(), ["tail", "ok", "edge", "ok", "random", "ok", "mmap", "ok"], out)
        # the reads may end before the transfer's closing steps (sync, rename)
        s = h.wait_for(lambda: (lambda s: s if s["transfers"] == 1 else None)(d.stats()), 60, "the transfer to end")
        self.assertEqual(s["transfer_failures"], 0, s)
        self.assertGreaterEqual(s["reads_waited_during_copy"], 2, s)  # the tail and the edge waited
        self.assertGreaterEqual(s["chunks_wanted"], 2, s)
        # The next open is an ordinary cache hit (kernel passthrough where it works).
        self.assertEqual(h.sha256_file(os.path.join(d.mnt, "big")), h.sha256_file(os.path.join(self.work.src, "big")))
        self.assertEqual(d.stats()["opens_during_copy"], 1)

    def test_an_early_handle_does_not_fail_later_opens(self):
        """The kernel refuses a passthrough open of an inode that has cached-mode opens (and
        the reverse): an early handle kept open must not make the next opens fail."""
        d, hold, data = self.start(8 * MiB)
        fd = os.open(os.path.join(d.mnt, "big"), os.O_RDONLY)
        try:
            h.wait_for(lambda: os.path.exists(hold), 30, "the copy to reach the hold")
            os.unlink(hold)
            d.wait_transfers(1)
            for _ in range(2):  # a new open of the published copy, the early handle still open
                with open(os.path.join(d.mnt, "big"), "rb") as f:
                    self.assertEqual(f.read(), data)
            self.assertEqual(os.pread(fd, 4096, 5 * MiB), data[5 * MiB:5 * MiB + 4096])
            # a handle opened now (spliced: the early one is open) outlives the early one
            kept = os.open(os.path.join(d.mnt, "big"), os.O_RDONLY)
        finally:
            os.close(fd)
        try:
            with open(os.path.join(d.mnt, "big"), "rb") as f:  # the early handle closed, `kept` open
                self.assertEqual(f.read(4096), data[:4096])
            self.assertEqual(os.pread(kept, 4096, 7 * MiB), data[7 * MiB:7 * MiB + 4096])
        finally:
            os.close(kept)
        with open(os.path.join(d.mnt, "big"), "rb") as f:  # and after every handle closed
            self.assertEqual(f.read(4096), data[:4096])
        self.assertEqual(d.stats()["open_errors"], 0)

    def test_off_waits_for_the_whole_copy(self):
        d, hold, data = self.start(8 * MiB, "--read-during-copy", "off")
        got = []

        def first_page():
            with open(os.path.join(d.mnt, "big"), "rb") as f:
                got.append(f.read(4096))

        t = threading.Thread(target=first_page)
        t.start()
        h.wait_for(lambda: os.path.exists(hold) and d.stats()["waiting"] == 1, 30,
                   "the copy to reach the hold with the open waiting")
        self.assertEqual(d.stats()["opens_during_copy"], 0)
        self.assertTrue(t.is_alive(), "the open returned while the copy was held")
        os.unlink(hold)
        t.join(timeout=60)
        self.assertEqual(got, [data[:4096]])
        self.assertEqual(d.stats()["opens_during_copy"], 0)

    def test_a_copy_failing_halfway_fails_only_reads_of_missing_chunks(self):
        size = 16 * MiB
        d, hold, data = self.start(size)
        fd = os.open(os.path.join(d.mnt, "big"), os.O_RDONLY)
        try:
            self.assertEqual(os.pread(fd, 4096, 0), data[:4096])
            h.wait_for(lambda: os.path.exists(hold), 30, "the copy to reach the hold")
            # The source shrinks: the source's reader fails at the first chunk past 4 MiB it
            # reads (it read at most a few chunks ahead before the hold), the copy aborts.
            os.truncate(os.path.join(self.work.src, "big"), 4 * MiB)
            os.unlink(hold)
            with self.assertRaises(OSError) as e:
                os.pread(fd, 4096, 12 * MiB)
            self.assertEqual(e.exception.errno, errno.EIO)
            h.wait_for(lambda: d.stats()["transfer_failures"] == 1, 60, "the copy to fail")
            # The failed copy's space is freed at once (no handle keeps the unlinked file), so
            # every later read of the handle fails, those of chunks that had arrived too
            # (the kernel's page cache may still answer the head, which it holds already).
            with self.assertRaises(OSError) as e:
                os.pread(fd, 4096, size - 4096)
            self.assertEqual(e.exception.errno, errno.EIO)
            self.assertEqual(h.run(["sh", "-c", "ls -l /proc/%d/fd | grep -c 'stage-tmp' || true" % d.pid]).stdout.strip(),
                             "0", "the daemon still holds the failed copy")
        finally:
            os.close(fd)
        self.assertFalse(os.path.exists(os.path.join(self.work.file("cache"), "data", "big")))
        self.assertEqual(h.temp_files(self.work.file("cache")), [])


class Group(h.MountTestCase):
    def test_early_open_on_a_node_that_is_not_the_source(self):
        with open(os.path.join(self.work.src, "big"), "wb") as f:
            f.write(os.urandom(24 * MiB))
        with h.Hold(self, "mid-file") as held:
            g = self.group(h.NP, "--chunk-size", "1M").wait_ready()
        hold = held.file
        last = h.NP - 1
        p = g.spawn(last, [h.PYTHON, SCRIPT, "probe", os.path.join(g.mnt, "big"), os.path.join(self.work.src, "big")])
        h.wait_for(lambda: g.stats(last)["opens_during_copy"] == 1, 30, "the open to return during the copy")
        expect_probe(self, p)
        h.wait_for(lambda: os.path.exists(hold), 30, "the copy to reach the hold")
        s = g.stats(last)
        self.assertEqual(s["transfers"], 0, s)
        self.assertEqual(s["opens_during_copy"], 1, s)
        os.unlink(hold)
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertEqual(out.split(), ["tail", "ok", "edge", "ok", "random", "ok", "mmap", "ok"], out)
        # the reads may end before the transfer's closing agreement
        s = h.wait_for(lambda: (lambda s: s if s["transfers"] == 1 else None)(g.stats(last)), 60,
                       "the transfer to end on node %d" % last)
        self.assertGreaterEqual(s["chunks_wanted"], 1, s)
        src_sha = h.sha256_file(os.path.join(self.work.src, "big"))
        for k in range(h.NP):
            self.assertEqual(g.sha256_on(k, os.path.join(g.mnt, "big"))[os.path.join(g.mnt, "big")][0], src_sha,
                             "node %d" % k)
            self.assertEqual(g.stats(k)["transfer_failures"], 0)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "probe":
        sys.exit(probe(sys.argv[2], sys.argv[3]))
    with_np = len(sys.argv) > 2 and sys.argv[2].isdigit()
    h.main(__file__, with_np=with_np)
