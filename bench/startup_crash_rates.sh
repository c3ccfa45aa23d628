#!/usr/bin/env bash
# startup_crash_rates.sh CASE SECONDS [LABEL]
#
# How often a 4-rank job on the simulated Slurm cluster (tests/harness/simslurm.sh) loses a
# rank at start-up, for telling Open MPI's start-up races from our own crashes. Runs one
# CASE again and again for SECONDS (then finishes the run under way), under load (LOAD busy
# loops, `yes > /dev/null`, bounded by timeout), and appends one line per batch to
# bench/results/startup_crash_rates.raw.csv. Takes /var/tmp/stagefs-cluster.lock itself and
# holds it for the batch only; the cluster is brought up at the start and down at the end.
#
# CASE (every srun: -N4 --ntasks-per-node=1 --mpi=pmix --kill-on-bad-exit=1, so a crashed
# rank ends the step at once instead of leaving the others waiting; KILL_ON_BAD_EXIT=0 drops
# the option, as job scripts without it run):
#   plain     bench/startup_probe.c plain: stage-bcast's start-up collectives, no threads
#   threads   startup_probe threads: the same, then threads as stage-bcast's engine starts them
#             (after MPI start-up) while the MPI thread passes 4 MiB down the rank chain
#   early     startup_probe early: those threads started before MPI_Init_thread
#   stage     stage-bcast --source <SIZE_MB MiB file> --dest /nvme/cN/f (a fresh destination
#             each run)
#
# Outcomes per run: ok (srun 0), crash (a task ended by a signal: srun's "Segmentation fault"
# / "signal" lines, or a core file; also when the others then waited), hang (no crash, but
# the srun outlived SRUN_TIMEOUT), fail (anything else). Each crash's core is classified by its backtrace: inside MPI_Init (ompi_mpi_init in
# the crashing thread's stack) or elsewhere; the logs and backtraces of every run that was not
# ok stay in WORK/CASE-LABEL/.
#
# Environment: BIN (stage-bcast's directory, default build/tools; copied before the batch, so
# a rebuild meanwhile does not change it), LOAD (2), SRUN_TIMEOUT (120 s), WORK
# (/var/tmp/stagefs-crashprobe), EXTRA_ENV ("NAME=VALUE ..." exported to the ranks, e.g.
# OMPI_MCA_ settings; recorded in the CSV), STAGE_ARGS (extra stage-bcast options), SIZE_MB
# (the stage case's source, default 4), KILL_ON_BAD_EXIT (1).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
CASE=${1:?usage: $0 plain|threads|early|stage SECONDS [LABEL]}
SECS=${2:?seconds}
LABEL=${3:-default}
BIN=${BIN:-$TOP/build/tools}
LOAD=${LOAD:-2}
SRUN_TIMEOUT=${SRUN_TIMEOUT:-120}
WORK=${WORK:-/var/tmp/stagefs-crashprobe}
RESULTS=${RESULTS:-$HERE/results}
HARNESS=$TOP/tests/harness/simslurm.sh
OUT=$WORK/$CASE-$LABEL
mkdir -p "$OUT" "$WORK/bin" "$RESULTS"

mpicc -O2 -o "$WORK/bin/startup_probe" "$HERE/startup_probe.c" -lpthread || exit 1
if [[ $CASE == stage ]]; then
  cp "$BIN/stage-bcast" "$WORK/bin/stage-bcast" || exit 1
fi
case $CASE in
  plain | threads | early) CMD=("$WORK/bin/startup_probe" "$CASE") ;;
  stage) CMD=("$WORK/bin/stage-bcast" --source "$WORK/src${SIZE_MB:-4}m" ${STAGE_ARGS:-}) ;;
  *) echo "unknown case $CASE" >&2; exit 2 ;;
esac
SIZE_MB=${SIZE_MB:-4}
SRC=$WORK/src${SIZE_MB}m
[[ -f $SRC ]] || head -c $((SIZE_MB << 20)) /dev/urandom >"$SRC"

exec 9>/var/tmp/stagefs-cluster.lock
flock 9
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  "$HARNESS" down 9>&- >/dev/null 2>&1
}
trap cleanup EXIT
"$HARNESS" up 4 9>&- >"$OUT/up.log" 2>&1 || { echo "cluster did not come up" >&2; exit 1; }
eval "$("$HARNESS" env)"
for kv in ${EXTRA_ENV:-}; do export "${kv?}"; done
ulimit -c unlimited
for ((i = 0; i < LOAD; i++)); do
  timeout $((SECS + SRUN_TIMEOUT + 60)) yes >/dev/null 9>&- &
  pids+=($!)
done

SRUN=(srun -N4 --ntasks-per-node=1 --mpi=pmix)
((${KILL_ON_BAD_EXIT:-1})) && SRUN+=(--kill-on-bad-exit=1)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
runs=0 ok=0 crash=0 in_init=0 hang=0 failed=0
t0=$SECONDS
while ((SECONDS - t0 < SECS)); do
  runs=$((runs + 1))
  d=$WORK/run/$runs
  mkdir -p "$d"
  args=("${CMD[@]}")
  [[ $CASE == stage ]] && args+=(--dest "/nvme/c$runs/f")
  (cd "$d" && timeout --kill-after=15 "$SRUN_TIMEOUT" "${SRUN[@]}" "${args[@]}" >"$d/log" 2>&1 9>&-)
  rc=$?
  cores=$(find "$d" -maxdepth 1 -name 'core*' | head -5)
  if ((rc == 0)) && [[ -z $cores ]]; then
    ok=$((ok + 1))
    rm -rf "$d" "$SIMSLURM_ROOT"/nodes/n*/nvme/c$runs
    continue
  fi
  if [[ -n $cores ]] || grep -qiE 'segmentation fault|signal|core dumped' "$d/log"; then
    crash=$((crash + 1)); kind=crash
    for c in $cores; do
      timeout 60 gdb -batch -ex 'thread apply all bt' "${CMD[0]}" "$c" >"$c.bt" 2>&1
      if grep -q 'ompi_mpi_init' "$c.bt"; then in_init=$((in_init + 1)); break; fi
    done
  elif ((rc == 124 || rc == 137)); then
    hang=$((hang + 1)); kind=hang
  else
    failed=$((failed + 1)); kind=fail
  fi
  mv "$d" "$OUT/$kind-$runs"
  echo "run $runs: $kind (srun $rc)" >&2
  rm -rf "$SIMSLURM_ROOT"/nodes/n*/nvme/c$runs
done
secs=$((SECONDS - t0))
load1=$(cut -d' ' -f1-3 /proc/loadavg)
csv=$RESULTS/startup_crash_rates.raw.csv
[[ -f $csv ]] || echo "date,case,label,extra_env,runs,ok,crash,crash_in_mpi_init,hang,fail,seconds,load,rev,srun" >"$csv"
echo "$(date -u +%FT%TZ),$CASE,$LABEL,\"${EXTRA_ENV:-}\",$runs,$ok,$crash,$in_init,$hang,$failed,$secs,$load0 / $load1,$(git -C "$TOP" rev-parse --short HEAD),\"${SRUN[*]} ${args[*]}\"" >>"$csv"
echo "$CASE $LABEL: $runs runs, $ok ok, $crash crashed ($in_init inside MPI_Init), $hang hung, $failed failed in ${secs}s (load $load0 -> $load1)"
