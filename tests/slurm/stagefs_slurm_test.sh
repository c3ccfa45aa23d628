#!/usr/bin/env bash
# stagefs_slurm_test.sh BUILD_DIR
#
# End-to-end test of tools/stagefs's step layout written out by hand (what `stagefs run` does
# for a user, tests/slurm/run_slurm_test.sh): one batch job on a simulated 4-node Slurm
# cluster (tests/harness/simslurm.sh), each node with its own hostname, /tmp, /nvme, /stage and
# mount namespace, and stagefs's admin kit as its prolog and epilog. The job is submitted by
# an ordinary user (stagefs-u1), and its script (written below, `sbatch -N4`) does:
#
#   srun --overlap --ntasks-per-node=1 --mpi=pmix stagefs SRC /stage/JOBID --cache /nvme/stagefs/USER &
#   stagefs --wait /stage/JOBID
#   srun --overlap -N4 --ntasks-per-node=1 sh -c 'hostname; sha256sum /stage/JOBID/image.sqsh'
#   srun --overlap -N4 ... squashfuse /stage/JOBID/image.sqsh /tmp/sq; read; fusermount3 -u /tmp/sq
#   ... other.bin read on one node, caches and user.stagefs.stats inspected ...
#   scancel --signal=TERM <the stagefs step>; wait (bounded)
#   (job 2: the same again over the same caches, stopped by reading user.stagefs.stop)
#   srun --overlap -N4 ...: no stagefs process, no stagefs mount left on any node
#
# and writes what it sees to a results file; this script parses it into PASS/FAIL lines.
#
# Concurrent steps (Slurm 22.05.8): `sbatch -N4` gives one CPU per node, which the stagefs
# step holds for the whole job, so any second step waits silently until stagefs ends.
# `--overlap` on either step is enough in 22.05 (a step with it "will overlap all other
# steps"); it is on every step here, which does not depend on which side a Slurm version
# wants it on. Resources to spare also work: `sbatch -N4 -c2` (or --exclusive) with
# `srun -c1` on every step.
#
# Stopping stagefs: `scancel --signal=TERM JOBID.STEPID` delivers SIGTERM to the stagefs
# tasks. `kill %1` (SIGTERM to the srun) does NOT: srun answers SIGTERM with "forcing job
# termination" and SIGKILLs the tasks, which leaves a stale (ENOTCONN) mount on every node.
#
# Mount point and cache: /stage/JOBID and /nvme/stagefs/USER, which the prolog prepares, the
# user's alone. The final check looks for stagefs mounts in each node's mount table:
# `mountpoint -q /stage` is always true in the harness (a bind mount in every node namespace).
#
# Checks:
#   1. the batch job runs to its end
#   2. stagefs mounts at /stage/JOBID (if refused: also that the refused start ends by
#      itself, srun exit 1, no MPI abort or crash)
#   3. stagefs --wait returns 0
#   4. 4 distinct hostnames run the checksum step; all 4 see the source's sha256
#   5. squashfuse mounts /stage/JOBID/image.sqsh on all 4 nodes, files inside match the tree,
#      fusermount3 -u succeeds
#   6. other.bin, first read on n3 (not the coordinator), matches the source
#   7. user.stagefs.stats on n1 (rank 0, the coordinator): after the 4 concurrent first
#      opens of the image exactly 1 transfer of image-size bytes; at the end 2 transfers,
#      bytes_broadcast = image + other.bin, no failures
#   8. /nvme/stagefs/USER/data/{image.sqsh,other.bin} on all 4 nodes equal the source
#   9. after scancel --signal=TERM the stagefs step ends within 30 s, exit 0
#  10. no stagefs process (in the node's mount namespace: the simulated nodes share one
#      process table) and no stagefs mount (live or stale) left on any node
#
# Exit: 0 all checks passed, 1 some check failed, 77 skipped (not root / Slurm, munge,
# squashfs-tools, squashfuse or fuse missing). Prints "PASS: ..." / "FAIL: ..." per check
# and a closing "stagefs_slurm: N passed, N failed" line.
#
# The simulated cluster is restarted fresh at the start (stale mounts of an earlier run
# live in node namespaces) and torn down on exit.
#
# Environment:
#   STAGEFS        binary to test (default BUILD_DIR/tools/stagefs); must be on a path
#                  every node sees, i.e. not under /tmp, /nvme or /stage
#   SIMSLURM_ROOT  harness state root (see simslurm.sh); the source dir is created in
#                  $SIMSLURM_ROOT/shared, which all nodes see
#   STEP_TIMEOUT   seconds allowed per job step (default 60)
#   JOB_TIMEOUT    seconds allowed for the whole batch job (default 240)
set -uo pipefail

