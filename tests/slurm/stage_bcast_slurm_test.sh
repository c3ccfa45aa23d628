#!/usr/bin/env bash
# stage_bcast_slurm_test.sh BUILD_DIR
#
# End-to-end test of tools/stage-bcast on a simulated 4-node Slurm cluster
# (tests/harness/simslurm.sh): one MPI rank per node via `srun --mpi=pmix`, each node with
# its own private /nvme. Every step runs as an ordinary user (stagefs-u1, `simslurm.sh as`),
# writing into the directory the site's stagefs prolog prepares for that user on each node,
# /nvme/stagefs/USER (Slurm's daemons stay root).
#
# CLI contract under test:
#   stage-bcast --source PATH --dest PATH [--verbose] [--json]
#   exit 0 success, 1 runtime failure, 2 usage error
#
# Checks:
#   1. first broadcast of a ~64 MiB image succeeds
#   2. every node (4 distinct hostnames) has /nvme/img.sqsh with the source's sha256
#   3. a second identical broadcast succeeds and does not rewrite the file
#      (inode, nanosecond mtime and ctime unchanged on every node, content still
#      identical; stage-bcast gives the copy the source's mtime, so an in-place rewrite
#      would keep the mtime: ctime is what catches it)
#   3b. partly warm: two nodes lose their copy; rank 1 (the lowest warm rank) feeds the
#      broadcast from its copy, 0 bytes are read from the source, every copy matches it
#   4. a source that does not exist: srun exits 1, every task exits non-zero, no node is
#      left with a (partial) destination file
#   5. an unknown option: srun exits 2 (usage error)
#   6. one rank dies at start (SIGSEGV before MPI_Init; srun --multi-prog) and srun has no
#      --kill-on-bad-exit: the other ranks give up after --startup-timeout 5 with a message,
#      so srun returns (non-zero) instead of waiting for the step's time limit
#
# Exit: 0 all checks passed, 1 some check failed, 77 skipped (not root / Slurm or munge
# not installed). Prints "PASS: ..." / "FAIL: ..." per check and a closing
# "stage_bcast_slurm: N passed, N failed" line.
#
# The simulated cluster is torn down on exit, also one that was already up before.
#
# Environment:
#   STAGE_BCAST        binary to test (default BUILD_DIR/tools/stage-bcast); must be on a
#                      path every node sees, i.e. not under /tmp, /nvme or /stage
#   SIMSLURM_ROOT      harness state root (see simslurm.sh); the source image is created in
#                      $SIMSLURM_ROOT/shared, which all nodes see
#   SRUN_TIMEOUT       seconds allowed per srun (default 300)
set -uo pipefail

NAME=stage_bcast_slurm
NODES=4
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HARNESS=$HERE/../harness/simslurm.sh
SRUN_TIMEOUT=${SRUN_TIMEOUT:-300}
RUN_USER=${SIMSLURM_USERS:-stagefs-u1}
RUN_USER=${RUN_USER%% *}
AS_USER=("$HARNESS" as "$RUN_USER" --)
SRUN=(timeout --foreground --kill-after=30 "$SRUN_TIMEOUT" "${AS_USER[@]}" srun -N"$NODES" --ntasks-per-node=1)

# shellcheck source=checks.sh
source "$HERE/checks.sh"

# ---------------------------------------------------------------------------------------
# arguments and prerequisites

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "FAIL: build dir '$1' not found"; exit 1; }
BIN=${STAGE_BCAST:-$BUILD_DIR/tools/stage-bcast}

[[ $(id -u) == 0 ]] || skip "needs root (simulated Slurm uses mount/UTS namespaces)"
for tool in slurmd slurmctld srun munged; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed (apt-get install slurm-wlm munge)"
done
[[ -x $HARNESS ]] || { echo "FAIL: harness $HARNESS missing"; exit 1; }
if [[ ! -x $BIN ]]; then
  fail "stage-bcast binary exists: $BIN"
  finish
  exit 1
