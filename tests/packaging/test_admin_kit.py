#!/usr/bin/python3
"""The admin kit's Slurm prolog and epilog (packaging/admin/), run as slurmd runs them: as root,
with a job's SLURM_JOB_ID, SLURM_JOB_UID and SLURM_JOB_USER, for real users, on directories of
the test's own (a settings file named by STAGEFS_CONF), in a private mount namespace.

Usage: test_admin_kit.py STAGEFS [-- UNITTEST ARGS...]
(exits 77 without root, /dev/fuse, fusermount3, unshare, nsenter, useradd, userdel, setpriv, flock)

  Prolog  the job's mount point and the user's cache are created, the user's alone (0700),
          below directories of root's (0755); /dev/fuse gets STAGEFS_FUSE_MODE (on a device
          node of the test's, bound over /dev/fuse here). The user's cache is kept with its
          copies; a directory of another uid at the user's cache path, and a symlink at the
          job's mount point, are replaced (the symlink's target untouched). A parent that others
          may write to is refused: nothing is created below it.
  Epilog  a stale mount of a killed stagefs at the job's mount point is unmounted and the mount
          point removed. Caches: one not used for STAGEFS_PURGE_AFTER_DAYS is purged, then,
          while the filesystem is fuller than STAGEFS_PURGE_ABOVE, the least recently used;
          a purge removes all the cache holds (the user's other files too) but its lock and
          spares; a cache in use (its lock held) is never purged; a symlink planted in a
          cache is removed, not followed.
Every test exits 0 from the scripts (they never fail a job).
"""
import fcntl
import os
import shutil
import signal
import stat
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import stagefs_harness as h  # noqa: E402

KIT = os.path.join(HERE, "..", "..", "packaging", "admin")
USERS = ("stagefs-kit1", "stagefs-kit2")
DAY = 86400


def owner_mode(path):
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


class KitCase(h.MountTestCase):
    def setUp(self):
        self.users = [h.ensure_user(self, n) for n in USERS]  # first: userdel after the fixture's cleanup
        super().setUp()
        self.conf = self.work.file("stagefs.conf")
        self.settings(STAGEFS_MOUNT=self.work.file("stage") + "/%j",
                      STAGEFS_CACHE=self.work.file("nvme/stagefs") + "/%u", STAGEFS_FUSE_MODE="")

    def settings(self, **kv):
        with open(self.conf, "w") as f:
            f.write("# the test's site\n")
            for k, v in kv.items():
                f.write('%s="%s"\n' % (k, v))
        os.chmod(self.conf, 0o644)

    def script(self, name, job, user):
        env = {"PATH": "/usr/bin:/bin", "STAGEFS_CONF": self.conf, "SLURM_JOB_ID": str(job),
               "SLURM_JOB_UID": str(user.pw_uid), "SLURM_JOB_USER": user.pw_name,
               "SLURM_JOB_GID": str(user.pw_gid)}
        r = h.run([os.path.join(KIT, name)], env=env, check=False, timeout=120)
        h.log("[%s job %s] rc %d: %s" % (name, job, r.returncode, r.stderr.strip()))
        self.assertEqual(r.returncode, 0, "the %s must never fail a job:\n%s" % (name, r.stderr))
        return r.stderr


