#!/usr/bin/python3
"""A root stagefs daemon on a node that users share, attacked by a second, unprivileged user
(created by the test) and by the daemon's own surroundings: real standalone mounts.

Usage: test_hostile_users.py STAGEFS [-- UNITTEST ARGS (classes)]
(exits 77 without /dev/fuse, root, fusermount3, unshare, nsenter, useradd, userdel, setpriv)

  Status    user.stagefs.status (stagectl status) names the file being copied only to root
            and to callers who may read it through the mount: a copy of a file inside a
            0700 directory shows others that a transfer runs, not its name or size
  Names     a file name with a carriage return, escape sequences (OSC title, CSI) and a
            UTF-8 encoded C1 control: stagectl status, prefetch and evict print it escaped,
            in text and in --json
  Metrics   --metrics-file in a sticky world-writable directory: a user who plants the old
            fixed temporary name (a directory) does not freeze the file; a symlink planted
            at the path itself is replaced, its target untouched; a file that cannot be
            rewritten (its filesystem full) is removed and logged, not left saying
            stagefs_up 1
  LogFlood  a user rewrites their own file while reopening it through the mount, 3,000
            times: each cause's lines stay within the log's burst (20; the daemon wrote
            hundreds of identical error lines before) and the log says how many it held back
  Signals   the daemon's stderr is a pipe whose reader went away (SIGPIPE), and SIGUSR1,
            SIGUSR2, SIGALRM: the mount keeps serving and still stops cleanly on unmount
  Sparse    the user's 1 TiB file with one written byte, opened through the mount, moves one
            chunk (its holes never travel, and stay holes in the cache), and another user's
            open after it is served with the chunks of its own data
  BatchAcl  a file that an ACL (setfacl) denies to the user is not copied into the cache by
            the user's open of a sibling; the user's own open of it is refused
  Prefetch  stagectl prefetch of a directory the user cannot list fails with the reason (exit
            1, "Permission denied") and stages nothing; of a directory with such a
            subdirectory it stages the rest and names the subdirectory that failed
  Budgets   a walk over directories of empty files with --prefetch-max-bytes 4K stages one
            file, not thousands; one open in a directory of 30,000 empty files stages the
            default budget of 16,384, not the directory
  ClosedDirectory
            a directory the user could search (its attributes cached by the kernel for
            --attr-timeout) is closed (chmod 700) on the source: the user learns nothing
            of it afterwards: no stat of a file created there (lookup), no size of a known
            file grown since (getattr), no new symlink's target nor a known one's
            (readlink), no extended attribute (getxattr, listxattr); root still does
  Listing   a user lists (ls -f) 20,000 entries with 250-byte names 14 levels deep: the
            daemon's memory grows by at most 2 KB per entry (a path per node, twice, took
            9 KB), and once the kernel forgot the entries (drop_caches) it falls back to
            within 0.5 KB per entry of where it started

Transfers are held at a chunk (bcast/holds/holds.h: STAGE_TEST_HOLD=mid-file,
STAGE_TEST_HOLD_BLOCK=1); every wait is a bounded poll of a condition. Standard library only.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
sys.path.insert(0, HERE)
import stagefs_harness as h  # noqa: E402
import test_wrong_bytes_and_access as wrong_bytes  # noqa: E402  (UserCase)

MiB = h.MiB
# What a terminal acts on: C0 controls but the newline, DEL, and C1 controls (as UTF-8).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f\x80-\x9f]")

GETXATTR = "import os,sys; sys.stdout.write(os.getxattr(sys.argv[1], sys.argv[2]).decode())"


def stagectl():
    return os.path.join(os.path.dirname(h.STAGEFS), "stagectl")


def run_raw(cmd, timeout=60):
    """Runs cmd (own session): (exit status, stdout, stderr) as str, every byte kept (no newline
    translation: a carriage return stays one; bytes that are not UTF-8 as surrogates)."""
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        h.stop_popen(p, grace=5)
        raise AssertionError("timed out after %ss: %r" % (timeout, cmd))
    return p.returncode, out.decode("utf-8", "surrogateescape"), err.decode("utf-8", "surrogateescape")


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def parse_metrics(text):
    """{(name, labels without mountpoint): value} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        extra = tuple(sorted(kv for kv in labels.rstrip("}").split(",") if kv and not kv.startswith("mountpoint=")))
        out[(name, extra)] = float(value)
    return out


