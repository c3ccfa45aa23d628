#!/usr/bin/python3
"""Real-mount tests of an MPI mount group: NP ranks under mpirun, each rank a "node" running
its stagefs in its own private mount namespace over its own cache WORK/node<k>, all mounted at
the same path WORK/mnt. "On node k" = nsenter into rank k's namespace.

Usage: test_group.py STAGEFS NP [MPIRUN ARGS...] [-- UNITTEST ARGS (test classes)...]
(exits 77 without /dev/fuse, root or mpirun)

  Staging      an open on node 1 (not the coordinator) stages the file into every node's
               cache with one transfer; the other nodes' opens are cache hits; daemons
               started with different --bcast-segment values follow rank 0's
  Concurrency  (NP >= 2) 4 readers per node opening one new file at once: one transfer;
               different files opened at once on different nodes
  Shutdown     fusermount3 -u on one node, or SIGTERM to mpirun, ends every rank
  Interrupt    unmounting the coordinator's node (or kill -9 of its daemon) during a transfer:
               bounded exit, the reader gets an error, no partial copy under a final name, temp
               files swept at the next start
  Kill9        kill -9 of one idle daemon: the others exit in bounded time, caches stay valid
  Seeding      (NP >= 4) two nodes whose caches hold a current copy from an earlier mount: a
               first open on a cold node is fed from a warm node's cache; no rank reads the
               source's data (strace)
"""
import os
import shutil
import signal
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stagefs_harness as h  # noqa: E402

MiB = h.MiB


class GroupCase(h.MountTestCase):
    def start(self, *args, np=None, wrap=None):
        return self.group(np or h.NP, *args, wrap=wrap).wait_ready()

    def assert_all_gone(self, g, what):
        # fusermount3's auto_unmount watchers exit on their own once they see their daemon's
        # session close: give them a bounded moment (a condition, not a fixed sleep;
        # generous, as a loaded machine schedules them late).
        try:
            h.wait_for(lambda: not g.leftovers(), 60, "processes of the group to exit")
        except AssertionError:
            pass  # reported with the list below
        left = g.leftovers()
        self.assertEqual(left, [], "%s: processes left: %s" %
                         (what, [(p, b" ".join(h.proc_cmdline(p))[:160]) for p in left]))
        self.assertEqual(h.mounts_under(self.work.mnt), [], "a mount remains in the test's namespace")

    def assert_caches_valid(self, g):
        """Every file in any node's cache is byte-equal to the source; no temp file under a
        final name."""
        for k in range(g.np):
            data = os.path.join(g.caches[k], "data")
            for rel in h.regular_files(data):
                if h.TEMP_MARK in os.path.basename(rel):
                    continue
                with self.subTest(node=k, copy=rel):
                    self.assertTrue(os.path.exists(os.path.join(self.work.src, rel)), "copy of no source file")
                    self.assertTrue(h.files_equal(os.path.join(data, rel), os.path.join(self.work.src, rel)),
                                    "node %d: %s differs from the source" % (k, rel))

    def readers(self, g, jobs):
        """Starts one reader per (node, [paths]) job, all blocked at a barrier; releases them
        together; returns [(node, paths, lines, rc)] once every one ended."""
        procs = [(k, paths, g.spawn(k, [h.PYTHON, h.HARNESS, "reader"] + list(paths))) for k, paths in jobs]
        for k, paths, p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                h.stop_popen(p)
                self.fail("reader on node %d did not start: %r %s" % (k, line, p.stderr.read()))
        for _, _, p in procs:  # the barrier: every reader is up; let them all go at once
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        deadline = time.monotonic() + 120
        for k, paths, p in procs:
            try:
                stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except Exception:
                h.stop_popen(p)
                raise AssertionError("reader on node %d of %s did not finish within 120 s" % (k, paths))
            out.append((k, paths, stdout.splitlines(), p.returncode, stderr))
        return out


