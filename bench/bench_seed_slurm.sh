#!/usr/bin/env bash
# bench_seed_slurm.sh: warm nodes seed cold ones, on NODES simulated Slurm nodes
# (tests/harness/simslurm.sh: one slurmd per node in its own mount namespace; the jobs are
# started with srun --mpi=pmix, as users start them). Run it under the cluster lock:
#   flock /var/tmp/stagefs-cluster.lock bench/bench_seed_slurm.sh
#
# The contended shared source: bench/throttlefs.c, a read-only FUSE passthrough of the directory
# holding the SIZE_MB image whose reads are limited to RATE MB/s in total, whatever the number
# of readers (a blkio/io.max cgroup would not apply to the tasks slurmd starts). One throttlefs
# mount per rate in RATES, plus an unthrottled one for the untimed warm-up jobs, all mounted on
# the host BEFORE the cluster starts, so every node's mount namespace holds them. direct_io: no
# node's page cache hides the rate. Built here with
#   cc -O2 -Wall -o THROTTLEFS bench/throttlefs.c $(pkg-config --cflags --libs fuse3) -lpthread
# The rate is checked from inside a node before the rounds (a dd through it on n2).
#
# Variants per round and rate R (interleaved):
#   sourceR        one read of the image from inside node 0 (n1), `cat image > /dev/null`
#                  through the R MB/s mount: the unit of the same round's ratios
#   bcastR-warmW   srun -N NODES stage-bcast --source (R MB/s)/image --dest /nvme/image; the
#                  W highest nodes' /nvme already holds a current copy (the same bytes, size
#                  and mtime: cp --preserve=timestamps from a local reference); wall time of
#                  srun (job allocation and MPI start-up included)
#   mountR-warmW   a NODES-node stagefs job (srun --mpi=pmix stagefs (R MB/s) /stage/mnt --cache
#                  /nvme/stagefs); the caches of the W highest nodes hold a valid copy that a
#                  previous W-node job on those nodes left there (its own first open, over the
#                  unthrottled view of the same files: same inodes, sizes and times); seconds:
#                  the first open on node 0 (n1, cold, the coordinator), `cat` of the whole file
#                  through the mount, from the open to the last byte (job start and stop not
#                  timed)
# Before each timed part, the pages of the underlying image and of every warm copy are dropped
# (POSIX_FADV_DONTNEED on those files), so a warm node reads its copy from its disk. After each
# run every node's copy is compared with the reference.
# Reported: seconds, ratio to the same round's source read, bytes read from the shared source
# and from seeds (stage-bcast's JSON report; node 0's user.stagefs.stats for the mount), who fed
# the transfer, and the file bytes throttlefs served during the run (its own counter: an
# independent count of the shared source's data reads).
#
# SET=jobs: job after job instead (results: NAME bench_warm_jobs), per round and rate R:
#   sourceR        the unit, as above
#   jobsR-warm2    the previous job on n3, n4 (2 of 4 warm); the 4-node job's first open of the
#                  image on EVERY node at once (cat on all four, the warm ones included, as a
#                  job's tasks do); seconds until the last node's cat ended
#   jobsR-warm4    the same with every node warm (no transfer: what the four nodes' own reads
#                  of their copies cost, CRC read-back included), for scale
#   seedfailR      the previous job on n4 only, then one bit of n4's copy flipped at half the
#                  file (its metadata kept: still current by its origin, not by its recorded
#                  chunk CRCs); the 4-node job's first open on n1 (cat): the seed feeds half the
#                  file, fails its proof there, and the source feeds the transfer again
#   ttfb-{head,tail}-{seeded,source}[-BIN2]  the cost to the first byte of a read during the
#                  copy: the time of open + a 4 KiB read at the file's start (head) or end
#                  (tail) on n1, in the first open of a fresh 4-node job; seeded: n4 warm (a
#                  previous job); source: no node warm. With BIN2 (a build of the code before
#                  the chunk proofs) the seeded pair again with that build, for both jobs
#
# Env: SIZE_MB (256) RATES ("10 50"; SET=jobs: "10") RUNS (5, lib.sh) CHUNK (16M)
#      NAME (bench_seed_slurm) SET (warm | jobs) BIN2 SIMSLURM_ROOT WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SIZE_MB=${SIZE_MB:-256}
NODES=4
SET=${SET:-warm}
[[ $SET == warm || $SET == jobs ]] || die "SET must be warm or jobs"
RATES=${RATES:-$([ "$SET" = jobs ] && echo 10 || echo 10 50)}
CHUNK=${CHUNK:-16M}
NAME=${NAME:-$([ "$SET" = jobs ] && echo bench_warm_jobs || echo bench_seed_slurm)}
WORK=$WORK_ROOT/seed-slurm  # under /var/tmp: every simulated node sees it
SHARED=$WORK/shared         # the shared storage's files, behind the throttlefs mounts
MNT=/stage/mnt              # the stagefs mount point inside every node
FAST=100000                 # the warm-up jobs' view: a passthrough, in effect unthrottled