NAME=stagefs_slurm
NODES=4
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HARNESS=$HERE/../harness/simslurm.sh
STEP_TIMEOUT=${STEP_TIMEOUT:-60}
JOB_TIMEOUT=${JOB_TIMEOUT:-240}

# shellcheck source=checks.sh
source "$HERE/checks.sh"

# ---------------------------------------------------------------------------------------
# arguments and prerequisites

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "FAIL: build dir '$1' not found"; exit 1; }
BIN=${STAGEFS:-$BUILD_DIR/tools/stagefs}

[[ $(id -u) == 0 ]] || skip "needs root (simulated Slurm uses mount/UTS namespaces)"
for tool in slurmd slurmctld srun sbatch squeue scancel munged; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed (apt-get install slurm-wlm munge)"
done
command -v mksquashfs >/dev/null 2>&1 || skip "mksquashfs not installed (apt-get install squashfs-tools)"
command -v squashfuse >/dev/null 2>&1 || skip "squashfuse not installed (apt-get install squashfuse)"
command -v fusermount3 >/dev/null 2>&1 || skip "fusermount3 not installed (apt-get install fuse3)"
command -v python3 >/dev/null 2>&1 || skip "python3 not installed (reads user.stagefs.stats)"
[[ -c /dev/fuse ]] || skip "/dev/fuse missing"
[[ -x $HARNESS ]] || { echo "FAIL: harness $HARNESS missing"; exit 1; }
if [[ ! -x $BIN ]]; then
  fail "stagefs binary exists: $BIN"
  finish
  exit 1
