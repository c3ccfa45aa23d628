#!/usr/bin/python3
"""A mount records what its job read; the next mount replays it (ctest label "mount").

Usage: test_profile_replay.py STAGEFS NP [MPIRUN ARGS...] [-- UNITTEST ARGS (classes)]

Every group here mounts with --profile WORK/profiles/p (the same path on every rank) and
--chunk-size 1M. A profile is read with tests/mount/profile_format.py, which follows
docs/profile-format.md, not the C++ codec.

  Record      opens on nodes 1, 2, 3 (small files of two directories, a large file read at
              chunks 1, 0 and 10 while its copy is held after two chunks): at unmount rank 0
              writes one profile, the files in the order of first access, the large file's
              chunks in the order its reader read them, nothing the job did not open
  Replay      the next group, over caches two of which are cold and two that hold an old
              version of a large file, replays the profile with no open at all: every node's
              cache then holds every recorded file at its current version (the changed one
              fresh), a removed one is skipped; rank 0's status says so
  OpenFirst   while the replay's copy of a large file is held, an open of a large file the
              profile does not name completes on another node (it runs nested in the
              background copy)
  Stop        the group is unmounted while the replay's copy is held: every rank exits 0 in
              bounded time, no partial copy under a final name, the profile is left as it was
              (the job opened nothing)
Holds are bcast/holds/holds.h's (STAGE_TEST_HOLD=reader-mid-file on rank 0); every wait is a
bounded poll of a condition.
"""
import os
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import profile_format  # noqa: E402
import stagefs_harness as h  # noqa: E402

KiB, MiB = h.KiB, h.MiB
READER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for c in sys.argv[2:]:
    os.pread(fd, 4096, int(c) * 1048576)
    print("r" + c, flush=True)
"""


def syscall_of(pid):
    """The number of the system call pid is blocked in, or None."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            first = f.read().split()[0]
        return int(first) if first.lstrip("-").isdigit() else None
    except OSError:
        return None


def make_source(src):
    for d, n in (("ds/a", 10), ("ds/b", 5)):
        os.makedirs(os.path.join(src, d))
        for i in range(n):
            h.write_random(os.path.join(src, d, "f%d" % i), 3000 + 997 * i, seed=hash((d, i)) & 0xFFFF)
    h.write_patterned(os.path.join(src, "big.img"), 16 * MiB, seed=1)
    h.write_patterned(os.path.join(src, "other.img"), 4 * MiB, seed=2)
    h.write_random(os.path.join(src, "gone.bin"), 2 * MiB + 5, seed=3)


class ProfileCase(h.MountTestCase):
    def setUp(self):
        super().setUp()
        make_source(self.work.src)
        self.profile = self.work.file("profiles/p")

    def start(self, *args):
        return self.group(h.NP, "--chunk-size", "1M", "--profile", self.profile, *args).wait_ready()

    def read_on(self, g, k, *rels):
        paths = [os.path.join(g.mnt, r) for r in rels]
        got = g.sha256_on(k, *paths)
        for r, p in zip(rels, paths):
            self.assertEqual(got[p][0], h.sha256_file(os.path.join(self.work.src, r)), "%s on node %d" % (r, k))

    def close(self, g):
        self.assertEqual(g.close(), [])
        self.assertEqual(g.proc.returncode, 0, h.tail(g.log_path))

    def record(self, *reads):
        """A first job: reads (node, rel) in order; its profile once every node unmounted."""
        g = self.start()
        for k, rel in reads:
            self.read_on(g, k, rel)
        self.close(g)
        return profile_format.read(self.profile)

    def replay_stats(self, g):
        return g.stats(0)["replay"]

    def wait_replay(self, g, state="done", timeout=120):
        return h.wait_for(lambda: (lambda r: r if r and r["state"] == state else None)(self.replay_stats(g)),
                          timeout, "the replay to be %s: %s" % (state, self.replay_stats(g)))

    def assert_cached(self, g, k, rel, want=None):
        c = g.cache_file(k, rel)
        self.assertTrue(os.path.exists(c), "node %d has no copy of %s" % (k, rel))
        self.assertTrue(h.files_equal(c, want or os.path.join(self.work.src, rel)), "node %d: %s differs" % (k, rel))


class Record(ProfileCase):
    def test_one_profile_of_every_nodes_first_accesses_and_the_chunks_read_during_a_copy(self):
        with h.Hold(self, "reader-mid-file") as held:
            g = self.start()
        self.read_on(g, 1, "ds/a/f3")
        self.read_on(g, 2, "ds/b/f1")
        # Node 3 reads big.img while its copy stops after two chunks: chunk 1, 0 (here by
        # then, or soon), then 10, which waits; the hold goes once that read waits.
        reader = g.spawn(3, [h.PYTHON, "-c", READER, os.path.join(g.mnt, "big.img"), "1", "0", "10"])
        for want in ("r1", "r0"):
            self.assertEqual(reader.stdout.readline().strip(), want, reader.stderr.read() if reader.poll() else "")
        h.wait_for(held.reached, 30, "big.img's copy to reach the hold")
        h.wait_for(lambda: syscall_of(reader.pid) == 17, 30, "the read of chunk 10 to wait (pread64)")
        held.release()
        out, err = reader.communicate(timeout=60)
        self.assertEqual((reader.returncode, out.split()), (0, ["r10"]), err)
        self.read_on(g, 1, "ds/a/f7")  # a second file of a directory already recorded
        self.close(g)
        p = profile_format.read(self.profile)
        paths = [f["path"] for f in p["files"]]
        self.assertEqual(paths, ["ds/a/f3", "ds/b/f1", "big.img", "ds/a/f7"], "first accesses, in order")
        times = [f["first_ms"] for f in p["files"]]
        self.assertEqual(times, sorted(times))
        self.assertEqual(p["files"][2]["chunks"][:3], [1, 0, 10], "big.img's chunks as its reader read them")
        self.assertEqual(p["chunk_size"], MiB)
        self.assertEqual(p["source"], self.work.src)
        self.assertEqual(os.stat(self.profile).st_mode & 0o777, 0o600)
        self.assertEqual([n for n in os.listdir(os.path.dirname(self.profile)) if n != "p"], [],
                         "a temporary file left beside the profile")
        # Only rank 0 writes, and it said so.
        self.assertIn("wrote the job's profile %s: 4 file(s)" % self.profile, open(g.log_path).read())