fi
case $(readlink -f "$BIN") in
  /tmp/* | /nvme/* | /stage/*)
    fail "stage-bcast binary must be outside /tmp, /nvme, /stage (per-node dirs): $BIN"
    finish
    exit 1
    ;;
esac

# ---------------------------------------------------------------------------------------
# cluster + scratch, torn down on any exit

WORK=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  "$HARNESS" down >/dev/null 2>&1 || echo "warning: simslurm down failed" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS
info "bringing up $NODES simulated nodes"
if ! "$HARNESS" up "$NODES"; then
  fail "simulated cluster comes up"
  finish
  exit 1
fi
# SLURM_CONF, SIMSLURM_ROOT and the Open MPI settings the simulated cluster needs
eval "$("$HARNESS" env)"

WORK=$(mktemp -d "$SIMSLURM_ROOT/shared/stage-bcast-test.XXXXXX")
chmod 0755 "$WORK"
chown "$RUN_USER:" "$WORK" # the steps' working directory (a crashed rank's core goes there)
SRC=$WORK/src.sqsh
LOCAL=/nvme/stagefs/$RUN_USER # the user's directory on each node (the stagefs prolog's)
DEST=$LOCAL/img.sqsh

info "creating ~64 MiB source image $SRC"
if command -v mksquashfs >/dev/null 2>&1; then
  # a real squashfs image (random, so incompressible: ~64 MiB)
  mkdir "$WORK/tree"
  head -c $((48 << 20)) /dev/urandom >"$WORK/tree/blob0"
  head -c $((16 << 20)) /dev/urandom >"$WORK/tree/blob1"
  mksquashfs "$WORK/tree" "$SRC" -noappend -quiet -no-progress >/dev/null
  rm -rf "$WORK/tree"
else
  head -c $((64 << 20)) /dev/urandom >"$SRC"
fi
SRC_SUM=$(sha256sum "$SRC" | cut -d' ' -f1)
echo "    size $(stat -c %s "$SRC") bytes, sha256 $SRC_SUM"

# per-node query: one line "HOSTNAME VALUE" per task, sorted; VALUE=MISSING if no file.
# $1 is a shell snippet run on each node with $f = the destination path.
per_node() {
  # shellcheck disable=SC2016  # expanded by the remote sh
  "${SRUN[@]}" sh -c '
    f=$1
    if [ -e "$f" ]; then v=$(eval "$2") || v=ERROR; else v=MISSING; fi
    echo "$(hostname) $v"' sh "$DEST" "$1" | sort
}
# shellcheck disable=SC2016  # expanded by the remote sh
per_node_sum() { per_node 'sha256sum "$f" | cut -d" " -f1'; }
# shellcheck disable=SC2016  # expanded by the remote sh
per_node_stat() { per_node 'stat -c %i:%.9Y:%.9Z "$f"'; }

# all_nodes_equal OUTPUT VALUE: NODES lines, NODES distinct hostnames, all values VALUE
all_nodes_equal() {
  local out=$1 want=$2
  [[ $(wc -l <<<"$out") -eq $NODES ]] || { echo "    expected $NODES lines"; return 1; }
  [[ $(cut -d' ' -f1 <<<"$out" | sort -u | wc -l) -eq $NODES ]] ||
    { echo "    expected $NODES distinct hostnames"; return 1; }
  [[ -z $(awk -v w="$want" '$2 != w' <<<"$out") ]] || { echo "    some node differs from $want"; return 1; }
}

# make sure no destination is left from an earlier run on a reused cluster
"${SRUN[@]}" rm -f "$DEST" || true
check "no $DEST on any node before the first run" \
  all_nodes_equal "$(per_node_sum)" MISSING

# run_bcast LOG ARGS... : srun stage-bcast under pmix; returns srun's exit code. A run in
# which a rank died inside Open MPI's MPI_Init (ompi_init_crash, checks.sh) runs once more.
run_bcast() {
  local log=$1; shift
  local s=$SECONDS rc=0
  rm -f "$WORK"/core "$WORK"/core.[0-9]*
  "${SRUN[@]}" --chdir="$WORK" --kill-on-bad-exit=1 --mpi=pmix "$BIN" "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)) && ompi_init_crash "$WORK"; then
    echo "RETRY: a rank died inside MPI_Init (Open MPI, not stage-bcast): the step again, once"
    show "$log"
    rm -f "$WORK"/core "$WORK"/core.[0-9]*
    rc=0
    "${SRUN[@]}" --chdir="$WORK" --kill-on-bad-exit=1 --mpi=pmix "$BIN" "$@" >"$log" 2>&1 || rc=$?
  fi
  echo "    srun exit $rc after $((SECONDS - s))s; output:"
  show "$log"
  return "$rc"
}
ulimit -c unlimited 2>/dev/null || true # a crashed rank leaves a core for ompi_init_crash

# ---------------------------------------------------------------------------------------
# 1 + 2: first broadcast

info "first broadcast"
check "first stage-bcast exits 0" \
  run_bcast "$WORK/run1.log" --source "$SRC" --dest "$DEST" --verbose

sums=$(per_node_sum)
show <(echo "$sums")
check "$NODES distinct nodes each have $DEST with the source sha256" \
  all_nodes_equal "$sums" "$SRC_SUM"

# ---------------------------------------------------------------------------------------
# 3: second broadcast must not rewrite

before=$(per_node_stat)
info "second broadcast (destination already current)"
check "second stage-bcast exits 0" \
  run_bcast "$WORK/run2.log" --source "$SRC" --dest "$DEST" --verbose
after=$(per_node_stat)
echo "    inode:mtime:ctime before / after:"
show <(paste -d' ' <(echo "$before") <(echo "$after" | cut -d' ' -f2))
same_stat() {
  [[ $(wc -l <<<"$before") -eq $NODES && $before == "$after" ]] &&
    ! grep -qE ' (MISSING|ERROR)$' <<<"$before"
}
check "second run did not rewrite $DEST on any node (inode, mtime and ctime unchanged)" same_stat
check "content still matches after second run" \
  all_nodes_equal "$(per_node_sum)" "$SRC_SUM"

# ---------------------------------------------------------------------------------------
# 3b: partly warm: two nodes keep their current copy, two lose it; the lowest warm rank
# feeds the broadcast from its copy and the shared source is not read for data

info "partly warm broadcast (the nodes of ranks 0 and 3 lose their copy)"
# shellcheck disable=SC2016  # expanded by the remote sh
"${SRUN[@]}" sh -c 'case $SLURM_PROCID in 0 | 3) rm -f "$1" ;; esac' sh "$DEST"
check "partly warm stage-bcast exits 0" \
  run_bcast "$WORK/run2b.log" --source "$SRC" --dest "$DEST" --json
# The report's JSON line: fed by rank 1 from its copy, 0 bytes from the source.
fed_by_warm_rank() {
  python3 - "$WORK/run2b.log" <<'PY'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if line.startswith("{") and '"fed_from"' in line:
        r = json.loads(line)
        print("    fed_by_rank %s fed_from %s bytes_read_source %s bytes_read_seed %s nodes_written %s"
              % (r["fed_by_rank"], r["fed_from"], r["bytes_read_source"], r["bytes_read_seed"], r["nodes_written"]))
        sys.exit(0 if (r["fed_by_rank"], r["fed_from"], r["bytes_read_source"], r["nodes_written"]) == (1, "seed", 0, 2) else 1)
print("    no JSON report in the log")
sys.exit(1)
PY
}
check "a warm node fed the broadcast and the source was not read for data" fed_by_warm_rank
check "content matches on every node after the partly warm run" \
  all_nodes_equal "$(per_node_sum)" "$SRC_SUM"

# ---------------------------------------------------------------------------------------
# 4: missing source

info "error case: source does not exist"
MISSING_DEST=$LOCAL/missing.sqsh
run_missing() {
  rc=0
  rm -f "$WORK"/core "$WORK"/core.[0-9]*
  # shellcheck disable=SC2016  # expanded by the remote sh
  "${SRUN[@]}" --chdir="$WORK" --mpi=pmix sh -c '
    "$@"; rc=$?
    echo "TASKRC $SLURM_PROCID $(hostname) $rc"
    exit $rc' sh "$BIN" --source "$WORK/does-not-exist.sqsh" --dest "$MISSING_DEST" \
    >"$WORK/run3.log" 2>&1 || rc=$?
}
run_missing
if ((rc != 1)) && ompi_init_crash "$WORK"; then
  echo "RETRY: a rank died inside MPI_Init (Open MPI, not stage-bcast): the step again, once"
  show "$WORK/run3.log"
  run_missing
fi
echo "    srun exit $rc; output:"
show "$WORK/run3.log"
check "srun exits non-zero for a missing source" test "$rc" -ne 0
check "srun exit code is 1 (runtime failure) for a missing source" test "$rc" -eq 1
# every task must have failed: either it reported a non-zero rc itself (TASKRC line), or
# srun reports it ("srun: error: n[1-2]: tasks 0-1: Exited with exit code 1", "...: task
# 3: Killed"). No task may report success.
failed_tasks() {
  local log=$1 line list part i parts
  sed -nE 's/^TASKRC ([0-9]+) [^ ]+ [1-9][0-9]*$/\1/p' "$log"
  while IFS= read -r line; do
    [[ $line =~ :\ tasks?\ ([0-9,-]+):\ (.*)$ ]] || continue
    [[ ${BASH_REMATCH[2]} == "Exited with exit code 0" ]] && continue
    list=${BASH_REMATCH[1]}
    IFS=, read -ra parts <<<"$list"
    for part in "${parts[@]}"; do
      if [[ $part == *-* ]]; then
        for ((i = ${part%-*}; i <= ${part#*-}; i++)); do echo "$i"; done
      else
        echo "$part"
      fi
    done
  done < <(grep '^srun: error: ' "$log")
}
every_task_failed() {
  local log=$WORK/run3.log n
  if grep -qE '^TASKRC [0-9]+ [^ ]+ 0$' "$log"; then echo "    a task exited 0"; return 1; fi
  n=$(failed_tasks "$log" | sort -u | wc -l)
  [[ $n -eq $NODES ]] || { echo "    only $n of $NODES tasks seen failing"; return 1; }
}
check "every one of the $NODES tasks exits non-zero for a missing source" every_task_failed
check "no node has a (partial) $MISSING_DEST after the failed run" \
  all_nodes_equal "$(DEST=$MISSING_DEST per_node_sum)" MISSING

# ---------------------------------------------------------------------------------------
# 5: usage error

info "error case: unknown option"
rc=0
"${SRUN[@]}" --mpi=pmix "$BIN" --source "$SRC" --dest "$DEST" --no-such-option \
  >"$WORK/run4.log" 2>&1 || rc=$?
echo "    srun exit $rc; output:"
show "$WORK/run4.log" 10
check "srun exit code is 2 (usage error) for an unknown option" test "$rc" -eq 2

# ---------------------------------------------------------------------------------------
# 6: a rank that dies at start, srun without --kill-on-bad-exit

info "a rank that dies at start (SIGSEGV before MPI_Init), srun without --kill-on-bad-exit"
printf '#!/bin/sh\nkill -SEGV $$\n' >"$WORK/dies-at-start.sh"
chmod 0755 "$WORK/dies-at-start.sh"
printf '0-%d %s --source %s --dest %s/dies.sqsh --startup-timeout 5\n%d %s\n' \
  $((NODES - 2)) "$BIN" "$SRC" "$LOCAL" $((NODES - 1)) "$WORK/dies-at-start.sh" >"$WORK/dies.conf"
rc=0
timeout --foreground --kill-after=10 120 "${AS_USER[@]}" srun -N"$NODES" --ntasks-per-node=1 --chdir="$WORK" --mpi=pmix \
  --multi-prog "$WORK/dies.conf" >"$WORK/run5.log" 2>&1 || rc=$?
echo "    srun exit $rc; output:"
show "$WORK/run5.log" 20
check "srun returns, non-zero, when one rank dies at start (no --kill-on-bad-exit)" \
  test "$rc" -ne 0 -a "$rc" -ne 124 -a "$rc" -ne 137
check "each of the other $((NODES - 1)) ranks says it gave up waiting for MPI start-up" \
  test "$(grep -c 'MPI start-up did not complete within 5 s' "$WORK/run5.log")" -eq $((NODES - 1))

echo "---- total time $((SECONDS - t0))s (cluster up + all checks)"
finish
