#!/usr/bin/python3
"""Fault tests (ctest label "faults"): what the tools must refuse,
and mounts by an unprivileged user.

Usage: test_refusals.py STAGEFS STAGE_BCAST [MPIRUN ARGS...] [-- UNITTEST ARGS (classes)]
(exits 77 without /dev/fuse, root, fusermount3, unshare, nsenter, mount; Unprivileged also
without useradd/userdel/setpriv)

  BcastRefusals  stage-bcast --dest a character device (a node of our own, and /dev/null
                 itself, held by a bind mount so that a regression cannot replace it), a
                 FIFO, a socket, a directory without -r: exit 2, the file is what it was.
                 --source on /proc (also a /proc file bind-mounted elsewhere): exit 2,
                 nothing created. A /proc file inside a -r tree (size 0 by stat, text by
                 read): exit 1 at read time, "longer than its size", nothing published.
                 -r into itself (also through a symlink), or over its own parent: exit 2,
                 the source tree unchanged. Under mpirun (2 ranks as nodes), one node's
                 destination a FIFO: every rank exits 2, the message printed once, no
                 node writes.
  StagefsPaths   MOUNTPOINT inside --cache (also through a symlink), MOUNTPOINT inside
                 SOURCE_DIR through a symlink, --cache inside SOURCE_DIR, SOURCE_DIR inside
                 --cache, SOURCE_DIR on /proc: exit 2, the message names both paths,
                 nothing mounted, no cache created. A /proc file bound into SOURCE_DIR: its
                 open fails with EIO ("longer than its size" in the log), nothing cached.
  Unprivileged   a real second user mounts (fusermount3 is setuid) with a fuse.conf without
                 user_allow_other: the mount works for that user, the log says "mounted for
                 uid N only" and never claims kernel passthrough; root gets EACCES. With
                 user_allow_other: shared (root reads it), still no passthrough claim. A
                 mount point the user cannot write: exit 1 naming that cause, not /dev/fuse.
                 /etc/fuse.conf is never edited: a temporary file is bind-mounted over it in
                 this test's private mount namespace.

Every test runs in the private mount namespace of tests/mount/stagefs_harness.py, in a fresh
work dir, and removes whatever it mounted or started, also on failure. No sleeps.
Standard library only.
"""
import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import stagefs_harness as h  # noqa: E402

SCRIPT = os.path.abspath(__file__)
BCAST = None
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
USER = "stagefs-tester"


