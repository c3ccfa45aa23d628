#!/usr/bin/python3
"""Real-mount tests of a standalone stagefs (no launcher: a group of one node).

Usage: test_standalone.py STAGEFS [-- UNITTEST ARGS...]    (exits 77 without /dev/fuse or root)

  Mirror        the mount mirrors SOURCE_DIR: listings, stat data, sizes, contents, xattrs;
                the cache gets byte-equal copies; the second open is a cache hit; every kind of
                change fails with EROFS
  SourceChanges a source file rewritten between two opens is materialized again (with and
                without kernel passthrough)
  StaleMount    kill -9 of the daemon leaves no mount (auto_unmount); a stale mount (daemon and
                its fusermount3 watcher killed) is refused with the command that clears it
"""
import errno
import os
import signal
import stat
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stagefs_harness as h  # noqa: E402

MiB = h.MiB
LISTING_ENV = dict(os.environ, LC_ALL="C", TZ="UTC")
# Everything stat(1) reports except the device (the mount's own, by design) and the access
# time (reading a file through the mount reads the source, which may move its atime).
STAT_FORMAT = "%n|%F|%a|%A|%s|%b|%B|%h|%i|%u|%g|%U|%G|%y|%Y|%z|%N\n"


def build_source(src):
    """A tree with nested dirs, files of several sizes, symlinks, odd modes and owners, a FIFO,
    a user xattr and nanosecond mtimes. Returns the relative paths of its regular files."""
    files = {
        "empty": b"",
        "small.txt": b"hello, stagefs\n",
        "page": bytes(range(256)) * 16,
        "odd size": bytes(range(251)) * 399,  # 100149 bytes, a space in the name
        "d1/d2/deep.txt": b"deep\n" * 1000,
        "d1/sibling": b"x" * 65537,
        "secret": b"0640\n" * 200,
        "owned": b"owned by 1000\n",
    }
    os.makedirs(os.path.join(src, "d1", "d2"))
    os.makedirs(os.path.join(src, "emptydir"))
    for rel, data in files.items():
        with open(os.path.join(src, rel), "wb") as f:
            f.write(data)
    h.write_random(os.path.join(src, "big.bin"), 40 * MiB + 12345, seed=40)
    os.chmod(os.path.join(src, "secret"), 0o640)
    os.chown(os.path.join(src, "owned"), 1000, 1000)
    os.chmod(os.path.join(src, "owned"), 0o600)
    os.chmod(os.path.join(src, "d1", "d2"), 0o750)
    os.chmod(os.path.join(src, "emptydir"), 0o700)
    os.symlink("d1/d2/deep.txt", os.path.join(src, "link"))
    os.symlink("../nowhere", os.path.join(src, "d1", "dangling"))
    os.mkfifo(os.path.join(src, "fifo"), 0o620)
    os.setxattr(os.path.join(src, "small.txt"), "user.test", b"some value")
    os.setxattr(os.path.join(src, "d1"), "user.dir", b"on a directory")
    for i, rel in enumerate(sorted(list(files) + ["big.bin"])):
        t = 1_600_000_000_123_456_789 + i * 1_000_000_007
        os.utime(os.path.join(src, rel), ns=(t, t))
    return sorted(list(files) + ["big.bin"])


def listing(cmd, cwd):
    return h.run(cmd, cwd=cwd, env=LISTING_ENV).stdout


