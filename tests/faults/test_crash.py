#!/usr/bin/python3
"""Fault injection: crashes, a full disk and a source that changes (ctest label "faults").

Usage: test_crash.py STAGE_BCAST STAGEFS [MPIRUN ARGS...] [-- UNITTEST ARGS...]
Exits 77 (skipped) without /dev/fuse, root, fusermount3, unshare, nsenter, mount or mpirun.

The crash points come from the holding store and source the tools wrap their own in when
asked (bcast/holds/holds.h): with STAGE_TEST_HOLD=<point> [STAGE_TEST_HOLD_RANK=<rank>]
STAGE_TEST_HOLD_FILE=<path> a process reaching <point> creates <path> and SIGSTOPs itself, so
a test can kill -9 it exactly there.

  CrashBcast     kill -9 of rank 1 of `stage-bcast -np 2` at before-first-chunk, mid-file and
                 before-rename, with and without an old copy at the destinations: no node ever
                 shows a partial file under the final name; the next run sweeps the dead
                 writer's temporary file and stages the file everywhere. Also swept: a dead
                 writer's temporary file beside a copy that is current (crash of an
                 --overwrite run), and one whose writer is an unreaped zombie.
  CrashStagefs   kill -9 of a standalone stagefs at mid-file / before-rename while an open
                 waits: the open fails, auto_unmount removes the mount, nothing is published in
                 the cache; a restart sweeps the temporary file and serves correct bytes.
  DiskFull       a destination / cache on a small tmpfs: the up-front check fails with
                 "need N bytes, M free" on every rank (stage-bcast) or ENOSPC for the open
                 (stagefs) and touches nothing else; ENOSPC in the middle of the copy (the disk
                 is filled while the writer is held before its first chunk) fails cleanly, for
                 stage-bcast and for stagefs (whose mount keeps working).
  SourceChange   the source is appended to, rewritten in place, or replaced by rename while
                 the source rank is held mid-file: every rank exits 1 saying the source
                 changed, nothing is published; a fresh run stages the new content. For
                 stagefs: a source rewritten during a materialization fails that open and a
                 retry gets the new content; a source changed between two jobs (new mtime,
                 restored mtime, replaced by rename) is materialized again.

Reuses tests/mount/stagefs_harness.py: the private mount namespace, Work / Daemon fixtures,
bounded polling, /proc helpers, process and mount cleanup. Standard library only.
No sleeps for synchronization: every wait is a bounded poll of a file, a process state or
/proc/self/mountinfo; every subprocess has a timeout.
"""
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import stagefs_harness as H  # noqa: E402

KiB = H.KiB
MiB = H.MiB
BCAST = None          # the stage-bcast binary (argv[1]); H.STAGEFS is argv[2]
TEMP_MARK = H.TEMP_MARK
CHUNK = "64K"         # so that "mid-file" (after the second chunk) is really mid-file
T_OLD = 1_500_000_000_111_111_111   # mtime of the "old copies"
T_NEW = 1_600_000_000_123_456_789   # mtime of the sources


# ---- small helpers ----------------------------------------------------------------------

def pids_with_env(entry, exe=None, extra=None):
    """Live processes whose environment holds `entry` (bytes, "K=V"), optionally also `extra`,
    and whose argv[0] has basename `exe`."""
    out = []
    for pid in H.all_pids():
        if pid == os.getpid():
            continue
        env = H.proc_environ(pid)
        if entry not in env or (extra is not None and extra not in env):
            continue
        if exe is not None:
            args = H.proc_cmdline(pid)
            if not args or os.path.basename(args[0]) != exe:
                continue
        if H.pid_alive(pid):
            out.append(pid)
    return out


def become_subreaper():
    """prctl(PR_SET_CHILD_SUBREAPER): ranks orphaned by a dying mpirun become our children, so
    the test reaps them (this container's PID 1 does not reap zombies, and a zombie's pid still
    answers kill(pid, 0))."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def hold_env(point, hold_file, rank=None):
    env = {"STAGE_TEST_HOLD": point, "STAGE_TEST_HOLD_FILE": hold_file}
    if rank is not None:
        env["STAGE_TEST_HOLD_RANK"] = str(rank)
    return env


def write_bytes(path, size, seed, mtime_ns=None):
    H.write_random(path, size, seed)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def fingerprint(path):
    """(inode, size, sha256) of a file, or None when absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, H.sha256_file(path))


def read_via_mount(path, timeout=60):
    """Opens and hashes path in a child (bounded): ("ok", sha, size) or ("err", errno, text)."""
    r = H.run([H.PYTHON, H.HARNESS, "reader", path], input="\n", timeout=timeout, check=False)
    lines = [l for l in r.stdout.splitlines() if l and l != "ready"]
    if not lines:
        raise AssertionError("reader of %s printed nothing (rc %d): %s" % (path, r.returncode, r.stderr))
    parts = lines[0].split(None, 3)
    if parts[0] == "ok":
        return ("ok", parts[1], int(parts[2]))
    return ("err", int(parts[1]), lines[0])