fi
BIN=$(readlink -f "$BIN")
case $BIN in
  /tmp/* | /nvme/* | /stage/*)
    fail "stagefs binary must be outside /tmp, /nvme, /stage (per-node dirs): $BIN"
    finish
    exit 1
    ;;
esac

# ---------------------------------------------------------------------------------------
# cluster + scratch, torn down on any exit

WORK=
JOBID=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -n $JOBID ]] && timeout 15 scancel "$JOBID" >/dev/null 2>&1
  # down first: stagefs/squashfuse of the job may still hold files under $WORK
  "$HARNESS" down >/dev/null 2>&1 || echo "warning: simslurm down failed" >&2
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS
info "bringing up $NODES fresh simulated nodes"
"$HARNESS" down >/dev/null 2>&1 || true # an earlier run's node namespaces may hold stale mounts
if ! "$HARNESS" up "$NODES"; then
  fail "simulated cluster comes up"
  finish
  exit 1
fi
# SLURM_CONF, SIMSLURM_ROOT and the Open MPI settings the simulated cluster needs;
# sbatch hands them on to the job (default --export=ALL), srun on to the tasks
eval "$("$HARNESS" env)"

RUN_USER=${SIMSLURM_USERS:-stagefs-u1}
RUN_USER=${RUN_USER%% *}
WORK=$(mktemp -d "$SIMSLURM_ROOT/shared/stagefs-test.XXXXXX")
chmod 0755 "$WORK"
SRC=$WORK/src   # what stagefs mirrors: image.sqsh and other.bin
TREE=$WORK/tree # what the image holds
mkdir -p "$SRC" "$TREE/sub"

info "creating the source: a squashfs image and a plain file in $SRC"
head -c $((24 << 20)) /dev/urandom >"$TREE/blob.bin" # random: the image stays ~24 MiB
seq 1 200000 >"$TREE/sub/numbers.txt"
echo "hello from the image" >"$TREE/hello.txt"
if ! mksquashfs "$TREE" "$SRC/image.sqsh" -noappend -quiet -no-progress >"$WORK/mksquashfs.log" 2>&1; then
  fail "mksquashfs creates the image"
  show "$WORK/mksquashfs.log"
  finish
  exit 1
fi
head -c $((3 << 20)) /dev/urandom >"$SRC/other.bin"
IMG_SIZE=$(stat -c %s "$SRC/image.sqsh")
OTHER_SIZE=$(stat -c %s "$SRC/other.bin")
IMG_SUM=$(sha256sum "$SRC/image.sqsh" | cut -d' ' -f1)
OTHER_SUM=$(sha256sum "$SRC/other.bin" | cut -d' ' -f1)
BLOB_SUM=$(sha256sum "$TREE/blob.bin" | cut -d' ' -f1)
NUM_SUM=$(sha256sum "$TREE/sub/numbers.txt" | cut -d' ' -f1)
echo "    image.sqsh $IMG_SIZE bytes sha256 $IMG_SUM"
echo "    other.bin  $OTHER_SIZE bytes sha256 $OTHER_SUM"

# ---------------------------------------------------------------------------------------
# the job script: what a user submits. Arguments: STAGEFS SRC RESULTS LOGDIR STEP_TIMEOUT.
# Every observation is one line of RESULTS; the last one is "DONE".

JOB=$WORK/job.sh
RESULTS=$WORK/results.txt
cat >"$JOB" <<'JOBEOF'
#!/bin/bash
# A user's stagefs job (see stagefs_slurm_test.sh), submitted as
#   sbatch -N4 -o OUT job.sh STAGEFS SRC RESULTS LOGDIR STEP_TIMEOUT
# shellcheck disable=SC2016  # the sh -c '...' snippets are expanded by the tasks' sh
STAGEFS=$1 SRC=$2 OUT=$3 LOGS=$4 T=$5 STAGECTL=$6
CACHE=/nvme/stagefs/$(id -un)

rec() { echo "$*" >>"$OUT"; }
mark() { rec "TIME $1 ${SECONDS}s"; } # seconds since the job script started
# every step: bounded, and --overlap so it can run next to the stagefs step
step() { timeout --kill-after=10 "$T" srun --overlap "$@"; }
all() { step -N4 --ntasks-per-node=1 "$@"; }

# start_stagefs MNT LOG: the daemon step in the background ($SPID)
start_stagefs() {
  timeout --kill-after=10 $((4 * T)) \
    srun --overlap --ntasks-per-node=1 --mpi=pmix "$STAGEFS" "$SRC" "$1" --cache "$CACHE" >"$2" 2>&1 &
  SPID=$!
}
# wait_mounted MNT LOG: `stagefs --wait MNT`, but stop early if the stagefs step has ended
# or a node has logged an error (refused to mount)
wait_mounted() {
  local deadline=$((SECONDS + T))
  while ((SECONDS < deadline)); do
    "$STAGEFS" --wait "$1" --wait-timeout 1 2>>"$LOGS/wait.err" && return 0
    kill -0 "$SPID" 2>/dev/null || return 1
    grep -q '^\[stagefs .*\] error: ' "$2" && return 1
  done
  return 1
}
# wait_gone PID SECONDS: true once PID has exited
wait_gone() {
  timeout "$2" tail --pid="$1" -f /dev/null 2>/dev/null  # returns when PID exits, no polling
  ! kill -0 "$1" 2>/dev/null
}
stagefs_step() { timeout 15 squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' | awk '$2 == "stagefs" { print $1; exit }'; }
# stop_stagefs [attr]: SIGTERM to the stagefs tasks (attr: a read of user.stagefs.stop on the
# mount instead); a full cancel if they do not end in time. Sets STOPPED (a results line).
stop_stagefs() {
  local id t=$SECONDS rc escalated=no
  id=$(stagefs_step)
  if [[ ${1:-} == attr ]]; then
    python3 -c 'import os, sys; os.getxattr(sys.argv[1], "user.stagefs.stop")' "$MNT" 2>>"$LOGS/steps.err"
  elif [[ -n $id ]]; then
    timeout 15 scancel --signal=TERM "$id" 2>>"$LOGS/steps.err"
  else
    kill -TERM "$SPID" # no step found: fall back to signalling srun
  fi
  if ! wait_gone "$SPID" 30; then
    escalated=yes
    [[ -n $id ]] && timeout 15 scancel "$id" 2>>"$LOGS/steps.err"
    wait_gone "$SPID" 20 || kill -KILL "$SPID"
  fi
  wait "$SPID"
  rc=$?
  STOPPED="step=${id:-none} rc=$rc secs=$((SECONDS - t)) escalated=$escalated"
}

rec "BATCH $(hostname) job=$SLURM_JOB_ID nodes=$SLURM_JOB_NODELIST"

# 1. the daemons, one per node, on the job's directory (the prolog's)
MNT=/stage/$SLURM_JOB_ID
start_stagefs "$MNT" "$LOGS/stagefs-stage.log"
if wait_mounted "$MNT" "$LOGS/stagefs-stage.log"; then
  rec "MOUNT_STAGE ok"
else
  # refused: every node should now exit 1 by itself
  if wait_gone "$SPID" 15; then
    wait "$SPID"
    rec "MOUNT_STAGE refused ended=yes rc=$?"
  else
    stop_stagefs
    rec "MOUNT_STAGE refused ended=no $STOPPED"
  fi
  mark refused
fi
mark mounted
rec "MNT $MNT"

if kill -0 "$SPID" 2>/dev/null && "$STAGEFS" --wait "$MNT" --wait-timeout 5; then
  rec "WAIT 0"

  # 2. every node reads the image: the first opens, concurrent on 4 nodes
  all sh -c 'echo "SUM $(hostname) $(sha256sum "$1" | cut -d" " -f1)"' sh "$MNT/image.sqsh" >>"$OUT" 2>>"$LOGS/steps.err"
  rec "STEP_SUM rc=$?"
  mark checksums
  rec "STATS_IMAGE $(step -N1 -w n1 python3 -c \
    'import os,sys; print(os.getxattr(sys.argv[1], "user.stagefs.stats").decode())' "$MNT" 2>>"$LOGS/steps.err")"

  # 3. every node mounts the image with squashfuse in its own /tmp and reads inside it
  all sh -c '
    m=/tmp/sq; mkdir -p $m
    if squashfuse "$1" $m; then
      b=$(sha256sum $m/blob.bin | cut -d" " -f1); n=$(sha256sum $m/sub/numbers.txt | cut -d" " -f1)
      fusermount3 -u $m; u=$?
    else b=MOUNT_FAILED n=- u=-; fi
    echo "SQ $(hostname) $b $n $u"' sh "$MNT/image.sqsh" >>"$OUT" 2>>"$LOGS/steps.err"
  rec "STEP_SQ rc=$?"
  mark squashfuse

  # 4. a second file, first opened on a node that is not the coordinator
  step -N1 -w n3 sh -c 'echo "OTHER $(hostname) $(sha256sum "$1" | cut -d" " -f1)"' sh "$MNT/other.bin" \
    >>"$OUT" 2>>"$LOGS/steps.err"

  # 5. counters (n1 = rank 0, the coordinator) and the node-local copies
  rec "STATS_FINAL $(step -N1 -w n1 python3 -c \
    'import os,sys; print(os.getxattr(sys.argv[1], "user.stagefs.stats").decode())' "$MNT" 2>>"$LOGS/steps.err")"
  all sh -c '
    s() { if [ -f "$1" ]; then sha256sum "$1" | cut -d" " -f1; else echo MISSING; fi; }
    echo "CACHE $(hostname) $(s "$1/data/image.sqsh") $(s "$1/data/other.bin")"' sh "$CACHE" \
    >>"$OUT" 2>>"$LOGS/steps.err"
else
  rec "WAIT 1"
fi

# 6. end stagefs
if kill -0 "$SPID" 2>/dev/null; then
  stop_stagefs
else
  wait "$SPID"
  STOPPED="step=none rc=$? secs=0 escalated=already-ended"
fi
rec "STOP $STOPPED"
mark stopped

# Job 2: a new stagefs step over the same node caches, as the next job would run
# it. n2's copy of other.bin is corrupted first (bytes flipped, mtime kept); a job script
# prefetches with stagectl, then every node reads.
step -N1 -w n2 python3 -c 'import os,sys
p=sys.argv[1]; st=os.stat(p)
with open(p, "r+b") as f:
    f.seek(1000); b=f.read(8); f.seek(1000); f.write(bytes(x ^ 0xFF for x in b))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))' "$CACHE/data/other.bin" 2>>"$LOGS/steps.err"
rec "CORRUPT rc=$?"
start_stagefs "$MNT" "$LOGS/stagefs-job2.log"
if wait_mounted "$MNT" "$LOGS/stagefs-job2.log"; then
  step -N1 -w n1 "$STAGECTL" prefetch "$MNT" image.sqsh other.bin >>"$LOGS/prefetch.out" 2>&1
  rec "PREFETCH rc=$?"
  all sh -c 'echo "SUM2 $(hostname) $(sha256sum "$1/image.sqsh" | cut -d" " -f1) $(sha256sum "$1/other.bin" | cut -d" " -f1)"' \
    sh "$MNT" >>"$OUT" 2>>"$LOGS/steps.err"
  all sh -c 'echo "STATS2 $(hostname) $("$1" --json stats "$2" | python3 -c "import json,sys; s=json.load(sys.stdin); print(s[\"local_writes\"], s[\"corrupt\"], s[\"materializations\"], s[\"cache\"][\"files\"], s[\"bytes_from_source\"], s[\"bytes_from_seeds\"], s[\"seeded_here\"])")"' \
    sh "$STAGECTL" "$MNT" >>"$OUT" 2>>"$LOGS/steps.err"
  stop_stagefs attr
  rec "STOP2 $STOPPED"
else
  rec "MOUNT2 failed"
  stop_stagefs
fi
mark job2

# 7. nothing left behind: stagefs processes in this node's mount namespace (the process
# table is shared by all simulated nodes), stagefs mounts (live or stale), and what
# `mountpoint` says (/stage itself is a bind mount in the harness: always a mount point)
all sh -c '
  me=$(readlink /proc/self/ns/mnt); n=0
  for p in $(pgrep -x stagefs); do
    [ "$(readlink /proc/$p/ns/mnt 2>/dev/null)" = "$me" ] && n=$((n + 1))
  done
  m=$(grep -c " - fuse\.stagefs " /proc/self/mountinfo)
  q=$(grep -c " - fuse\.squashfuse " /proc/self/mountinfo)
  if stat "$1" >/dev/null 2>&1; then st=ok; else st=ERROR; fi
  mountpoint -q /stage && s=MOUNTED || s=clean
  mountpoint -q "$1" && t=MOUNTED || t=clean
  echo "END $(hostname) procs=$n stagefs_mounts=$m squashfuse_mounts=$q stat=$st stage=$s mnt=$t"' sh "$MNT" \
  >>"$OUT" 2>>"$LOGS/steps.err"
mark end
rec "DONE"
JOBEOF
chmod 0755 "$JOB"

# ---------------------------------------------------------------------------------------
# run it

# submit, then wait_job (checks.sh) waits for the end of the job (the controller's epilog says it)
run_job() {
  info "sbatch -N$NODES $JOB (then waiting for the job to end)"
  js=$SECONDS
  rc=0
  rm -f "$WORK"/core "$WORK"/core.[0-9]* "$RESULTS"
  chown -R "$RUN_USER:" "$WORK" # the job writes its results and logs there
  JOBID=$(timeout 30 "$HARNESS" as "$RUN_USER" -- sbatch -N"$NODES" --time=$(((JOB_TIMEOUT + 59) / 60)) --chdir="$WORK" --parsable \
    -o "$WORK/job.out" "$JOB" "$BIN" "$SRC" "$RESULTS" "$WORK" "$STEP_TIMEOUT" "$(dirname "$BIN")/stagectl" \
    2>"$WORK/sbatch.err") || rc=$?
  JOBID=${JOBID%%;*}
  state=
  if ((rc == 0)) && [[ $JOBID =~ ^[0-9]+$ ]]; then
    state=$(wait_job "$JOBID" "$JOB_TIMEOUT")
    if [[ $state == TIMEOUT* ]]; then rc=124; fi
  else
    echo "    sbatch failed (exit $rc):"
    show "$WORK/sbatch.err"
    ((rc)) || rc=1
  fi
}
ulimit -c unlimited 2>/dev/null || true # a crashed rank leaves a core for ompi_init_crash
run_job
# a rank that died inside Open MPI's MPI_Init (checks.sh): once more, on fresh nodes. Whatever
# the job's state: the job script records a step that failed and goes on, so a crash in one
# of its steps (seen under load: the first mount step, SIGSEGV in the TCP BTL's callback)
# leaves a COMPLETED job with wrong results.
if ompi_init_crash "$WORK"; then
  echo "RETRY: a rank died inside MPI_Init (Open MPI, not stagefs): the job again, once, on fresh nodes"
  "$HARNESS" down >/dev/null 2>&1 || true
  if "$HARNESS" up "$NODES" >/dev/null 2>&1; then
    run_job
  else
    echo "    simulated cluster did not come up again"
  fi
fi
echo "    job ${JOBID:-?}: ${state:-no state} after $((SECONDS - js))s; job output:"
show "$WORK/job.out" 60
touch "$RESULTS"
echo "    results:"
grep -v '^TIME ' "$RESULTS" | show /dev/stdin 60
echo "    timeline (seconds into the job): $(sed -n 's/^TIME //p' "$RESULTS" | paste -sd' ')"

# r KEY: the results lines starting with KEY (without the key)
r() { sed -n "s/^$1 //p" "$RESULTS"; }
# field LINE NAME: value of NAME=VALUE in LINE
field() { sed -nE "s/.*(^| )$2=([^ ]*).*/\\2/p" <<<"$1"; }
# json JSON KEY: a number or string value of a flat JSON object
json() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2" 2>/dev/null; }

