#!/usr/bin/python3
"""Real-MPI integration tests for stage-bcast (ctest label "mpi").

Usage: test_stage_bcast.py STAGE_BCAST NP [MPIRUN ARGS...] [-- UNITTEST ARGS...]

Every rank acts as its own node (--ranks-as-nodes) and the destination pattern holds %n, so
node k writes under WORK/node<k>/. MPIRUN defaults to
`mpirun --allow-run-as-root --oversubscribe`; CTest passes ${STAGE_MPIRUN}. Each test case
gets a fresh directory under /var/tmp, removed (and any mount in it undone) in tearDown.
Standard library only. No sleeps; every subprocess has a timeout.
"""
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mount"))
import profile_format  # noqa: E402  (a profile written as docs/profile-format.md says)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

BIN = None        # path of stage-bcast
NP = 1            # ranks (= nodes) per mpirun job
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
RUN_TIMEOUT = 60  # seconds for any single subprocess (a normal run takes a few)
TEMP_MARK = ".stage-tmp."


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def clean_env():
    """The environment without any launcher variables: stage-bcast must run standalone."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}


def mpi_env():
    env = dict(os.environ)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def run(cmd, env, timeout=RUN_TIMEOUT):
    """Runs cmd in its own session; on timeout terminates the whole group and fails loudly."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         start_new_session=True, text=True, errors="replace")
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # What was still running, and in which kernel wait, before the group is killed.
        ps = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:32,etime,args", "-s", str(p.pid)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30).stdout
        out, err = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        raise AssertionError("timed out after %ss: %s\nprocesses:\n%s\nstdout:\n%s\nstderr:\n%s"
                             % (timeout, " ".join(cmd), ps, out, err))
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def write_random(path, size, mode=0o644, mtime_ns=None, rng=None):
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, 4 * MiB)
            f.write(rng.randbytes(n) if rng else os.urandom(n))
            left -= n
    os.chmod(path, mode)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def data_extents(fd, size):
    """[(start, end)) ranges holding data (SEEK_DATA/SEEK_HOLE); everything else reads as zeros."""
    out = []
    off = 0
    while off < size:
        try:
            d = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            raise
        h = os.lseek(fd, d, os.SEEK_HOLE)
        out.append((d, min(h, size)))
        off = h
    return out