def snapshot(root):
    """{relative path: (type, size)} below root, symlinks not followed."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return out


def bind(src, dst):
    h.run(["mount", "--bind", src, dst])


def mount_count(prefix):
    return len(h.mounts_under(prefix))


# ---- stage-bcast ----------------------------------------------------------------------------

class BcastRefusals(h.MountTestCase):
    def setUp(self):
        super().setUp()
        self.src = self.work.file("img.bin")
        h.write_random(self.src, 300_000, 81)

    def bcast(self, *args):
        return h.run([BCAST] + [str(a) for a in args], env=h.clean_env(), check=False, timeout=60)

    def refused(self, args, words, status=2):
        r = self.bcast(*args)
        h.log("[stage-bcast %s] rc %d: %s" % (" ".join(map(str, args)), r.returncode, r.stderr.strip()[:300]))
        self.assertEqual(r.returncode, status, "stage-bcast %s: rc %d\n%s" % (args, r.returncode, r.stderr))
        for w in words:
            self.assertIn(w, r.stderr)
        self.assertNotIn("done", r.stdout)
        return r

    def assert_special(self, path, kind, rdev=None):
        st = os.lstat(path)
        self.assertEqual(stat.S_IFMT(st.st_mode), kind, "%s was replaced" % path)
        if rdev is not None:
            self.assertEqual(st.st_rdev, rdev)
        self.assertEqual(h.temp_files(os.path.dirname(path)), [])

    def test_dest_device_fifo_socket_directory(self):
        w = self.work
        fifo = w.file("fifo")
        os.mkfifo(fifo)
        sock_path = w.file("sock")
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.bind(sock_path)
        with self.subTest("a FIFO"):
            self.refused(["--source", self.src, "--dest", fifo], ["--dest " + fifo, "FIFO", "refusing"])
            self.assert_special(fifo, stat.S_IFIFO)
        with self.subTest("a UNIX socket"):
            self.refused(["--source", self.src, "--dest", sock_path], ["socket"])
            self.assert_special(sock_path, stat.S_IFSOCK)
        with self.subTest("a character device node of our own"):
            dev = w.file("null-node")
            try:
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            except OSError as e:
                self.skipTest("mknod: %s" % e)
            self.refused(["--source", self.src, "--dest", dev], ["character device"])
            self.assert_special(dev, stat.S_IFCHR, os.makedev(1, 3))
        with self.subTest("/dev/null itself"):
            # Bound onto itself in this namespace: a rename over a mount point fails (EBUSY),
            # so even a regression cannot replace the machine's /dev/null.
            bind("/dev/null", "/dev/null")
            try:
                self.refused(["--source", self.src, "--dest", "/dev/null"], ["/dev/null", "character device"])
                self.assert_special("/dev/null", stat.S_IFCHR, os.makedev(1, 3))
            finally:
                h.run(["umount", "/dev/null"], check=False)
        with self.subTest("a directory without -r"):
            d = w.file("adir")
            os.mkdir(d)
            self.refused(["--source", self.src, "--dest", d], ["is a directory", "--recursive"])
            self.assertEqual(os.listdir(d), [])

    def test_source_on_a_pseudo_filesystem(self):
        out = self.work.file("out")
        with self.subTest("/proc/self/status"):
            self.refused(["--source", "/proc/self/status", "--dest", out], ["/proc/self/status", "proc", "pseudo"])
            self.assertFalse(os.path.lexists(out))
        with self.subTest("a /proc file bind-mounted onto a regular path"):
            f = self.work.file("status-copy")
            open(f, "w").close()
            bind("/proc/%d/status" % os.getpid(), f)
            try:
                self.refused(["--source", f, "--dest", out], ["proc", "pseudo"])
            finally:
                h.run(["umount", f], check=False)
            self.assertFalse(os.path.lexists(out))

    def test_pseudo_file_inside_a_tree_fails_at_read_time(self):
        tree = self.work.file("tree")
        os.mkdir(tree)
        h.write_random(os.path.join(tree, "a.bin"), 70_000, 82)
        status = os.path.join(tree, "status")
        open(status, "w").close()
        bind("/proc/%d/status" % os.getpid(), status)  # 0 bytes by stat, text by read
        self.addCleanup(h.run, ["umount", status], check=False)
        dest = self.work.file("staged")
        r = self.refused(["-r", "--source", tree, "--dest", dest], ["longer than its size", "status"], status=1)
        self.assertIn("source changed", r.stderr)
        self.assertFalse(os.path.lexists(os.path.join(dest, "status")), "an empty copy was published")
        self.assertEqual(h.temp_files(self.work.path), [])

    def test_tree_into_itself(self):
        w = self.work
        tree = w.file("tree")
        os.makedirs(os.path.join(tree, "sub"))
        h.write_random(os.path.join(tree, "sub", "f.bin"), 10_000, 83)
        os.symlink(tree, w.file("tree-link"))
        before = snapshot(tree)
        for case, src, dest, words in [
            ("dest inside source", tree, os.path.join(tree, "sub", "copy"), ["inside --source", "into itself"]),
            ("dest inside source through a symlink", tree, w.file("tree-link/copy"), ["inside --source", tree]),
            ("dest = source", tree, w.file("tree-link"), ["is the source"]),
            ("source inside dest", tree, w.path, ["lies inside --dest"]),
        ]:
            with self.subTest(case):
                self.refused(["-r", "--source", src, "--dest", dest], words)
                self.assertEqual(snapshot(tree), before, "%s: the source tree changed" % case)

    def test_mpi_one_node_refuses_every_rank_exits_2(self):
        if shutil.which(MPIRUN[0]) is None:
            self.skipTest("no mpirun")
        w = self.work
        os.mkdir(w.file("node1"))
        os.mkfifo(w.file("node1/img.bin"))
        r = h.run(MPIRUN + ["-np", "2", BCAST, "--ranks-as-nodes", "--source", self.src,
                            "--dest", w.file("node%n/img.bin")], env=h.mpi_env(), check=False, timeout=120)
        h.log("[mpirun np 2, node 1 a FIFO] rc %d: %s" % (r.returncode, r.stderr.strip()[-400:]))
        self.assertEqual(r.returncode, 2, r.stderr[-2000:])
        self.assertEqual(r.stderr.count("is a FIFO"), 1, "printed once, by rank 0: %s" % r.stderr[-2000:])
        self.assertIn(w.file("node1/img.bin"), r.stderr)
        self.assert_special(w.file("node1/img.bin"), stat.S_IFIFO)
        self.assertFalse(os.path.lexists(w.file("node0/img.bin")), "a node wrote though another refused")


# ---- stagefs paths ------------------------------------------------------------------------

class StagefsPaths(h.MountTestCase):
    def invoke(self, src, mnt, cache, timeout=20):
        """Runs stagefs; returns (rc, stderr, mounted). A run that mounts is unmounted again."""
        err_p = self.work.file("inv%d.err" % len(self.work.logs))
        self.work.logs.append(err_p)
        before = mount_count(self.work.path)
        with open(err_p, "w") as e:
            p = subprocess.Popen([h.STAGEFS, src, mnt, "--cache", cache], stdin=subprocess.DEVNULL,
                                 stdout=e, stderr=e, env=h.clean_env(), start_new_session=True)
        h.STANDALONE_PIDS.add(p.pid)
        try:
            h.wait_for(lambda: p.poll() is not None or mount_count(self.work.path) > before, timeout,
                       "stagefs to exit or mount")
        finally:
            mounted = mount_count(self.work.path) > before
            for mp in h.mounts_under(self.work.path):
                h.force_unmount(mp)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                h.stop_popen(p)
        return p.returncode, h.tail(err_p), mounted

    def refused(self, case, src, mnt, cache, words):
        rc, err, mounted = self.invoke(src, mnt, cache)
        h.log("[%s] rc %s: %s" % (case, rc, err.strip()[:400]))
        self.assertFalse(mounted, "%s: accepted and mounted: %s" % (case, err[-500:]))
        self.assertEqual(rc, 2, "%s: exit %s, want 2 (usage): %s" % (case, rc, err[-500:]))
        for word in words:
            self.assertIn(word, err, "%s: the message does not name %r" % (case, word))
        self.assertEqual(mount_count(self.work.path), 0)

    def test_paths_inside_each_other(self):
        w = self.work
        with open(os.path.join(w.src, "f"), "w") as f:
            f.write("x\n")
        cache = w.file("cache")
        os.makedirs(os.path.join(cache, "mnt"))
        real = w.file("real-cache")
        os.makedirs(os.path.join(real, "mnt"))
        os.symlink(real, w.file("cache-link"))
        os.mkdir(os.path.join(w.src, "sub"))
        os.symlink(os.path.join(w.src, "sub"), w.file("mnt-link"))
        os.symlink(w.src, w.file("src-link"))
        cases = [  # case, SOURCE_DIR, MOUNTPOINT, --cache, words in the message, cache that must not appear
            ("MOUNTPOINT inside --cache", w.src, os.path.join(cache, "mnt"), cache,
             ["MOUNTPOINT " + os.path.join(cache, "mnt"), "inside --cache " + cache], None),
            ("MOUNTPOINT inside --cache through a symlink", w.src, os.path.join(real, "mnt"), w.file("cache-link"),
             ["MOUNTPOINT", os.path.join(real, "mnt"), "inside --cache " + w.file("cache-link"), real], None),
            ("MOUNTPOINT inside SOURCE_DIR through a symlink", w.src, w.file("mnt-link"), w.file("c1"),
             ["MOUNTPOINT " + w.file("mnt-link"), os.path.join(w.src, "sub"), "inside SOURCE_DIR " + w.src],
             w.file("c1")),
            ("--cache inside SOURCE_DIR through a symlink", w.src, w.mnt, w.file("src-link/c2"),
             ["--cache " + w.file("src-link/c2"), "inside SOURCE_DIR " + w.src], os.path.join(w.src, "c2")),
            ("SOURCE_DIR inside --cache", w.src, w.mnt, w.path,
             ["SOURCE_DIR " + w.src, "inside --cache " + w.path], None),
            ("SOURCE_DIR on /proc", "/proc", w.mnt, w.file("c3"), ["SOURCE_DIR /proc", "pseudo filesystem"],
             w.file("c3")),
        ]
        for case, src, mnt, c, words, fresh in cases:
            with self.subTest(case):
                self.refused(case, src, mnt, c, words)
                if fresh:
                    self.assertFalse(os.path.exists(fresh), "%s: the refused run created %s" % (case, fresh))
        self.assertEqual(os.listdir(cache), ["mnt"], "the refused run wrote into the cache")
        self.assertEqual(sorted(os.listdir(w.src)), ["f", "sub"])


    def test_pseudo_file_in_source_fails_the_open(self):
        """A /proc file bound into SOURCE_DIR (0 bytes by stat, text by read): the open fails, no
        empty copy is served or cached; a regular file beside it still works."""
        w = self.work
        with open(os.path.join(w.src, "f"), "w") as f:
            f.write("regular\n")
        status = os.path.join(w.src, "status")
        open(status, "w").close()
        bind("/proc/%d/status" % os.getpid(), status)
        self.addCleanup(h.run, ["umount", status], check=False)
        cache = w.file("cache")
        d = self.daemon(cache).wait_ready()
        with self.assertRaises(OSError) as ctx:
            with open(os.path.join(w.mnt, "status"), "rb") as f:
                h.log("read %d bytes through the mount" % len(f.read()))
        self.assertEqual(ctx.exception.errno, errno.EIO, ctx.exception)
        self.assertFalse(os.path.lexists(os.path.join(cache, "data", "status")), "a copy was cached")
        with open(os.path.join(w.mnt, "f")) as f:
            self.assertEqual(f.read(), "regular\n")
        self.assertEqual(d.stop(), 0)
        self.assertIn("longer than its size", d.output()[1])


# ---- unprivileged mounts ------------------------------------------------------------------

class UserDaemon(h.Daemon):
    """A standalone stagefs run as another user (setpriv), in this test's namespace."""

    def __init__(self, work, uid, gid, cache, mnt, src):
        h.Daemon.count += 1
        self.work, self.mnt, self.src, self.cache = work, mnt, src, cache
        self.uid, self.gid = uid, gid
        self.out_path = work.file("udaemon%d.out" % h.Daemon.count)
        self.err_path = work.file("udaemon%d.err" % h.Daemon.count)
        work.logs += [self.out_path, self.err_path]
        self.cmd = as_user(uid, gid, [h.STAGEFS, src, mnt, "--cache", cache])
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd="/",
                                         env=h.clean_env(), start_new_session=True)
        h.STANDALONE_PIDS.add(self.proc.pid)

    def wait_ready(self, timeout=30):
        """Until mounted (or the daemon is gone), then `stagefs --wait` as the user: root may not
        be let in."""
        h.wait_for(lambda: self.proc.poll() is not None or self.mnt in h.mounts_under(self.mnt), timeout,
                   "stagefs as uid %d to mount or exit" % self.uid)
        if self.proc.poll() is not None:
            raise AssertionError("stagefs as uid %d exited %d without mounting:\n%s" %
                                 (self.uid, self.proc.returncode, self.output()[1][-2000:]))
        r = h.run(as_user(self.uid, self.gid, [h.STAGEFS, "--wait", self.mnt, "--wait-timeout", str(timeout)]),
                  timeout=timeout + 30, check=False, cwd="/")
        if r.returncode != 0:
            raise AssertionError("stagefs --wait as uid %d failed (%d): %s\n daemon exit: %s\n stderr: %s" %
                                 (self.uid, r.returncode, r.stderr, self.proc.poll(), self.output()[1][-2000:]))
        return self


