#!/usr/bin/env bash
# bench_contended.sh: "the reason we exist". NODES nodes all read the same SIZE_MB image from
# a shared source whose total read bandwidth is limited (~RATE_MBS MB/s): without stagefs every
# node reads it from the source; with stagefs one node reads it once and the copies travel by
# MPI broadcast to every node's cache.
#
# The throttled "shared filesystem" (FUSE-free, one machine, no new packages):
#   an ext4 image on a loop device (losetup --direct-io=on, so the backing file is not cached
#   in the host page cache), mounted at WORK/shared, and a blkio cgroup (v1
#   blkio.throttle.read_bps_device, or v2 io.max rbps) limiting READS from that loop device
#   to RATE_MBS MB/s in total for every process of the benchmark (readers, mpirun, all
#   stagefs ranks: the script moves itself into the cgroup; children inherit). Local disk
#   (the caches, on another device) is not throttled. (A loopback NFS export with tc is not
#   possible here: this kernel has no nfsd; tc on lo would also throttle everyone else.)
#   Page cache: on one machine, 4 readers of one file would share one page cache and the
#   source would be read once even without stagefs. Real nodes do not share page caches, so
#   the baseline's node k reads its own identical copy shared/baseline/nodeK/image (same
#   bytes, different inode); stagefs's nodes all open the one shared/stagefs/image.
#
# Variants (interleaved per round, caches dropped before each timed part):
#   baseline       NODES concurrent `dd if=shared/baseline/nodeK/image of=/dev/null bs=1M`;
#                  time until all are done.
#   stagefs-disk   mpirun -np NODES, each rank `unshare -m` + stagefs SOURCE MNT --cache
#                  WORK/nodeK/cache (empty), like demo.sh; after `stagefs --wait` (mount time
#                  reported separately), every node reads MNT/image at the same time (dd via
#                  nsenter); time from start until all NODES readers finished (includes the
#                  materialization: first open -> coordinator -> broadcast -> verified copy).
#                  Also the CPU-seconds the NODES daemons used meanwhile (/proc/PID/stat).
#   stagefs-tmpfs  the same with the caches in /dev/shm (tmpfs): what 4 nodes with their OWN
#                  fast local disks would see, since here all 4 "nodes" write one shared disk.
#   stagefs-<cache>@2  with BIN2 set: the same with $BIN2/stagefs (A/B of two builds)
# Reported: times and ratio baseline/stagefs (ideal -> NODES when the source is the bottleneck).
#
# Env: SIZE_MB (1024) NODES (4) RATE_MBS (200) RUNS (5) CACHES ("disk tmpfs") CHUNK (16M) BIN2
#      WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SIZE_MB=${SIZE_MB:-1024}
NODES=${NODES:-4}
RATE_MBS=${RATE_MBS:-200}
CACHES=${CACHES:-"disk tmpfs"}
CHUNK=${CHUNK:-16M}
WORK=$WORK_ROOT/contended
SHM=/dev/shm/stagefs-bench-contended
IMG=$WORK/shared.img
SHARED=$WORK/shared
MNT=$WORK/mnt
NAME=bench_contended
CG=

