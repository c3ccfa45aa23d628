#!/usr/bin/python3
"""Shared fixture for the real-mount tests of stagefs (ctest label "mount").

A test script calls main(__file__) with argv
    SCRIPT STAGEFS [NP] [MPIRUN ARGS...] [-- UNITTEST ARGS...]
which
  - exits 77 (ctest skip) without /dev/fuse, root, fusermount3, unshare or nsenter (and
    without mpirun when NP is given, or a command named in main's `tools`),
  - re-executes the script in a private mount namespace of its own (unshare -m
    --propagation private): the mounts a test makes are invisible to other processes, and
    no namespace created elsewhere in the meantime (a container, a simulated slurmd, another
    engineer's test) can clone one of them and keep its superblock alive after the test
    unmounted it. FUSE mounts copied in from the host are detached at once, in this
    namespace only, for the same reason the other way round.
  - runs unittest.

Fixture pieces:
  Work      a fresh directory under /var/tmp (not /tmp: ranks run in private mount
            namespaces), removed with everything mounted inside it in cleanup()
  Daemon    a standalone stagefs (no launcher): Popen, stdin /dev/null, stdout and stderr
            to files in the work dir
  Group     an MPI mount group of NP ranks: each rank runs its stagefs in its own private
            mount namespace over its own cache WORK/node<k>, all at the same mount point
            path; on(k, cmd) runs cmd "on node k" (nsenter into rank k's namespace)
Nothing here sleeps to synchronize: it waits for a process to exit (with a timeout), for
`stagefs --wait` (a bounded poll inside stagefs), or polls a condition with a deadline.

Run as a script, this file is also the tiny tool the tests run inside a node's namespace:
    stagefs_harness.py stats MNT          print the mount's user.stagefs.stats JSON
    stagefs_harness.py sha256 PATH...     print "<sha256> <size>" of each file
    stagefs_harness.py reader PATH...     print "ready", wait for a line on stdin (a barrier),
                                          then open and hash each PATH: "ok <sha> <size>" or
                                          "err <errno> <message>"
Standard library only.
"""
import atexit
import errno
import hashlib
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

KiB = 1024
MiB = 1024 * KiB

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.abspath(__file__)
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
STAGEFS = None                    # the stagefs binary (argv[1])
NP = None                         # ranks per group, for the MPI scripts (argv[2])
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
RUN_TIMEOUT = 60                  # seconds for any single helper command
TEMP_MARK = ".stage-tmp."
STANDALONE_PIDS = set()           # standalone daemons started by the tests (not a group's)
NS_MARK = "STAGEFS_MOUNT_TEST_PRIVATE_NS"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- conditions and processes ------------------------------------------------------------

def wait_for(cond, timeout, what, interval=0.02):
    """Polls cond() until it returns a true value (returned) or timeout seconds passed
    (AssertionError naming what). Backs off from 20 ms to 200 ms."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(interval)  # a bounded poll of a condition, not a synchronization sleep
        interval = min(interval * 2, 0.2)


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_state(pid):
    fields = proc_stat(pid)
    return fields[0] if fields else None


def proc_ppid(pid):
    fields = proc_stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def pid_alive(pid):
    return proc_state(pid) not in (None, "Z", "X")


def _proc_strings(pid, name):
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def proc_cmdline(pid):
    return _proc_strings(pid, "cmdline")


def proc_environ(pid):
    return _proc_strings(pid, "environ")


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def stagefs_pids(marker):
    """Live stagefs processes whose command line mentions marker (a work dir)."""
    out = []
    exe = os.path.realpath(STAGEFS).encode()
    m = marker.encode()
    for pid in all_pids():
        if pid == os.getpid():
            continue
        args = proc_cmdline(pid)
        if not args or not pid_alive(pid):
            continue
        if (args[0] == exe or os.path.basename(args[0]) == b"stagefs") and any(m in a for a in args):
            out.append(pid)
    return out


def work_pids(marker):
    """Live processes (other than this one) whose command line mentions marker: daemons, their
    fusermount3 watchers, mpirun, helpers."""
    m = marker.encode()
    me = os.getpid()
    return [p for p in all_pids() if p != me and any(m in a for a in proc_cmdline(p)) and pid_alive(p)]


def mnt_ns(pid="self"):
    try:
        return os.readlink("/proc/%s/ns/mnt" % pid)
    except OSError:
        return None


def pids_in_namespaces(namespaces):
    namespaces = set(n for n in namespaces if n)
    return [p for p in all_pids() if p != os.getpid() and mnt_ns(p) in namespaces and pid_alive(p)]


def kill_pid(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_popen(p, grace=10):
    """Ends a Popen we started: SIGTERM to its process group, then SIGKILL."""
    if p is None or p.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            kill_pid(p.pid, sig)
        try:
            p.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run(cmd, timeout=RUN_TIMEOUT, env=None, input=None, check=True, cwd=None):
    """Runs cmd (own session); on timeout kills it and fails loudly."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                         env=env, cwd=cwd, start_new_session=True, text=True, errors="replace")
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_popen(p, grace=5)
        raise AssertionError("timed out after %ss: %s" % (timeout, " ".join(map(str, cmd))))
    r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d\nstdout: %s\nstderr: %s" %
                             (" ".join(map(str, cmd)), r.returncode, out[-3000:], err[-3000:]))
    return r


