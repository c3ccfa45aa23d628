#!/usr/bin/env bash
# bench_hol_scale.sh: "a small-file batch must not wait behind a large
# transfer" on the netns cluster (tests/harness/netns-cluster.sh: one rank per simulated
# node, real TCP between network namespaces), every node's link shaped to RATE both ways, at
# N = 2..16 nodes; a stagefs group with --nested-batches on and one with off per N.
#
# Per N and MODE (one mount group, chunk CHUNK, --stall-timeout 120, fresh caches). Source
# (SHARED/hol): img-MODE (SIZE_MB MiB random), alone-MODE/ and behind-MODE/ (FILES files of
# FILE_KB KiB each: each directory is one batch).
#   alone   on node N (the last node), the first open of alone-MODE/f00
#   large   node 1 reads the whole img-MODE (tests/netns/nsutil.py read) in the background;
#           an in-node poller reads node 1's user.stagefs.stats every 0.1 s (at most 60 s)
#           until it shows a "transfer" (the image's broadcast is under way) whose bytes_done
#           is at least MARK_BYTES (default 0: as soon as the transfer shows)
#   behind  then, on node N, the first open of behind-MODE/f00 (its batch opened while the
#           image streams); then the image read is waited for (large = its start to its end, the
#           wall time of the read command in node 1, taken when it ends; large_tool_s in the raw
#           file: nsutil's own open-to-EOF time)
# Open times: `python3 -c "open(PATH,'rb').close()"` run in the node; the table uses the
# time python measures around open()+close() (the open's latency), the raw file also has the
# wall time of the whole command (nsenter + python start-up, ~0.05-0.1 s more).
# Bytes sent: each node's eth0 tx_bytes from just before the image read starts until every
# node's copies are published (the image, the nested/waiting batch, MPI control traffic),
# over the image size.
# Copies: every node's cache copy (NVME/cache/data/...) of the image and of both batches'
# files is compared with the source (after waiting, bounded, for the last nodes to publish).
# RAM=1 (default) puts the cluster's root on a tmpfs of its own, as bench_scale.sh does.
#
# Env: NODES ("2 4 8 16") MODES ("on off") SIZE_MB (96) FILES (20) FILE_KB (32) RATE (100mbit)
#      CHUNK (16M) MARK_BYTES (0) TIMEOUT (300 s per step) RAM (1) NETNS_SIM_NET (10.79.0)
#      NETNS_SIM_ROOT (WORK_ROOT/hol-ram/netns with RAM=1, else /var/tmp/stagefs-hol)
#      NAME (bench_hol_scale): results' file name; APPEND=1 adds to NAME's raw file (repeats)
# Output: bench/results/NAME.raw.csv and NAME.md (logs in WORK_ROOT/hol-logs).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
unset OMPI_MCA_btl_tcp_if_include   # lib.sh's loopback setting; the harness picks the links

NODES=${NODES:-"2 4 8 16"}
MODES=${MODES:-"on off"}
SIZE_MB=${SIZE_MB:-96}
FILES=${FILES:-20}
FILE_KB=${FILE_KB:-32}
RATE=${RATE:-100mbit}
CHUNK=${CHUNK:-16M}
MARK_BYTES=${MARK_BYTES:-0}
TIMEOUT=${TIMEOUT:-300}
max_n=0; for n in $NODES; do ((n > max_n)) && max_n=$n; done
need_bin stagefs
NSUTIL=$TOP/tests/netns/nsutil.py
HARNESS=$TOP/tests/mount/stagefs_harness.py
NAME=${NAME:-bench_hol_scale}
mpirun_pid='' reader_pid=''
NETNS_BENCH_PIDS="reader_pid mpirun_pid"
netns_bench_begin hol $((SIZE_MB * (2 * max_n + 6) + 512)) 10.79.0