job_complete() { [[ $rc -eq 0 && $state == "COMPLETED 0:0" ]] && grep -qx DONE "$RESULTS"; }
check "batch job runs to its end (COMPLETED, exit 0, results complete)" job_complete

# -- mount
stage_line=$(r MOUNT_STAGE)
if [[ $stage_line == ok ]]; then
  pass "stagefs mounts at /stage/JOBID"
else
  fail "stagefs mounts at /stage/JOBID (${stage_line:-no result}); stagefs said:"
  show "$WORK/stagefs-stage.log" 12
  ended_cleanly() {
    [[ $(field "$stage_line" ended) == yes ]] || { echo "    still running 15 s after the refusal"; return 1; }
    [[ $(field "$stage_line" rc) == 1 ]] || { echo "    srun exit $(field "$stage_line" rc), expected 1"; return 1; }
    ! grep -qE 'MPI_ERR|An error occurred in MPI|received signal' "$WORK/stagefs-stage.log" ||
      { echo "    MPI error or crash in the log"; return 1; }
  }
  check "a refused mount ends by itself on every node within 15 s (srun exit 1, no MPI abort or crash)" ended_cleanly
fi
MNT=$(r MNT)
check "stagefs --wait $MNT returns 0 (every node mounted)" test "$(r WAIT)" = 0
[[ $(r WAIT) == 0 || ! -s $WORK/wait.err ]] || show "$WORK/wait.err" 5