# the throttlefs mount of rate $1 (MB/s)
src_of() { echo "$WORK/src-$1"; }
# node K (0-based, = srun rank K) is the simulated node n$((K+1)); its /nvme on the host
nvme_of() { echo "$SROOT/nodes/n$(($1 + 1))/nvme"; }

group_pid=
cleanup() {
  set +e
  stop_group
  simslurm_end
  local r mounts=()
  for r in $RATES $FAST; do mounts+=("$(src_of "$r")"); done
  throttlefs_stop "${mounts[@]}"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ $SET == jobs ]] || need_bin stage-bcast
need_bin stagefs
mkdir -p "$WORK"
need_space $(( (SIZE_MB * (2 * NODES + 3) + 1023) / 1024 ))

throttlefs_build
make_random_file "$WORK/ref/image" "$SIZE_MB"
mkdir -p "$SHARED"
cp --preserve=timestamps "$WORK/ref/image" "$SHARED/image"
sync

# The throttlefs mounts first, then the cluster: the nodes' namespaces are copies of the host's.
for r in $RATES $FAST; do throttlefs_start "$r" "$SHARED" "$(src_of "$r")"; done
simslurm_begin "$NODES"
for ((k = 0; k < NODES; k++)); do mkdir -p "$SROOT/nodes/n$((k + 1))/stage/mnt"; done

# served_bytes RATE: the file bytes that throttlefs mount has served so far
served_bytes() { throttlefs_bytes "$(src_of "$1")"; }

# The rate as a node sees it (a dd on n2, through its namespace).
for r in $RATES; do throttle_check "$r" "$(src_of "$r")/image"; done

# the image's pages and those of the given nodes' copies (relative path under their /nvme)
evict_all() {
  local rel=$1 k
  shift
  evict_pages "$SHARED/image"
  for k in "$@"; do evict_pages "$(nvme_of "$k")/$rel"; done
}

# every node's copy (path under its /nvme) equals the reference
all_copies_equal() {
  local k
  for ((k = 0; k < NODES; k++)); do
    cmp -s "$WORK/ref/image" "$(nvme_of "$k")/$1" || { log "n$((k + 1)): $1 differs"; return 1; }
  done
}

run_source() {  # $1: rate
  local before
  before=$(served_bytes "$1")
  evict_pages "$SHARED/image"
  timed on_node 0 sh -c 'cat "$1" > /dev/null' sh "$(src_of "$1")/image" || return
  RES="$SECS,$((SIZE_MB << 20)),0,source,$(($(served_bytes "$1") - before))"
}

