#!/usr/bin/python3
"""Wrong bytes and access as real-mount tests: each class is one ctest, each test one way a
mount could serve bytes that are not the source's or let a user past the source's permissions.

Usage: test_wrong_bytes_and_access.py STAGEFS [-- UNITTEST ARGS (classes)]
(exits 77 without /dev/fuse, root, fusermount3, unshare, nsenter, useradd, setpriv, setfacl)

  Cache    an attacker's cache directory (owned by a user, a symlink, planted symlinks and
           forged copies), rm -rf of the cache under a live mount, a copy corrupted on disk,
           a stale copy on a full cache filesystem
  Fresh    a source rewritten (same size, mtime restored), grown and shrunk while an old
           holder keeps the file open: new opens read the new bytes, old holders the old ones
  Access   POSIX ACLs, chmod after the attributes were cached, trusted.* xattrs, 300 open
           directory handles (memory), 100 opens waiting on a copy (no head-of-line
           blocking), SIGTERM during a copy (abandoned at the next chunk, exit 0)

Nothing sleeps to synchronize: the daemon's copy is held at a chunk (bcast/holds/holds.h:
STAGE_TEST_HOLD=mid-file, STAGE_TEST_HOLD_BLOCK=1: only the copy's writer thread waits until
the hold file is removed), and every wait is a bounded poll of a condition. Standard library only.
"""
import errno
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
sys.path.insert(0, HERE)
import stagefs_harness as h  # noqa: E402
import test_input_security_load as fx  # noqa: E402  (create_user, delete_user, PROBE)

MiB = h.MiB


def sha(data):
    return hashlib.sha256(data).hexdigest()


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


rss_kib = h.rss_kib


class UserCase(h.MountTestCase):
    def setUp(self):
        super().setUp()
        self.user = fx.create_user()
        self.addCleanup(fx.delete_user, self.user)
        import pwd
        pw = pwd.getpwnam(self.user)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        os.chmod(self.work.path, 0o755)

    def user_cmd(self, *cmd):
        """cmd (str or bytes arguments) run as the test's user."""
        return (["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups", "--"] +
                [c if isinstance(c, bytes) else str(c) for c in cmd])

    def as_user(self, *cmd, timeout=30):
        return h.run(self.user_cmd(*cmd), cwd="/", timeout=timeout, check=False)

    def probe(self, op, path):
        r = self.as_user(h.PYTHON, "-c", fx.PROBE, op, path)
        return r.stdout.split() or ["no output", r.stderr[-300:]]

    def start_refused(self, cache):
        """stagefs with this --cache must refuse to start: returns its stderr."""
        d = h.Daemon(self.work, cache)
        rc = d.wait_exit(30)
        self.assertIsNotNone(rc, "stagefs kept running with --cache %s" % cache)
        self.assertNotEqual(rc, 0)
        self.assertNotIn(self.work.mnt, h.mounts_under(self.work.mnt))
        return d.output()[1]


