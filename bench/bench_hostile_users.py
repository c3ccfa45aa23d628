#!/usr/bin/python3
"""What one user can do to the others on a root stagefs daemon, measured on a real standalone
mount with real users (created here, removed afterwards), builds alternated in the same run.

  rss     the daemon's RSS per listed entry: an unprivileged user runs `ls -f` of a directory of
          N empty files with 250-byte names, 14 levels deep (each level's name 250 bytes too);
          RSS before, after the listing (the kernel holds every entry: READDIRPLUS), and after
          the kernel forgot them (drop_caches: FORGETs reach the daemon)
  flood   another user's warm open (open + close of a cached file, median of OPENS) on an idle
          daemon, then while one user floods it: holds as many handles of one file as the
          daemon gives it (up to HANDLES), or lists the N-entry directory in a loop; as a
          ratio to the idle daemon (target <= 2); also whether the other user's open and
          listing still work at all while the handles are held
  lsR     `ls -lR` of a tree of DIRS x FILES entries as an unprivileged user, warm (listed
          once before) and cold (after drop_caches), through each build's mount: the cost of
          answering metadata as the caller

Usage: bench_hostile_users.py PARTS BUILD [BUILD2 ...]     PARTS: rss, flood, lsR (comma-separated) or all
env: N=100000 RUNS=3 OPENS=300 HANDLES=(as many as it gets) DIRS=200 FILES=250 RESULTS=bench/results
Writes RESULTS/bench_hostile_users.<part>.md (+ .raw.csv). Run as root; needs setpriv,
useradd, userdel, fusermount3. Calls drop_caches (the whole machine's page cache).
"""
import os
import pwd
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "faults"))
import benchlib  # noqa: E402
from test_handles import HOLDER  # noqa: E402  (holds as many handles as it gets)
from test_hostile_users import deep_listing  # noqa: E402

N = int(os.environ.get("N", "100000"))
RUNS = int(os.environ.get("RUNS", "3"))
OPENS = int(os.environ.get("OPENS", "300"))
HANDLES = int(os.environ.get("HANDLES", str(1 << 20)))
DIRS = int(os.environ.get("DIRS", "200"))
FILES = int(os.environ.get("FILES", "250"))
DEPTH = 14
RESULTS = os.environ.get("RESULTS", os.path.join(HERE, "results"))
USERS = ("stagebench1", "stagebench2")

h = None  # the tests/mount harness (benchlib.enter)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_users():
    ids = []
    for u in USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", u], check=True)
        pw = pwd.getpwnam(u)
        ids.append((pw.pw_uid, pw.pw_gid))
    return ids