run_bcast() {  # $1: rate, $2: how many nodes (the highest) hold a current copy
  local rate=$1 w=$2 k warm=() before f bsrc bseed frank ffrom
  for ((k = 0; k < NODES; k++)); do
    rm -f "$(nvme_of "$k")/image"
    if ((k >= NODES - w)); then
      cp --preserve=timestamps "$WORK/ref/image" "$(nvme_of "$k")/image"
      warm+=("$k")
    fi
  done
  sync
  evict_all image "${warm[@]}"
  before=$(served_bytes "$rate")
  timed timeout -k 10 900 srun -N"$NODES" --ntasks-per-node=1 --mpi=pmix "$BIN/stage-bcast" --json \
    --chunk-size "$CHUNK" --source "$(src_of "$rate")/image" --dest /nvme/image < /dev/null > "$WORK/bcast.out" 2>&1 ||
    { log "stage-bcast failed: $(tail -5 "$WORK/bcast.out")"; return 1; }
  all_copies_equal image || return 1
  f=$(bcast_report_fields < "$WORK/bcast.out") || return 1
  # bytes_read_source,bytes_read_seed,fed_by_rank,fed_from -> bytes_from_source,bytes_from_seeds,fed_by
  IFS=, read -r bsrc bseed frank ffrom <<< "$f"
  RES="$SECS,$bsrc,$bseed,${ffrom}_rank_$frank,$(($(served_bytes "$rate") - before))"
}

# start_mount SRC FIRST NODES_N LOG [BINDIR]: a stagefs job over SRC on the simulated nodes
# n$((FIRST+1)) .. n$((FIRST+NODES_N)); returns once the group answers on node FIRST. No profile:
# what is measured is the opens' path, not a replay of the last job's reads.
start_mount() {
  local src=$1 first=$2 n=$3 log=$4 bin=${5:-$BIN}
  timeout -k 10 900 srun -N"$n" -w "n[$((first + 1))-$((first + n))]" --ntasks-per-node=1 --mpi=pmix \
    "$bin/stagefs" "$src" "$MNT" --chunk-size "$CHUNK" --profile off --cache /nvme/stagefs < /dev/null > "$log" 2>&1 &
  group_pid=$!
  on_node "$first" "$BIN/stagefs" --wait "$MNT" --wait-timeout 120 ||
    { log "stagefs job not ready: $(tail -5 "$log")"; stop_group "$first"; return 1; }
}

# previous_job W [BINDIR]: empty caches everywhere, then a W-node job on the W highest nodes
# whose first open fills their caches (over the unthrottled view); WARM lists those nodes.
previous_job() {
  local w=$1 bin=${2:-$BIN} k
  WARM=()
  for ((k = 0; k < NODES; k++)); do
    on_node "$k" mountpoint -q "$MNT" && on_node "$k" umount -l "$MNT"  # a failed run's stale mount
    rm -rf "$(nvme_of "$k")/stagefs"
  done
  ((w > 0)) || return 0
  start_mount "$(src_of "$FAST")" $((NODES - w)) "$w" "$WORK/previous.log" "$bin" || return 1
  on_node $((NODES - w)) sh -c 'cat "$1" > /dev/null' sh "$MNT/image" || { stop_group $((NODES - w)); return 1; }
  wait_materialized "$WORK/previous.log" image
  stop_group $((NODES - w))
  for ((k = NODES - w; k < NODES; k++)); do
    cmp -s "$WORK/ref/image" "$(nvme_of "$k")/stagefs/data/image" || { log "previous job: n$((k + 1))'s copy differs"; return 1; }
    WARM+=("$k")
  done
}

run_mount() {  # $1: rate, $2: how many caches (the highest nodes) hold a valid copy
  local rate=$1 w=$2 k before stats
  previous_job "$w" || return 1
  sync
  evict_all stagefs/data/image "${WARM[@]}"
  start_mount "$(src_of "$rate")" 0 "$NODES" "$WORK/mount.log" || return 1
  before=$(served_bytes "$rate")
  timed on_node 0 sh -c 'cat "$1" > /dev/null' sh "$MNT/image" || { stop_group; return 1; }
  wait_materialized "$WORK/mount.log" image
  stats=$(on_node 0 getfattr --absolute-names --only-values -n user.stagefs.stats "$MNT")
  stop_group
  all_copies_equal stagefs/data/image || return 1
  RES="$SECS,$(stats_source_fields <<< "$stats"),$FED,$(($(served_bytes "$rate") - before))"
}

