#!/usr/bin/python3
"""What a user and an operator read from a running mount (ctest label "mount").

Usage: test_stagectl.py STAGEFS [-- UNITTEST ARGS (classes)]
STAGECTL is found beside STAGEFS (build/tools/).

  Paths      stagectl finds the mount from the paths it is given, relative paths are relative
             to the current directory (`stagectl prefetch mnt mnt/data` from the mount's
             parent), the older MOUNTPOINT PATH... form still works, an ambiguous path is
             refused (2), a path outside any stagefs mount fails (1)
  Prefetch   a tree: one summary line (files, bytes, copied, already cached, failed) and no
             line per file; --verbose lists them in path order; --json is complete; a file
             the user may not read is one failure with its reason; the progress line on a
             terminal (a pty) and in a log (--progress on)
  ReadPath   after a file was read during its copy (held mid-file), stagectl status says how
             reads are served, not "not yet known"
  InFlight   the metrics file's stagefs_transfer_done_bytes moves during a copy, stays put while
             the copy is held, and is 0 once it ended
  Docs       every key of user.stagefs.stats is in the user guide's table and every metric of
             the metrics file in the admin guide's, and the reverse
Nothing sleeps to synchronize. Standard library plus python3-prometheus-client.
"""
import json
import os
import pty
import pwd
import re
import subprocess
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "faults"))
import stagefs_harness as h  # noqa: E402
from test_node_cache import parse_metrics, read_all, stagectl, write  # noqa: E402

MiB = h.MiB
DOCS = os.path.join(HERE, "..", "..", "docs")


def ctl(*args, cwd=None, timeout=120):
    return h.run([stagectl()] + [str(a) for a in args], timeout=timeout, check=False, cwd=cwd)