class Staging(GroupCase):
    def test_open_on_one_node_stages_everywhere(self):
        src = self.work.src
        os.makedirs(os.path.join(src, "a", "b"))
        rel = "a/b/data.bin"
        size = 20 * MiB + 4321
        h.write_random(os.path.join(src, rel), size, seed=7, mode=0o640)
        want = h.sha256_file(os.path.join(src, rel))
        g = self.start()
        mp = os.path.join(g.mnt, rel)

        # the first open, on node 1 (the read may end before the transfer: wait for it)
        self.assertEqual(g.sha256_on(1, mp)[mp], (want, size))
        for k in range(g.np):
            g.wait_transfers(k, 1)
        for k in range(g.np):
            with self.subTest(cache_of_node=k):
                c = g.cache_file(k, rel)
                self.assertTrue(os.path.exists(c), "node %d has no copy at %s" % (k, c))
                self.assertTrue(h.files_equal(c, os.path.join(src, rel)), "node %d: copy differs" % k)
                self.assertEqual(h.temp_files(g.caches[k]), [])
        s = [g.stats(k) for k in range(g.np)]
        self.assertEqual(s[0]["transfers"], 1, s[0])
        self.assertEqual(s[0]["bytes_broadcast"], size, s[0])
        self.assertEqual((s[1]["opens"], s[1]["materializations"], s[1]["requests"]), (1, 1, 1), s[1])
        for k in range(g.np):
            with self.subTest(stats_of_node=k):
                self.assertEqual((s[k]["rank"], s[k]["ranks"], s[k]["pid"]), (k, g.np, g.pids[k]), s[k])
                self.assertEqual(s[k]["transfers"], 1, s[k])
                self.assertEqual(s[k]["local_writes"], 1, s[k])
                self.assertEqual(s[k]["transfer_failures"], 0, s[k])
                if k != 1:
                    self.assertEqual((s[k]["opens"], s[k]["materializations"]), (0, 0), s[k])

        # every other node reads it: cache hits, no new transfer
        for k in [0] + list(range(2, g.np)):
            with self.subTest(read_on_node=k):
                self.assertEqual(g.sha256_on(k, mp)[mp], (want, size))
                a = g.stats(k)
                self.assertEqual((a["opens"], a["cache_hits"], a["materializations"]), (1, 1, 0), a)
                self.assertEqual(a["transfers"], 1, a)
        c = g.stats(0)
        self.assertEqual((c["transfers"], c["bytes_broadcast"]), (1, size), c)
        # a second open on node 1 as well
        self.assertEqual(g.sha256_on(1, mp)[mp], (want, size))
        a = g.stats(1)
        self.assertEqual((a["opens"], a["cache_hits"], a["materializations"], a["transfers"]), (2, 1, 1, 1), a)

    def test_every_node_follows_rank0s_bcast_segment(self):
        # Daemons started with different --bcast-segment values (rank 0: 1M, the others: 64K)
        # use rank 0's: a chain's receivers post receives of the sender's message size.
        size = 9 * MiB + 77
        h.write_random(os.path.join(self.work.src, "seg.bin"), size, seed=5)
        want = h.sha256_file(os.path.join(self.work.src, "seg.bin"))
        per_rank = '$([ "$OMPI_COMM_WORLD_RANK" = 0 ] && echo 1M || echo 64K)'
        g = self.start("--bcast-algorithm", "chain", "--bcast-segment", per_rank)
        mp = os.path.join(g.mnt, "seg.bin")
        self.assertEqual(g.sha256_on(g.np - 1, mp)[mp], (want, size))
        for k in range(g.np):
            s = g.wait_transfers(k, 1)
            self.assertEqual((s["transfer_failures"], s["local_writes"]), (0, 1), s)
            self.assertTrue(h.files_equal(g.cache_file(k, "seg.bin"), os.path.join(self.work.src, "seg.bin")))


