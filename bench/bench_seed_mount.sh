#!/usr/bin/env bash
# bench_seed_mount.sh: warm nodes seed cold ones, through the mount. A NODES-rank mount group
# (mpirun, each rank a "node" in its own mount namespace over its own cache, like
# bench_contended.sh) over a contended source (RATE_MBS MB/s, the throttled loop device);
# WARM of the caches already hold a valid copy of the SIZE_MB image, as an earlier job left
# it (its origin xattr and mtime: made once by a warm-up mount, then copied with cp -a; the
# source is not touched afterwards, so the copies stay current). Without a warm cache rank 0
# reads the source; with one, the lowest warm rank feeds the broadcast from its cache.
#
# Variants per round (interleaved): source (one `dd` of the image from the throttled source:
# one source read, the unit), warm0 .. warm$((NODES-1)) (the warm caches are the HIGHEST
# ranks; a first open on node 0, a cold node and the coordinator: `dd` of the whole file
# through the mount there, from the open to the last byte; the group's start and stop are
# not timed). Before each timed part the image's pages are dropped from the page cache
# (POSIX_FADV_DONTNEED on that file only). Reported: seconds, ratio to the same round's source
# read, bytes read from the shared source and from seeds (user.stagefs.stats of node 0), and
# the rank that fed the transfer (its log line). Every node's copy is compared with the
# reference after each run.
#
# Env: SIZE_MB (256) NODES (4) RATE_MBS (10) RUNS (5, lib.sh) CHUNK (16M) NAME WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SIZE_MB=${SIZE_MB:-256}
NODES=${NODES:-4}
RATE_MBS=${RATE_MBS:-10}
CHUNK=${CHUNK:-16M}
NAME=${NAME:-seed-mount-${RATE_MBS}mbs}
WORK=$WORK_ROOT/seed-mount
SHARED=$WORK/shared
MNT=$WORK/mnt

group_pid=
cleanup() {
  set +e
  stop_group
  cg_leave
  loop_source_end
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
mkdir -p "$WORK"
need_space $(( (SIZE_MB * (NODES + 4) + 1023) / 1024 ))

mkdir -p "$MNT"
loop_source_begin "$SHARED" "$SIZE_MB"
mkdir -p "$SHARED/src"
make_random_file "$WORK/ref/image" "$SIZE_MB"
cp "$WORK/ref/image" "$SHARED/src/image"
sync


start_group() {
  rm -f "$WORK"/pid*
  timeout -k 5 900 mpirun --oversubscribe -np "$NODES" sh -c 'echo $$ > '"$WORK"'/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private '"$BIN"'/stagefs '"$SHARED/src $MNT"' --chunk-size '"$CHUNK"' --cache '"$WORK"'/node$OMPI_COMM_WORLD_RANK' \
    2> "$WORK/group.log" &
  group_pid=$!
  local k
  for ((k = 0; k < NODES; k++)); do
    for _ in $(seq 300); do [ -s "$WORK/pid$k" ] && break; sleep 0.1; done
    [ -s "$WORK/pid$k" ] || { log "rank $k did not start: $(tail -5 "$WORK/group.log")"; return 1; }
  done
  on_node 0 "$BIN/stagefs" --wait "$MNT" --wait-timeout 120 || { log "group not ready: $(tail -5 "$WORK/group.log")"; return 1; }
}

# The warm-up mount (untimed, at full speed): node 0's cache gets a copy with its origin; it is
# the template of every warm cache.
log "warm-up mount: one copy into node 0's cache"
rm -rf "$WORK"/node*
start_group
on_node 0 dd if="$MNT/image" of=/dev/null bs=1M status=none
wait_materialized "$WORK/group.log" image
stop_group
cmp -s "$WORK/ref/image" "$WORK/node0/data/image" || die "the warm-up copy differs from the reference"
mkdir -p "$WORK/template"
cp -a "$WORK/node0/data/image" "$WORK/template/image"  # bytes, mtime and the origin xattr

cg_enter "$LOOPDEV" "$RATE_MBS"
log "source $SHARED/src on $LOOPDEV, reads limited to $RATE_MBS MB/s for cgroup $CG"

run_source() {
  evict_pages "$SHARED/src/image"
  timed dd if="$SHARED/src/image" of=/dev/null bs=1M status=none || return
  RES="$SECS,$((SIZE_MB << 20)),0,-"
}

run_warm() {  # $1: how many caches (the highest ranks) hold a valid copy
  local w=$1 k stats
  rm -rf "$WORK"/node*
  for ((k = NODES - w; k < NODES; k++)); do
    mkdir -p "$WORK/node$k/data"
    cp -a "$WORK/template/image" "$WORK/node$k/data/image"
  done
  sync
  start_group || return 1
  evict_pages "$SHARED/src/image"
  timed on_node 0 dd if="$MNT/image" of=/dev/null bs=1M status=none || { stop_group; return 1; }
  wait_materialized "$WORK/group.log" image
  stats=$(on_node 0 getfattr --absolute-names --only-values -n user.stagefs.stats "$MNT")
  stop_group
  for ((k = 0; k < NODES; k++)); do
    cmp -s "$WORK/ref/image" "$WORK/node$k/data/image" || { log "node$k differs"; return 1; }
  done
  RES="$SECS,$(stats_source_fields <<< "$stats"),$FED"
}

seed_run() {
  case $1 in
    source) run_source ;;
    warm*) run_warm "${1#warm}" ;;
  esac
}
raw_init "$NAME" "round,variant,loadavg,seconds,bytes_from_source,bytes_from_seeds,fed_by"
rounds seed_run ",,," source $(seed_warm_variants "")

seed_summarize "" source 0.3 bytes_from_source,bytes_from_seeds \
  "warm nodes seed cold ones, through the mount: a $NODES-rank group, a first open of one $SIZE_MB MiB image from a $RATE_MBS MB/s source, 0..$((NODES - 1)) caches warm" \
  "source: one dd of the image from the throttled source (the unit). warmW: a $NODES-rank mount group (mpirun, a mount namespace and a cache per rank) whose W highest ranks' caches hold a valid copy from an earlier mount; seconds: dd of the whole file through the mount on node 0 (cold, the coordinator), from the open to the last byte (group start and stop not timed). bytes_from_source / bytes_from_seeds: node 0's user.stagefs.stats; fed_by (raw CSV): the materialization's log line. Every node's copy compared with the reference after each run. Chunk size $CHUNK. The image's pages are evicted (POSIX_FADV_DONTNEED) before each timed part."