def ensure_user(test, name):
    """The passwd entry of user `name`, created (useradd, no home) if missing and then removed
    (userdel) in test's cleanup. Call it before the fixture's setUp: cleanups run last-in
    first-out, so userdel comes after the fixture has stopped every process of that user."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    r = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("useradd %s failed: %s" % (name, r.stdout))
    test.addCleanup(subprocess.run, ["userdel", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    timeout=60)
    return pwd.getpwnam(name)


# Where a daemon started with --profile auto keeps its profiles: one directory per test process,
# never the home of the user running the suite.
PROFILE_HOME = tempfile.mkdtemp(prefix="stagefs-test-profiles-", dir="/var/tmp")
atexit.register(shutil.rmtree, PROFILE_HOME, ignore_errors=True)


def clean_env():
    """The environment without launcher variables: a stagefs started with it is standalone."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "PRTE_"))}
    env["XDG_CACHE_HOME"] = PROFILE_HOME
    return env


_KNOWS_PROFILE = {}


def no_replay(args):
    """A daemon's options with --profile off unless the test chose a profile: a test of
    anything else counts transfers and temporary files that the last daemon's replay would add.
    (A build from before profiles, which a benchmark may compare, is left as it is.)"""
    args = [str(a) for a in args]
    if any(a == "--profile" or a.startswith("--profile=") for a in args):
        return args
    if STAGEFS not in _KNOWS_PROFILE:
        r = subprocess.run([STAGEFS, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT)
        _KNOWS_PROFILE[STAGEFS] = b"--profile" in r.stdout
    return args + ["--profile", "off"] if _KNOWS_PROFILE[STAGEFS] else args


def mpi_env():
    env = clean_env()
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_btl_tcp_if_include"] = "lo"
    env["OMPI_MCA_oob_tcp_if_include"] = "lo"
    return env


# ---- mounts of this namespace -----------------------------------------------------------

def mounts_under(prefix, pid="self"):
    """Mount points at or below prefix in pid's mount namespace, deepest first."""
    out = []
    try:
        with open("/proc/%s/mountinfo" % pid) as f:
            for line in f:
                mp = line.split()[4].replace("\\040", " ")
                if mp == prefix or mp.startswith(prefix.rstrip("/") + "/"):
                    out.append(mp)
    except OSError:
        pass
    return sorted(set(out), key=len, reverse=True)


def force_unmount(mp):
    """fusermount3 -u, else a lazy umount: never leaves a mount behind in this namespace."""
    r = subprocess.run(["fusermount3", "-u", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=RUN_TIMEOUT)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=RUN_TIMEOUT)


# ---- file helpers -----------------------------------------------------------------------

def write_random(path, size, seed, mode=0o644):
    """A file of `size` pseudo-random bytes (a fast generator: random.Random(seed))."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, 4 * MiB)
            f.write(rng.randbytes(n))
            left -= n
    os.chmod(path, mode)


def write_patterned(path, size, seed):
    """A large file fast: 1 MiB of random bytes repeated, each MiB stamped with its index (so
    no two chunks are equal and a misplaced chunk shows)."""
    block = random.Random(seed).randbytes(MiB)
    with open(path, "wb") as f:
        i = 0
        while i * MiB < size:
            b = i.to_bytes(8, "little") + block[8:]
            f.write(b[:min(MiB, size - i * MiB)])
            i += 1


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 * MiB)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def files_equal(a, b):
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x = fa.read(4 * MiB)
            y = fb.read(4 * MiB)
            if x != y:
                return False
            if not x:
                return True


def temp_files(root):
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if TEMP_MARK in f]
    return out


def regular_files(root):
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(os.path.relpath(p, root))
    return sorted(out)


def rss_kib(pid):
    """The resident memory of process pid, KiB (0 if it is gone)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return "(%s)" % e


# ---- the fixture --------------------------------------------------------------------------

WORK_BASE = "/var/tmp"  # where Work dirs go (benchmarks may point it at another filesystem)


class Work:
    """A fresh work dir: WORK/src (the source), WORK/mnt (the mount point)."""

    def __init__(self, name):
        self.path = tempfile.mkdtemp(prefix="stagefs-mount-%s-" % name, dir=WORK_BASE)
        os.chmod(self.path, 0o755)
        self.src = os.path.join(self.path, "src")
        self.mnt = os.path.join(self.path, "mnt")
        os.mkdir(self.src)
        os.mkdir(self.mnt)
        self.logs = []

    def file(self, name):
        return os.path.join(self.path, name)

    def dump_logs(self):
        for p in self.logs:
            log("---- %s (last lines)\n%s" % (p, tail(p)))

    def cleanup(self):
        """Unmounts whatever is still mounted inside the work dir (this namespace), kills any
        process still naming it, removes it. Returns the pids that had to be killed."""
        for mp in mounts_under(self.path):
            force_unmount(mp)
        try:  # a fusermount3 auto_unmount watcher ends shortly after its daemon
            wait_for(lambda: not work_pids(self.path), 10, "processes to end")
        except AssertionError:
            pass
        leftovers = [(p, b" ".join(proc_cmdline(p))[:300].decode(errors="replace")) for p in work_pids(self.path)]
        for pid, _ in leftovers:
            kill_pid(pid, signal.SIGKILL)
        if leftovers:
            wait_for(lambda: not work_pids(self.path), 30, "killed processes to vanish")
        for mp in mounts_under(self.path):  # a killed daemon's mount, stale now
            force_unmount(mp)
        shutil.rmtree(self.path, ignore_errors=True)
        return leftovers


class Daemon:
    """A standalone stagefs (no launcher) in this test's mount namespace."""
    count = 0

    def __init__(self, work, cache, *args, mnt=None, src=None):
        Daemon.count += 1
        self.work = work
        self.mnt = mnt or work.mnt
        self.src = src or work.src
        self.cache = cache
        self.out_path = work.file("daemon%d.out" % Daemon.count)
        self.err_path = work.file("daemon%d.err" % Daemon.count)
        work.logs += [self.out_path, self.err_path]
        self.cmd = [STAGEFS, self.src, self.mnt, "--cache", cache] + no_replay(args)
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         env=clean_env(), start_new_session=True)
        STANDALONE_PIDS.add(self.proc.pid)

    @property
    def pid(self):
        return self.proc.pid

    def output(self):
        with open(self.out_path, errors="replace") as o, open(self.err_path, errors="replace") as e:
            return o.read(), e.read()

    def wait_ready(self, timeout=30):
        r = run([STAGEFS, "--wait", self.mnt, "--wait-timeout", str(timeout)], timeout=timeout + 30, check=False)
        if r.returncode != 0:
            out, err = self.output()
            raise AssertionError("stagefs --wait %s failed (%d): %s\n daemon exit: %s\n stdout: %s\n stderr: %s" %
                                 (self.mnt, r.returncode, r.stderr, self.proc.poll(), out[-2000:], err[-2000:]))
        return self

    def stats(self):
        return json.loads(os.getxattr(self.mnt, "user.stagefs.stats"))

    def wait_transfers(self, n, timeout=60):
        """Stats once at least n transfers ended. An open may return while its copy is still
        being made (--read-during-copy): a read can end before the transfer is counted."""
        return wait_for(lambda: (lambda s: s if s["transfers"] >= n else None)(self.stats()), timeout,
                        "%d transfer(s) to end" % n)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=30):
        """fusermount3 -u, then the bounded wait; SIGTERM/SIGKILL if it does not end.
        Returns the exit status of the daemon (None if it had to be killed)."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        if self.mnt in mounts_under(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=RUN_TIMEOUT)
        rc = self.wait_exit(timeout)
        if rc is None:
            stop_popen(self.proc)
        return rc


class Group:
    """An MPI mount group: NP ranks, each a stagefs in its own private mount namespace, over its
    own cache WORK/node<k>, at the same mount point path WORK/mnt. wrap: a command that runs
    each stagefs (its arguments follow), keeping its pid (strace -D...)."""

    def __init__(self, work, np, *args, wrap=None):
        self.work = work
        self.np = np
        self.mnt = work.mnt
        self.src = work.src
        self.caches = [work.file("node%d" % k) for k in range(np)]
        self.pidfiles = [work.file("pid%d" % k) for k in range(np)]
        self.log_path = work.file("mpirun.log")
        work.logs.append(self.log_path)
        self.pids = [None] * np
        self.namespaces = [None] * np
        self.helpers = []  # Popen objects of commands running on nodes
        stagefs_cmd = " ".join(([wrap] if wrap else []) + [STAGEFS, self.src, self.mnt, "--cache", work.file("node$OMPI_COMM_WORLD_RANK")] +
                               no_replay(args))
        wrapper = ("echo $$ > %s/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private %s"
                   % (work.path, stagefs_cmd))
        self.cmd = MPIRUN + ["-np", str(np), "sh", "-c", wrapper]
        with open(self.log_path, "w") as lg:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=lg, stderr=subprocess.STDOUT,
                                         env=mpi_env(), start_new_session=True)

    # -- start
    def _rank_started(self, k):
        """pid of rank k once it is stagefs (past sh and unshare) in a namespace of its own."""
        try:
            with open(self.pidfiles[k]) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return None
        if not pid:
            return None
        args = proc_cmdline(pid)
        if not args or os.path.basename(args[0]) != b"stagefs":
            return None
        ns = mnt_ns(pid)
        if ns is None or ns == mnt_ns():
            return None
        return pid, ns

    def wait_ready(self, timeout=60):
        def started():
            if self.proc.poll() is not None:
                raise AssertionError("mpirun exited %d before every rank started:\n%s" %
                                     (self.proc.returncode, tail(self.log_path)))
            got = [self._rank_started(k) for k in range(self.np)]
            return got if all(got) else None
        got = wait_for(started, timeout, "%d ranks to start stagefs" % self.np)
        self.pids = [g[0] for g in got]
        self.namespaces = [g[1] for g in got]
        for k in range(self.np):  # any node ready means all agreed; check each anyway
            r = self.on(k, [STAGEFS, "--wait", self.mnt, "--wait-timeout", str(timeout)], timeout=timeout + 30,
                        check=False)
            if r.returncode != 0:
                raise AssertionError("stagefs --wait on node %d failed (%d): %s\n%s" %
                                     (k, r.returncode, r.stderr, tail(self.log_path)))
        return self

    # -- commands on nodes
    def nsenter(self, k):
        if self.pids[k] is None:
            raise AssertionError("node %d has no known pid" % k)
        return ["nsenter", "-t", str(self.pids[k]), "-m", "--"]

    def on(self, k, cmd, timeout=RUN_TIMEOUT, check=True, input=None):
        """Runs cmd on node k (in rank k's mount namespace)."""
        return run(self.nsenter(k) + [str(c) for c in cmd], timeout=timeout, check=check, input=input)

    def spawn(self, k, cmd):
        """Starts cmd on node k with pipes for stdin/stdout/stderr; stopped in close()."""
        p = subprocess.Popen(self.nsenter(k) + [str(c) for c in cmd], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             start_new_session=True)
        self.helpers.append(p)
        return p

    def stats(self, k):
        return json.loads(self.on(k, [PYTHON, HARNESS, "stats", self.mnt]).stdout)

    def wait_transfers(self, k, n, timeout=60):
        """Node k's stats once at least n transfers ended there (see Daemon.wait_transfers)."""
        return wait_for(lambda: (lambda s: s if s["transfers"] >= n else None)(self.stats(k)), timeout,
                        "%d transfer(s) to end on node %d" % (n, k))

    def sha256_on(self, k, *paths):
        """{path: (sha256, size)} of files read on node k."""
        out = self.on(k, [PYTHON, HARNESS, "sha256"] + list(paths), timeout=120).stdout.split()
        return {p: (out[2 * i], int(out[2 * i + 1])) for i, p in enumerate(paths)}

    def unmount(self, k, check=True):
        return self.on(k, ["fusermount3", "-u", self.mnt], timeout=30, check=check)

    def cache_file(self, k, rel):
        return os.path.join(self.caches[k], "data", rel)

    # -- end
    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def leftovers(self):
        """stagefs processes of this group, and any process still in a rank's namespace."""
        mine = set(stagefs_pids(self.work.path)) - STANDALONE_PIDS
        # Namespace inode numbers are recycled once a namespace dies: only count processes of
        # this test (their command line names its work dir), not strangers in a reused one.
        ours = set(work_pids(self.work.path))
        return sorted(mine | (set(pids_in_namespaces(self.namespaces)) & ours))

    def close(self):
        """Always ends everything: unmount every live node, bounded wait for mpirun, SIGTERM,
        SIGKILL. Returns a list of problems found on the way (empty when the group ended by
        itself)."""
        problems = []
        for p in self.helpers:
            stop_popen(p, grace=5)
        if self.proc.poll() is None:
            for k, pid in enumerate(self.pids):
                if pid and pid_alive(pid):
                    try:
                        self.unmount(k, check=False)
                    except AssertionError as e:
                        problems.append(str(e))
            if self.wait_exit(30) is None:
                problems.append("mpirun still running 30 s after every node was unmounted")
                kill_pid(self.proc.pid, signal.SIGTERM)
                if self.wait_exit(20) is None:
                    problems.append("mpirun still running 20 s after SIGTERM")
                    stop_popen(self.proc, grace=10)
        left = self.leftovers()
        if left:
            problems.append("processes left after mpirun ended: %s" %
                            [(p, b" ".join(proc_cmdline(p))[:200]) for p in left])
            for pid in left:
                kill_pid(pid, signal.SIGKILL)
            wait_for(lambda: not self.leftovers(), 30, "leftover processes to die")
        return problems


class Hold:
    """A copy held at a known point instead of slowed by time (bcast/holds/holds.h): the thread
    of rank `rank` that reaches `point` (mid-file: its writer thread after two chunks;
    reader-mid-file: the source's reader thread; the rest of the daemon goes on) waits until the test
    removes the hold file. os.environ carries it while the daemons or groups started inside
    `with` start (the harness passes the environment on); the file is removed at the test's
    cleanup whatever happens."""

    def __init__(self, test, point, rank=0):
        self.file = test.work.file("hold")
        self.env = {"STAGE_TEST_HOLD": point, "STAGE_TEST_HOLD_BLOCK": "1", "STAGE_TEST_HOLD_FILE": self.file,
                    "STAGE_TEST_HOLD_RANK": str(rank)}
        test.addCleanup(lambda: os.path.exists(self.file) and os.unlink(self.file))

    def __enter__(self):
        self.saved = dict(os.environ)
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.saved)

    def reached(self):
        return os.path.exists(self.file)

    def release(self):
        os.unlink(self.file)


