#!/usr/bin/python3
"""A user who holds as many handles as the daemon gives (ctest faults.handles.*): real users
created by the test, a root standalone mount and a 2-rank mount group.

Usage: test_handles.py STAGEFS NP [MPIRUN ARGS...] [-- UNITTEST ARGS (classes)]
(exits 77 without /dev/fuse, root, fusermount3, unshare, nsenter, mpirun, useradd, userdel,
setpriv, prlimit)

  Standalone  the daemon, started with a soft descriptor limit of 1024, runs with its hard
              limit; one user opens one readable file over and over (its own descriptor limit
              the same: it outlasts the daemon, which holds a few of its own) and gets exactly
              --max-open-per-user handles
              (4096 by default), then EMFILE; meanwhile a second user opens and lists, and
              root opens a file not copied yet; once the first user lets go it opens again.
              Before the limit, the first user took every descriptor the daemon had: the
              others' opens and listings failed with "Too many open files".
  Group       the same user on node 0 of a 2-rank group; a second user's first open of a new
              file on node 1 works (node 0 must create its temporary file: the daemon keeps
              descriptors of its own), as do its open and listing on node 0. Before: EIO.

No sleeps: the holder says how many handles it got on stdout and keeps them until its stdin
closes. Standard library only.
"""
import os
import pwd
import resource
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
sys.path.insert(0, HERE)
import stagefs_harness as h  # noqa: E402
import test_input_security_load as fx  # noqa: E402  (create_user, delete_user)

MiB = h.MiB
DEFAULT_LIMIT = 4096  # --max-open-per-user's default
TRIES = 1 << 20       # as many as it gets: its own descriptor limit is the daemon's (the hard one)

# Holds as many handles of argv[1] as it gets (up to argv[2]): prints "COUNT ERRNO-NAME" and
# keeps them until its stdin closes.
HOLDER = r"""
import errno, os, sys
fds, why = [], "none"
for _ in range(int(sys.argv[2])):
    try:
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
    except OSError as e:
        why = errno.errorcode.get(e.errno, str(e.errno))
        break
print(len(fds), why, flush=True)
sys.stdin.read()
"""

# Each step's answer: "ok ..." or "err ERRNO-NAME".
OTHER = r"""
import errno, os, sys
def show(what, fn):
    try:
        print(what, "ok", fn())
    except OSError as e:
        print(what, "err", errno.errorcode.get(e.errno, str(e.errno)))
def read(p):
    with open(p, "rb") as f:
        return len(f.read())
for p in sys.argv[1:]:
    show(os.path.basename(p), (lambda p=p: len(os.listdir(p))) if os.path.isdir(p) else (lambda p=p: read(p)))
"""


def daemon_limits(pid):
    """(soft, hard) of the daemon's RLIMIT_NOFILE."""
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    return None


