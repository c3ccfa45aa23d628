#!/usr/bin/env bash
# node_loss_scale.sh: with N (16) simulated nodes, cut one node's link while stage-bcast is
# broadcasting; every other node's stage-bcast must return (non-zero) within about the stall
# timeout, with no partial file under the final name. A benchmark-style check (too slow for
# CI); the 4-node stagefs version is tests/netns/lost_link_test.sh.
#
# Steps: up N, shape every link to RATE; mpirun stage-bcast (ALGO, --stall-timeout STALL) of a
# SIZE_MB file; once node CUT holds part of its temporary copy, break its link; then poll every
# node's processes: print when each node's stage-bcast is gone, relative to the break.
# MODE=cut: `linkdown CUT` (the node is gone);
# MODE=choke: shape CUT's link to 8kbit (a hung node or a dying link: TCP stays up, data stops).
# Either way the ranks below the break time out waiting for data, leave without MPI_Finalize,
# and mpirun then ends the rest of the job.
# Env: N (16) CUT (8) MODE (cut) ALGO (chain) SIZE_MB (128) RATE (100mbit) STALL (10)
#      BOUND (STALL+20)
#      NETNS_SIM_ROOT (/var/tmp/stagefs-scale) NETNS_SIM_NET (10.78.0)
# Output: lines on stdout; bench/results/node_loss_scale.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
unset OMPI_MCA_btl_tcp_if_include

N=${N:-16}
CUT=${CUT:-8}
MODE=${MODE:-cut}
ALGO=${ALGO:-chain}
SIZE_MB=${SIZE_MB:-128}
RATE=${RATE:-100mbit}
STALL=${STALL:-10}
BOUND=${BOUND:-$((STALL + 20))}
export NETNS_SIM_ROOT=${NETNS_SIM_ROOT:-/var/tmp/stagefs-scale}
export NETNS_SIM_NET=${NETNS_SIM_NET:-10.78.0}
ROOT=${NETNS_SIM_ROOT%/}
H=$TOP/tests/harness/netns-cluster.sh
LOG=${LOGDIR:-$WORK_ROOT/node-loss-logs}
MD=$RESULTS/node_loss_scale.$MODE.md
need_bin stage-bcast

mpirun_pid=''
cleanup() {
  set +e
  "$H" linkup "$CUT" >/dev/null 2>&1
  "$H" shape "$CUT" off >/dev/null 2>&1
  [ -n "$mpirun_pid" ] && kill_tree "$mpirun_pid"
  "$H" down >>"$LOG/harness.log" 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$LOG" "$RESULTS"
"$H" down >>"$LOG/harness.log" 2>&1 || true
"$H" up "$N" >>"$LOG/harness.log" 2>&1 || die "cluster of $N does not come up"
for ((k = 1; k <= N; k++)); do "$H" shape "$k" "$RATE"; done
mkdir -p "$ROOT/bin" "$ROOT/shared/scale"
cp "$BIN/stage-bcast" "$ROOT/bin/"
SRC=$ROOT/shared/scale/loss.img
make_random_file "$SRC" "$SIZE_MB"

sb_alive() {  # (no `| grep -q`: under pipefail its early exit would read as "not alive")
  local p
  for p in $("$H" pids "$1" 2>/dev/null); do grep -qa stage-bcast "/proc/$p/cmdline" 2>/dev/null && return 0; done
  return 1
}
temp_bytes() { find "$ROOT/nodes/node$1/nvme" -name '*.stage-tmp.*' -printf '%s\n' 2>/dev/null | head -n1; }

"$H" mpirun "$ROOT/bin/stage-bcast" --source "$SRC" --dest "$ROOT/view/nvme/loss.img" --bcast-algorithm "$ALGO" \
  --stall-timeout "$STALL" --pre-validate none >"$LOG/mpirun.log" 2>&1 &
mpirun_pid=$!
t_start=$(now)
for _ in $(seq 600); do
  b=$(temp_bytes "$CUT"); [ -n "$b" ] && [ "$b" -gt $((8 << 20)) ] && break
  sleep 0.1
done
if [[ $MODE == choke ]]; then "$H" shape "$CUT" 8kbit; else "$H" linkdown "$CUT"; fi
t_cut=$(now)
log "link of node $CUT broken ($MODE) $(elapsed "$t_start" "$t_cut") s after the start (its temporary copy: $(temp_bytes "$CUT") bytes)"
declare -A gone
left=$N
while ((left > 1)); do
  for ((k = 1; k <= N; k++)); do
    [[ -n ${gone[$k]:-} || $k == "$CUT" ]] && continue
    sb_alive "$k" || { gone[$k]=$(elapsed "$t_cut" "$(now)"); left=$((left - 1)); }
  done
  awk -v t="$(elapsed "$t_cut" "$(now)")" -v b="$BOUND" 'BEGIN { exit !(t > b) }' && break
  sleep 0.25
done
partial=0
for ((k = 1; k <= N; k++)); do
  f=$ROOT/nodes/node$k/nvme/loss.img
  [[ -e $f ]] && ! cmp -s "$f" "$SRC" && partial=$((partial + 1))
done
{
  echo "# node_loss_scale ($MODE): $N nodes, node $CUT's link broken mid-broadcast"
  echo
  echo "$(date -Is), git $(git -C "$TOP" rev-parse --short HEAD), algorithm $ALGO, $SIZE_MB MiB, links $RATE, --stall-timeout $STALL s, MODE=$MODE."
  echo "Link broken $(elapsed "$t_start" "$t_cut") s after mpirun started. Seconds from the cut until each node's stage-bcast was gone (bound ${BOUND} s):"
  echo
  echo "| node | returned after (s) |"
  echo "|---|---|"
  for ((k = 1; k <= N; k++)); do
    [[ $k == "$CUT" ]] && { echo "| $k (cut) | (not checked) |"; continue; }
    echo "| $k | ${gone[$k]:-STILL RUNNING} |"
  done
  echo
  echo "Partial or wrong files under the final name: $partial. mpirun's last lines:"
  echo
  echo '```'
  tail -n 12 "$LOG/mpirun.log"
  echo '```'
} | tee "$MD"
