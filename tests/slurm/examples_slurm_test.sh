#!/usr/bin/env bash
# examples_slurm_test.sh BUILD_DIR EXAMPLE...      EXAMPLE: stage-image | container | dataset | pyxis
#
# Runs job scripts of packaging/examples/ as they are, one after the other, with sbatch on one
# simulated 4-node Slurm cluster (tests/harness/simslurm.sh; each node with its own hostname,
# /tmp, /nvme, /stage and mount namespace, and stagefs's admin kit as its prolog and epilog),
# submitted by an ordinary user (stagefs-u1), the build's stagefs and stage-bcast first on
# PATH. Each example runs twice: round 1 from empty node caches, round 2 right after, as the
# user's next job, from what round 1 left in the user's caches. The container image is a
# SquashFS made here from busybox-static (tiny: /bin/busybox, a data file, /etc/motd); the
# runtime is Charliecloud's ch-run.
#
# Checks (every example, both rounds): the job completes (COMPLETED, exit 0) within
# JOB_TIMEOUT (60 s); for the stagefs examples also: stagefs run printed its summary and
# nothing of Slurm's cancel or kill noise (no "CANCELLED", "kill:", "scancel:" in the job's
# output), the daemons stopped cleanly, no stagefs process or mount is left on any node and the
# epilog removed the job's mount point.
#   stage-image  ch-run ran on 4 distinct nodes and read the image's data file correctly;
#                every node's copy (in the user's directory) equals the shared image;
#                round 2: stage-bcast copied nothing (every node's copy already current)
#   container    ch-run ran on 4 distinct nodes from the mount and read the data file
#                correctly; round 1: 1 transfer of the image's size read from the shared source
#                (4 first opens, one broadcast); round 2: no transfer (every node's copy came
#                from the user's cache); every node's cache holds the image
#   dataset      16 readers (4 per node, 4 nodes) each read every file of a 12-file dataset
#                and saw the source's contents; round 1: for 16 x 12 opens one transfer per
#                file over 1 MiB and one per directory for the smaller ones (a batch), bytes
#                = the dataset's size; round 2: no transfer; every node's cache holds every file
#   pyxis        as container, with a stand-in for pyxis (not installable here):
#                pyxis-standin/srun, first on the job's PATH, turns --container-image=IMG into
#                `ch-run IMG --` and, as pyxis does, runs a step without --container-image in
#                $PYXIS_CONTAINER_IMAGE when that is set. The job is submitted with
#                PYXIS_CONTAINER_IMAGE exported. Checks: the stagefs step still ran on the
#                nodes (not in the container), the container step ran in the mount's app.sqsh
#                on 4 nodes and read the data correctly, transfers as for container, caches,
#                clean stop. What pyxis and enroot themselves do with the image is not checked.
#
# Each example starts round 1 from empty caches of the user and a work directory of its own;
# a failed example does not stop the next.
# Exit: 0 all passed, 1 some check failed, 77 skipped (not root, or slurmd, munge, ch-run,
# busybox-static, mksquashfs or /dev/fuse missing). The cluster is brought up fresh and torn
# down on exit.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HARNESS=$HERE/../harness/simslurm.sh
EXAMPLES=$HERE/../../packaging/examples
NODES=4
JOB_TIMEOUT=${JOB_TIMEOUT:-60}
# shellcheck source=checks.sh
source "$HERE/checks.sh" # NAME is read by its finish

