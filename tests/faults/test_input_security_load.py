#!/usr/bin/python3
"""Fault tests of stagefs (ctest label "faults"): bad input, odd names, special files, a second
user, load. Reuses the real-mount fixture of tests/mount/stagefs_harness.py: every test runs in
a private mount namespace of its own, in a fresh work dir under /var/tmp, and everything it
mounted or started is removed even when it fails.

Usage: test_input_security_load.py STAGEFS [NP [MPIRUN ARGS...]] [-- UNITTEST ARGS (classes)]
(exits 77 without /dev/fuse, root, fusermount3, unshare, nsenter; with NP, without mpirun;
for the Security class, without useradd/userdel/setpriv)

  Input     every option with a missing, empty, malformed and out-of-range value; missing
            operands; a SOURCE_DIR / MOUNTPOINT / --cache that cannot work: exit 2 (usage) or 1
            (refused at start), a message naming the problem, no crash, nothing mounted.
            Relative paths work. `stagefs --wait` on nothing mounted times out with exit 1.
  Names     spaces, a newline, non-UTF-8 bytes, leading dashes, 255-byte names, 20 levels:
            the mount lists exactly what the source holds and reads give the source's bytes
  Special   a FIFO, a UNIX socket, a char device node, symlinks (one pointing out of
            SOURCE_DIR): same type, mode and target; opening them never materializes anything
  Security  a real second user: the source's permissions hold through the mount, the cache is
            0700, a root-made copy of a 0600 file does not leak
  Load      (NP ranks, MPI) 64 concurrent range readers over 12 large files, then 1,000 small
            files opened in one burst: no error, right bytes; the daemons' fd count and RSS
            come back

Run as `test_input_security_load.py tool ...` it is the reader used inside a node's namespace.
Standard library only.
"""
import errno
import hashlib
import json
import os
import pwd
import random
import re
import resource
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
import stagefs_harness as h  # noqa: E402

MiB = h.MiB
SCRIPT = os.path.abspath(__file__)


# ---- small helpers ------------------------------------------------------------------------

def mount_count(prefix):
    """Number of mounts (mountinfo lines, stacked ones counted) at or below prefix here."""
    n = 0
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix.rstrip("/") + "/"):
                n += 1
    return n


def allow_core_dumps():
    """preexec_fn: raise the core limit to its hard limit, so that a crash leaves a core."""
    try:
        hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    except (ValueError, OSError):
        pass


def cores_in(d):
    return [n for n in os.listdir(d) if n == "core" or n.startswith("core.")]


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def tree(root):
    """{relative bytes path: (type, mode, size or symlink target)} of everything below root
    (bytes), never following symlinks."""
    out = {}

    def walk(rel):
        for name in os.listdir(os.path.join(root, rel) if rel else root):
            r = os.path.join(rel, name) if rel else name
            st = os.lstat(os.path.join(root, r))
            if stat.S_ISDIR(st.st_mode):
                out[r] = ("dir", stat.S_IMODE(st.st_mode), None)
                walk(r)
            elif stat.S_ISLNK(st.st_mode):
                out[r] = ("link", None, os.readlink(os.path.join(root, r)))
            else:
                out[r] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size)
    walk(b"")
    return out


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def pread_full(fd, n, off):
    out = []
    while n > 0:
        b = os.pread(fd, n, off)
        if not b:
            break
        out.append(b)
        n -= len(b)
        off += len(b)
    return b"".join(out)


def stats_of(mnt):
    return json.loads(os.getxattr(mnt, "user.stagefs.stats"))


def host_target():
    """An absolute path outside every test dir that a symlink can point to."""
    for p in ("/etc/hostname", "/etc/passwd"):
        if os.path.isfile(p) and not os.path.islink(p):
            return p
    return None


# ---- the tools run inside a node's namespace ---------------------------------------------

def tool_ranges(src, mnt, seed, nthreads, nranges, rels):
    """nthreads threads, each reading nranges random ranges of random files through the mount
    (a fresh open each time) and comparing them with the same range of the source."""
    sizes = {r: os.path.getsize(os.path.join(src, r)) for r in rels}
    errors, counts = [], []
    lock = threading.Lock()

    def worker(t):
        rng = random.Random(seed * 1000 + t)
        srcfds = {r: os.open(os.path.join(src, r), os.O_RDONLY) for r in rels}
        n = nbytes = 0
        try:
            for _ in range(nranges):
                r = rng.choice(rels)
                size = sizes[r]
                off = rng.randrange(0, size + 4096)          # sometimes past the end
                length = rng.choice([1, 4095, 4096, 65537, 131072, 262147, rng.randrange(1, 512 * 1024)])
                try:
                    fd = os.open(os.path.join(mnt, r), os.O_RDONLY)
                    try:
                        got = pread_full(fd, length, off)
                    finally:
                        os.close(fd)
                except OSError as e:
                    with lock:
                        errors.append("%s @%d+%d: %s" % (r, off, length, e))
                    continue
                want = pread_full(srcfds[r], length, off)
                if got != want:
                    with lock:
                        errors.append("%s @%d+%d: %d bytes differ from the source's %d" %
                                      (r, off, length, len(got), len(want)))
                n += 1
                nbytes += len(got)
        finally:
            for fd in srcfds.values():
                os.close(fd)
        with lock:
            counts.append((n, nbytes))

    return run_threads(worker, nthreads, errors, counts)


def tool_burst(src, mnt, nthreads, rels):
    """nthreads threads taking files from one list: read each whole file through the mount and
    compare it with the source."""
    todo = list(rels)
    errors, counts = [], []
    lock = threading.Lock()

    def worker(_t):
        n = nbytes = 0
        while True:
            with lock:
                if not todo:
                    break
                r = todo.pop()
            try:
                got = read_all(os.path.join(mnt, r))
            except OSError as e:
                with lock:
                    errors.append("%s: %s" % (r, e))
                continue
            if got != read_all(os.path.join(src, r)):
                with lock:
                    errors.append("%s: content differs from the source" % r)
            n += 1
            nbytes += len(got)
        with lock:
            counts.append((n, nbytes))

    return run_threads(worker, nthreads, errors, counts)