class MountTestCase(unittest.TestCase):
    """Gives each test a Work (self.work) and closes every daemon and group it started, even on
    failure; a group that had to be forced down fails the test."""
    maxDiff = 8000

    def setUp(self):
        self.work = Work(self.id().rsplit(".", 1)[-1])
        self.daemons = []
        self.groups = []
        self.addCleanup(self._teardown)

    def daemon(self, cache, *args, **kw):
        d = Daemon(self.work, cache, *args, **kw)
        self.daemons.append(d)
        return d

    def group(self, np, *args, wrap=None):
        g = Group(self.work, np, *args, wrap=wrap)
        self.groups.append(g)
        return g

    def _teardown(self):
        problems = []
        try:
            for g in self.groups:
                problems += g.close()
            for d in self.daemons:
                if d.proc.poll() is None:
                    if d.stop() is None:
                        problems.append("standalone stagefs %d did not exit after fusermount3 -u" % d.pid)
        finally:
            if problems or not self._ok():
                self.work.dump_logs()
            killed = self.work.cleanup()
        if killed:
            problems.append("processes had to be killed: %s" % killed)
        if problems:
            raise AssertionError("teardown: " + "; ".join(problems))

    def _ok(self):
        """False once a failure or error of this test (or of one of its subtests) is recorded."""
        outcome = getattr(self, "_outcome", None)
        result = getattr(outcome, "result", None)
        if result is None:
            return True
        for test, _ in list(getattr(result, "failures", [])) + list(getattr(result, "errors", [])):
            if test is self or getattr(test, "test_case", None) is self:
                return False
        return True


