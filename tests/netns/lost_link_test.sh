#!/usr/bin/env bash
# lost_link_test.sh BUILD_DIR - a node's link is cut while stagefs broadcasts a file.
#
# 4 simulated nodes (tests/harness/netns-cluster.sh: own network, UTS and mount namespace each,
# one rank per node under mpirun). For each stall policy (eio, then source):
#   1. mpirun stagefs SHARED/src MNT --cache NVME/cache --stall-timeout 5 --chunk-size 4M;
#      stagefs --wait on node 1. (Progress is counted per chunk: the stall timeout must exceed
#      one chunk's time on the slowest link, or a slow but healthy link counts as a stall;
#      16 MiB chunks over 20 Mbit/s take 6.7 s.)
#   2. slow node 4's link (tc tbf), start readers of the big file on nodes 1-3, and once the
#      broadcast is in flight (node 1 is writing its temporary copy and node 4 has one) cut
#      node 4's link
#   3. the readers return (eio: ETIMEDOUT/EIO; source: the right bytes) well before a generous
#      bound; a later open does not wait again; no cache holds a partial file under the final
#      name; user.stagefs.state on nodes 1-3 says "broken" and stagefs --wait fails there
#   4. end the job like a user (SIGTERM mpirun; escalate only if it does not end), check that
#      nothing is left on nodes 1-3, restore the link, check that node 4 cleans itself up
# Then recovery: a new group sweeps the temporary files, reading on all 4 nodes gives the right
# bytes everywhere, and SIGTERM ends that job cleanly. Last, a lost seed: only node 4's cache
# keeps its valid copy, so node 4 feeds the next transfer from it (the seed) instead of the
# source; its link is cut mid-copy (--on-stall source) and the readers on nodes 1-3 still get the
# source's bytes, as when a source node is lost, with nothing partial published.
# What MPI did (mpirun exit, messages, times) is printed as INFO lines and logged in LOGDIR.
#
# Exit 0 pass, 1 fail, 77 skip (not root, no `ip netns`, no FUSE or mpirun).
# Environment: NETNS_SIM_ROOT (default /var/tmp/stagefs-netns), LOST_LINK_KEEP=1 (keep the source
# and the caches after the test), LOST_LINK_LOGDIR (default
# BUILD_DIR/tests/netns/lost_link.logs), LOST_LINK_SIZE_MB (256), LOST_LINK_RATE (50mbit),
# LOST_LINK_CHUNK (4M), LOST_LINK_STALL (5), LOST_LINK_READ_BOUND (60 s after the cut),
# LOST_LINK_MPIRUN_GRACE (15 s after SIGTERM for the nodes to end, and for mpirun to end in the
# recovery run), LOST_LINK_MPIRUN_WAIT (3 s: how long mpirun is given with node 4 still cut off
# before escalating (eio) or restoring the link (source); it cannot end by itself then, and
# restoring the link sooner also keeps TCP's retransmission back-off short),
# LOST_LINK_RELINK_BOUND (90 s: TCP retransmission back-off decides when a node whose link
# returns hears from its peers).
set -uo pipefail

SKIP=77
[[ $# -ge 1 && -d $1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")
H=$(readlink -f "$HERE/../harness/netns-cluster.sh")
NSUTIL=$HERE/nsutil.py
PY=/usr/bin/python3
STAGEFS=$BUILD/tools/stagefs

skip() { echo "SKIP: $*"; echo "lost_link: 0 passed, 0 failed (skipped)"; exit "$SKIP"; }
[[ $(id -u) == 0 ]] || skip "needs root"
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
for c in tc nsenter unshare findmnt mpirun fusermount3 sha256sum cmp; do
  command -v "$c" >/dev/null || skip "missing $c"
done
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ -x $PY ]] || skip "no $PY"
[[ -x $STAGEFS ]] || { echo "FAIL: $STAGEFS is not built"; echo "lost_link: 0 passed, 1 failed"; exit 1; }

