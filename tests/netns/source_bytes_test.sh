#!/usr/bin/env bash
# source_bytes_test.sh BUILD_DIR - the source node sends each byte about once.
#
# 4 simulated nodes (tests/harness/netns-cluster.sh, one rank per node, real TCP), every link
# shaped to RATE both ways. stage-bcast stages a SIZE_MB file from node 1 (rank 0) with
# --bcast-algorithm auto and then tree; for each run:
#   - every node's copy equals the source,
#   - node 1's eth0 sent less than 2.2x the file (interface counters; MPI_Bcast of large chunks
#     sent it once per other node, 3x here and (N-1)x in general).
# The 16-node figures are a benchmark (bench/bench_scale.sh), not a test.
# Exit 0 pass, 1 fail, 77 skip (not root, no `ip netns`, no mpirun).
# Environment: NETNS_SIM_ROOT (default /var/tmp/stagefs-netns-bytes), NETNS_SIM_NET (10.76.0),
# SOURCE_BYTES_SIZE_MB (32), SOURCE_BYTES_RATE (200mbit), SOURCE_BYTES_LIMIT (2.2).
set -uo pipefail

SKIP=77
[[ $# -ge 1 && -d $1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(readlink -f "$1")
HERE=$(dirname "$(readlink -f "$0")")
H=$(readlink -f "$HERE/../harness/netns-cluster.sh")
SB=$BUILD/tools/stage-bcast
skip() { echo "SKIP: $*"; exit "$SKIP"; }
[[ $(id -u) == 0 ]] || skip "needs root"
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
for c in tc nsenter mpirun cmp; do command -v "$c" >/dev/null || skip "missing $c"; done
[[ -x $SB ]] || { echo "FAIL: $SB is not built"; exit 1; }

export NETNS_SIM_ROOT=${NETNS_SIM_ROOT:-/var/tmp/stagefs-netns-bytes}
export NETNS_SIM_NET=${NETNS_SIM_NET:-10.76.0}
ROOT=${NETNS_SIM_ROOT%/}
N=4
SIZE_MB=${SOURCE_BYTES_SIZE_MB:-32}
RATE=${SOURCE_BYTES_RATE:-200mbit}
LIMIT=${SOURCE_BYTES_LIMIT:-2.2}
LOG=$BUILD/tests/netns/source_bytes.logs
FAILED=0 PASSED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*"; }

cleanup() { "$H" down >>"$LOG/harness.log" 2>&1 || echo "WARNING: harness down reported leftovers"; rm -rf "$ROOT/shared/bytes" "$ROOT/bin" "$ROOT"/nodes/node*/nvme/img; }
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$LOG"
mkdir -p "$LOG"
"$H" down >>"$LOG/harness.log" 2>&1 || true
"$H" up "$N" >>"$LOG/harness.log" 2>&1 || { cat "$LOG/harness.log"; echo "FAIL: cluster up"; exit 1; }
for ((k = 1; k <= N; k++)); do "$H" shape "$k" "$RATE"; done
mkdir -p "$ROOT/bin" "$ROOT/shared/bytes"
cp "$SB" "$ROOT/bin/stage-bcast"
SRC=$ROOT/shared/bytes/img
head -c "${SIZE_MB}M" /dev/urandom >"$SRC"
SIZE=$(stat -c %s "$SRC")

for algo in auto tree; do
  for ((k = 1; k <= N; k++)); do rm -f "$ROOT/nodes/node$k/nvme/img"; done
  tx0=$("$H" exec 1 cat /sys/class/net/eth0/statistics/tx_bytes)
  t0=${EPOCHREALTIME/./}
  if timeout 120 "$H" mpirun "$ROOT/bin/stage-bcast" --source "$SRC" --dest "$ROOT/view/nvme/img" \
    --bcast-algorithm "$algo" --stall-timeout 30 >"$LOG/$algo.out" 2>&1; then
    pass "$algo: stage-bcast on $N nodes returned 0 ($(((${EPOCHREALTIME/./} - t0) / 1000)) ms)"
  else
    fail "$algo: stage-bcast on $N nodes failed: $(tail -n 5 "$LOG/$algo.out" | tr '\n' ' ')"
  fi
  tx1=$("$H" exec 1 cat /sys/class/net/eth0/statistics/tx_bytes)
  for ((k = 1; k <= N; k++)); do
    cmp -s "$SRC" "$ROOT/nodes/node$k/nvme/img" || fail "$algo: node $k's copy differs from the source"
  done
  ratio=$(awk -v a="$tx0" -v b="$tx1" -v s="$SIZE" 'BEGIN { printf "%.3f", (b - a) / s }')
  if awk -v r="$ratio" -v l="$LIMIT" 'BEGIN { exit !(r < l) }'; then
    pass "$algo: the source node sent ${ratio}x the file (limit ${LIMIT}x)"
  else
    fail "$algo: the source node sent ${ratio}x the file (limit ${LIMIT}x)"
  fi
done
echo "source_bytes: $PASSED passed, $FAILED failed"
((FAILED == 0 && PASSED > 0))
