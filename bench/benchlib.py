"""What the python benchmarks that run stagefs mounts on ranks-as-nodes share: enter(BUILD)
re-executes the calling script once in a private mount namespace (its mounts vanish with
it), points the tests/mount harness at BUILD's stagefs, sets Open MPI's environment for
root on loopback, and returns the harness module. journaled_ext4() puts the harness's work
dirs (source and caches) on a fresh journaled ext4 on a loop device, as a node's NVMe.
NodeCpus gives each rank-as-node a CPU quota of its own, as each node has its own cores."""
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mount"))
import stagefs_harness as harness  # noqa: E402


def enter(build):
    if os.environ.get("STAGE_BENCH_INNER") != "1":
        os.environ["STAGE_BENCH_INNER"] = "1"
        os.execvp("unshare", ["unshare", "-m", "--propagation", "private", sys.executable] + sys.argv)
    harness.STAGEFS = os.path.join(build, "tools", "stagefs")
    os.environ.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                       "OMPI_MCA_btl_tcp_if_include": "lo"})
    return harness


# The dataset readers of bench_smallfiles and bench_threads: tar of the tree (tar skips reading
# when its archive is /dev/null itself, hence the pipe), and a Python loop with 8 threads.
TAR = "set -o pipefail; tar cf - -C \"$1\" . | wc -c"
PYLOOP = r"""
import os, sys
from concurrent.futures import ThreadPoolExecutor
paths = [os.path.join(r, n) for r, _, fs in os.walk(sys.argv[1]) for n in fs]
def rd(p):
    with open(p, 'rb') as f:
        return len(f.read())
with ThreadPoolExecutor(8) as ex:
    total = sum(ex.map(rd, paths))
print(len(paths), total)
"""


def reader_cmd(kind, root, python=sys.executable):
    if kind == "tar":
        return ["bash", "-c", TAR, "tar", root]
    return [python, "-c", PYLOOP, root]


def make_tree(src, nfiles, ndirs):
    """nfiles files of 4-64 KiB (random sizes and bytes, seed 11) spread over ndirs
    directories of src. Returns their total size."""
    rng = random.Random(11)
    total = 0
    for i in range(nfiles):
        d = os.path.join(src, "d%03d" % (i % ndirs))
        os.makedirs(d, exist_ok=True)
        n = rng.randint(4 * 1024, 64 * 1024)
        with open(os.path.join(d, "f%05d" % i), "wb") as f:
            f.write(rng.randbytes(n))
        total += n
    return total


