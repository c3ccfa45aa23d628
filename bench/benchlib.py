"""What the python benchmarks that run stagefs mounts on ranks-as-nodes share: enter(BUILD)
re-executes the calling script once in a private mount namespace (its mounts vanish with
it), points the tests/mount harness at BUILD's stagefs, sets Open MPI's environment for
root on loopback, and returns the harness module. journaled_ext4() puts the harness's work
dirs (source and caches) on a fresh journaled ext4 on a loop device, as a node's NVMe."""
import os
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
        parent = os.path.join(os.path.dirname(cg), "cgroup.procs")
        try:
            with open(os.path.join(cg, "cgroup.procs")) as f:
                pids = f.read().split()
            for p in pids:
                try:
                    with open(parent, "w") as f:
                        f.write(p + "\n")
                except OSError:
                    pass
            os.rmdir(cg)
        except OSError:
            pass
        remove_fs()
    return mnt, remove
