#!/usr/bin/env bash
# bench_read_path.sh: read throughput of a materialized file through a standalone stagefs
# mount, against reading the cached copy (CACHE/data/<name>) directly.
#
# How: one SIZE_MB random file in WORK/src. For each variant, a fresh mount with an empty
# cache (passthrough: the default as root on Linux >= 6.9; fallback: --no-passthrough, the
# daemon splices from the local copy with keep_cache); the first read materializes the file
# (not timed), then, per round, `dd if=X of=/dev/null bs=1M`:
#   mount-cold / direct-cold   REPS alternating pairs: drop caches, read MNT/image; drop
#                caches, read CACHE/data/image; ...
#   mount-warm / direct-warm   both read once more untimed, then REPS alternating timed
#                pairs (mount, direct, mount, direct, ...)
# (the order of mount/direct alternates from round to round). Rounds interleave the two
# variants: pt fb pt fb ... and every round mounts fresh. The metric is MB/s (dd's bytes /
# its seconds); ratios are mount/direct throughput, also paired (per pair of reads).
# The daemon's log line "reads are served by ..." is checked to confirm which path served.
# Targets: passthrough >= 0.95x direct; fallback >= 0.5x direct when warm.
#
# Env: SIZE_MB (2048) RUNS (5) REPS (3) WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SIZE_MB=${SIZE_MB:-2048}
REPS=${REPS:-3}   # paired reads per round (a 2 GiB read takes 0.2-2 s here: one sample is
                  # at the mercy of one scheduling hiccup of this shared machine)
WORK=$WORK_ROOT/read
SRC=$WORK/src
MNT=$WORK/mnt
CACHE=$WORK/cache
NAME=bench_read_path

daemon_pid=
cleanup() {
  set +e
  unmount_if "$MNT"
  [ -n "$daemon_pid" ] && kill_tree "$daemon_pid"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
need_space $(( (SIZE_MB * 2 + 1023) / 1024 ))
mkdir -p "$SRC" "$MNT"
make_random_file "$SRC/image" "$SIZE_MB"

# dd's throughput in MB/s (10^6), computed from its own byte count and seconds.
dd_mbs() {
  local line
  line=$(LC_ALL=C dd if="$1" of=/dev/null bs=1M 2>&1 | grep 'bytes') || return 1
  "$PY" -c 'import sys; w=sys.argv[1].split(); b=float(w[0]); s=float(w[w.index("s,")-1] if "s," in w else w[-4]); print(f"{b/s/1e6:.1f}")' "$line"
}

mount_fresh() {  # $1 = extra option ("" or --no-passthrough); sets daemon_pid, LOGF
  unmount_if "$MNT"
  rm -rf "$CACHE"
  LOGF=$WORK/daemon.$2.log
  "$BIN/stagefs" "$SRC" "$MNT" --cache "$CACHE" $1 2> "$LOGF" &
  daemon_pid=$!
  "$BIN/stagefs" --wait "$MNT" --wait-timeout 60 || die "mount not ready: $(cat "$LOGF")"
  # materialize (first open copies the file into the cache); not timed
  cat "$MNT/image" > /dev/null
  [ "$(stat -c %s "$CACHE/data/image")" = $((SIZE_MB << 20)) ] || die "not materialized: $(cat "$LOGF")"
}

file_of() { if [ "$1" = mount ]; then echo "$MNT/image"; else echo "$CACHE/data/image"; fi; }

umount_now() {
  fusermount3 -u "$MNT" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=
}

raw_init "$NAME" "round,variant,loadavg,mbs,read_path"
declare -A served
for ((r = 1; r <= RUNS; r++)); do
  for v in pt fb; do
    opt=""; [ $v = fb ] && opt="--no-passthrough"
    mount_fresh "$opt" "$v.$r"
    path=$(grep -o 'reads are served by .*' "$LOGF" | tail -1 | sed 's/reads are served by //')
    served[$v]=$path
    order=$(round_order "$r" mount direct)
    for ((i = 1; i <= REPS; i++)); do   # cold: each read right after a drop
      for what in $order; do
        drop_caches
        la=$(loadavg); raw "$r.$i,$v-$what-cold,$la,$(dd_mbs "$(file_of $what)"),$path"
      done
    done
    # warm: both warmed once (untimed), then REPS alternating timed pairs
    for what in $order; do cat "$(file_of $what)" > /dev/null; done
    for ((i = 1; i <= REPS; i++)); do
      for what in $order; do
        la=$(loadavg); raw "$r.$i,$v-$what-warm,$la,$(dd_mbs "$(file_of $what)"),$path"
      done
    done
    umount_now
  done
done

"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric mbs --unit MB/s \
  --title "read path: $SIZE_MB MiB file via a standalone stagefs mount vs the cached copy directly (dd bs=1M)" \
  --ratio "passthrough cold=pt-mount-cold/pt-direct-cold" --ratio "passthrough warm=pt-mount-warm/pt-direct-warm" \
  --ratio "fallback cold=fb-mount-cold/fb-direct-cold" --ratio "fallback warm=fb-mount-warm/fb-direct-warm" \
  --target "passthrough cold>=0.95" --target "passthrough warm>=0.95" --target "fallback warm>=0.5" \
  --note "Ratios are throughput mount/direct (higher is better). Daemon log: passthrough mount: \"reads are served by ${served[pt]:-?}\"; --no-passthrough mount: \"reads are served by ${served[fb]:-?}\". The fallback-cold ratio has no target (reported for completeness)."