class Cache(UserCase):
    def test_attacker_owned_cache_with_planted_symlink_is_refused(self):
        # A world-writable sticky directory, as /tmp is.
        shared = self.work.file("shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        victim = self.work.file("victim")
        os.mkdir(victim)
        with open(os.path.join(self.work.src, "x"), "wb") as f:
            f.write(b"x" * 1000)
        os.mkdir(os.path.join(self.work.src, "sub"))
        with open(os.path.join(self.work.src, "sub", "x"), "wb") as f:
            f.write(b"y" * 1000)
        c = os.path.join(shared, "c")
        r = self.as_user("sh", "-c", "mkdir -p %s/data && chmod 777 %s %s/data && ln -s %s %s/data/sub" %
                         (c, c, c, victim, c))
        self.assertEqual(r.returncode, 0, r.stderr)
        err = self.start_refused(c)
        self.assertIn(c, err)
        self.assertIn("owned by uid %d" % self.uid, err)
        self.assertEqual(os.listdir(victim), [])
        self.assertEqual(os.stat(c).st_mode & 0o777, 0o777, "root changed the attacker's directory")

    def test_cache_that_is_a_symlink_is_refused_and_its_target_untouched(self):
        target = self.work.file("system-dir")
        os.mkdir(target)
        os.chmod(target, 0o755)
        link = self.work.file("cachelink")
        os.symlink(target, link)
        err = self.start_refused(link)
        self.assertIn("is a symlink", err)
        self.assertEqual(stat.S_IMODE(os.stat(target).st_mode), 0o755)
        self.assertEqual(os.listdir(target), [])

    def test_planted_copy_with_forged_origin_is_not_served(self):
        # Root made the cache carelessly world-writable; a user planted a copy that matches the
        # source's size and mtime and carries a forged origin record.
        data = os.urandom(4096)
        src = os.path.join(self.work.src, "f")
        with open(src, "wb") as f:
            f.write(data)
        cache = self.work.file("cache")
        os.makedirs(os.path.join(cache, "data"))
        os.chmod(cache, 0o777)
        os.chmod(os.path.join(cache, "data"), 0o777)
        st = os.stat(src)
        planted = os.path.join(cache, "data", "f")
        from zlib import crc32  # any value: the attacker knows the bytes it planted
        forged = "v1 %d %d %d %d %d %016x" % (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                                             crc32(b"E" * st.st_size))
        script = ("import os,sys; p=sys.argv[1]; open(p,'wb').write(b'E'*%d); "
                  "os.setxattr(p,'user.stagefs.origin',sys.argv[2].encode()); os.utime(p, ns=(%d,%d))"
                  % (st.st_size, st.st_mtime_ns, st.st_mtime_ns))
        r = self.as_user(h.PYTHON, "-c", script, planted, forged)
        self.assertEqual(r.returncode, 0, r.stderr)
        d = self.daemon(cache).wait_ready()
        self.assertEqual(read_all(os.path.join(self.work.mnt, "f")), data)
        self.assertEqual(stat.S_IMODE(os.stat(cache).st_mode), 0o700)
        self.assertEqual(os.stat(os.path.join(cache, "data", "f")).st_uid, 0)
        self.assertIn("did not write", d.output()[1])

    def test_cache_removed_under_a_live_mount_is_not_recreated(self):
        os.mkdir(os.path.join(self.work.src, "priv"), 0o700)
        with open(os.path.join(self.work.src, "priv", "f"), "wb") as f:
            f.write(b"secret" * 100)
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()
        shutil.rmtree(cache)
        with self.assertRaises(OSError):
            read_all(os.path.join(self.work.mnt, "priv", "f"))
        self.assertFalse(os.path.exists(cache), "the daemon recreated the removed cache")
        self.assertIn("was removed under the running mount", d.output()[1])

    def test_corrupted_copy_is_detected_and_copied_again(self):
        data = os.urandom(3 * MiB)
        with open(os.path.join(self.work.src, "img"), "wb") as f:
            f.write(data)
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()
        self.assertEqual(sha(read_all(os.path.join(self.work.mnt, "img"))), sha(data))
        self.assertEqual(d.stop(), 0)
        copy = os.path.join(cache, "data", "img")
        st = os.stat(copy)
        with open(copy, "r+b") as f:  # flip bytes in the middle, keep size and mtime
            f.seek(MiB)
            f.write(bytes(b ^ 0xFF for b in data[MiB:MiB + 16]))
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        d2 = self.daemon(cache).wait_ready()
        self.assertEqual(sha(read_all(os.path.join(self.work.mnt, "img"))), sha(data))
        s = d2.stats()
        self.assertEqual((s["corrupt"], s["materializations"]), (1, 1), s)
        self.assertIn("corrupted", d2.output()[1])
        self.assertEqual(sha(read_all(copy)), sha(data))
        # Once verified in this mount, later opens are plain cache hits.
        read_all(os.path.join(self.work.mnt, "img"))
        self.assertEqual(d2.stats()["materializations"], 1)

    def test_stale_copy_does_not_block_its_replacement_on_a_full_cache(self):
        cache = self.work.file("cache")
        os.mkdir(cache)
        h.run(["mount", "-t", "tmpfs", "-o", "size=12m", "stagefs-test", cache])
        path = os.path.join(self.work.src, "big")
        with open(path, "wb") as f:
            f.write(os.urandom(8 * MiB))
        self.daemon(cache).wait_ready()
        read_all(os.path.join(self.work.mnt, "big"))
        new = os.urandom(8 * MiB)
        with open(path, "wb") as f:
            f.write(new)
        self.assertEqual(sha(read_all(os.path.join(self.work.mnt, "big"))), sha(new))


class Fresh(h.MountTestCase):
    def test_new_open_sees_a_rewrite_with_restored_mtime_old_holder_keeps_old_bytes(self):
        for extra in ([], ["--no-passthrough"]):
            with self.subTest(args=extra):
                src = os.path.join(self.work.src, "f%d" % len(extra))
                old, new = os.urandom(64 * 1024), os.urandom(64 * 1024)
                with open(src, "wb") as f:
                    f.write(old)
                cache = self.work.file("cache%d" % len(extra))
                mnt = self.work.file("mnt%d" % len(extra))
                os.mkdir(mnt)
                d = h.Daemon(self.work, cache, *extra, mnt=mnt)
                self.addCleanup(d.stop)
                d.wait_ready()
                p = os.path.join(mnt, os.path.basename(src))
                holder = open(p, "rb")
                self.assertEqual(holder.read(), old)
                before = os.stat(src)
                with open(src, "r+b") as f:  # same size, same inode
                    f.write(new)
                os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))  # as touch -r does
                self.assertEqual(read_all(p), new)
                holder.seek(0)
                self.assertEqual(holder.read(), old)
                holder.close()
                self.assertEqual(d.stop(), 0)

    def test_grown_and_shrunk_source(self):
        src = os.path.join(self.work.src, "g")
        with open(src, "wb") as f:
            f.write(b"0123456789abc\n")
        self.daemon(self.work.file("cache")).wait_ready()
        p = os.path.join(self.work.mnt, "g")
        self.assertEqual(len(read_all(p)), 14)
        with open(src, "ab") as f:
            f.write(b"x" * 40)
        self.assertEqual(len(read_all(p)), 54)
        self.assertEqual(os.stat(p).st_size, 54)
        s = os.path.join(self.work.src, "s.bin")
        with open(s, "wb") as f:
            f.write(os.urandom(100000))
        read_all(os.path.join(self.work.mnt, "s.bin"))
        with open(s, "wb") as f:
            f.write(os.urandom(10))
        r = h.run([h.PYTHON, "-c", "import mmap,sys;f=open(sys.argv[1],'rb');m=mmap.mmap(f.fileno(),0,prot=1);"
                   "print(len(m), m[-1] >= 0)", os.path.join(self.work.mnt, "s.bin")], check=False)
        self.assertEqual(r.returncode, 0, "mmap reader of a shrunk file died: rc %d %s" % (r.returncode, r.stderr))
        self.assertEqual(r.stdout.split(), ["10", "True"])