class Replay(ProfileCase):
    def test_the_recorded_set_is_staged_before_any_open_fresh_where_it_changed(self):
        self.record((1, "ds/a/f3"), (2, "big.img"), (3, "gone.bin"), (1, "ds/b/f4"))
        # Between the jobs: big.img changes (nodes 0 and 1 keep the old copy), gone.bin goes,
        # nodes 2 and 3 lose their caches (the next job lands on cold nodes too).
        old_big = self.work.file("big.old")
        shutil.copy(os.path.join(self.work.src, "big.img"), old_big)
        h.write_patterned(os.path.join(self.work.src, "big.img"), 16 * MiB, seed=99)
        os.unlink(os.path.join(self.work.src, "gone.bin"))
        for k in (2, 3):
            shutil.rmtree(self.work.file("node%d" % k))
        for k in (0, 1):
            self.assertTrue(h.files_equal(self.work.file("node%d/data/big.img" % k), old_big))
        g = self.start()
        r = self.wait_replay(g)
        self.assertEqual((r["files"], r["files_queued"], r["files_done"], r["files_skipped"]), (4, 3, 3, 1), r)
        for k in range(g.np):
            s = g.stats(k)
            with self.subTest(node=k):
                self.assertEqual((s["opens"], s["transfer_failures"]), (0, 0), s)
                for d, n in (("ds/a", 10), ("ds/b", 5)):  # their directories' batches
                    for i in range(n):
                        self.assert_cached(g, k, "%s/f%d" % (d, i))
                self.assert_cached(g, k, "big.img")  # the new version, on the warm nodes too
                if k in (2, 3):  # (a warm cache keeps its old copy until evicted: never served)
                    self.assertFalse(os.path.exists(g.cache_file(k, "gone.bin")))
                self.assertFalse(os.path.exists(g.cache_file(k, "other.img")), "not in the profile")
                if k != 0:
                    self.assertIsNone(s["replay"], "only the coordinator's node replays")
        self.read_on(g, 3, "big.img")  # the job's open is a cache hit
        self.assertEqual(g.stats(3)["cache_hits"], 1)
        self.close(g)
        self.assertIn("replay of %s done: 3 of 4 file(s) asked for in 3 transfer(s), 1 skipped (gone 1" % self.profile,
                      open(g.log_path).read())


class OpenFirst(ProfileCase):
    def test_an_open_outside_the_profile_is_not_held_behind_the_replay(self):
        self.record((1, "big.img"))
        for k in range(h.NP):
            shutil.rmtree(self.work.file("node%d" % k))
        with h.Hold(self, "reader-mid-file") as held:
            g = self.start()
        h.wait_for(held.reached, 60, "the replay's copy of big.img to reach the hold")
        # other.img: 4 chunks, so its reader would hold at its third read too: a 2-chunk file.
        h.write_random(os.path.join(self.work.src, "unrecorded.bin"), 2 * MiB, seed=7)
        self.read_on(g, 2, "unrecorded.bin")  # returns while big.img's copy is held
        self.assertTrue(held.reached())
        for k in range(g.np):
            with self.subTest(node=k):
                s = g.stats(k)
                self.assertEqual(s["nested_files"], 1, s)
                self.assertFalse(os.path.exists(g.cache_file(k, "big.img")), "big.img's copy ended: not a test")
                self.assert_cached(g, k, "unrecorded.bin")
        self.assertEqual(self.replay_stats(g)["state"], "running")
        held.release()
        self.wait_replay(g)
        for k in range(g.np):
            self.assert_cached(g, k, "big.img")
        self.close(g)
        self.assertIn("unrecorded.bin", open(g.log_path).read())
        self.assertIn("(nested)", open(g.log_path).read())


class Stop(ProfileCase):
    def test_an_unmount_during_the_replay_ends_every_rank_cleanly(self):
        self.record((1, "big.img"), (2, "ds/a/f0"))
        before = open(self.profile, "rb").read()
        for k in range(h.NP):
            shutil.rmtree(self.work.file("node%d" % k))
        with h.Hold(self, "reader-mid-file") as held:
            g = self.start()
        h.wait_for(held.reached, 60, "the replay's copy of big.img to reach the hold")
        g.unmount(h.NP - 1)
        held.release()  # the reader goes on, sees the stop
        rc = g.wait_exit(60)
        self.assertIsNotNone(rc, "mpirun still running 60 s after an unmount during the replay")
        self.assertEqual(rc, 0, h.tail(g.log_path))
        log = open(g.log_path).read()
        self.assertIn("ended (stopped)", log)
        self.assertIn("the job opened no file: %s left as it was" % self.profile, log)
        self.assertEqual(open(self.profile, "rb").read(), before)
        for k in range(g.np):
            with self.subTest(node=k):
                c = g.cache_file(k, "big.img")
                self.assertTrue(not os.path.exists(c) or h.files_equal(c, os.path.join(self.work.src, "big.img")),
                                "a partial copy under the final name")


if __name__ == "__main__":
    h.main(__file__, with_np=True)
