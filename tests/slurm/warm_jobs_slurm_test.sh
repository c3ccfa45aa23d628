#!/usr/bin/env bash
# warm_jobs_slurm_test.sh BUILD_DIR
#
# Job after job, as a user runs them, on a simulated 4-node Slurm cluster
# (tests/harness/simslurm.sh: each node with its own hostname, /tmp, /nvme, /stage and mount
# namespace). An unprivileged user (stagefs-warm, created if missing) submits, with sbatch:
#
#   job 1 (sbatch -N2 -w n[1-2]):
#     srun --overlap --ntasks-per-node=1 --mpi=pmix stagefs SRC /stage/USER/mnt --cache /nvme/USER/stagefs &
#     stagefs --wait; every node reads the 256 MiB image, every small file of the dataset
#     directory (its first open stages the directory's small files as one batch) and a file
#     with two hard links; scancel --signal=TERM the stagefs step
#   job 2 (sbatch -N4): the same mount over the same caches (n1 and n2 warm, n3 and n4 cold);
#     every node's FIRST opens of the same files, at once, then of the second name of the
#     hard-linked file
#
# Checks:
#   1. both jobs run to their end
#   2. job 2: every node's reads succeed with the source's bytes (sha256 of the image, of the
#      dataset's files in name order, of both names of the linked file)
#   3. job 2: user.stagefs.stats on every node: no byte read from the shared source, no failed
#      transfer, no failed open, no feed that had to be replaced
#   4. job 2: the image was fed by a warm node's cache (the log line "fed by rank N's cache")
#   5. every node's cache holds the source's image at the end
# Before the fix of the first-open EIO, every node's read of the image in job 2 failed
# (Input/output error): the seed's own open changed its copy's ctime while it fed the transfer.
#
# Exit: 0 all checks passed, 1 some check failed, 77 skipped (not root / Slurm, munge or fuse
# missing). Prints "PASS: ..." / "FAIL: ..." per check and a closing "warm_jobs_slurm: N passed,
# N failed" line. The simulated cluster is restarted fresh at the start and torn down on exit.
#
# Environment:
#   STAGEFS        binary to test (default BUILD_DIR/tools/stagefs); on a path every node sees
#   SIMSLURM_ROOT  harness state root (see simslurm.sh)
#   WARM_USER      the user who submits the jobs (default stagefs-warm)
#   IMAGE_MB       size of the image (default 256)
#   STEP_TIMEOUT   seconds allowed per job step (default 60); JOB_TIMEOUT per job (default 150)
set -uo pipefail

NAME=warm_jobs_slurm
NODES=4
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HARNESS=$HERE/../harness/simslurm.sh
STEP_TIMEOUT=${STEP_TIMEOUT:-60}
JOB_TIMEOUT=${JOB_TIMEOUT:-150}
IMAGE_MB=${IMAGE_MB:-256}
USER_NAME=${WARM_USER:-stagefs-warm}

# shellcheck source=checks.sh
source "$HERE/checks.sh"