class Prolog(KitCase):
    def test_prepares_the_jobs_mount_point_and_the_users_cache(self):
        u = self.users[0]
        node = self.work.file("fuse-dev")  # a /dev/fuse of this namespace's own, mode 0600
        os.mknod(node, 0o600 | stat.S_IFCHR, os.stat("/dev/fuse").st_rdev)
        os.chmod(node, 0o600)
        h.run(["mount", "--bind", node, "/dev/fuse"])
        self.addCleanup(h.run, ["umount", "/dev/fuse"], check=False)
        self.settings(STAGEFS_MOUNT=self.work.file("stage") + "/%j",
                      STAGEFS_CACHE=self.work.file("nvme/stagefs") + "/%u", STAGEFS_FUSE_MODE="0666")
        self.script("slurm-prolog", 42, u)
        self.assertEqual(owner_mode(self.work.file("stage/42")), (u.pw_uid, 0o700))
        self.assertEqual(owner_mode(self.work.file("nvme/stagefs/" + u.pw_name)), (u.pw_uid, 0o700))
        for parent in ("stage", "nvme", "nvme/stagefs"):
            self.assertEqual(owner_mode(self.work.file(parent)), (0, 0o755), parent)
        self.assertEqual(stat.S_IMODE(os.stat("/dev/fuse").st_mode), 0o666)
        self.assertEqual(os.listdir(self.work.file("stage/42")), [])

    def test_keeps_the_users_cache_and_replaces_anyone_elses(self):
        u, other = self.users
        mine = self.work.file("nvme/stagefs/" + u.pw_name)
        theirs = self.work.file("nvme/stagefs/" + other.pw_name)
        for d, owner in ((mine, u), (theirs, u)):  # the second: `other`'s path, someone else's dir
            os.makedirs(os.path.join(d, "data"))
            with open(os.path.join(d, "data", "copy"), "w") as f:
                f.write("a copy")
            for p in (d, os.path.join(d, "data"), os.path.join(d, "data", "copy")):
                os.chown(p, owner.pw_uid, owner.pw_gid)
        os.chmod(self.work.file("nvme"), 0o755)
        os.chmod(self.work.file("nvme/stagefs"), 0o755)
        victim = self.work.file("victim")
        os.mkdir(victim, 0o755)
        os.makedirs(self.work.file("stage"), 0o755)
        os.symlink(victim, self.work.file("stage/43"))

        self.script("slurm-prolog", 42, u)
        self.assertTrue(os.path.isfile(os.path.join(mine, "data", "copy")), "the user's copies were removed")
        self.assertEqual(owner_mode(mine), (u.pw_uid, 0o700))

        err = self.script("slurm-prolog", 43, other)
        self.assertIn("replacing %s (owner uid %d)" % (theirs, u.pw_uid), err)
        self.assertEqual(owner_mode(theirs), (other.pw_uid, 0o700))
        self.assertEqual(os.listdir(theirs), [], "another uid's files were handed over")
        self.assertFalse(os.path.islink(self.work.file("stage/43")))
        self.assertEqual(owner_mode(self.work.file("stage/43")), (other.pw_uid, 0o700))
        self.assertEqual(owner_mode(victim), (0, 0o755), "the symlink's target was changed")

    def test_a_parent_others_may_write_is_refused(self):
        u = self.users[0]
        opened = self.work.file("open")
        os.mkdir(opened)
        os.chmod(opened, 0o777)  # not sticky: anyone could swap what the prolog creates
        self.settings(STAGEFS_MOUNT=opened + "/%j", STAGEFS_CACHE=self.work.file("nvme/stagefs") + "/%u",
                      STAGEFS_FUSE_MODE="")
        err = self.script("slurm-prolog", 42, u)
        self.assertIn("%s must be a directory of root's that others cannot write to" % opened, err)
        self.assertEqual(os.listdir(opened), [])
        self.assertEqual(owner_mode(self.work.file("nvme/stagefs/" + u.pw_name)), (u.pw_uid, 0o700))