# -- checksum step
sums=$(r SUM | sort)
distinct_hosts() { [[ $(awk 'NF' <<<"$1" | cut -d' ' -f1 | sort -u | wc -l) -eq $NODES ]]; }
# all_equal LINES VALUE...: NODES lines, NODES distinct hosts, fields 2.. equal VALUE...
all_equal() {
  local out=$1; shift
  [[ $(awk 'NF' <<<"$out" | wc -l) -eq $NODES ]] || { echo "    expected $NODES lines"; return 1; }
  distinct_hosts "$out" || { echo "    expected $NODES distinct hostnames"; return 1; }
  [[ -z $(awk -v w="$*" '{ h = $1; $1 = ""; sub(/^ /, ""); if ($0 != w) print h }' <<<"$out") ]] ||
    { echo "    some node differs"; return 1; }
}
check "checksum step ran on $NODES distinct hostnames" distinct_hosts "$sums"
check "sha256 of $MNT/image.sqsh equals the source on all $NODES nodes" all_equal "$sums" "$IMG_SUM"

# -- squashfuse
sq=$(r SQ | sort)
check "squashfuse of $MNT/image.sqsh reads blob.bin and sub/numbers.txt correctly and unmounts on $NODES nodes" \
  all_equal "$sq" "$BLOB_SUM" "$NUM_SUM" 0

