#!/usr/bin/env bash
# bench_scale.sh: how staging time grows with the node count, on the netns cluster
# (tests/harness/netns-cluster.sh: one rank per simulated node, real TCP between network
# namespaces) with every node's link shaped to RATE in both directions, so the links, not this
# machine's two cores, are the bottleneck.
#
# For each N in NODES (cluster brought up once per N, all links shaped):
#   sb-<ALGO>   mpirun stage-bcast --source SHARED/img --dest NVME/img --bcast-algorithm ALGO
#               (source rank 0 = node 1, which reads the shared file; --pre-validate none)
#               wall = mpirun start to end; CPU = user+sys of each rank (/usr/bin/time in the
#               node); sent = each node's eth0 tx_bytes delta / file size (interface counters).
#   fs-<ALGO>   (STAGEFS=1) a stagefs mount group; once ready, every node opens and reads
#               MNT/img at once: time from the reads' start until the last one returns
#               (the first open's transfer: the broadcast, publication and the read).
#   sb-seed     (SEED=1) as sb-chain, but node N already holds a current copy (same bytes and
#               mtime) and stage-bcast runs with its default pre-validation: node N's rank
#               reads its own copy and feeds the chain; node 1 reads the source for metadata
#               only. src_sent_x is then node 1's share of the sending, fed_by in the log.
#   fs-seed     (SEED=1, STAGEFS=1) as fs-chain, but node N's cache keeps the valid copy the
#               fs-chain run before it left (every other node's cache is emptied): node N's rank
#               feeds the first open's transfer from its cache; node 1 opens the source for
#               metadata only (bytes_from_source in node 1's user.stagefs.stats, in the log).
#   pull        (BASELINE=1) every node reads the source itself: node 1 serves the file over
#               HTTP (python3 http.server) and nodes 2..N fetch it at once, through node 1's
#               shaped link (an NFS-like server with one link; a parallel filesystem with k
#               servers behaves like k of these).
# Page caches are not dropped: the source is read from memory, so the network is measured.
# RAM=1 (default) puts the cluster's root (the nodes' "local disks" and the source) on a tmpfs
# of its own: the simulated nodes share one real disk, and 16 copies written and fsynced to it
# at once measure that disk, not the broadcast.
# Each copy is compared with the source after the run.
#
# Env: NODES ("1 2 4 8 16") ALGOS ("mpi chain tree") SIZE_MB (64) RATE (100mbit) CHUNK (16M)
#      STAGEFS (1) STAGEFS_ALGOS ("mpi chain") BASELINE (1) SEED (0) TIMEOUT (300 s per run)
#      RAM (1) NETNS_SIM_ROOT (WORK_ROOT/scale-ram/netns with RAM=1, else /var/tmp/stagefs-scale)
#      NETNS_SIM_NET (10.78.0): a cluster of its own
#      NAME (bench_scale): results' file name (another name keeps another set, e.g. another RATE)
# Output: bench/results/NAME.raw.csv and NAME.md (tables by bench/scale_table.py).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
unset OMPI_MCA_btl_tcp_if_include   # lib.sh's loopback setting; the harness picks the links

NODES=${NODES:-"1 2 4 8 16"}
ALGOS=${ALGOS:-"mpi chain tree"}
SIZE_MB=${SIZE_MB:-64}
RATE=${RATE:-100mbit}
CHUNK=${CHUNK:-16M}
STAGEFS=${STAGEFS:-1}
STAGEFS_ALGOS=${STAGEFS_ALGOS:-"mpi chain"}
BASELINE=${BASELINE:-1}
TIMEOUT=${TIMEOUT:-300}
max_n=0; for n in $NODES; do ((n > max_n)) && max_n=$n; done
need_bin stage-bcast
need_bin stagefs
NSUTIL=$TOP/tests/netns/nsutil.py
NAME=${NAME:-bench_scale}  # another name keeps a second set of results (e.g. another RATE)
mpirun_pid='' server_pid=''
NETNS_BENCH_PIDS="mpirun_pid server_pid"
netns_bench_begin scale $((SIZE_MB * (2 * max_n + 4) + 256)) 10.78.0

# private copies of the binaries: a rebuild during the run cannot pull them away
mkdir -p "$ROOT/bin" "$ROOT/shared/scale"
cp "$BIN/stage-bcast" "$BIN/stagefs" "$ROOT/bin/"
SB=$ROOT/bin/stage-bcast
FS=$ROOT/bin/stagefs
SRC=$ROOT/shared/scale/img
make_random_file "$SRC" "$SIZE_MB"
FILE_BYTES=$(stat -c %s "$SRC")

# APPEND=1: add to the existing raw file (re-running some N or variants; the table keeps the
# last row of each variant and N)
if [ "${APPEND:-0}" = 1 ] && [ -f "$RESULTS/$NAME.raw.csv" ]; then
  RAW=$RESULTS/$NAME.raw.csv MD=$RESULTS/$NAME.md
  echo "# appended $(date -Is) git=$(git -C "$TOP" rev-parse --short HEAD)" >>"$RAW"
