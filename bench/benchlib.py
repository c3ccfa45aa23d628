"""What the python benchmarks that run stagefs mounts on ranks-as-nodes share: enter(BUILD)
re-executes the calling script once in a private mount namespace (its mounts vanish with
it), points the tests/mount harness at BUILD's stagefs, sets Open MPI's environment for
root on loopback, and returns the harness module."""
import os
import sys

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