def merge(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def file_digest(path):
    """SHA-256 of the file's logical bytes, reading only data extents (holes hash as zeros)."""
    h = hashlib.sha256()
    zeros = bytes(MiB)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        for a, b in data_extents(fd, size) + [(size, size)]:
            while pos < a:  # a hole: feed zeros without reading
                n = min(a - pos, MiB)
                h.update(zeros[:n])
                pos += n
            while pos < b:
                chunk = os.pread(fd, min(b - pos, 4 * MiB), pos)
                if not chunk:
                    raise AssertionError("%s: short read at %d" % (path, pos))
                h.update(chunk)
                pos += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def files_equal(a, b):
    """Byte equality of two (possibly sparse, possibly huge) files: compares the union of both
    files' data extents; outside it both files are holes, hence zeros in both."""
    fa = os.open(a, os.O_RDONLY)
    fb = os.open(b, os.O_RDONLY)
    try:
        size = os.fstat(fa).st_size
        if os.fstat(fb).st_size != size:
            return False
        for lo, hi in merge(data_extents(fa, size) + data_extents(fb, size)):
            pos = lo
            while pos < hi:
                n = min(hi - pos, 4 * MiB)
                if os.pread(fa, n, pos) != os.pread(fb, n, pos):
                    return False
                pos += n
        return True
    finally:
        os.close(fa)
        os.close(fb)


def identity(path):
    st = os.lstat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def tree_snapshot(root, with_identity=False):
    """{relative path: description} of a tree, never following symlinks."""
    snap = {}

    def describe(full):
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            d = ("link", os.readlink(full))
        elif stat.S_ISDIR(st.st_mode):
            d = ("dir", stat.S_IMODE(st.st_mode))
        elif stat.S_ISREG(st.st_mode):
            d = ("file", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, file_digest(full))
        else:
            d = ("other", stat.S_IFMT(st.st_mode))
        if with_identity:
            d = d + ((st.st_ino, st.st_mtime_ns, st.st_ctime_ns),)
        return d

    snap["."] = describe(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            snap[os.path.relpath(full, root)] = describe(full)
    return snap


class StageBcastTest(unittest.TestCase):
    maxDiff = 4000

    # ---- fixture -------------------------------------------------------------------------
    def setUp(self):
        log("=== case %s (np=%d)" % (self.id().split(".")[-1], NP))
        self.t0 = time.monotonic()
        self.work = tempfile.mkdtemp(prefix="stagefs-mpi-", dir="/var/tmp")
        self.mounts = []
        self.src_dir = os.path.join(self.work, "shared")
        os.mkdir(self.src_dir)
        self.rng = random.Random(self.id())

    def tearDown(self):
        for m in reversed(self.mounts):
            r = run(["umount", m], env=clean_env(), timeout=30)
            if r.returncode != 0:
                run(["umount", "-l", m], env=clean_env(), timeout=30)
        shutil.rmtree(self.work, ignore_errors=True)
        log("    %s took %.1fs" % (self.id().split(".")[-1], time.monotonic() - self.t0))

    # ---- helpers -------------------------------------------------------------------------
    def node_dir(self, k):
        return os.path.join(self.work, "node%d" % k)

    def dest_pattern(self, rel="sub/img.bin"):
        return os.path.join(self.work, "node%n", rel)

    def dest(self, k, rel="sub/img.bin"):
        return os.path.join(self.node_dir(k), rel)

    def make_source(self, name, size, mode=0o644, mtime_ns=1_600_000_000_123_456_789):
        path = os.path.join(self.src_dir, name)
        write_random(path, size, mode, mtime_ns, self.rng)
        return path

    def stage(self, args, np=None, ranks_as_nodes=True):
        np = NP if np is None else np
        cmd = MPIRUN + ["-np", str(np), BIN] + (["--ranks-as-nodes"] if ranks_as_nodes else []) + list(args)
        return run(cmd, env=mpi_env())

    def stage_per_rank(self, args, np=None):
        """Runs every rank under a wrapper that records its own exit status (and exits 0, so
        mpirun never kills a rank that is still cleaning up). Returns (result, {rank: status})."""
        np = NP if np is None else np
        rc_dir = os.path.join(self.work, "rc")
        os.makedirs(rc_dir, exist_ok=True)
        wrapper = '"$0" "$@"; echo $? > "%s/rank.$OMPI_COMM_WORLD_RANK"' % rc_dir
        cmd = MPIRUN + ["-np", str(np), "/bin/sh", "-c", wrapper, BIN, "--ranks-as-nodes"] + list(args)
        r = run(cmd, env=mpi_env())
        rcs = {}
        for name in os.listdir(rc_dir):
            with open(os.path.join(rc_dir, name)) as f:
                rcs[int(name.split(".")[1])] = int(f.read())
        shutil.rmtree(rc_dir)
        return r, rcs

    def standalone(self, args):
        return run([BIN] + list(args), env=clean_env())

    def stage_ok(self, args, np=None):
        """Runs with --json, asserts success, returns the parsed report."""
        r = self.stage(list(args) + ["--json"], np=np)
        self.assertEqual(r.returncode, 0, "stage-bcast failed:\nstdout:\n%s\nstderr:\n%s" % (r.stdout, r.stderr))
        return self.report_of(r)

    def report_of(self, r):
        reports = []
        for line in r.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                reports.append(json.loads(line))
        self.assertEqual(len(reports), 1, "expected exactly one JSON report on stdout:\n" + r.stdout)
        return reports[0]

    def temps_under(self, root):
        found = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            found += [os.path.join(dirpath, n) for n in dirnames + filenames if TEMP_MARK in n]
        return found

    def assert_no_temps(self):
        self.assertEqual(self.temps_under(self.work), [], "temporary files left behind")

    def assert_copy(self, src, dst):
        self.assertTrue(os.path.isfile(dst) and not os.path.islink(dst), "missing copy " + dst)
        s, d = os.stat(src), os.stat(dst)
        self.assertEqual(d.st_size, s.st_size, dst)
        self.assertTrue(files_equal(src, dst), "content differs: " + dst)
        self.assertEqual(stat.S_IMODE(d.st_mode), stat.S_IMODE(s.st_mode), "mode of " + dst)
        self.assertEqual(d.st_mtime_ns, s.st_mtime_ns, "mtime of " + dst)

    # ---- 1. byte-equal copies, mode, mtime -------------------------------------------------
    def test_01_copies_bytes_mode_mtime(self):
        odd = self.make_source("odd.bin", 1_000_003, mode=0o640, mtime_ns=1_500_000_000_987_654_321)
        multi = self.make_source("multi.bin", 5 * 64 * KiB, mode=0o755, mtime_ns=1_400_000_000_000_000_001)
        # A temporary file left by a dead writer (pid beyond pid_max) on the last node is cleared.
        os.makedirs(os.path.dirname(self.dest(NP - 1)))
        dead = os.path.join(os.path.dirname(self.dest(NP - 1)),
                            ".img.bin%s%s.%d" % (TEMP_MARK, socket.gethostname(), 999_999_999))
        with open(dead, "wb") as f:
            f.write(b"partial")
        for src, rel, chunks in ((odd, "sub/img.bin", 16), (multi, "sub/multi.bin", 5)):
            rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(rel), "--chunk-size", "64K"])
            self.assertTrue(rep["ok"])
            self.assertEqual(rep["nodes"], NP)
            self.assertEqual(rep["nodes_written"], NP)
            self.assertEqual(rep["bytes"], os.path.getsize(src))
            self.assertEqual(rep["bytes_broadcast"], os.path.getsize(src))
            self.assertEqual(rep["chunks"], chunks)
            for k in range(NP):
                self.assert_copy(src, self.dest(k, rel))
            pipe = rep["pipeline_seconds"]  # where the copy phase went
            self.assertGreater(pipe["write"], 0)
            self.assertGreaterEqual(pipe["bcast"], 0)
            # Nothing outside the node directories and the source.
            self.assertEqual(sorted(os.listdir(self.work)), sorted(["shared"] + ["node%d" % k for k in range(NP)]))
        self.assert_no_temps()
        # Buffered writes (--direct-io off) give the same copies.
        rep = self.stage_ok(["--source", odd, "--dest", self.dest_pattern("sub/img.bin"), "--chunk-size", "64K",
                             "--direct-io", "off", "--overwrite"])
        self.assertEqual(rep["nodes_written"], NP)
        for k in range(NP):
            self.assert_copy(odd, self.dest(k, "sub/img.bin"))
        self.assert_no_temps()

    def test_01b_mtime_before_1970(self):
        # 1.5 s before the epoch: a valid timestamp (ext4 stores it) whose tv_sec is negative.
        src = self.make_source("old.bin", 100_003, mode=0o644, mtime_ns=-1_500_000_000)
        self.assertEqual(os.stat(src).st_mtime_ns, -1_500_000_000, "filesystem cannot hold the timestamp")
        rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "64K"])
        self.assertEqual(rep["nodes_written"], NP)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))
        self.assert_no_temps()

    # ---- 2. empty file ----------------------------------------------------------------------
    def test_02_empty_file(self):
        src = self.make_source("empty.bin", 0, mode=0o600)
        rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern()])
        self.assertEqual(rep["bytes"], 0)
        self.assertEqual(rep["nodes_written"], NP)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))
            self.assertEqual(os.path.getsize(self.dest(k)), 0)
        self.assert_no_temps()

    # ---- 3. sparse file over 4 GiB -------------------------------------------------------
    def test_03_sparse_over_4gib(self):
        size = 4 * GiB + 512 * MiB
        src = os.path.join(self.src_dir, "sparse.img")
        with open(src, "wb") as f:
            f.truncate(size)
            for off in (0, 2 * GiB + 123, size - 5000):
                f.seek(off)
                f.write(self.rng.randbytes(4 * KiB))
        os.utime(src, ns=(1_650_000_000_000_000_000, 1_650_000_000_000_000_000))
        self.assertLess(os.stat(src).st_blocks * 512, 64 * MiB, "the test filesystem does not keep holes")
        rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "16M"])
        self.assertEqual(rep["bytes"], size)
        # Only the three chunks holding data are in the stream: holes of whole chunks never travel.
        self.assertEqual(rep["chunks"], 3)
        self.assertLessEqual(rep["bytes_broadcast"], 3 * 16 * MiB)
        self.assertGreater(rep["bytes_broadcast"], 0)
        for k in range(NP):
            dst = self.dest(k)
            self.assert_copy(src, dst)  # byte comparison over the union of both files' data extents
            self.assertLess(os.stat(dst).st_blocks * 512, size // 16, "copy is not sparse: " + dst)
        self.assert_no_temps()

    def test_03b_sparse_odd_layouts(self):
        # Data straddling a chunk boundary, a last partial chunk that is all hole; and a file
        # that is nothing but a hole.
        chunk = 1 * MiB
        odd = os.path.join(self.src_dir, "odd-sparse.img")
        with open(odd, "wb") as f:
            f.truncate(40 * chunk + 12_345)
            f.seek(16 * chunk - 3000)
            f.write(self.rng.randbytes(6000))
            f.seek(30 * chunk + 7)
            f.write(self.rng.randbytes(100))
        hole = os.path.join(self.src_dir, "hole.img")
        with open(hole, "wb") as f:
            f.truncate(64 * chunk + 1)
        # The chunks holding data (15 and 16, then 30) are the stream; a file of holes has none.
        for src, rel, chunks in ((odd, "sub/odd.img", 3), (hole, "sub/hole.img", 0)):
            rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(rel), "--chunk-size", "1M"])
            self.assertEqual(rep["chunks"], chunks)
            self.assertLessEqual(rep["bytes_broadcast"], 3 * chunk)
            if src == hole:
                self.assertEqual(rep["bytes_broadcast"], 0)
            for k in range(NP):
                self.assert_copy(src, self.dest(k, rel))
                self.assertLessEqual(os.stat(self.dest(k, rel)).st_blocks * 512, 4 * chunk)
        self.assert_no_temps()

    # ---- 4. re-run writes nothing --------------------------------------------------------
    def test_04_rerun_does_not_rewrite(self):
        src = self.make_source("img.bin", 1_000_003)
        args = ["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "64K"]
        first = self.stage_ok(args)
        self.assertEqual(first["nodes_written"], NP)
        before = {k: identity(self.dest(k)) for k in range(NP)}
        again = self.stage_ok(args)
        self.assertEqual(again["nodes_written"], 0)
        self.assertEqual(again["bytes_broadcast"], 0)
        self.assertEqual(again["chunks"], 0)
        self.assertEqual({k: identity(self.dest(k)) for k in range(NP)}, before)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))
        # --pre-validate none trusts nothing: every node writes a new copy.
        forced = self.stage_ok(args + ["--pre-validate", "none"])
        self.assertEqual(forced["nodes_written"], NP)
        self.assertEqual(forced["bytes_broadcast"], os.path.getsize(src))
        for k in range(NP):
            self.assertNotEqual(os.stat(self.dest(k)).st_ino, before[k][0])
            self.assert_copy(src, self.dest(k))
        self.assert_no_temps()

    # ---- 5. stale copies are refreshed, current ones kept --------------------------------
    def test_05_stale_copy_refreshed(self):
        size = 1_000_003
        src = self.make_source("img.bin", size)
        args = ["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "64K"]
        self.stage_ok(args)
        stale = NP - 1
        with open(self.dest(stale), "r+b") as f:  # same size, other bytes, other mtime
            f.write(self.rng.randbytes(size))
        os.utime(self.dest(stale), ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        self.assertFalse(files_equal(src, self.dest(stale)))
        others = {k: identity(self.dest(k)) for k in range(NP) if k != stale}
        stale_ino = os.stat(self.dest(stale)).st_ino

        rep = self.stage_ok(args)
        self.assertEqual(rep["nodes_written"], 1)
        self.assertEqual(rep["bytes_broadcast"], size)
        self.assert_copy(src, self.dest(stale))
        self.assertNotEqual(os.stat(self.dest(stale)).st_ino, stale_ino, "stale copy not replaced by rename")
        self.assertEqual({k: identity(self.dest(k)) for k in range(NP) if k != stale}, others)

        # Same size and same mtime but other bytes: size validation trusts it, checksum does not.
        fd = os.open(self.dest(stale), os.O_RDWR)
        try:
            mid = os.pread(fd, 100, size // 2)
            os.pwrite(fd, bytes(b ^ 0xFF for b in mid), size // 2)
        finally:
            os.close(fd)
        st = os.stat(src)
        os.utime(self.dest(stale), ns=(st.st_mtime_ns, st.st_mtime_ns))
        self.assertFalse(files_equal(src, self.dest(stale)))
        rep = self.stage_ok(args)
        self.assertEqual(rep["nodes_written"], 0, "--pre-validate size looks only at size and mtime")
        rep = self.stage_ok(args + ["--pre-validate", "checksum"])
        self.assertEqual(rep["nodes_written"], 1)
        self.assert_copy(src, self.dest(stale))
        self.assertEqual({k: identity(self.dest(k)) for k in range(NP) if k != stale}, others)
        self.assert_no_temps()

    # ---- 6. a node that cannot write -----------------------------------------------------
    def _unwritable_node_case(self, break_node1, per_rank):
        if NP < 2:
            self.skipTest("needs two nodes")
        src = self.make_source("img.bin", 1_000_003)
        # Node 0 holds a valid old copy (an older version of the file).
        os.makedirs(os.path.dirname(self.dest(0)))
        write_random(self.dest(0), 700_001, mode=0o644, mtime_ns=1_000_000_000_000_000_000, rng=self.rng)
        with open(self.dest(0), "rb") as f:
            old_bytes = f.read()
        old_id = identity(self.dest(0))
        failing_path = break_node1()
        args = ["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "64K"]
        if per_rank:
            r, rcs = self.stage_per_rank(args)
            self.assertEqual(rcs, {k: 1 for k in range(NP)}, "every rank must exit 1:\n" + r.stderr)
        else:
            r = self.stage(args)
            self.assertEqual(r.returncode, 1, "stdout:\n%s\nstderr:\n%s" % (r.stdout, r.stderr))
        self.assertIn(failing_path, r.stderr)
        self.assert_no_temps()
        self.assertEqual(identity(self.dest(0)), old_id, "node 0's old copy was touched")
        with open(self.dest(0), "rb") as f:
            self.assertEqual(f.read(), old_bytes)
        for k in range(2, NP):
            self.assertFalse(os.path.lexists(self.dest(k)), "published despite a failed node: %s" % self.dest(k))

    def test_06a_unwritable_node_parent_is_file(self):
        def break_node1():
            with open(self.node_dir(1), "w") as f:  # node1/sub/img.bin: "node1" is a regular file
                f.write("not a directory\n")
            return self.node_dir(1)
        self._unwritable_node_case(break_node1, per_rank=True)
        with open(self.node_dir(1)) as f:
            self.assertEqual(f.read(), "not a directory\n")

    def test_06b_unwritable_node_readonly_mount(self):
        def break_node1():
            os.makedirs(os.path.dirname(self.dest(1)))
            d = self.node_dir(1)
            r = run(["mount", "-o", "bind,ro", d, d], env=clean_env(), timeout=30)
            if r.returncode != 0:
                self.skipTest("cannot bind-mount read-only: " + r.stderr.strip())
            self.mounts.append(d)
            return self.dest(1)
        if NP < 2:
            self.skipTest("needs two nodes")
        self._unwritable_node_case(break_node1, per_rank=False)
        self.assertEqual(os.listdir(os.path.dirname(self.dest(1))), [])

    def test_06c_no_space_during_copy(self):
        # Every node's directory on one small tmpfs: each passes the free-space check alone
        # (1.5 MB free, 1 MB file), together they run out mid-copy. A node whose write failed
        # must publish nothing; a node that finished publishes a complete copy; no temp remains.
        if NP < 2:
            self.skipTest("needs two nodes")
        src = self.make_source("img.bin", 1_000_003)
        shm = os.path.join(self.work, "shm")
        os.mkdir(shm)
        r = run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", shm], env=clean_env(), timeout=30)
        if r.returncode != 0:
            self.skipTest("cannot mount tmpfs: " + r.stderr.strip())
        self.mounts.append(shm)
        r, rcs = self.stage_per_rank(["--source", src, "--dest", os.path.join(shm, "node%n", "img.bin"),
                                      "--chunk-size", "64K"])
        self.assertEqual(rcs, {k: 1 for k in range(NP)}, r.stderr)
        self.assertIn("No space left on device", r.stderr)
        published = 0
        for k in range(NP):
            dst = os.path.join(shm, "node%d" % k, "img.bin")
            if os.path.lexists(dst):
                self.assert_copy(src, dst)
                published += 1
        self.assertLess(published, NP)
        self.assertEqual(self.temps_under(shm), [])

    # ---- 7. unreadable source ------------------------------------------------------------
    def test_07_bad_source(self):
        missing = os.path.join(self.src_dir, "no-such-file.bin")
        r = self.stage(["--source", missing, "--dest", self.dest_pattern()])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(missing, r.stderr)
        self.assertEqual(os.listdir(self.work), ["shared"], "a destination was created")
        r, rcs = self.stage_per_rank(["--source", missing, "--dest", self.dest_pattern()])
        self.assertEqual(rcs, {k: 1 for k in range(NP)}, r.stderr)
        self.assertEqual(os.listdir(self.work), ["shared"], "a destination was created")

        tree = os.path.join(self.src_dir, "adir")
        os.mkdir(tree)
        write_random(os.path.join(tree, "f"), 10, rng=self.rng)
        r = self.stage(["--source", tree, "--dest", self.dest_pattern()])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--recursive", r.stderr)
        self.assertIn(tree, r.stderr)
        self.assertEqual(os.listdir(self.work), ["shared"], "a destination was created")

    # ---- 8. recursive tree ---------------------------------------------------------------
    def build_tree(self, root):
        dirs = ["", "a", "a/b", "a/b/c", "d", "d/e"]
        for d in dirs[1:]:
            os.mkdir(os.path.join(root, d))
        os.chmod(root, 0o755)
        os.chmod(os.path.join(root, "d"), 0o750)
        modes = [0o644, 0o600, 0o755, 0o640]
        for i in range(1000):
            p = os.path.join(root, self.rng.choice(dirs), "f%04d.dat" % i)
            write_random(p, self.rng.randint(0, 10 * KiB), mode=self.rng.choice(modes),
                         mtime_ns=1_600_000_000_000_000_000 + i * 1_000_003, rng=self.rng)
        for i, d in enumerate(("", "a/b/c", "d")):
            write_random(os.path.join(root, d, "big%d.bin" % i), 3 * MiB + i * 7, mode=0o644,
                         mtime_ns=1_700_000_000_000_000_000 + i, rng=self.rng)
        os.symlink("../big0.bin", os.path.join(root, "a", "rel-link"))
        os.symlink(os.path.join(root, "a/b/c/big1.bin"), os.path.join(root, "abs-link"))
        os.symlink("b/c", os.path.join(root, "a", "dir-link"))
        os.symlink("does-not-exist", os.path.join(root, "d", "dangling"))
        write_random(os.path.join(root, "d", "e", "na\u00efve \u00fcml\u00e4ut with spaces.txt"), 1234,
                     mtime_ns=1_600_000_000_000_000_000, rng=self.rng)

    def test_08_recursive_tree(self):
        src = os.path.join(self.src_dir, "tree")
        os.mkdir(src)
        self.build_tree(src)
        want = tree_snapshot(src)
        nfiles = sum(1 for v in want.values() if v[0] == "file")
        args = ["-r", "--source", src, "--dest", self.dest_pattern("stage/tree"), "--chunk-size", "1M"]
        rep = self.stage_ok(args)
        self.assertEqual(rep["files"], nfiles)
        self.assertEqual(rep["symlinks"], 4)
        self.assertEqual(rep["dirs"], 6)
        self.assertEqual(rep["nodes_written"], NP)
        self.assertEqual(rep["bytes_broadcast"], sum(v[2] for v in want.values() if v[0] == "file"))
        self.assertLess(rep["chunks"], nfiles // 20, "small files must travel packed")
        for k in range(NP):
            got = tree_snapshot(self.dest(k, "stage/tree"))
            self.assertEqual(sorted(got), sorted(want), "node %d: different set of paths" % k)
            self.assertEqual(got, want, "node %d: tree differs" % k)
        self.assert_no_temps()

        before = {k: tree_snapshot(self.dest(k, "stage/tree"), with_identity=True) for k in range(NP)}
        again = self.stage_ok(args)
        self.assertEqual(again["nodes_written"], 0)
        self.assertEqual(again["bytes_broadcast"], 0)
        after = {k: tree_snapshot(self.dest(k, "stage/tree"), with_identity=True) for k in range(NP)}
        self.assertEqual(after, before, "second run rewrote something")

        # One source file changes (content and mtime): only it travels, only it is replaced.
        changed = "a/b/c/big1.bin"
        write_random(os.path.join(src, changed), 2 * MiB + 1, mode=0o600,
                     mtime_ns=1_750_000_000_000_000_000, rng=self.rng)
        want = tree_snapshot(src)
        third = self.stage_ok(args)
        self.assertEqual(third["nodes_written"], NP)
        self.assertEqual(third["files_broadcast"], 1)
        self.assertEqual(third["bytes_broadcast"], 2 * MiB + 1)
        for k in range(NP):
            got = tree_snapshot(self.dest(k, "stage/tree"), with_identity=True)
            self.assertEqual({p: v[:-1] for p, v in got.items()}, want, "node %d: tree differs" % k)
            for p, v in got.items():  # directories get new mtimes from the rename; files and links must not
                if p != changed and v[0] != "dir":
                    self.assertEqual(v[-1], before[k][p][-1], "node %d: %s was rewritten" % (k, p))
            self.assertNotEqual(got[changed][-1][0], before[k][changed][-1][0])
        self.assert_no_temps()

    # ---- 8b. a profile's files first in a tree's stream -----------------------------------
    def test_08b_profile_orders_the_stream(self):
        if shutil.which("strace") is None:
            self.skipTest("strace not installed")
        src = os.path.join(self.src_dir, "tree")
        names = ["d%d/f%d" % (d, f) for d in range(3) for f in range(3)]
        for n in names:
            os.makedirs(os.path.dirname(os.path.join(src, n)), exist_ok=True)
            write_random(os.path.join(src, n), 1 * MiB + 17, 0o644, 1_600_000_000_000_000_000, self.rng)
        prof = os.path.join(self.work, "job.profile")
        profile_format.write(prof, {"chunk_size": MiB, "source": src,
                                    "files": [{"path": "d2/f1"}, {"path": "gone"}, {"path": "d0/f2"}]})
        trace = os.path.join(self.work, "trace")
        os.mkdir(trace)
        wrapper = ('if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec strace -f -qq -e trace=openat -o %s/r0 "$0" "$@"; '
                   'else exec "$0" "$@"; fi' % trace)
        cmd = MPIRUN + ["-np", str(NP), "/bin/sh", "-c", wrapper, BIN, "--ranks-as-nodes", "-r", "--source", src,
                        "--dest", self.dest_pattern("stage/tree"), "--chunk-size", "1M", "--profile", prof, "--json"]
        r = run(cmd, env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = self.report_of(r)
        self.assertEqual(rep["files"], len(names))
        opened = []
        for name in os.listdir(trace):
            with open(os.path.join(trace, name)) as f:
                for line in f:
                    for n in names:
                        if '"%s"' % os.path.join(src, n) in line and "O_RDONLY" in line and n not in opened:
                            opened.append(n)
        rest = [n for n in names if n not in ("d2/f1", "d0/f2")]
        self.assertEqual(opened[:2], ["d2/f1", "d0/f2"], "the profile's files first, in its order: %s" % opened)
        self.assertEqual(sorted(opened[2:]), sorted(rest))
        for k in range(NP):
            for n in names:
                self.assert_copy(os.path.join(src, n), self.dest(k, os.path.join("stage/tree", n)))
        self.assert_no_temps()

    # ---- 9. usage errors -----------------------------------------------------------------
    def test_09_bad_options(self):
        src = self.make_source("img.bin", 10_000)
        dst = os.path.join(self.work, "out", "img.bin")
        base = ["--source", src, "--dest", dst]
        cases = {  # name: (arguments, a word the message must contain)
            "no args": ([], "--source"),
            "--dest without value": (["--source", src, "--dest"], "--dest"),
            "--source without value": (["--dest", dst, "--source"], "--source"),
            "unknown flag": (base + ["--no-such-flag"], "--no-such-flag"),
            "--chunk-size abc": (base + ["--chunk-size", "abc"], "--chunk-size"),
            "--chunk-size 0": (base + ["--chunk-size", "0"], "--chunk-size"),
            "--chunk-size 5G": (base + ["--chunk-size", "5G"], "--chunk-size"),
            "--chunk-size 1K": (base + ["--chunk-size", "1K"], "--chunk-size"),
            "--pre-validate bogus": (base + ["--pre-validate", "bogus"], "--pre-validate"),
            "--post-validate bogus": (base + ["--post-validate", "bogus"], "--post-validate"),
            "--direct-io bogus": (base + ["--direct-io", "bogus"], "--direct-io"),
            "--source-rank -1": (base + ["--source-rank", "-1"], "--source-rank"),
            "--source-rank 1 standalone": (base + ["--source-rank", "1"], "--source-rank"),
            "--source-rank abc": (base + ["--source-rank", "abc"], "--source-rank"),
            "--dest ''": (["--source", src, "--dest", ""], "--dest"),
            "--dest ending in /": (["--source", src, "--dest", os.path.join(self.work, "out") + "/"], "--dest"),
        }
        for name, (args, word) in cases.items():
            with self.subTest(name):
                r = self.standalone(args)
                self.assertEqual(r.returncode, 2, "%s: rc=%d stderr=%s" % (name, r.returncode, r.stderr))
                self.assertIn(word, r.stderr, name)
                self.assertEqual(r.stdout, "", name)
        self.assertFalse(os.path.exists(os.path.join(self.work, "out")), "a usage error created the destination")

        r = self.standalone(["--help"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("--source", r.stdout)
        r = self.standalone(["--version"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("stage-bcast", r.stdout)

        r = self.stage(["--source", src, "--dest", self.dest_pattern(), "--source-rank", str(NP)])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("out of range", r.stderr)
        self.assertEqual(r.stderr.count("out of range"), 1, "the usage error should print once")
        self.assertFalse(any(os.path.exists(self.node_dir(k)) for k in range(NP)))

    # ---- 10. last rank as source, checksum post-validation -------------------------------
    def test_10_last_rank_source_post_checksum(self):
        src = self.make_source("img.bin", 3 * MiB + 17, mode=0o600)
        rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "256K",
                             "--source-rank", str(NP - 1), "--post-validate", "checksum"])
        self.assertEqual(rep["nodes_written"], NP)
        self.assertEqual(rep["bytes_broadcast"], os.path.getsize(src))
        for k in range(NP):
            self.assert_copy(src, self.dest(k))
        inodes = [os.stat(self.dest(k)).st_ino for k in range(NP)]
        # --overwrite rewrites current copies; --post-validate size checks them.
        rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "256K",
                             "--source-rank", str(NP - 1), "--overwrite", "--post-validate", "size"])
        self.assertEqual(rep["nodes_written"], NP)
        for k in range(NP):
            self.assertNotEqual(os.stat(self.dest(k)).st_ino, inodes[k])
            self.assert_copy(src, self.dest(k))
        self.assert_no_temps()

    # ---- 11. standalone (no launcher) ----------------------------------------------------
    def test_11_standalone(self):
        src = self.make_source("img.bin", 2 * MiB + 5, mode=0o640)
        dst = os.path.join(self.work, "local", "deep", "img.bin")
        r = self.standalone(["--source", src, "--dest", dst, "--json", "--post-validate", "checksum"])
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = self.report_of(r)
        self.assertEqual(rep["ranks"], 1)
        self.assertEqual(rep["nodes"], 1)
        self.assertEqual(rep["nodes_written"], 1)
        self.assert_copy(src, dst)
        self.assert_no_temps()

    def test_11b_standalone_output_reader_gone(self):
        # stdout and stderr are pipes whose reader went away: the copy ends, and so does the
        # process, with the copy's exit status (not killed by SIGPIPE at its report).
        src = self.make_source("img.bin", 2 * MiB + 5)
        dst = os.path.join(self.work, "local", "img.bin")
        p = subprocess.Popen([BIN, "--source", src, "--dest", dst, "-v"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=clean_env(), start_new_session=True)
        p.stdout.close()
        p.stderr.close()
        try:
            rc = p.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise AssertionError("stage-bcast did not end")
        self.assertEqual(rc, 0)
        self.assert_copy(src, dst)
        self.assert_no_temps()

    # ---- 12. one writer per host without --ranks-as-nodes ---------------------------------
    def test_12_one_writer_per_host(self):
        src = self.make_source("img.bin", 300_007)
        r = run(MPIRUN + ["-np", str(NP), BIN, "--source", src, "--dest", os.path.join(self.work, "rank%r", "img.bin"),
                          "--json", "--chunk-size", "64K"], env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = self.report_of(r)
        self.assertEqual(rep["ranks"], NP)
        self.assertEqual(rep["nodes"], 1)
        self.assertEqual(rep["nodes_written"], 1)
        self.assert_copy(src, os.path.join(self.work, "rank0", "img.bin"))
        self.assertEqual(sorted(os.listdir(self.work)), ["rank0", "shared"], "a relay rank wrote")
        # --ranks-as-nodes: every rank is its own node.
        r = run(MPIRUN + ["-np", str(NP), BIN, "--source", src, "--ranks-as-nodes",
                          "--dest", self.dest_pattern(), "--json"], env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.report_of(r)["nodes"], NP)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))

    # ---- 13. the JSON report carries paths faithfully ------------------------------------
    def test_13_json_report_non_ascii_path(self):
        src = self.make_source("gr\u00fc\u00dfe.bin", 10_007)
        pattern = os.path.join(self.work, "kn\u00f6tchen-%n", "img.bin")
        rep = self.stage_ok(["--source", src, "--dest", pattern])
        for k in range(NP):
            self.assert_copy(src, os.path.join(self.work, "kn\u00f6tchen-%d" % k, "img.bin"))
        self.assertEqual(rep["source"], src, "JSON 'source' does not decode to the path given")
        self.assertEqual(rep["dest"], pattern, "JSON 'dest' does not decode to the pattern given")

    # ---- 14. warm nodes seed the others; the source is read for metadata only ------------
    def traced_stage(self, args, trace_dir):
        """Runs every rank under strace -ff -y (each thread's syscalls in its own file, each fd
        annotated with its path), for the read-family syscalls and mmap."""
        os.makedirs(trace_dir)
        wrapper = ('exec strace -ff -y -qq -s 0 --seccomp-bpf '
                   '-e trace=read,pread64,readv,preadv,preadv2,mmap,sendfile,copy_file_range,splice '
                   '-o "%s/r$OMPI_COMM_WORLD_RANK" "$0" "$@"' % trace_dir)
        cmd = MPIRUN + ["-np", str(NP), "/bin/sh", "-c", wrapper, BIN, "--ranks-as-nodes", "--json"] + list(args)
        r = run(cmd, env=mpi_env(), timeout=2 * RUN_TIMEOUT)
        self.assertEqual(r.returncode, 0, "stage-bcast failed:\nstdout:\n%s\nstderr:\n%s" % (r.stdout, r.stderr))
        return self.report_of(r)

    @staticmethod
    def bytes_read_from(path, trace_dir):
        """Bytes any traced rank's thread read from `path` (and how many times it mapped it)."""
        tag = "<%s>" % os.path.realpath(path)
        total, maps = 0, 0
        for name in os.listdir(trace_dir):
            with open(os.path.join(trace_dir, name), errors="replace") as f:
                for line in f:
                    if tag not in line:
                        continue
                    ret = line.rsplit("= ", 1)[-1].split()[0]
                    if line.startswith("mmap("):
                        maps += 0 if ret.startswith("-") else 1
                    elif ret.lstrip("-").isdigit() and int(ret) > 0:
                        total += int(ret)
        return total, maps

    def test_14_warm_nodes_seed_the_others(self):
        if NP < 3:
            self.skipTest("needs a node with a copy and two without")
        if shutil.which("strace") is None:
            self.skipTest("strace not installed")
        size = 3 * MiB + 17
        src = self.make_source("img.bin", size)
        args = ["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "256K"]
        warm = (1, 2)
        # Current copies an earlier stage-bcast left (with their recorded origin and chunk CRCs):
        # only such a copy feeds other nodes.
        self.stage_ok(args)
        for k in range(NP):
            if k not in warm:
                os.unlink(self.dest(k))
        before = {k: identity(self.dest(k)) for k in warm}
        rep = self.traced_stage(args, os.path.join(self.work, "trace1"))
        self.assertEqual((rep["fed_by_rank"], rep["fed_from"]), (1, "seed"), rep)
        self.assertEqual((rep["bytes_read_source"], rep["bytes_read_seed"]), (0, size), rep)
        self.assertEqual(rep["nodes_written"], NP - len(warm))
        self.assertEqual(self.bytes_read_from(src, os.path.join(self.work, "trace1")), (0, 0),
                         "a rank read the shared source's data")
        self.assertGreaterEqual(self.bytes_read_from(self.dest(1), os.path.join(self.work, "trace1"))[0], size)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))
        self.assertEqual({k: identity(self.dest(k)) for k in warm}, before, "a current copy was rewritten")

        # An explicit --source-rank wins over the warm nodes (and shows the trace sees reads).
        for k in range(NP):
            if k not in warm:
                os.unlink(self.dest(k))
        rep = self.traced_stage(args + ["--source-rank", "0"], os.path.join(self.work, "trace2"))
        self.assertEqual((rep["fed_by_rank"], rep["fed_from"]), (0, "source"), rep)
        self.assertEqual((rep["bytes_read_source"], rep["bytes_read_seed"]), (size, 0), rep)
        self.assertGreaterEqual(self.bytes_read_from(src, os.path.join(self.work, "trace2"))[0], size)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))
        self.assert_no_temps()

    # ---- 15, 16. progress: one line on a terminal, bounded lines in a log, nothing unasked
    def test_15_progress_line_on_a_terminal(self):
        # stderr on a terminal (a pty), stdout a pipe (the report): one progress line,
        # rewritten in place and ended once, with bytes, percent and rate.
        import pty
        src = self.make_source("img.bin", 24 * MiB + 3)
        dst = os.path.join(self.work, "local", "img.bin")
        master, slave = pty.openpty()
        p = subprocess.Popen([BIN, "--source", src, "--dest", dst, "--chunk-size", "1M"], stdout=subprocess.PIPE,
                             stderr=slave, stdin=subprocess.DEVNULL, env=clean_env(), start_new_session=True)
        os.close(slave)
        shown = b""
        while True:  # until the pty's writer end is closed (the process ended): EIO
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        os.close(master)
        out, _ = p.communicate(timeout=RUN_TIMEOUT)
        self.assertEqual(p.returncode, 0, shown)
        text = shown.decode(errors="replace").replace("\r\n", "\n")  # the pty turns \n into \r\n
        self.assertIn("\r", text)
        self.assertEqual(text.count("\n"), 1, repr(text))  # one line, ended once
        self.assertRegex(text, r"24\.00 MiB / 24\.00 MiB \(100%\), \d+ MB/s")
        self.assertIn(b"stage-bcast done", out)  # the report still goes to stdout
        self.assert_copy(src, dst)

    def test_16_progress_in_a_log(self):
        # srun's and mpirun's pipes are no terminal: no progress unless asked; asked (--progress
        # on, or --verbose), whole lines from the source rank only, a tenth at a time at most.
        src = self.make_source("img.bin", 40 * MiB + 7)
        common = ["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "256K", "--overwrite"]
        quiet = self.stage(common)
        self.assertEqual(quiet.returncode, 0, quiet.stderr)
        self.assertNotIn("MB/s", quiet.stderr)
        for extra in (["--progress", "on"], ["-v"]):
            r = self.stage(common + extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = [ln for ln in r.stderr.splitlines() if " MB/s" in ln]
            self.assertNotIn("\r", r.stderr)
            self.assertGreaterEqual(len(lines), 1, r.stderr)
            self.assertLessEqual(len(lines), 11, r.stderr)  # 160 chunks: never a line per chunk
            self.assertEqual(sum("(100%)" in ln for ln in lines), 1, r.stderr)  # one rank shows it
        off = self.stage(common + ["--progress", "off", "-v"])
        self.assertEqual(off.returncode, 0, off.stderr)
        self.assertNotIn("MB/s", off.stderr)
        bad = self.stage(common + ["--progress", "sometimes"])
        self.assertEqual(bad.returncode, 2)
        for k in range(NP):
            self.assert_copy(src, self.dest(k))

    # ---- 17. a same-size, same-mtime file of unknown origin is present, never a seed --------
    def test_17_unknown_origin_file_is_not_a_seed(self):
        if NP < 2:
            self.skipTest("needs a node with the file and one without")
        size = 2 * MiB + 5
        src = self.make_source("img.bin", size)
        st = os.stat(src)
        # Node 1 holds other bytes with the source's size and mtime (bit rot, a rebuild with a
        # fixed mtime): --pre-validate size takes it as present there, as mpi-stage would.
        os.makedirs(os.path.dirname(self.dest(1)))
        write_random(self.dest(1), size, mtime_ns=st.st_mtime_ns, rng=random.Random(15))
        other = file_digest(self.dest(1))
        rep = self.stage_ok(["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "256K",
                             "--post-validate", "checksum"])
        self.assertEqual((rep["fed_by_rank"], rep["fed_from"]), (0, "source"), rep)
        self.assertEqual((rep["bytes_read_source"], rep["bytes_read_seed"]), (size, 0), rep)
        self.assertEqual(rep["nodes_written"], NP - 1, rep)
        for k in range(NP):
            if k != 1:
                self.assert_copy(src, self.dest(k))
        self.assertEqual(file_digest(self.dest(1)), other, "node 1's file was rewritten (or fed others)")
        self.assert_no_temps()

    # ---- 18. a seed whose copy rotted is replaced by the source within the run --------------
    def test_18_rotten_seed_falls_back_to_the_source(self):
        if NP < 2:
            self.skipTest("needs a seed and a node to feed")
        size = 3 * MiB + 99
        src = self.make_source("img.bin", size)
        args = ["--source", src, "--dest", self.dest_pattern(), "--chunk-size", "256K"]
        self.stage_ok(args)
        # Node 1's copy loses a bit on its disk, its metadata unchanged: still current by its
        # origin, but its bytes do not read back to the CRCs it recorded.
        st = os.stat(self.dest(1))
        with open(self.dest(1), "r+b") as f:
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0x20]))
        os.utime(self.dest(1), ns=(st.st_atime_ns, st.st_mtime_ns))
        for k in range(NP):
            if k != 1:
                os.unlink(self.dest(k))
        rep = self.stage_ok(args)
        self.assertEqual(rep["feed_retries"], 1, rep)
        self.assertEqual((rep["fed_by_rank"], rep["fed_from"]), (0, "source"), rep)
        self.assertEqual(len(rep["feed_failures"]), 1, rep)
        self.assertEqual(rep["errors"], [], rep)
        for k in range(NP):  # node 1 included: its copy is written anew
            self.assert_copy(src, self.dest(k))
        self.assert_no_temps()


def main():
    global BIN, NP, MPIRUN
    argv = sys.argv[1:]
    ut_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, ut_args = argv[:i], argv[i + 1:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    BIN = os.path.abspath(argv[0])
    NP = int(argv[1])
    if argv[2:]:
        MPIRUN = argv[2:]
    if not os.access(BIN, os.X_OK):
        print("not executable: " + BIN, file=sys.stderr)
        return 2
    log("stage-bcast: %s, np=%d, launcher: %s" % (BIN, NP, " ".join(MPIRUN)))
    prog = unittest.main(module=__name__, argv=[sys.argv[0], "-v"] + ut_args, exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