def on_a_terminal(cmd, cwd=None):
    """Runs cmd with stderr on a pty (stdout a pipe): (returncode, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, cwd=cwd,
                         start_new_session=True)
    os.close(slave)
    shown = b""
    while True:  # until every writer closed the pty (the process ended): EIO
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    out, _ = p.communicate(timeout=h.RUN_TIMEOUT)
    return p.returncode, out.decode(errors="replace"), shown.decode(errors="replace").replace("\r\n", "\n")


class Paths(h.MountTestCase):
    def test_the_mount_is_found_from_the_paths(self):
        src, mnt = self.work.src, self.work.mnt
        for rel in ("imgs/a.img", "imgs/b.img", "data/x", "x"):
            write(os.path.join(src, rel), os.urandom(64 * 1024))
        cache = self.work.file("cache")
        self.daemon(cache).wait_ready()

        def cached(rel):
            return os.path.exists(os.path.join(cache, "data", rel))

        with self.subTest("a path inside the mount, no mount point given"):
            r = ctl("prefetch", os.path.join(mnt, "imgs"), cwd="/")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(cached("imgs/a.img") and cached("imgs/b.img"))
            r = ctl("status", os.path.join(mnt, "imgs"), cwd="/")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("ready", r.stdout)
        with self.subTest("relative to the current directory: `prefetch mnt mnt/data` from the mount's parent"):
            r = ctl("prefetch", "mnt", "mnt/data", cwd=self.work.path)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertTrue(cached("data/x"))
        with self.subTest("relative to the current directory inside the mount"):
            self.assertEqual(ctl("evict", "a.img", cwd=os.path.join(mnt, "imgs")).returncode, 0)
            self.assertFalse(cached("imgs/a.img"))
            r = ctl("prefetch", "a.img", cwd=os.path.join(mnt, "imgs"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(cached("imgs/a.img"))
        with self.subTest("the older form: MOUNTPOINT, then paths relative to it"):
            self.assertEqual(ctl("evict", mnt, "imgs/b.img", cwd="/").returncode, 0)
            self.assertFalse(cached("imgs/b.img"))
            r = ctl("prefetch", mnt, "imgs/b.img", cwd="/")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(cached("imgs/b.img"))
        with self.subTest("the older form where both readings exist: refused, both named"):
            r = ctl("prefetch", mnt, "x", cwd=os.path.join(mnt, "data"))  # mnt/data/x or mnt/x?
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("ambiguous", r.stderr)
            self.assertIn(os.path.join(mnt, "data", "x"), r.stderr)
            self.assertFalse(cached("x"))
        with self.subTest("a path in no stagefs mount"):
            r = ctl("prefetch", os.path.join(src, "x"), cwd="/")
            self.assertEqual(r.returncode, 1)
            self.assertIn("not in a running stagefs mount", r.stderr)
            self.assertEqual(ctl("status", src).returncode, 1)


class Prefetch(h.MountTestCase):
    def setUp(self):
        super().setUp()
        import test_input_security_load as fx
        self.user = fx.create_user()
        self.addCleanup(fx.delete_user, self.user)
        pw = pwd.getpwnam(self.user)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        os.chmod(self.work.path, 0o755)

    def as_user(self, *cmd):
        return h.run(["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups", "--"] +
                     [str(c) for c in cmd], cwd="/", timeout=120, check=False)

    def tree(self, top, dirs=3, per_dir=10):
        files = []
        for d in range(dirs):
            for i in range(per_dir):
                rel = "%s/d%d/f%02d" % (top, d, i)
                write(os.path.join(self.work.src, rel), os.urandom(64 * 1024))
                files.append(rel)
        for rel, size in (("%s/big1" % top, 5 * MiB), ("%s/big2" % top, 20 * MiB + 3)):
            write(os.path.join(self.work.src, rel), os.urandom(size))
            files.append(rel)
        return files

    def test_one_summary_and_the_list_on_request(self):
        files = self.tree("ds")
        total = sum(os.path.getsize(os.path.join(self.work.src, f)) for f in files)
        self.daemon(self.work.file("cache")).wait_ready()
        ds = os.path.join(self.work.mnt, "ds")

        r = ctl("prefetch", ds)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")  # no progress in a log unless asked
        self.assertEqual(len(r.stdout.splitlines()), 1, r.stdout)  # one summary, no line per file
        self.assertRegex(r.stdout, r"^prefetch: 32 file\(s\), 26\.88 MiB: 32 copied, 0 already cached, 0 failed \(")

        r = ctl("prefetch", ds)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(": 0 copied, 32 already cached, 0 failed", r.stdout)

        r = ctl("prefetch", "--verbose", ds)
        listed = [ln.split(" ", 1) for ln in r.stdout.splitlines()[:-1]]
        self.assertEqual([p for _, p in listed], sorted(os.path.join(self.work.mnt, f) for f in files))
        self.assertEqual({w for w, _ in listed}, {"cached"})

        j = json.loads(ctl("--json", "prefetch", ds).stdout)
        self.assertEqual((j["ok"], j["files"], j["bytes"], j["copied"], j["cached"], j["failed"]),
                         (True, 32, total, 0, 32, 0), j)
        self.assertEqual([x["path"] for x in j["results"]], sorted(os.path.join(self.work.mnt, f) for f in files))
        self.assertTrue(all(x["ok"] and x["cached"] for x in j["results"]))

        with self.subTest("a file the user may not read: one failure, with its reason"):
            secret = os.path.join(self.work.src, "ds2", "secret")
            self.tree("ds2", dirs=1, per_dir=3)
            write(secret, b"s" * 1000)
            os.chmod(secret, 0o600)
            r = self.as_user(stagectl(), "prefetch", os.path.join(self.work.mnt, "ds2"))
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn(": 5 copied, 0 already cached, 1 failed", r.stdout)
            self.assertEqual(r.stderr.strip(), "stagectl: %s: Permission denied" %
                             os.path.join(self.work.mnt, "ds2", "secret"))
            self.assertFalse(os.path.exists(os.path.join(self.work.file("cache"), "data", "ds2", "secret")))

    def test_progress_on_a_terminal_and_in_a_log(self):
        self.tree("t1")
        self.tree("t2")
        self.daemon(self.work.file("cache")).wait_ready()
        rc, out, shown = on_a_terminal([stagectl(), "prefetch", os.path.join(self.work.mnt, "t1")])
        self.assertEqual(rc, 0, shown)
        self.assertIn("\r", shown)
        self.assertEqual(shown.count("\n"), 1, repr(shown))  # one line, rewritten in place
        self.assertRegex(shown, r"32/32 files, 26\.88 MiB / 26\.88 MiB \(100%\)")
        self.assertIn("32 copied", out)

        r = ctl("prefetch", "--progress", "on", os.path.join(self.work.mnt, "t2"))
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stderr.splitlines()
        self.assertNotIn("\r", r.stderr)
        self.assertTrue(1 <= len(lines) <= 12, r.stderr)  # a tenth at a time, never a line per file
        self.assertTrue(all(" files, " in ln for ln in lines), r.stderr)
        self.assertIn("32/32 files", lines[-1])


class ReadPath(h.MountTestCase):
    def test_status_after_a_read_during_the_copy(self):
        size = 40 * MiB + 11
        data = os.urandom(size)
        write(os.path.join(self.work.src, "big"), data)
        with h.Hold(self, "mid-file") as hold:
            self.daemon(self.work.file("cache"), "--chunk-size", "4M").wait_ready()
        mnt = self.work.mnt
        with open(os.path.join(mnt, "big"), "rb") as f:  # answered once the copy runs
            h.wait_for(hold.reached, 60, "the copy to be held mid-file")
            head = f.read(MiB)
            hold.release()
            rest = f.read()
        self.assertEqual(head + rest, data)
        s = json.loads(ctl("--json", "status", mnt).stdout)
        self.assertEqual(s["opens_during_copy"], 1, s)
        self.assertIn(s["read_path"], ("kernel passthrough", "splice from the local copy (keep_cache)"), s)
        r = ctl("status", mnt)
        self.assertNotIn("not yet known", r.stdout)
        self.assertIn("1 open(s) during a copy read through the daemon", r.stdout)


class InFlight(h.MountTestCase):
    def test_bytes_done_of_the_copy_in_flight(self):
        size = 40 * MiB + 11
        data = os.urandom(size)
        write(os.path.join(self.work.src, "big"), data)
        path = self.work.file("stagefs.prom")
        with h.Hold(self, "mid-file") as hold:
            self.daemon(self.work.file("cache"), "--chunk-size", "4M", "--metrics-file", path,
                        "--metrics-interval", "0.2").wait_ready()
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault("data", read_all(os.path.join(self.work.mnt, "big"))))
        reader.start()
        self.addCleanup(lambda: (hold.reached() and hold.release(), reader.join(120)))

        def metrics():
            try:
                with open(path) as f:
                    return parse_metrics(f.read())
            except (OSError, ValueError):
                return None

        def held():
            m = metrics()
            return m if m and m.get(("stagefs_transfer_done_bytes", ()), 0) > 0 else None
        h.wait_for(hold.reached, 60, "the copy to be held mid-file")
        m = h.wait_for(held, 30, "the metrics file to show the copy in flight")
        done = m[("stagefs_transfer_done_bytes", ())]
        self.assertEqual(m[("stagefs_transfer_size_bytes", ())], size)
        self.assertLess(done, size)
        self.assertEqual(m[("stagefs_transfers_total", ())], 0)
        # While the copy is held nothing moves: the file is rewritten with the same bytes done.
        mtime = os.stat(path).st_mtime_ns
        h.wait_for(lambda: os.stat(path).st_mtime_ns != mtime, 30, "the metrics file to be rewritten")
        self.assertEqual(metrics()[("stagefs_transfer_done_bytes", ())], done)
        hold.release()
        reader.join(120)
        self.assertEqual(got.get("data"), data)

        def ended():
            m = metrics()
            return m if m and m.get(("stagefs_transfers_total", ())) == 1 else None
        m = h.wait_for(ended, 30, "the metrics file to show the copy ended")
        self.assertEqual((m[("stagefs_transfer_done_bytes", ())], m[("stagefs_transfer_size_bytes", ())]), (0, 0))


def table_keys(page, heading):
    """The backquoted names in the first column of the table(s) under `heading` in page, up to
    the next heading."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        text = f.read()
    at = text.index(heading)
    keys = set()
    for line in text[at:].splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            keys |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