class Users(h.MountTestCase):
    def setUp(self):
        super().setUp()
        self.users = []
        for _ in range(2):
            name = fx.create_user()
            self.addCleanup(fx.delete_user, name)
            pw = pwd.getpwnam(name)
            self.users.append((pw.pw_uid, pw.pw_gid))
        os.chmod(self.work.path, 0o755)
        src = self.work.src
        for name, size in (("shared.bin", MiB), ("other.bin", MiB), ("new-on-node1.bin", 4 * MiB),
                           ("new-for-root.bin", 4 * MiB)):
            h.write_random(os.path.join(src, name), size, len(name))
        os.mkdir(os.path.join(src, "listed"), 0o755)
        for i in range(10):
            h.write_random(os.path.join(src, "listed", "f%d" % i), 100, i)

    def as_user(self, k, *cmd, unlimited=False):
        """cmd as user k; unlimited: with its soft descriptor limit at the hard one (as the
        daemon's), which without root's CAP_SYS_RESOURCE no process may pass."""
        uid, gid = self.users[k]
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        return ((["prlimit", "--nofile=%d:%d" % (hard, hard)] if unlimited else []) +
                ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"] + [str(c) for c in cmd])

    def hold(self, popen):
        """Reads the holder's "COUNT ERRNO" (bounded by its own run time: it answers once its
        opens stopped) and lets it go at cleanup."""
        self.addCleanup(lambda: popen.poll() is None and h.stop_popen(popen))
        line = popen.stdout.readline().split()
        self.assertEqual(len(line), 2, "the holder said nothing: %r" % line)
        return int(line[0]), line[1]

    def others(self, run, paths):
        r = run(self.as_user(1, h.PYTHON, "-c", OTHER, *paths))
        return dict((parts[0], " ".join(parts[1:])) for parts in (l.split() for l in r.stdout.splitlines()))


class Standalone(Users):
    def test_a_user_at_its_limit_gets_emfile_and_the_others_go_on(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # the daemon inherits it
        try:
            d = self.daemon(self.work.file("cache"))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        d.wait_ready()
        self.assertEqual(daemon_limits(d.pid), (hard, hard), "the soft limit was not raised to the hard one")
        mnt = self.work.mnt
        h.run([h.PYTHON, "-c", "open(%r,'rb').read(); open(%r,'rb').read()" %
               (os.path.join(mnt, "shared.bin"), os.path.join(mnt, "other.bin"))])
        holder = subprocess.Popen(self.as_user(0, h.PYTHON, "-c", HOLDER, os.path.join(mnt, "shared.bin"), TRIES,
                                               unlimited=True),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        got = self.hold(holder)
        seen = {"holder": "%d %s" % got}
        seen.update(self.others(lambda cmd: h.run(cmd, cwd="/", check=False),
                                [os.path.join(mnt, "other.bin"), os.path.join(mnt, "listed")]))
        try:
            with open(os.path.join(mnt, "new-for-root.bin"), "rb") as f:
                seen["root"] = "ok %d" % len(f.read())
        except OSError as e:
            seen["root"] = "err %s" % e.strerror
        self.assertEqual(seen, {"holder": "%d EMFILE" % DEFAULT_LIMIT, "other.bin": "ok %d" % MiB,
                                "listed": "ok 10", "root": "ok %d" % (4 * MiB)})
        self.assertIn("--max-open-per-user", d.output()[1])  # the daemon says why
        holder.stdin.close()
        holder.wait(60)
        r = h.run(self.as_user(0, h.PYTHON, "-c", HOLDER, os.path.join(mnt, "shared.bin"), 10), input="", cwd="/")
        self.assertEqual(r.stdout.split(), ["10", "none"], "the handles were not given back")


class Group(Users):
    def test_a_user_full_of_handles_on_one_node_stops_no_first_open_on_another(self):
        g = self.group(2).wait_ready()
        mnt = self.work.mnt
        g.sha256_on(0, os.path.join(mnt, "shared.bin"), os.path.join(mnt, "other.bin"))  # cached everywhere
        holder = g.spawn(0, self.as_user(0, h.PYTHON, "-c", HOLDER, os.path.join(mnt, "shared.bin"), TRIES,
                                         unlimited=True))
        got = self.hold(holder)
        seen = {"holder": "%d %s" % got}
        on1 = self.others(lambda cmd: g.on(1, cmd, check=False, timeout=120), [os.path.join(mnt, "new-on-node1.bin")])
        on0 = self.others(lambda cmd: g.on(0, cmd, check=False),
                          [os.path.join(mnt, "other.bin"), os.path.join(mnt, "listed")])
        seen.update({"node 1: " + k: v for k, v in on1.items()})
        seen.update({"node 0: " + k: v for k, v in on0.items()})
        self.assertEqual(seen, {"holder": "%d EMFILE" % DEFAULT_LIMIT,
                                "node 1: new-on-node1.bin": "ok %d" % (4 * MiB),
                                "node 0: other.bin": "ok %d" % MiB, "node 0: listed": "ok 10"})


if __name__ == "__main__":
    h.main(__file__, with_np=True, tools=("useradd", "userdel", "setpriv", "prlimit"))