class Mirror(h.MountTestCase):
    def setUp(self):
        super().setUp()
        self.files = build_source(self.work.src)
        self.cache = self.work.file("cache")
        # One materialization per file read is what these tests count: no batches of small
        # files by directory (those: test_small_file_batches.py).
        self.d = self.daemon(self.cache, "--small-file-size", "0").wait_ready()
        self.src, self.mnt = self.work.src, self.work.mnt

    def both(self, cmd):
        return listing(cmd, self.src), listing(cmd, self.mnt)

    def test_listings_match_source(self):
        for cmd in (["ls", "-lR", "--time-style=full-iso"],
                    ["find", ".", "-printf", "%P %y %m %s %U %G %T@ %l\n"],
                    ["du", "-s", "--apparent-size", "."],
                    ["du", "-s", "."],
                    ["du", "-a", "--apparent-size", "."]):
            with self.subTest(cmd=" ".join(cmd)):
                want, got = self.both(cmd)
                self.assertTrue(want.strip())
                self.assertEqual(got, want)
        entries = sorted(listing(["find", ".", "-mindepth", "1", "-printf", "%P\n"], self.src).split("\n"))[1:]
        self.assertGreater(len(entries), 12)
        want, got = self.both(["stat", "--printf", STAT_FORMAT] + entries)
        self.assertEqual(got, want)
        # the root too (its inode is the mount's own: compare everything else)
        fmt = "%F|%a|%s|%h|%u|%g|%y|%z\n"
        want, got = self.both(["stat", "--printf", fmt, "."])
        self.assertEqual(got, want)

    def test_contents_and_cache(self):
        before = self.d.stats()
        for rel in self.files:
            with self.subTest(file=rel):
                self.assertTrue(h.files_equal(os.path.join(self.mnt, rel), os.path.join(self.src, rel)))
        # through the symlink as well
        with open(os.path.join(self.mnt, "link"), "rb") as f:
            self.assertEqual(f.read(), b"deep\n" * 1000)
        n = len(self.files)
        after = self.d.wait_transfers(before["transfers"] + n)
        self.assertEqual(after["materializations"] - before["materializations"], n, after)
        self.assertEqual(after["transfers"] - before["transfers"], n, after)
        self.assertEqual(after["cache_hits"] - before["cache_hits"], 1, after)  # the symlink's target
        self.assertEqual(after["open_errors"], 0, after)
        self.assertEqual(after["state"], "ready")
        # the cache: 0700, one byte-equal copy per file read, same mode and mtime, no temp file
        self.assertEqual(stat.S_IMODE(os.stat(self.cache).st_mode), 0o700)
        data = os.path.join(self.cache, "data")
        self.assertEqual(h.regular_files(data), self.files)
        for rel in self.files:
            with self.subTest(copy=rel):
                c, s = os.path.join(data, rel), os.path.join(self.src, rel)
                self.assertTrue(h.files_equal(c, s))
                self.assertEqual(stat.S_IMODE(os.stat(c).st_mode), stat.S_IMODE(os.stat(s).st_mode))
                self.assertEqual(os.stat(c).st_mtime_ns, os.stat(s).st_mtime_ns)
        self.assertEqual(h.temp_files(self.cache), [])

        # the second open of each file is served from the cache
        for rel in ["big.bin", "small.txt", "empty", "d1/d2/deep.txt"]:
            with self.subTest(second_open=rel):
                b = self.d.stats()
                self.assertEqual(h.sha256_file(os.path.join(self.mnt, rel)),
                                 h.sha256_file(os.path.join(self.src, rel)))
                a = self.d.stats()
                self.assertEqual(a["cache_hits"], b["cache_hits"] + 1, a)
                self.assertEqual(a["opens"], b["opens"] + 1, a)
                self.assertEqual(a["materializations"], b["materializations"], a)
                self.assertEqual(a["transfers"], b["transfers"], a)
                self.assertEqual(a["bytes_broadcast"], b["bytes_broadcast"], a)

    def test_same_file_open_twice_at_once(self):
        """Two open descriptors of one file on one node (two readers of one image): both open,
        both read the whole file."""
        m = os.path.join(self.mnt, "d1", "sibling")
        want = b"x" * 65537
        with open(m, "rb") as first:
            with self.subTest("a second open while the first is open (first materialized it)"):
                with open(m, "rb") as second:
                    self.assertEqual(second.read(), want)
            self.assertEqual(first.read(), want)
        with open(m, "rb") as first:
            with self.subTest("a second open while the first is open (both cache hits)"):
                with open(m, "rb") as second:
                    self.assertEqual(second.read(), want)
            self.assertEqual(first.read(), want)
        self.assertEqual(self.d.stats()["open_errors"], 0)

    def test_xattrs_show_through(self):
        m = lambda *p: os.path.join(self.mnt, *p)  # noqa: E731
        with self.subTest("getxattr of a file"):
            self.assertEqual(os.getxattr(m("small.txt"), "user.test"), b"some value")
        with self.subTest("listxattr of a file"):
            self.assertIn("user.test", os.listxattr(m("small.txt")))
        with self.subTest("getxattr of a directory"):
            self.assertEqual(os.getxattr(m("d1"), "user.dir"), b"on a directory")
        with self.subTest("no such attribute"):
            with self.assertRaises(OSError) as cm:
                os.getxattr(m("page"), "user.test")
            self.assertEqual(cm.exception.errno, errno.ENODATA)
        with self.subTest("the synthetic attributes of the root"):
            self.assertEqual(os.getxattr(self.mnt, "user.stagefs.state"), b"ready")
            s = self.d.stats()
            self.assertEqual((s["rank"], s["ranks"], s["pid"]), (0, 1, self.d.pid))
        with self.subTest("the cache's bookkeeping xattr is not shown"):
            with open(m("small.txt"), "rb") as f:
                f.read()
            self.assertNotIn("user.stagefs.origin", os.listxattr(m("small.txt")))
            with self.assertRaises(OSError) as cm:
                os.getxattr(m("small.txt"), "user.stagefs.origin")
            self.assertEqual(cm.exception.errno, errno.ENODATA)

    def test_every_change_is_erofs(self):
        m = lambda *p: os.path.join(self.mnt, *p)  # noqa: E731
        snapshot = listing(["find", ".", "-printf", "%P %y %m %s %U %G %T@ %C@\n"], self.src)
        changes = {
            "open O_WRONLY": lambda: os.open(m("small.txt"), os.O_WRONLY),
            "open O_RDWR": lambda: os.open(m("small.txt"), os.O_RDWR),
            "open O_TRUNC": lambda: os.open(m("small.txt"), os.O_RDONLY | os.O_TRUNC),
            "open O_APPEND": lambda: os.open(m("small.txt"), os.O_WRONLY | os.O_APPEND),
            "create": lambda: os.open(m("new"), os.O_WRONLY | os.O_CREAT, 0o644),
            "create O_EXCL": lambda: os.open(m("d1", "new"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644),
            "mkdir": lambda: os.mkdir(m("newdir")),
            "unlink": lambda: os.unlink(m("small.txt")),
            "unlink symlink": lambda: os.unlink(m("link")),
            "rmdir": lambda: os.rmdir(m("emptydir")),
            "rename": lambda: os.rename(m("small.txt"), m("renamed")),
            "rename dir": lambda: os.rename(m("d1"), m("d9")),
            "chmod": lambda: os.chmod(m("small.txt"), 0o600),
            "chown": lambda: os.chown(m("small.txt"), 1000, 1000),
            "truncate": lambda: os.truncate(m("small.txt"), 0),
            "utime": lambda: os.utime(m("small.txt"), (0, 0)),
            "setxattr": lambda: os.setxattr(m("small.txt"), "user.other", b"v"),
            "removexattr": lambda: os.removexattr(m("small.txt"), "user.test"),
            "symlink": lambda: os.symlink("small.txt", m("newlink")),
            "link": lambda: os.link(m("small.txt"), m("hardlink")),
            "mkfifo": lambda: os.mkfifo(m("newfifo")),
        }
        for name, change in changes.items():
            with self.subTest(change=name):
                with self.assertRaises(OSError) as cm:
                    fd = change()
                    if isinstance(fd, int):
                        os.close(fd)
                self.assertEqual(cm.exception.errno, errno.EROFS,
                                 "%s: %s" % (name, errno.errorcode.get(cm.exception.errno)))
        # an fd opened for reading cannot write either
        fd = os.open(m("small.txt"), os.O_RDONLY)
        try:
            with self.assertRaises(OSError) as cm:
                os.write(fd, b"x")
            self.assertEqual(cm.exception.errno, errno.EBADF)
        finally:
            os.close(fd)
        self.assertEqual(listing(["find", ".", "-printf", "%P %y %m %s %U %G %T@ %C@\n"], self.src), snapshot)
        self.assertEqual(os.getxattr(os.path.join(self.src, "small.txt"), "user.test"), b"some value")
        self.assertEqual(self.d.stats()["state"], "ready")


class CachePageCache(h.MountTestCase):
    """Where a materialized copy lives right after the open that made it, before anything reads
    it: in the page cache by default (buffered cache writes: the reader that triggered the copy
    reads it next), on disk only with --direct-io auto (O_DIRECT). fincore counts the pages."""

    def resident_after_open(self, *extra):
        h.write_random(os.path.join(self.work.src, "img"), 8 * MiB, seed=7)
        cache = self.work.file("cache-" + ("-".join(extra) or "default"))
        d = self.daemon(cache, *extra).wait_ready()
        fd = os.open(os.path.join(self.work.mnt, "img"), os.O_RDONLY)  # materializes, reads nothing
        try:
            # The open may return while the copy is still being made (--read-during-copy).
            h.wait_for(lambda: d.stats()["transfers"] == 1, 60, "the copy to be published")
            out = h.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                         os.path.join(cache, "data", "img")]).stdout
        finally:
            os.close(fd)
        d.stop()
        return int(out.strip())

    def test_default_leaves_the_copy_in_the_page_cache(self):
        self.assertGreater(self.resident_after_open(), 4 * MiB)

    def test_direct_io_auto_bypasses_it(self):
        fs_type = h.run(["stat", "-f", "-c", "%T", self.work.src]).stdout.strip()
        if fs_type == "tmpfs":
            self.skipTest("the cache would be on tmpfs: its pages are always resident")
        self.assertLess(self.resident_after_open("--direct-io", "auto"), 1 * MiB)