def fill_filesystem(path):
    """Writes path until the filesystem is full (ENOSPC); returns the bytes written."""
    n = 0
    block = b"\xa5" * MiB
    with open(path, "wb", buffering=0) as f:
        for size in (MiB, 64 * KiB, 4 * KiB, 512, 1):
            while True:
                try:
                    w = f.write(block[:size])
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
                if not w:
                    break
                n += w
    return n


# ---- fixture ------------------------------------------------------------------------------

class FaultCase(H.MountTestCase):
    """MountTestCase (work dir, standalone daemons, cleanup) plus: jobs started in the
    background (mpirun, stage-bcast, readers) and processes held at a hold point, all ended
    in teardown before the harness looks for leftovers; tmpfs mounts undone."""

    def setUp(self):
        super().setUp()
        self.t0 = time.monotonic()
        self.procs = []        # Popen objects we started
        self.hold_files = []   # every hold file handed out (a held process carries it in its env)
        self.tmpfs = []
        self.job_pids = set()  # every process seen carrying a hold file

    def _teardown(self):
        try:
            for p in self.procs:
                H.stop_popen(p, grace=5)
            for hf in self.hold_files:
                self.kill_env_pids(hf)
            self.reap_orphans()
            for d in self.daemons:  # a held daemon cannot unmount: end it, auto_unmount follows
                if d.proc.poll() is None and H.proc_state(d.pid) == "T":
                    H.kill_pid(d.pid, signal.SIGKILL)
                    d.wait_exit(10)
        finally:
            try:
                super()._teardown()
            finally:
                for mp in reversed(self.tmpfs):
                    if mp in H.mounts_under(mp):
                        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, timeout=30)
                H.log("    %s took %.1fs" % (self.id().rsplit(".", 1)[-1], time.monotonic() - self.t0))

    # -- processes
    def reap_orphans(self):
        """Reaps zombie children that are not Popen objects of ours (orphans we adopted as
        subreaper); returns the pids reaped."""
        known = {p.pid for p in self.procs} | {d.proc.pid for d in self.daemons}
        me = os.getpid()
        reaped = []
        for pid in H.all_pids():
            if pid in known or H.proc_ppid(pid) != me or H.proc_state(pid) != "Z":
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
        return reaped

    def wait_job_pids_gone(self, timeout=20):
        """Waits until every process of a killed job is gone from /proc (reaping orphans):
        a zombie's pid would still count as a live writer for the temp-file sweep."""
        def gone():
            self.reap_orphans()
            left = [p for p in self.job_pids if os.path.exists("/proc/%d" % p)]
            return not left or None
        try:
            H.wait_for(gone, timeout, "the killed job's processes to be reaped")
        except AssertionError:
            raise AssertionError("processes of the killed job still exist: %s" %
                                 [(p, H.proc_state(p), H.proc_ppid(p)) for p in self.job_pids
                                  if os.path.exists("/proc/%d" % p)])
        self.job_pids.clear()

    def kill_env_pids(self, hold_file):
        """SIGKILLs every process carrying hold_file in its environment; bounded wait."""
        entry = b"STAGE_TEST_HOLD_FILE=" + hold_file.encode()
        for pid in pids_with_env(entry):
            H.kill_pid(pid, signal.SIGKILL)
        H.wait_for(lambda: not pids_with_env(entry), 20, "processes holding %s to vanish" % hold_file)

    def hold_file(self, name):
        p = self.work.file("hold-%s" % name)
        self.hold_files.append(p)
        return p

    def wait_held(self, hold_file, exe, rank=None, job=None, timeout=60):
        """Waits for the hold file and for the process (exe, rank) carrying it to be stopped
        (state T); returns its pid."""
        entry = b"STAGE_TEST_HOLD_FILE=" + hold_file.encode()
        extra = None if rank is None else b"OMPI_COMM_WORLD_RANK=%d" % rank

        def held():
            if job is not None and job.poll() is not None:
                raise AssertionError("job exited %d before reaching the hold point:\n%s" %
                                     (job.returncode, "".join(H.tail(p) for p in self.work.logs[-2:])))
            if not os.path.exists(hold_file):
                return None
            self.job_pids.update(pids_with_env(entry, exe))
            pids = [p for p in pids_with_env(entry, exe, extra) if H.proc_state(p) == "T"]
            return pids[0] if len(pids) == 1 else None
        return H.wait_for(held, timeout, "%s (rank %s) to stop at %s" % (exe.decode(), rank, hold_file))

    def background(self, cmd, log_name, env):
        """Starts cmd with stdout+stderr to a log file in the work dir (own session)."""
        path = self.work.file(log_name)
        self.work.logs.append(path)
        with open(path, "w") as lg:
            p = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=lg,
                                 stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        return p, path

    def end_job(self, job, hold_file):
        """Kills an mpirun job: SIGTERM, SIGKILL to its group after a bounded wait, then any
        process still carrying the hold file (a rank mpirun left behind)."""
        if job.poll() is None:
            H.kill_pid(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=15)
            except subprocess.TimeoutExpired:
                H.stop_popen(job, grace=10)
        self.kill_env_pids(hold_file)
        self.wait_job_pids_gone()

    # -- stage-bcast
    def mpirun(self, np, *args):
        return H.MPIRUN + ["-np", str(np), BCAST, "--ranks-as-nodes"] + [str(a) for a in args]

    def per_rank(self, np, rc_dir, *args):
        """mpirun under a wrapper that records each rank's exit status in rc_dir/rank.<r>."""
        os.makedirs(rc_dir, exist_ok=True)
        wrapper = '"$0" "$@"; echo $? > "%s/rank.$OMPI_COMM_WORLD_RANK"' % rc_dir
        return H.MPIRUN + ["-np", str(np), "/bin/sh", "-c", wrapper, BCAST, "--ranks-as-nodes"] + \
            [str(a) for a in args]

    @staticmethod
    def rank_status(rc_dir, np):
        out = {}
        for r in range(np):
            try:
                with open(os.path.join(rc_dir, "rank.%d" % r)) as f:
                    out[r] = int(f.read().strip())
            except (OSError, ValueError):
                out[r] = None
        return out

    def env_with(self, extra=None, mpi=True):
        env = H.mpi_env() if mpi else H.clean_env()
        env.update(extra or {})
        return env

    # -- filesystems
    def mount_tmpfs(self, path, size):
        os.makedirs(path, exist_ok=True)
        H.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=0755" % size, "tmpfs", path], timeout=30)
        self.tmpfs.append(path)
        return path

    def held_daemon(self, cache, point, name):
        """A standalone stagefs with the crash hold armed at point; returns (daemon, hold file)."""
        hold = self.hold_file(name)
        saved = dict(os.environ)
        os.environ.update(hold_env(point, hold))  # the harness's Daemon takes os.environ
        try:
            d = self.daemon(cache, "--chunk-size", CHUNK)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return d.wait_ready(), hold

    def start_reader(self, target):
        """Opens and hashes target in a background child; its output is read with
        communicate(timeout)."""
        go = self.work.file("newline")
        with open(go, "w") as f:
            f.write("\n")
        with open(go) as stdin:  # the reader's barrier line, already there
            reader = subprocess.Popen([H.PYTHON, H.HARNESS, "reader", target], stdin=stdin,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)
        self.procs.append(reader)
        return reader

    def reader_result(self, reader, timeout=30):
        try:
            out, err = reader.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the open through the mount did not return within %s s" % timeout)
        lines = [l for l in out.splitlines() if l and l != "ready"]
        if not lines:
            raise AssertionError("reader printed nothing: %r" % err)
        parts = lines[0].split(None, 3)
        if parts[0] == "ok":
            return ("ok", parts[1], int(parts[2]))
        return ("err", int(parts[1]), lines[0])

    def assert_no_temps(self, *roots):
        for root in roots:
            self.assertEqual(H.temp_files(root), [], "temporary files left under %s" % root)