loopdev=
group_pid=
cleanup() {
  set +e
  stop_group
  jobs -p | while read -r p; do kill "$p" 2>/dev/null; done
  cg_leave
  mountpoint -q "$SHARED" && umount "$SHARED"
  [ -n "$loopdev" ] && losetup -d "$loopdev"
  rm -rf "$SHM"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

BIN2=${BIN2:-}
need_bin stagefs
need_space $(( (SIZE_MB * (2 * NODES + 1) + 2047) / 1024 ))

# ---- the throttled shared source -------------------------------------------------------
mkdir -p "$WORK" "$SHARED" "$MNT"
log "building the shared source: ext4 on a loop device"
truncate -s $(( (SIZE_MB * (NODES + 1) + 512) ))M "$IMG"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$IMG"
loopdev=$(losetup --direct-io=on -f --show "$IMG")
mount "$loopdev" "$SHARED"
mkdir -p "$SHARED/stagefs"
make_random_file "$SHARED/stagefs/image" "$SIZE_MB"
for ((k = 0; k < NODES; k++)); do
  mkdir -p "$SHARED/baseline/node$k"
  cp "$SHARED/stagefs/image" "$SHARED/baseline/node$k/image"
done
sync
majmin=$(lsblk -dno MAJ:MIN "$loopdev" | tr -d ' ')
cg_enter "$loopdev" "$RATE_MBS"
log "source $SHARED on $loopdev ($majmin), reads limited to $RATE_MBS MB/s for cgroup $CG"

# Check the throttle: one reader of one copy should see ~RATE_MBS.
drop_caches
check=$(LC_ALL=C dd if="$SHARED/baseline/node0/image" of=/dev/null bs=1M count=256 2>&1 | grep bytes)
log "throttle check (one reader, up to 256 MiB): $check"

# ---- variants (each sets RES="seconds,mount_s,incl_mount_s"; no subshell, so the EXIT
# trap always knows the group's pid) --------------------------------------------------------------------------
reader() {  # $1 file; optional nsenter prefix in the rest; prints nothing, fails loudly
  local f=$1; shift
  "$@" dd if="$f" of=/dev/null bs=1M status=none
}

run_baseline() {
  local t0 t1 pids=()
  drop_caches
  t0=$(now)
  for ((k = 0; k < NODES; k++)); do reader "$SHARED/baseline/node$k/image" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  t1=$(now)
  RES="$(elapsed "$t0" "$t1"),,,"
}

HZ=$(getconf CLK_TCK)
cpu_ticks() {  # utime+stime of the given pids (all threads), summed
  local p sum=0
  for p in "$@"; do sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
  echo "$sum"
}

run_stagefs() {  # $1 = disk|tmpfs, $2 = bin dir (default BIN)
  local base t0 tm t1 pids=() bin=${2:-$BIN}
  if [ "$1" = tmpfs ]; then base=$SHM; else base=$WORK; fi
  rm -rf "$WORK"/pid* "$base"/node*/cache
  mkdir -p "$base"
  drop_caches
  tm=$(now)
  timeout -k 5 600 mpirun --oversubscribe -np "$NODES" sh -c 'echo $$ > '"$WORK"'/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private '"$bin"'/stagefs '"$SHARED/stagefs $MNT"' --chunk-size '"$CHUNK"' --cache '"$base"'/node$OMPI_COMM_WORLD_RANK/cache' \
    2> "$WORK/group.$1.log" &
  group_pid=$!
  for ((k = 0; k < NODES; k++)); do
    for _ in $(seq 300); do [ -s "$WORK/pid$k" ] && break; sleep 0.1; done
    [ -s "$WORK/pid$k" ] || { log "rank $k did not start: $(tail -5 "$WORK/group.$1.log")"; return 1; }
  done
  on_node 0 "$bin/stagefs" --wait "$MNT" --wait-timeout 120 || { log "group not ready: $(tail -5 "$WORK/group.$1.log")"; return 1; }
  t0=$(now)
  local mount_s; mount_s=$(elapsed "$tm" "$t0")
  drop_caches
  local pidl=() c0 c1
  for ((k = 0; k < NODES; k++)); do pidl+=("$(cat "$WORK/pid$k")"); done
  c0=$(cpu_ticks "${pidl[@]}")
  t0=$(now)
  for ((k = 0; k < NODES; k++)); do reader "$MNT/image" nsenter -t "$(cat "$WORK/pid$k")" -m & pids+=($!); done
  local ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  t1=$(now)
  c1=$(cpu_ticks "${pidl[@]}")
  local mat
  mat=$(grep -o 'materialized image .*' "$WORK/group.$1.log" | head -1)
  stop_group
  [ $ok = 1 ] || { log "a reader failed: $(tail -5 "$WORK/group.$1.log")"; return 1; }
  log "  $mat"
  RES="$(elapsed "$t0" "$t1"),$mount_s,$(elapsed "$tm" "$t1"),$("$PY" -c "print(f'{($c1 - $c0) / $HZ:.2f}')")"
}

variants=(baseline)
for c in $CACHES; do variants+=("stagefs-$c"); [ -n "$BIN2" ] && variants+=("stagefs-$c@2"); done
raw_init "$NAME" "round,variant,loadavg,seconds,mount_s,incl_mount_s,daemons_cpu_s"
echo "# throttle check: $check" >> "$RAW"
# One run of a variant; a stagefs run that failed is retried once (said in the raw log).
run_variant() {
  case $1 in
    baseline) run_baseline ;;
    stagefs-*) c=${1#stagefs-}; b=$BIN; [[ $c == *@2 ]] && { c=${c%@2}; b=$BIN2; }
               run_stagefs "$c" "$b" || { log "retrying $1"; stop_group; LA="$LA retry"; run_stagefs "$c" "$b"; } ;;
  esac
}
rounds run_variant ",,," "${variants[@]}"

ratios=() targets=()
for c in $CACHES; do
  ratios+=(--ratio "baseline/stagefs-$c=baseline/stagefs-$c")
  [ -n "$BIN2" ] && ratios+=(--ratio "baseline/stagefs-$c@2=baseline/stagefs-$c@2")
done
bins="BIN=$BIN"; [ -n "$BIN2" ] && bins="$bins; @2 = BIN2=$BIN2"
"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric seconds --cols mount_s,incl_mount_s,daemons_cpu_s \
  --title "contended source ($RATE_MBS MB/s total): $NODES nodes read one $SIZE_MB MiB image; baseline (each node reads the source) vs stagefs" \
  "${ratios[@]}" \
  --note "seconds: from the moment the $NODES readers start until all finished (stagefs: includes the materialization). mount_s: mpirun start until \`stagefs --wait\` returned (not included in seconds); incl_mount_s: mpirun start until all readers finished. daemons_cpu_s: CPU-seconds (utime+stime, all threads) the $NODES stagefs daemons used while the readers ran (the machine has 2 vCPUs: compare with 2 x seconds). Ideal ratio with a source-bound baseline: $NODES. Chunk size $CHUNK. Throttle check: $check. Binaries: $bins."