def run_threads(worker, nthreads, errors, counts):
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every process is up
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"ops": sum(c[0] for c in counts), "bytes": sum(c[1] for c in counts),
                      "threads_done": len(counts), "seconds": round(time.monotonic() - t0, 3),
                      "nerrors": len(errors), "errors": errors[:20]}), flush=True)
    return 0 if not errors and len(counts) == nthreads else 1


def tool_main(argv):
    cmd = argv[0]
    if cmd == "ranges":
        src, mnt, seed, nthreads, nranges = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
        return tool_ranges(src, mnt, seed, nthreads, nranges, argv[6:])
    if cmd == "burst":
        src, mnt, nthreads = argv[1], argv[2], int(argv[3])
        return tool_burst(src, mnt, nthreads, sys.stdin.readline().split())
    print("unknown tool " + cmd, file=sys.stderr)
    return 2


# ---- 1. bad input -----------------------------------------------------------------------

# option: (malformed values, out-of-range values). "nan" is malformed for a number of seconds.
OPTION_VALUES = {
    "--chunk-size": (["abc", "16Q", "1.5M", "-4K", "4K4", "99999999999999999999"], ["0", "1K", "4095", "2G", "1025M"]),
    "--attr-timeout": (["abc", "1s", "nan"], ["-1", "inf", "1e400"]),
    "--entry-timeout": (["abc", "1s", "nan"], ["-1", "inf", "1e400"]),
    "--stall-timeout": (["abc", "1m", "nan"], ["0", "-5", "inf", "1e400"]),
    "--on-stall": (["EIO", "fail", "eio,source"], []),
    "--threads": (["abc", "1.5", "4x"], ["0", "-1", "1025", "99999999999"]),
    "--wait-timeout": (["abc", "1s", "nan"], ["0", "-1", "inf"]),
    "--cache": ([], []),
    "--wait": ([], []),
}