# node_stat K KEY: KEY of node K's user.stagefs.stats
node_stat() {
  on_node "$1" getfattr --absolute-names --only-values -n user.stagefs.stats "$MNT" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$2"
}

run_jobs() {  # $1: rate, $2: warm caches (the highest nodes): the first open on every node at once
  local rate=$1 w=$2 k before stats pids=() bad=0
  previous_job "$w" || return 1
  sync
  evict_all stagefs/data/image "${WARM[@]}"
  start_mount "$(src_of "$rate")" 0 "$NODES" "$WORK/mount.log" || return 1
  for ((k = 0; k < NODES; k++)); do on_node "$k" "$BIN/stagefs" --wait "$MNT" --wait-timeout 60 || return 1; done
  before=$(served_bytes "$rate")
  local t0 t1
  t0=$(now)
  for ((k = 0; k < NODES; k++)); do
    on_node "$k" sh -c 'cat "$1" > /dev/null' sh "$MNT/image" 2>>"$WORK/jobs.err" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || bad=1; done
  t1=$(now)
  ((bad == 0)) || { log "a first open failed: $(tail -3 "$WORK/jobs.err")"; stop_group; return 1; }
  SECS=$(elapsed "$t0" "$t1")
  wait_materialized "$WORK/mount.log" image
  stats=$(on_node 0 getfattr --absolute-names --only-values -n user.stagefs.stats "$MNT")
  local retries
  retries=$(node_stat 0 feed_retries)
  stop_group
  all_copies_equal stagefs/data/image || return 1
  RES="$SECS,$(stats_source_fields <<< "$stats"),$FED,$(($(served_bytes "$rate") - before)),$retries"
}

# flip_bit PATH OFFSET: one bit of a copy flipped on its disk, its times kept (still current by
# its origin; not by the chunk CRCs it recorded)
flip_bit() {
  "$PY" -c 'import os,sys
p, off = sys.argv[1], int(sys.argv[2]); st = os.stat(p)
with open(p, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x10]))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))' "$1" "$2"
}

run_seedfail() {  # $1: rate: the only warm node's copy fails its proof at half the file
  local rate=$1 before stats retries
  previous_job 1 || return 1
  flip_bit "$(nvme_of 3)/stagefs/data/image" $((SIZE_MB << 19))
  sync
  evict_all stagefs/data/image 3
  start_mount "$(src_of "$rate")" 0 "$NODES" "$WORK/mount.log" || return 1
  before=$(served_bytes "$rate")
  timed on_node 0 sh -c 'cat "$1" > /dev/null' sh "$MNT/image" || { stop_group; return 1; }
  wait_materialized "$WORK/mount.log" image
  stats=$(on_node 0 getfattr --absolute-names --only-values -n user.stagefs.stats "$MNT")
  retries=$(node_stat 0 feed_retries)
  stop_group
  all_copies_equal stagefs/data/image || return 1
  [[ $retries == 1 ]] || { log "seedfail: feed_retries=$retries, expected 1"; return 1; }
  RES="$SECS,$(stats_source_fields <<< "$stats"),$FED,$(($(served_bytes "$rate") - before)),$retries"
}