def ignored_signals(pid):
    """The signal numbers pid ignores (SigIgn of /proc/PID/status)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("SigIgn:"):
                mask = int(line.split()[1], 16)
                return {s for s in range(1, 65) if mask & (1 << (s - 1))}
    return set()


class UserCase(wrong_bytes.UserCase):  # a second user, created for the test (as_user, user_cmd)
    def held_daemon(self, *args):
        """A daemon whose transfers stop after their second 64 KiB chunk until the hold file
        (returned) is removed (h.Hold)."""
        with h.Hold(self, "mid-file") as hold:
            d = self.daemon(self.work.file("cache"), "--chunk-size", "64K", *args)
        return d.wait_ready(), hold.file

    def open_in_background(self, path):
        """Reads path through the mount on a thread (its transfer may be held); at cleanup the
        hold is released, then the thread joined."""
        t = threading.Thread(target=lambda: read_all(path), daemon=True)
        t.start()
        hold = self.work.file("hold")
        self.addCleanup(t.join, 60)
        self.addCleanup(lambda: os.path.exists(hold) and os.unlink(hold))
        return t


class Status(UserCase):
    def status_as_user(self, attr="user.stagefs.status"):
        r = self.as_user(h.PYTHON, "-c", GETXATTR, self.work.mnt, attr)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_a_transfer_is_named_only_to_callers_who_may_read_it(self):
        private = os.path.join(self.work.src, "private")
        os.mkdir(private, 0o700)
        h.write_random(os.path.join(private, "merger-plan.bin"), 4 * MiB, 1, mode=0o644)
        h.write_random(os.path.join(self.work.src, "public.bin"), 4 * MiB, 2, mode=0o644)
        d, hold = self.held_daemon()

        # A file in a 0700 directory: the file's own mode would let the user read it, the
        # directory does not let them reach it.
        t = self.open_in_background(os.path.join(self.work.mnt, "private", "merger-plan.bin"))
        h.wait_for(lambda: os.path.exists(hold), 30, "the transfer to reach the hold")
        for attr in ("user.stagefs.status", "user.stagefs.stats"):
            text = self.status_as_user(attr)
            self.assertNotIn("merger-plan", text)
            self.assertNotIn("private", text)
            transfer = json.loads(text)["transfer"]
            self.assertIsInstance(transfer, dict, "a transfer runs: that much is shown")
            self.assertIsNone(transfer.get("path"), transfer)
            self.assertNotIn("bytes_total", transfer)
            self.assertNotIn("bytes_done", transfer)
        r = self.as_user(stagectl(), "status", self.work.mnt)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("merger-plan", r.stdout)
        self.assertIn("transfer: one in flight", r.stdout)
        self.assertEqual(d.stats()["transfer"]["path"], "private/merger-plan.bin")  # root sees it
        os.unlink(hold)
        t.join(60)
        d.wait_transfers(1)

        # A file the user may read: named, with its progress.
        t = self.open_in_background(os.path.join(self.work.mnt, "public.bin"))
        h.wait_for(lambda: os.path.exists(hold), 30, "the second transfer to reach the hold")
        transfer = json.loads(self.status_as_user())["transfer"]
        self.assertEqual(transfer["path"], "public.bin")
        self.assertEqual(transfer["bytes_total"], 4 * MiB)
        os.unlink(hold)
        t.join(60)


class Names(UserCase):
    # A carriage return back to the line's start, an OSC that sets the terminal's title, a CSI
    # that erases the line, and CSI once more as the UTF-8 form of the C1 control U+009B.
    EVIL = b"evil\r\x1b]0;owned\x07\x1b[2Kfake \xc2\x9b31m.bin"

    def assert_no_raw_control(self, text, what):
        m = RAW_CONTROL.search(text)
        self.assertIsNone(m, "%s holds a raw control character %r: %r" % (what, m and m.group(), text))

    def test_stagectl_prints_hostile_names_escaped(self):
        ds = os.path.join(self.work.src.encode(), b"ds")
        os.mkdir(ds)
        h.write_random(os.path.join(ds, self.EVIL), 4 * MiB, 3)  # a single transfer (over --small-file-size)
        d, hold = self.held_daemon()
        t = self.open_in_background(os.path.join(self.work.mnt.encode(), b"ds", self.EVIL))
        h.wait_for(lambda: os.path.exists(hold), 30, "the transfer to reach the hold")
        for args in (["status"], ["--json", "status"]):
            rc, out, err = run_raw([stagectl()] + args + [self.work.mnt])
            self.assertEqual(rc, 0, err)
            self.assertIn("evil", out)
            self.assert_no_raw_control(out, "stagectl %s" % " ".join(args))
            if "--json" in args:  # still the very name, for a program
                self.assertEqual(json.loads(out)["transfer"]["path"].encode(), b"ds/" + self.EVIL)
        os.unlink(hold)
        t.join(60)
        d.wait_transfers(1)

        # Names stagectl found below a directory (listed with --verbose), and errors about them.
        rc, out, err = run_raw([stagectl(), "prefetch", "--verbose", self.work.mnt, "ds"])
        self.assertEqual(rc, 0, err)
        self.assertIn("cached", out)
        self.assertIn("evil", out)
        self.assert_no_raw_control(out, "stagectl prefetch --verbose")
        rc, out, err = run_raw(self.user_cmd(stagectl(), "evict", self.work.mnt, b"ds/" + self.EVIL))
        self.assertEqual(rc, 1)
        self.assertIn("evil", err)
        self.assert_no_raw_control(err, "stagectl evict (refused)")
        rc, out, err = run_raw([stagectl(), "--json", "prefetch", self.work.mnt, "ds"])
        self.assertEqual(rc, 0, err)
        self.assert_no_raw_control(out, "stagectl --json prefetch")


class Metrics(UserCase):
    def shared_dir(self):
        shared = self.work.file("shared")  # as /tmp or /var/tmp: sticky, world-writable
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        return shared

    def metrics_when(self, path, cond):
        def current():
            try:
                m = parse_metrics(read_all(path).decode())
            except (OSError, ValueError):
                return None
            return m if cond(m) else None
        return current

    def test_a_planted_temporary_name_does_not_freeze_the_metrics_file(self):
        h.write_random(os.path.join(self.work.src, "f"), 64 * 1024, 4)
        shared = self.shared_dir()
        path = os.path.join(shared, "stagefs.prom")
        d = self.daemon(self.work.file("cache"), "--metrics-file", path, "--metrics-interval", "0.1").wait_ready()
        h.wait_for(lambda: os.path.exists(path), 30, "the first metrics file")
        # The name the daemon wrote its temporary file under, as a directory of the user's.
        planted = os.path.join(shared, ".stagefs-metrics.%d.tmp" % d.pid)
        r = self.as_user("mkdir", planted)
        self.assertEqual(r.returncode, 0, r.stderr)
        read_all(os.path.join(self.work.mnt, "f"))
        h.wait_for(self.metrics_when(path, lambda m: m.get(("stagefs_opens_total", ())) == 1), 30,
                   "the metrics file to count the open made after the plant")
        self.assertEqual(os.stat(path).st_uid, 0)
        self.assertEqual(os.stat(planted).st_uid, self.uid, "the user's directory was touched")
        left = [n for n in os.listdir(shared) if n.startswith(".stagefs-metrics")]
        self.assertLessEqual(set(left), {os.path.basename(planted)}, "temporary files left behind")

    def test_a_symlink_planted_at_the_metrics_path_is_replaced_not_followed(self):
        shared = self.shared_dir()
        victim = self.work.file("victim")
        with open(victim, "w") as f:
            f.write("root's\n")
        path = os.path.join(shared, "stagefs.prom")
        r = self.as_user("ln", "-s", victim, path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.daemon(self.work.file("cache"), "--metrics-file", path, "--metrics-interval", "0.1").wait_ready()
        h.wait_for(lambda: not os.path.islink(path) and os.path.exists(path), 30, "the metrics file")
        self.assertEqual(read_all(victim), b"root's\n")
        self.assertIn(("stagefs_up", ()), parse_metrics(read_all(path).decode()))

    def test_a_metrics_file_that_cannot_be_rewritten_is_removed_and_logged(self):
        mdir = self.work.file("metrics")
        os.mkdir(mdir)
        h.run(["mount", "-t", "tmpfs", "-o", "size=256k", "stagefs-test", mdir])
        path = os.path.join(mdir, "stagefs.prom")
        d = self.daemon(self.work.file("cache"), "--metrics-file", path, "--metrics-interval", "0.1").wait_ready()
        h.wait_for(self.metrics_when(path, lambda m: m.get(("stagefs_up", ())) == 1), 30, "the metrics file")
        filler = os.path.join(mdir, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.addCleanup(os.close, fd)

        def full_then_failed():
            # The filesystem kept full (a page the daemon frees is taken at the next poll): no
            # new temporary file fits.
            try:
                while os.write(fd, b"\0" * 4096) > 0:
                    pass
            except OSError:
                pass
            return "removed it" in d.output()[1]
        h.wait_for(full_then_failed, 30, "the daemon to log the failed write")
        err = d.output()[1]
        self.assertIn("cannot write --metrics-file %s" % path, err)
        self.assertIn("No space left on device", err)
        os.ftruncate(fd, 0)  # room again
        h.wait_for(self.metrics_when(path, lambda m: m.get(("stagefs_up", ())) == 1), 30,
                   "the metrics file to come back once there is room")
        h.wait_for(lambda: "written again" in d.output()[1], 30, "the daemon to log the recovery")


# Run as the user: each step's answer on one line, "ok VALUE" or "err ERRNO-NAME".
METADATA_PROBE = r"""
import errno, os, subprocess, sys
d = sys.argv[1]
def show(fn):
    try:
        print("ok", fn())
    except OSError as e:
        print("err", errno.errorcode.get(e.errno, str(e.errno)))