class Input(h.MountTestCase):
    def setUp(self):
        super().setUp()
        with open(os.path.join(self.work.src, "f"), "wb") as f:
            f.write(b"relative paths work\n" * 100)
        self.n = 0
        self.messages = []  # (case, rc, stderr) of every invocation, for the report

    def cache_path(self):
        self.n += 1
        return self.work.file("cache%d" % self.n)

    def invoke(self, args, cwd=None, timeout=20):
        """Runs stagefs ARGS; returns (rc, stdout, stderr, mounted): mounted is True when a new
        mount appeared under the work dir (then it was unmounted and stagefs ended)."""
        self.n += 1
        out_p, err_p = self.work.file("inv%d.out" % self.n), self.work.file("inv%d.err" % self.n)
        before = mount_count(self.work.path)
        with open(out_p, "w") as o, open(err_p, "w") as e:
            p = subprocess.Popen([h.STAGEFS] + [str(a) for a in args], stdin=subprocess.DEVNULL, stdout=o,
                                 stderr=e, cwd=cwd or self.work.path, env=h.clean_env(), start_new_session=True,
                                 preexec_fn=allow_core_dumps)
        mounted = []

        def ended_or_mounted():
            if p.poll() is not None:
                return True
            if mount_count(self.work.path) > before:
                mounted.append(True)
                return True
            return False
        try:
            h.wait_for(ended_or_mounted, timeout, "stagefs %s to exit" % args)
        except AssertionError:
            h.stop_popen(p)
            raise
        if mounted:  # accepted: take the mount down again (the test fails anyway)
            for mp in h.mounts_under(self.work.path):
                h.force_unmount(mp)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                h.stop_popen(p)
        with open(out_p, errors="replace") as o, open(err_p, errors="replace") as e:
            out, err = o.read(), e.read()
        return p.returncode, out, err, bool(mounted)

    def assert_refused(self, case, args, status, words, cwd=None, cache=None):
        rc, out, err, mounted = self.invoke(args, cwd=cwd)
        self.messages.append((case, rc, err.strip()))
        h.log("[%s] rc %s: %s" % (case, rc, err.strip()[:400]))
        self.assertFalse(mounted, "%s: accepted and mounted (rc %s): %s" % (case, rc, err[-500:]))
        self.assertIsNotNone(rc)
        self.assertTrue(0 <= rc < 128, "%s: killed by a signal or crashed (rc %s): %s" % (case, rc, err[-500:]))
        self.assertEqual(cores_in(cwd or self.work.path), [], "%s left a core file" % case)
        self.assertEqual(rc, status, "%s: exit status %s, want %s; stderr: %s" % (case, rc, status, err[-500:]))
        for w in words:
            self.assertIn(w, err, "%s: the message does not name %r: %r" % (case, w, err[-500:]))
        self.assertEqual(mount_count(self.work.path), 0, "%s: something is mounted afterwards" % case)
        self.assertEqual(h.stagefs_pids(self.work.path), [], "%s: a stagefs process is left" % case)
        if cache is not None:
            self.assertFalse(os.path.exists(cache), "%s: the refused run created its cache %s" % (case, cache))
        return err

    def base_args(self):
        return [self.work.src, self.work.mnt, "--cache", self.cache_path()]

    def test_option_values(self):
        """Every option with a missing, empty, malformed and out-of-range value: exit 2, the
        message names the option (and the value), nothing is mounted."""
        for opt, (malformed, out_of_range) in OPTION_VALUES.items():
            if opt == "--wait":
                base = []
            elif opt == "--cache":
                base = [self.work.src, self.work.mnt]
            elif opt == "--wait-timeout":
                base = ["--wait", self.work.mnt]
            else:
                base = self.base_args()
            with self.subTest(option=opt, value="(missing)"):
                self.assert_refused("%s (missing value)" % opt, base + [opt], 2, [opt])
            with self.subTest(option=opt, value="(empty)"):
                self.assert_refused("%s ''" % opt, base + [opt, ""], 2, [opt])
            for v in malformed:
                with self.subTest(option=opt, value=v):
                    self.assert_refused("%s %s" % (opt, v), base + [opt, v], 2, [opt, v])
            for v in out_of_range:  # the message may show the value converted ("got 1024 bytes")
                with self.subTest(option=opt, value=v):
                    self.assert_refused("%s %s" % (opt, v), base + [opt, v], 2, [opt])

    def test_usage_messages_are_readable(self):
        """A usage error is one short line naming the option and the value (no 300-digit
        numbers, no range that contains the rejected value)."""
        for opt, val in [("--attr-timeout", "-1"), ("--entry-timeout", "abc"), ("--stall-timeout", "0"),
                         ("--wait-timeout", "0"), ("--threads", "0")]:
            with self.subTest(option=opt, value=val):
                base = ["--wait", self.work.mnt] if opt == "--wait-timeout" else self.base_args()
                err = self.assert_refused("%s %s" % (opt, val), base + [opt, val], 2, [opt])
                first = err.splitlines()[0] if err else ""
                self.assertLessEqual(len(first), 160, "an unreadable message: %r" % first[:400])

    def test_stall_timeout_extremes_refused_or_working(self):
        """--stall-timeout values a double holds but the stall clock cannot (317 years and up):
        either a usage error, or the mount works (a cache miss does not time out at once)."""
        for v in ["1e10", "1e300"]:
            with self.subTest(stall_timeout=v):
                cache = self.cache_path()
                args = [h.STAGEFS, self.work.src, self.work.mnt, "--cache", cache, "--stall-timeout", v]
                r_err = self.work.file("stall%s.err" % v)
                with open(r_err, "w") as e:
                    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=e,
                                         env=h.clean_env(), start_new_session=True)
                try:
                    h.wait_for(lambda: p.poll() is not None or mount_count(self.work.mnt) > 0, 20,
                               "stagefs to exit or mount")
                    if p.poll() is not None:
                        self.assertEqual(p.returncode, 2, "refused, but not as a usage error")
                        self.assertIn("--stall-timeout", h.tail(r_err))
                        continue
                    h.run([h.STAGEFS, "--wait", self.work.mnt, "--wait-timeout", "20"], timeout=40)
                    try:
                        got = read_all(os.path.join(self.work.mnt, "f"))
                        problem = None if got == read_all(os.path.join(self.work.src, "f")) else "wrong bytes"
                    except OSError as ex:
                        problem = "a cache miss failed: %s" % ex
                    state = os.getxattr(self.work.mnt, "user.stagefs.state").decode()
                    self.assertIsNone(problem, "--stall-timeout %s accepted, then %s; state %s; log: %s" %
                                      (v, problem, state, h.tail(r_err, 5)))
                    self.assertEqual(state, "ready")
                finally:
                    if p.poll() is None:
                        h.force_unmount(self.work.mnt)
                        try:
                            p.wait(timeout=30)
                        except subprocess.TimeoutExpired:
                            h.stop_popen(p)
                    self.assertEqual(mount_count(self.work.path), 0)

    def test_missing_operands(self):
        src, mnt = self.work.src, self.work.mnt
        cases = [
            ("no arguments", [], ["SOURCE_DIR", "MOUNTPOINT"]),
            ("no MOUNTPOINT", [src, "--cache", self.cache_path()], ["MOUNTPOINT"]),
            ("no SOURCE_DIR nor MOUNTPOINT", ["--cache", self.cache_path()], ["SOURCE_DIR"]),
            ("no --cache", [src, mnt], ["--cache"]),
            ("empty SOURCE_DIR", ["", mnt, "--cache", self.cache_path()], ["SOURCE_DIR"]),
            ("empty MOUNTPOINT", [src, "", "--cache", self.cache_path()], ["MOUNTPOINT"]),
            ("a third operand", [src, mnt, "extra", "--cache", self.cache_path()], ["extra"]),
            ("an unknown option", [src, mnt, "--cache", self.cache_path(), "--bogus"], ["--bogus"]),
            ("--wait with SOURCE_DIR", ["--wait", mnt, src], ["--wait"]),
        ]
        for case, args, words in cases:
            with self.subTest(case=case):
                self.assert_refused(case, args, 2, words)

    def test_refused_at_start(self):
        w = self.work
        regular = w.file("regular")
        with open(regular, "w") as f:
            f.write("x")
        full = w.file("full")
        os.mkdir(full)
        with open(os.path.join(full, "x"), "w") as f:
            f.write("x")
        c = self.cache_path
        cases = [  # case, SOURCE_DIR, MOUNTPOINT, cache, words, cache must not be created
            ("SOURCE_DIR missing", w.file("nosuch"), w.mnt, c(), ["SOURCE_DIR", w.file("nosuch"), "No such file"], True),
            ("SOURCE_DIR a regular file", regular, w.mnt, c(), ["SOURCE_DIR", regular, "not a directory"], True),
            ("SOURCE_DIR = MOUNTPOINT", w.src, w.src, c(), ["SOURCE_DIR", "MOUNTPOINT", "same"], True),
            ("SOURCE_DIR = MOUNTPOINT (trailing slash)", w.src, w.src + "/", c(), ["same"], True),
            ("MOUNTPOINT inside SOURCE_DIR", w.src, os.path.join(w.src, "sub"), c(), ["inside SOURCE_DIR"], True),
            ("cache inside MOUNTPOINT", w.src, w.mnt, os.path.join(w.mnt, "cache"), ["--cache", "inside MOUNTPOINT"],
             True),
            ("cache = MOUNTPOINT", w.src, w.mnt, w.mnt, ["--cache", "inside MOUNTPOINT"], False),
            ("cache inside SOURCE_DIR", w.src, w.mnt, os.path.join(w.src, "cache"), ["--cache", "inside SOURCE_DIR"],
             True),
            ("SOURCE_DIR inside cache", w.src, w.mnt, w.path, ["SOURCE_DIR", "inside --cache"], False),
            ("MOUNTPOINT missing", w.src, w.file("nomnt"), c(), ["mount point", w.file("nomnt"), "No such file"], True),
            ("MOUNTPOINT a regular file", w.src, regular, c(), ["mount point", regular, "not a directory"], True),
            ("MOUNTPOINT not empty", w.src, full, c(), ["mount point", full, "not empty"], True),
            ("cache a regular file", w.src, w.mnt, regular, ["cache", regular, "Not a directory"], False),
        ]
        # Paths that contradict each other are a usage error (2); the rest is refused at start (1).
        for case, src, mnt, cache, words, fresh in cases:
            with self.subTest(case=case):
                status = 2 if " = MOUNTPOINT" in case or " inside " in case else 1
                self.assert_refused(case, [src, mnt, "--cache", cache], status, words, cache=cache if fresh else None)
        self.assertEqual(os.listdir(w.mnt), [])
        self.assertEqual(os.listdir(w.src), ["f"])

    def test_mountpoint_already_mounted(self):
        d = self.daemon(self.work.file("first")).wait_ready()
        self.assertEqual(mount_count(self.work.mnt), 1)
        cache = self.cache_path()
        rc, out, err, mounted = self.invoke([self.work.src, self.work.mnt, "--cache", cache])
        self.messages.append(("already mounted", rc, err))
        h.log("[MOUNTPOINT already has a stagefs] rc %s: %s" % (rc, err.strip()))
        self.assertFalse(mounted, "a second stagefs mounted over the first: %s" % err)
        self.assertEqual(rc, 1, err)
        self.assertIn("already has a fuse.stagefs mounted", err)
        self.assertIn("fusermount3 -u " + self.work.mnt, err)
        self.assertEqual(mount_count(self.work.mnt), 1, "the mount point has %d mounts" % mount_count(self.work.mnt))
        self.assertFalse(os.path.exists(cache))
        # the first one is unharmed
        self.assertEqual(read_all(os.path.join(self.work.mnt, "f")), read_all(os.path.join(self.work.src, "f")))
        self.assertIsNone(d.proc.poll())
        # the first one's cache, on another mount point: in use
        other = self.work.file("mnt2")
        os.mkdir(other)
        rc, out, err, mounted = self.invoke([self.work.src, other, "--cache", self.work.file("first")])
        h.log("[cache in use] rc %s: %s" % (rc, err.strip()))
        self.assertFalse(mounted)
        self.assertEqual(rc, 1, err)
        self.assertIn("in use by another stagefs", err)
        self.assertEqual(d.stop(), 0)
        self.assertEqual(mount_count(self.work.path), 0)

    def test_relative_paths_work(self):
        w = self.work
        sub = w.file("sub")
        os.mkdir(sub)
        for cwd, src, mnt, cache in [(w.path, "src", "mnt", "cache-rel"),
                                     (sub, "../src", "./../mnt", "../sub/../cache-rel2")]:
            with self.subTest(cwd=cwd, src=src, mnt=mnt, cache=cache):
                err_p = w.file("rel%d.err" % len(w.logs))
                w.logs.append(err_p)
                with open(err_p, "w") as e:
                    p = subprocess.Popen([h.STAGEFS, src, mnt, "--cache", cache], cwd=cwd, stdin=subprocess.DEVNULL,
                                         stdout=e, stderr=e, env=h.clean_env(), start_new_session=True)
                h.STANDALONE_PIDS.add(p.pid)
                try:
                    r = h.run([h.STAGEFS, "--wait", mnt, "--wait-timeout", "20"], cwd=cwd, timeout=40, check=False)
                    self.assertEqual(r.returncode, 0, "relative --wait: %s\n%s" % (r.stderr, h.tail(err_p)))
                    self.assertEqual(read_all(os.path.join(cwd, mnt, "f")), read_all(os.path.join(w.src, "f")))
                    copy = os.path.normpath(os.path.join(cwd, cache, "data", "f"))
                    self.assertTrue(os.path.isfile(copy), "no copy at %s" % copy)
                    self.assertIn("mounted at %s " % w.mnt, h.tail(err_p), "paths are not shown absolute")
                    r = h.run(["fusermount3", "-u", mnt], cwd=cwd, timeout=30, check=False)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(p.wait(timeout=30), 0, h.tail(err_p))
                finally:
                    if p.poll() is None:
                        h.force_unmount(w.mnt)
                        try:
                            p.wait(timeout=30)
                        except subprocess.TimeoutExpired:
                            h.stop_popen(p)
                self.assertEqual(mount_count(w.path), 0)

    def test_wait_on_nothing_mounted(self):
        for case, path in [("an empty directory", self.work.mnt), ("a missing path", self.work.file("nosuch"))]:
            with self.subTest(case=case):
                t0 = time.monotonic()
                err = self.assert_refused("--wait on %s" % case, ["--wait", path, "--wait-timeout", "1"], 1,
                                          ["--wait", path, "not ready", "not mounted"])
                took = time.monotonic() - t0
                h.log("--wait on %s: %.2f s, %r" % (case, took, err.strip()))
                self.assertGreaterEqual(took, 0.9, "gave up before its timeout")
                self.assertLess(took, 10, "took far longer than --wait-timeout 1")