# run_ttfb RATE head|tail seeded|source [BINDIR]: open + one 4 KiB read during the copy, on n1
run_ttfb() {
  local rate=$1 where=$2 kind=$3 bin=${4:-$BIN} off
  previous_job "$([ "$kind" = seeded ] && echo 1 || echo 0)" "$bin" || return 1
  sync
  evict_all stagefs/data/image "${WARM[@]}"
  start_mount "$(src_of "$rate")" 0 "$NODES" "$WORK/mount.log" "$bin" || return 1
  off=$([ "$where" = head ] && echo 0 || echo $(((SIZE_MB << 20) - 4096)))
  SECS=$(on_node 0 "$PY" -c 'import os,sys,time
t = time.monotonic(); fd = os.open(sys.argv[1], os.O_RDONLY); n = len(os.pread(fd, 4096, int(sys.argv[2])))
print("%.4f" % (time.monotonic() - t)) if n == 4096 else sys.exit(1)' "$MNT/image" "$off") || { stop_group; return 1; }
  wait_materialized "$WORK/mount.log" image
  stop_group
  all_copies_equal stagefs/data/image || return 1
  RES="$SECS,,,$FED,,"
}

seed_run() {
  local v=$1
  case $v in
    source*) run_source "${v#source}" ;;
    bcast*) v=${v#bcast}; run_bcast "${v%%-*}" "${v##*warm}" ;;
    mount*) v=${v#mount}; run_mount "${v%%-*}" "${v##*warm}" ;;
    jobs*) v=${v#jobs}; run_jobs "${v%%-*}" "${v##*warm}" ;;
    seedfail*) run_seedfail "${v#seedfail}" ;;
    ttfb-*) IFS=- read -r _ where kind b2 <<< "$v"; run_ttfb "${RATES%% *}" "$where" "$kind" ${b2:+"$BIN2"} ;;
  esac
}

if [[ $SET == jobs ]]; then
  r=${RATES%% *}
  [ -z "${BIN2:-}" ] || [ -x "$BIN2/stagefs" ] || die "no $BIN2/stagefs"
  variants=("source$r" "jobs$r-warm2" "jobs$r-warm4" "seedfail$r" ttfb-head-seeded ttfb-tail-seeded ttfb-head-source ttfb-tail-source)
  [ -z "${BIN2:-}" ] || variants+=(ttfb-head-seeded-main ttfb-tail-seeded-main)
  raw_init "$NAME" "round,variant,loadavg,seconds,bytes_from_source,bytes_from_seeds,fed_by,throttlefs_bytes,feed_retries"
  rounds seed_run ",,,,," "${variants[@]}"
  rm -f "$MD"
  common="Source: throttlefs at $r MB/s (measured from inside n2 before the rounds: $(awk -v r="$r" '$1 == r {print $2}' "$WORK/rate-check") MB/s); source$r: cat of the image through it on n1 (the unit). Warm copies' and the image's pages evicted before each run; every node's copy compared with the reference after each run. Chunk size $CHUNK. bytes_from_source / bytes_from_seeds / feed_retries: n1's user.stagefs.stats; throttlefs_bytes (raw CSV): the file bytes the throttled mount served during the run."
  "$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric seconds --cols bytes_from_source,bytes_from_seeds,throttlefs_bytes,feed_retries \
    --title "job after job on $NODES simulated Slurm nodes, one $SIZE_MB MiB image from a $r MB/s source" \
    --only "source$r,jobs$r-warm2,jobs$r-warm4,seedfail$r" \
    --ratio "jobs$r-warm2/source$r=jobs$r-warm2/source$r" --target "jobs$r-warm2/source$r<=0.3" \
    --ratio "jobs$r-warm4/source$r=jobs$r-warm4/source$r" \
    --ratio "seedfail$r/source$r=seedfail$r/source$r" --target "seedfail$r/source$r<=1.3" \
    --note "jobs$r-warm2: a previous 2-node job on n3, n4 filled their caches; then a $NODES-node job whose every node (the warm ones too) cats the image at once, its first open; seconds until the last cat ended. jobs$r-warm4: the same with every node warm (no transfer; each node reads its copy back for its CRC, then cats it): the cost of the nodes' own reads on this machine. seedfail$r: a previous job on n4 only; then one bit of n4's copy flipped at half the file, its times kept; the $NODES-node job's cat on n1: n4 feeds half the file, its proof fails there, the source feeds the transfer again within the same open. $common"
  ttfb=(ttfb-head-seeded ttfb-tail-seeded ttfb-head-source ttfb-tail-source)
  ratios=(--ratio "head: seeded/source=ttfb-head-seeded/ttfb-head-source" --ratio "tail: seeded/source=ttfb-tail-seeded/ttfb-tail-source")
  if [ -n "${BIN2:-}" ]; then
    ttfb+=(ttfb-head-seeded-main ttfb-tail-seeded-main)
    ratios+=(--ratio "head: seeded, proven/before the proofs=ttfb-head-seeded/ttfb-head-seeded-main"
      --ratio "tail: seeded, proven/before the proofs=ttfb-tail-seeded/ttfb-tail-seeded-main")
  fi
  "$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric seconds --append --only "$(IFS=,; echo "${ttfb[*]}")" \
    --title "the cost to the first byte of a read during the copy (open + 4 KiB), on n1" "${ratios[@]}" \
    --note "ttfb-WHERE-KIND: a fresh $NODES-node job whose first open of the image is n1's open + one 4 KiB read at its start (head) or its last 4 KiB (tail), the copy still running; seeded: n4 warm (a previous job), its chunks proven against their recorded CRCs before they are sent; source: no node warm (the $r MB/s source feeds). -main: the seeded pair with BIN2, the code before the chunk proofs, for both jobs. $common"
  exit 0
