#!/usr/bin/python3
"""`stagefs run` on one machine: its life cycle around a real mount, without Slurm.

Usage: test_run.py STAGEFS [-- UNITTEST ARGS...]    (exits 77 without /dev/fuse or root)

A stand-in for srun (srun-standin/srun, first on PATH) runs the daemons' step here, as a job
of one node, and records the options, command line and environment stagefs run gave it; the
job is described by SLURM_JOB_ID, SLURMD_NODENAME and SLURM_JOB_NUM_NODES, the site's
settings by a file of the test's own (STAGEFS_CONF). What Slurm itself does with the step is
the slurm label's (tests/slurm/run_slurm_test.sh).

  Lifecycle      the command runs once the mount is ready, sees STAGEFS_MOUNT and the
                 source's bytes there; stagefs run exits with its status; the daemons stop
                 through the mount (exit 0, nothing mounted after), the summary line counts the
                 transfer; the step was srun --overlap, one task per node, --kill-on-bad-exit,
                 --mpi=pmix, with the site's mount point, cache, --cache-size and
                 --spare-caches, the options given to stagefs run, and without
                 PYXIS_CONTAINER_* in its environment
  Refusals       a node that cannot mount (a planted file in the mount point): stagefs run
                 gives up as soon as the step ends (not at the wait timeout), quotes the
                 daemon's error, exits 125, and the command never runs. Outside a job, or in
                 salloc's shell: 125 and why. A command that does not exist: 127, mount stopped
  Signals        SIGTERM to stagefs run reaches the command; its status is stagefs run's,
                 the mount is stopped
  SpareCache     two runs of one user on one node at the same time, one cache: the second
                 takes CACHE/spare.1 and both succeed
"""
import os
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stagefs_harness as h  # noqa: E402

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "srun-standin")
RUN_LIMIT = 60  # seconds any stagefs run of these tests may take


class RunCase(h.MountTestCase):
    def setUp(self):
        super().setUp()
        w = self.work
        self.data = os.urandom(3 * h.MiB + 17)
        with open(os.path.join(w.src, "app.sqsh"), "wb") as f:
            f.write(self.data)
        os.rmdir(w.mnt)  # the site's mount point is a directory per job: mnt-<job>
        self.mnt = w.file("mnt-77")
        os.mkdir(self.mnt)
        self.conf = w.file("stagefs.conf")
        with open(self.conf, "w") as f:
            f.write("# the test's site\nSTAGEFS_MOUNT=%s/mnt-%%j\nSTAGEFS_CACHE=%s/cache-%%u\n"
                    "STAGEFS_CACHE_SIZE=1G\nSTAGEFS_PURGE_ABOVE=80\n" % (w.path, w.path))
        self.standin_log = w.file("srun-standin.log")

    def env(self, **extra):
        e = h.clean_env()
        e.update(PATH=STANDIN + ":" + e.get("PATH", "/usr/bin:/bin"), STAGEFS_CONF=self.conf,
                 SRUN_STANDIN_LOG=self.standin_log, SLURM_JOB_ID="77", SLURMD_NODENAME="n1",
                 SLURM_JOB_NUM_NODES="1", PYXIS_CONTAINER_IMAGE="/somewhere/else.sqsh")
        e.update(extra)
        return {k: v for k, v in e.items() if v is not None}

    def start(self, *args, env=None):
        """stagefs run ARGS in the background; its output in files of the work dir."""
        n = len(self.work.logs)
        out, err = self.work.file("run%d.out" % n), self.work.file("run%d.err" % n)
        self.work.logs += [out, err]
        with open(out, "w") as o, open(err, "w") as e:
            p = subprocess.Popen([h.STAGEFS, "run"] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                                 stdout=o, stderr=e, env=env or self.env(), start_new_session=True)
        self.addCleanup(h.stop_popen, p)
        p.out_path, p.err_path = out, err
        return p

    def finish(self, p):
        """(exit status, stdout, stderr) of a run started with start()."""
        try:
            rc = p.wait(timeout=RUN_LIMIT)
        except subprocess.TimeoutExpired:
            h.stop_popen(p)
            raise AssertionError("stagefs run did not end within %ss" % RUN_LIMIT)
        with open(p.out_path, errors="replace") as o, open(p.err_path, errors="replace") as e:
            return rc, o.read(), e.read()

    def standin(self, kind):
        with open(self.standin_log) as f:
            return [line[len(kind) + 1:].rstrip("\n") for line in f if line.startswith(kind + " ")]

    def assert_stopped(self, err):
        self.assertEqual(h.mounts_under(self.mnt), [], "a mount is left at " + self.mnt)
        # (fusermount3's auto_unmount watcher ends shortly after its daemon)
        h.wait_for(lambda: not h.work_pids(self.work.path), 10, "the run's processes to end")
        self.assertIn("asked the mount to stop", err)
        self.assertNotIn("the stagefs step ended with", err, "the daemons did not stop cleanly:\n" + err)