# private copy of the binary: a rebuild during the run cannot pull it away
mkdir -p "$ROOT/bin" "$ROOT/shared/hol"
cp "$BIN/stagefs" "$ROOT/bin/"
FS=$ROOT/bin/stagefs
SRC=$ROOT/shared/hol
for m in $MODES; do
  make_random_file "$SRC/img-$m" "$SIZE_MB"
  for d in alone behind; do
    mkdir -p "$SRC/$d-$m"
    for ((i = 0; i < FILES; i++)); do
      f=$SRC/$d-$m/$(printf 'f%02d' "$i")
      [ -f "$f" ] || head -c $((FILE_KB << 10)) /dev/urandom >"$f"
    done
  done
done
IMG_BYTES=$((SIZE_MB << 20))

# APPEND=1: add this run's rows to the existing raw file (repeats; the table lists every row)
if [ "${APPEND:-0}" = 1 ] && [ -f "$RESULTS/$NAME.raw.csv" ]; then
  RAW=$RESULTS/$NAME.raw.csv MD=$RESULTS/$NAME.md
  echo "# appended $(date -Is) git=$(git -C "$TOP" rev-parse --short HEAD)" >>"$RAW"
else
  raw_init "$NAME" "nodes,mode,rate,img_bytes,alone_s,behind_s,behind_alone,large_s,large_tool_s,alone_wall_s,behind_wall_s,mark_after_s,mark_bytes_done,nested_1,nested_n,batches_1,transfers_1,src_sent_x,max_sent_x,ok,loadavg"
fi
echo "# binary: $("$FS" --version 2>&1 | head -n 1) (a copy of $BIN/stagefs taken $(date -Is))" >>"$RAW"

tx_all() { local k; for ((k = 1; k <= N; k++)); do timeout 20 "$H" exec "$k" cat /sys/class/net/eth0/statistics/tx_bytes; done; }
sent_ratios() {  # two tx_all snapshots -> "node1_x max_x"
  "$PY" -c '
import sys
a, b = (list(map(int, s.split())) for s in sys.argv[2:4]); d = [(y - x) / int(sys.argv[1]) for x, y in zip(a, b)]
print(f"{d[0]:.3f} {max(d):.3f}")' "$IMG_BYTES" "$1" "$2"
}
# open_time K PATH OUT: the first open of PATH on node K; OUT gets python's own open() time
OPEN_PY='import sys, time
t = time.monotonic(); open(sys.argv[1], "rb").close(); print(f"{time.monotonic() - t:.3f}")'
open_time() { timeout "$TIMEOUT" "$H" exec "$1" "$PY" -c "$OPEN_PY" "$2" >"$3" 2>&1; }
num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] && echo "$1" || echo nan; }
# stat_of K FIELD: a counter of node K's status JSON (nan if unreadable)
stat_of() {
  timeout 20 "$H" exec "$1" "$PY" "$HARNESS" stats "$mnt" 2>/dev/null |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], "nan"))' "$2" 2>/dev/null || echo nan
}
# every node's cache copy of REL... equals the source; waits up to 60 s for late publications
copies_ok() {
  local k rel deadline=$((SECONDS + 60))
  for ((k = 1; k <= N; k++)); do
    for rel in "$@"; do
      until cmp -s "$SRC/$rel" "$ROOT/nodes/node$k/nvme/cache/data/$rel"; do
        ((SECONDS < deadline)) || { log "node $k: cache/data/$rel missing or differs"; return 1; }
        sleep 0.5
      done
    done
  done
}
# an in-node poller: node 1's status until it shows a transfer (with bytes_done >= MARK_BYTES); prints "<s> <bytes_done> <path>"
POLL_PY='import json, os, sys, time
t0 = time.monotonic()
while True:
    try:
        tr = json.loads(os.getxattr(sys.argv[1], "user.stagefs.stats")).get("transfer")
    except (OSError, ValueError):
        tr = None
    if tr and (tr.get("bytes_done") or 0) >= int(sys.argv[3]):
        print("%.3f %s %s" % (time.monotonic() - t0, tr.get("bytes_done"), tr.get("path"))); sys.exit(0)
    if time.monotonic() - t0 > float(sys.argv[2]):
        print("timeout"); sys.exit(1)
    time.sleep(0.1)'

