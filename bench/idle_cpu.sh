#!/usr/bin/env bash
# idle_cpu.sh: CPU used by an idle stagefs daemon (no file opened), as % of one core.
#
# How: mount, wait until `stagefs --wait` says ready, let it settle SETTLE s, then read
# utime+stime of the daemon process (all its threads: /proc/PID/stat fields 14+15, in clock
# ticks) at the start and end of DURATION s; % of one core = ticks / CLK_TCK / DURATION * 100.
#   standalone  one `stagefs SRC MNT --cache C` (no launcher)
#   group       mpirun -np RANKS, each rank in its own mount namespace (unshare, like demo.sh);
#               reported per rank (each rank's stagefs process), plus their mean and max, and
#               mpirun's own CPU over the same window (the launcher: not part of the target).
# Variants interleaved (standalone, group, standalone, group, ...); RUNS rounds.
# Target: <= 1% of one core per daemon.
# Tick resolution: CLK_TCK is usually 100, so 60 s resolve 1 tick = 0.017% of a core.
#
# Env: DURATION (60) SETTLE (3) RANKS (4) RUNS (5) WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail

. "$(dirname "$0")/lib.sh"
need_root

DURATION=${DURATION:-60}
SETTLE=${SETTLE:-3}
RANKS=${RANKS:-4}
WORK=$WORK_ROOT/idle
MNT=$WORK/mnt
NAME=idle_cpu
HZ=$(getconf CLK_TCK)

daemon_pid=
group_pid=
cleanup() {
  set +e
  unmount_if "$MNT"
  [ -n "$daemon_pid" ] && kill_tree "$daemon_pid"
  stop_group
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
mkdir -p "$WORK/src" "$MNT"
head -c 1M /dev/urandom > "$WORK/src/file"

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }   # comm has no spaces here
pct() { "$PY" -c "import sys; print(f'{int(sys.argv[1]) / $HZ / $DURATION * 100:.3f}')" "$1"; }


run_standalone() {
  rm -rf "$WORK/cache"
  "$BIN/stagefs" "$WORK/src" "$MNT" --cache "$WORK/cache" 2> "$WORK/standalone.log" &
  daemon_pid=$!
  "$BIN/stagefs" --wait "$MNT" --wait-timeout 60 || { log "not ready: $(cat "$WORK/standalone.log")"; return 1; }
  sleep "$SETTLE"
  local la a b
  la=$(loadavg)
  a=$(ticks "$daemon_pid"); sleep "$DURATION"; b=$(ticks "$daemon_pid")
  raw "$r,standalone,$la,$(pct $((b - a))),$((b - a)),"
  fusermount3 -u "$MNT"; wait "$daemon_pid" || true; daemon_pid=
}

run_group() {
  rm -rf "$WORK"/pid* "$WORK"/node*
  timeout -k 5 $((DURATION + 300)) mpirun --oversubscribe -np "$RANKS" sh -c 'echo $$ > '"$WORK"'/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private '"$BIN"'/stagefs '"$WORK/src $MNT"' --cache '"$WORK"'/node$OMPI_COMM_WORLD_RANK/cache' \
    2> "$WORK/group.log" &
  group_pid=$!
  local k
  for ((k = 0; k < RANKS; k++)); do
    for _ in $(seq 300); do [ -s "$WORK/pid$k" ] && break; sleep 0.1; done
    [ -s "$WORK/pid$k" ] || { log "rank $k did not start: $(tail -5 "$WORK/group.log")"; return 1; }
  done
  on_node 0 "$BIN/stagefs" --wait "$MNT" --wait-timeout 120 || { log "group not ready: $(tail -5 "$WORK/group.log")"; return 1; }
  sleep "$SETTLE"
  local la pids=() a=() b=() ma mb
  la=$(loadavg)
  for ((k = 0; k < RANKS; k++)); do pids+=("$(cat "$WORK/pid$k")"); done
  for ((k = 0; k < RANKS; k++)); do a+=("$(ticks "${pids[$k]}")"); done
  ma=$(ticks "$group_pid")
  sleep "$DURATION"
  for ((k = 0; k < RANKS; k++)); do b+=("$(ticks "${pids[$k]}")"); done
  mb=$(ticks "$group_pid")
  local sum=0 max=0 d
  for ((k = 0; k < RANKS; k++)); do
    d=$((b[k] - a[k])); sum=$((sum + d)); ((d > max)) && max=$d
    raw "$r,group-rank$k,$la,$(pct "$d"),$d,"
  done
  raw "$r,group-mean,$la,$("$PY" -c "print(f'{$sum / $RANKS / $HZ / $DURATION * 100:.3f}')"),$sum,"
  raw "$r,group-max,$la,$(pct "$max"),$max,"
  raw "$r,group-mpirun,$la,$(pct $((mb - ma))),$((mb - ma)),launcher"
  stop_group
}

raw_init "$NAME" "round,variant,loadavg,pct_core,ticks,note"
echo "# CLK_TCK=$HZ DURATION=${DURATION}s SETTLE=${SETTLE}s RANKS=$RANKS" >> "$RAW"
for ((r = 1; r <= RUNS; r++)); do
  run_standalone || die "standalone run failed"
  run_group || die "group run failed"
done

"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric pct_core --unit "% of one core" --cols ticks \
  --title "idle daemon CPU over ${DURATION} s after the mount is ready (target <= 1% of one core per daemon)" \
  --note "group-rankK: each rank's stagefs process; group-mean/max: over the $RANKS ranks; group-mpirun: the launcher (Open MPI's mpirun, not stagefs). ticks at CLK_TCK=$HZ."