class SourceChanges(h.MountTestCase):
    """--attr-timeout 0 --entry-timeout 0: every open sees the source's current attributes. A
    copy is current when the source's size, mtime, ctime and inode all match its origin (see
    fusefs/core/core.h); each kind of change below must give a new materialization and the new
    content through the mount."""

    T = [1_700_000_000_000_000_000 + i * 100_000_000_000 for i in range(4)]

    def check_rematerialized(self, *extra):
        src, mnt = self.work.src, self.work.mnt
        cache = self.work.file("cache")
        path = os.path.join(src, "f")
        tmp = os.path.join(src, ".f.new")
        with open(path, "wb") as f:
            f.write(b"A" * 100000)
        os.utime(path, ns=(self.T[0],) * 2)
        d = self.daemon(cache, "--attr-timeout", "0", "--entry-timeout", "0", *extra).wait_ready()
        mp = os.path.join(mnt, "f")

        def read_and_check(expect, what):
            before = d.stats()
            with open(mp, "rb") as f:
                got = f.read()
            after = d.stats()
            self.assertEqual(os.stat(mp).st_size, len(expect), what)
            with open(os.path.join(cache, "data", "f"), "rb") as f:
                self.assertTrue(f.read() == expect, "%s: the cache copy is not the new content" % what)
            self.assertEqual(after["materializations"], before["materializations"] + 1, (what, after))
            self.assertEqual(after["transfers"], before["transfers"] + 1, (what, after))
            self.assertEqual(after["cache_hits"], before["cache_hits"], (what, after))
            self.assertTrue(got == expect, "%s: the mount shows stale content: %d bytes, first %r (expected %r)"
                            % (what, len(got), got[:4], expect[:4]))

        def rewrite_in_place(data, mtime):
            with open(path, "r+b") as f:
                f.write(data)
                f.truncate(len(data))
            os.utime(path, ns=(mtime,) * 2)

        def replace_by_rename(data, mtime):
            with open(tmp, "wb") as f:
                f.write(data)
            os.utime(tmp, ns=(mtime,) * 2)
            os.rename(tmp, path)

        read_and_check(b"A" * 100000, "first open")
        cases = [
            ("rewritten in place, new size and mtime", lambda: rewrite_in_place(b"B" * 150000, self.T[1]), b"B"),
            ("rewritten in place, same size, new mtime", lambda: rewrite_in_place(b"C" * 150000, self.T[2]), b"C"),
            ("replaced by rename (new inode), same size and mtime",
             lambda: replace_by_rename(b"D" * 150000, self.T[2]), b"D"),
            ("rewritten in place, same size, mtime put back (only the ctime moved)",
             lambda: rewrite_in_place(b"E" * 150000, self.T[2]), b"E"),
        ]
        for what, change, ch in cases:
            with self.subTest(change=what):
                change()
                read_and_check(ch * 150000, what)
        with self.subTest("unchanged since: a cache hit"):
            before = d.stats()
            with open(mp, "rb") as f:
                f.read()
            self.assertEqual(d.stats()["cache_hits"], before["cache_hits"] + 1)

    def test_rematerialized_passthrough(self):
        self.check_rematerialized()

    def test_rematerialized_no_passthrough(self):
        self.check_rematerialized("--no-passthrough")


