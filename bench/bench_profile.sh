#!/usr/bin/env bash
# bench_profile.sh: a cold job that replays the last job's profile, against the same job without
# one, on 4 simulated Slurm nodes (tests/harness/simslurm.sh) reading a shared source throttled
# to RATE MB/s (bench/throttlefs.c, mounted before the cluster starts so every node sees it).
# Every job is submitted as an unprivileged user (the harness's SIMSLURM_USERS, default
# stagefs-bench here): `srun -N2 -w NODES --mpi=pmix stagefs SRC /stage/USER/mnt --cache
# /nvme/stagefs/USER --profile PROFILE`; its readers run as that user inside the nodes'
# namespaces. Each round, interleaved, for every scenario: a job on n1, n2 whose profile path
# is fresh (nothing to replay: "rec", the variant without a profile; it records one), then a
# job on n3, n4, whose caches are emptied first, with that profile (rank 0 on n3 finds it on
# the shared path and replays it: "replay"). Caches are emptied before every job.
#
# Timed: from mount-ready (`stagefs --wait` answered on both nodes) to the end of the readers
# on both nodes ("seconds"); "pass_seconds" is from the first read to the end. A launch gap of
# GAP seconds lies between mount-ready and the first read (launch time: the replay may use it;
# it is not a synchronization).
#
# Scenarios (SCENARIOS, in this order each round):
#   source       the unit: one node (n1) reading the dataset straight from the throttled source,
#                `tar cf - d001..d040 | cat > /dev/null`
#   tar-rec      the dataset (TAR_DIRS directories of TAR_FILES files of 4-64 KiB), tar'ed
#   tar-replay   through the mount on both nodes after GAP seconds
#   waste        a job on n3, n4 replaying a copy of tar-rec's profile whose read set changed
#                by 10%: it tars d005..d044 (the first tenth of the directories dropped, as
#                many new ones read). Reported: the replay's bytes staged and never opened
#                (user.stagefs.stats replay.used, through the metrics file's last write)
#   epoch-rec    a shuffled first epoch: EPOCH_DIRS directories of EPOCH_FILES files of 4-64
#   epoch-replay KiB; each node reads every file whole in its own random order (Python,
#                seeded by round and node), after EPOCH_GAP seconds (0: none)
#   ctr-rec      a container start: an IMAGE_MB image of which each node reads CTR_PERCENT %
#   ctr-replay   in 128 KiB preads (as squashfuse does), after GAP seconds. The read set is
#                the same every job: runs of 1..CTR_RUN_BLOCKS consecutive 128 KiB blocks (a
#                squashfs file's blocks) at random places, the runs in random order
#                (CTR_RUN_BLOCKS=1: single blocks anywhere)
# Per job also: the same readers again right after the timed pass, their data already local (the read
# path's floor: what no replay can remove), the replay's bytes staged by the end of the gap and of the pass (rank 0's
# user.stagefs.stats replay.bytes_done), its final staged/used/unused bytes (rank 0's metrics
# file, written last at unmount), the file bytes throttlefs served (its own counter), and the
# replay's log lines in the job logs (WORK/logs, kept with KEEP=1).
#
# Env: RATE (50) GAP (3) EPOCH_GAP (0) TAR_DIRS (40) TAR_FILES (100) EPOCH_DIRS (1000)
#      EPOCH_FILES (20) IMAGE_MB (1024) CTR_PERCENT (30) CTR_RUN_BLOCKS (64) CHUNK (16M)
#      SCENARIOS ("source tar waste epoch ctr") RUNS (lib.sh: 5) NAME (bench_profile)
#      SIMSLURM_USERS SIMSLURM_ROOT WORK_ROOT BIN RESULTS KEEP=1
# Time: 6-9 minutes per round at the default sizes on a loaded 2-vCPU machine (the epoch's two
# jobs are two thirds of it; SCENARIOS=ctr alone: 1.5 minutes), plus ~1 minute to create the
# data (with KEEP=1, WORK_ROOT/profile-slurm is kept: logs, profiles, and the data, reused by
# the next run when its sizes match).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