run_mode() {  # MODE
  local m=$1 k t0 t1 tx0 tx1 ok=1 rc=0 tag="$1.n$N" poll mark_s=nan mark_b=nan
  local alone=nan behind=nan alone_w=nan behind_w=nan large=nan large_tool=nan
  mnt=$ROOT/view/stage
  for ((k = 1; k <= N; k++)); do rm -rf "$ROOT/nodes/node$k/nvme/cache"; done
  nice -n 10 "$H" mpirun "$FS" "$SRC" "$mnt" --cache "$ROOT/view/nvme/cache" --nested-batches "$m" \
    --chunk-size "$CHUNK" --stall-timeout 120 </dev/null >"$LOG/fs-$tag.log" 2>&1 &
  mpirun_pid=$!
  if ! timeout 150 "$H" exec 1 "$FS" --wait "$mnt" --wait-timeout 120 >>"$LOG/fs-$tag.log" 2>&1 ||
     ! timeout 150 "$H" exec "$N" "$FS" --wait "$mnt" --wait-timeout 120 >>"$LOG/fs-$tag.log" 2>&1; then
    log "$tag: the mount group did not come up (see $LOG/fs-$tag.log)"
  else
    # 1. the batch alone
    t0=$(now); open_time "$N" "$mnt/alone-$m/f00" "$LOG/alone-$tag.out" || { ok=0; log "$tag: alone open failed: $(cat "$LOG/alone-$tag.out")"; }
    t1=$(now); alone_w=$(elapsed "$t0" "$t1"); alone=$(num "$(tail -n 1 "$LOG/alone-$tag.out")")
    # 2. the batch behind the image's transfer
    tx0=$(tx_all)
    t0=$(now)
    rm -f "$LOG/large-$tag.end"
    # its end time is taken when it ends (the batch's open may return after it: mode off)
    { rc=0; timeout "$TIMEOUT" "$H" exec 1 "$PY" "$NSUTIL" read "$mnt/img-$m" >"$LOG/large-$tag.out" 2>&1 || rc=$?
      now >"$LOG/large-$tag.end"; exit "$rc"; } &
    reader_pid=$!
    if poll=$(timeout 70 "$H" exec 1 "$PY" -c "$POLL_PY" "$mnt" 60 "$MARK_BYTES"); then
      read -r _ mark_b _ <<<"$poll"; echo "$poll" >"$LOG/poll-$tag.out"
    else
      log "$tag: node 1 never showed a transfer ($poll); timing the batch anyway"
    fi
    t1=$(now); mark_s=$(elapsed "$t0" "$t1")   # from the image read's start to the batch's open
    open_time "$N" "$mnt/behind-$m/f00" "$LOG/behind-$tag.out" || { ok=0; log "$tag: behind open failed: $(cat "$LOG/behind-$tag.out")"; }
    behind_w=$(elapsed "$t1" "$(now)"); behind=$(num "$(tail -n 1 "$LOG/behind-$tag.out")")
    wait "$reader_pid" || rc=$?
    reader_pid=''
    large=$(elapsed "$t0" "$(cat "$LOG/large-$tag.end" 2>/dev/null)" 2>/dev/null || echo nan)
    read -r _ _ _ large_tool <"$LOG/large-$tag.out" || true
    large_tool=$(num "${large_tool:-}")
    [[ $(cut -d' ' -f1,3 "$LOG/large-$tag.out") == "ok $IMG_BYTES" ]] || { ok=0; log "$tag: image read: rc $rc, $(cat "$LOG/large-$tag.out")"; }
    local rels=("img-$m") d i
    for d in alone behind; do for ((i = 0; i < FILES; i++)); do rels+=("$d-$m/$(printf 'f%02d' "$i")"); done; done
    copies_ok "${rels[@]}" || ok=0
    tx1=$(tx_all)   # after every node published: the chain's tail may still send when node 1's read ends
    local n1 nn b1 tr1
    n1=$(stat_of 1 nested_batches); nn=$(stat_of "$N" nested_batches)
    b1=$(stat_of 1 batches); tr1=$(stat_of 1 transfers)
  fi
  kill -TERM "$mpirun_pid" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$mpirun_pid" 2>/dev/null; then log "$tag: mpirun still there 20 s after SIGTERM"; fi
  kill_tree "$mpirun_pid"; wait "$mpirun_pid" 2>/dev/null || true; mpirun_pid=''
  local ratio
  ratio=$("$PY" -c 'import sys; print(f"{float(sys.argv[2]) / float(sys.argv[1]):.1f}")' "$alone" "$behind" 2>/dev/null || echo nan)
  raw "$N,$m,$RATE,$IMG_BYTES,$alone,$behind,$ratio,$large,${large_tool:-nan},$alone_w,$behind_w,$mark_s,$mark_b,${n1:-nan},${nn:-nan},${b1:-nan},${tr1:-nan},$(if [ -n "${tx1:-}" ]; then sent_ratios "$tx0" "$tx1" | tr ' ' ,; else echo nan,nan; fi),$ok,$(loadavg)"
}