def cpu_seconds(pids):
    """CPU seconds (user + system) the processes used so far, summed (None pids and gone
    processes count 0): steadier than wall time on a shared machine, and what each node
    would spend."""
    total = 0
    for pid in pids:
        st = harness.proc_stat(pid) if pid else None
        if st:
            total += int(st[11]) + int(st[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


class ThreadStarts:
    """Counts the threads the given processes start from now until stop() (perf stat on the
    task:task_newtask tracepoint, started disabled and enabled through its control fifo, so
    that counting has begun when the constructor returns). stop() returns None where perf is
    missing."""

    def __init__(self, pids, out):
        self.out = out
        self.proc = None
        if not shutil.which("perf"):
            return
        ctl, ack = out + ".ctl", out + ".ack"
        for f in (ctl, ack):
            if os.path.exists(f):
                os.unlink(f)
            os.mkfifo(f)
        self.proc = subprocess.Popen(["perf", "stat", "-e", "task:task_newtask", "-x,", "-o", out, "-D", "-1",
                                      "--control", "fifo:%s,%s" % (ctl, ack), "-p", ",".join(str(p) for p in pids)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(ctl, "w") as c:  # blocks until perf opened its end
            c.write("enable\n")
        with open(ack) as a:
            if a.readline().strip() != "ack":
                raise AssertionError("perf stat did not acknowledge 'enable'")

    def stop(self):
        if not self.proc:
            return None
        self.proc.send_signal(2)
        self.proc.wait(timeout=60)
        for line in open(self.out):
            if "task_newtask" in line:
                return int(line.split(",")[0])
        return None


def _loop_ext4(prefix, size, direct_io):
    """A fresh journaled ext4 of `size` on a loop device, mounted in this private mount
    namespace. Returns (mount point, device, remove)."""
    img = tempfile.mktemp(prefix=prefix, suffix=".img", dir="/var/tmp")
    mnt = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
    subprocess.run(["truncate", "-s", size, img], check=True)
    # Inode tables and journal initialized now: by default ext4 zeroes them from a kernel
    # thread after the mount, which took the CPU and disk from the first minute of a run
    # (the first point of bench_smallfiles took twice as long as the same point later).
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", img], check=True)
    dev = subprocess.run(["losetup"] + (["--direct-io=on"] if direct_io else []) + ["-f", "--show", img],
                         check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["mount", dev, mnt], check=True)

    def remove():
        subprocess.run(["umount", mnt], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)
        os.rmdir(mnt)
        os.unlink(img)
    return mnt, dev, remove


def journaled_ext4(size="16G"):
    """Mounts a fresh ext4 (with its journal) on a loop device in this private mount namespace
    and points the harness's work dirs at it. Returns a function that removes it. Why: this
    machine's root filesystem is ext4 without a journal, where creating a file scans the
    inodes deleted in the last minutes (ext4 recently_deleted(): half the CPU of a run of small
    files after an earlier run removed its tree), and where syncs behave unlike a node's NVMe."""
    mnt, _, remove = _loop_ext4("stagefs-bench-ext4-", size, direct_io=False)
    harness.WORK_BASE = mnt
    return remove


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def remove_cgroup(cg, to=None):
    """Moves the processes left in cgroup cg to `to` (default: its parent) and removes cg."""
    dest = os.path.join(to or os.path.dirname(cg), "cgroup.procs")
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            pids = f.read().split()
        for p in pids:
            try:
                with open(dest, "w") as f:
                    f.write(p + "\n")
            except OSError:
                pass
        os.rmdir(cg)
    except OSError:
        pass


def throttled_fs(size, rate_mbs):
    """A contended shared source, as bench_contended.sh makes it: a journaled ext4 on a loop
    device with direct I/O (its reads are not served from the host's page cache), and this
    process moved into a blkio cgroup that limits reads from that device to rate_mbs MB/s in
    total (the readers, mpirun and every stagefs rank started afterwards inherit it). Returns
    (mount point, remove)."""
    mnt, dev, remove_fs = _loop_ext4("stagefs-bench-src-", size, direct_io=True)
    majmin = subprocess.run(["lsblk", "-dno", "MAJ:MIN", dev], check=True, capture_output=True,
                            text=True).stdout.strip()
    rate = rate_mbs * 1000 * 1000
    if os.path.isdir("/sys/fs/cgroup/blkio"):  # cgroup v1 (this VM)
        cg = "/sys/fs/cgroup/blkio/stagefs-bench.%d" % os.getpid()
        limit = ("blkio.throttle.read_bps_device", "%s %d\n" % (majmin, rate))
    else:
        cg = "/sys/fs/cgroup/stagefs-bench.%d" % os.getpid()
        limit = ("io.max", "%s rbps=%d\n" % (majmin, rate))
    os.makedirs(cg, exist_ok=True)
    with open(os.path.join(cg, limit[0]), "w") as f:
        f.write(limit[1])
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write("%d\n" % os.getpid())

    def remove():
        remove_cgroup(cg)
        remove_fs()
    return mnt, remove


class NodeCpus:
    """Simulated nodes' CPUs: one cpu cgroup per node (v1 cpu.cfs_quota_us on this VM, v2
    cpu.max elsewhere), each limited to `cpus` CPUs. A node's daemon is moved in with join(k,
    pid) (every thread of it: cgroup.procs); a command runs in node k's cgroup through
    wrap(k, cmd). With cpus=0 nothing is limited and both do nothing. Why: ranks-as-nodes on
    one machine share its cores, so NP nodes' work is compared with one node's on the same
    cores; real nodes each have their own. With NP * cpus equal to the machine's cores, every
    node (and the one-node yardstick, run in node 0's cgroup) gets the same share. Period 10 ms:
    a node that spent its quota waits at most 10 ms, not the default 100."""
    PERIOD_US = 10000

    def __init__(self, n, cpus):
        self.cpus = cpus
        self.dirs = []
        if cpus <= 0:
            return
        v1 = os.path.isdir("/sys/fs/cgroup/cpu") and not os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        base = ("/sys/fs/cgroup/cpu/stagefs-bench-cpu.%d" if v1 else "/sys/fs/cgroup/stagefs-bench-cpu.%d") % os.getpid()
        os.makedirs(base, exist_ok=True)
        if not v1:
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu\n")
        self.base = base
        quota = int(cpus * self.PERIOD_US)
        for k in range(n):
            d = os.path.join(base, "node%d" % k)
            os.makedirs(d, exist_ok=True)
            if v1:
                with open(os.path.join(d, "cpu.cfs_period_us"), "w") as f:
                    f.write("%d\n" % self.PERIOD_US)
                with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                    f.write("%d\n" % quota)
            else:
                with open(os.path.join(d, "cpu.max"), "w") as f:
                    f.write("%d %d\n" % (quota, self.PERIOD_US))
            self.dirs.append(d)

    def join(self, k, pid):
        if self.dirs:
            with open(os.path.join(self.dirs[k], "cgroup.procs"), "w") as f:
                f.write("%d\n" % pid)

    def wrap(self, k, cmd):
        if not self.dirs:
            return cmd
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.dirs[k]] + list(cmd)

    def remove(self):
        """Moves whatever is left to the parent cgroup and removes the node cgroups."""
        if not self.dirs:
            return
        top = os.path.dirname(self.base)
        for d in self.dirs:
            remove_cgroup(d, top)
        remove_cgroup(self.base)