NODES=4
RATE=${RATE:-50}
GAP=${GAP:-3}
EPOCH_GAP=${EPOCH_GAP:-0}
TAR_DIRS=${TAR_DIRS:-40}
TAR_FILES=${TAR_FILES:-100}
EPOCH_DIRS=${EPOCH_DIRS:-1000}
EPOCH_FILES=${EPOCH_FILES:-20}
IMAGE_MB=${IMAGE_MB:-1024}
CTR_PERCENT=${CTR_PERCENT:-30}
CTR_RUN_BLOCKS=${CTR_RUN_BLOCKS:-64}
CHUNK=${CHUNK:-16M}
SCENARIOS=${SCENARIOS:-source tar waste epoch ctr}
NAME=${NAME:-bench_profile}
export SIMSLURM_USERS=${SIMSLURM_USERS:-stagefs-bench}
U=${SIMSLURM_USERS%% *}       # the user every job runs as
WORK=$WORK_ROOT/profile-slurm # under /var/tmp: every simulated node sees it
SHARED=$WORK/shared           # the shared storage's files, behind throttlefs
SRC=$WORK/src                 # the throttled view
PROFS=$WORK/profiles          # the user's profiles, on a path every node sees
MNT=/stage/$U/mnt             # the stagefs mount point inside every node
METRICS=/tmp/stagefs-$U.prom  # each node's own /tmp
SHIFT=$(((TAR_DIRS + 9) / 10)) # the waste job's read set: SHIFT directories dropped, SHIFT new