class Docs(h.MountTestCase):
    def test_every_stats_key_and_metric_is_documented(self):
        write(os.path.join(self.work.src, "big"), os.urandom(20 * MiB))
        path = self.work.file("stagefs.prom")
        with h.Hold(self, "mid-file") as hold:
            self.daemon(self.work.file("cache"), "--chunk-size", "4M", "--metrics-file", path,
                        "--metrics-interval", "0.2").wait_ready()
        reader = threading.Thread(target=lambda: read_all(os.path.join(self.work.mnt, "big")))
        reader.start()
        self.addCleanup(lambda: (hold.reached() and hold.release(), reader.join(120)))
        h.wait_for(hold.reached, 60, "a copy in flight")
        s = json.loads(os.getxattr(self.work.mnt, "user.stagefs.stats"))
        keys = set()
        for k, v in s.items():
            keys.add(k)
            if isinstance(v, dict):
                keys |= {"%s.%s" % (k, sub) for sub in v}
        keys.add("transfer.hidden")  # what a reader who may not read the file gets instead
        self.assertEqual(table_keys("user-guide.md", "### The keys of user.stagefs.stats"), keys)

        def names():
            if not os.path.exists(path):
                return None
            with open(path) as f:
                text = f.read()
            return {re.sub(r"_(bucket|sum|count)$", "", n) for n, _ in parse_metrics(text)}
        metrics = h.wait_for(names, 30, "the metrics file")
        documented = {re.sub(r"\{.*", "", k) for k in table_keys("admin-guide.md", "## Metrics")}
        self.assertEqual(documented, metrics)
        hold.release()
        reader.join(120)


if __name__ == "__main__":
    h.main(__file__)
