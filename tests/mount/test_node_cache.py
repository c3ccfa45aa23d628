#!/usr/bin/python3
"""A node cache that lives across jobs (ctest label "mount").

Usage: test_node_cache.py STAGEFS [NP [MPIRUN ARGS...]] [-- UNITTEST ARGS (classes)]
STAGECTL is found beside STAGEFS (build/tools/).

  Capacity   --cache-size: LRU eviction, a file held open is never evicted, the cache never
             above its limit, a file larger than the limit fails its open with ENOSPC and a
             log line naming both sizes; an open that finds the room held by open files waits
             for it (--stall-timeout), then fails with ENOSPC and a log line naming them
  Control    stagectl status/stats/prefetch/evict, --json, exit 0/1/2, what an unprivileged
             user may and may not do
  Metrics    --metrics-file parses as Prometheus text, matches the counters, is rewritten
  Reuse      a second mount over the same cache serves without copying; a corrupted copy
             is replaced (--verify-cache crc)
  GroupLoad  (NP ranks) a cache limited to 3 images, 6 images cycled by readers on every node
             while stagectl prefetches and the metrics file is sampled: no error, no open file
             evicted, the cache never above its limit, the metrics file always parseable; a
             node whose room is held by an open file relays a copy the others get at once,
             and its own open of it waits for the room
Nothing sleeps to synchronize. Standard library plus python3-prometheus-client.
"""
import json
import os
import pwd
import subprocess
import sys
import threading
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "faults"))
import stagefs_harness as h  # noqa: E402

MiB = h.MiB


def stagectl():
    return os.path.join(os.path.dirname(h.STAGEFS), "stagectl")


def ctl(*args, check=False, timeout=120):
    return h.run([stagectl()] + [str(a) for a in args], timeout=timeout, check=check)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def parse_metrics(text):
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "mountpoint")))] = s.value
            assert "mountpoint" in s.labels, s
    return out