# -- second file
check "other.bin first read on n3 matches the source" test "$(r OTHER)" = "n3 $OTHER_SUM"

# -- counters on the coordinator
st1=$(r STATS_IMAGE)
st2=$(r STATS_FINAL)
stats_image_ok() {
  [[ $(json "$st1" host) == n1 && $(json "$st1" rank) == 0 ]] || { echo "    not n1/rank 0"; return 1; }
  [[ $(json "$st1" transfers) == 1 ]] || { echo "    transfers $(json "$st1" transfers), expected 1"; return 1; }
  [[ $(json "$st1" bytes_broadcast) == "$IMG_SIZE" ]] ||
    { echo "    bytes_broadcast $(json "$st1" bytes_broadcast), expected $IMG_SIZE"; return 1; }
}
check "4 concurrent first opens of the image: exactly 1 transfer of $IMG_SIZE bytes (n1, rank 0)" stats_image_ok
stats_final_ok() {
  local want=$((IMG_SIZE + OTHER_SIZE))
  [[ $(json "$st2" transfers) == 2 ]] || { echo "    transfers $(json "$st2" transfers), expected 2"; return 1; }
  [[ $(json "$st2" bytes_broadcast) == "$want" ]] ||
    { echo "    bytes_broadcast $(json "$st2" bytes_broadcast), expected $want"; return 1; }
  [[ $(json "$st2" transfer_failures) == 0 ]] || { echo "    transfer_failures"; return 1; }
}
check "at the end: 2 transfers, bytes_broadcast = image + other.bin = $((IMG_SIZE + OTHER_SIZE)), no failures" \
  stats_final_ok

