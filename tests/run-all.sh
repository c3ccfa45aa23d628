#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is missing, builds
# (warnings are errors), and runs every ctest label (unit, mpi, mount, faults, packaging, then
# slurm and netns: `-LE 'unit|slurm|netns'` below selects every other label, so a new label is
# run without listing it), then the unit and MPI tests again under AddressSanitizer+UBSan and
# the concurrency tests under ThreadSanitizer. Any sanitizer report fails the run.
#
# Time (CI: 2 cores, budget well under 20 minutes). The tests outside `unit` run one at a time
# and leave about a core idle (measured: 0.8 of a core over 7.5 minutes; they wait on mpirun,
# FUSE and the disk). The two sanitizer trees are built meanwhile, in the background at the
# lowest CPU priority (nice 19, best-effort I/O at its lowest level): they take what the tests
# leave.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/packaging/install-deps.sh"
"$top/packaging/build.sh"
export OMPI_MCA_btl_tcp_if_include=lo

# Sanitizers: only the targets the sanitized tests use are built, at -O1 -g1 (what the
# sanitizers recommend; it compiles in 60 % of the time of -O2 -g, and the tests run as fast).
asan=$top/build-asan tsan=$top/build-tsan
sanflags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
          "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
background_build() {  # DIR SANITIZER JOBS TARGET...: configure and build at low priority, log in DIR.log
  local dir=$1 san=$2 jobs=$3; shift 3
  cmake -S "$top" -B "$dir" "${sanflags[@]}" -DSTAGEFS_SANITIZE="$san" >/dev/null &&
    nice -n 19 ionice -c 2 -n 7 cmake --build "$dir" -j"$jobs" --target "$@"
}
# (not the idle I/O class: the tests' I/O starved the builds, which were still 4 minutes from
# done when the tests ended)
set -m  # each background build in a process group of its own, so that it can be ended whole
background_build "$asan" address 2 unit_tests stage-bcast polite_wait >"$asan.log" 2>&1 &
asan_pid=$!
background_build "$tsan" thread 1 unit_tests >"$tsan.log" 2>&1 &
tsan_pid=$!
set +m
# a failing test ends the script: the background builds go with it
trap 'kill -- -$asan_pid -$tsan_pid 2>/dev/null; true' EXIT
built() {  # PID LOG
  wait "$1" && return 0
  echo "sanitizer build failed:"; tail -n 50 "$2"; return 1
}

cd "$top/build"
ctest --output-on-failure -L unit -j2
ctest --output-on-failure -LE 'unit|slurm|netns'
# The simulated Slurm and netns clusters last: by then the background builds are done (they
# are waited for here), so these run on a quiet machine. Under the builds' load a Slurm step
# of slurm.stagefs once never mounted (2 runs in 13 under load, none alone).
built $asan_pid "$asan.log"
built $tsan_pid "$tsan.log"
ctest --output-on-failure -L 'slurm|netns'

# Any error aborts. Leaks are checked in the unit tests (the whole engine runs there on
# in-process ranks); under mpirun, Open MPI's components are unloaded at finalize and their
# init-time allocations show as leaks of an unknown module, so the MPI tests check memory
# errors and undefined behaviour only.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
(cd "$asan" && ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 ctest --output-on-failure -L unit -E fuzz -j2)
(cd "$asan" && ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 ctest --output-on-failure -L mpi -R np4)
(cd "$tsan" && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure -L unit -E fuzz -j2)
