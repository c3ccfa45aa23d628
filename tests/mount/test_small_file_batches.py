#!/usr/bin/python3
"""Datasets of many small files, staged by directory (ctest label "mount").

Usage: test_small_file_batches.py STAGEFS [NP [MPIRUN ARGS...]] [-- UNITTEST ARGS (classes)]

  Standalone  a tree of small files in several directories (and one large file per directory,
              and a nested directory) read whole through a standalone mount: one transfer per
              directory of small files plus one per large file, every file identical to the
              source, one log line per batch; with --small-file-size 0 one transfer per file.
              A batch's copies are published unsynced (--sync-after) with their names in
              CACHE/unsynced; after kill -9 the next start keeps them (same boot id) or, if the
              log names another boot (a crash), removes them and they are copied again.
              Walks: opens in two sibling directories stage the parent's other
              subdirectories (those every user may list and enter) without an open;
              --prefetch-siblings off stages only what opens ask for; under --cache-size a
              walk's batch that does not fit without evicting is skipped, with the rest of
              the walk, and nothing is evicted
  Group       (NP ranks, one mount namespace each) every rank reads the whole tree at once:
              transfers == directories on every rank, every file identical on every rank
Run as `test_small_file_batches.py compare MNT SRC` inside a node's namespace, it reads every file
under MNT (8 threads) and compares it with SRC: prints "files N" and one line per mismatch.
Nothing sleeps to synchronize.
"""
import collections
import os
import random
import re
import signal
import sys
import threading
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import stagefs_harness as h  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
SCRIPT = os.path.abspath(__file__)


def make_tree(src, dirs, per_dir, large=True, seed=11):
    """dirs directories d00.. of per_dir small files (1-64 KiB), a large file (2 MiB) in each when
    large, and d00/nested with 5 small files. Returns (small file count, large file count,
    directories holding small files)."""
    rng = random.Random(seed)
    small = 0
    big = 0
    for d in range(dirs):
        dp = os.path.join(src, "d%02d" % d)
        os.makedirs(dp)
        for i in range(per_dir):
            with open(os.path.join(dp, "f%04d" % i), "wb") as f:
                f.write(rng.randbytes(rng.randint(1 * KiB, 64 * KiB)))
            small += 1
        if large:
            with open(os.path.join(dp, "large.bin"), "wb") as f:
                f.write(rng.randbytes(2 * MiB))
            big += 1
    nested = os.path.join(src, "d00", "nested")
    os.makedirs(nested)
    for i in range(5):
        with open(os.path.join(nested, "n%d" % i), "wb") as f:
            f.write(rng.randbytes(rng.randint(1, 8 * KiB)))
        small += 1
    return small, big, dirs + 1


def compare(mnt, src):
    """Reads every regular file under mnt with 8 threads, compares it with src."""
    paths = []
    for root, _, files in os.walk(mnt):
        for n in files:
            paths.append(os.path.relpath(os.path.join(root, n), mnt))

    def check(rel):
        with open(os.path.join(mnt, rel), "rb") as a, open(os.path.join(src, rel), "rb") as b:
            return None if a.read() == b.read() else rel

    with ThreadPoolExecutor(8) as ex:
        bad = [r for r in ex.map(check, paths) if r]
    print("files %d" % len(paths))
    for r in bad:
        print("mismatch %s" % r)
    return 0 if not bad else 1