def remove_users():
    for u in USERS:
        subprocess.run(["userdel", u], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def as_user(ids, cmd, cwd="/", timeout=600, **kw):
    uid, gid = ids
    pre = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"]
    return subprocess.run(pre + cmd, cwd=cwd, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


LS_DEEP = 'cd "$1" && shift && for d in "$@"; do cd "$d" || exit 1; done && ls -f | wc -l'


def ls_deep(ids, mnt, names):
    r = as_user(ids, ["sh", "-c", LS_DEEP, "sh", mnt] + names)
    if r.returncode != 0:
        raise RuntimeError("ls -f failed: %s" % r.stderr[-500:])
    return int(r.stdout.strip())


def settle(pid, timeout=30):
    """RSS (KiB) once it stopped falling for a second (FORGETs are being processed)."""
    last, since, t_end = h.rss_kib(pid), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < t_end:
        time.sleep(0.25)  # a bounded poll of a measurement, not a synchronization
        now = h.rss_kib(pid)
        if now < last - 256:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            break
    return h.rss_kib(pid)


def start(work, build, tag, *args):
    h.STAGEFS = os.path.join(build, "tools", "stagefs")
    d = h.Daemon(work, work.file("cache-%s" % tag), *args)
    d.wait_ready()
    return d


def part_rss(builds, users, raw):
    work = h.Work("rss")
    try:
        names = deep_listing(work.src, DEPTH, N)
        os.chmod(work.path, 0o755)
        rows = {b: [] for b in builds}
        for r in range(RUNS):
            for i, b in enumerate(builds):
                benchlib.drop_caches()
                d = start(work, b, str(i))
                try:
                    before = settle(d.pid, 5)
                    n = ls_deep(users[0], work.mnt, names)
                    listed = h.rss_kib(d.pid)
                    benchlib.drop_caches()
                    forgot = settle(d.pid)
                finally:
                    d.stop()
                per = (listed - before) * 1024 / max(n, 1)
                left = (forgot - before) * 1024 / max(n, 1)
                rows[b].append((before, listed, forgot, per, left))
                raw.append("rss,%d,%s,%d,%d,%d,%d,%.0f,%.0f" % (r, b, n, before, listed, forgot, per, left))
                log("rss run %d %s: %d entries, RSS %d -> %d KiB (%.0f B/entry), %d KiB after the kernel forgot"
                    % (r, b, n, before, listed, per, forgot))
        lines = ["| build | RSS idle | after `ls -f` | bytes per entry | after the kernel forgot | bytes per entry left |",
                 "|---|---|---|---|---|---|"]
        for b in builds:
            med = [statistics.median(x[k] for x in rows[b]) for k in range(5)]
            lines.append("| %s | %.1f MiB | %.1f MiB | %.0f | %.1f MiB | %.0f |" % (
                b, med[0] / 1024, med[1] / 1024, med[3], med[2] / 1024, med[4]))
        return lines
    finally:
        work.cleanup()


OPEN_LOOP = r"""
import os, statistics, sys, time
p, n = sys.argv[1], int(sys.argv[2])
lat, errs = [], {}
for _ in range(n):
    t0 = time.perf_counter()
    try:
        os.close(os.open(p, os.O_RDONLY))
        lat.append(time.perf_counter() - t0)
    except OSError as e:
        errs[e.strerror] = errs.get(e.strerror, 0) + 1
try:
    listed = "ls ok %d" % len(os.listdir(os.path.dirname(p)))
except OSError as e:
    listed = "ls failed: " + e.strerror
print(statistics.median(lat) * 1e6 if lat else -1, len(lat), repr(errs), listed)
"""

LS_LOOP = 'cd "$1" && shift && for d in "$@"; do cd "$d" || exit 1; done && echo started && while :; do ls -f > /dev/null; done'


def victim(users, path):
    r = as_user(users[1], [sys.executable, "-c", OPEN_LOOP, path, str(OPENS)])
    med, ok, errs, listed = r.stdout.split(" ", 3)
    return float(med), int(ok), errs, listed.strip()


def part_flood(builds, users, raw):
    work = h.Work("flood")
    lines = ["| build | idle open (us) | one user holds handles: what it got | other user's open (us, ratio) | "
             "its opens that failed, its `ls` | one user lists %d entries in a loop: other user's open (us, ratio) |" % N,
             "|---|---|---|---|---|---|"]
    try:
        names = deep_listing(work.src, DEPTH, N)
        os.chmod(work.path, 0o755)
        target = os.path.join(work.src, "shared.bin")
        with open(target, "wb") as f:
            f.write(os.urandom(1 << 20))
        os.chmod(target, 0o644)
        mine = os.path.join(work.src, "mine.bin")
        with open(mine, "wb") as f:
            f.write(os.urandom(1 << 20))
        os.chmod(mine, 0o644)
        res = {b: [] for b in builds}
        for r in range(RUNS):
            for i, b in enumerate(builds):
                d = start(work, b, str(i))
                holder = looper = None
                try:
                    mpath = os.path.join(work.mnt, "mine.bin")
                    with open(mpath, "rb") as f:
                        f.read()  # cached
                    with open(os.path.join(work.mnt, "shared.bin"), "rb") as f:
                        f.read()
                    idle = victim(users, mpath)
                    # One user holds handles: as many as it gets, its soft limit at the hard one
                    # (the daemon's: the user outlasts the daemon, which holds some of its own).
                    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                    holder = subprocess.Popen(
                        ["setpriv", "--reuid=%d" % users[0][0], "--regid=%d" % users[0][1], "--clear-groups", "--",
                         sys.executable, "-c", HOLDER, os.path.join(work.mnt, "shared.bin"), str(HANDLES)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)))
                    got = holder.stdout.readline().strip()
                    held = victim(users, mpath)
                    holder.stdin.close()
                    holder.wait(60)
                    holder = None
                    # One user lists the big directory over and over.
                    looper = subprocess.Popen(
                        ["setpriv", "--reuid=%d" % users[0][0], "--regid=%d" % users[0][1], "--clear-groups", "--",
                         "sh", "-c", LS_LOOP, "sh", work.mnt] + names, stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
                    looper.stdout.readline()
                    time.sleep(1)  # the loop is under way (a benchmark's ramp, not a synchronization)
                    listing = victim(users, mpath)
                finally:
                    if holder:
                        holder.kill()
                    if looper:
                        h.stop_popen(looper)
                    d.stop()
                res[b].append((idle, got, held, listing))
                raw.append("flood,%d,%s,%.1f,%s,%.1f,%d,%s,%.1f" % (r, b, idle[0], got.replace(",", ";"), held[0],
                                                                    held[1], held[3].replace(",", ";"), listing[0]))
                log("flood run %d %s: idle %.0f us; handles: %s, other %.0f us (%d ok, %s, %s); listing: %.0f us"
                    % (r, b, idle[0], got, held[0], held[1], held[2], held[3], listing[0]))
        for b in builds:
            idle = statistics.median(x[0][0] for x in res[b])
            held = [x[2][0] for x in res[b] if x[2][0] > 0]
            lst = statistics.median(x[3][0] for x in res[b])
            last = res[b][-1]
            lines.append("| %s | %.0f | %s | %s | %d of %d failed %s; %s | %.0f (%.2fx) |" % (
                b, idle, last[1], "%.0f (%.2fx)" % (statistics.median(held), statistics.median(held) / idle)
                if held else "every open failed", OPENS - last[2][1], OPENS, last[2][2], last[2][3], lst, lst / idle))
        return lines
    finally:
        work.cleanup()


def tree(root):
    for i in range(DIRS):
        d = os.path.join(root, "d%04d" % i)
        os.makedirs(d, exist_ok=True)
        for j in range(FILES):
            p = os.path.join(d, "file-%05d.dat" % j)
            if not os.path.exists(p):
                open(p, "w").close()


def ls_lr(users, path):
    t0 = time.perf_counter()
    uid, gid = users[0]
    r = subprocess.run(["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--",
                        "ls", "-lR", "--color=never", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, cwd="/", timeout=600)
    if r.returncode != 0:
        raise RuntimeError("ls -lR failed: %s" % r.stderr[-500:])
    return time.perf_counter() - t0


def part_lsr(builds, users, raw):
    work = h.Work("lsr")
    mounts = []
    try:
        tree(work.src)
        os.chmod(work.path, 0o755)
        for i, b in enumerate(builds):
            mnt = work.file("mnt%d" % i)
            os.mkdir(mnt)
            h.STAGEFS = os.path.join(b, "tools", "stagefs")
            d = h.Daemon(work, work.file("cache-%d" % i), mnt=mnt)
            d.wait_ready()
            mounts.append((b, mnt, d))
        times = {(b, k): [] for b in builds for k in ("cold", "warm")}
        for r in range(RUNS):
            order = mounts if r % 2 == 0 else list(reversed(mounts))
            for b, mnt, d in order:
                benchlib.drop_caches()
                cold = ls_lr(users, mnt)
                warm = ls_lr(users, mnt)
                times[(b, "cold")].append(cold)
                times[(b, "warm")].append(warm)
                raw.append("lsR,%d,%s,%.4f,%.4f" % (r, b, cold, warm))
                log("ls -lR run %d %s: cold %.3f s, warm %.3f s" % (r, b, cold, warm))
        base = builds[0]
        lines = ["| build | warm `ls -lR` (s) | ratio to %s | cold (s) | ratio |" % os.path.basename(base),
                 "|---|---|---|---|---|"]
        for b in builds:
            w, c = statistics.median(times[(b, "warm")]), statistics.median(times[(b, "cold")])
            lines.append("| %s | %.3f | %.2f | %.3f | %.2f |" % (
                b, w, w / statistics.median(times[(base, "warm")]), c, c / statistics.median(times[(base, "cold")])))
        return lines
    finally:
        for _, _, d in mounts:
            d.stop()
        work.cleanup()


def main():
    global h
    parts = sys.argv[1].split(",") if len(sys.argv) >= 3 else []
    if not parts or any(p not in ("rss", "flood", "lsR", "all") for p in parts):
        sys.exit(__doc__)
    builds = [os.path.abspath(b) for b in sys.argv[2:]]
    h = benchlib.enter(builds[0])
    users = make_users()
    os.makedirs(RESULTS, exist_ok=True)
    parts = ["rss", "flood", "lsR"] if "all" in parts else parts
    try:
        for p in parts:
            raw = []
            loadavg = open("/proc/loadavg").read().split()[:3]
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            lines = {"rss": part_rss, "flood": part_flood, "lsR": part_lsr}[p](builds, users, raw)
            head = ["# bench_hostile_users.py %s" % p, "",
                    "%s; %d runs, builds alternated, medians; load average at start %s; N=%d OPENS=%d HANDLES=%d "
                    "DIRS=%d FILES=%d" % (stamp, RUNS, " ".join(loadavg), N, OPENS, HANDLES, DIRS, FILES), "",
                    "Builds: " + ", ".join(builds), ""]
            text = "\n".join(head + lines) + "\n"
            with open(os.path.join(RESULTS, "bench_hostile_users.%s.md" % p), "w") as f:
                f.write(text)
            with open(os.path.join(RESULTS, "bench_hostile_users.%s.raw.csv" % p), "w") as f:
                f.write("\n".join(raw) + "\n")
            print(text)
    finally:
        remove_users()


if __name__ == "__main__":
    main()