class Access(UserCase):
    def test_acl_denies_through_the_mount_as_on_the_source(self):
        if not shutil.which("setfacl"):
            self.skipTest("setfacl missing")
        f = os.path.join(self.work.src, "acl")
        with open(f, "wb") as fh:
            fh.write(b"acl protected\n")
        os.chmod(f, 0o644)
        d = os.path.join(self.work.src, "acldir")
        os.mkdir(d, 0o755)
        with open(os.path.join(d, "inner"), "wb") as fh:
            fh.write(b"inner\n")
        h.run(["setfacl", "-m", "u:%s:---" % self.user, f])
        h.run(["setfacl", "-m", "u:%s:---" % self.user, d])
        self.assertEqual(self.probe("read", f), ["err", "EACCES"])  # the source enforces it
        self.daemon(self.work.file("cache")).wait_ready()
        self.assertEqual(self.probe("read", os.path.join(self.work.mnt, "acl")), ["err", "EACCES"])
        self.assertEqual(self.probe("list", os.path.join(self.work.mnt, "acldir")), ["err", "EACCES"])
        self.assertEqual(self.probe("read", os.path.join(self.work.mnt, "acldir", "inner")), ["err", "EACCES"])

    def test_chmod_is_enforced_at_once_and_trusted_xattrs_hidden(self):
        f = os.path.join(self.work.src, "later")
        with open(f, "wb") as fh:
            fh.write(b"was public\n")
        os.chmod(f, 0o644)
        os.setxattr(f, "trusted.site", b"internal")
        self.daemon(self.work.file("cache")).wait_ready()
        p = os.path.join(self.work.mnt, "later")
        self.assertEqual(self.probe("read", p)[0], "ok")  # attributes now cached for 3600 s
        os.chmod(f, 0o600)
        self.assertEqual(self.probe("read", p), ["err", "EACCES"])
        r = self.as_user(h.PYTHON, "-c", "import os,sys;print(os.listxattr(sys.argv[1]))", p)
        self.assertNotIn("trusted.site", r.stdout, r.stderr)
        self.assertIn("trusted.site", os.listxattr(p))  # root still sees it

    def test_a_directory_closed_above_the_file_denies_its_next_open(self):
        # The kernel keeps the directories' attributes (and so its own search check) for
        # --attr-timeout; the daemon resolves the path on the source as the caller at each open.
        proj = os.path.join(self.work.src, "proj")
        deep = os.path.join(proj, "deep")
        os.makedirs(deep)
        files = {}
        for name in ("cached", "uncached", "acl-cached", "acl-uncached"):
            files[name] = os.path.join(deep, name)
            with open(files[name], "wb") as fh:
                fh.write(name.encode() + b"\n")
            os.chmod(files[name], 0o644)
        for d in (proj, deep):
            os.chmod(d, 0o755)
        self.daemon(self.work.file("cache")).wait_ready()
        m = lambda name: os.path.join(self.work.mnt, "proj", "deep", name)  # noqa: E731
        for name in files:  # attributes of every directory and file now cached by the kernel
            self.assertEqual(self.probe("stat", m(name)), ["ok"])
        for name in ("cached", "acl-cached"):  # their copies in the cache
            self.assertEqual(self.probe("read", m(name))[0], "ok")
        os.chmod(proj, 0o700)
        self.assertEqual(self.probe("read", m("cached")), ["err", "EACCES"])
        self.assertEqual(self.probe("read", m("uncached")), ["err", "EACCES"])
        self.assertEqual(read_all(m("cached")), b"cached\n")  # root still reads it
        os.chmod(proj, 0o755)
        self.assertEqual(self.probe("read", m("cached"))[0], "ok")
        if not shutil.which("setfacl"):
            self.skipTest("setfacl missing (package acl)")
        h.run(["setfacl", "-m", "u:%s:---" % self.user, deep])
        self.assertEqual(self.probe("read", files["acl-cached"]), ["err", "EACCES"])  # the source enforces it
        self.assertEqual(self.probe("read", m("acl-cached")), ["err", "EACCES"])
        self.assertEqual(self.probe("read", m("acl-uncached")), ["err", "EACCES"])

    def test_open_directory_handles_share_one_listing(self):
        big = os.path.join(self.work.src, "many")
        os.mkdir(big)
        for i in range(20000):
            open(os.path.join(big, "entry-with-a-longish-name-%06d" % i), "wb").close()
        d = self.daemon(self.work.file("cache")).wait_ready()
        before = rss_kib(d.pid)
        script = ("import os,sys\nfds=[os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECTORY) for _ in range(300)]\n"
                  "print(len(fds))\nsys.stdout.flush()\nsys.stdin.readline()\n")
        holder = subprocess.Popen(["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups",
                                   "--", h.PYTHON, "-c", script, os.path.join(self.work.mnt, "many")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(holder.stdout.readline().strip(), "300")
            grown = rss_kib(d.pid) - before
        finally:
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=30)
        h.log("RSS growth with 300 handles on 20,000 entries: %d KiB" % grown)
        # One listing is about 1.3 MB; one per handle would be 300 times that.
        self.assertLess(grown, 32 * 1024, "daemon RSS grew %d KiB for 300 handles" % grown)

    def hold_env(self, hold):
        return {"STAGE_TEST_HOLD": "mid-file", "STAGE_TEST_HOLD_BLOCK": "1", "STAGE_TEST_HOLD_FILE": hold}

    def start_held(self, cache, big_size):
        with open(os.path.join(self.work.src, "big"), "wb") as f:
            f.write(os.urandom(big_size))
        hold = self.work.file("hold")
        old = dict(os.environ)
        os.environ.update(self.hold_env(hold))
        try:
            d = h.Daemon(self.work, cache, "--chunk-size", "64K")
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.addCleanup(lambda: os.path.exists(hold) and os.unlink(hold))
        return d, hold

    def test_waiting_opens_do_not_block_other_files(self):
        with open(os.path.join(self.work.src, "small"), "wb") as f:
            f.write(b"small\n")
        d, hold = self.start_held(self.work.file("cache"), 8 * MiB)
        d.wait_ready()
        self.assertEqual(read_all(os.path.join(self.work.mnt, "small")), b"small\n")  # cached now
        results = []
        openers = [threading.Thread(target=lambda: results.append(len(read_all(os.path.join(self.work.mnt, "big")))))
                   for _ in range(100)]
        for t in openers:
            t.start()
        h.wait_for(lambda: os.path.exists(hold), 30, "the transfer to reach the hold")
        # 100 opens wait on the held copy (more than the 16 FUSE workers); a cached file still reads.
        t0 = time.monotonic()
        done = []
        reader = threading.Thread(target=lambda: done.append(read_all(os.path.join(self.work.mnt, "small"))))
        reader.start()
        reader.join(timeout=20)
        took = time.monotonic() - t0
        still_held = os.path.exists(hold)
        os.unlink(hold)
        for t in openers:
            t.join(timeout=60)
        self.assertEqual(done, [b"small\n"], "a cached file could not be read while opens waited")
        self.assertTrue(still_held)
        h.log("cached read while 100 opens waited: %.1f ms" % (took * 1000))
        self.assertEqual(results, [8 * MiB] * 100)

    def test_sigterm_abandons_a_copy_at_the_next_chunk(self):
        cache = self.work.file("cache")
        d, hold = self.start_held(cache, 16 * MiB)
        d.wait_ready()
        err = []
        opener = threading.Thread(target=lambda: err.append(self._open_err(os.path.join(self.work.mnt, "big"))))
        opener.start()
        h.wait_for(lambda: os.path.exists(hold), 30, "the transfer to reach the hold")
        os.kill(d.pid, signal.SIGTERM)
        h.wait_for(lambda: "shutting down" in d.output()[1], 30, "the daemon to log the stop")
        os.unlink(hold)
        rc = d.wait_exit(30)
        opener.join(timeout=30)
        out = d.output()[1]
        self.assertEqual(rc, 0, out)
        self.assertNotIn("materialized", out)
        self.assertEqual(h.temp_files(cache), [])
        self.assertFalse(os.path.exists(os.path.join(cache, "data", "big")))
        self.assertEqual(len(err), 1)
        self.assertIsNotNone(err[0])

    @staticmethod
    def _open_err(path):
        try:
            read_all(path)
            return None
        except OSError as e:
            return e.errno


if __name__ == "__main__":
    h.main(__file__, tools=("useradd", "userdel", "setpriv"))
