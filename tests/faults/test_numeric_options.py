#!/usr/bin/python3
"""Every numeric option of every command refuses NaN and infinities (ctest faults.numbers).

Usage: test_numeric_options.py STAGEFS STAGE_BCAST STAGECTL

The options come from each command's --help (as the man pages do): an option whose value type
is FLOAT, INT, UINT, SIZE or SIZE|N% is numeric. Each is given nan, NaN, -nan, inf, -inf,
infinity, +Infinity and 1e999 (a double overflows to infinity) and must exit with status 2,
naming the option. A range check alone lets NaN through (it compares false with every bound):
`stage-bcast --stall-timeout nan` used to run with its watchdog off and exit 0.

What an accepted value would do instead, so that acceptance shows as another exit status:
  stagefs      --wait on a path that is no mount, for 0.05 s: exit 1
  stage-bcast  a real one-rank copy of a small file (MPI singleton): exit 0
The same invocations with a finite value are checked to give exactly that (the control).
stagectl has no numeric option today: its --help (and each subcommand's) is parsed too, so
one added later is tested. Needs no root and no mount. Standard library only.
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

STAGEFS = STAGE_BCAST = STAGECTL = None
NUMERIC = {"FLOAT", "INT", "UINT", "SIZE", "SIZE|N%"}
NOT_FINITE = ["nan", "NaN", "-nan", "inf", "-inf", "infinity", "+Infinity", "1e999"]
# "  --name TYPE[:CHECK][=DEFAULT] ..." (also "-v,--verbose" flags, which have no TYPE).
OPTION = re.compile(r"^\s+(?:-\w,)?(--[\w-]+)(?: ([^\s=:]+))?")


def run(cmd, timeout=60):
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, errors="replace", timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def numeric_options(cmd):
    """{option: type} of the numeric options cmd's --help lists."""
    rc, out, err = run(cmd + ["--help"])
    if rc != 0:
        raise AssertionError("%s --help exited %d: %s" % (cmd, rc, err))
    found = {}
    for line in out.splitlines():
        m = OPTION.match(line)
        if m and m.group(2) in NUMERIC:
            found[m.group(1)] = m.group(2)
    return found


class NumericOptions(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stagefs-numbers-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", self.tmp]))
        self.src = os.path.join(self.tmp, "src")
        with open(self.src, "wb") as f:
            f.write(b"x" * 10000)

    def stagefs_cmd(self, opt, value):
        cmd = [STAGEFS, "--wait", os.path.join(self.tmp, "no-mount")]
        if opt != "--wait-timeout":
            cmd += ["--wait-timeout", "0.05"]
        return cmd + [opt, value]

    def bcast_cmd(self, opt, value):
        return [STAGE_BCAST, "--source", self.src, "--dest", os.path.join(self.tmp, "dest"), opt, value]

    def check_command(self, name, make, accepted, finite, must_have):
        opts = numeric_options(make("--help", "")[:1])
        for o in must_have:
            self.assertIn(o, opts, "%s --help no longer shows %s as numeric: the parse is stale" % (name, o))
        for opt, typ in sorted(opts.items()):
            for bad in NOT_FINITE + (["nan%", "inf%"] if typ == "SIZE|N%" else []):
                with self.subTest(command=name, option=opt, value=bad):
                    rc, out, err = run(make(opt, bad))
                    self.assertEqual(rc, 2, "%s %s %s: exit %d, want 2 (refused)\nstdout: %s\nstderr: %s" %
                                     (name, opt, bad, rc, out[-500:], err[-500:]))
                    self.assertIn(opt, err, "%s %s %s: the message does not name the option" % (name, opt, bad))
        # The control: a finite value gets past the options (to what acceptance does).
        rc, out, err = run(make(*finite))
        self.assertEqual(rc, accepted, "%s %s %s: exit %d, want %d (accepted)\nstderr: %s" %
                         (name, finite[0], finite[1], rc, accepted, err[-500:]))
        return opts

    def test_stagefs(self):
        opts = self.check_command("stagefs", self.stagefs_cmd, 1, ("--stall-timeout", "30"),
                                  ["--wait-timeout", "--stall-timeout", "--startup-timeout", "--attr-timeout",
                                   "--threads", "--chunk-size", "--cache-size", "--max-open-per-user"])
        print("stagefs: %d numeric options: %s" % (len(opts), " ".join(sorted(opts))), file=sys.stderr)

    def test_stage_bcast(self):
        opts = self.check_command("stage-bcast", self.bcast_cmd, 0, ("--stall-timeout", "30"),
                                  ["--stall-timeout", "--startup-timeout", "--source-rank", "--chunk-size"])
        print("stage-bcast: %d numeric options: %s" % (len(opts), " ".join(sorted(opts))), file=sys.stderr)

    def test_stagectl_has_no_numeric_option_untested(self):
        for sub in ([], ["status"], ["stats"], ["prefetch"], ["evict"]):
            self.assertEqual(numeric_options([STAGECTL] + sub), {},
                             "stagectl %s has numeric options now: give this test its invocation" % " ".join(sub))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    STAGEFS, STAGE_BCAST, STAGECTL = (os.path.abspath(a) for a in sys.argv[1:4])
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