(($# >= 2)) || { echo "usage: $0 BUILD_DIR stage-image|container|dataset|pyxis..." >&2; exit 2; }
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "FAIL: build dir '$1' not found"; exit 1; }
shift
EXAMPLE_LIST=("$@")
export NAME="examples (${EXAMPLE_LIST[*]})"
for EXAMPLE in "${EXAMPLE_LIST[@]}"; do
  [[ -f $EXAMPLES/$EXAMPLE.sbatch ]] || { echo "FAIL: no $EXAMPLES/$EXAMPLE.sbatch"; exit 1; }
done

[[ $(id -u) == 0 ]] || skip "needs root (simulated Slurm uses mount/UTS namespaces)"
for tool in slurmd slurmctld srun sbatch munged mksquashfs getfattr; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
done
for EXAMPLE in "${EXAMPLE_LIST[@]}"; do
  if [[ $EXAMPLE != stage-image ]]; then
    if [[ ! -c /dev/fuse ]] || ! command -v fusermount3 >/dev/null; then skip "/dev/fuse or fusermount3 missing"; fi
  fi
  if [[ $EXAMPLE != dataset ]]; then
    command -v ch-run >/dev/null || skip "ch-run not installed (apt-get install charliecloud-runtime)"
    if ! file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then
      skip "a static /bin/busybox is needed for the test image (apt-get install busybox-static)"
    fi
  fi
done
for b in stagefs stage-bcast; do
  [[ -x $BUILD_DIR/tools/$b ]] || { echo "FAIL: $BUILD_DIR/tools/$b missing"; exit 1; }
done

WORK='' JOBID='' WORKS=() CH_MNT=''
RUN_USER=${SIMSLURM_USERS:-stagefs-u1}
RUN_USER=${RUN_USER%% *}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -n $JOBID ]] && timeout 15 scancel "$JOBID" >/dev/null 2>&1
  "$HARNESS" down >/dev/null 2>&1 || echo "warning: simslurm down failed" >&2
  local w
  for w in "${WORKS[@]}"; do [[ -d $w ]] && rm -rf "$w"; done
  [[ -n $CH_MNT ]] && rm -rf "${CH_MNT%/mnt}"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ulimit -c unlimited 2>/dev/null || true # a crashed rank leaves a core for ompi_init_crash
t0=$SECONDS
cluster_up || { finish; exit 1; }
echo "    jobs are submitted by $RUN_USER"
# what the user's environment has: the commands on PATH (simslurm.sh as sets USER, HOME)
export PATH=$BUILD_DIR/tools:$PATH
# ch-run mounts a SquashFS image on /var/tmp/$USER.ch/mnt, creating it if needed. Real nodes
# each have their own /var/tmp; the simulated nodes share this machine's, and ch-run's mkdir
# is not EEXIST-tolerant ("can't mkdir: /var/tmp/USER.ch: File exists" when four nodes race),
# so the test creates it, the user's, before the jobs and removes it at the end.
if [[ ! -e /var/tmp/$RUN_USER.ch ]]; then
  CH_MNT=/var/tmp/$RUN_USER.ch/mnt
  mkdir -p "$CH_MNT"
  chown -R "$RUN_USER:" "${CH_MNT%/mnt}"
fi

sum() { sha256sum "$1" | cut -d' ' -f1; }
# human BYTES: as stagefs run's summary writes sizes
human() {
  python3 -c 'import sys
b, u = float(sys.argv[1]), 0
while b >= 1024 and u < 4: b, u = b / 1024, u + 1
print(("%.0f %s" if u == 0 else "%.2f %s") % (b, ["B", "KiB", "MiB", "GiB", "TiB"][u]))' "$1"
}

# the test image: busybox, a 4 MiB data file, /etc/motd, and what ch-run binds over
make_image() {
  local img=$WORK/img c
  mkdir -p "$img"/{bin,dev,proc,sys,tmp,etc,home,root,mnt,usr,var,run}
  cp /bin/busybox "$img/bin/"
  for c in sh cat cut sha256sum hostname ls; do ln -s busybox "$img/bin/$c"; done
  touch "$img"/etc/{passwd,group,hosts,resolv.conf}
  echo "hello-from-the-image" >"$img/etc/motd"
  head -c $((4 << 20)) /dev/urandom >"$img/data.bin"
  DATA_SUM=$(sum "$img/data.bin")
  mksquashfs "$img" "$SHARED/app.sqsh" -noappend -quiet -no-progress >"$WORK/mksquashfs.log" 2>&1
}
# what the container runs: one line per node
# shellcheck disable=SC2016  # expanded inside the container
IN_CONTAINER=(sh -c 'echo "CONTAINER $(hostname) $(sha256sum /data.bin | cut -d" " -f1) $(cat /etc/motd)"')

