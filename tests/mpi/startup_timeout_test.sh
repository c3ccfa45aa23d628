#!/usr/bin/env bash
# startup_timeout_test.sh STAGE_BCAST STAGEFS MPIRUN... - a rank that never gets through MPI
# start-up does not leave the others waiting forever.
#
# A 3-rank job whose last rank stops itself (SIGSTOP) before it can exec the program, as a task
# that hangs at start would (a node stuck loading the binary, a stopped process): the two
# others wait for it inside MPI_Init. With --startup-timeout 5 a waiting rank must say which
# rank waits for what and exit with status 3, so the launcher ends the job and returns. Once
# for stage-bcast, once for the stagefs daemon group. Without the bound the job only ends at
# the `timeout` below (or the ctest TIMEOUT), which fails the test. Exit 0 pass, 1 fail.
set -uo pipefail
SB=$1 FS=$2
shift 2
WORK=$(mktemp -d /var/tmp/stagefs-startup.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo
# The hung rank: stops before exec; mpirun's SIGKILL at the end of the job ends it.
STOPPED=(/bin/sh -c 'kill -STOP $$; exec "$@"' stopped-rank)
head -c 1048576 /dev/urandom >"$WORK/src.img"
mkdir -p "$WORK/tree" "$WORK/mnt"
fail=0

# run NAME CMD...: 2 ranks of CMD, a third stopped before it starts CMD. mpirun ends the job
# when the first rank exits non-zero, so the other waiting rank may be ended before its own
# deadline: at least one of them must report, and mpirun must pass on its status 3.
run() {
  local name=$1 rc bad=0
  shift
  timeout -k 10 120 "${MPIRUN[@]}" -np 2 "$@" : -np 1 "${STOPPED[@]}" "$@" >"$WORK/$name.out" 2>&1
  rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "FAIL: $name: the job was still waiting after 120 s"; bad=1
  elif ((rc != 3)); then
    echo "FAIL: $name: the launcher returned $rc, not 3"; bad=1
  fi
  if ! grep -qE "^$name: rank [01] of 3 on .*MPI start-up did not complete within 5 s .*still waiting in MPI_Init" \
    "$WORK/$name.out"; then
    echo "FAIL: $name: no waiting rank reported the start-up timeout"; bad=1
  fi
  if ((bad)); then
    sed -e 's/^/    | /' "$WORK/$name.out" | head -n 40
    fail=1
  else
    echo "ok: $name (launcher status $rc)"
  fi
}
MPIRUN=("$@")
run stage-bcast "$SB" --source "$WORK/src.img" --dest "$WORK/node%n/img" --ranks-as-nodes --startup-timeout 5
run stagefs "$FS" "$WORK/tree" "$WORK/mnt" --cache "$WORK/cache" --startup-timeout 5
if ls "$WORK"/node*/img >/dev/null 2>&1; then echo "FAIL: a copy was published"; fail=1; fi

# The watchdog covers start-up only. Its thread ("startup-watch") exists while a rank starts
# (seen in the two ranks that wait for a stopped third), and is gone in every rank once the
# transfer runs: with --startup-timeout 1, rank 0 holds itself (SIGSTOP, STAGE_TEST_HOLD) before
# the first chunk; then no rank has the thread, and the job, resumed, succeeds.
# ranks MARK: pids of this test's stage-bcast processes whose command line holds MARK
ranks() {
  local p
  for p in $(pgrep -x stage-bcast); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "$1" && echo "$p"
  done
}
# watchers PIDS...: how many of them have a thread named startup-watch
watchers() {
  local p n=0
  for p in "$@"; do cat /proc/"$p"/task/*/comm 2>/dev/null | grep -qx startup-watch && n=$((n + 1)); done
  echo "$n"
}
# poll CMD...: until CMD succeeds; the ctest TIMEOUT bounds it
poll() { until "$@"; do sleep 0.1; done; }
two_watching() { (($(watchers $(ranks "$WORK/watch")) == 2)); }
timeout -k 10 120 "${MPIRUN[@]}" -np 2 "$SB" --source "$WORK/src.img" --dest "$WORK/watch%n/img" --ranks-as-nodes \
  --startup-timeout 600 : -np 1 "${STOPPED[@]}" "$SB" --source "$WORK/src.img" --dest "$WORK/watch%n/img" \
  --ranks-as-nodes >"$WORK/watch.out" 2>&1 &
job=$!
poll two_watching
echo "ok: the two waiting ranks each have a startup-watch thread"
kill -TERM "$job"
wait "$job"
held() { [[ -e $WORK/held ]]; }
STAGE_TEST_HOLD=before-first-chunk STAGE_TEST_HOLD_RANK=0 STAGE_TEST_HOLD_FILE=$WORK/held \
  timeout -k 10 120 "${MPIRUN[@]}" -x STAGE_TEST_HOLD -x STAGE_TEST_HOLD_RANK -x STAGE_TEST_HOLD_FILE -np 3 \
  "$SB" --source "$WORK/src.img" --dest "$WORK/long%n/img" --ranks-as-nodes --startup-timeout 1 \
  >"$WORK/long.out" 2>&1 &
job=$!
poll held
pids=$(ranks "$WORK/long")
if (($(wc -w <<<"$pids") != 3)); then
  echo "FAIL: expected 3 stage-bcast ranks, found: $pids"; fail=1
elif (($(watchers $pids) != 0)); then
  echo "FAIL: a startup-watch thread is still there during the transfer"; fail=1
else
  echo "ok: no rank has a startup-watch thread once the transfer runs"
fi
kill -CONT $pids
wait "$job"
rc=$?
if ((rc != 0)); then
  echo "FAIL: the held transfer with --startup-timeout 1 returned $rc"; sed -e 's/^/    | /' "$WORK/long.out" | head -n 20
  fail=1
else
  for k in 0 1 2; do cmp -s "$WORK/src.img" "$WORK/long$k/img" || { echo "FAIL: node $k's copy differs"; fail=1; }; done
fi
exit "$fail"
