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
IMG=$WORK/shared.img
SHARED=$WORK/shared
NAME=${NAME:-seed$([ "$RATE_MBS" = 10 ] || echo "-${RATE_MBS}mbs")}

loopdev=
cleanup() {
  set +e
  cg_leave
  mountpoint -q "$SHARED" && umount "$SHARED"
  [ -n "$loopdev" ] && losetup -d "$loopdev"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stage-bcast
mkdir -p "$WORK"
need_space $(( (SIZE_MB * (NODES + 3) + 1023) / 1024 ))

mkdir -p "$WORK" "$SHARED"
log "building the shared source: ext4 on a loop device"
truncate -s $((SIZE_MB + 256))M "$IMG"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$IMG"
loopdev=$(losetup --direct-io=on -f --show "$IMG")
mount "$loopdev" "$SHARED"
make_random_file "$WORK/ref/image" "$SIZE_MB"  # the local reference the warm copies come from
cp --preserve=timestamps "$WORK/ref/image" "$SHARED/image"
sync
cg_enter "$loopdev" "$RATE_MBS"
log "source $SHARED on $loopdev, reads limited to $RATE_MBS MB/s for cgroup $CG"


run_source() {
  local t0 t1
  evict_pages "$SHARED/image"
  t0=$(now)
  dd if="$SHARED/image" of=/dev/null bs=1M status=none
  t1=$(now)
  RES="$(elapsed "$t0" "$t1"),$((SIZE_MB << 20)),0,-,source"
}

run_warm() {  # $1: how many nodes (the highest ranks) hold a current copy
  local w=$1 k t0 t1 out
  for ((k = 0; k < NODES; k++)); do
    rm -rf "$WORK/node$k"
    if ((k >= NODES - w)); then
      mkdir -p "$WORK/node$k"
      cp --preserve=timestamps "$WORK/ref/image" "$WORK/node$k/image"
    fi
  done
  sync
  evict_pages "$SHARED/image"
  t0=$(now)
  out=$(timeout -k 5 600 mpirun --oversubscribe -np "$NODES" "$BIN/stage-bcast" --ranks-as-nodes --json \
        --chunk-size "$CHUNK" --source "$SHARED/image" --dest "$WORK/node%n/image") || return 1
  t1=$(now)
  for ((k = 0; k < NODES; k++)); do cmp -s "$WORK/ref/image" "$WORK/node$k/image" || { log "node$k differs"; return 1; }; done
  RES="$(elapsed "$t0" "$t1"),$("$PY" -c 'import json,sys; r=json.loads(sys.argv[1]); print("%d,%d,%d,%s" % (r["bytes_read_source"], r["bytes_read_seed"], r["fed_by_rank"], r["fed_from"]))' "$out")"
}

variants=(source)
for ((w = 0; w < NODES; w++)); do variants+=("warm$w"); done
raw_init "$NAME" "round,variant,loadavg,seconds,bytes_read_source,bytes_read_seed,fed_by_rank,fed_from"
for ((r = 1; r <= RUNS; r++)); do
  for v in "${variants[@]}"; do
    la=$(loadavg)
    case $v in
      source) run_source || RES=",,,," ;;
      warm*) run_warm "${v#warm}" || RES=",,,," ;;
    esac
    raw "$r,$v,$la,$RES"
  done
done

ratios=()
for ((w = 0; w < NODES; w++)); do ratios+=(--ratio "warm$w/source=warm$w/source"); done
for ((w = 1; w < NODES; w++)); do ratios+=(--target "warm$w/source<=0.3"); done
"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric seconds --cols bytes_read_source,bytes_read_seed,fed_by_rank \
  --title "warm nodes seed cold ones: $NODES ranks-as-nodes stage one $SIZE_MB MiB image from a $RATE_MBS MB/s source, 0..$((NODES - 1)) of them warm" \
  "${ratios[@]}" \
  --note "source: one dd of the image from the throttled source (the unit). warmW: mpirun -np $NODES stage-bcast --ranks-as-nodes, the W highest ranks hold a current copy; wall time of mpirun (includes MPI start-up). bytes_read_source / bytes_read_seed / fed_by_rank: from stage-bcast's JSON report. Every copy compared with the reference after each run. Chunk size $CHUNK. The image's pages are evicted (POSIX_FADV_DONTNEED) before each timed part."