# ---- 2. names -------------------------------------------------------------------------------

ODD_NAMES = [
    b"with space", b" leading space", b"trailing space ", b"new\nline", b"\nstarts with newline",
    b"non-utf8 \xff\xfe\x80 bytes", b"\xc3\x28 invalid sequence", "utf8 \u00e9\u4e2d\U0001F600".encode(),
    b"-leading-dash", b"--help", b"-", b"tab\tin name", b"back\\slash", b"quote'\"", b"*glob?[x]", b"#hash",
    b"a" * 200, b"b" * 240, b"c" * 255,
]


def label(rel):
    """A short printable label of a bytes path (long names abbreviated)."""
    parts = []
    for part in rel.split(b"/"):
        parts.append("%r...(%d bytes)" % (part[:8], len(part)) if len(part) > 40 else repr(part))
    return "/".join(parts)


class Names(h.MountTestCase):
    def build(self):
        src = os.fsencode(self.work.src)
        files = {}

        def put(rel, seed):
            data = rel + b"\n" + random.Random(seed).randbytes(seed % 9000)
            with open(os.path.join(src, rel), "wb") as f:
                f.write(data)
            files[rel] = data
        for i, n in enumerate(ODD_NAMES):
            put(n, i + 1)
        # directories with odd names, odd names inside
        for i, d in enumerate([b"dir with space", b"dir\nnewline", b"dir \xff\xfe", b"-dashdir", b"d" * 255]):
            os.mkdir(os.path.join(src, d))
            put(os.path.join(d, b"inner file"), 100 + i)
            put(os.path.join(d, b"-inner\n\xfe"), 200 + i)
        put(os.path.join(b"d" * 255, b"e" * 255), 300)
        # 20 levels deep
        deep = b"/".join(b"level%02d" % i for i in range(1, 21))
        os.makedirs(os.path.join(src, deep))
        put(os.path.join(deep, b"leaf"), 400)
        put(os.path.join(deep, b"leaf with \xff and \n"), 401)
        put(os.path.join(b"level01", b"shallow"), 402)
        return src, files

    def test_odd_names_list_and_read(self):
        src, files = self.build()
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()
        mnt = os.fsencode(self.work.mnt)
        want, got = tree(src), tree(mnt)
        with self.subTest("listing"):
            self.assertEqual(sorted(map(label, set(got) - set(want))), [], "listed but not in the source")
            self.assertEqual(sorted(map(label, set(want) - set(got))), [], "in the source but not listed")
            self.assertEqual([label(r) for r in sorted(want) if got[r] != want[r]], [], "listed differently")
            self.assertGreaterEqual(len(want), len(files) + 25)
        failed = {}
        for rel, data in sorted(files.items()):
            with self.subTest(read=label(rel)):
                try:
                    b = read_all(os.path.join(mnt, rel))
                except OSError as e:
                    failed[label(rel)] = "%s %s" % (errno.errorcode.get(e.errno, e.errno), e.strerror)
                    self.fail("reading %s through the mount: %s %s" %
                              (label(rel), errno.errorcode.get(e.errno, e.errno), e.strerror))
                self.assertEqual(b, data, "%s: wrong bytes" % label(rel))
                self.assertEqual(read_all(os.path.join(os.fsencode(cache), b"data", rel)), data)
        if failed:
            _, err = d.output()
            h.log("names that could not be read:\n  " + "\n  ".join("%s: %s" % kv for kv in failed.items()))
            h.log("daemon log (names abbreviated):\n" + "\n".join(
                re.sub(r"([a-e])\1{40,}", lambda m: "%s{%d}" % (m.group(1), len(m.group(0))), line)
                for line in err.splitlines() if "error" in line or "warning" in line))
        s = d.stats()
        self.assertEqual(s["open_errors"], 0, s)
        # Small files are staged by directory: one batch per directory read, which
        # copied every file (odd names included). Walks stage some directories before their
        # first open: no open of theirs is a miss.
        self.assertEqual(s["batch_files"], len(files), s)
        self.assertEqual(s["batches"], len({os.path.dirname(rel) for rel in files}), s)
        self.assertLessEqual(s["materializations"], s["batches"], s)