fi

variants=()
for r in $RATES; do
  variants+=("source$r" $(seed_warm_variants "bcast$r-") $(seed_warm_variants "mount$r-"))
done
raw_init "$NAME" "round,variant,loadavg,seconds,bytes_from_source,bytes_from_seeds,fed_by,throttlefs_bytes"
rounds seed_run ",,,," "${variants[@]}"

rm -f "$MD"
for r in $RATES; do
  target=$([ "$r" = 10 ] && echo 0.3 || true)  # the target is set at 10 MB/s
  common="Source: throttlefs at $r MB/s (measured from inside n2 before the rounds: $(awk -v r="$r" '$1 == r {print $2}' "$WORK/rate-check") MB/s); source$r: cat of the image through it on n1 (the unit). throttlefs_bytes (raw CSV): the file bytes the throttled mount served during the run. Warm copies' and the image's pages evicted before each run; every node's copy compared with the reference after each run. Chunk size $CHUNK."
  seed_summarize "bcast$r-" "source$r" "$target" bytes_from_source,bytes_from_seeds \
    "stage-bcast on $NODES simulated Slurm nodes, one $SIZE_MB MiB image from a $r MB/s source, 0..$((NODES - 1)) nodes warm" \
    "bcast$r-warmW: srun -N$NODES --mpi=pmix stage-bcast, the W highest nodes (n$NODES down) hold a current copy at the dest; wall time of srun. bytes_from_source / bytes_from_seeds: stage-bcast's JSON (bytes_read_source / bytes_read_seed). $common" \
    --append --only "source$r,$(seed_warm_variants "bcast$r-" | paste -sd,)"
  seed_summarize "mount$r-" "source$r" "$target" bytes_from_source,bytes_from_seeds \
    "the mount on $NODES simulated Slurm nodes, a first open of one $SIZE_MB MiB image from a $r MB/s source, 0..$((NODES - 1)) caches warm" \
    "mount$r-warmW: a $NODES-node stagefs job; the caches of the W highest nodes hold the copy a previous W-node job left; seconds: cat of the whole file through the mount on n1 (cold, the coordinator), job start and stop not timed. bytes_from_source / bytes_from_seeds: n1's user.stagefs.stats. $common" \
    --append --only "source$r,$(seed_warm_variants "mount$r-" | paste -sd,)"
done
