#!/usr/bin/env bash
# bench_seed.sh: warm nodes seed cold ones. NODES ranks-as-nodes (mpirun, not Slurm: light on a
# small shared machine) stage one SIZE_MB image from a contended source (RATE_MBS MB/s, the
# throttled loop device of bench_contended.sh); WARM of them already hold a current copy
# (same bytes and mtime, made from a local reference copy, not from the source). Without a
# warm node the source rank reads the source; with one, the warm node reads its own copy and
# the source is read for metadata only.
#
# Variants per round (interleaved): source (one `dd` of the image: one source read, the unit),
# warm0 .. warm$((NODES-1)) (stage-bcast on NODES ranks; the warm nodes are the HIGHEST ranks,
# so the seed is never the source rank 0). Before each timed part the image's pages are dropped
# from the page cache (POSIX_FADV_DONTNEED on that file only: no global drop_caches).
# Reported: seconds, ratio to the same round's source read, bytes read from the shared source
# and from seeds (stage-bcast's JSON report), and which rank fed the transfer.
#
# Env: SIZE_MB (256) NODES (4) RATE_MBS (10) RUNS (5, lib.sh) CHUNK (16M) NAME (seed, or seed-RATEmbs)
#      WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SIZE_MB=${SIZE_MB:-256}
NODES=${NODES:-4}
RATE_MBS=${RATE_MBS:-10}
CHUNK=${CHUNK:-16M}
WORK=$WORK_ROOT/seed
SHARED=$WORK/shared
NAME=${NAME:-seed$([ "$RATE_MBS" = 10 ] || echo "-${RATE_MBS}mbs")}

cleanup() {
  set +e
  cg_leave
  loop_source_end
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stage-bcast
mkdir -p "$WORK"
need_space $(( (SIZE_MB * (NODES + 3) + 1023) / 1024 ))

loop_source_begin "$SHARED" "$SIZE_MB"
make_random_file "$WORK/ref/image" "$SIZE_MB"  # the local reference the warm copies come from
cp --preserve=timestamps "$WORK/ref/image" "$SHARED/image"
sync
cg_enter "$LOOPDEV" "$RATE_MBS"
log "source $SHARED on $LOOPDEV, reads limited to $RATE_MBS MB/s for cgroup $CG"

run_source() {
  evict_pages "$SHARED/image"
  timed dd if="$SHARED/image" of=/dev/null bs=1M status=none || return
  RES="$SECS,$((SIZE_MB << 20)),0,-,source"
}

run_warm() {  # $1: how many nodes (the highest ranks) hold a current copy
  local w=$1 k
  for ((k = 0; k < NODES; k++)); do
    rm -rf "$WORK/node$k"
    if ((k >= NODES - w)); then
      mkdir -p "$WORK/node$k"
      cp --preserve=timestamps "$WORK/ref/image" "$WORK/node$k/image"
    fi
  done
  sync
  evict_pages "$SHARED/image"
  timed bcast_run || return 1
  for ((k = 0; k < NODES; k++)); do cmp -s "$WORK/ref/image" "$WORK/node$k/image" || { log "node$k differs"; return 1; }; done
  RES="$SECS,$(bcast_report_fields < "$WORK/out.json")"
}
bcast_run() {
  timeout -k 5 600 mpirun --oversubscribe -np "$NODES" "$BIN/stage-bcast" --ranks-as-nodes --json \
    --chunk-size "$CHUNK" --source "$SHARED/image" --dest "$WORK/node%n/image" > "$WORK/out.json"
}

seed_run() {
  case $1 in
    source) run_source ;;
    warm*) run_warm "${1#warm}" ;;
  esac
}
raw_init "$NAME" "round,variant,loadavg,seconds,bytes_read_source,bytes_read_seed,fed_by_rank,fed_from"
rounds seed_run ",,,," source $(seed_warm_variants "")

seed_summarize "" source 0.3 bytes_read_source,bytes_read_seed,fed_by_rank \
  "warm nodes seed cold ones: $NODES ranks-as-nodes stage one $SIZE_MB MiB image from a $RATE_MBS MB/s source, 0..$((NODES - 1)) of them warm" \
  "source: one dd of the image from the throttled source (the unit). warmW: mpirun -np $NODES stage-bcast --ranks-as-nodes, the W highest ranks hold a current copy; wall time of mpirun (includes MPI start-up). bytes_read_source / bytes_read_seed / fed_by_rank: from stage-bcast's JSON report. Every copy compared with the reference after each run. Chunk size $CHUNK. The image's pages are evicted (POSIX_FADV_DONTNEED) before each timed part."