(($# == 1)) || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "FAIL: build dir '$1' not found"; exit 1; }
BIN=${STAGEFS:-$BUILD_DIR/tools/stagefs}

[[ $(id -u) == 0 ]] || skip "needs root (simulated Slurm uses mount/UTS namespaces)"
for tool in slurmd slurmctld srun sbatch scancel munged runuser useradd nsenter mknod fusermount3 python3; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
done
[[ -c /dev/fuse ]] || skip "/dev/fuse missing"
[[ -x $BIN ]] || { fail "stagefs binary exists: $BIN"; finish; exit 1; }
BIN=$(readlink -f "$BIN")
case $BIN in /tmp/* | /nvme/* | /stage/*) fail "stagefs binary outside /tmp, /nvme, /stage: $BIN"; finish; exit 1 ;; esac

WORK=
JOBID=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -n $JOBID ]] && timeout 15 scancel "$JOBID" >/dev/null 2>&1
  "$HARNESS" down >/dev/null 2>&1 || echo "warning: simslurm down failed" >&2
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# the user, unprivileged, who submits both jobs
id -u "$USER_NAME" >/dev/null 2>&1 || useradd --system --no-create-home --shell /bin/sh "$USER_NAME" ||
  { fail "create user $USER_NAME"; finish; exit 1; }

info "bringing up $NODES fresh simulated nodes"
"$HARNESS" down >/dev/null 2>&1 || true
"$HARNESS" up "$NODES" || { fail "simulated cluster comes up"; finish; exit 1; }
eval "$("$HARNESS" env)"

# What a site prepares for its users on every node, made from the host side of each node:
# the user's own cache directory and mount point (from the node's /nvme and /stage). Each node's
# /dev/fuse is a device node of its own (the harness's), which the admin kit's prolog opens to
# users; made so here too, for the steps of a job whose prolog has not run on that node yet.
for ((k = 1; k <= NODES; k++)); do
  nd=$SIMSLURM_ROOT/nodes/n$k
  install -d -o "$USER_NAME" -m 0700 "$nd/nvme/$USER_NAME"
  install -d -o "$USER_NAME" -m 0755 "$nd/stage/$USER_NAME" "$nd/stage/$USER_NAME/mnt"
  chmod 0666 "$nd/fuse" || { fail "n$k: a /dev/fuse users may open"; finish; exit 1; }
done

WORK=$(mktemp -d "$SIMSLURM_ROOT/shared/warm-jobs.XXXXXX")
chmod 0755 "$WORK"
SRC=$WORK/src
OUT=$WORK/out # the jobs write here: the user's
mkdir -p "$SRC/data"
install -d -o "$USER_NAME" -m 0755 "$OUT"
info "creating the source: a $IMAGE_MB MiB image, a directory of small files, a file with two names"
head -c $((IMAGE_MB << 20)) /dev/urandom >"$SRC/image.bin"
for i in $(seq -w 1 40); do head -c $((1000 + 10#$i * 997)) /dev/urandom >"$SRC/data/s$i"; done
head -c $((40 << 20)) /dev/urandom >"$SRC/linked"
ln "$SRC/linked" "$SRC/linked.2"
chmod -R a+rX "$SRC"
IMG_SUM=$(sha256sum "$SRC/image.bin" | cut -d' ' -f1)
DATA_SUM=$(cat "$SRC"/data/s* | sha256sum | cut -d' ' -f1)
LINK_SUM=$(sha256sum "$SRC/linked" | cut -d' ' -f1)

# The job script (both jobs): mount, read on every node, record, stop. Arguments:
# STAGEFS SRC OUT STEP_TIMEOUT TAG (TAG: job1 or job2; job 2 also reads the second name).
JOB=$WORK/job.sh
cat >"$JOB" <<'JOBEOF'
#!/bin/bash
# shellcheck disable=SC2016  # the sh -c '...' snippets are expanded by the tasks' sh
STAGEFS=$1 SRC=$2 OUT=$3 T=$4 TAG=$5
ME=$(id -un)
MNT=/stage/$ME/mnt CACHE=/nvme/$ME/stagefs
rec() { echo "$TAG $*" >>"$OUT/results"; }
step() { timeout --kill-after=10 "$T" srun --overlap "$@"; }
all() { step -N"$SLURM_NNODES" --ntasks-per-node=1 "$@"; }
timeout --kill-after=10 $((3 * T)) srun --overlap --ntasks-per-node=1 --mpi=pmix \
  "$STAGEFS" "$SRC" "$MNT" --cache "$CACHE" >"$OUT/stagefs-$TAG.log" 2>&1 &
SPID=$!
if "$STAGEFS" --wait "$MNT" --wait-timeout "$T" 2>>"$OUT/steps-$TAG.err"; then
  rec "MOUNTED"
  # every node's first opens, at once: the image, the dataset's files in name order, the
  # hard-linked file (job 2: then its second name)
  all sh -c 's() { sha256sum "$@" 2>&1 | cut -d" " -f1; }
    img=$(s "$1/image.bin"); data=$(cat "$1"/data/s* | s); l=$(s "$1/linked")
    if [ "$2" = job2 ]; then l2=$(s "$1/linked.2"); else l2=-; fi
    echo "SUM $(hostname) $img $data $l $l2"' sh "$MNT" "$TAG" >>"$OUT/sums-$TAG" 2>>"$OUT/steps-$TAG.err"
  rec "READ rc=$?"
  # each node writes its own file: srun splits an output line longer than 1 KiB, and lines of
  # several tasks interleave
  all sh -c 'echo "STATS $(hostname) $(python3 -c "import os,sys; print(os.getxattr(sys.argv[1], \"user.stagefs.stats\").decode())" "$1")" \
    >"$2/stats-$3.$(hostname)"' sh "$MNT" "$OUT" "$TAG" 2>>"$OUT/steps-$TAG.err"
else
  rec "NOT_MOUNTED"
fi
id=$(timeout 15 squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' | awk '$2 == "stagefs" { print $1; exit }')
[ -n "$id" ] && timeout 15 scancel --signal=TERM "$id"
timeout 30 tail --pid="$SPID" -f /dev/null
wait "$SPID"
rec "STOPPED rc=$?"
rec "DONE"
JOBEOF
chmod 0755 "$JOB"

# run_job TAG SBATCH_ARGS...: submits the job as the user, waits for its end (checks.sh)
run_job() {
  local tag=$1 rc=0
  shift
  info "$tag: sbatch $* as $USER_NAME"
  JOBID=$(cd "$OUT" && timeout 30 runuser -u "$USER_NAME" -- sbatch "$@" --time=$(((JOB_TIMEOUT + 59) / 60)) \
    --parsable -o "$OUT/job-$tag.out" "$JOB" "$BIN" "$SRC" "$OUT" "$STEP_TIMEOUT" "$tag" 2>"$OUT/sbatch-$tag.err") || rc=$?
  JOBID=${JOBID%%;*}
  if ((rc != 0)) || ! [[ $JOBID =~ ^[0-9]+$ ]]; then
    echo "    sbatch failed (exit $rc):"
    show "$OUT/sbatch-$tag.err"
    return 1
  fi
  local state
  state=$(wait_job "$JOBID" "$JOB_TIMEOUT")
  JOBID=
  echo "    $tag: $state"
  [[ $state == "COMPLETED 0:0" ]] && grep -qx "$tag DONE" "$OUT/results"
}
ulimit -c unlimited 2>/dev/null || true
# a rank that died inside Open MPI's MPI_Init (checks.sh): that job once more, on fresh nodes
run_job_retrying() {
  rm -f "$OUT"/core "$OUT"/core.[0-9]*
  run_job "$@" && return 0
  ompi_init_crash "$OUT" || return 1
  echo "RETRY: a rank died inside MPI_Init (Open MPI, not stagefs): job $1 again"
  sed -i "/^$1 /d" "$OUT/results"
  rm -f "$OUT/sums-$1" "$OUT/stats-$1".*
  run_job "$@"
}

t0=$SECONDS
check "job 1 (2 nodes, cold caches) runs to its end" run_job_retrying job1 -N2 -w "n[1-2]"
check "job 1: every node read the source's bytes" \
  test "$(awk -v w="$IMG_SUM $DATA_SUM $LINK_SUM -" '{ h = $2; $1 = $2 = ""; sub(/^ +/, ""); if ($0 == w) n++ } END { print n + 0 }' "$OUT/sums-job1" 2>/dev/null)" = 2
check "job 2 (4 nodes, n1 and n2 warm) runs to its end" run_job_retrying job2 -N4
echo "    jobs took $((SECONDS - t0)) s"

sums_ok() {
  local bad
  [[ $(wc -l <"$OUT/sums-job2") == "$NODES" ]] || { echo "    $(wc -l <"$OUT/sums-job2") nodes read"; show "$OUT/sums-job2"; return 1; }
  bad=$(awk -v w="$IMG_SUM $DATA_SUM $LINK_SUM $LINK_SUM" '{ h = $2; $1 = $2 = ""; sub(/^ +/, ""); if ($0 != w) print h ": " $0 }' "$OUT/sums-job2")
  [[ -z $bad ]] || { echo "$bad" | sed 's/^/    | /'; return 1; }
}
check "job 2: every node's first opens (image, small-file batch, hard-linked file, its second name) read the source's bytes" sums_ok

stats_ok() {
  python3 - "$NODES" "$OUT"/stats-job2.* <<'PY'
import json, sys
lines = [l.split(" ", 2) for f in sys.argv[2:] for l in open(f) if l.startswith("STATS ")]
ok = len(lines) == int(sys.argv[1])
for _, host, js in lines:
    s = json.loads(js)
    vals = {k: s.get(k) for k in ("bytes_from_source", "transfer_failures", "open_errors", "feed_retries")}
    good = all(v == 0 for v in vals.values()) and s.get("bytes_from_seeds", 0) > 0
    ok = ok and good
    print("    %s %s bytes_from_seeds=%s%s" % (host, " ".join("%s=%s" % kv for kv in vals.items()),
                                             s.get("bytes_from_seeds"), "" if good else "  <-- wrong"))
sys.exit(0 if ok else 1)
PY
}
check "job 2: on every node, 0 bytes from the shared source, no failed transfer, open or feed" stats_ok
check "job 2: the image was fed by a warm node's cache" \
  grep -qE "materialized image\.bin .*fed by rank [01]'s cache" "$OUT/stagefs-job2.log"
caches_ok() {
  local k bad=0
  for ((k = 1; k <= NODES; k++)); do
    cmp -s "$SRC/image.bin" "$SIMSLURM_ROOT/nodes/n$k/nvme/$USER_NAME/stagefs/data/image.bin" ||
      { echo "    n$k: the cached image differs from the source"; bad=1; }
  done
  ((bad == 0))
}
check "every node's cache holds the source's image" caches_ok
if ((nfail > 0)); then
  for f in "$OUT"/stagefs-job2.log "$OUT"/steps-job2.err "$OUT"/job-job2.out; do
    [[ -s $f ]] && { echo "    $f:"; grep -vE '^\s*$' "$f" | tail -n 20 | sed 's/^/    | /'; }
  done
fi
finish