def fresh_size(p):  # statx with AT_STATX_FORCE_SYNC: a GETATTR whatever the kernel cached
    r = subprocess.run(["stat", "--cached=never", "-c", "%s", p], capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(errno.EACCES if "Permission denied" in r.stderr else errno.EIO, r.stderr)
    return r.stdout.strip()
show(lambda: os.stat(os.path.join(d, "new")).st_size)
show(lambda: fresh_size(os.path.join(d, "known")))
show(lambda: os.readlink(os.path.join(d, "newlink")))
show(lambda: os.readlink(os.path.join(d, "knownlink")))
show(lambda: os.getxattr(os.path.join(d, "known"), "user.note").decode())
show(lambda: ",".join(sorted(os.listxattr(os.path.join(d, "known")))))
"""


class ClosedDirectory(UserCase):
    def test_a_closed_directory_shows_the_user_nothing_new(self):
        d = os.path.join(self.work.src, "team")
        os.mkdir(d, 0o755)
        known = os.path.join(d, "known")
        with open(known, "wb") as f:
            f.write(b"k" * 100)
        os.chmod(known, 0o644)
        os.symlink("old-target", os.path.join(d, "knownlink"))
        os.setxattr(known, "user.note", b"public")
        self.daemon(self.work.file("cache")).wait_ready()
        m = os.path.join(self.work.mnt, "team")
        # The user looks around: the kernel now holds the directory's attributes (mode 0755),
        # and the entries of known and knownlink (knownlink's target not read yet).
        r = self.as_user(h.PYTHON, "-c", "import os,sys; d=sys.argv[1]; print(sorted(os.listdir(d)), "
                         "os.stat(d + '/known').st_size, os.lstat(d + '/knownlink').st_size)", m)
        self.assertEqual(r.stdout.split("]")[0] + "]", "['known', 'knownlink']", r.stderr)

        # The administrator closes the directory, then puts new things in it.
        os.chmod(d, 0o700)
        with open(os.path.join(d, "new"), "wb") as f:
            f.write(b"n" * 12345)
        os.chmod(os.path.join(d, "new"), 0o644)
        with open(known, "ab") as f:
            f.write(b"k" * 1000)
        os.symlink("new-secret-target", os.path.join(d, "newlink"))
        os.setxattr(known, "user.note", b"secret")
        os.setxattr(known, "user.plan", b"secret")

        r = self.as_user(h.PYTHON, "-c", METADATA_PROBE, m)
        got = r.stdout.splitlines()
        self.assertEqual(len(got), 6, r.stdout + r.stderr)
        steps = ["stat of a new file", "stat of a known file", "readlink of a new symlink",
                 "readlink of a known symlink", "getxattr", "listxattr"]
        self.assertEqual(dict(zip(steps, got)), {step: "err EACCES" for step in steps},
                         "what the user learnt of the closed directory")
        # Root, through the mount, sees all of it.
        self.assertEqual(os.stat(os.path.join(m, "new")).st_size, 12345)
        self.assertEqual(os.readlink(os.path.join(m, "newlink")), "new-secret-target")
        self.assertEqual(os.getxattr(os.path.join(m, "known"), "user.note"), b"secret")
        # Opened again: the user is back.
        os.chmod(d, 0o755)
        r = self.as_user(h.PYTHON, "-c", METADATA_PROBE, m)
        self.assertEqual(r.stdout.splitlines()[0], "ok 12345", r.stdout + r.stderr)


rss_kib = h.rss_kib


def deep_listing(root, depth, n):
    """root/L00.../L13... (each level's name 250 bytes) holding n empty files with 250-byte
    names; returns the levels' names."""
    names = [("L%02d" % i).ljust(250, "x") for i in range(depth)]
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.mkdir(name, 0o755, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        for i in range(n):
            os.close(os.open(("f%06d" % i).ljust(250, "y"), os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return names


class Listing(UserCase):
    N = 20000

    def test_a_deep_listing_costs_about_a_kilobyte_per_entry_and_is_given_back(self):
        names = deep_listing(self.work.src, 14, self.N)
        d = self.daemon(self.work.file("cache")).wait_ready()
        idle = rss_kib(d.pid)
        # The user walks down one level at a time (the path is longer than PATH_MAX allows
        # at once) and lists: READDIRPLUS looks every entry up.
        r = self.as_user("sh", "-c", 'cd "$1" && shift && for d in "$@"; do cd "$d" || exit 1; done && ls -f | wc -l',
                         "sh", self.work.mnt, *names, timeout=120)
        self.assertEqual(r.stdout.strip(), str(self.N + 2), r.stderr)
        per_entry = (rss_kib(d.pid) - idle) * 1024 / self.N
        h.log("daemon RSS: %d KiB idle, %.0f bytes per listed entry" % (idle, per_entry))
        self.assertLess(per_entry, 2048, "the daemon holds %.0f bytes per listed entry" % per_entry)
        # The kernel forgets the entries (FORGET for each): their memory goes back.
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        h.wait_for(lambda: (rss_kib(d.pid) - idle) * 1024 / self.N < 512, 60,
                   "the daemon's RSS to come back within 0.5 KB per entry of its idle %d KiB once the kernel "
                   "forgot the entries" % idle)


# Run as the user: rewrites argv[1] (the source) on a thread while reopening argv[2] (the same
# file through the mount) argv[3] times or for 20 s; prints reopens and failures.
REWRITE_AND_REOPEN = r"""
import os, sys, threading, time
src, mnt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop = threading.Event()
def rewrite():
    while not stop.is_set():
        with open(src, "r+b") as f:
            f.write(os.urandom(4096))
threading.Thread(target=rewrite, daemon=True).start()
failed, end, i = 0, time.monotonic() + 20, 0
while i < n and time.monotonic() < end:
    i += 1
    try:
        with open(mnt, "rb") as f:
            f.read()
    except OSError:
        failed += 1
stop.set()
print(i, failed)
"""


class LogFlood(UserCase):
    def test_a_user_who_makes_transfers_fail_at_will_floods_no_log(self):
        mine = os.path.join(self.work.src, "mine")
        os.mkdir(mine)
        f = os.path.join(mine, "f")
        h.write_random(f, 4 * MiB, 9)
        os.chown(mine, self.uid, self.gid)
        os.chown(f, self.uid, self.gid)
        d = self.daemon(self.work.file("cache")).wait_ready()
        r = self.as_user(h.PYTHON, "-c", REWRITE_AND_REOPEN, f, os.path.join(self.work.mnt, "mine", "f"), 3000,
                         timeout=120)
        reopens, failed = map(int, r.stdout.split())
        self.assertGreater(failed, 100, "the rewrites made too few transfers fail to test anything: %s" % r.stdout)
        self.assertEqual(d.stop(), 0)
        lines = d.output()[1].splitlines()
        # Lines of one cause look alike once their numbers are taken out.
        shapes = {}
        for line in lines:
            shape = re.sub(r"[0-9]+", "N", line)
            shapes[shape] = shapes.get(shape, 0) + 1
        h.log("%d reopens (%d failed): %d log lines, %d shapes" % (reopens, failed, len(lines), len(shapes)))
        flooding = {shape: n for shape, n in shapes.items() if n > 20}
        self.assertEqual(flooding, {}, "causes that wrote more than their burst of 20 lines")
        self.assertLessEqual(len(lines), 200)
        self.assertTrue(any("were not logged" in line for line in lines), "no count of the lines held back")


class Signals(h.MountTestCase):
    def test_a_log_reader_that_went_away_does_not_kill_the_daemon(self):
        h.write_random(os.path.join(self.work.src, "a"), 64 * 1024, 5)
        h.write_random(os.path.join(self.work.src, "b"), 64 * 1024, 6)
        cmd = [h.STAGEFS, self.work.src, self.work.mnt, "--cache", self.work.file("cache")]
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=h.clean_env(), start_new_session=True)
        self.addCleanup(h.stop_popen, p)
        self.addCleanup(lambda: h.mounts_under(self.work.mnt) and h.force_unmount(self.work.mnt))
        h.run([h.STAGEFS, "--wait", self.work.mnt, "--wait-timeout", "30"], timeout=60)
        p.stderr.close()  # the reader goes away (a log pipeline ended, a terminal closed)
        # Each materialization logs a line: into a pipe nobody reads.
        self.assertEqual(read_all(os.path.join(self.work.mnt, "a")), read_all(os.path.join(self.work.src, "a")))
        self.assertEqual(read_all(os.path.join(self.work.mnt, "b")), read_all(os.path.join(self.work.src, "b")))
        self.assertIsNone(p.poll(), "the daemon died")
        self.assertIn(signal.SIGPIPE, ignored_signals(p.pid))
        h.run(["fusermount3", "-u", self.work.mnt], timeout=30)
        self.assertEqual(p.wait(timeout=30), 0)

    def test_usr1_usr2_and_alrm_do_not_stop_the_mount(self):
        h.write_random(os.path.join(self.work.src, "a"), 64 * 1024, 7)
        d = self.daemon(self.work.file("cache")).wait_ready()
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            os.kill(d.pid, sig)
        # A signal whose action is to end the process ends it before kill() returns (the
        # kernel marks the whole group as exiting): whatever answers now is a survivor.
        self.assertEqual(read_all(os.path.join(self.work.mnt, "a")), read_all(os.path.join(self.work.src, "a")))
        self.assertEqual(d.stats()["state"], "ready")
        self.assertIsNone(d.proc.poll())
        self.assertLessEqual({signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM}, ignored_signals(d.pid))
        self.assertEqual(d.stop(), 0)


PROBE_AT = r"""
import errno, os, sys
path, off = sys.argv[1], int(sys.argv[2])
try:
    fd = os.open(path, os.O_RDONLY)
    print("ok", os.pread(fd, 4, off).hex())
    os.close(fd)
except OSError as e:
    print("err", errno.errorcode.get(e.errno, str(e.errno)))
"""


def cached_files(cache, rel):
    """Regular files (copies) in the cache below the source path rel."""
    root = os.path.join(cache, "data", rel)
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if not n.startswith(".")]


class Sparse(UserCase):
    def test_a_users_sparse_terabyte_moves_its_data_and_another_users_open_goes_next(self):
        home = os.path.join(self.work.src, "alice")
        os.mkdir(home, 0o755)
        os.chown(home, self.uid, self.gid)
        huge = os.path.join(home, "huge.img")
        data_at = 512 << 30
        r = self.as_user("sh", "-c", "truncate -s 1T %s && printf stagefs | dd of=%s bs=1 seek=%d conv=notrunc "
                         "status=none" % (huge, huge, data_at))
        self.assertEqual(r.returncode, 0, r.stderr)
        if os.stat(huge).st_blocks * 512 > 1 << 20:
            self.skipTest("the source filesystem has no sparse files")
        h.write_random(os.path.join(self.work.src, "other.bin"), 20 * MiB, 8)
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()  # 16 MiB chunks

        got = self.as_user(h.PYTHON, "-c", PROBE_AT, os.path.join(self.work.mnt, "alice", "huge.img"), data_at,
                           timeout=60)
        self.assertEqual(got.stdout.split(), ["ok", b"stag".hex()], got.stderr)
        s = d.wait_transfers(1)
        self.assertEqual(s.get("chunks_broadcast"), 1, "the one chunk that holds data, not 65,536 chunks of holes")
        # Another user's open after it: its own two chunks, nothing of the sparse file's.
        self.assertEqual(read_all(os.path.join(self.work.mnt, "other.bin")),
                         read_all(os.path.join(self.work.src, "other.bin")))
        s = d.wait_transfers(2)
        self.assertEqual(s.get("chunks_broadcast"), 3)
        err = d.output()[1]
        self.assertLess(err.index("materialized alice/huge.img"), err.index("materialized other.bin"))
        copy = os.stat(os.path.join(cache, "data", "alice", "huge.img"))
        self.assertEqual(copy.st_size, 1 << 40)
        self.assertLessEqual(copy.st_blocks * 512, 1 << 20, "the copy keeps the holes")


class BatchAcl(UserCase):
    def test_a_file_an_acl_denies_the_user_is_not_batched_by_their_open_of_a_sibling(self):
        ds = os.path.join(self.work.src, "ds")
        os.mkdir(ds, 0o755)
        for name, seed in (("a", 1), ("secret", 2), ("c", 3)):
            h.write_random(os.path.join(ds, name), 4096, seed, mode=0o644)
        r = h.run(["setfacl", "-m", "u:%d:---" % self.uid, os.path.join(ds, "secret")], check=False)
        if r.returncode != 0:
            self.skipTest("no POSIX ACLs on the source filesystem: %s" % r.stderr.strip())
        self.assertEqual(self.probe("read", os.path.join(ds, "secret")), ["err", "EACCES"], "the ACL holds")
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()

        self.assertEqual(self.probe("read", os.path.join(self.work.mnt, "ds", "a"))[0], "ok")
        d.wait_transfers(1)
        copies = sorted(os.path.basename(p) for p in cached_files(cache, "ds"))
        self.assertEqual(copies, ["a", "c"], "the batch copied a file the user may not read")
        self.assertEqual(self.probe("read", os.path.join(self.work.mnt, "ds", "secret")), ["err", "EACCES"])
        self.assertNotIn("secret", [os.path.basename(p) for p in cached_files(cache, "ds")])


class Prefetch(UserCase):
    def prefetch_as_user(self, *paths):
        return run_raw(self.user_cmd(stagectl(), "--json", "prefetch", self.work.mnt, *paths))

    def test_a_directory_the_user_cannot_list_fails_with_the_reason(self):
        private = os.path.join(self.work.src, "private")
        os.mkdir(private, 0o700)
        h.write_random(os.path.join(private, "f"), 4096, 4)
        cache = self.work.file("cache")
        self.daemon(cache).wait_ready()
        rc, out, err = self.prefetch_as_user("private")
        self.assertEqual(rc, 1, out + err)
        j = json.loads(out)
        self.assertFalse(j["ok"])
        self.assertEqual([(os.path.basename(r["path"]), r["ok"], r["error"]) for r in j["results"]],
                         [("private", False, "Permission denied")])
        rc, out, err = run_raw(self.user_cmd(stagectl(), "prefetch", self.work.mnt, "private"))
        self.assertEqual(rc, 1)
        self.assertIn("private: Permission denied", err)
        self.assertEqual(cached_files(cache, ""), [])

    def test_a_subdirectory_the_user_cannot_list_is_named_and_the_rest_staged(self):
        top = os.path.join(self.work.src, "mixed")
        os.makedirs(os.path.join(top, "closed"))
        os.chmod(os.path.join(top, "closed"), 0o700)
        h.write_random(os.path.join(top, "open.bin"), 4096, 5)
        h.write_random(os.path.join(top, "closed", "hidden.bin"), 4096, 6)
        cache = self.work.file("cache")
        self.daemon(cache).wait_ready()
        rc, out, err = self.prefetch_as_user("mixed")
        self.assertEqual(rc, 1, "not everything asked for was staged")
        results = {os.path.relpath(r["path"], self.work.mnt): r for r in json.loads(out)["results"]}
        self.assertTrue(results["mixed/open.bin"]["ok"])
        self.assertEqual(results["mixed/closed"]["error"], "Permission denied")
        self.assertEqual([os.path.relpath(p, os.path.join(cache, "data")) for p in cached_files(cache, "")],
                         ["mixed/open.bin"])


class Budgets(UserCase):
    def wait_budget_stop(self, d):
        h.wait_for(lambda: d.stats().get("budget_stops", 0) >= 1, 120, "a budget to stop the staging")

    def empty_files(self, d, n):
        os.makedirs(d, exist_ok=True)
        for i in range(n):
            os.close(os.open(os.path.join(d, "f%06d" % i), os.O_WRONLY | os.O_CREAT, 0o644))

    def test_a_walk_of_empty_files_keeps_to_a_4k_budget(self):
        w = os.path.join(self.work.src, "w")
        for sub in "ab":
            self.empty_files(os.path.join(w, sub), 1)
        for sub in "cdefgh":
            self.empty_files(os.path.join(w, sub), 1000)
        cache = self.work.file("cache")
        d = self.daemon(cache, "--prefetch-max-bytes", "4K").wait_ready()
        for sub in "ab":  # a reader walking the tree: two sibling directories
            self.assertEqual(self.probe("read", os.path.join(self.work.mnt, "w", sub, "f000000"))[0], "ok")
        self.wait_budget_stop(d)
        prefetched = sum(len(cached_files(cache, os.path.join("w", sub))) for sub in "cdefgh")
        self.assertLessEqual(prefetched, 1, "an empty file's copy is not free: 4 KiB pays for none")

    def test_one_open_in_a_directory_of_30000_empty_files_stages_the_default_budget(self):
        big = os.path.join(self.work.src, "big")
        self.empty_files(big, 30000)
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()  # --batch-max-files 4096, --prefetch-max-files 16384
        self.assertEqual(self.probe("read", os.path.join(self.work.mnt, "big", "f000000"))[0], "ok")
        self.wait_budget_stop(d)
        self.assertEqual(len(cached_files(cache, "big")), 16384)
        self.assertIn("batch big/: 16384 small file(s)", d.output()[1])


if __name__ == "__main__":
    h.main(__file__, tools=("useradd", "userdel", "setpriv", "setfacl"))