class Concurrency(GroupCase):
    def test_one_new_file_many_openers_one_transfer(self):
        size = 48 * MiB + 1
        h.write_random(os.path.join(self.work.src, "shared.bin"), size, seed=11)
        want = h.sha256_file(os.path.join(self.work.src, "shared.bin"))
        g = self.start()
        mp = os.path.join(g.mnt, "shared.bin")
        per_node = 4
        results = self.readers(g, [(k, [mp]) for k in range(g.np) for _ in range(per_node)])
        s = [g.wait_transfers(k, 1) for k in range(g.np)]
        with self.subTest("one transfer"):
            self.assertEqual(s[0]["transfers"], 1, s[0])
            self.assertEqual(s[0]["bytes_broadcast"], size, "the file was broadcast more than once: %s" % s[0])
        for k in range(g.np):
            with self.subTest(stats_of_node=k):
                self.assertEqual(s[k]["transfers"], 1, s[k])
                self.assertEqual(s[k]["local_writes"], 1, s[k])
                self.assertEqual(s[k]["opens"], per_node, s[k])
                self.assertEqual(s[k]["cache_hits"] + s[k]["materializations"], per_node, s[k])
                self.assertLessEqual(s[k]["requests"], 1, s[k])
                self.assertEqual(s[k]["open_errors"], 0, s[k])
                self.assertTrue(h.files_equal(g.cache_file(k, "shared.bin"), os.path.join(self.work.src, "shared.bin")))
        with self.subTest("every reader got the whole file"):
            bad = ["node %d: rc %s %s %s" % (k, rc, " ".join(lines)[:60], err[-200:].strip())
                   for k, _, lines, rc, err in results if (rc, lines) != (0, ["ok %s %d" % (want, size)])]
            self.assertEqual(bad, [], "%d of %d readers failed" % (len(bad), len(results)))

    def test_different_files_at_once_on_different_nodes(self):
        sizes = [0, 1, 4095, 4096, 65537, MiB + 3, 3 * MiB, 8 * MiB + 17]
        names = ["f%d.bin" % i for i in range(len(sizes))]
        os.mkdir(os.path.join(self.work.src, "sub"))
        names[5] = "sub/" + names[5]
        want = {}
        for i, (n, size) in enumerate(zip(names, sizes)):
            h.write_random(os.path.join(self.work.src, n), size, seed=100 + i)
            want[n] = "ok %s %d" % (h.sha256_file(os.path.join(self.work.src, n)), size)
        g = self.start("--small-file-size", "0")  # one transfer per file: no batches by directory
        jobs = [(i % g.np, [os.path.join(g.mnt, n)]) for i, n in enumerate(names)]
        results = self.readers(g, jobs)
        for (k, paths, lines, rc, err), n in zip(results, names):
            self.assertEqual((rc, lines), (0, [want[n]]), "%s read on node %d: %s" % (n, k, err))
        s = [g.wait_transfers(k, len(names)) for k in range(g.np)]
        self.assertEqual(s[0]["transfers"], len(names), s[0])
        self.assertEqual(s[0]["bytes_broadcast"], sum(sizes), s[0])
        for k in range(g.np):
            with self.subTest(node=k):
                self.assertEqual(s[k]["local_writes"], len(names), s[k])
                self.assertEqual(s[k]["transfer_failures"], 0, s[k])
                for n in names:
                    self.assertTrue(h.files_equal(g.cache_file(k, n), os.path.join(self.work.src, n)), (k, n))


