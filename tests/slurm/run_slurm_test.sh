#!/usr/bin/env bash
# run_slurm_test.sh BUILD_DIR
#
# `stagefs run` as the users of a cluster run it: jobs submitted by two ordinary users
# (stagefs-u1, stagefs-u2) to a simulated 4-node Slurm (tests/harness/simslurm.sh), whose
# nodes run stagefs's admin kit as their prolog and epilog (each job gets /stage/JOBID, each
# user /nvme/stagefs/USER, theirs alone). Each job script is one line:
#   stagefs run SRC -- COMMAND...
#
# Checks:
#   one line      a job of u1 whose command reads the file through the mount on every node
#                 and exits 3: every node read the source's bytes, the job's exit status is 3,
#                 stagefs run printed its summary (1 transfer), the job's output has none of
#                 Slurm's cancel or kill messages and no error, nothing is left on any node
#                 (no stagefs process or mount, /stage/JOBID removed by the epilog)
#   together      three jobs on the same 4 nodes at the same time (a barrier in their commands
#                 proves it): two of u1, one of u2. Each reads the source's bytes through its
#                 own mount; no task of one user can list the other user's mount point or
#                 cache, nor create anything in /stage or /nvme/stagefs; on every node one of
#                 u1's two jobs used a spare cache (CACHE/spare.1); every cache directory is
#                 its user's, mode 0700
#   reuse         u1's next job: no transfer, every open a cache hit (0 bytes read anywhere)
#   refused       u1's job with --cache in a directory that, on n3 only, belongs to u2: the job
#                 ends with status 125 long before --wait-timeout (600 s), quoting n3's error
#                 (the owner's uid and name), and its command never runs
#   scancel       u1's job cancelled (scancel, by u1) while its command runs on the mount:
#                 nothing is left on any node
#
# Exit: 0 all passed, 1 some check failed, 77 skipped (not root; slurmd, munge, setpriv or
# /dev/fuse missing). The cluster is brought up fresh and torn down on exit.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HARNESS=$HERE/../harness/simslurm.sh
NODES=4
JOB_TIMEOUT=${JOB_TIMEOUT:-60}
# shellcheck source=checks.sh
source "$HERE/checks.sh"
export NAME=run_slurm