group_pid=
cleanup() {
  set +e
  STOP_WAIT=5 stop_group
  simslurm_end
  throttlefs_stop "$SRC"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
rm -rf "$WORK/logs" "$WORK/rate-check"  # a kept run's (KEEP=1)
mkdir -p "$WORK/logs"
need_space $(((IMAGE_MB * 5 + EPOCH_DIRS * EPOCH_FILES * 34 * 5 / 1024 + 1023) / 1024 + 1))

# --- the data (a kept run's is reused when its sizes match) -------------------------------
# make_tree DIR DIRS FILES SEED: DIRS directories dNNNN of FILES files of 4-64 KiB
make_tree() {
  local stamp="$2x$3 seed $4"
  [ "$(cat "$1.made" 2>/dev/null)" = "$stamp" ] && return 0
  log "creating $1: $2 directories of $3 files of 4-64 KiB"
  rm -rf "$1" "$1.made"
  "$PY" - "$1" "$2" "$3" "$4" <<'PYEOF'
import os, random, sys
root, dirs, files, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
for d in range(1, dirs + 1):
    dp = os.path.join(root, "d%04d" % d)
    os.makedirs(dp)
    for i in range(files):
        with open(os.path.join(dp, "f%04d" % i), "wb") as f:
            f.write(rng.randbytes(rng.randint(4096, 65536)))
PYEOF
  echo "$stamp" > "$1.made"
}
mkdir -p "$SHARED"
make_tree "$SHARED/dataset" $((TAR_DIRS + SHIFT)) "$TAR_FILES" dataset
make_tree "$SHARED/epoch" "$EPOCH_DIRS" "$EPOCH_FILES" epoch
make_random_file "$SHARED/image" "$IMAGE_MB"
chmod -R a+rX "$SHARED"
(cd "$SHARED/epoch" && find . -type f -printf '%P\n' | sort) > "$WORK/epoch.list"
tar_set() { seq -f 'd%04g' "$1" "$2" | paste -sd' '; }  # directories $1..$2
SET_A=$(tar_set 1 "$TAR_DIRS")
SET_B=$(tar_set $((SHIFT + 1)) $((TAR_DIRS + SHIFT)))

# The readers (run as the user inside a node): a shuffled epoch, and a container start's preads.
cat > "$WORK/epoch_read.py" <<'PYEOF'
import os, random, sys
root, listfile, seed = sys.argv[1], sys.argv[2], sys.argv[3]
names = open(listfile).read().split()
random.Random(seed).shuffle(names)
for name in names:
    with open(os.path.join(root, name), "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass
PYEOF
cat > "$WORK/ctr_read.py" <<'PYEOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for line in open(sys.argv[2]):
    if len(os.pread(fd, 131072, int(line))) != 131072:
        sys.exit("short read at " + line)
PYEOF
# The container start's read set (the same every job); CTR_CHUNKS: the chunks it touches.
"$PY" - "$((IMAGE_MB << 20))" "$CTR_PERCENT" "$CTR_RUN_BLOCKS" "$WORK/ctr.offsets" "$CHUNK" <<'PYEOF' > "$WORK/ctr.chunks"
import random, sys
size, pct, run_max, out, chunk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
chunk = int(chunk[:-1]) << {"K": 10, "M": 20, "G": 30}[chunk[-1]] if chunk[-1] in "KMG" else int(chunk)
B = 131072
nb, rng = size // B, random.Random("container start")
want, got, taken, runs = nb * pct // 100, 0, bytearray(nb), []
while got < want:
    n = min(rng.randint(1, run_max), want - got)
    s = rng.randrange(0, nb - n + 1)
    if any(taken[s:s + n]):
        continue
    taken[s:s + n] = b"\1" * n
    runs.append((s, n))
    got += n
rng.shuffle(runs)
chunks = set()
with open(out, "w") as f:
    for s, n in runs:
        for b in range(s, s + n):
            f.write("%d\n" % (b * B))
            chunks.add(b * B // chunk)
print("%d of %d" % (len(chunks), (size + chunk - 1) // chunk))
PYEOF
CTR_CHUNKS=$(cat "$WORK/ctr.chunks")
chmod -R a+rX "$WORK/epoch.list" "$WORK/epoch_read.py" "$WORK/ctr_read.py" "$WORK/ctr.offsets"

# --- the source and the cluster -----------------------------------------------------------
throttlefs_build
throttlefs_start "$RATE" "$SHARED" "$SRC"
simslurm_begin "$NODES"
G=$(id -g "$U")
rm -rf "$PROFS"
install -d -o "$U" -g "$G" -m 0700 "$PROFS"
for ((k = 1; k <= NODES; k++)); do
  install -d -o "$U" -g "$G" -m 0755 "$SROOT/nodes/n$k/stage/$U" "$SROOT/nodes/n$k/stage/$U/mnt"
done
throttle_check "$RATE" "$SRC/image"

# on_node_as K CMD...: CMD as the user, in node K's namespace
on_node_as() {
  local k=$1
  shift
  on_node "$k" setpriv --reuid="$U" --regid="$G" --init-groups env HOME="$SROOT/home/$U" "$@"
}
node_dir() { echo "$SROOT/nodes/n$(($1 + 1))"; }
# cold K...: those nodes' caches emptied, their metrics files removed
cold() {
  local k
  for k in "$@"; do
    find "$(node_dir "$k")/nvme/stagefs/$U" -mindepth 1 -delete 2>/dev/null || true
    rm -f "$(node_dir "$k")$METRICS"
  done
}
sleep_until() { sleep "$("$PY" -c 'import sys, time; print(max(0.0, float(sys.argv[1]) - time.time()))' "$1")"; }
# replay_done K: bytes the replay has staged so far (node K, rank 0's user.stagefs.stats)
replay_done() {
  on_node_as "$1" getfattr --absolute-names --only-values -n user.stagefs.stats "$MNT" 2>/dev/null |
    "$PY" -c 'import json, sys; r = json.load(sys.stdin).get("replay") or {}; print(r.get("bytes_done", ""))' || true
}
# replay_final K: "staged,used,unused" bytes of the replay, from node K's last metrics write
replay_final() {
  "$PY" - "$(node_dir "$1")$METRICS" <<'PYEOF' || echo ",,"
import re, sys
v = {}
for line in open(sys.argv[1]):
    m = re.match(r'stagefs_replay_bytes_total\{.*kind="(\w+)".*\}\s+(\S+)', line)
    if m:
        v[m.group(1)] = int(float(m.group(2)))
print(",".join(str(v.get(k, "")) for k in ("staged", "used", "unused")))
PYEOF
}

# start_job FIRST PROFILE LOG: a 2-node stagefs job of the user on n$((FIRST+1)), n$((FIRST+2));
# returns once both nodes' mounts answer; T_READY: that moment.
start_job() {
  local first=$1 k
  "$HARNESS" as "$U" -- timeout -k 10 900 srun -N2 -w "n[$((first + 1))-$((first + 2))]" --ntasks-per-node=1 \
    --mpi=pmix "$BIN/stagefs" "$SRC" "$MNT" --chunk-size "$CHUNK" --cache "/nvme/stagefs/$U" --profile "$2" \
    --metrics-file "$METRICS" --metrics-interval 1 < /dev/null > "$3" 2>&1 &
  group_pid=$!
  for ((k = first; k < first + 2; k++)); do
    on_node_as "$k" "$BIN/stagefs" --wait "$MNT" --wait-timeout 120 ||
      { log "stagefs job not ready: $(tail -5 "$3")"; stop_group "$first"; return 1; }
  done
  T_READY=$(now)
}

# readers FIRST CMD...: CMD on both nodes of the job at once, as the user ("@K@" in CMD: the
# node's index); fails if one failed
readers() {
  local first=$1 k p pids=() bad=0
  shift
  for ((k = first; k < first + 2; k++)); do
    on_node_as "$k" "${@//@K@/$k}" > /dev/null 2>> "$WORK/logs/readers.err" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  ((bad == 0)) || log "a reader failed: $(tail -3 "$WORK/logs/readers.err")"
  return $bad
}
# shellcheck disable=SC2016  # expanded by the reader's bash
TAR=(bash -o pipefail -c 'cd "$0" && tar cf - "$@" | cat > /dev/null')  # TAR DIR SUBDIR...

# job_pass TAG FIRST PROFILE GAP CMD...: a cold 2-node job from FIRST with PROFILE; CMD (see
# readers) GAP seconds after mount-ready; RES the CSV fields after round,variant,loadavg
job_pass() {
  local tag=$1 first=$2 prof=$3 gap=$4 before at_gap="" at_end t_go t_end
  shift 4
  cold "$first" $((first + 1))
  before=$(throttlefs_bytes "$SRC")
  start_job "$first" "$prof" "$WORK/logs/$tag.log" || return 1
  if [ "$gap" != 0 ]; then
    sleep_until "$("$PY" -c "print($T_READY + $gap - 0.1)")"
    at_gap=$(replay_done "$first")
    sleep_until "$("$PY" -c "print($T_READY + $gap)")"
  fi
  t_go=$(now)
  readers "$first" "$@" || { stop_group "$first"; return 1; }
  t_end=$(now)
  at_end=$(replay_done "$first")
  timed readers "$first" "$@" || { stop_group "$first"; return 1; }  # again, warm: the read path's floor
  STOP_WAIT=60 stop_group "$first"
  grep -h "replay\|profile" "$WORK/logs/$tag.log" | sed "s/^/[$tag] /" >> "$WORK/logs/replay.lines" || true
  RES="$(elapsed "$T_READY" "$t_end"),$(elapsed "$t_go" "$t_end"),$SECS,$at_gap,$at_end,$(replay_final "$first"),$(($(throttlefs_bytes "$SRC") - before))"
}

run_source() {
  local before
  before=$(throttlefs_bytes "$SRC")
  # shellcheck disable=SC2086  # the directories are words
  timed on_node_as 0 "${TAR[@]}" "$SRC/dataset" $SET_A || return 1
  RES="$SECS,$SECS,,,,,,,$(($(throttlefs_bytes "$SRC") - before))"
}

# the round's profile of scenario $1
prof() { echo "$PROFS/r$ROUND-$1.prof"; }
have_profile() { [ -s "$1" ] || { log "no profile at $1: the recording job did not write one"; return 1; }; }

profile_run() {
  local v=$1
  # shellcheck disable=SC2086  # the directory lists are words
  case $v in
    source) run_source ;;
    tar-rec) job_pass "r$ROUND-$v" 0 "$(prof tar)" "$GAP" "${TAR[@]}" "$MNT/dataset" $SET_A &&
      have_profile "$(prof tar)" && cp -p "$(prof tar)" "$(prof waste)" ;;
    tar-replay) have_profile "$(prof tar)" && job_pass "r$ROUND-$v" 2 "$(prof tar)" "$GAP" "${TAR[@]}" "$MNT/dataset" $SET_A ;;
    waste) have_profile "$(prof waste)" && job_pass "r$ROUND-$v" 2 "$(prof waste)" "$GAP" "${TAR[@]}" "$MNT/dataset" $SET_B ;;
    epoch-rec | epoch-replay)
      local first=2
      [ "$v" = epoch-rec ] && first=0
      [ "$v" = epoch-rec ] || have_profile "$(prof epoch)" || return 1
      job_pass "r$ROUND-$v" "$first" "$(prof epoch)" "$EPOCH_GAP" "$PY" "$WORK/epoch_read.py" "$MNT/epoch" "$WORK/epoch.list" "$ROUND-@K@" ;;
    ctr-rec | ctr-replay)
      local first=2
      [ "$v" = ctr-rec ] && first=0
      [ "$v" = ctr-rec ] || have_profile "$(prof ctr)" || return 1
      job_pass "r$ROUND-$v" "$first" "$(prof ctr)" "$GAP" "$PY" "$WORK/ctr_read.py" "$MNT/image" "$WORK/ctr.offsets" ;;
    *) die "unknown variant $v" ;;
  esac
}