else
  raw_init "$NAME" "variant,nodes,rate,bytes,wall_s,tool_total_s,tool_copy_s,src_sent_x,max_sent_x,sum_sent_x,cpu_src_s,cpu_max_s,cpu_mean_s,ok,loadavg"
fi

tx_of() { "$H" exec "$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
tx_all() { local k; for ((k = 1; k <= N; k++)); do tx_of "$k"; done; }
# sent ratios from two tx_all snapshots: "src_x max_x sum_x"
sent_ratios() {
  "$PY" - "$FILE_BYTES" "$1" "$2" <<'EOF'
import sys
size = int(sys.argv[1]); a = list(map(int, sys.argv[2].split())); b = list(map(int, sys.argv[3].split()))
d = [(y - x) / size for x, y in zip(a, b)]
print(f"{d[0]:.3f} {max(d):.3f} {sum(d):.3f}")
EOF
}
# CPU seconds per rank from each node's /tmp/sb.time ("user sys"): "src max mean"
cpu_figures() {
  "$PY" - "$ROOT" "$N" <<'EOF'
import sys
root, n = sys.argv[1], int(sys.argv[2]); cpu = []
for k in range(1, n + 1):
    try:
        u, s = open(f"{root}/nodes/node{k}/tmp/sb.time").read().split()[:2]; cpu.append(float(u) + float(s))
    except (OSError, ValueError):
        cpu.append(float("nan"))
print(f"{cpu[0]:.2f} {max(cpu):.2f} {sum(cpu) / len(cpu):.2f}")
EOF
}
copies_ok() {  # FILE-UNDER-NODE-DIR: every node holds the source's bytes there
  local k
  for ((k = 1; k <= N; k++)); do cmp -s "$SRC" "$ROOT/nodes/node$k/$1" || { log "node $k: $1 differs"; return 1; }; done
}

run_sb() {  # ALGO [seed]
  local a=$1 variant=sb-$1 k t0 t1 tx0 tx1 rc=0 ok=1 json total copy pre=(--pre-validate none)
  for ((k = 1; k <= N; k++)); do rm -f "$ROOT/nodes/node$k/nvme/img" "$ROOT/nodes/node$k/tmp/sb.time"; done
  if [ "${2:-}" = seed ]; then  # the last node is warm: a current copy, default pre-validation
    ((N >= 2)) || return 0
    variant=sb-seed pre=()
    cp -p "$SRC" "$ROOT/nodes/node$N/nvme/img"
  fi
  tx0=$(tx_all)
  t0=$(now)
  timeout "$TIMEOUT" nice -n 10 "$H" mpirun /usr/bin/time -f '%U %S' -o /tmp/sb.time \
    "$SB" --source "$SRC" --dest "$ROOT/view/nvme/img" --bcast-algorithm "$a" --chunk-size "$CHUNK" \
    "${pre[@]}" --json >"$LOG/$variant.n$N.json" 2>"$LOG/$variant.n$N.err" || rc=$?
  t1=$(now)
  tx1=$(tx_all)
  json=$(tail -n 1 "$LOG/$variant.n$N.json")
  total=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"]["total"])' "$json" 2>/dev/null || echo nan)
  copy=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"]["copy"])' "$json" 2>/dev/null || echo nan)
  ((rc == 0)) && copies_ok nvme/img || ok=0
  ((rc == 0)) || log "$variant N=$N: exit $rc: $(tail -n 3 "$LOG/$variant.n$N.err" | tr '\n' ' ')"
  [ "$variant" = sb-seed ] && log "sb-seed N=$N: $("$PY" -c 'import json,sys; j=json.loads(sys.argv[1]); print({k: j.get(k) for k in ("fed_by_rank", "fed_from", "bytes_read_source", "bytes_read_seed")})' "$json" 2>/dev/null)"
  raw "$variant,$N,$RATE,$FILE_BYTES,$(elapsed "$t0" "$t1"),$total,$copy,$(sent_ratios "$tx0" "$tx1" | tr ' ' ,),$(cpu_figures | tr ' ' ,),$ok,$(loadavg)"
}

run_pull() {
  local k t0 t1 tx0 tx1 ok=1 pids=()
  ((N >= 2)) || return 0
  "$H" exec 1 "$PY" -m http.server --bind "$NETNS_SIM_NET.1" --directory "$ROOT/shared/scale" 8000 \
    >"$LOG/pull-server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do "$H" exec 2 "$PY" -c "import urllib.request as u; u.urlopen('http://$NETNS_SIM_NET.1:8000/', timeout=1)" 2>/dev/null && break; sleep 0.2; done
  for ((k = 1; k <= N; k++)); do rm -f "$ROOT/nodes/node$k/nvme/img"; done
  tx0=$(tx_all)
  t0=$(now)
  for ((k = 2; k <= N; k++)); do
    "$H" exec "$k" "$PY" -c "
import shutil, sys, urllib.request as u
with u.urlopen(sys.argv[1]) as r, open(sys.argv[2], 'wb') as f: shutil.copyfileobj(r, f, 4 << 20)
" "http://$NETNS_SIM_NET.1:8000/img" "$ROOT/view/nvme/img" 2>>"$LOG/pull.err" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || ok=0; done
  t1=$(now)
  tx1=$(tx_all)
  kill_tree "$server_pid"; server_pid=''
  cp "$SRC" "$ROOT/nodes/node1/nvme/img"   # node 1 has it already (the server)
  copies_ok nvme/img || ok=0
  raw "pull,$N,$RATE,$FILE_BYTES,$(elapsed "$t0" "$t1"),nan,nan,$(sent_ratios "$tx0" "$tx1" | tr ' ' ,),nan,nan,nan,$ok,$(loadavg)"
}

run_fs() {  # ALGO [seed]
  local a=$1 variant=fs-$1 k t0 t1 tx0 tx1 ok=1 pids=() mnt=$ROOT/view/stage keep=0
  if [ "${2:-}" = seed ]; then  # node N's cache keeps the copy of the fs-ALGO run before
    ((N >= 2)) || return 0
    variant=fs-seed keep=$N
    [ -f "$ROOT/nodes/node$N/nvme/cache/data/img" ] || { log "fs-seed N=$N: no warm copy on node $N (run fs-$a first)"; return 0; }
  fi
  for ((k = 1; k <= N; k++)); do
    ((k == keep)) || rm -rf "$ROOT/nodes/node$k/nvme/cache"
    rm -f "$ROOT/nodes/node$k/nvme/img"
  done
  nice -n 10 "$H" mpirun "$FS" "$ROOT/shared/scale" "$mnt" --cache "$ROOT/view/nvme/cache" \
    --bcast-algorithm "$a" --chunk-size "$CHUNK" --stall-timeout 60 </dev/null >"$LOG/$variant.n$N.log" 2>&1 &
  mpirun_pid=$!
  if ! "$H" exec 1 "$FS" --wait "$mnt" --wait-timeout 120 >>"$LOG/$variant.n$N.log" 2>&1; then
    log "$variant N=$N: the mount group did not come up"; kill_tree "$mpirun_pid"; mpirun_pid=''
    raw "$variant,$N,$RATE,$FILE_BYTES,nan,nan,nan,nan,nan,nan,nan,nan,nan,0,$(loadavg)"
    return 0
  fi
  tx0=$(tx_all)
  t0=$(now)
  for ((k = 1; k <= N; k++)); do
    timeout "$TIMEOUT" "$H" exec "$k" "$PY" "$NSUTIL" read "$mnt/img" >"$LOG/$variant.n$N.read$k" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || ok=0; done
  t1=$(now)
  tx1=$(tx_all)
  [ "$variant" = fs-seed ] && log "fs-seed N=$N: $(grep -o 'fed by [a-z0-9 ]*' "$LOG/$variant.n$N.log" | head -1); node 1: $("$H" exec 1 getfattr --absolute-names --only-values -n user.stagefs.stats "$mnt" | stats_source_fields) (bytes from the source, from seeds)"
  kill -TERM "$mpirun_pid" 2>/dev/null
  for _ in $(seq 200); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.1; done
  kill_tree "$mpirun_pid"; wait "$mpirun_pid" 2>/dev/null || true; mpirun_pid=''
  copies_ok nvme/cache/data/img || ok=0
  raw "$variant,$N,$RATE,$FILE_BYTES,$(elapsed "$t0" "$t1"),nan,nan,$(sent_ratios "$tx0" "$tx1" | tr ' ' ,),nan,nan,nan,$ok,$(loadavg)"
}

for N in $NODES; do
  log "=== $N node(s), links $RATE ==="
  "$H" up "$N" >>"$LOG/harness.log" 2>&1 || die "netns cluster of $N does not come up (see $LOG/harness.log)"
  for ((k = 1; k <= N; k++)); do "$H" shape "$k" "$RATE"; done
  for a in $ALGOS; do run_sb "$a"; done
  if [ "${SEED:-0}" = 1 ]; then run_sb chain seed; fi
  if [ "$STAGEFS" = 1 ]; then for a in $STAGEFS_ALGOS; do run_fs "$a"; done; fi
  if [ "$STAGEFS" = 1 ] && [ "${SEED:-0}" = 1 ]; then run_fs chain seed; fi
  if [ "$BASELINE" = 1 ]; then run_pull; fi
done

"$PY" "$BENCH_DIR/scale_table.py" "$RAW" "$MD"