export NETNS_SIM_ROOT=${NETNS_SIM_ROOT:-/var/tmp/stagefs-netns}
ROOT=${NETNS_SIM_ROOT%/}
LOG=${LOST_LINK_LOGDIR:-$BUILD/tests/netns/lost_link.logs}
SIZE_MB=${LOST_LINK_SIZE_MB:-256}
RATE=${LOST_LINK_RATE:-50mbit}
CHUNK=${LOST_LINK_CHUNK:-4M}
STALL=${LOST_LINK_STALL:-5}
READ_BOUND=${LOST_LINK_READ_BOUND:-60}
GRACE=${LOST_LINK_MPIRUN_GRACE:-15}
CUT_WAIT=${LOST_LINK_MPIRUN_WAIT:-3}
RELINK_BOUND=${LOST_LINK_RELINK_BOUND:-90}
N=4
CUT=4                                   # the node whose link is cut
SRC=$ROOT/shared/lost_link_src          # seen by every node
FILE=big.img
MNT=$ROOT/view/stage                    # same path on every node, a private mount point each
NVME=$ROOT/view/nvme                    # same path on every node, its own disk each

SEEDED=no                               # lost_link_run: node CUT seeds the transfer
PASSED=0 FAILED=0 MPIRUN_PID='' T_TERM=0 LAST_ESCALATED=no READERS=() T_START=${EPOCHREALTIME/./}
FAILS=()