class Epilog(KitCase):
    def test_unmounts_what_the_job_left_and_removes_its_mount_point(self):
        u = self.users[0]
        self.script("slurm-prolog", 42, u)
        mnt = self.work.file("stage/42")
        with open(os.path.join(self.work.src, "f"), "w") as f:
            f.write("f")
        d = self.daemon(self.work.file("cache"), mnt=mnt).wait_ready()
        for p in h.all_pids():  # a job killed with SIGKILL: the daemon and its unmount watcher
            if h.proc_ppid(p) == d.pid and os.path.basename(h.proc_cmdline(p)[0]) == b"fusermount3":
                h.kill_pid(p, signal.SIGKILL)
        os.kill(d.pid, signal.SIGKILL)
        d.wait_exit(30)
        self.assertIn(mnt, h.mounts_under(mnt), "the killed daemon's mount should be left")

        err = self.script("slurm-epilog", 42, u)
        self.assertIn("unmounted %s (left behind)" % mnt, err)
        self.assertEqual(h.mounts_under(mnt), [])
        self.assertFalse(os.path.lexists(mnt))

    def test_purges_unused_then_least_recently_used_caches_never_one_in_use(self):
        u1, u2 = self.users
        root = self.work.file("nvme")
        os.mkdir(root, 0o755)
        h.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", root])
        self.addCleanup(h.run, ["umount", "-l", root], check=False)
        self.settings(STAGEFS_MOUNT=self.work.file("stage") + "/%j", STAGEFS_CACHE=root + "/stagefs/%u",
                      STAGEFS_FUSE_MODE="", STAGEFS_PURGE_AFTER_DAYS="30", STAGEFS_PURGE_ABOVE="30")
        for u in (u1, u2):
            self.script("slurm-prolog", 42, u)
        now = time.time()
        victim = self.work.file("victim")
        os.mkdir(victim)
        with open(os.path.join(victim, "keep"), "w") as f:
            f.write("keep")
        # cache (owner, MiB, last use in days ago)
        caches = {"u1": (u1, 6, 40), "u2": (u2, 6, 2), "u2/spare.1": (u2, 2, 50), "u1/spare.1": (u1, 1, 0)}
        paths = {}
        for name, (u, mib, age) in caches.items():
            c = os.path.join(root, "stagefs", name.replace("u1", u1.pw_name).replace("u2", u2.pw_name))
            paths[name] = c
            os.makedirs(os.path.join(c, "data"), exist_ok=True)
            with open(os.path.join(c, "data", "img"), "wb") as f:
                f.write(os.urandom(mib * h.MiB))
            if name == "u1":
                os.symlink(victim, os.path.join(c, "data", "planted"))
                os.mkdir(os.path.join(c, "images"))  # stage-bcast's copies kept there
                os.chown(os.path.join(c, "images"), u.pw_uid, u.pw_gid)
            with open(os.path.join(c, ".lock"), "w") as f:
                f.write("pid 1 on n1\n")
            for p in (c, os.path.join(c, "data"), os.path.join(c, "data", "img"), os.path.join(c, ".lock")):
                os.chown(p, u.pw_uid, u.pw_gid)
            os.utime(os.path.join(c, ".lock"), (now - age * DAY, now - age * DAY))
        held = open(os.path.join(paths["u2/spare.1"], ".lock"))  # a running stagefs's lock
        self.addCleanup(held.close)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)

        err = self.script("slurm-epilog", 42, u1)
        has_data = {name: os.path.exists(os.path.join(c, "data")) for name, c in paths.items()}
        self.assertEqual(has_data, {"u1": False, "u2": False, "u2/spare.1": True, "u1/spare.1": True}, err)
        self.assertIn("purged %s (not used for 30 days)" % paths["u1"], err)
        self.assertIn("purged %s (the filesystem was" % paths["u2"], err)
        self.assertEqual(os.listdir(victim), ["keep"], "a planted symlink was followed")
        self.assertEqual(sorted(os.listdir(paths["u1"])), [".lock", "spare.1"], "a purge keeps the lock and spares only")
        self.assertTrue(os.path.exists(os.path.join(paths["u2"], "spare.1", "data", "img")))


def main():
    missing = [t for t in ("useradd", "userdel", "setpriv", "flock", "mountpoint") if shutil.which(t) is None]
    if missing:
        print("SKIP: %s missing" % ", ".join(missing), file=sys.stderr)
        sys.exit(77)
    h.main(__file__)


if __name__ == "__main__":
    main()