class Shutdown(GroupCase):
    def prepare(self):
        h.write_random(os.path.join(self.work.src, "f"), MiB, seed=3)
        g = self.start()
        mp = os.path.join(g.mnt, "f")
        g.sha256_on(min(2, g.np - 1), mp)
        return g

    def test_unmount_on_one_node_ends_every_rank(self):
        g = self.prepare()
        last = g.np - 1
        t0 = time.monotonic()
        g.unmount(last)
        rc = g.wait_exit(60)
        took = time.monotonic() - t0
        h.log("mpirun exited %s %.1f s after fusermount3 -u on node %d" % (rc, took, last))
        self.assertIsNotNone(rc, "mpirun still running 60 s after fusermount3 -u on node %d" % last)
        self.assert_all_gone(g, "after fusermount3 -u on node %d" % last)
        self.assertEqual(rc, 0, "every rank should exit 0 after a clean unmount:\n" + h.tail(g.log_path))
        self.assert_caches_valid(g)

    def test_sigterm_to_mpirun_ends_every_rank(self):
        g = self.prepare()
        t0 = time.monotonic()
        os.kill(g.proc.pid, signal.SIGTERM)
        rc = g.wait_exit(60)
        took = time.monotonic() - t0
        h.log("mpirun exited %s %.1f s after SIGTERM" % (rc, took))
        self.assertIsNotNone(rc, "mpirun still running 60 s after SIGTERM")
        self.assert_all_gone(g, "after SIGTERM to mpirun")
        self.assert_caches_valid(g)

    def test_usr1_usr2_and_alrm_to_the_ranks_do_not_end_the_group(self):
        # What `srun --signal=USR1@T` sends every task before a time limit (and mpirun forwards
        # of its own SIGUSR1/SIGUSR2): the mount goes on, ignored after MPI_Init too.
        g = self.prepare()
        for pid in g.pids:
            for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
                os.kill(pid, sig)
        # A signal whose default action ends a process has ended it before kill() returns:
        # a transfer to every node now proves every rank survived.
        h.write_random(os.path.join(self.work.src, "after"), MiB, seed=4)
        got = g.sha256_on(g.np - 1, os.path.join(g.mnt, "after"))
        self.assertEqual(got[os.path.join(g.mnt, "after")][0], h.sha256_file(os.path.join(self.work.src, "after")))
        for pid in g.pids:
            self.assertTrue(h.pid_alive(pid))
            with open("/proc/%d/status" % pid) as f:
                ign = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
            for sig in (signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
                self.assertTrue(ign & (1 << (sig - 1)), "rank %d does not ignore %s" % (pid, sig.name))
        os.kill(g.proc.pid, signal.SIGTERM)
        self.assertIsNotNone(g.wait_exit(60), "mpirun still running 60 s after SIGTERM")
        self.assert_all_gone(g, "after SIGTERM to mpirun")


class Interrupt(GroupCase):
    """A transfer under way (a 16 MiB file in 32 KiB chunks, opened on node 1) when the
    coordinator's node is unmounted, or its daemon killed. "Under way" is a fact, not a race:
    the source rank's reader is held after two chunks (STAGE_TEST_HOLD=reader-mid-file) until
    the test has acted; the rest of the daemon goes on."""

    def interrupt_transfer(self, how):
        size = 16 * MiB
        big = os.path.join(self.work.src, "big.bin")
        h.write_patterned(big, size, seed=5)
        with h.Hold(self, "reader-mid-file") as held:
            g = self.start("--chunk-size", "32K")
        # a temp file of a dead writer, planted: the next start must sweep it
        planted = os.path.join(g.caches[1], "data", "old", ".gone.bin.stage-tmp.%s.999999" % os.uname().nodename)
        os.makedirs(os.path.dirname(planted))
        with open(planted, "wb") as f:
            f.write(b"partial")

        reader = g.spawn(1, [h.PYTHON, h.HARNESS, "reader", os.path.join(g.mnt, "big.bin")])
        self.assertEqual(reader.stdout.readline().strip(), "ready")
        reader.stdin.write("go\n")
        reader.stdin.flush()
        # wait until the transfer is under way on node 1 (its temp file is there)
        data1 = os.path.join(g.caches[1], "data")
        h.wait_for(lambda: any(".big.bin" in os.path.basename(p) for p in h.temp_files(data1)), 60,
                   "the transfer to start writing on node 1")
        h.wait_for(held.reached, 60, "the source's reader to reach the hold")
        self.assertIsNone(reader.poll(), "the reader finished while the copy was held")
        t0 = time.monotonic()
        if how == "unmount":
            g.unmount(0)
        else:
            os.kill(g.pids[0], signal.SIGKILL)
        held.release()  # the reader goes on: it sees the stop (unmount) or nothing (killed)
        rc = g.wait_exit(60)
        took = time.monotonic() - t0
        h.log("mpirun exited %s %.1f s after the %s of node 0 during a transfer" % (rc, took, how))
        self.assertIsNotNone(rc, "mpirun still running 60 s after the %s of node 0 during a transfer" % how)
        try:
            out, err = reader.communicate(timeout=30)
        except Exception:
            h.stop_popen(reader)
            raise AssertionError("the reader on node 1 hangs after the group ended")
        h.log("reader: rc %s, %r %r" % (reader.returncode, out, err[-500:]))
        self.assertTrue(out.startswith("err ") or reader.returncode != 0,
                        "the reader should get an error, got %r (rc %s)" % (out, reader.returncode))
        self.assert_all_gone(g, "after the %s of node 0 during a transfer" % how)
        # no cache holds a partial file under the final name
        for k in range(g.np):
            c = g.cache_file(k, "big.bin")
            with self.subTest(node=k):
                self.assertTrue(not os.path.exists(c) or h.files_equal(c, big),
                                "node %d: partial copy under the final name" % k)
        self.assert_caches_valid(g)

        # a restart over each cache sweeps the temp files
        left = {k: h.temp_files(g.caches[k]) for k in range(g.np)}
        h.log("temp files after the group ended: %s" % {k: [os.path.basename(p) for p in v] for k, v in left.items()})
        self.assertIn(planted, left[1])
        for k in range(g.np):
            if not left[k]:
                continue
            with self.subTest(restart_on_cache=k):
                d = self.daemon(g.caches[k]).wait_ready()
                self.assertEqual(h.temp_files(g.caches[k]), [], "node %d: temp files survive a restart" % k)
                out, err = d.output()
                self.assertIn("removed %d temporary file(s)" % len(left[k]), out + err)
                if k == 1:  # the cache still works
                    with open(os.path.join(self.work.mnt, "big.bin"), "rb") as f:
                        f.read(MiB)
                    d.wait_transfers(1)  # the open may return during the copy
                    self.assertTrue(h.files_equal(g.cache_file(k, "big.bin"), big))
                self.assertEqual(d.stop(), 0)
        return left

    def test_unmount_coordinator_during_transfer(self):
        self.interrupt_transfer("unmount")

    def test_kill9_coordinator_during_transfer(self):
        left = self.interrupt_transfer("kill -9")
        # the writers died mid-copy: their temp files were left, and swept above
        self.assertTrue(any(".big.bin" in os.path.basename(p) for k in left for p in left[k]),
                        "no partial temp file of big.bin was left: the kill came too late to test the sweep")


class Kill9(GroupCase):
    def test_kill9_one_idle_daemon(self):
        victim = min(2, h.NP - 1)
        for i, size in enumerate([0, 5000, 3 * MiB]):
            h.write_random(os.path.join(self.work.src, "f%d" % i), size, seed=i)
        g = self.start()
        for i in range(3):
            g.sha256_on(i % g.np, os.path.join(g.mnt, "f%d" % i))
        pid = g.pids[victim]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        rc = g.wait_exit(45)
        took = time.monotonic() - t0
        h.log("mpirun exited %s %.1f s after kill -9 of rank %d" % (rc, took, victim))
        self.assertIsNotNone(rc, "mpirun still running 45 s after kill -9 of rank %d:\n%s" % (victim, h.tail(g.log_path)))
        self.assertNotEqual(rc, 0, "a job with a killed rank should not succeed")
        self.assertLess(took, 30)
        self.assert_all_gone(g, "after kill -9 of rank %d" % victim)
        self.assert_caches_valid(g)
        for k in range(g.np):
            self.assertEqual(h.temp_files(g.caches[k]), [], "node %d" % k)


class Seeding(GroupCase):
    def test_warm_caches_feed_a_first_open_without_reading_the_source(self):
        if h.NP < 4:
            self.skipTest("needs two warm nodes and two cold ones")
        if shutil.which("strace") is None:
            self.skipTest("strace not installed")
        rel = "img.bin"
        src = os.path.join(self.work.src, rel)
        size = 12 * MiB + 4099
        h.write_random(src, size, seed=26)
        want = h.sha256_file(src)
        # The earlier mount: every node gets a copy; then nodes 0 and 3 lose theirs.
        g = self.start()
        self.assertEqual(g.sha256_on(1, os.path.join(g.mnt, rel))[os.path.join(g.mnt, rel)], (want, size))
        for k in range(g.np):
            g.wait_transfers(k, 1)
        self.assertEqual(g.close(), [])
        cold = (0, 3)
        for k in cold:
            os.unlink(g.cache_file(k, rel))
        # This mount, every rank under strace (read-family syscalls, fds annotated with paths).
        trace = self.work.file("trace")
        os.makedirs(trace)
        wrap = ('strace -D -ff -y -qq -s 0 --seccomp-bpf '
                '-e trace=read,pread64,readv,preadv,preadv2,mmap,sendfile,copy_file_range,splice '
                '-o %s/r$OMPI_COMM_WORLD_RANK' % trace)
        g = self.start(wrap=wrap)
        mp = os.path.join(g.mnt, rel)
        self.assertEqual(g.sha256_on(3, mp)[mp], (want, size))
        s = [g.wait_transfers(k, 1) for k in range(g.np)]
        for k in range(g.np):
            with self.subTest(stats_of_node=k):
                self.assertEqual((s[k]["transfers"], s[k]["transfer_failures"]), (1, 0), s[k])
                self.assertEqual((s[k]["bytes_from_source"], s[k]["bytes_from_seeds"]), (0, size), s[k])
                self.assertEqual(s[k]["seeded_here"], 1 if k == 1 else 0, s[k])  # the lowest warm rank
                self.assertEqual(s[k]["local_writes"], 1 if k in cold else 0, s[k])
        seed_copy = g.cache_file(1, rel)
        self.assertEqual(g.close(), [])
        self.assertEqual(bytes_read_from(src, trace), 0, "a rank read the shared source's data")
        self.assertGreaterEqual(bytes_read_from(seed_copy, trace), size, "the trace missed the seed's reads")
        for k in range(g.np):
            self.assertTrue(h.files_equal(g.cache_file(k, rel), src), "node %d: copy differs" % k)
        self.assert_caches_valid(g)


def bytes_read_from(path, trace_dir):
    """Bytes any traced thread read from `path` (a mapping of it counts as its whole size)."""
    tag = "<%s>" % os.path.realpath(path)
    total = 0
    for name in os.listdir(trace_dir):
        with open(os.path.join(trace_dir, name), errors="replace") as f:
            for line in f:
                if tag not in line:
                    continue
                ret = line.rsplit("= ", 1)[-1].split()[0]
                if line.startswith("mmap("):
                    total += 0 if ret.startswith("-") else os.path.getsize(path)
                elif ret.lstrip("-").isdigit() and int(ret) > 0:
                    total += int(ret)
    return total


if __name__ == "__main__":
    h.main(__file__, with_np=True)