# submit SBATCH_ARGS... -- SCRIPT_ARGS...: sbatch the example as the user, wait until it ends;
# sets JOBID, STATE ("COMPLETED 0:0"), output in $WORK/job.out. A job in which a rank died
# inside Open MPI's MPI_Init (ompi_init_crash, checks.sh) runs once more on a fresh cluster.
submit() {
  rm -f "$WORK"/core "$WORK"/core.[0-9]*
  submit_once "$@" || return 1
  job_ok && return 0
  ompi_init_crash "$WORK" || return 0
  echo "RETRY: a rank died inside MPI_Init (Open MPI, not stagefs): the job again, once, on fresh nodes"
  rm -f "$WORK"/core "$WORK"/core.[0-9]*
  "$HARNESS" down >/dev/null 2>&1 || true
  "$HARNESS" up "$NODES" >/dev/null 2>&1 || { echo "    simulated cluster did not come up again"; return 1; }
  submit_once "$@"
}
submit_once() {
  local sargs=() rc=0
  while (($#)) && [[ $1 != -- ]]; do sargs+=("$1"); shift; done
  shift
  info "sbatch -N$NODES ${sargs[*]} $(basename "$SCRIPT") $* (as $RUN_USER)"
  local js=$SECONDS
  rm -f "$WORK/job.out"
  JOBID=$(timeout 30 "$HARNESS" as "$RUN_USER" -- sbatch -N"$NODES" "${sargs[@]}" --time=5 --chdir="$WORK" \
    --parsable -o "$WORK/job.out" "$SCRIPT" "$@" 2>"$WORK/sbatch.err") || rc=$?
  JOBID=${JOBID%%;*}
  STATE=
  if ((rc != 0)) || [[ ! $JOBID =~ ^[0-9]+$ ]]; then show "$WORK/sbatch.err"; return 1; fi
  STATE=$(wait_job "$JOBID" "$JOB_TIMEOUT")
  echo "$STATE" >"$WORK/state"
  echo "$JOBID" >"$WORK/jobid"
  echo "    job $JOBID: ${STATE:-no state} after $((SECONDS - js))s; output:"
  touch "$WORK/job.out"
  show "$WORK/job.out" 60
  JOB_SECS=$((SECONDS - js))
  echo "$JOB_SECS" >"$WORK/job-secs"
}
job_ok() { [[ $STATE == "COMPLETED 0:0" ]]; } # and not cancelled at JOB_TIMEOUT

containers_ok() {
  all_equal "$(sed -n 's/^CONTAINER //p' "$WORK/job.out" | sort)" "$DATA_SUM hello-from-the-image"
}
# staged TEXT: stagefs run's summary line says TEXT (after "stagefs run: MOUNTPOINT, ")
staged() {
  local line
  line=$(grep -E '^stagefs run: /stage/[0-9]+, ' "$WORK/job.out" | tail -n 1)
  [[ -n $line ]] || { echo "    no summary line from stagefs run"; return 1; }
  [[ $line == *"$1"* ]] || { echo "    the summary says: ${line#stagefs run: }"; echo "    expected: $1"; return 1; }
}
# round 2's summary: no transfer, and every open on n1 (ch-run opens the image twice) a hit
all_from_cache() {
  staged "4 nodes, 0 transfers; on n1 " &&
    grep -qE '^stagefs run: .*; on n1 ([1-9][0-9]*) opens?, \1 from the cache$' "$WORK/job.out"
}
# the user's cache on each node (the prolog's /nvme/stagefs/USER)
CACHE=/nvme/stagefs/$RUN_USER
# the daemons stopped on their own (stagefs run said nothing of it), nothing is left behind
stopped_cleanly() {
  ! grep -q '^stagefs run: the stagefs step ended with' "$WORK/job.out" || { echo "    the daemons did not stop cleanly"; return 1; }
  nothing_left "$(cat "$WORK/jobid")"
}
# count N ONE MANY: "1 batch", "3 batches"
count() { if (($1 == 1)); then echo "1 $2"; else echo "$1 $3"; fi; }

# run_example ROUND: round 1 from empty caches of the user, in a work directory of its own;
# round 2 in the same one, the user's next job, over what round 1 left in the user's caches
run_example() {
local round=$1
SCRIPT=$EXAMPLES/$EXAMPLE.sbatch JOB_SECS=''
if ((round == 1)); then
  WORK=$(mktemp -d "$SIMSLURM_ROOT/shared/example-test.XXXXXX")
  WORKS+=("$WORK")
  chmod 0755 "$WORK"
  SHARED=$WORK/shared
  mkdir -p "$SHARED"
  per_node "rm -rf $CACHE" >/dev/null # the next job's prolog makes it again, empty
  case $EXAMPLE in
    dataset)
      NFILES=12 READERS=4
      for i in $(seq 1 $NFILES); do
        mkdir -p "$SHARED/part$((i % 3))"
        head -c $(((i % 4 + 1) << 19)) /dev/urandom >"$SHARED/part$((i % 3))/shard-$i.bin"
      done
      (cd "$SHARED" && find . -type f -exec sha256sum {} + | awk '{ print $1, $2 }' | sort -k2) >"$WORK/expected"
      TOTAL=$(find "$SHARED" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
      ;;
    *)
      make_image || { fail "test image built"; show "$WORK/mksquashfs.log"; return 1; }
      IMG_SUM=$(sum "$SHARED/app.sqsh") IMG_SIZE=$(stat -c %s "$SHARED/app.sqsh")
      ;;
  esac
  chown "$RUN_USER:" "$WORK" # the job's output and its ranks' cores go there
fi
info "example $EXAMPLE, round $round"
case $EXAMPLE in
stage-image)
  submit -- "$SHARED/app.sqsh" "${IN_CONTAINER[@]}"
  check "the job completes (COMPLETED, exit 0) within ${JOB_TIMEOUT}s" job_ok
  check "ch-run ran on $NODES distinct nodes from the local copy and read the image's data correctly" containers_ok
  # shellcheck disable=SC2016
  check "every node's $CACHE/images/app.sqsh equals the shared image" \
    all_equal "$(per_node 'echo "$(hostname) $(sha256sum '"$CACHE"'/images/app.sqsh | cut -d" " -f1)"')" "$IMG_SUM"
  if ((round == 2)); then
    check "round 2: stage-bcast copied nothing (every node's copy was current)" \
      grep -q '4 node(s), 0 wrote, 0 file(s) / 0 B broadcast' "$WORK/job.out"
  fi
  ;;
container | pyxis)
  if [[ $EXAMPLE == pyxis ]]; then
    # a user who exported PYXIS_CONTAINER_IMAGE: pyxis would run every step in that image
    rm -f "$WORK/pyxis-standin.log"
    (
      export PYXIS_STANDIN_SRUN PYXIS_STANDIN_LOG=$WORK/pyxis-standin.log PYXIS_CONTAINER_IMAGE=$SHARED/app.sqsh
      PYXIS_STANDIN_SRUN=$(command -v srun)
      export PATH=$HERE/pyxis-standin:$PATH
      submit -- "$SHARED" app.sqsh "${IN_CONTAINER[@]}"
    )
    STATE=$(cat "$WORK/state" 2>/dev/null) JOB_SECS=$(cat "$WORK/job-secs" 2>/dev/null) # submit ran in a subshell
  else
    submit -- "$SHARED" app.sqsh "${IN_CONTAINER[@]}"
  fi
  check "the job completes (COMPLETED, exit 0) within ${JOB_TIMEOUT}s" job_ok
  if [[ $EXAMPLE == pyxis ]]; then
    touch "$WORK/pyxis-standin.log"
    logged() { grep -q "^$1" "$WORK/pyxis-standin.log" || { show "$WORK/pyxis-standin.log"; return 1; }; }
    check "with PYXIS_CONTAINER_IMAGE in the job's environment, the stagefs step still ran on the nodes" \
      logged "host: .*/stagefs "
    check "the container step ran in the mount's app.sqsh (--container-image)" \
      logged "container /stage/$(cat "$WORK/jobid")/app.sqsh: "
  fi
  check "the container ran on $NODES distinct nodes from the mount and read the image's data correctly" containers_ok
  if ((round == 1)); then
    check "4 nodes' first opens of the image: 1 transfer of $IMG_SIZE bytes, read from the shared source" \
      staged "4 nodes, 1 transfer, $(human "$IMG_SIZE") staged: $(human "$IMG_SIZE") read from the shared source, 0 B from node caches"
  else
    check "round 2: no transfer, every open on n1 served from the user's cache" all_from_cache
  fi
  # shellcheck disable=SC2016
  check "every node's cache ($CACHE) holds the image" \
    all_equal "$(per_node 'echo "$(hostname) $(sha256sum '"$CACHE"'/data/app.sqsh | cut -d" " -f1)"')" "$IMG_SUM"
  check "no cancel, kill or error message in the job's output" quiet "$WORK/job.out"
  check "stagefs stopped cleanly: no stagefs process or mount left on any node, the mount point removed" stopped_cleanly
  ;;