# ---- entry points ------------------------------------------------------------------------

def missing_prerequisite(need_mpi, tools=()):
    """Why the tests cannot run here (None: they can). tools: further commands they need."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if os.geteuid() != 0:
        return "not root"
    for tool in ["fusermount3", "unshare", "nsenter", "umount"] + (["mpirun"] if need_mpi else []) + list(tools):
        if shutil.which(tool) is None:
            return tool + " is missing"
    return None


def enter_private_namespace(script, argv):
    """Re-executes the test in a private mount namespace (see the module docstring)."""
    if os.environ.get(NS_MARK) == "1":
        for mp in list_fuse_mounts():
            subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=RUN_TIMEOUT)
        return
    os.environ[NS_MARK] = "1"
    unshare = shutil.which("unshare")
    os.execv(unshare, [unshare, "-m", "--propagation", "private", PYTHON, script] + argv)


def list_fuse_mounts():
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype = right.split()[0]
            if fstype.startswith("fuse") and fstype != "fusectl":
                out.append(left.split()[4].replace("\\040", " "))
    return sorted(out, key=len, reverse=True)


def main(script, with_np=False, tools=()):
    global STAGEFS, NP, MPIRUN
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    if not argv:
        print("usage: %s STAGEFS%s [-- UNITTEST ARGS]" % (script, " NP [MPIRUN ARGS...]" if with_np else ""),
              file=sys.stderr)
        sys.exit(2)
    STAGEFS = os.path.abspath(argv[0])
    if with_np:
        NP = int(argv[1])
        if len(argv) > 2:
            MPIRUN = argv[2:]
    why = missing_prerequisite(with_np, tools)
    if why:
        print("SKIP: " + why, file=sys.stderr)
        sys.exit(77)
    enter_private_namespace(os.path.abspath(script), sys.argv[1:])
    unittest.main(module="__main__", argv=[script] + rest, verbosity=2)


def tool_main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "stats":
        sys.stdout.write(os.getxattr(args[0], "user.stagefs.stats").decode())
        return 0
    if cmd == "sha256":
        for p in args:
            print(sha256_file(p), os.path.getsize(p))
        return 0
    if cmd == "reader":
        print("ready", flush=True)
        sys.stdin.readline()
        rc = 0
        for p in args:
            try:
                h = hashlib.sha256()
                n = 0
                with open(p, "rb") as f:
                    while True:
                        b = f.read(4 * MiB)
                        if not b:
                            break
                        h.update(b)
                        n += len(b)
                print("ok", h.hexdigest(), n, flush=True)
            except OSError as e:
                print("err", e.errno, errno.errorcode.get(e.errno, "?"), str(e).replace("\n", " "), flush=True)
                rc = 1
        return rc
    print("unknown command " + cmd, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(tool_main(sys.argv[1:]))