def as_user(uid, gid, cmd):
    return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"] + [str(c) for c in cmd]


READ = r"""
import errno, sys
try:
    with open(sys.argv[1], "rb") as f:
        sys.stdout.write(f.read().decode())
except OSError as e:
    print("err", errno.errorcode.get(e.errno, str(e.errno)))
"""

PASSTHROUGH_CLAIMS = ("reads via kernel passthrough", "reads are served by kernel passthrough",
                      "kernel passthrough refused")


class Unprivileged(h.MountTestCase):
    def setUp(self):
        pw = h.ensure_user(self, USER)  # first: userdel after the fixture's cleanup
        super().setUp()
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        w = self.work
        with open(os.path.join(w.src, "f.txt"), "w") as f:
            f.write("staged for an unprivileged user\n" * 1000)
        self.umnt = w.file("umnt")
        self.uhome = w.file("uhome")  # where the user may create its cache
        for d in (self.umnt, self.uhome):
            os.mkdir(d)
            os.chown(d, self.uid, self.gid)
        self.conf = w.file("fuse.conf")

    def fuse_conf(self, text):
        """Puts `text` in this namespace's /etc/fuse.conf (a bind mount, undone in cleanup)."""
        with open(self.conf, "w") as f:
            f.write(text)
        os.chmod(self.conf, 0o644)
        if "/etc/fuse.conf" not in h.mounts_under("/etc/fuse.conf"):
            if not os.path.exists("/etc/fuse.conf"):
                self.skipTest("no /etc/fuse.conf to bind over")
            bind(self.conf, "/etc/fuse.conf")
            self.addCleanup(h.run, ["umount", "/etc/fuse.conf"], check=False)

    def fuse_device_for_user(self):
        """A FUSE device node the user may open (0666, as most distributions have it), bound over
        /dev/fuse in this namespace: fusermount3 opens /dev/fuse with the caller's rights."""
        if os.access("/dev/fuse", os.R_OK | os.W_OK, effective_ids=False) and \
                stat.S_IMODE(os.stat("/dev/fuse").st_mode) & 0o006 == 0o006:
            return
        node = self.work.file("fuse-dev")
        os.mknod(node, 0o666 | stat.S_IFCHR, os.stat("/dev/fuse").st_rdev)
        os.chmod(node, 0o666)
        bind(node, "/dev/fuse")
        self.addCleanup(h.run, ["umount", "/dev/fuse"], check=False)

    def user_read(self, path):
        return h.run(as_user(self.uid, self.gid, [h.PYTHON, "-c", READ, path]), cwd="/", check=False).stdout

    def start(self, cache_name):
        d = UserDaemon(self.work, self.uid, self.gid, os.path.join(self.uhome, cache_name), self.umnt, self.work.src)
        self.daemons.append(d)
        return d

    def stop_as_user(self, d):
        r = h.run(as_user(self.uid, self.gid, ["fusermount3", "-u", self.umnt]), cwd="/", check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(d.wait_exit(30), 0, d.output()[1][-2000:])
        return d.output()[1]

    def assert_no_passthrough_claim(self, log):
        for claim in PASSTHROUGH_CLAIMS:
            self.assertNotIn(claim, log, "an unprivileged mount claims passthrough:\n" + log[-2000:])
        self.assertIn("reads via splice", log)

    def test_mount_for_the_caller_only(self):
        self.fuse_conf("# stock: no user_allow_other\n#user_allow_other\n")
        self.fuse_device_for_user()
        d = self.start("cache").wait_ready()
        with open(os.path.join(self.work.src, "f.txt")) as f:
            want = f.read()
        self.assertEqual(self.user_read(os.path.join(self.umnt, "f.txt")), want)
        with self.assertRaises(PermissionError, msg="root entered a mount made for one user"):
            os.stat(os.path.join(self.umnt, "f.txt"))
        log = self.stop_as_user(d)
        self.assertEqual(log.count("mounted for uid %d only" % self.uid), 1, log[-2000:])
        self.assert_no_passthrough_claim(log)
        self.assertEqual(mount_count(self.umnt), 0)

    def test_mount_shared_with_user_allow_other(self):
        self.fuse_conf("user_allow_other\n")
        self.fuse_device_for_user()
        d = self.start("cache2").wait_ready()
        with open(os.path.join(self.work.src, "f.txt")) as f:
            want = f.read()
        self.assertEqual(self.user_read(os.path.join(self.umnt, "f.txt")), want)
        with open(os.path.join(self.umnt, "f.txt")) as f:  # root is let in
            self.assertEqual(f.read(), want)
        log = self.stop_as_user(d)
        self.assertNotIn("mounted for uid", log)
        self.assert_no_passthrough_claim(log)

    def refused_mount(self, mnt, cache_name):
        d = UserDaemon(self.work, self.uid, self.gid, os.path.join(self.uhome, cache_name), mnt, self.work.src)
        self.daemons.append(d)
        rc = d.wait_exit(30)
        err = d.output()[1]
        h.log("[unprivileged mount at %s] rc %s: %s" % (mnt, rc, err.strip()[-400:]))
        self.assertEqual(rc, 1, err[-2000:])
        self.assertNotIn("is /dev/fuse there", err, "the old guess instead of the cause")
        self.assertEqual(mount_count(mnt), 0)
        return err

    def test_failure_names_the_cause(self):
        self.fuse_conf("#user_allow_other\n")
        with self.subTest("/dev/fuse not accessible to the user"):
            if os.stat("/dev/fuse").st_mode & 0o006 == 0o006:
                self.skipTest("/dev/fuse is open to everyone here")
            err = self.refused_mount(self.umnt, "cache3")
            self.assertIn("/dev/fuse (mode 0", err)
            self.assertIn("not readable and writable by uid %d" % self.uid, err)
        with self.subTest("a mount point the user cannot write"):
            self.fuse_device_for_user()
            theirs = self.work.file("root-owned-mnt")  # 0755 root: fusermount3 refuses the user
            os.mkdir(theirs)
            err = self.refused_mount(theirs, "cache4")
            self.assertIn("mount point %s is not writable by uid %d" % (theirs, self.uid), err)


def main():
    global BCAST, MPIRUN
    args = sys.argv[1:]
    before = args[:args.index("--")] if "--" in args else args
    after = args[args.index("--") + 1:] if "--" in args else []
    if len(before) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    h.STAGEFS = os.path.abspath(before[0])
    BCAST = os.path.abspath(before[1])
    if before[2:]:
        MPIRUN = before[2:]
    why = h.missing_prerequisite(False)
    if why is None and shutil.which("mount") is None:
        why = "mount is missing"
    selected = [a for a in after if not a.startswith("-")]
    if why is None and (not selected or any(s.split(".")[0] == "Unprivileged" for s in selected)):
        missing = [t for t in ("useradd", "userdel", "setpriv") if shutil.which(t) is None]
        if missing:
            why = "%s missing (Unprivileged needs a real second user)" % ", ".join(missing)
    if why:
        print("SKIP: " + why, file=sys.stderr)
        sys.exit(77)
    h.enter_private_namespace(SCRIPT, sys.argv[1:])
    unittest.main(module="__main__", argv=[SCRIPT] + after, verbosity=2)


if __name__ == "__main__":
    main()