variants=()
for s in $SCENARIOS; do
  case $s in
    source | waste) variants+=("$s") ;;
    tar | epoch | ctr) variants+=("$s-rec" "$s-replay") ;;
    *) die "unknown scenario $s" ;;
  esac
done
raw_init "$NAME" "round,variant,loadavg,seconds,pass_seconds,warm_pass_seconds,replay_bytes_at_gap,replay_bytes_at_end,replay_bytes_staged,replay_bytes_used,replay_bytes_unused,throttlefs_bytes"
round_run() {  # VARIANT ROUND: profile_run, which names its profiles by ROUND
  ROUND=$2
  [ "$1" != "${variants[0]}" ] || log "round $ROUND of $RUNS"
  profile_run "$1"
}
rounds round_run ",,,,,,,," "${variants[@]}"
cp "$WORK/logs/replay.lines" "$RESULTS/$NAME.replay-log.txt" 2>/dev/null || true

# --- the tables ---------------------------------------------------------------------------
rm -f "$MD"
common="Source: throttlefs at $RATE MB/s (measured from inside n2 before the rounds: $(awk '{print $2}' "$WORK/rate-check") MB/s). Every job: 2 simulated nodes, submitted as the unprivileged user $U (srun --mpi=pmix stagefs ... --profile PATH on a path every node sees), caches emptied before it; rec: n1, n2 with a fresh profile path (nothing to replay; records), replay: n3, n4 with the profile rec wrote. seconds: from mount-ready (stagefs --wait answered on both nodes) to the end of both nodes' readers; pass_seconds: from the first read; warm_pass_seconds: the same readers again right after, their data already local (the read path's floor). replay_bytes_at_gap / _at_end: rank 0's replay.bytes_done when the gap ended / the readers ended; replay_bytes_staged / _used / _unused: the replay's final counters (rank 0's metrics file, written at unmount); throttlefs_bytes: file bytes the source served during the job. Chunk size $CHUNK."
cols=pass_seconds,warm_pass_seconds,replay_bytes_at_gap,replay_bytes_at_end,replay_bytes_staged,replay_bytes_used,replay_bytes_unused,throttlefs_bytes
summ() { "$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric seconds --cols "$cols" --append "$@"; }
has() { [[ " ${variants[*]} " == *" $1 "* ]]; }
if has tar-rec; then
  summ --title "a dataset through tar: $TAR_DIRS directories of $TAR_FILES files (4-64 KiB), recorded by a 2-node job, replayed by the next on 2 cold nodes, $GAP s launch gap" \
    --only "source,tar-rec,tar-replay" \
    --ratio "replay/rec=tar-replay/tar-rec" --target "replay/rec<=0.6" \
    --ratio "rec/source=tar-rec/source" --ratio "replay/source=tar-replay/source" \
    --note "source: tar of the same $TAR_DIRS directories straight from the throttled source on n1 (one node, no gap: the unit). tar-rec, tar-replay: \`tar cf - d0001..d$(printf %04d "$TAR_DIRS") | cat > /dev/null\` through the mount on both nodes at once, $GAP s after mount-ready; seconds include the gap. $common"
fi
if has waste; then
  waste_note=$("$PY" - "$RAW" <<'PYEOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#")) if r["variant"] == "waste" and r["replay_bytes_staged"]]
if rows:
    st = [int(r["replay_bytes_staged"]) for r in rows]
    un = [int(r["replay_bytes_unused"]) for r in rows]
    fr = ["%.1f%%" % (100.0 * u / s) for u, s in zip(un, st) if s]
    print("Staged by the replay and never opened: median %.1f MiB of %.1f MiB staged (%s per round)." % (statistics.median(un) / 1048576, statistics.median(st) / 1048576, " ".join(fr)))
PYEOF
)
  summ --title "the waste: the replay when the job's read set changed by 10%" --only "tar-replay,waste" \
    --ratio "waste job/replay of the same set=waste/tar-replay" \
    --note "$waste_note waste: a job on n3, n4 replaying a copy of tar-rec's profile (directories d0001..d$(printf %04d "$TAR_DIRS")) but tar'ing d$(printf %04d $((SHIFT + 1)))..d$(printf %04d $((TAR_DIRS + SHIFT))): $SHIFT of $TAR_DIRS directories dropped, $SHIFT new ones read. $common"
fi
if has epoch-rec; then
  summ --title "a shuffled first epoch: $EPOCH_DIRS directories of $EPOCH_FILES files (4-64 KiB), each node reading every file in its own random order" \
    --only "epoch-rec,epoch-replay" --ratio "replay/rec=epoch-replay/epoch-rec" --target "replay/rec<=0.6" \
    --note "Each node: Python opens and reads every file whole, in an order shuffled with its own seed (round and node: the replaying job's nodes read in other orders than the recording job's), $EPOCH_GAP s after mount-ready. $common"
fi
if has ctr-rec; then
  summ --title "a container start: $CTR_PERCENT% of a $IMAGE_MB MiB image in 128 KiB preads, $GAP s launch gap" \
    --only "ctr-rec,ctr-replay" --ratio "replay/rec=ctr-replay/ctr-rec" --target "replay/rec<=0.6" \
    --note "Each node: Python preads 128 KiB blocks of the image, $CTR_PERCENT% of it, the same blocks in the same order in every job: runs of 1..$CTR_RUN_BLOCKS consecutive blocks at random places (a squashfs file's blocks), the runs in random order. They lie in $CTR_CHUNKS chunks of $CHUNK. $common"
fi
log "results: $MD"