# ---- 3. special files ---------------------------------------------------------------------

class Special(h.MountTestCase):
    def test_special_files_and_symlinks(self):
        src = self.work.src
        os.mkfifo(os.path.join(src, "fifo"), 0o640)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(os.path.join(src, "sock"))
        sock.close()
        os.chmod(os.path.join(src, "sock"), 0o751)
        try:
            os.mknod(os.path.join(src, "null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            have_dev = True
        except OSError as e:
            h.log("mknod refused (%s): no device node case" % e)
            have_dev = False
        with open(os.path.join(src, "target.txt"), "wb") as f:
            f.write(b"the target\n")
        outside = host_target()
        links = {"rel-link": "target.txt", "dangling": "nowhere/at/all", "dot-dot-out": "../" * 12 + "etc/passwd"}
        if outside:
            links["abs-out"] = outside
        for n, t in links.items():
            os.symlink(t, os.path.join(src, n))
        cache = self.work.file("cache")
        data = os.path.join(cache, "data")
        d = self.daemon(cache).wait_ready()
        mnt = self.work.mnt

        with self.subTest("listed with the same type and mode"):
            self.assertEqual(sorted(os.listdir(mnt)), sorted(os.listdir(src)))
            for n, test in [("fifo", stat.S_ISFIFO), ("sock", stat.S_ISSOCK)] + ([("null", stat.S_ISCHR)] if have_dev else []):
                m, s = os.lstat(os.path.join(mnt, n)), os.lstat(os.path.join(src, n))
                self.assertTrue(test(m.st_mode), "%s: mode %o through the mount" % (n, m.st_mode))
                self.assertEqual(m.st_mode, s.st_mode, n)
                self.assertEqual((m.st_uid, m.st_gid), (s.st_uid, s.st_gid), n)
                if n == "null":
                    self.assertEqual(m.st_rdev, s.st_rdev)
            kinds = {e.name: (e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False),
                              e.is_symlink()) for e in os.scandir(mnt)}
            want = {e.name: (e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False),
                             e.is_symlink()) for e in os.scandir(src)}
            self.assertEqual(kinds, want)
        with self.subTest("symlinks: same target, shown as symlinks"):
            for n, t in links.items():
                self.assertTrue(stat.S_ISLNK(os.lstat(os.path.join(mnt, n)).st_mode), n)
                self.assertEqual(os.readlink(os.path.join(mnt, n)), t, n)

        before = d.stats()
        with self.subTest("a FIFO opened O_RDONLY|O_NONBLOCK through the mount"):
            code = ("import os,sys,stat; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_NONBLOCK); "
                    "print(stat.S_ISFIFO(os.fstat(fd).st_mode), len(os.read(fd, 10))); os.close(fd)")
            r = h.run([h.PYTHON, "-c", code, os.path.join(mnt, "fifo")], timeout=15, check=False)
            self.assertEqual((r.returncode, r.stdout.split()), (0, ["True", "0"]), r.stderr)
        with self.subTest("a socket cannot be opened"):
            with self.assertRaises(OSError) as cm:
                os.open(os.path.join(mnt, "sock"), os.O_RDONLY)
            self.assertEqual(cm.exception.errno, errno.ENXIO, cm.exception)
        if have_dev:
            with self.subTest("the device node cannot be opened (nodev)"):
                for flags in (os.O_RDONLY, os.O_RDONLY | os.O_NONBLOCK):
                    with self.assertRaises(OSError) as cm:
                        os.close(os.open(os.path.join(mnt, "null"), flags))
                    self.assertEqual(cm.exception.errno, errno.EACCES, cm.exception)
        after = d.stats()
        with self.subTest("special files are never materialized"):
            self.assertEqual(os.listdir(data), [], "the cache got: %s" % os.listdir(data))
            for k in ("opens", "materializations", "transfers", "open_errors"):
                self.assertEqual(after[k], before[k], "%s changed: %s -> %s" % (k, before, after))

        with self.subTest("symlinks out of SOURCE_DIR resolve from the mount, are not materialized"):
            if outside:
                self.assertEqual(read_all(os.path.join(mnt, "abs-out")), read_all(outside))
            self.assertEqual(read_all(os.path.join(mnt, "dot-dot-out")), read_all("/etc/passwd"))
            with self.assertRaises(FileNotFoundError):
                read_all(os.path.join(mnt, "dangling"))
            s = d.stats()
            self.assertEqual((s["opens"], s["materializations"], s["transfers"]),
                             (before["opens"], before["materializations"], before["transfers"]), s)
            self.assertEqual(os.listdir(data), [])
        with self.subTest("a symlink inside: the target is materialized, under its own name only"):
            self.assertEqual(read_all(os.path.join(mnt, "rel-link")), b"the target\n")
            s = d.stats()
            self.assertEqual(s["materializations"], before["materializations"] + 1, s)
            self.assertEqual(sorted(os.listdir(data)), ["target.txt"])
            self.assertTrue(stat.S_ISREG(os.lstat(os.path.join(data, "target.txt")).st_mode))
        self.assertEqual(d.stats()["open_errors"], 0)