(($# == 1)) || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "FAIL: build dir '$1' not found"; exit 1; }
[[ $(id -u) == 0 ]] || skip "needs root (simulated Slurm uses mount/UTS namespaces)"
for tool in slurmd slurmctld srun sbatch squeue scancel munged setpriv fusermount3; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
done
[[ -c /dev/fuse ]] || skip "/dev/fuse missing"
[[ -x $BUILD_DIR/tools/stagefs ]] || { echo "FAIL: $BUILD_DIR/tools/stagefs missing"; exit 1; }
U1=stagefs-u1 U2=stagefs-u2
export SIMSLURM_USERS="$U1 $U2"

WORK='' JOBS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  ((${#JOBS[@]})) && timeout 15 scancel "${JOBS[@]}" >/dev/null 2>&1
  "$HARNESS" down >/dev/null 2>&1 || echo "warning: simslurm down failed" >&2
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ulimit -c unlimited 2>/dev/null || true # a crashed rank leaves a core (ompi_init_crash)
t0=$SECONDS
cluster_up || { finish; exit 1; }
export PATH=$BUILD_DIR/tools:$PATH

WORK=$(mktemp -d "$SIMSLURM_ROOT/shared/run-test.XXXXXX")
chmod 0755 "$WORK"
SRC=$WORK/src BAR=$WORK/barrier OUT=$WORK/out
mkdir -p "$SRC" "$BAR" "$OUT"
chmod 1777 "$BAR" "$OUT" # the jobs of both users write there
head -c $((8 << 20)) /dev/urandom >"$SRC/app.bin"
SUM=$(sha256sum "$SRC/app.bin" | cut -d' ' -f1) SIZE=$(stat -c %s "$SRC/app.bin")
# the job script: one line (its arguments: SOURCE_DIR, then stagefs run's options and the command)
printf '#!/bin/bash\nexec stagefs run "$@"\n' >"$WORK/job.sh"
chmod 0755 "$WORK/job.sh"

# submit USER NAME SBATCH_ARGS... -- JOB_ARGS...: sbatch as USER; prints the job id
submit() {
  local user=$1 name=$2 sargs=() id
  shift 2
  while (($#)) && [[ $1 != -- ]]; do sargs+=("$1"); shift; done
  shift
  id=$(timeout 30 "$HARNESS" as "$user" -- sbatch -N"$NODES" --ntasks-per-node=1 --time=5 --chdir="$WORK" \
    --parsable -o "$OUT/$name.out" "${sargs[@]}" "$WORK/job.sh" "$@" 2>"$OUT/$name.sbatch.err") ||
    { show "$OUT/$name.sbatch.err"; return 1; }
  id=${id%%;*}
  JOBS+=("$id")
  echo "$id"
}
# ended NAME ID: waits for the job's end (wait_job); "EXIT:SIGNAL" or TIMEOUT..., and its output
ended() {
  local state
  state=$(wait_job "$2" "$JOB_TIMEOUT")
  echo "    job $2 ($1): $state; output:" >&2
  touch "$OUT/$1.out"
  show "$OUT/$1.out" 40 >&2
  echo "${state#* }"
}
summary() { grep -E '^stagefs run: /stage/[0-9]+, ' "$OUT/$1.out" | tail -n 1; }
# sums NAME: every node's SUM line of the job equals the source's
sums_ok() { all_equal "$(sed -n 's/^SUM //p' "$OUT/$1.out" | sort)" "$SUM"; }
# shellcheck disable=SC2016  # expanded on the nodes
READ='echo "SUM $(hostname) $(sha256sum "$STAGEFS_MOUNT/app.bin" | cut -d" " -f1)"'

# ---------------------------------------------------------------------------------------
info "one line: u1's job reads through the mount on every node, its command exits 3"
id=$(submit $U1 one -- "$SRC" -- sh -c 'srun sh -c '"'$READ'"'; exit 3')
state=$(ended one "$id")
check "the job ends with its command's status (3)" test "$state" = 3:0
check "every node read the source's bytes through the mount" sums_ok one
check "stagefs run's summary: 4 nodes, 1 transfer of $SIZE bytes from the shared source" \
  grep -q "^stagefs run: /stage/$id, 4 nodes, 1 transfer, 8.00 MiB staged: 8.00 MiB read from the shared source" "$OUT/one.out"
check "no cancel, kill or error message in the job's output" quiet "$OUT/one.out"
check "nothing left on any node: no stagefs process or mount, /stage/$id removed" nothing_left "$id"

# ---------------------------------------------------------------------------------------
info "together: two jobs of u1 and one of u2 on the same nodes at the same time"
# Each task: a barrier (every task of the three jobs has mounted and says so), its own file
# through its mount, then what it may do to the other user's mount point and cache.
# shellcheck disable=SC2016  # expanded on the nodes
TOGETHER='h=$(hostname); echo "$(id -un)" >"$1/$SLURM_JOB_ID.$h"
  t=0; while [ "$(ls "$1" | grep -c "\.$h\$")" -lt 3 ]; do t=$((t + 1)); [ $t -gt 600 ] && exit 9; sleep 0.1; done
  echo "SUM $h $(sha256sum "$STAGEFS_MOUNT/app.bin" | cut -d" " -f1)"
  me=$(id -un)
  for f in "$1"/*."$h"; do
    j=${f##*/}; j=${j%%.*}; u=$(cat "$f")
    [ "$u" = "$me" ] && continue
    ls "/stage/$j" >/dev/null 2>&1 && echo "LEAK $h $me listed /stage/$j of $u"
    ls "/nvme/stagefs/$u" >/dev/null 2>&1 && echo "LEAK $h $me listed /nvme/stagefs/$u"
  done
  mkdir "/stage/planted-$me" 2>/dev/null && echo "LEAK $h $me created /stage/planted-$me"
  mkdir "/nvme/stagefs/planted-$me" 2>/dev/null && echo "LEAK $h $me created /nvme/stagefs/planted-$me"
  echo "DONE $h"'
a=$(submit $U1 u1a --oversubscribe -- "$SRC" -- srun sh -c "$TOGETHER" sh "$BAR")
b=$(submit $U1 u1b --oversubscribe -- "$SRC" -- srun sh -c "$TOGETHER" sh "$BAR")
c=$(submit $U2 u2 --oversubscribe -- "$SRC" -- srun sh -c "$TOGETHER" sh "$BAR")
sa=$(ended u1a "$a") sb=$(ended u1b "$b") sc=$(ended u2 "$c")
check "the three jobs (u1: $a, $b; u2: $c) complete with status 0" test "$sa $sb $sc" = "0:0 0:0 0:0"
each() { local f=$1 x; shift; for x in "$@"; do "$f" "$x" || return 1; done; }
check "each job's tasks on all 4 nodes passed the barrier together and read the source's bytes" \
  each sums_ok u1a u1b u2
no_leak() { ! grep -h '^LEAK ' "$OUT/u1a.out" "$OUT/u1b.out" "$OUT/u2.out" | sed 's/^/    | /' | grep .; }
check "no task could list the other user's mount point or cache, or create anything in /stage or /nvme/stagefs" no_leak
spares() {
  grep -h "using the spare cache /nvme/stagefs/$U1/spare.1" "$OUT/u1a.out" "$OUT/u1b.out" |
    sed -nE 's/^\[stagefs ([^ ]+) .*/\1 spare/p' | sort
}
check "on every node one of u1's two jobs took the spare cache /nvme/stagefs/$U1/spare.1" all_equal "$(spares)" spare
check "no cancel, kill or error message in the jobs' output" each quiet "$OUT/u1a.out" "$OUT/u1b.out" "$OUT/u2.out"
# shellcheck disable=SC2016  # expanded on the nodes
check "every user's cache on every node is theirs alone (mode 0700)" all_equal \
  "$(per_node 'echo "$(hostname) $(stat -c "%U:%a" /nvme/stagefs/'$U1' /nvme/stagefs/'$U2' /nvme/stagefs/'$U1'/spare.1 | paste -sd" ")"')" \
  "$U1:700 $U2:700 $U1:700"
check "nothing left on any node after the three jobs" each nothing_left "$a" "$b" "$c"

# ---------------------------------------------------------------------------------------
info "reuse: u1's next job is served from u1's caches"
id=$(submit $U1 reuse -- "$SRC" -- srun sh -c "$READ")
state=$(ended reuse "$id")
check "the job completes with status 0" test "$state" = 0:0
check "every node read the source's bytes" sums_ok reuse
all_hits() {
  [[ $(summary reuse) == "stagefs run: /stage/$id, 4 nodes, 0 transfers; on n1 1 open, 1 from the cache" ]] ||
    { echo "    $(summary reuse)"; return 1; }
}
check "no transfer: 0 bytes read from the shared source or any node" all_hits

# ---------------------------------------------------------------------------------------
info "refused: u1's --cache on n3 belongs to u2"
# (the per-user directory exists on every node: the prolog made it for the jobs above)
timeout 60 srun -N1 -w n3 sh -c "mkdir /nvme/stagefs/$U1/alt && chown $U2: /nvme/stagefs/$U1/alt && chmod 0700 /nvme/stagefs/$U1/alt"
ts=$SECONDS
id=$(submit $U1 refused -- "$SRC" --cache "/nvme/stagefs/$U1/alt" --wait-timeout 600 -- touch "$OUT/refused-ran")
state=$(ended refused "$id")
echo "    the job took $((SECONDS - ts))s"
check "the job ends with status 125 (stagefs run failed), not at its wait timeout" test "$state" = 125:0
check "stagefs run quotes n3's error, naming the directory's owner" \
  grep -qE "^stagefs run: the first error: \[stagefs n3 r[0-9]\] error: .*/alt \(owned by uid [0-9]+ \($U2\), mode 0700\) is another user's directory" "$OUT/refused.out"
check "the command did not run" test ! -e "$OUT/refused-ran"
check "nothing left on any node" nothing_left "$id"

# ---------------------------------------------------------------------------------------
info "scancel: u1's job cancelled while its command runs on the mount"
# shellcheck disable=SC2016  # expanded in the job
id=$(submit $U1 cancelled -- "$SRC" -- sh -c 'srun sh -c "cat \"\$STAGEFS_MOUNT/app.bin\" >/dev/null" && touch "$1" && exec sleep 3600' sh "$OUT/mounted")
deadline=$((SECONDS + JOB_TIMEOUT))
until [[ -e $OUT/mounted ]] || ((SECONDS > deadline)); do sleep 0.2; done # bounded wait for the job's marker
check "the job's command ran on the mount" test -e "$OUT/mounted"
"$HARNESS" as $U1 -- scancel "$id"
state=$(ended cancelled "$id")
echo "    cancelled job: $state"
check "nothing left on any node after scancel: no stagefs process or mount, /stage/$id removed" nothing_left "$id"

echo "---- total time $((SECONDS - t0))s (cluster up + jobs + checks)"
finish