for N in $NODES; do
  log "=== $N node(s), links $RATE ==="
  timeout 300 "$H" up "$N" >>"$LOG/harness.log" 2>&1 || die "netns cluster of $N does not come up (see $LOG/harness.log)"
  for ((k = 1; k <= N; k++)); do "$H" shape "$k" "$RATE"; done
  for m in $MODES; do run_mode "$m"; done
done

# the table
"$PY" - "$RAW" "$MD" "NAME=$NAME $0 (NODES=\"$NODES\" MODES=\"$MODES\" SIZE_MB=$SIZE_MB FILES=$FILES FILE_KB=$FILE_KB RATE=$RATE CHUNK=$CHUNK MARK_BYTES=$MARK_BYTES)" <<'EOF'
import csv, sys
raw, md, cmd = sys.argv[1:4]
lines = open(raw).read().splitlines()
head = lines[0]
rows = list(csv.DictReader(l for l in lines[1:] if not l.startswith("#")))
binaries = sorted({l[2:] for l in lines if l.startswith("# binary: ")})
loads = [float(r["loadavg"].split()[0]) for r in rows]
order = {"on": 0, "off": 1}
rows.sort(key=lambda r: (int(r["nodes"]), order.get(r["mode"], 2)))  # stable: repeats in run order
out = [f"# A small-file batch behind a large transfer, 2-16 netns nodes", "",
       f"Command: `{cmd}`", "", f"Raw: `{raw.split('/bench/')[-1]}` (`{head.lstrip('# ')}`)", "",
       *([*(b + "  " for b in binaries), ""] if binaries else []),
       f"Load average (1 min) at the end of each row: {min(loads):.2f}-{max(loads):.2f} (per row in the raw file)", "",
       "| N | mode | batch alone (s) | batch behind the large transfer (s) | behind/alone | large file read (s) "
       "| nested_batches (node 1 / node N) | max bytes sent per node / image size | copies ok |",
       "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    out.append(f"| {r['nodes']} | {r['mode']} | {r['alone_s']} | {r['behind_s']} | {r['behind_alone']} | {r['large_s']} "
               f"| {r['nested_1']} / {r['nested_n']} | {r['max_sent_x']} | {'yes' if r['ok'] == '1' else 'NO'} |")
out += ["", "The batch was opened on node N `mark_after_s` seconds after the image read started "
        "(raw file; node 1's status showed the transfer by then)."]
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