# ---- 4. security with a second user --------------------------------------------------------

PROBE = r"""
import errno, hashlib, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read":
        with open(path, "rb") as f:
            print("ok", hashlib.sha256(f.read()).hexdigest())
    elif op == "list":
        print("ok", len(os.listdir(path)))
    elif op == "stat":
        os.stat(path)
        print("ok")
except OSError as e:
    print("err", errno.errorcode.get(e.errno, str(e.errno)))
"""


def create_user():
    name = "stagetest"
    try:
        pwd.getpwnam(name)
        name = "stagetest%d" % (os.getpid() % 100000)  # taken (by someone else): one of our own
    except KeyError:
        pass
    r = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("useradd %s failed: %s" % (name, r.stdout))
    return name


def delete_user(name):
    r = subprocess.run(["userdel", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if r.returncode != 0:
        h.log("userdel %s: %s" % (name, r.stdout))


class Security(h.MountTestCase):
    def setUp(self):
        super().setUp()
        self.user = create_user()
        self.addCleanup(delete_user, self.user)  # runs even if the test fails
        pw = pwd.getpwnam(self.user)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid

    def as_user(self, *cmd):
        r = h.run(["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups", "--"] +
                  list(cmd), cwd="/", timeout=30, check=False)
        return r

    def probe(self, op, path):
        r = self.as_user(h.PYTHON, "-c", PROBE, op, path)
        return r.stdout.split() or ["no output", r.stderr[-300:]]

    def test_permissions_hold_for_a_second_user(self):
        src = self.work.src
        secret, public = os.path.join(src, "secret"), os.path.join(src, "public")
        with open(secret, "wb") as f:
            f.write(b"root only\n" * 100)
        os.chmod(secret, 0o600)
        with open(public, "wb") as f:
            f.write(b"everyone\n" * 100)
        os.chmod(public, 0o644)
        os.mkdir(os.path.join(src, "private"))
        with open(os.path.join(src, "private", "inner"), "wb") as f:
            f.write(b"inside 0700\n")
        os.chmod(os.path.join(src, "private", "inner"), 0o644)
        os.chmod(os.path.join(src, "private"), 0o700)
        os.mkdir(os.path.join(src, "listonly"))
        with open(os.path.join(src, "listonly", "inner"), "wb") as f:
            f.write(b"listed, not searchable\n")
        os.chmod(os.path.join(src, "listonly", "inner"), 0o644)
        os.chmod(os.path.join(src, "listonly"), 0o744)
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()
        mnt = self.work.mnt
        sha = lambda p: hashlib.sha256(read_all(p)).hexdigest()  # noqa: E731

        with self.subTest("the user reads the 0644 file"):
            self.assertEqual(self.probe("read", os.path.join(mnt, "public")), ["ok", sha(public)])
        with self.subTest("the user cannot read the 0600 file"):
            self.assertEqual(self.probe("read", os.path.join(mnt, "secret")), ["err", "EACCES"])
            r = self.as_user("cat", os.path.join(mnt, "secret"))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("Permission denied", r.stderr)
            self.assertEqual(r.stdout, "")
        with self.subTest("the user cannot list or enter the 0700 directory"):
            self.assertEqual(self.probe("list", os.path.join(mnt, "private")), ["err", "EACCES"])
            self.assertEqual(self.probe("read", os.path.join(mnt, "private", "inner")), ["err", "EACCES"])
            r = self.as_user("ls", os.path.join(mnt, "private"))
            self.assertIn("Permission denied", r.stderr)
        with self.subTest("denied opens never reach the daemon: nothing was copied for them"):
            s = d.stats()
            self.assertEqual((s["opens"], s["materializations"]), (1, 1), s)
            self.assertEqual(sorted(os.listdir(os.path.join(cache, "data"))), ["public"])
        with self.subTest("the cache is 0700; the user cannot read a copy directly, root can"):
            self.assertEqual(stat.S_IMODE(os.stat(cache).st_mode), 0o700)
            copy = os.path.join(cache, "data", "public")
            self.assertEqual(self.probe("read", copy), ["err", "EACCES"])
            self.assertEqual(self.probe("stat", copy), ["err", "EACCES"])
            self.assertEqual(self.probe("list", cache), ["err", "EACCES"])
            self.assertEqual(sha(copy), sha(public))
        with self.subTest("root's copy of the 0600 file does not open it to the user"):
            self.assertEqual(read_all(os.path.join(mnt, "secret")), read_all(secret))  # root materializes it
            copy = os.path.join(cache, "data", "secret")
            self.assertTrue(os.path.isfile(copy))
            self.assertEqual(stat.S_IMODE(os.stat(copy).st_mode) & 0o077, 0, "the copy is readable by others")
            self.assertEqual(self.probe("read", os.path.join(mnt, "secret")), ["err", "EACCES"])
            self.assertEqual(self.probe("read", copy), ["err", "EACCES"])
            self.assertEqual(os.lstat(os.path.join(mnt, "secret")).st_mode, os.lstat(secret).st_mode)
        with self.subTest("root's copy of a file in the 0700 dir does not open it to the user"):
            self.assertEqual(read_all(os.path.join(mnt, "private", "inner")), b"inside 0700\n")
            self.assertEqual(self.probe("read", os.path.join(mnt, "private", "inner")), ["err", "EACCES"])
            self.assertEqual(self.probe("read", os.path.join(cache, "data", "private", "inner")), ["err", "EACCES"])
        with self.subTest("a directory others may list but not search: names only, even once root's listing "
                          "(READDIRPLUS) put its entries with their attributes in the kernel's cache"):
            listonly = os.path.join(mnt, "listonly")
            self.assertEqual(os.listdir(listonly), ["inner"])
            os.stat(os.path.join(listonly, "inner"))
            self.assertEqual(self.probe("list", listonly), ["ok", "1"])
            self.assertEqual(self.probe("stat", os.path.join(listonly, "inner")), ["err", "EACCES"])
            self.assertEqual(self.probe("read", os.path.join(listonly, "inner")), ["err", "EACCES"])
        with self.subTest("the user cannot unmount root's mount"):
            r = self.as_user("fusermount3", "-u", mnt)
            self.assertNotEqual(r.returncode, 0)
            self.assertEqual(os.getxattr(mnt, "user.stagefs.state"), b"ready")
        self.assertEqual(d.stats()["open_errors"], 0)


# ---- 5. load ------------------------------------------------------------------------------

class SafeGroup(h.Group):
    """h.Group whose leftovers() names only processes of this test. A mount namespace's inode
    number is recycled once the namespace is gone, so after a rank ended another test's
    processes may be "in" its namespace: a process there counts only if its command line
    names this test's work dir (every command this test runs on a node does)."""

    def leftovers(self):
        mine = set(h.stagefs_pids(self.work.path)) - h.STANDALONE_PIDS
        marker = self.work.path.encode()
        inside = [p for p in h.pids_in_namespaces(self.namespaces) if any(marker in a for a in h.proc_cmdline(p))]
        return sorted(mine | set(inside))


class Load(h.MountTestCase):
    NBIG = 12
    NSMALL = 1000
    READERS_PER_NODE = 16
    RANGES = 200
    BURST_THREADS = 8

    def spawn_tools(self, g, jobs, timeout):
        """jobs: [(node, argv, stdin payload or None)]. Starts them all, waits until every one
        printed "ready", releases them together, returns [(node, rc, result dict, stderr)]."""
        procs = []
        for k, argv, payload in jobs:
            p = g.spawn(k, [h.PYTHON, SCRIPT, "tool"] + argv)
            if payload is not None:
                p.stdin.write(payload + "\n")
                p.stdin.flush()
            procs.append((k, p))
        for k, p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                self.fail("tool on node %d did not start: %r %s" % (k, line, p.stderr.read()[-500:]))
        for _, p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        deadline = time.monotonic() + timeout
        for k, p in procs:
            try:
                stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                h.stop_popen(p)
                raise AssertionError("tool on node %d did not finish within %d s" % (k, timeout))
            try:
                res = json.loads(stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res = {"nerrors": -1, "errors": ["no result: %r" % stdout[-300:]]}
            out.append((k, p.returncode, res, stderr[-1000:]))
        return out

    def measure(self, g, what):
        m = [(fd_count(pid), rss_kib(pid)) for pid in g.pids]
        h.log("LOAD %-28s fds %s  VmRSS MiB %s" % (what, [x[0] for x in m], [round(x[1] / 1024, 1) for x in m]))
        return m

    def test_concurrent_readers_and_a_burst_of_small_files(self):
        src = self.work.src
        rng = random.Random(2024)
        os.mkdir(os.path.join(src, "big"))
        big = []
        for i in range(self.NBIG):
            rel = "big/f%02d.bin" % i
            h.write_random(os.path.join(src, rel), rng.randrange(8 * MiB, 32 * MiB), seed=500 + i)
            big.append(rel)
        small = []
        for i in range(self.NSMALL):
            d = os.path.join(src, "small", "d%02d" % (i % 20))
            os.makedirs(d, exist_ok=True)
            rel = "small/d%02d/s%04d" % (i % 20, i)
            with open(os.path.join(src, rel), "wb") as f:
                f.write(rng.randbytes(rng.randrange(0, 64 * 1024)))
            small.append(rel)
        g = SafeGroup(self.work, h.NP)
        self.groups.append(g)
        g.wait_ready()
        self.measure(g, "after mount")

        # materialize the big files: node k opens every NP-th one
        t0 = time.monotonic()
        for k in range(g.np):
            paths = [os.path.join(g.mnt, r) for r in big[k::g.np]]
            got = g.sha256_on(k, *paths)
            for r in big[k::g.np]:
                self.assertEqual(got[os.path.join(g.mnt, r)],
                                 (h.sha256_file(os.path.join(src, r)), os.path.getsize(os.path.join(src, r))), r)
        total = sum(os.path.getsize(os.path.join(src, r)) for r in big)
        h.log("LOAD materialized %d files, %.0f MiB, in %.1f s" % (self.NBIG, total / MiB, time.monotonic() - t0))
        s0 = g.wait_transfers(0, self.NBIG)
        self.assertEqual((s0["transfers"], s0["bytes_broadcast"]), (self.NBIG, total), s0)
        base = self.measure(g, "before the readers")

        # 64 concurrent range readers
        t0 = time.monotonic()
        res = self.spawn_tools(g, [(k, ["ranges", src, g.mnt, str(k + 1), str(self.READERS_PER_NODE),
                                        str(self.RANGES)] + big, None) for k in range(g.np)], timeout=150)
        took = time.monotonic() - t0
        ops = sum(r[2].get("ops", 0) for r in res)
        nbytes = sum(r[2].get("bytes", 0) for r in res)
        h.log("LOAD %d readers: %d ranges, %.0f MiB in %.1f s" % (g.np * self.READERS_PER_NODE, ops, nbytes / MiB, took))
        for k, rc, r, err in res:
            with self.subTest(readers_on_node=k):
                self.assertEqual((rc, r.get("nerrors")), (0, 0), "node %d: %s %s" % (k, r.get("errors"), err))
                self.assertEqual(r.get("ops"), self.READERS_PER_NODE * self.RANGES, r)
        for k in range(g.np):
            s = g.stats(k)
            self.assertEqual((s["open_errors"], s["transfers"]), (0, self.NBIG), s)
        after_readers = self.check_resources(g, base, "after the readers")

        # 1,000 different small files opened in one burst, spread over the nodes
        t0 = time.monotonic()
        res = self.spawn_tools(g, [(k, ["burst", src, g.mnt, str(self.BURST_THREADS)], " ".join(small[k::g.np]))
                                   for k in range(g.np)], timeout=180)
        took = time.monotonic() - t0
        h.log("LOAD burst of %d small files on %d nodes x %d threads: %.1f s" %
              (self.NSMALL, g.np, self.BURST_THREADS, took))
        for k, rc, r, err in res:
            with self.subTest(burst_on_node=k):
                self.assertEqual((rc, r.get("nerrors")), (0, 0), "node %d: %s %s" % (k, r.get("errors"), err))
                self.assertEqual(r.get("ops"), len(small[k::g.np]), r)
        s = [g.stats(k) for k in range(g.np)]
        for k in range(g.np):
            with self.subTest(stats_of_node=k):
                # The small files are staged by directory (20 of them), one batch each.
                self.assertEqual(s[k]["transfers"], self.NBIG + 20, s[k])
                self.assertEqual(s[k]["batches"], 20, s[k])
                self.assertEqual(s[k]["batch_files"], self.NSMALL, s[k])
                self.assertEqual(s[k]["local_writes"], self.NBIG + 20, s[k])
                self.assertEqual((s[k]["transfer_failures"], s[k]["open_errors"]), (0, 0), s[k])
                self.assertEqual(len(h.regular_files(os.path.join(g.caches[k], "data", "small"))), self.NSMALL)
        h.log("LOAD stats of node 0 at the end: %s" % s[0])
        self.check_resources(g, base, "after the burst")
        self.assertTrue(after_readers)

    def check_resources(self, g, base, what):
        """fd count back to base (+4) on every daemon (the kernel releases files shortly after the
        last close: polled with a deadline), RSS growth under 64 MiB. Returns the numbers."""
        def settled():
            return all(fd_count(pid) <= base[k][0] + 4 for k, pid in enumerate(g.pids))
        try:
            h.wait_for(settled, 15, "the daemons' fd counts to settle")
        except AssertionError:
            pass
        now = self.measure(g, what)
        for k in range(g.np):
            with self.subTest(resources_of_node=k, when=what):
                self.assertLessEqual(now[k][0], base[k][0] + 4, "node %d: %d fds, %d before" %
                                     (k, now[k][0], base[k][0]))
                self.assertLess(now[k][1] - base[k][1], 64 * 1024, "node %d: VmRSS %d KiB, %d KiB before" %
                                (k, now[k][1], base[k][1]))
        return now


# ---- entry point ---------------------------------------------------------------------------

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "tool":
        sys.exit(tool_main(sys.argv[2:]))
    args = sys.argv[1:]
    before = args[:args.index("--")] if "--" in args else args
    after = args[args.index("--") + 1:] if "--" in args else []
    selected = [a for a in after if not a.startswith("-")]
    if (not selected or any(s.split(".")[0] == "Security" for s in selected)) and os.geteuid() == 0:
        missing = [t for t in ("useradd", "userdel", "setpriv") if shutil.which(t) is None]
        if missing:
            print("SKIP: %s missing (Security needs a real second user)" % ", ".join(missing), file=sys.stderr)
            sys.exit(77)
    h.main(SCRIPT, with_np=len(before) > 1)


if __name__ == "__main__":
    main()