# ---- reporting, time, conditions ----------------------------------------------------------
elapsed() { local t=${EPOCHREALTIME/./}; printf '%d.%02d' $(((t - T_START) / 1000000)) $(((t - T_START) / 10000 % 100)); }
say() { printf '[%6ss] %s\n' "$(elapsed)" "$*" | tee -a "$LOG/test.log"; }
pass() { PASSED=$((PASSED + 1)); say "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); FAILS+=("$*"); say "FAIL: $*"; }
info() { say "INFO: $*"; }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
now_us() { echo "${EPOCHREALTIME/./}"; }
secs_since() { local d=$(($(now_us) - $1)); printf '%d.%01d' $((d / 1000000)) $((d / 100000 % 10)); }

# wait_until TIMEOUT_S CMD... : poll CMD (backing off 0.05 .. 0.5 s); 1 on timeout
wait_until() {
  local deadline=$(($(now_us) + $1 * 1000000)) delay=0.05; shift
  until "$@"; do
    (($(now_us) >= deadline)) && return 1
    sleep "$delay"
    case $delay in 0.05) delay=0.1 ;; 0.1) delay=0.2 ;; *) delay=0.5 ;; esac
  done
}
alive() { local s; { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1; s=${s##*) }; [[ ${s%% *} != [ZX] ]]; }
dead() { ! alive "$1"; }

node() { "$H" exec "$@"; }
alloc_mib() { local t; t=$(temps_of "$1" | head -n1); [[ -n $t ]] && echo $(($(stat -c %b "$t") / 2048)) || echo "-"; }
cache_file() { echo "$ROOT/nodes/node$1/nvme/cache/data/$FILE"; }
temps_of() { find "$ROOT/nodes/node$1/nvme/cache/data" -maxdepth 1 -name ".$FILE.stage-tmp.*" 2>/dev/null; }
node_procs() { local p; for p in $("$H" pids "$1"); do printf '%s(%s) ' "$p" "$(cat /proc/"$p"/comm 2>/dev/null)"; done; }
fuse_mounts() { "$H" mounts "$1" | awk '$2 ~ /^fuse/ {print $1}'; }
node_clean() { [[ -z $("$H" pids "$1") && -z $(fuse_mounts "$1") ]]; }
nodes_clean() { local k; for k in "$@"; do node_clean "$k" || return 1; done; }
state_of() { node "$1" "$PY" "$NSUTIL" xattr "$MNT" user.stagefs.state 2>&1 | tr -d '\n'; }

# ---- cleanup ------------------------------------------------------------------------------
cleanup() {
  local p
  for p in "${READERS[@]}" $MPIRUN_PID; do alive "$p" && kill -KILL "$p" 2>/dev/null; done
  if "$H" down >>"$LOG/harness.log" 2>&1; then
    # the big data (source, 4 caches) goes unless asked to keep it; the logs stay in LOGDIR
    [[ ${LOST_LINK_KEEP:-0} == 1 ]] || rm -rf --one-file-system "$SRC" "$ROOT"/nodes/node*/nvme/cache "$ROOT/bin/stagefs"
  else
    say "WARNING: harness down reported leftovers (see $LOG/harness.log)"
  fi
}
finish() {
  trap - EXIT INT TERM
  cleanup
  say "runtime $(elapsed) s; logs in $LOG"
  if ((FAILED)); then local f; say "failed checks:"; for f in "${FAILS[@]}"; do say "  - $f"; done; fi
  echo "lost_link: $PASSED passed, $FAILED failed"
  ((FAILED == 0 && PASSED > 0))
  exit $?
}
trap 'FAILED=$((FAILED + 1)); FAILS+=("interrupted"); finish' INT TERM
trap 'finish' EXIT

rm -rf "$LOG"
mkdir -p "$LOG"
info "root $ROOT, $N nodes, file $SIZE_MB MiB, node $CUT shaped to $RATE, chunk $CHUNK, stall timeout $STALL s"

# ---- cluster and source ---------------------------------------------------------------------
"$H" down >>"$LOG/harness.log" 2>&1 || true
if ! "$H" up "$N" >>"$LOG/harness.log" 2>&1; then
  cat "$LOG/harness.log"; fail "netns cluster comes up"; exit 1
fi
# a private copy of the binary: a rebuild in BUILD_DIR during the test cannot pull it away
mkdir -p "$ROOT/bin" "$SRC"
cp "$BUILD/tools/stagefs" "$ROOT/bin/stagefs.new" && mv "$ROOT/bin/stagefs.new" "$ROOT/bin/stagefs"
STAGEFS=$ROOT/bin/stagefs
info "stagefs: copy of $BUILD/tools/stagefs built $(stat -c %y "$BUILD/tools/stagefs" | cut -d. -f1)"
head -c "${SIZE_MB}M" /dev/urandom >"$SRC/$FILE"
SRC_SHA=$(sha256sum "$SRC/$FILE" | cut -d' ' -f1)
SRC_SIZE=$(stat -c %s "$SRC/$FILE")
info "cluster up; source $SRC/$FILE ($SRC_SIZE bytes)"

# ---- the mount group --------------------------------------------------------------------------
# Each rank's stderr also goes to the node's own /tmp/stagefs.log (timestamped), which outlives
# mpirun: a node cut off keeps logging there.
start_group() {  # NAME [stagefs options...]; no profile: a replay of the last case would add transfers
  local name=$1; shift
  # shellcheck disable=SC2016  # expanded by the rank's bash
  "$H" mpirun bash -c 'exec "$0" "$@" 2> >(trap "" PIPE TERM INT HUP; while IFS= read -r l; do printf "%(%T)T %s\n" -1 "$l"; done >>/tmp/stagefs.log)' \
    "$STAGEFS" "$SRC" "$MNT" --cache "$NVME/cache" --stall-timeout "$STALL" --chunk-size "$CHUNK" --profile off "$@" \
    </dev/null >"$LOG/$name.mpirun.log" 2>&1 &
  MPIRUN_PID=$!
  local t0; t0=$(now_us)
  if node 1 "$STAGEFS" --wait "$MNT" --wait-timeout 60 >>"$LOG/$name.wait.log" 2>&1; then
    pass "$name: mount group ready on all $N nodes ($(secs_since "$t0") s)"
  else
    fail "$name: mount group ready on all $N nodes: $(tr '\n' ' ' <"$LOG/$name.wait.log")"
    tail -n 20 "$LOG/$name.mpirun.log"
    return 1
  fi
}

collect_node_logs() {  # NAME: move each node's daemon log into LOGDIR and print it
  local name=$1 k f
  for ((k = 1; k <= N; k++)); do
    f=$ROOT/nodes/node$k/tmp/stagefs.log
    [[ -f $f ]] || continue
    mv "$f" "$LOG/$name.node$k.stagefs.log"
    sed "s/^/    node$k: /" "$LOG/$name.node$k.stagefs.log" | tee -a "$LOG/test.log"
  done
  if [[ -s $LOG/$name.mpirun.log ]]; then
    say "  mpirun output ($name):"
    sed 's/^/    mpirun: /' "$LOG/$name.mpirun.log" | tee -a "$LOG/test.log"
  fi
}

# End the job as a user would: SIGTERM to mpirun, then check that the given nodes are left
# with no process and no FUSE mount.
end_job() {  # NAME NODES-EXPECTED-TO-STOP...
  local name=$1; shift
  T_TERM=$(now_us)
  info "$name: SIGTERM to mpirun (pid $MPIRUN_PID)"
  kill -TERM "$MPIRUN_PID"
  if wait_until "$GRACE" nodes_clean "$@"; then
    pass "$name: nodes $* have no process and no FUSE mount left $(secs_since "$T_TERM") s after SIGTERM"
  else
    local k
    for k in "$@"; do
      node_clean "$k" && continue
      fail "$name: node $k still has processes [$(node_procs "$k")] / FUSE mounts [$(fuse_mounts "$k" | tr '\n' ' ')] $GRACE s after SIGTERM"
    done
  fi
}

# Wait up to BOUND s for mpirun to end after end_job's SIGTERM; with ESCALATE=yes make it end:
# a second SIGTERM (Open MPI: "hit ctrl-c again within 5 seconds to forcibly terminate"),
# SIGKILL as the last resort; and say which it took. 0 if mpirun is gone.
mpirun_ended() {  # NAME BOUND ESCALATE
  local name=$1 bound=$2 escalate=$3 rc
  if wait_until "$bound" dead "$MPIRUN_PID"; then
    wait "$MPIRUN_PID"; rc=$?
    info "$name: mpirun ended by itself $(secs_since "$T_TERM") s after the SIGTERM, exit status $rc"
    MPIRUN_PID='' LAST_ESCALATED=no
    return 0
  fi
  info "$name: mpirun still running $(secs_since "$T_TERM") s after the SIGTERM"
  [[ $escalate == yes ]] || return 1
  info "$name: a second SIGTERM to mpirun"
  kill -TERM "$MPIRUN_PID"
  # mpirun prints "Abort is in progress...hit ctrl-c again within 5 seconds" on the 2nd signal
  wait_until 5 grep -q "Abort is in progress" "$LOG/$name.mpirun.log" && kill -TERM "$MPIRUN_PID" 2>/dev/null &&
    info "$name: mpirun printed \"$(grep -m1 "Abort is in progress" "$LOG/$name.mpirun.log")\"; a third SIGTERM"
  if wait_until 5 dead "$MPIRUN_PID"; then
    wait "$MPIRUN_PID"; rc=$?
    info "$name: mpirun ended after the repeated SIGTERM, $(secs_since "$T_TERM") s after the first, exit status $rc"
  else
    kill -KILL "$MPIRUN_PID"; wait "$MPIRUN_PID"; rc=$?
    info "$name: mpirun needed SIGKILL ($(secs_since "$T_TERM") s after the first SIGTERM), exit status $rc"
  fi
  MPIRUN_PID='' LAST_ESCALATED=yes
}

check_no_partial() {  # NAME
  local name=$1 k f
  for ((k = 1; k <= N; k++)); do
    f=$(cache_file "$k")
    if [[ ! -e $f ]]; then
      pass "$name: node $k: no file under the final name in the cache"
    elif cmp -s "$f" "$SRC/$FILE"; then
      pass "$name: node $k: the cached file is complete and equal to the source"
    else
      fail "$name: node $k: PARTIAL/WRONG file under the final name: $(stat -c '%s bytes' "$f")"
    fi
  done
}

# in flight: node 1 has written >= 2 chunks of its temporary copy, node CUT has one (unless it
# is the seed: it writes nothing), and the transfer is not finished on node 1
inflight() {
  local t b
  t=$(temps_of 1 | head -n1)
  [[ -n $t && ( $SEEDED == yes || -n $(temps_of "$CUT") ) && ! -e $(cache_file 1) ]] || return 1
  b=$(stat -c %b "$t" 2>/dev/null) || return 1
  ((b * 512 >= 2 * CHUNK_BYTES))
}
CHUNK_BYTES=$(numfmt --from=iec "$CHUNK")

lost_link_run() {  # POLICY (eio|source) [seed]
  local policy=$1 name=cut-$1 k t_cut t0 out res p
  SEEDED=no
  if [[ ${2:-} == seed ]]; then
    # node CUT keeps the valid copy the recovery run left; the other caches start empty
    SEEDED=yes name=cut-seed
    [[ -e $(cache_file "$CUT") ]] || { fail "$name: node $CUT has no cached copy to seed from"; return 1; }
    for ((k = 1; k < CUT; k++)); do rm -rf "$ROOT/nodes/node$k/nvme/cache"; done
  fi
  info "===== $name: link of node $CUT cut during the broadcast, --on-stall $policy ====="
  start_group "$name" --on-stall "$policy" || return 1
  local left=0
  for ((k = 1; k <= N; k++)); do left=$((left + $(temps_of "$k" | wc -l))); done
  check "$name: no temporary file in any cache after start (swept)" test "$left" -eq 0
  "$H" shape "$CUT" "$RATE"
  READERS=()
  for ((k = 1; k <= N - 1; k++)); do
    node "$k" "$PY" "$NSUTIL" read "$MNT/$FILE" >"$LOG/$name.reader$k.out" 2>&1 &
    READERS[k]=$!
  done
  t0=$(now_us)
  if ! wait_until 60 inflight; then
    fail "$name: the broadcast is in flight (node 1 writing its temporary copy, node $CUT has one) within 60 s"
    ls -la "$ROOT"/nodes/node*/nvme/cache/data/ >>"$LOG/test.log" 2>&1
    return 1
  fi
  info "$name: broadcast in flight $(secs_since "$t0") s after the readers started; written so far: $(for ((k = 1; k <= N; k++)); do printf 'node%d %s MiB  ' "$k" "$(alloc_mib "$k")"; done)"
  if [[ $SEEDED == yes ]]; then
    # (the log reaches the file through the rank's log pipe: wait for the line, not only look)
    wait_until 10 grep -qs "rank $((CUT - 1)) feeds the transfer from its current copy" "$ROOT/nodes/node1/tmp/stagefs.log" &&
      pass "$name: the transfer is fed by node $CUT's cache (rank $((CUT - 1)), the seed)" ||
      fail "$name: node 1's log does not say rank $((CUT - 1)) feeds the transfer from its copy"
  fi
  "$H" linkdown "$CUT"
  t_cut=$(now_us)
  info "$name: link of node $CUT is down"

  for ((k = 1; k <= N - 1; k++)); do
    p=${READERS[k]}
    if wait_until "$READ_BOUND" dead "$p"; then
      wait "$p"
      out=$(cat "$LOG/$name.reader$k.out")
      pass "$name: reader on node $k returned $(secs_since "$t_cut") s after the cut (bound $READ_BOUND s): $out"
      res=${out%% *}
      if [[ $policy == eio ]]; then
        [[ $out =~ ^err\ (ETIMEDOUT|EIO)\  ]] && pass "$name: node $k: the open failed with ETIMEDOUT/EIO" \
          || fail "$name: node $k: expected ETIMEDOUT or EIO, got: $out"
      else
        [[ $res == ok && $out == "ok $SRC_SHA $SRC_SIZE "* ]] && pass "$name: node $k: read the right bytes (from the source)" \
          || fail "$name: node $k: expected the source's bytes, got: $out"
      fi
    else
      fail "$name: reader on node $k still blocked $READ_BOUND s after the cut"
    fi
  done

  if [[ $SEEDED == yes ]]; then
    # the messages say which node was lost: the seed's rank and host
    named_seed() { grep -qs "rank $((CUT - 1)) (node$CUT)" "$ROOT"/nodes/node[1-$((N - 1))]/tmp/stagefs.log; }
    wait_until 20 named_seed && pass "$name: the logs of the other nodes name the lost seed (rank $((CUT - 1)), node$CUT)" ||
      fail "$name: no log of nodes 1-$((N - 1)) names the lost seed as rank $((CUT - 1)) (node$CUT)"
  fi
  # a later open on a broken group does not wait for another stall timeout
  t0=$(now_us)
  out=$(timeout $((STALL * 4)) "$H" exec 2 "$PY" "$NSUTIL" read "$MNT/$FILE" 2>&1)
  local took; took=$(secs_since "$t0")
  if [[ $policy == eio ]]; then
    [[ $out == err* ]] && (( ${took%.*} < STALL )) && pass "$name: a later open on node 2 fails at once (${took} s): $out" \
      || fail "$name: a later open on node 2 should fail before the stall timeout: ${took} s: $out"
  else
    [[ $out == "ok $SRC_SHA $SRC_SIZE "* ]] && pass "$name: a later open on node 2 reads the source's bytes (${took} s)" \
      || fail "$name: a later open on node 2 should read the source's bytes: ${took} s: $out"
  fi

  for ((k = 1; k <= N - 1; k++)); do
    res=$(state_of "$k")
    if [[ $res == broken ]]; then pass "$name: node $k: user.stagefs.state is broken"
    else fail "$name: node $k: user.stagefs.state should be \"broken\" after the stall, is \"$res\""; fi
  done
  if node 1 "$STAGEFS" --wait "$MNT" --wait-timeout 3 >"$LOG/$name.wait-broken.log" 2>&1; then
    fail "$name: stagefs --wait on node 1 should fail on a broken group, returned 0 (\"ready\")"
  else
    pass "$name: stagefs --wait on node 1 fails on a broken group: $(tr '\n' ' ' <"$LOG/$name.wait-broken.log")"
  fi
  info "$name: node $CUT (cut off, no open of its own waiting): user.stagefs.state = $(state_of "$CUT")"
  for ((k = 1; k <= N; k++)); do
    node "$k" "$PY" "$NSUTIL" xattr "$MNT" user.stagefs.stats >>"$LOG/$name.stats" 2>&1
  done
  info "$name: stats: $(tr '\n' ' ' <"$LOG/$name.stats")"
  check_no_partial "$name"

  end_job "$name" $(seq 1 $((N - 1)))
  # eio: the dead-node case, mpirun is made to end while the link is still down.
  # source: mpirun gets no second signal; the link comes back while it still runs.
  if [[ $policy == eio ]]; then mpirun_ended "$name" "$CUT_WAIT" yes; else mpirun_ended "$name" "$CUT_WAIT" no; fi
  if node_clean "$CUT"; then
    info "$name: node $CUT (cut off) has nothing left $(secs_since "$T_TERM") s after the SIGTERM"
  else
    info "$name: node $CUT (cut off), $(secs_since "$T_TERM") s after the SIGTERM: processes [$(node_procs "$CUT")], FUSE mounts [$(fuse_mounts "$CUT" | tr '\n' ' ')], state $(state_of "$CUT")"
  fi

  "$H" linkup "$CUT"
  "$H" shape "$CUT" off
  t0=$(now_us)
  info "$name: link of node $CUT restored"
  if wait_until "$RELINK_BOUND" node_clean "$CUT"; then
    pass "$name: node $CUT: no process and no FUSE mount left $(secs_since "$t0") s after its link came back"
  else
    fail "$name: node $CUT: processes [$(node_procs "$CUT")] and FUSE mounts [$(fuse_mounts "$CUT" | tr '\n' ' ')] remain $RELINK_BOUND s after its link came back; killing them"
    for p in $("$H" pids "$CUT"); do kill -KILL "$p" 2>/dev/null; done
    for p in $(fuse_mounts "$CUT"); do node "$CUT" fusermount3 -u "$p" 2>/dev/null || node "$CUT" umount -l "$p"; done
    node_clean "$CUT" && info "$name: node $CUT cleaned by hand (kill -9, fusermount3 -u / umount -l)"
  fi
  [[ -z $MPIRUN_PID ]] || mpirun_ended "$name" "$RELINK_BOUND" yes
  for ((k = 1; k <= N; k++)); do
    [[ -z $(fuse_mounts "$k") ]] || { fail "$name: node $k: stale FUSE mount $(fuse_mounts "$k")"; node "$k" umount -l "$MNT"; }
  done
  check_no_partial "$name (after the job)"
  left=0
  for ((k = 1; k <= N; k++)); do left=$((left + $(temps_of "$k" | wc -l))); done
  info "$name: $left temporary file(s) left in the caches by the interrupted transfer"
  collect_node_logs "$name"
}

recovery_run() {
  local name=recovery k p out t0
  info "===== $name: a new group after the failed ones, all links healthy ====="
  local left=0
  for ((k = 1; k <= N; k++)); do left=$((left + $(temps_of "$k" | wc -l))); done
  info "$name: $left temporary file(s) in the caches before the start"
  start_group "$name" || return 1
  left=0
  for ((k = 1; k <= N; k++)); do left=$((left + $(temps_of "$k" | wc -l))); done
  check "$name: temporary files of the failed runs are gone (swept at start)" test "$left" -eq 0
  READERS=()
  t0=$(now_us)
  for ((k = 1; k <= N; k++)); do
    node "$k" "$PY" "$NSUTIL" read "$MNT/$FILE" >"$LOG/$name.reader$k.out" 2>&1 &
    READERS[k]=$!
  done
  for ((k = 1; k <= N; k++)); do
    p=${READERS[k]}
    if wait_until 120 dead "$p"; then
      wait "$p"
      out=$(cat "$LOG/$name.reader$k.out")
      [[ $out == "ok $SRC_SHA $SRC_SIZE "* ]] && pass "$name: node $k reads the right bytes ($(secs_since "$t0") s)" \
        || fail "$name: node $k: expected the source's bytes, got: $out"
    else
      fail "$name: reader on node $k did not return within 120 s"
    fi
  done
  # (a read may end before its transfer does: the open returns during the copy)
  for ((k = 1; k <= N; k++)); do
    wait_until 60 cmp -s "$(cache_file "$k")" "$SRC/$FILE" && pass "$name: node $k: its cache holds the complete copy" \
      || fail "$name: node $k: cache copy missing or different"
  done
  for ((k = 1; k <= N; k++)); do
    node "$k" "$PY" "$NSUTIL" xattr "$MNT" user.stagefs.stats >>"$LOG/$name.stats" 2>&1
  done
  info "$name: stats: $(tr '\n' ' ' <"$LOG/$name.stats")"
  end_job "$name" $(seq 1 $N)
  # (mpirun exits 1 whenever a SIGTERM ended its job, even a plain `sleep`: not asserted)
  if mpirun_ended "$name" "$GRACE" yes && [[ $LAST_ESCALATED == no ]]; then
    pass "$name: mpirun ended after one SIGTERM"
  else
    fail "$name: mpirun did not end after one SIGTERM within $GRACE s"
  fi
  collect_node_logs "$name"
}

# a phase that cannot go on (no group, nothing in flight) ends the test: finish cleans up
lost_link_run eio || exit 1
lost_link_run source || exit 1
recovery_run || exit 1
lost_link_run source seed || exit 1
exit 0
