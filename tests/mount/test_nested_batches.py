#!/usr/bin/python3
"""A batch of small files does not wait behind a large copy (ctest label
"mount").

Usage: test_nested_batches.py STAGEFS [NP [MPIRUN ARGS...]] [-- UNITTEST ARGS (classes)]

The large copy is held, not slowed by time: STAGE_TEST_HOLD=reader-mid-file with
STAGE_TEST_HOLD_BLOCK=1 stops the source rank's reader thread after two chunks until the test
removes the hold file, while the rest of the daemon (its MPI thread's copy loop included) goes
on. So "the large copy is still running" is a fact the test controls: a batch that completes
while the hold is there ran nested in it; one that waited behind it could not complete.

  Standalone  big's copy starts and is held; every small file of ds/ then reads back identical
              to the source (nested_batches 1, big's transfer not ended); released, big is
              identical too. With --nested-batches off the batch waits for big's copy.
  Group       (NP ranks, one mount namespace each) node 0 opens big; while its copy is held the
              last node reads ds/: its request reaches the coordinator during the transfer and
              every node runs the nested batch; released, big is identical on every node.
Run as `test_nested_batches.py compare DIR SRC`, it reads every file of DIR and compares it with SRC
(prints "files N" and one line per mismatch; exit status 0 iff all match).
"""
import os
import random
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import stagefs_harness as h  # noqa: E402

KiB, MiB = h.KiB, h.MiB
SCRIPT = os.path.abspath(__file__)
SMALL = 30


def compare(d, src):
    names = sorted(os.listdir(src))
    bad = 0
    for n in names:
        with open(os.path.join(d, n), "rb") as f, open(os.path.join(src, n), "rb") as g:
            if f.read() != g.read():
                print("differs", n, flush=True)
                bad += 1
    print("files", len(names), flush=True)
    return 0 if bad == 0 and names else 1


def make_source(src):
    rng = random.Random(4)
    with open(os.path.join(src, "big"), "wb") as f:
        f.write(rng.randbytes(12 * MiB))
    os.makedirs(os.path.join(src, "ds"))
    for i in range(SMALL):
        with open(os.path.join(src, "ds", "s%02d" % i), "wb") as f:
            f.write(rng.randbytes(rng.randint(1, 32 * KiB)))


class InThread:
    """fn() on a thread of its own: result or exception kept for the test."""

    def __init__(self, fn):
        self.out = None
        self.err = None
        self.t = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.t.start()

    def _run(self, fn):
        try:
            self.out = fn()
        except BaseException as e:  # noqa: B902 - reported by the test
            self.err = e

    def done(self):
        return not self.t.is_alive()

    def result(self, timeout=120):
        self.t.join(timeout)
        if self.t.is_alive():
            raise AssertionError("still running after %s s" % timeout)
        if self.err is not None:
            raise self.err
        return self.out


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


class Standalone(h.MountTestCase):
    def start(self, *args):
        make_source(self.work.src)
        with h.Hold(self, "reader-mid-file") as held:
            d = self.daemon(self.work.file("cache"), "--chunk-size", "1M", *args).wait_ready()
        big = InThread(lambda: read_file(os.path.join(d.mnt, "big")))  # starts big's copy
        h.wait_for(held.reached, 30, "big's copy to reach the hold")
        return d, held, big

    def read_small(self, d):
        src = os.path.join(self.work.src, "ds")
        return InThread(lambda: h.run([h.PYTHON, SCRIPT, "compare", os.path.join(d.mnt, "ds"), src],
                                      check=False, timeout=300))

    def test_a_batch_runs_while_a_large_copy_is_held(self):
        d, held, big = self.start()
        small = self.read_small(d)
        h.wait_for(small.done, 60, "the small files to be read while big's copy is held")
        r = small.result()
        self.assertEqual((r.returncode, r.stdout.split()), (0, ["files", str(SMALL)]), r.stdout + r.stderr)
        self.assertTrue(held.reached())
        s = d.stats()
        self.assertEqual((s["batches"], s["nested_batches"], s["transfers"]), (1, 1, 1), s)  # big's not ended
        self.assertFalse(big.done())
        held.release()
        self.assertEqual(big.result(), read_file(os.path.join(self.work.src, "big")))
        s = d.wait_transfers(2)
        self.assertEqual(s["transfer_failures"], 0, s)
        self.assertEqual(s["open_errors"], 0, s)
        self.assertEqual(h.temp_files(self.work.file("cache")), [])
        self.assertIn("(nested)", open(d.err_path).read())

    def test_off_waits_behind_the_large_copy(self):
        d, held, big = self.start("--nested-batches", "off")
        small = self.read_small(d)
        h.wait_for(lambda: d.stats()["waiting"] == 1, 30, "the batch's open to wait")
        self.assertFalse(small.done(), "the batch ran while big's copy was held")
        held.release()
        r = small.result()
        self.assertEqual((r.returncode, r.stdout.split()), (0, ["files", str(SMALL)]), r.stdout + r.stderr)
        self.assertEqual(big.result(), read_file(os.path.join(self.work.src, "big")))
        s = d.wait_transfers(2)
        self.assertEqual((s["batches"], s["nested_batches"], s["transfer_failures"]), (1, 0, 0), s)


class Group(h.MountTestCase):
    def test_a_batch_asked_by_another_node_runs_during_the_held_copy(self):
        make_source(self.work.src)
        with h.Hold(self, "reader-mid-file") as held:
            g = self.group(h.NP, "--chunk-size", "1M").wait_ready()
        last = h.NP - 1
        big = g.spawn(0, [h.PYTHON, h.HARNESS, "sha256", os.path.join(g.mnt, "big")])
        h.wait_for(held.reached, 30, "big's copy to reach the hold")
        r = g.on(last, [h.PYTHON, SCRIPT, "compare", os.path.join(g.mnt, "ds"), os.path.join(self.work.src, "ds")],
                 check=False, timeout=120)
        self.assertEqual((r.returncode, r.stdout.split()), (0, ["files", str(SMALL)]), r.stdout + r.stderr)
        self.assertTrue(held.reached())
        for k in range(h.NP):  # every node ran the batch nested, big's transfer still open
            s = g.stats(k)
            self.assertEqual((s["batches"], s["nested_batches"], s["transfers"]), (1, 1, 1), "node %d: %s" % (k, s))
        held.release()
        out, err = big.communicate(timeout=120)
        src_sha = h.sha256_file(os.path.join(self.work.src, "big"))
        self.assertEqual(out.split()[0], src_sha, err)
        for k in range(h.NP):
            s = g.wait_transfers(k, 2)
            self.assertEqual(s["transfer_failures"], 0, "node %d: %s" % (k, s))
            self.assertEqual(g.sha256_on(k, os.path.join(g.mnt, "big"))[os.path.join(g.mnt, "big")][0], src_sha)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    with_np = len(sys.argv) > 2 and sys.argv[2].isdigit()
    h.main(__file__, with_np=with_np)