def children(pid):
    return [p for p in h.all_pids() if h.proc_ppid(p) == pid]


class StaleMount(h.MountTestCase):
    def setUp(self):
        super().setUp()
        with open(os.path.join(self.work.src, "f"), "wb") as f:
            f.write(b"f")

    def kill9(self, d, with_watcher):
        """kill -9 of the daemon; with_watcher: first of its fusermount3 auto_unmount watcher as
        well, as when the whole job step is SIGKILLed (a cgroup kill, OOM)."""
        watchers = [p for p in children(d.pid) if os.path.basename(h.proc_cmdline(p)[0]) == b"fusermount3"]
        if with_watcher:
            for p in watchers:
                h.kill_pid(p, signal.SIGKILL)
        os.kill(d.pid, signal.SIGKILL)
        self.assertEqual(d.wait_exit(30), -signal.SIGKILL)
        return watchers

    def test_kill9_leaves_no_stale_mount(self):
        d1 = self.daemon(self.work.file("cache")).wait_ready()
        with open(os.path.join(self.work.mnt, "f"), "rb") as f:
            self.assertEqual(f.read(), b"f")
        self.kill9(d1, with_watcher=False)
        h.wait_for(lambda: not h.mounts_under(self.work.mnt), 10, "the mount of a killed daemon to go")
        self.assertEqual(os.listdir(self.work.mnt), [])
        d2 = self.daemon(self.work.file("cache")).wait_ready()
        with open(os.path.join(self.work.mnt, "f"), "rb") as f:
            self.assertEqual(f.read(), b"f")
        self.assertEqual(d2.stats()["cache_hits"], 1)
        self.assertEqual(d2.stop(), 0)

    def test_stale_mount_is_refused_with_the_fix(self):
        d1 = self.daemon(self.work.file("cache")).wait_ready()
        self.kill9(d1, with_watcher=True)
        self.assertIn(self.work.mnt, h.mounts_under(self.work.mnt), "the killed daemon's mount should remain")
        with self.assertRaises(OSError) as cm:
            os.listdir(self.work.mnt)
        self.assertEqual(cm.exception.errno, errno.ENOTCONN)

        d2 = self.daemon(self.work.file("cache2"))
        rc = d2.wait_exit(30)
        out, err = d2.output()
        detail = "\nstdout: %s\nstderr: %s" % (out, err)
        self.assertEqual(rc, 1, "a second stagefs on a stale mount point: exit %s%s" % (rc, detail))
        self.assertIn("fusermount3 -u " + self.work.mnt, err,
                      "stderr should name the command that clears the stale mount" + detail)
        # --wait reports the stale mount at once rather than waiting out its timeout
        r = h.run([h.STAGEFS, "--wait", self.work.mnt, "--wait-timeout", "30"], timeout=20, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("stale", r.stderr)
        # the advice works
        h.run(["fusermount3", "-u", self.work.mnt])
        self.assertNotIn(self.work.mnt, h.mounts_under(self.work.mnt))
        d3 = self.daemon(self.work.file("cache3")).wait_ready()
        with open(os.path.join(self.work.mnt, "f"), "rb") as f:
            self.assertEqual(f.read(), b"f")
        self.assertEqual(d3.stop(), 0)


if __name__ == "__main__":
    h.main(__file__)