class Capacity(h.MountTestCase):
    def test_lru_eviction_pins_and_limit(self):
        imgs = {}
        for i in range(6):
            imgs[i] = os.urandom(5 * MiB)
            write(os.path.join(self.work.src, "img%d" % i), imgs[i])
        write(os.path.join(self.work.src, "huge"), os.urandom(13 * MiB))
        d = self.daemon(self.work.file("cache"), "--cache-size", "12M").wait_ready()
        mnt = self.work.mnt
        held = open(os.path.join(mnt, "img0"), "rb")  # open all along: never evicted
        for i in range(1, 6):
            self.assertEqual(read_all(os.path.join(mnt, "img%d" % i)), imgs[i])
            c = d.stats()["cache"]
            self.assertLessEqual(c["bytes"], 12 * MiB, c)
            self.assertTrue(os.path.exists(os.path.join(self.work.file("cache"), "data", "img0")))
        self.assertEqual(held.read(), imgs[0])
        held.close()
        s = d.stats()
        self.assertEqual(s["cache"]["evictions"], 4, s)
        self.assertEqual(s["cache"]["limit"], 12 * MiB)
        # least recently used first: after img1..img5, the cache holds img0 (pinned) and img5
        self.assertEqual(sorted(os.listdir(os.path.join(self.work.file("cache"), "data"))), ["img0", "img5"])
        with self.assertRaises(OSError) as e:
            read_all(os.path.join(mnt, "huge"))
        self.assertEqual(e.exception.errno, 28)  # ENOSPC
        err = d.output()[1]
        self.assertIn("needs", err)
        self.assertIn("more than the whole --cache-size (%d bytes)" % (12 * MiB), err)

    def test_an_open_waits_for_room_that_open_files_hold(self):
        # Two 5 MiB files do not fit in 8M: the second one's open waits while the first is open
        # (its copy pinned), shows in stagectl status, and gets its copy once it is closed.
        a, b = os.urandom(5 * MiB), os.urandom(5 * MiB)
        write(os.path.join(self.work.src, "a"), a)
        write(os.path.join(self.work.src, "b"), b)
        d = self.daemon(self.work.file("cache"), "--cache-size", "8M").wait_ready()
        held = open(os.path.join(self.work.mnt, "a"), "rb")
        try:
            got = []
            reader = threading.Thread(target=lambda: got.append(read_all(os.path.join(self.work.mnt, "b"))))
            reader.start()
            h.wait_for(lambda: d.stats()["room_waits"] == 1, 30, "the open of b to wait for room")
            c = d.stats()["cache"]
            self.assertEqual((c["pinned_files"], c["pinned_bytes"] >= 5 * MiB), (1, True), c)
            r = h.run([stagectl(), "status", self.work.mnt])
            self.assertIn("in 1 cached file(s) held open on this node", r.stdout)
            self.assertIn("1 open(s) waited for room", r.stdout)
            self.assertEqual(held.read(), a)
        finally:
            held.close()
        reader.join(timeout=60)
        self.assertEqual(got, [b])
        self.assertEqual(sorted(os.listdir(os.path.join(self.work.file("cache"), "data"))), ["b"])

    def test_an_open_that_never_gets_room_fails_and_the_log_names_the_open_files(self):
        write(os.path.join(self.work.src, "a"), os.urandom(5 * MiB))
        write(os.path.join(self.work.src, "b"), os.urandom(5 * MiB))
        d = self.daemon(self.work.file("cache"), "--cache-size", "8M", "--stall-timeout", "1").wait_ready()
        with open(os.path.join(self.work.mnt, "a"), "rb"):
            with self.assertRaises(OSError) as e:
                read_all(os.path.join(self.work.mnt, "b"))
            self.assertEqual(e.exception.errno, 28)  # ENOSPC
        err = d.output()[1]
        self.assertIn("no room in the cache for b after waiting 1 s", err)
        self.assertIn("held by 1 cop(ies) of files open on this node (pinned", err)
        self.assertEqual(d.stats()["room_waits"], 1)

    def test_percentage_limit_and_bad_values(self):
        d = self.daemon(self.work.file("cache"), "--cache-size", "50%").wait_ready()
        st = os.statvfs(self.work.file("cache"))
        self.assertAlmostEqual(d.stats()["cache"]["limit"], st.f_blocks * st.f_frsize // 2, delta=st.f_frsize * 2)
        for bad in ("0", "101%", "-5%", "12Q", "%"):
            r = h.run([h.STAGEFS, self.work.src, self.work.file("mnt2"), "--cache", self.work.file("c2"),
                       "--cache-size", bad], check=False)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn("--cache-size", r.stderr)


class Control(h.MountTestCase):
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
                     [str(c) for c in cmd], cwd="/", timeout=60, check=False)

    def test_stagectl(self):
        src = self.work.src
        write(os.path.join(src, "ds", "a"), os.urandom(MiB))
        write(os.path.join(src, "ds", "sub", "b"), os.urandom(MiB))
        write(os.path.join(src, "later"), os.urandom(MiB))
        write(os.path.join(src, "secret"), b"s" * 1000)
        os.chmod(os.path.join(src, "secret"), 0o600)
        mine = os.path.join(src, "mine")
        write(mine, b"m" * 1000)
        os.chown(mine, self.uid, self.gid)
        d = self.daemon(self.work.file("cache")).wait_ready()
        mnt = self.work.mnt

        r = ctl("status", mnt)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ready", r.stdout)
        self.assertIn("transfer: none in flight", r.stdout)
        s = json.loads(ctl("--json", "status", mnt, check=True).stdout)
        self.assertEqual((s["state"], s["ranks"]), ("ready", 1))
        r = ctl("prefetch", mnt, "ds")  # a directory: every file below
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(d.stats()["materializations"], 2)
        self.assertTrue(os.path.exists(os.path.join(self.work.file("cache"), "data", "ds", "sub", "b")))
        read_all(os.path.join(mnt, "ds", "a"))
        self.assertEqual(d.stats()["materializations"], 2)  # the open was a cache hit
        r = ctl("prefetch", "--no-wait", mnt, "later")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("queued", r.stdout)
        self.assertEqual(len(read_all(os.path.join(mnt, "later"))), MiB)
        stats = json.loads(ctl("stats", "--json", mnt, check=True).stdout)
        self.assertEqual(stats["prefetches"], 3)

        with self.subTest("a user prefetches only what they may read"):
            r = self.as_user(stagectl(), "prefetch", mnt, "secret")
            self.assertEqual(r.returncode, 1)
            self.assertIn("Permission denied", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.work.file("cache"), "data", "secret")))
        with self.subTest("a user evicts only what they own"):
            r = self.as_user(stagectl(), "evict", mnt, "ds/a")
            self.assertEqual(r.returncode, 1)
            self.assertTrue(os.path.exists(os.path.join(self.work.file("cache"), "data", "ds", "a")))
            self.assertEqual(self.as_user(stagectl(), "prefetch", mnt, "mine").returncode, 0)
            r = self.as_user(stagectl(), "evict", mnt, "mine")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.work.file("cache"), "data", "mine")))
        with self.subTest("an open file is not evicted; a closed one is"):
            f = open(os.path.join(mnt, "ds", "a"), "rb")
            r = ctl("evict", mnt, "ds/a")
            self.assertEqual(r.returncode, 1)
            self.assertIn("busy", r.stderr)
            f.close()
            r = ctl("--json", "evict", mnt, os.path.join(mnt, "ds", "a"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(json.loads(r.stdout)["ok"])
            self.assertFalse(os.path.exists(os.path.join(self.work.file("cache"), "data", "ds", "a")))
        with self.subTest("exit codes"):
            self.assertEqual(ctl("status", self.work.src).returncode, 1)
            self.assertEqual(ctl("prefetch", mnt, "nonexistent").returncode, 1)
            self.assertEqual(ctl("bogus").returncode, 2)
            self.assertEqual(ctl("status").returncode, 2)
            self.assertEqual(ctl("--help").returncode, 0)


class Metrics(h.MountTestCase):
    def test_metrics_file(self):
        write(os.path.join(self.work.src, "f"), os.urandom(3 * MiB))
        path = self.work.file("stagefs.prom")
        d = self.daemon(self.work.file("cache"), "--metrics-file", path, "--metrics-interval", "0.2",
                        "--cache-size", "1G").wait_ready()
        read_all(os.path.join(self.work.mnt, "f"))
        read_all(os.path.join(self.work.mnt, "f"))

        def current():
            if not os.path.exists(path):
                return None
            m = parse_metrics(open(path).read())  # a half-written file would not parse
            return m if m.get(("stagefs_cache_hits_total", ())) == 1 else None
        h.wait_for(lambda: current() is not None, 30, "the metrics file to show the hit")
        m = current()
        self.assertEqual(m[("stagefs_cache_misses_total", ())], 1)
        self.assertEqual(m[("stagefs_bytes_broadcast_total", ())], 3 * MiB)
        # standalone: the one node reads the source, never a seed
        self.assertEqual(m[("stagefs_bytes_read_total", (("from", "source"),))], 3 * MiB)
        self.assertEqual(m[("stagefs_bytes_read_total", (("from", "seed"),))], 0)
        self.assertEqual(m[("stagefs_seeded_transfers_total", ())], 0)
        self.assertEqual(m[("stagefs_cache_limit_bytes", ())], 1 << 30)
        self.assertEqual(m[("stagefs_transfer_seconds_count", ())], 1)
        self.assertEqual(m[("stagefs_errors_total", (("kind", "open"),))], 0)
        self.assertEqual(m[("stagefs_up", ())], 1)
        self.assertEqual(d.stop(), 0)
        with open(path) as f:
            self.assertEqual(parse_metrics(f.read())[("stagefs_up", ())], 0)  # the last write
        self.assertEqual([f for f in os.listdir(self.work.path) if f.startswith(".stagefs-metrics")], [])


class Reuse(h.MountTestCase):
    def test_second_mount_reuses_the_cache(self):
        data = os.urandom(2 * MiB)
        write(os.path.join(self.work.src, "img"), data)
        cache = self.work.file("cache")
        d = self.daemon(cache).wait_ready()
        self.assertEqual(read_all(os.path.join(self.work.mnt, "img")), data)
        self.assertEqual(d.stop(), 0)
        d2 = self.daemon(cache).wait_ready()
        self.assertEqual(read_all(os.path.join(self.work.mnt, "img")), data)
        s = d2.stats()
        self.assertEqual((s["materializations"], s["bytes_broadcast"], s["verified"], s["cache_hits"]), (0, 0, 1, 1), s)
        self.assertEqual(s["cache"]["files"], 1)


class GroupLoad(h.MountTestCase):
    def test_eviction_under_load_on_every_node(self):
        n_img = 6
        for i in range(n_img):
            write(os.path.join(self.work.src, "img%d" % i), os.urandom(4 * MiB))
        limit = 13 * MiB  # three images
        prom = self.work.file("stagefs.prom")  # every rank rewrites it: each write must be whole
        g = self.group(h.NP, "--cache-size", str(limit), "--metrics-file", prom, "--metrics-interval", "0.1")
        g.wait_ready()
        want = {("img%d" % i): h.sha256_file(os.path.join(self.work.src, "img%d" % i)) for i in range(n_img)}
        errors = []
        samples = []
        stop = threading.Event()

        def reader(k):
            for rnd in range(2):
                for i in range(n_img):
                    name = "img%d" % ((i + k + rnd) % n_img)
                    r = g.on(k, [h.PYTHON, h.HARNESS, "sha256", os.path.join(g.mnt, name)], check=False)
                    if r.returncode != 0 or r.stdout.split()[0] != want[name]:
                        errors.append((k, name, r.returncode, r.stdout, r.stderr[-300:]))

        def sampler():
            while not stop.is_set():
                for k in range(h.NP):
                    s = g.stats(k)
                    samples.append(s["cache"]["bytes"])
                if os.path.exists(prom):
                    try:
                        with open(prom) as f:
                            parse_metrics(f.read())
                    except Exception as e:  # noqa: BLE001
                        errors.append(("metrics", repr(e)))
                stop.wait(0.05)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(h.NP)]
        smp = threading.Thread(target=sampler)
        smp.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        stop.set()
        smp.join(timeout=60)
        self.assertEqual(errors, [])
        self.assertTrue(samples)
        self.assertLessEqual(max(samples), limit)
        for k in range(h.NP):
            s = g.stats(k)
            self.assertGreater(s["cache"]["evictions"], 0, s)
            self.assertEqual(s["open_errors"], 0, s)

    def test_a_node_without_room_relays_and_its_open_waits_for_it(self):
        # Node 1 holds a open (its copy pinned there); b does not fit beside it in 8M on node 1
        # only. The other nodes get b at once; node 1's open of b waits until a is closed.
        a, b = os.urandom(5 * MiB), os.urandom(5 * MiB)
        write(os.path.join(self.work.src, "a"), a)
        write(os.path.join(self.work.src, "b"), b)
        g = self.group(h.NP, "--cache-size", "8M")
        g.wait_ready()
        holder = g.spawn(1, [h.PYTHON, "-c", "import sys; f = open(sys.argv[1], 'rb'); print(len(f.read()), flush=True);"
                             " sys.stdin.readline()", os.path.join(g.mnt, "a")])
        self.assertEqual(holder.stdout.readline().strip(), str(5 * MiB))
        want = h.sha256_file(os.path.join(self.work.src, "b"))
        self.assertEqual(g.sha256_on(0, os.path.join(g.mnt, "b"))[os.path.join(g.mnt, "b")][0], want)
        waiter = g.spawn(1, [h.PYTHON, h.HARNESS, "sha256", os.path.join(g.mnt, "b")])
        h.wait_for(lambda: g.stats(1)["room_waits"] == 1, 60, "node 1's open of b to wait for room")
        for k in range(h.NP):
            if k != 1:
                self.assertTrue(os.path.exists(g.cache_file(k, "b")), k)
        self.assertFalse(os.path.exists(g.cache_file(1, "b")))
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=60)
        out, err = waiter.communicate(timeout=120)
        self.assertEqual(waiter.returncode, 0, err[-500:])
        self.assertEqual(out.split()[0], want)
        for k in range(h.NP):
            self.assertEqual(g.stats(k)["open_errors"], 0, k)


if __name__ == "__main__":
    with_np = len(sys.argv) > 2 and sys.argv[2].isdigit()
    h.main(__file__, with_np=with_np)
