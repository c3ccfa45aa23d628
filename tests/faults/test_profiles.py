#!/usr/bin/python3
"""A profile (what a job read, replayed by the next mount) from another user, or edited by
hand, against a root stagefs daemon: real standalone mounts, a second user created by the test.

Usage: test_profiles.py STAGEFS [-- UNITTEST ARGS (classes)]
(exits 77 without /dev/fuse, root, fusermount3, unshare, nsenter, useradd, userdel, setpriv)

  Owner    a profile owned by the user, naming a file the user may read, one in a directory
           only root may enter, one only root may read, and one through a symlinked
           directory: the root daemon replays it with the user's access (only the first is
           staged; the others are skipped and counted)
  Forged   profiles the user may have forged with a valid checksum: one that names a path
           outside the source (refused whole: nothing staged), one that other users may
           write (refused)
Profiles are written with tests/mount/profile_format.py (docs/profile-format.md); every wait
is a bounded poll of a condition. Standard library only.
"""
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount"))
sys.path.insert(0, HERE)
import profile_format  # noqa: E402
import stagefs_harness as h  # noqa: E402
import test_wrong_bytes_and_access as wrong_bytes  # noqa: E402  (UserCase)


class ProfileCase(wrong_bytes.UserCase):
    def setUp(self):
        super().setUp()
        src = self.work.src
        os.makedirs(os.path.join(src, "pub"))
        os.makedirs(os.path.join(src, "secret"))
        os.chmod(os.path.join(src, "secret"), 0o700)
        for rel, mode in (("pub/ok.bin", 0o644), ("secret/s.bin", 0o644), ("rootonly.bin", 0o600)):
            h.write_random(os.path.join(src, rel), 2 * h.MiB + 3, seed=len(rel), mode=mode)
        os.symlink("pub", os.path.join(src, "lnk"))
        with open(self.work.file("outside.bin"), "wb") as f:
            f.write(b"not in the source" * 1000)
        self.profile = self.work.file("profiles/p")
        os.makedirs(os.path.dirname(self.profile))

    def write_profile(self, paths, owner=None, mode=0o600):
        profile_format.write(self.profile, {"chunk_size": h.MiB, "uid": self.uid, "source": self.work.src,
                                            "files": [{"path": p, "first_ms": i} for i, p in enumerate(paths)]},
                             mode=mode)
        os.chown(self.profile, owner if owner is not None else self.uid, self.gid)

    def mount(self):
        return self.daemon(self.work.file("cache"), "--profile", self.profile, "--chunk-size", "1M").wait_ready()

    def replay(self, d, states=("done", "refused", "full", "failed")):
        return h.wait_for(lambda: (lambda r: r if r["state"] in states else None)(d.stats()["replay"]), 60,
                          "the replay to end")

    def cached(self, rel):
        return os.path.exists(os.path.join(self.work.file("cache"), "data", rel))


class Owner(ProfileCase):
    def test_a_users_profile_stages_only_what_that_user_may_read(self):
        self.write_profile(["pub/ok.bin", "secret/s.bin", "rootonly.bin", "lnk/ok.bin"])
        d = self.mount()
        r = self.replay(d)
        self.assertEqual((r["state"], r["files"], r["files_done"], r["files_skipped"]), ("done", 4, 1, 3), r)
        self.assertTrue(self.cached("pub/ok.bin"))
        for rel in ("secret/s.bin", "rootonly.bin", "lnk/ok.bin"):
            self.assertFalse(self.cached(rel), "%s staged on the strength of a user's profile" % rel)
        self.assertEqual(d.stop(), 0)
        # The job opened nothing: the user's profile is left as it was (and still the user's).
        self.assertEqual(os.stat(self.profile).st_uid, self.uid)
        _, err = d.output()
        self.assertIn("not readable by its user 2", err)


class Forged(ProfileCase):
    def test_a_profile_naming_a_path_outside_the_source_is_refused_whole(self):
        self.write_profile(["pub/ok.bin", "../outside.bin"])
        d = self.mount()
        r = self.replay(d)
        self.assertEqual(r["state"], "refused", r)
        self.assertIn("outside the source", r["profile"])
        self.assertFalse(self.cached("pub/ok.bin"), "a refused profile staged something")
        self.assertFalse(os.path.exists(os.path.join(self.work.file("cache"), "outside.bin")))
        out = h.run([os.path.join(os.path.dirname(h.STAGEFS), "stagectl"), "status", d.mnt]).stdout
        self.assertIn("replay: profile refused:", out)
        self.assertEqual(d.stop(), 0)

    def test_a_profile_other_users_may_write_is_refused(self):
        self.write_profile(["pub/ok.bin"], mode=0o666)
        os.chmod(self.profile, 0o666)
        d = self.mount()
        r = self.replay(d)
        self.assertEqual(r["state"], "refused", r)
        self.assertIn("other users may write it", r["profile"])
        self.assertFalse(self.cached("pub/ok.bin"))
        self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    h.main(__file__, tools=("useradd", "userdel", "setpriv"))