# -- node-local copies
caches=$(r CACHE | sort)
check "/nvme/stagefs/$RUN_USER/data/image.sqsh and other.bin equal the source on all $NODES nodes" \
  all_equal "$caches" "$IMG_SUM" "$OTHER_SUM"

# -- shutdown
stop=$(r STOP)
stopped_in_time() { [[ -n $stop && $(field "$stop" escalated) == no && $(field "$stop" step) != none ]]; }
check "stagefs step ends within 30 s of scancel --signal=TERM" stopped_in_time
check "stagefs step exits 0 after SIGTERM (daemons shut down, not killed by the signal)" \
  test "$(field "$stop" rc)" = 0
ends=$(r END | sort)
# the harness's /stage is a bind mount, so `mountpoint -q /stage` is always true there:
# the mount checks look for stagefs mounts in the node's mount table instead
check "no stagefs process left on any node" all_equal "$(awk '{print $1, $2}' <<<"$ends")" procs=0
no_mounts() {
  local want="stagefs_mounts=0 squashfuse_mounts=0 stat=ok"
  [[ $MNT == /stage ]] || want+=" mnt=clean"
  all_equal "$(awk -v m="$MNT" '{ l = $1 " " $3 " " $4 " " $5; if (m != "/stage") l = l " " $7; print l }' \
    <<<"$ends")" "$want"
}
check "no stagefs mount (live or stale) left on any node" no_mounts

# -- job 2: the cache reused across jobs, a corrupted copy replaced, stagectl prefetch
check "job 2: stagectl prefetch exits 0" test "$(r PREFETCH)" = "rc=0"
sums2=$(r SUM2 | sort)
check "job 2: every node reads the source's bytes (n2's corrupted copy was replaced)" \
  all_equal "$sums2" "$IMG_SUM" "$OTHER_SUM"
stats2=$(r STATS2 | sort)
job2_reuse() {
  # local_writes corrupt materializations files, per node: only n2 copied again (other.bin);
  # then bytes_from_source bytes_from_seeds seeded_here: that copy was fed by n1's cache
  # (rank 0, the lowest warm node), not by the source
  local want="n1 0 0 0 2 0 $OTHER_SIZE 1
n2 1 1 1 2 0 $OTHER_SIZE 0
n3 0 0 0 2 0 $OTHER_SIZE 0
n4 0 0 0 2 0 $OTHER_SIZE 0"
  [[ $stats2 == "$want" ]] || { echo "    got:"; echo "$stats2" | sed 's/^/      /'; return 1; }
}
check "job 2: nothing is copied again except n2's corrupted other.bin (detected by CRC once per mount), fed by n1's cache" job2_reuse
check "job 2: the stagefs step stops cleanly after a read of user.stagefs.stop (no escalation)" \
  test "$(field "$(r STOP2)" rc) $(field "$(r STOP2)" escalated)" = "0 no"

if [[ -s $WORK/stagefs.log ]]; then
  echo "    stagefs step log ($MNT):"
  show "$WORK/stagefs.log" 30
elif [[ $stage_line == ok ]]; then
  echo "    stagefs step log:"
  show "$WORK/stagefs-stage.log" 30
fi
[[ -s $WORK/steps.err ]] && { echo "    step errors:"; show "$WORK/steps.err" 20; }

echo "---- total time $((SECONDS - t0))s (cluster up + job + checks)"
finish