class Lifecycle(RunCase):
    def test_command_runs_on_the_mount_and_its_status_is_returned(self):
        w = self.work
        p = self.start("--chunk-size", "1M", "-v", w.src, "--",
                       "sh", "-c", 'cmp "$STAGEFS_MOUNT/app.sqsh" "$1" && echo SAME; exit 7', "sh",
                       os.path.join(w.src, "app.sqsh"))
        rc, out, err = self.finish(p)
        self.assertEqual(rc, 7, err)
        self.assertEqual(out.strip(), "SAME", err)
        self.assert_stopped(err)
        summary = [line for line in err.splitlines() if line.startswith("stagefs run: %s, " % self.mnt)]
        self.assertEqual(len(summary), 1, err)
        self.assertIn("1 node, 1 transfer, 3.00 MiB staged: 3.00 MiB read from the shared source", summary[0])

        options = self.standin("option")
        for want in ("--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                     "--mpi=pmix"):
            self.assertIn(want, options)
        argv = self.standin("argv")
        self.assertEqual(argv[:5], [os.path.realpath(h.STAGEFS), w.src, self.mnt, "--cache", w.file("cache-root")])
        rest = " ".join(argv[5:])
        for want in ("--chunk-size 1M", "--verbose", "--cache-size 1G", "--spare-caches 4"):
            self.assertIn(want, rest)
        env = self.standin("env")
        self.assertEqual([e for e in env if e.startswith("PYXIS_CONTAINER_")], [])
        self.assertIn("SLURM_JOB_ID=77", env)


class Refusals(RunCase):
    def test_a_node_that_cannot_mount_ends_the_wait_with_its_error(self):
        with open(os.path.join(self.mnt, "planted"), "w") as f:
            f.write("x")
        marker = self.work.file("command-ran")
        p = self.start("--wait-timeout", "3600", self.work.src, "--", "touch", marker)
        rc, _, err = self.finish(p)  # long before the wait timeout: the step ended
        self.assertEqual(rc, 125, err)
        self.assertIn("is not ready on every node: the stagefs step ended (exit status 1)", err)
        self.assertIn("stagefs run: the first error: [stagefs", err)
        self.assertIn("mount point %s is not empty: it holds 'planted' (owned by uid 0" % self.mnt, err)
        self.assertFalse(os.path.exists(marker), "the command ran although the mount did not")

    def test_outside_a_job_it_says_so(self):
        for unset, words in ((("SLURM_JOB_ID",), "not inside a Slurm job (SLURM_JOB_ID is not set)"),
                             (("SLURMD_NODENAME",), "salloc's shell runs on the login node")):
            with self.subTest(unset=unset):
                p = self.start(self.work.src, "--", "true", env=self.env(**{k: None for k in unset}))
                rc, _, err = self.finish(p)
                self.assertEqual(rc, 125, err)
                self.assertIn(words, err)
                self.assertFalse(os.path.exists(self.standin_log), "a step was started")

    def test_a_command_that_does_not_exist(self):
        p = self.start(self.work.src, "--", self.work.file("no-such-command"))
        rc, _, err = self.finish(p)
        self.assertEqual(rc, 127, err)
        self.assertIn("cannot run %s: No such file or directory" % self.work.file("no-such-command"), err)
        self.assert_stopped(err)


class Signals(RunCase):
    def test_sigterm_reaches_the_command_and_the_mount_stops(self):
        started = self.work.file("started")
        p = self.start(self.work.src, "--", "sh", "-c",
                       'trap "exit 42" TERM; touch "$1"; while :; do sleep 0.1; done', "sh", started)
        h.wait_for(lambda: os.path.exists(started), 30, "the command to start")
        os.kill(p.pid, signal.SIGTERM)
        rc, _, err = self.finish(p)
        self.assertEqual(rc, 42, err)
        self.assert_stopped(err)


class SpareCache(RunCase):
    def test_a_second_run_of_one_user_takes_a_spare_cache(self):
        w = self.work
        up, go = w.file("first-up"), w.file("go")
        os.mkfifo(go)
        first = self.start(w.src, "--", "sh", "-c", 'cat "$STAGEFS_MOUNT/app.sqsh" >/dev/null; touch "$1"; read x < "$2"',
                           "sh", up, go)
        h.wait_for(lambda: os.path.exists(up), 30, "the first run's command")
        second_mnt = w.file("mnt-78")
        os.mkdir(second_mnt)
        second = self.start(w.src, "--", "cmp", os.path.join(second_mnt, "app.sqsh"),
                            os.path.join(w.src, "app.sqsh"), env=self.env(SLURM_JOB_ID="78"))
        rc2, _, err2 = self.finish(second)
        with open(go, "w") as f:
            f.write("go\n")
        rc1, _, err1 = self.finish(first)
        self.assertEqual((rc1, rc2), (0, 0), err1 + err2)
        self.assertIn("is in use by another stagefs on this node (pid", err2)
        self.assertIn("using the spare cache %s/spare.1" % w.file("cache-root"), err2)
        self.assertTrue(os.path.isfile(os.path.join(w.file("cache-root"), "spare.1", "data", "app.sqsh")))
        self.assertTrue(os.path.isfile(os.path.join(w.file("cache-root"), "data", "app.sqsh")))
        self.assertEqual(h.mounts_under(w.path), [])


if __name__ == "__main__":
    h.main(__file__)