# ---- 1. crash safety, stage-bcast ---------------------------------------------------------

class CrashBcast(FaultCase):
    SIZE = 4 * MiB + 12345  # 65 chunks of 64 KiB

    def test_kill9_rank1_at_each_hold_point(self):
        for point in ("before-first-chunk", "mid-file", "before-rename"):
            for old in (True, False):
                with self.subTest(point=point, old_copy=old):
                    self.crash_case(point, old)

    def crash_case(self, point, old):
        case = os.path.join(self.work.path, "%s-%s" % (point, "old" if old else "new"))
        os.makedirs(os.path.join(case, "shared"))
        src = os.path.join(case, "shared", "img")
        write_bytes(src, self.SIZE, seed=len(point) * 2 + old, mtime_ns=T_NEW)
        src_sha = H.sha256_file(src)
        dests = [os.path.join(case, "node%d" % k, "img") for k in range(2)]
        before = [None, None]
        if old:
            for k, d in enumerate(dests):
                os.makedirs(os.path.dirname(d))
                write_bytes(d, 3 * MiB + 7, seed=100 + k, mtime_ns=T_OLD)
                before[k] = fingerprint(d)
        pattern = os.path.join(case, "node%n", "img")
        hold = self.hold_file("%s-%s" % (point, old))
        job, _ = self.background(self.mpirun(2, "--source", src, "--dest", pattern, "--chunk-size", CHUNK),
                                       "crash-%s-%s.log" % (point, old),
                                       self.env_with(hold_env(point, hold, rank=1)))
        try:
            victim = self.wait_held(hold, b"stage-bcast", rank=1, job=job)
            # What the held writer has on disk: its temporary file only.
            temps1 = H.temp_files(os.path.dirname(dests[1]))
            self.assertEqual(len(temps1), 1, "node1 at %s: temporary files %s" % (point, temps1))
            tsize = os.path.getsize(temps1[0])
            if point == "before-first-chunk":
                self.assertEqual(tsize, 0, "a chunk was written before the first chunk")
            elif point == "mid-file":
                self.assertLess(tsize, self.SIZE, "mid-file: the temporary file is already complete")
            else:
                self.assertTrue(H.files_equal(temps1[0], src), "before-rename: temporary file is not complete")
            os.kill(victim, signal.SIGKILL)
            H.wait_for(lambda: not H.pid_alive(victim), 20, "rank 1 (pid %d) to die" % victim)
        finally:
            self.end_job(job, hold)

        # Never a partial file under the final name.
        now = [fingerprint(d) for d in dests]
        if old:
            self.assertEqual(now[1], before[1], "node1 (killed at %s): old copy changed" % point)
        else:
            self.assertIsNone(now[1], "node1 (killed at %s): something was published" % point)
        # Node 0 was not killed at a hold point: it may have published the complete new copy
        # (it decides for itself), else it keeps what it had.
        if now[0] is not None and now[0] != before[0]:
            self.assertEqual((now[0][1], now[0][2]), (self.SIZE, src_sha),
                             "node0 after the crash at %s: neither the old nor the complete new copy" % point)
        left = H.temp_files(case)
        H.log("    %s old=%s: node0 %s, leftover temps %s" %
              (point, old, "old" if now[0] == before[0] and old else "absent" if now[0] is None else "new",
               [os.path.relpath(t, case) for t in left]))

        # A normal run sweeps the dead writer's temporary file and stages the file everywhere.
        r = H.run(self.mpirun(2, "--source", src, "--dest", pattern, "--chunk-size", CHUNK, "-v"),
                  env=self.env_with(), timeout=90, check=False)
        self.assertEqual(r.returncode, 0, "recovery run after %s failed:\n%s\n%s" % (point, r.stdout, r.stderr))
        for k, d in enumerate(dests):
            self.assertTrue(os.path.isfile(d) and H.files_equal(d, src), "node%d: not staged after recovery" % k)
        self.assert_no_temps(case)
        if temps1:
            self.assertRegex(r.stderr + r.stdout, r"removed 1 stale temporary file\(s\) under %s" %
                             re.escape(dests[1]))


    def test_temp_beside_current_copy_is_swept(self):
        """kill -9 of rank 1 before the rename of an --overwrite run leaves a complete-size
        temporary file beside a copy that is still current. The next normal run has nothing to
        copy; it must still remove the dead writer's temporary file (README: "a failed or
        killed run leaves only temporary files, which the next run removes")."""
        src = os.path.join(self.work.src, "img")
        write_bytes(src, 2 * MiB + 9, seed=33, mtime_ns=T_NEW)
        pattern = self.work.file("node%n/img")
        args = ["--source", src, "--dest", pattern, "--chunk-size", CHUNK]
        r = H.run(self.mpirun(2, *args), env=self.env_with(), timeout=90, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        dest1 = self.work.file("node1/img")
        before = fingerprint(dest1)
        hold = self.hold_file("overwrite")
        job, _ = self.background(self.mpirun(2, *(args + ["--overwrite"])), "overwrite.log",
                                 self.env_with(hold_env("before-rename", hold, rank=1)))
        try:
            victim = self.wait_held(hold, b"stage-bcast", rank=1, job=job)
            os.kill(victim, signal.SIGKILL)
            H.wait_for(lambda: not H.pid_alive(victim), 20, "rank 1 to die")
        finally:
            self.end_job(job, hold)
        self.assertEqual(fingerprint(dest1), before, "node1's current copy changed")
        left = H.temp_files(self.work.file("node1"))
        self.assertEqual(len(left), 1, left)
        r = H.run(self.mpirun(2, *(args + ["-v"])), env=self.env_with(), timeout=90, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for k in range(2):
            self.assertTrue(H.files_equal(self.work.file("node%d/img" % k), src))
        self.assertEqual(H.temp_files(self.work.path), [],
                         "a dead writer's temporary file (%d bytes) survived the next run:\n%s" %
                         (os.path.getsize(left[0]) if os.path.exists(left[0]) else -1, r.stderr))

    def test_temp_of_zombie_writer_is_swept(self):
        """A killed writer whose parent died first (mpirun crashes in PMIx_Finalize on SIGTERM,
        and a container's PID 1 may never reap) stays a zombie: dead, yet kill(pid, 0)
        succeeds. Its temporary file can never be used again and must be swept too."""
        zombie = subprocess.Popen(["true"])
        self.procs.append(zombie)  # reaped (poll) in teardown
        H.wait_for(lambda: H.proc_state(zombie.pid) == "Z", 10, "the child to become a zombie")
        src = os.path.join(self.work.src, "img")
        write_bytes(src, MiB + 3, seed=31, mtime_ns=T_NEW)
        node1 = self.work.file("node1")
        os.makedirs(node1)
        stale = os.path.join(node1, ".img.stage-tmp.%s.%d" % (socket.gethostname(), zombie.pid))
        write_bytes(stale, 64 * KiB, seed=32)
        r = H.run(self.mpirun(2, "--source", src, "--dest", self.work.file("node%n/img"), "--chunk-size", CHUNK,
                              "-v"), env=self.env_with(), timeout=90, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for k in range(2):
            self.assertTrue(H.files_equal(self.work.file("node%d/img" % k), src))
        self.assertEqual(H.proc_state(zombie.pid), "Z", "the zombie was reaped during the run")
        self.assertFalse(os.path.lexists(stale),
                         "the temporary file of a dead (zombie, pid %d) writer was not swept:\n%s" %
                         (zombie.pid, r.stderr))


# ---- 2. crash safety, stagefs standalone --------------------------------------------------

class CrashStagefs(FaultCase):
    SIZE = 6 * MiB + 333

    def test_kill9_daemon_during_materialization(self):
        for point in ("mid-file", "before-rename"):
            with self.subTest(point=point):
                self.crash_case(point)

    def crash_case(self, point):
        src = os.path.join(self.work.src, "big-%s.bin" % point)
        write_bytes(src, self.SIZE, seed=len(point), mtime_ns=T_NEW)
        cache = self.work.file("cache-%s" % point)
        cached = os.path.join(cache, "data", os.path.basename(src))
        target = os.path.join(self.work.mnt, os.path.basename(src))
        d, hold = self.held_daemon(cache, point, point)
        reader = self.start_reader(target)
        self.assertEqual(self.wait_held(hold, b"stagefs"), d.pid)
        temps = H.temp_files(cache)
        self.assertEqual(len(temps), 1, "cache at %s: %s" % (point, temps))
        if point == "mid-file":
            self.assertLess(os.path.getsize(temps[0]), self.SIZE)
        else:
            self.assertTrue(H.files_equal(temps[0], src), "before-rename: temporary file is not complete")

        os.kill(d.pid, signal.SIGKILL)
        self.assertIsNotNone(d.wait_exit(20), "daemon still alive 20 s after kill -9")
        got = self.reader_result(reader)
        H.log("    %s: the waiting open returned: %s" % (point, got[2] if got[0] == "err" else got))
        if point == "before-rename" and got[0] == "ok":
            # Every chunk was written and verified before the hold: the open returned during
            # the copy (--read-during-copy) and read the source's bytes, though the copy was
            # never published.
            self.assertEqual(tuple(got[1:]), (H.sha256_file(src), self.SIZE))
        else:
            self.assertEqual(got[0], "err", "the waiting read did not fail after kill -9")
        H.wait_for(lambda: not H.mounts_under(self.work.mnt), 30, "auto_unmount to remove the mount")
        self.assertFalse(os.path.lexists(cached), "a copy was published in the cache at %s" % point)
        self.assertEqual(len(H.temp_files(cache)), 1)

        d2 = self.daemon(cache, "--chunk-size", CHUNK).wait_ready()
        H.wait_for(lambda: "removed 1 temporary file(s) left in the cache" in d2.output()[1], 10,
                   "the restarted daemon to log the temporary files it removed")
        self.assert_no_temps(cache)
        got = read_via_mount(target)
        self.assertEqual(got, ("ok", H.sha256_file(src), self.SIZE), "read after restart")
        self.assertEqual(d2.wait_transfers(1)["transfers"], 1)
        self.assertTrue(H.files_equal(cached, src))
        self.assertEqual(d2.stop(), 0, "restarted daemon did not exit cleanly")


# ---- 3. disk full -------------------------------------------------------------------------

class DiskFull(FaultCase):
    def test_a_bcast_upfront_check(self):
        """np 2, node1's destination on an 8 MiB tmpfs, a 20 MiB source."""
        src = os.path.join(self.work.src, "img")
        write_bytes(src, 20 * MiB, seed=1, mtime_ns=T_NEW)
        node0 = self.work.file("node0")
        node1 = self.mount_tmpfs(self.work.file("node1"), "8m")
        os.makedirs(node0)
        other = os.path.join(node1, "other.bin")
        write_bytes(other, MiB, seed=2)
        old1 = os.path.join(node1, "img")
        write_bytes(old1, 2 * MiB, seed=3, mtime_ns=T_OLD)
        keep = {p: fingerprint(p) for p in (other, old1)}
        rc_dir = self.work.file("rc-a")
        r = H.run(self.per_rank(2, rc_dir, "--source", src, "--dest", self.work.file("node%n/img"),
                                "--chunk-size", CHUNK),
                  env=self.env_with(), timeout=90, check=False)
        msg = r.stdout + r.stderr
        self.assertEqual(self.rank_status(rc_dir, 2), {0: 1, 1: 1}, msg)
        m = re.search(r"%s: [^\n]*%s[^\n]*No space left on device \(need (\d+) bytes, (\d+) free\)" %
                      (re.escape(socket.gethostname()), re.escape(node1)), msg)
        self.assertIsNotNone(m, "no 'HOST: ... node1 ...: No space left on device (need N bytes, M free)':\n" + msg)
        H.log("    user sees: %s" % m.group(0))
        need, free = int(m.group(1)), int(m.group(2))
        self.assertEqual(need, 20 * MiB)
        self.assertLess(free, need)
        self.assertLessEqual(free, 8 * MiB)
        for p, fp in keep.items():
            self.assertEqual(fingerprint(p), fp, "%s changed" % p)
        self.assertFalse(os.path.lexists(os.path.join(node0, "img")), "node0 published although node1 failed")
        self.assert_no_temps(node0, node1)

    def test_b_stagefs_cache_full(self):
        """Standalone stagefs over an 8 MiB tmpfs cache: the big file fails with ENOSPC, small
        files before and after are fine, the cache is untouched."""
        big = os.path.join(self.work.src, "big.bin")
        small = os.path.join(self.work.src, "small.bin")
        first = os.path.join(self.work.src, "first.bin")
        write_bytes(big, 20 * MiB, seed=4)
        write_bytes(small, MiB, seed=5)
        write_bytes(first, MiB + 17, seed=6)
        fs = self.mount_tmpfs(self.work.file("cachefs"), "8m")
        cache = os.path.join(fs, "c")
        d = self.daemon(cache, "--chunk-size", CHUNK).wait_ready()
        mnt = self.work.mnt
        self.assertEqual(read_via_mount(os.path.join(mnt, "first.bin")), ("ok", H.sha256_file(first), MiB + 17))
        first_cached = os.path.join(cache, "data", "first.bin")
        kept = fingerprint(first_cached)
        self.assertIsNotNone(kept)

        got = read_via_mount(os.path.join(mnt, "big.bin"))
        self.assertEqual(got[:2], ("err", errno.ENOSPC), "open of a file larger than the free cache: %s" % (got,))
        self.assertFalse(os.path.lexists(os.path.join(cache, "data", "big.bin")))
        self.assert_no_temps(cache)
        H.log("    daemon log: %s" % [l for l in d.output()[1].splitlines() if "big.bin" in l])
        self.assertRegex(d.output()[1], r"need %d bytes, \d+ free" % (20 * MiB))

        self.assertEqual(read_via_mount(os.path.join(mnt, "small.bin")), ("ok", H.sha256_file(small), MiB),
                         "a small file after the ENOSPC")
        self.assertEqual(fingerprint(first_cached), kept, "the earlier copy in the cache changed")
        self.assertEqual(read_via_mount(os.path.join(mnt, "first.bin"))[0], "ok")
        self.assertEqual(d.stats()["cache_hits"], 1)
        self.assert_no_temps(cache)
        self.assertEqual(d.stop(), 0)

    def test_c_enospc_mid_copy(self):
        """The up-front check passes; the tmpfs is filled while the writer is held before its
        first chunk: the write fails with ENOSPC, nothing is published, the old copy stays."""
        src = os.path.join(self.work.src, "img")
        write_bytes(src, 12 * MiB, seed=7, mtime_ns=T_NEW)
        fs = self.mount_tmpfs(self.work.file("fs"), "20m")
        dest = os.path.join(fs, "img")
        write_bytes(dest, MiB, seed=8, mtime_ns=T_OLD)
        old = fingerprint(dest)
        hold = self.hold_file("enospc")
        # a world of one rank: stage-bcast without a launcher (SelfComm), rank 0
        job, job_log = self.background([BCAST, "--source", src, "--dest", dest, "--chunk-size", CHUNK],
                                       "enospc.log", self.env_with(hold_env("before-first-chunk", hold, rank=0),
                                                                   mpi=False))
        self.assertEqual(self.wait_held(hold, b"stage-bcast", job=job), job.pid)
        filled = fill_filesystem(os.path.join(fs, "filler"))
        self.assertGreater(filled, 0)
        os.kill(job.pid, signal.SIGCONT)
        try:
            rc = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("stage-bcast did not end within 60 s after the disk filled")
        out = H.tail(job_log, 100)
        H.log("    user sees: %s" % [l for l in out.splitlines() if "error" in l])
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"%s[^\n]*No space left on device" % re.escape(dest))
        self.assertEqual(fingerprint(dest), old, "the old copy changed")
        self.assert_no_temps(fs)

    def test_d_stagefs_enospc_mid_copy(self):
        """stagefs: the cache fills while the materialization is held before its first chunk:
        the open fails with ENOSPC (or, as the open returned during the copy, the read fails
        with EIO and the log names ENOSPC), nothing is left in the cache, the mount keeps
        working."""
        src = os.path.join(self.work.src, "img.bin")
        write_bytes(src, 12 * MiB, seed=9)
        small = os.path.join(self.work.src, "small.bin")
        write_bytes(small, MiB, seed=10)
        fs = self.mount_tmpfs(self.work.file("cachefs"), "20m")
        cache = os.path.join(fs, "c")
        d, hold = self.held_daemon(cache, "before-first-chunk", "stagefs-enospc")
        reader = self.start_reader(os.path.join(self.work.mnt, "img.bin"))
        self.assertEqual(self.wait_held(hold, b"stagefs"), d.pid)
        filler = os.path.join(fs, "filler")
        self.assertGreater(fill_filesystem(filler), 0)
        os.kill(d.pid, signal.SIGCONT)
        got = self.reader_result(reader, timeout=60)
        H.log("    open: %s; daemon log: %s" % (got, [l for l in d.output()[1].splitlines() if "img.bin" in l]))
        self.assertIn(got[:2], (("err", errno.ENOSPC), ("err", errno.EIO)), "open while the cache filled up: %s" % (got,))
        if got[1] == errno.EIO:
            H.wait_for(lambda: "No space left on device" in d.output()[1], 30, "the log to name ENOSPC")
        self.assertFalse(os.path.lexists(os.path.join(cache, "data", "img.bin")))
        self.assert_no_temps(cache)
        os.unlink(filler)
        # the hold stops every transfer of this daemon: release the next one at once
        os.unlink(hold)
        reader = self.start_reader(os.path.join(self.work.mnt, "small.bin"))
        self.assertEqual(self.wait_held(hold, b"stagefs"), d.pid)
        os.kill(d.pid, signal.SIGCONT)
        self.assertEqual(self.reader_result(reader, timeout=60), ("ok", H.sha256_file(small), MiB),
                         "the mount after ENOSPC")
        self.assertEqual(d.stop(), 0)


# ---- 4. the source changes during a transfer; 5. between two stagefs jobs -----------------

class SourceChange(FaultCase):
    SIZE = 8 * MiB

    def test_during_bcast(self):
        kinds = {
            "append": self.append,
            "rewrite-in-place": self.rewrite,
            "replace-by-rename": self.replace,
        }
        for kind, change in kinds.items():
            with self.subTest(change=kind):
                self.during_bcast(kind, change)

    @staticmethod
    def append(src):
        with open(src, "ab") as f:
            f.write(b"appended" * 512)

    @staticmethod
    def rewrite(src):
        with open(src, "rb") as f:
            data = bytes(b ^ 0xff for b in f.read(MiB))
        with open(src, "r+b") as f:
            for off in range(0, os.path.getsize(src), MiB):
                f.seek(off)
                f.write(data)

    @staticmethod
    def replace(src):
        tmp = src + ".new"
        H.write_random(tmp, os.path.getsize(src), seed=99)
        os.rename(tmp, src)

    def during_bcast(self, kind, change):
        case = os.path.join(self.work.path, kind)
        os.makedirs(os.path.join(case, "shared"))
        src = os.path.join(case, "shared", "img")
        write_bytes(src, self.SIZE, seed=len(kind), mtime_ns=T_NEW)
        dests = [os.path.join(case, "node%d" % k, "img") for k in range(2)]
        os.makedirs(os.path.dirname(dests[0]))
        write_bytes(dests[0], 5 * MiB, seed=11, mtime_ns=T_OLD)  # node0: an old copy; node1: none
        old0 = fingerprint(dests[0])
        pattern = os.path.join(case, "node%n", "img")
        hold = self.hold_file(kind)
        rc_dir = os.path.join(case, "rc")
        job, job_log = self.background(self.per_rank(2, rc_dir, "--source", src, "--dest", pattern,
                                                     "--chunk-size", CHUNK),
                                       "change-%s.log" % kind, self.env_with(hold_env("mid-file", hold, rank=0)))
        try:
            held = self.wait_held(hold, b"stage-bcast", rank=0, job=job)
            change(src)
            os.kill(held, signal.SIGCONT)
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail("the job did not end within 60 s after the source changed (%s)" % kind)
        finally:
            self.end_job(job, hold)
        out = H.tail(job_log, 100)
        self.assertEqual(self.rank_status(rc_dir, 2), {0: 1, 1: 1}, "%s:\n%s" % (kind, out))
        H.log("    %s: %s" % (kind, [l for l in out.splitlines() if "error" in l]))
        self.assertIn("source changed", out)
        self.assertEqual(fingerprint(dests[0]), old0, "node0's old copy changed")
        self.assertFalse(os.path.lexists(dests[1]), "node1 published a copy of a changing source")
        self.assert_no_temps(case)

        r = H.run(self.mpirun(2, "--source", src, "--dest", pattern, "--chunk-size", CHUNK),
                  env=self.env_with(), timeout=90, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for k, d in enumerate(dests):
            self.assertTrue(H.files_equal(d, src), "node%d: new content not staged (%s)" % (k, kind))
        self.assert_no_temps(case)

    def test_stagefs_during_materialization(self):
        """stagefs: the source is rewritten while the materialization is held mid-file: the
        waiting open fails (ESTALE), nothing is published, and the next open materializes
        the new content."""
        name = "img.bin"
        src = os.path.join(self.work.src, name)
        write_bytes(src, self.SIZE, seed=41, mtime_ns=T_NEW)
        cache = self.work.file("cache")
        d, hold = self.held_daemon(cache, "mid-file", "stagefs-change")
        target = os.path.join(self.work.mnt, name)
        reader = self.start_reader(target)
        self.assertEqual(self.wait_held(hold, b"stagefs"), d.pid)
        self.rewrite(src)
        os.kill(d.pid, signal.SIGCONT)
        got = self.reader_result(reader, timeout=60)
        H.log("    open: %s" % (got,))
        # The README names no errno for this; the daemon logs "source changed during transfer"
        # and the open gets EIO (the group reports a failed transfer), ESTALE would do too.
        self.assertEqual(got[0], "err", "open of a source that changed during the copy")
        self.assertIn(got[1], (errno.EIO, errno.ESTALE), got)
        H.wait_for(lambda: "source changed during transfer" in d.output()[1], 10, "the daemon to log the change")
        self.assertFalse(os.path.lexists(os.path.join(cache, "data", name)))
        self.assert_no_temps(cache)
        # The user retries: the hook stops this transfer at mid-file too; release it at once.
        os.unlink(hold)
        reader = self.start_reader(target)
        self.assertEqual(self.wait_held(hold, b"stagefs"), d.pid)
        os.kill(d.pid, signal.SIGCONT)
        self.assertEqual(self.reader_result(reader, timeout=60), ("ok", H.sha256_file(src), self.SIZE),
                         "the retried open")
        s = d.wait_transfers(2)  # the read may end before the copy does (--read-during-copy)
        self.assertEqual((s["transfers"], s["transfer_failures"]), (2, 1), s)
        self.assertEqual(d.stop(), 0)

    def test_stagefs_between_jobs(self):
        """A source changed between two standalone stagefs runs over one cache is materialized
        again at the first open: new mtime; mtime restored (only ctime tells); replaced by
        rename with the same size and mtime."""
        kinds = ("new-mtime", "mtime-restored", "renamed-same-mtime")
        for kind in kinds:
            with self.subTest(change=kind):
                self.between_jobs(kind)

    def between_jobs(self, kind):
        name = "img-%s.bin" % kind
        src = os.path.join(self.work.src, name)
        size = 3 * MiB + 5
        write_bytes(src, size, seed=21, mtime_ns=T_NEW)
        cache = self.work.file("cache-%s" % kind)
        target = os.path.join(self.work.mnt, name)
        d1 = self.daemon(cache, "--chunk-size", CHUNK).wait_ready()
        self.assertEqual(read_via_mount(target), ("ok", H.sha256_file(src), size))
        self.assertEqual(d1.wait_transfers(1)["transfers"], 1)
        self.assertEqual(d1.stop(), 0)
        H.wait_for(lambda: not H.mounts_under(self.work.mnt), 20, "the first mount to go away")

        if kind == "new-mtime":
            write_bytes(src + ".tmp", size, seed=22)
            with open(src + ".tmp", "rb") as f, open(src, "r+b") as g:
                g.write(f.read())
            os.unlink(src + ".tmp")
            os.utime(src, ns=(T_NEW + 10**9, T_NEW + 10**9))
        elif kind == "mtime-restored":
            with open(src, "r+b") as g:
                g.write(b"\x00new content\x00" * 1000)
            os.utime(src, ns=(T_NEW, T_NEW))
        else:
            write_bytes(src + ".tmp", size, seed=23, mtime_ns=T_NEW)
            os.rename(src + ".tmp", src)
        new_sha = H.sha256_file(src)

        d2 = self.daemon(cache, "--chunk-size", CHUNK).wait_ready()
        self.assertEqual(read_via_mount(target), ("ok", new_sha, size), "first open after the change (%s)" % kind)
        s = d2.wait_transfers(1)  # the read may end before the copy does (--read-during-copy)
        self.assertEqual((s["transfers"], s["materializations"], s["cache_hits"]), (1, 1, 0), s)
        self.assertEqual(H.sha256_file(os.path.join(cache, "data", name)), new_sha)
        self.assertEqual(read_via_mount(target), ("ok", new_sha, size))
        s = d2.stats()
        self.assertEqual((s["transfers"], s["cache_hits"]), (1, 1), s)
        self.assertEqual(d2.stop(), 0)
        H.wait_for(lambda: not H.mounts_under(self.work.mnt), 20, "the second mount to go away")


# ---- entry point --------------------------------------------------------------------------

def main():
    global BCAST
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    if len(argv) < 2:
        print("usage: %s STAGE_BCAST STAGEFS [MPIRUN ARGS...] [-- UNITTEST ARGS]" % sys.argv[0], file=sys.stderr)
        sys.exit(2)
    BCAST = os.path.abspath(argv[0])
    H.STAGEFS = os.path.abspath(argv[1])
    if len(argv) > 2:
        H.MPIRUN = argv[2:]
    why = H.missing_prerequisite(True) or (None if shutil.which("mount") else "mount is missing")
    if why:
        print("SKIP: " + why, file=sys.stderr)
        sys.exit(77)
    H.enter_private_namespace(os.path.abspath(__file__), sys.argv[1:])
    if not become_subreaper():
        H.log("warning: cannot become a child subreaper; orphaned ranks are left to PID 1")
    unittest.main(module="__main__", argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