dataset)
  # the simulated nodes have nproc CPUs (2 here): a job of 2 tasks per node, 4 readers each
  export READERS_PER_NODE=$READERS
  submit --ntasks-per-node=$(($(nproc) < READERS ? $(nproc) : READERS)) -- "$SHARED"
  check "the job completes (COMPLETED, exit 0) within ${JOB_TIMEOUT}s" job_ok
  readers_ok() {
    local r lines bad=0 hosts
    hosts=$(awk '$1 == "READER" { print $2, $3 }' "$WORK/job.out" | sort -u | awk '{ print $2 }' | sort | uniq -c)
    [[ $(awk -v want="$READERS" '$1 == want { n++ } END { print n + 0 }' <<<"$hosts") -eq $NODES ]] ||
      { echo "    readers per host:"; show <(echo "$hosts"); return 1; }
    for ((r = 0; r < NODES * READERS; r++)); do
      lines=$(awk -v r=$r '$1 == "READER" && $2 == r { print $4, $5 }' "$WORK/job.out" | sort -k2)
      [[ $lines == "$(cat "$WORK/expected")" ]] || { echo "    reader $r saw something else"; bad=1; }
    done
    ((bad == 0))
  }
  check "$((NODES * READERS)) readers ($READERS on each of $NODES nodes) each read all $NFILES files correctly" readers_ok
  # one transfer per file over stagefs's --small-file-size (1 MiB by default), one per
  # directory for the files at or under it (a batch)
  LARGE=$(find "$SHARED" -type f -size +1048576c | wc -l)
  SMALL=$(find "$SHARED" -type f ! -size +1048576c | wc -l)
  BATCHES=$(find "$SHARED" -type f ! -size +1048576c -printf '%h\n' | sort -u | wc -l)
  if ((round == 1)); then
    check "$((NODES * READERS * NFILES)) opens: $((LARGE + BATCHES)) transfers ($LARGE large files, $BATCHES directory batches of small files), $TOTAL bytes from the shared source" \
      staged "4 nodes, $((LARGE + BATCHES)) transfers ($(count "$SMALL" "small file" "small files") in $(count "$BATCHES" batch batches)), $(human "$TOTAL") staged: $(human "$TOTAL") read from the shared source, 0 B from node caches"
  else
    check "round 2: no transfer, every file came from the user's cache" staged "4 nodes, 0 transfers;"
  fi
  # shellcheck disable=SC2016
  check "every node's cache holds every file" \
    all_equal "$(per_node 'cd '"$CACHE"'/data && echo "$(hostname) $(find . -type f -exec sha256sum {} + | awk "{ print \$1, \$2 }" | sort -k2 | sha256sum | cut -d" " -f1)"')" \
    "$(sha256sum <"$WORK/expected" | cut -d' ' -f1)"
  check "no cancel, kill or error message in the job's output" quiet "$WORK/job.out"
  check "stagefs stopped cleanly: no stagefs process or mount left on any node, the mount point removed" stopped_cleanly
  ;;
esac
echo "    the job took ${JOB_SECS:-?}s (limit ${JOB_TIMEOUT}s)"
}

for EXAMPLE in "${EXAMPLE_LIST[@]}"; do
  if run_example 1; then run_example 2 || true; fi
done
echo "---- total time $((SECONDS - t0))s (cluster up + jobs + checks)"
finish
