# Shared helpers for the bench/ scripts (sourced, not run). Bash, no dependencies beyond
# coreutils, Open MPI's mpirun and python3 (stdlib only, for medians and tables).
#
# Every script:
#   - records one CSV line per timed run in bench/results/<name>.raw.csv, with
#     /proc/loadavg taken at the start of that run (the machine is shared and noisy);
#   - interleaves the compared variants (A B C A B C ...) so background noise hits all alike;
#   - reports medians and ratios (ratio of medians, and the median of the per-round ratios)
#     in a table on stdout and in bench/results/<name>.md.
#
# Environment (all optional):
#   TOP        the repository (default: the parent of bench/)
#   BIN        directory holding stage-bcast and stagefs (default: <repo>/build/tools)
#   WORK_ROOT  scratch directory (default /var/tmp/stagefs-bench); each script uses a subdir
#   RESULTS    where the tables go (default <repo>/bench/results)
#   RUNS       timed runs per variant (default 5)

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=${TOP:-$(dirname "$BENCH_DIR")}   # the repository (BIN and the git revision in the raw logs)
BIN=${BIN:-$TOP/build/tools}
WORK_ROOT=${WORK_ROOT:-/var/tmp/stagefs-bench}
RESULTS=${RESULTS:-$BENCH_DIR/results}
RUNS=${RUNS:-5}
PY=${PY:-$(command -v /usr/bin/python3 || command -v python3)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo

now() { date +%s.%N; }
elapsed() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

# need_bin NAME: $BIN/NAME must exist, and $BIN2/NAME when BIN2 (a build to A/B) is set.
need_bin() {
  [ -x "$BIN/$1" ] || die "no $BIN/$1 (build first: make -C build -j2)"
  [ -z "${BIN2:-}" ] || [ -x "$BIN2/$1" ] || die "no $BIN2/$1"
}

need_root() { [ "$(id -u)" = 0 ] || die "run as root (drop_caches, mounts, namespaces)"; }

# A file of random bytes of $2 MiB at $1, reused when it is already there with that size.
make_random_file() {
  local path=$1 mib=$2
  if [ -f "$path" ] && [ "$(stat -c %s "$path")" = $((mib << 20)) ]; then return; fi
  mkdir -p "$(dirname "$path")"
  log "generating $mib MiB of random data in $path"
  # openssl's AES-CTR stream is much faster than /dev/urandom when available
  if command -v openssl >/dev/null; then
    openssl enc -aes-128-ctr -nosalt -pass pass:stagefs-bench -in /dev/zero 2>/dev/null |
      head -c $((mib << 20)) > "$path.tmp" || true  # openssl dies of SIGPIPE: expected
  else
    head -c $((mib << 20)) /dev/urandom > "$path.tmp"
  fi
  [ "$(stat -c %s "$path.tmp")" = $((mib << 20)) ] || die "could not generate $path"
  mv "$path.tmp" "$path"
  sync
}

# raw_init NAME HEADER: starts bench/results/NAME.raw.csv with a header line.
raw_init() {
  mkdir -p "$RESULTS"
  RAW=$RESULTS/$1.raw.csv
  MD=$RESULTS/$1.md
  {
    echo "# $1 $(date -Is) host=$(hostname) kernel=$(uname -r) nproc=$(nproc) git=$(git -C "$TOP" rev-parse --short HEAD 2>/dev/null)$(git -C "$TOP" diff --quiet 2>/dev/null || echo +dirty)"
    echo "$2"
  } > "$RAW"
}
raw() { echo "$*" >> "$RAW"; log "raw: $*"; }

# --- rounds: every script's timed runs ----------------------------------------------------
# rounds [--alternate] RUN EMPTY VARIANT...: RUNS rounds of the VARIANTs, interleaved (A B C
# A B C ...; --alternate: A B C, C B A, ...: none goes first every time), so background noise
# hits all alike. Each run is `RUN VARIANT ROUND`, which sets RES (the CSV fields after
# round,variant,loadavg) or fails: EMPTY is recorded instead. LA is the load average taken at
# the run's start; RUN may add to it (a retry says so: LA="$LA retry").
rounds() {
  local alternate=0 run empty r v order
  [ "$1" = --alternate ] && { alternate=1; shift; }
  run=$1 empty=$2
  shift 2
  for ((r = 1; r <= RUNS; r++)); do
    order=("$@")
    # shellcheck disable=SC2207  # round_order prints the variants space-separated
    ((alternate)) && order=($(round_order "$r" "$@"))
    for v in "${order[@]}"; do
      LA=$(loadavg)
      RES=
      "$run" "$v" "$r" || RES=$empty
      raw "$r,$v,$LA,$RES"
    done
  done
}

# round_order ROUND VARIANT...: the VARIANTs in their order in odd rounds, reversed in even
# ones (A B, B A, ...: neither goes first every time), space-separated.
round_order() {
  local r=$1 out=() i
  shift
  if ((r % 2)); then out=("$@"); else for ((i = $#; i >= 1; i--)); do out+=("${!i}"); done; fi
  echo "${out[*]}"
}

# Free space sanity check: $1 = GiB needed under WORK_ROOT.
need_space() {
  local avail_kb
  avail_kb=$(df -Pk "$WORK_ROOT" | awk 'NR==2 {print $4}')
  [ "$avail_kb" -gt $(( $1 * 1024 * 1024 + 5 * 1024 * 1024 )) ] || die "need $1 GiB (+5 GiB margin) free under $WORK_ROOT"
}

# Kill a process group we started (by pid), politely then firmly.
kill_tree() {
  local pid=$1
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# A mount group started by a script (mpirun, each rank `echo $$ > $WORK/pid<rank>` then
# `unshare -m` + stagefs at $MNT; or srun on a simulated Slurm cluster, $WORK/pid<K> holding
# the pid of node K's slurmd): on_node K CMD runs CMD in node K's mount namespace;
# stop_group [K] unmounts $MNT on node K (default 0, a node of the group: one unmount stops
# the whole group) and ends $group_pid (mpirun or srun), given STOP_WAIT seconds (15) to end.
on_node() { local k=$1; shift; nsenter -t "$(cat "$WORK/pid$k")" -m "$@"; }
stop_group() {
  [ -n "${group_pid:-}" ] || return 0
  if kill -0 "$group_pid" 2>/dev/null; then
    on_node "${1:-0}" fusermount3 -u "$MNT" 2>/dev/null
    for _ in $(seq $((${STOP_WAIT:-15} * 10))); do kill -0 "$group_pid" 2>/dev/null || break; sleep 0.1; done
    kill_tree "$group_pid"
  fi
  wait "$group_pid" 2>/dev/null
  group_pid=
}

# Drops one file's pages from the page cache (POSIX_FADV_DONTNEED; no global drop_caches).
evict_pages() { "$PY" -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"; }

# cg_enter DEV MBS: this shell and every process it starts from now on read block device DEV
# at most MBS MB/s in total (a blkio cgroup: v1 blkio.throttle.read_bps_device, or v2 io.max
# rbps; its path in CG). cg_leave moves everyone back out and removes the cgroup.
CG=
cg_enter() {
  local majmin rate
  majmin=$(lsblk -dno MAJ:MIN "$1" | tr -d ' ')
  rate=$(($2 * 1000 * 1000))
  if [ -d /sys/fs/cgroup/blkio ]; then           # cgroup v1 (this VM)
    CG=/sys/fs/cgroup/blkio/stagefs-bench.$$
    mkdir -p "$CG"
    echo "$majmin $rate" > "$CG/blkio.throttle.read_bps_device"
  else                                          # cgroup v2
    CG=/sys/fs/cgroup/stagefs-bench.$$
    echo +io > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    mkdir -p "$CG"
    echo "$majmin rbps=$rate" > "$CG/io.max"
  fi
  echo $$ > "$CG/cgroup.procs"
}
cg_leave() {
  [ -n "$CG" ] && [ -d "$CG" ] || return 0
  echo $$ > "$(dirname "$CG")/cgroup.procs" 2>/dev/null
  for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do echo "$p" > "$(dirname "$CG")/cgroup.procs" 2>/dev/null; done
  rmdir "$CG" 2>/dev/null
  CG=
}

# The EXIT trap of a script with one standalone mount: unmounts $MNT, ends $daemon_pid and
# removes $WORK (kept with KEEP=1).
standalone_cleanup() {
  set +e
  unmount_if "$MNT"
  [ -n "${daemon_pid:-}" ] && kill_tree "$daemon_pid"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}

# Unmount $1 if it is a mount point in the current namespace.
unmount_if() {
  mountpoint -q "$1" 2>/dev/null || return 0
  fusermount3 -u "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
}

# Users of one standalone mount at $MNT (bench_fair.sh, bench_sparse.sh): a command as uid $1,
# the mount's status attribute, one timed read, and a wait for a transfer in flight.
as_user() { setpriv --reuid="$1" --regid="$1" --clear-groups -- "${@:2}"; }
status() { getfattr --only-values -n user.stagefs.status "$MNT" 2>/dev/null || true; }
timed_cat() {  # seconds of one `cat FILE > /dev/null` as uid $1
  local t0 t1
  t0=$(now)
  as_user "$1" cat "$2" > /dev/null
  t1=$(now)
  elapsed "$t0" "$t1"
}
wait_in_flight() {  # until the status names a transfer of $1, or process $2 ended (at most ${3:-60} s)
  for _ in $(seq $((${3:-60} * 20))); do
    status | grep -q "\"path\":\"$1" && return 0
    kill -0 "$2" 2>/dev/null || return 0
    sleep 0.05
  done
  die "no transfer of $1 in flight: $(status)"
}

# --- the netns benches (bench_scale.sh, bench_hol_scale.sh) ---------------------------------
# netns_bench_begin TAG TMPFS_MB NET: the cluster's root (NETNS_SIM_ROOT, ROOT) on a tmpfs of
# its own at WORK_ROOT/TAG-ram (RAM=1, the default: simulated nodes share one real disk,
# whose fsyncs would be measured instead of the network) or /var/tmp/stagefs-TAG; the address
# range NETNS_SIM_NET (default NET); H, the harness; LOG (LOGDIR or WORK_ROOT/TAG-logs). At
# exit, netns_bench_end kills the process trees whose pids the variables named in
# NETNS_BENCH_PIDS hold, takes the cluster down and unmounts the tmpfs.
netns_bench_begin() {
  local tag=$1 mb=$2 net=$3
  command -v ip >/dev/null && command -v tc >/dev/null || die "needs ip and tc"
  RAM=${RAM:-1}
  RAMDIR=$WORK_ROOT/$tag-ram
  if [ "$RAM" = 1 ]; then
    mkdir -p "$RAMDIR"
    mountpoint -q "$RAMDIR" || mount -t tmpfs -o size="${mb}m" "stagefs-$tag" "$RAMDIR"
    export NETNS_SIM_ROOT=${NETNS_SIM_ROOT:-$RAMDIR/netns}
  else
    export NETNS_SIM_ROOT=${NETNS_SIM_ROOT:-/var/tmp/stagefs-$tag}
  fi
  export NETNS_SIM_NET=${NETNS_SIM_NET:-$net}
  ROOT=${NETNS_SIM_ROOT%/}
  H=$TOP/tests/harness/netns-cluster.sh
  LOG=${LOGDIR:-$WORK_ROOT/$tag-logs}
  trap netns_bench_end EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$LOG"
  : >"$LOG/harness.log"
  "$H" down >>"$LOG/harness.log" 2>&1 || true
}
netns_bench_end() {
  set +e
  local v
  for v in ${NETNS_BENCH_PIDS:-}; do [ -n "${!v}" ] && kill_tree "${!v}"; done
  "$H" down >>"$LOG/harness.log" 2>&1
  [ "$RAM" = 1 ] && mountpoint -q "$RAMDIR" && umount "$RAMDIR"
}

# --- the seed benches (bench_seed.sh, bench_seed_mount.sh, bench_seed_slurm.sh) -------------
# Warm nodes seed cold ones: per round, one read of the contended source (the unit), then the
# same job with 0..NODES-1 warm nodes.

# loop_source_begin DIR SIZE_MB: a contended source's filesystem: ext4 on a loop device (direct
# I/O, so cg_enter "$LOOPDEV" can throttle its reads), its image file $WORK/shared.img, mounted
# at DIR. loop_source_end (in the EXIT trap) unmounts it and detaches the device.
LOOPDEV=
loop_source_begin() {
  LOOP_DIR=$1
  log "building the shared source: ext4 on a loop device"
  mkdir -p "$LOOP_DIR"
  truncate -s $(($2 + 256))M "$WORK/shared.img"
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/shared.img"
  LOOPDEV=$(losetup --direct-io=on -f --show "$WORK/shared.img")
  mount "$LOOPDEV" "$LOOP_DIR"
}
loop_source_end() {
  [ -n "${LOOP_DIR:-}" ] && mountpoint -q "$LOOP_DIR" && umount "$LOOP_DIR"
  [ -n "$LOOPDEV" ] && losetup -d "$LOOPDEV"
  LOOPDEV=
}

# timed CMD...: runs CMD; SECS is its wall time.
timed() {
  local t0 t1
  t0=$(now)
  "$@" || return
  t1=$(now)
  SECS=$(elapsed "$t0" "$t1")
}

# seed_warm_variants PREFIX: PREFIXwarm0 .. PREFIXwarm$((NODES-1)), one a line.
seed_warm_variants() { local w; for ((w = 0; w < NODES; w++)); do echo "${1}warm$w"; done; }

# seed_summarize PREFIX UNIT TARGET COLS TITLE NOTE [summarize.py options]: the table of the
# variants PREFIXwarmW in seconds, each as a ratio to the same round's UNIT; with TARGET, the
# ratio with any node warm is marked against <= TARGET.
seed_summarize() {
  local prefix=$1 unit=$2 target=$3 cols=$4 title=$5 note=$6 w
  shift 6
  local ratios=()
  for ((w = 0; w < NODES; w++)); do ratios+=(--ratio "${prefix}warm$w/$unit=${prefix}warm$w/$unit"); done
  if [ -n "$target" ]; then
    for ((w = 1; w < NODES; w++)); do ratios+=(--target "${prefix}warm$w/$unit<=$target"); done
  fi
  "$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric seconds --cols "$cols" --title "$title" \
    "${ratios[@]}" --note "$note" "$@"
}

# bcast_report_fields < OUTPUT: from stage-bcast --json's output (its JSON report line among
# any others), "bytes_read_source,bytes_read_seed,fed_by_rank,fed_from".
bcast_report_fields() {
  "$PY" -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.startswith("{") and "\"fed_from\"" in l][-1]
print("%d,%d,%d,%s" % (r["bytes_read_source"], r["bytes_read_seed"], r["fed_by_rank"], r["fed_from"]))'
}

# stats_source_fields <<< STATS: from a mount's user.stagefs.stats (JSON),
# "bytes_from_source,bytes_from_seeds".
stats_source_fields() {
  "$PY" -c 'import json,sys; s=json.load(sys.stdin); print("%d,%d" % (s["bytes_from_source"], s["bytes_from_seeds"]))'
}

# wait_materialized LOG NAME: waits (up to 60 s) for a mount group's log line saying NAME is
# materialized; FED is who fed that transfer ("rank_N" or "the_source", empty if not logged).
wait_materialized() {
  for _ in $(seq 600); do grep -q "materialized $2" "$1" && break; sleep 0.1; done
  FED=$(grep -o 'fed by rank [0-9]*\|fed by the source' "$1" | head -1 | sed 's/fed by //; s/ /_/g')
}

# --- the simulated Slurm benches (bench_seed_slurm.sh, bench_profile.sh) --------------------
# A contended shared source seen by every simulated node: throttlefs (bench/throttlefs.c, a
# read-only FUSE passthrough whose reads share one rate) mounted on the host BEFORE the cluster
# starts, so every node's mount namespace (a copy of the host's) holds it.

# throttlefs_build: $WORK/throttlefs from bench/throttlefs.c
throttlefs_build() {
  pkg-config --exists fuse3 || die "needs libfuse3-dev (throttlefs)"
  # shellcheck disable=SC2046  # pkg-config's flags are words
  cc -O2 -Wall -o "$WORK/throttlefs" "$BENCH_DIR/throttlefs.c" $(pkg-config --cflags --libs fuse3) -lpthread
}

# throttlefs_start RATE SRCDIR MOUNTPOINT: SRCDIR at MOUNTPOINT, reads at RATE MB/s in total;
# its pid joins throttle_pids. throttlefs_stop MOUNTPOINT... unmounts them and ends those pids.
throttle_pids=()
throttlefs_start() {
  mkdir -p "$3"
  "$WORK/throttlefs" "$1" "$2" "$3" -f 2>>"$WORK/throttlefs.log" &
  throttle_pids+=($!)
  for _ in $(seq 100); do mountpoint -q "$3" && return 0; sleep 0.1; done
  die "throttlefs did not mount: $(tail -3 "$WORK/throttlefs.log")"
}
throttlefs_stop() {
  local m p
  for m in "$@"; do unmount_if "$m"; done
  for p in "${throttle_pids[@]}"; do kill_tree "$p"; done
  throttle_pids=()
}

# throttlefs_bytes MOUNTPOINT: the file bytes that throttlefs mount has served so far
throttlefs_bytes() { getfattr --absolute-names --only-values -n user.throttlefs.bytes_read "$1"; }

# throttle_check RATE FILE: reads 32 MB (64 MB at 50 MB/s and more, at most the file) of FILE
# on node 1 (n2) through its namespace; SEEN is the rate it got (MB/s), also appended as
# "RATE SEEN" to $WORK/rate-check. Dies when the throttle lets more than 1.15x RATE through.
throttle_check() {
  local rate=$1 file=$2 mb size_mb
  mb=$((rate >= 50 ? 64 : 32))
  size_mb=$(($(stat -c %s "$file") >> 20))
  mb=$((mb < size_mb ? mb : size_mb))
  timed on_node 1 dd if="$file" of=/dev/null bs=1M count="$mb" status=none ||
    die "cannot read the source from inside a node"
  SEEN=$("$PY" -c "import sys; print(f'{$mb * 1048576 / 1e6 / float(sys.argv[1]):.1f}')" "$SECS")
  log "throttle check: $mb MiB through the $rate MB/s mount from inside n2 in $SECS s: $SEEN MB/s"
  echo "$rate $SEEN" >> "$WORK/rate-check"
  "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 1.15 * $rate else 1)" "$SEEN" ||
    die "the $rate MB/s throttle lets $SEEN MB/s through"
}

# simslurm_begin NODES: a fresh simulated cluster of NODES nodes (tests/harness/simslurm.sh,
# HARNESS; its root in SROOT); its environment (srun, MPI) exported; $WORK/pid<K> holds the
# pid of node K's slurmd, so on_node K enters node n$((K+1))'s namespace. simslurm_end takes
# it down.
HARNESS=$TOP/tests/harness/simslurm.sh
SROOT=${SIMSLURM_ROOT:-/var/tmp/stagefs-simslurm}
simslurm_begin() {
  local k
  command -v srun >/dev/null || die "needs Slurm (tests/harness/simslurm.sh deps)"
  "$HARNESS" down >/dev/null 2>&1 || true
  "$HARNESS" up "$1" || die "the simulated cluster did not come up"
  eval "$("$HARNESS" env)"
  for ((k = 0; k < $1; k++)); do cp "$SROOT/nodes/n$((k + 1))/pid" "$WORK/pid$k"; done
}
simslurm_end() { "$HARNESS" down >/dev/null 2>&1 || log "warning: simslurm down failed"; }