class Standalone(h.MountTestCase):
    def test_one_transfer_per_directory_and_identical_bytes(self):
        small, big, dirs = make_tree(self.work.src, 6, 80)
        d = self.daemon(self.work.file("cache")).wait_ready()
        # tar of the whole tree (as a data loader's first pass), then every file compared.
        r = h.run(["tar", "cf", "/dev/null", "-C", d.mnt, "."], timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = h.run([h.PYTHON, SCRIPT, "compare", d.mnt, self.work.src], timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        self.assertIn("files %d" % (small + big), out.stdout)
        s = d.stats()
        self.assertEqual(s["batches"], dirs, s)
        self.assertEqual(s["transfers"], dirs + big, s)
        self.assertEqual(s["batch_files"], small, s)
        self.assertEqual(s["transfer_failures"], 0, s)
        self.assertEqual(s["open_errors"], 0, s)
        self.assertEqual(s["cache"]["files"], small + big, s)
        self.assertEqual(s["verified"], 0, s)  # copies made in this mount: no CRC re-read
        self.assertEqual(d.stop(), 0)
        _, err = d.output()
        batches = re.findall(r"materialized batch (\S+) \((\d+) small file", err)
        self.assertEqual(len(batches), dirs, err[-3000:])  # one log line per batch
        self.assertEqual(sum(int(n) for _, n in batches), small)
        self.assertEqual(len(re.findall(r"materialized d\d\d/f", err)), 0, "a log line per small file")
        self.assertEqual(len(h.temp_files(self.work.file("cache"))), 0)

    def test_small_file_size_0_is_one_transfer_per_file(self):
        small, big, _ = make_tree(self.work.src, 2, 10, large=False)
        d = self.daemon(self.work.file("cache"), "--small-file-size", "0").wait_ready()
        out = h.run([h.PYTHON, SCRIPT, "compare", d.mnt, self.work.src], timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:])
        s = d.stats()
        self.assertEqual(s["transfers"], small + big, s)
        self.assertEqual(s["batches"], 0, s)

    def test_a_file_costs_one_open_and_one_release(self):
        """Per-file costs (item 3): the mount is read-only, so its opens say FOPEN_NOFLUSH and
        a close sends the daemon no FLUSH; a listing is answered with READDIRPLUS, so a reader
        that lists a directory and then opens its files (os.walk, tar) sends no LOOKUP per
        file. What is left per file: one OPEN and one RELEASE."""
        release = os.uname().release.split(".")
        if (int(release[0]), int(re.match(r"\d+", release[1]).group())) < (5, 15):
            self.skipTest("FOPEN_NOFLUSH needs Linux 5.15")
        small, _, _ = make_tree(self.work.src, 1, 20, large=False)
        # A directory too large for one READDIRPLUS reply (the kernel's adaptive mode would ask
        # for attributes in the first reply only).
        wide = os.path.join(self.work.src, "wide")
        os.mkdir(wide)
        for i in range(3000):
            open(os.path.join(wide, "entry-with-a-longer-name-%05d" % i), "wb").close()
        d = self.daemon(self.work.file("cache"), "-d").wait_ready()
        self.assertEqual(sorted(os.listdir(d.mnt)), ["d00", "wide"])  # d00 and wide then need no LOOKUP
        out = h.run([h.PYTHON, SCRIPT, "compare", os.path.join(d.mnt, "d00"), os.path.join(self.work.src, "d00")],
                    timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:])
        listed = h.run(["ls", "-l", os.path.join(d.mnt, "wide")], timeout=120)
        self.assertEqual(len(listed.stdout.splitlines()), 3001, listed.stdout[-500:])  # "total", then one per entry
        self.assertEqual(d.stop(), 0)
        ops = collections.Counter(re.findall(r"opcode: (\w+)", "".join(d.output())))
        self.assertEqual(ops["OPEN"], small, ops)
        self.assertEqual(ops["RELEASE"], small, ops)
        self.assertEqual(ops["FLUSH"], 0, ops)
        self.assertGreater(ops["READDIRPLUS"], 2, ops)
        self.assertEqual(ops["LOOKUP"], 0, ops)

    def _killed_with_unsynced_batches(self):
        """A mount whose batches stay unsynced (--sync-after 3600), every file read, then kill -9.
        Returns (cache dir, small file count, the log the killed daemon left)."""
        small, _, _ = make_tree(self.work.src, 2, 10, large=False)
        cache = self.work.file("cache")
        d = self.daemon(cache, "--sync-after", "3600").wait_ready()
        out = h.run([h.PYTHON, SCRIPT, "compare", d.mnt, self.work.src], timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:])
        s = d.stats()
        self.assertEqual(s["batches"], 3, s)
        # Published before synced: the opens did not wait for the disk; the names are recorded.
        self.assertEqual(s["cache"]["unsynced"], small, s)
        with open(os.path.join(cache, "unsynced"), "rb") as f:
            log = f.read()
        self.assertIn(b"d00/f0003\0", log)
        self.assertIn(b"d00/nested/n4\0", log)
        os.kill(d.pid, signal.SIGKILL)
        self.assertEqual(d.wait_exit(30), -signal.SIGKILL)
        h.force_unmount(self.work.mnt)
        with open(os.path.join(cache, "unsynced"), "rb") as f:
            self.assertEqual(f.read(), log)
        return cache, small, log

    def test_after_a_kill_on_the_same_boot_unsynced_copies_are_kept(self):
        cache, small, _ = self._killed_with_unsynced_batches()
        d = self.daemon(cache).wait_ready()
        self.assertFalse(os.path.exists(os.path.join(cache, "unsynced")))
        out = h.run([h.PYTHON, SCRIPT, "compare", d.mnt, self.work.src], timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:])
        s = d.stats()
        self.assertEqual(s["transfers"], 0, s)  # every copy kept: the kernel still had their bytes
        self.assertEqual(s["cache_hits"], small, s)
        self.assertEqual(d.stop(), 0)
        self.assertIn("synced %d cop(ies) an earlier daemon" % small, d.output()[1])

    def test_after_a_reboot_unsynced_copies_are_copied_again(self):
        cache, small, log = self._killed_with_unsynced_batches()
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
        self.assertIn(boot, log)
        with open(os.path.join(cache, "unsynced"), "wb") as f:  # as if the machine had restarted
            f.write(log.replace(boot, b"an-earlier-boot"))
        d = self.daemon(cache).wait_ready()
        self.assertFalse(os.path.exists(os.path.join(cache, "data", "d00", "f0003")))
        out = h.run([h.PYTHON, SCRIPT, "compare", d.mnt, self.work.src], timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:])
        s = d.stats()
        self.assertEqual(s["batches"], 3, s)  # copied again, every file
        self.assertEqual(s["batch_files"], small, s)
        self.assertEqual(d.stop(), 0)  # a clean stop syncs and leaves no log
        self.assertFalse(os.path.exists(os.path.join(cache, "unsynced")))
        self.assertIn("restarted while %d cached cop(ies) were not yet synced" % small, d.output()[1])

    def _walk_tree(self):
        small, _, _ = make_tree(self.work.src, 5, 12, large=False)
        # A sibling other users may not enter: never staged by a walk, though its files are o+r.
        private = os.path.join(self.work.src, "private")
        os.makedirs(private)
        for i in range(3):
            with open(os.path.join(private, "p%d" % i), "wb") as f:
                f.write(b"private %d\n" % i)
        os.chmod(private, 0o750)
        return small

    def _cached(self, rel_dir):
        p = os.path.join(self.work.file("cache"), "data", rel_dir)
        return sorted(os.listdir(p)) if os.path.isdir(p) else []

    def test_two_sibling_directories_stage_the_others(self):
        small = self._walk_tree()
        d = self.daemon(self.work.file("cache")).wait_ready()
        for rel in ("d00/f0000", "d01/f0003"):
            with open(os.path.join(d.mnt, rel), "rb") as f, open(os.path.join(self.work.src, rel), "rb") as g:
                self.assertEqual(f.read(), g.read())
        # d02..d04 come without an open (d00/nested is no sibling of d00: not a walk's).
        s = h.wait_for(lambda: (lambda s: s if s["batches"] >= 5 else None)(d.stats()), 60, "the walk's batches")
        for k in range(5):
            rel = "d%02d" % k
            want = sorted(n for n in os.listdir(os.path.join(self.work.src, rel))
                          if os.path.isfile(os.path.join(self.work.src, rel, n)))
            self.assertEqual([n for n in self._cached(rel) if n != "nested"], want, rel)
        self.assertEqual(self._cached("private"), [])
        self.assertEqual(s["opens"], 2, s)
        # Then every file reads from the cache, identical (and the nested directory's batch).
        out = h.run([h.PYTHON, SCRIPT, "compare", d.mnt, self.work.src], timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        s = d.stats()
        self.assertEqual(s["batches"], 7, s)  # d00-d04, d00/nested, private (its own open)
        self.assertEqual(s["open_errors"], 0, s)
        self.assertEqual(d.stop(), 0)
        _, err = d.output()
        self.assertEqual(len(re.findall(r"readers walk /:", err)), 1, err[-3000:])

    def test_a_walk_never_evicts_under_a_cache_limit(self):
        """Room for the two opened directories and a third of another: the walk's first prefetch
        does not fit without evicting, so it is skipped and the rest of the walk dropped;
        nothing is evicted. An open in a skipped directory still gets its batch (and evicts)."""
        self._walk_tree()
        def alloc(rel):
            p = os.path.join(self.work.src, rel)
            return sum(os.stat(os.path.join(p, n)).st_blocks * 512 for n in os.listdir(p)
                       if os.path.isfile(os.path.join(p, n)))
        # (each copy may take a block more than its source, for its origin xattr: 12 per directory)
        limit = alloc("d00") + alloc("d01") + 24 * 4096 + min(alloc("d%02d" % k) for k in (2, 3, 4)) // 3
        d = self.daemon(self.work.file("cache"), "--cache-size", str(limit)).wait_ready()
        for rel in ("d00/f0000", "d01/f0003"):
            with open(os.path.join(d.mnt, rel), "rb") as f:
                f.read()
        s = h.wait_for(lambda: (lambda s: s if s["batches"] >= 3 else None)(d.stats()), 60, "the walk's first batch")
        self.assertEqual(s["cache"]["evictions"], 0, s)
        for k in (2, 3, 4):
            self.assertEqual(self._cached("d%02d" % k), [], k)
        for k in (0, 1):
            self.assertEqual(len([n for n in self._cached("d%02d" % k) if n != "nested"]), 12, k)
        # An open in d03 is asked for: its batch runs, evicting what it must.
        with open(os.path.join(d.mnt, "d03", "f0001"), "rb") as f, \
                open(os.path.join(self.work.src, "d03", "f0001"), "rb") as g:
            self.assertEqual(f.read(), g.read())
        s = d.stats()
        self.assertEqual(s["batches"], 4, s)  # d00, d01, the skipped prefetch, d03
        self.assertEqual(len(self._cached("d03")), 12)
        self.assertGreater(s["cache"]["evictions"], 0, s)
        self.assertLessEqual(s["cache"]["bytes"], limit, s)
        self.assertEqual(d.stop(), 0)
        _, err = d.output()
        self.assertEqual(len(re.findall(r"prefetch of d0[234]/ skipped \(.*\); it never evicts a copy: 2 more", err)), 1,
                         err[-3000:])

    def test_prefetch_siblings_off_stages_only_what_is_opened(self):
        self._walk_tree()
        d = self.daemon(self.work.file("cache"), "--prefetch-siblings", "off").wait_ready()
        for rel in ("d00/f0000", "d01/f0003", "d02/f0001"):
            with open(os.path.join(d.mnt, rel), "rb") as f:
                f.read()
        s = d.stats()
        self.assertEqual(s["batches"], 3, s)
        self.assertEqual(self._cached("d03"), [])
        self.assertEqual(d.stop(), 0)
        _, err = d.output()
        self.assertNotIn("readers walk", err)

    def test_bad_small_file_size_is_a_usage_error(self):
        r = h.run([h.STAGEFS, self.work.src, self.work.mnt, "--cache", self.work.file("c"), "--small-file-size",
                   "lots"], check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--small-file-size", r.stderr)


class Group(h.MountTestCase):
    def test_every_rank_reads_the_tree_with_one_transfer_per_directory(self):
        small, _, dirs = make_tree(self.work.src, 8, 60, large=False)
        g = self.group(h.NP).wait_ready()
        results = [None] * h.NP

        def reader(k):
            results[k] = g.on(k, [h.PYTHON, SCRIPT, "compare", g.mnt, self.work.src], timeout=600, check=False)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(h.NP)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=660)
        for k in range(h.NP):
            r = results[k]
            self.assertIsNotNone(r, "node %d did not finish" % k)
            self.assertEqual(r.returncode, 0, "node %d: %s %s" % (k, r.stdout[-2000:], r.stderr[-2000:]))
            self.assertIn("files %d" % small, r.stdout)
        for k in range(h.NP):
            s = g.stats(k)
            self.assertEqual(s["transfers"], dirs, "node %d: %s" % (k, s))
            self.assertEqual(s["batches"], dirs, "node %d: %s" % (k, s))
            self.assertEqual(s["batch_files"], small, "node %d: %s" % (k, s))
            self.assertEqual(s["open_errors"], 0, "node %d: %s" % (k, s))
            self.assertEqual(s["cache"]["files"], small, "node %d: %s" % (k, s))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    with_np = len(sys.argv) > 2 and sys.argv[2].isdigit()
    h.main(__file__, with_np=with_np)
