#!/usr/bin/env bash
# bench_sparse.sh: a user's huge sparse file and another user's open, through a standalone
# stagefs mount (one machine; the default 16 MiB chunks).
#
# Per variant and round (variants interleaved), each on a fresh cache and mount:
#   idle       user B (uid 1234) reads WORK/src/other-R.bin (20 MiB, uncached): timed;
#   contended  user A (uid 65534) opens WORK/src/a/huge.img (SPARSE_SIZE, default 1T, with 7
#              bytes written in its middle) and reads 4 bytes there; once the daemon's status
#              shows that transfer in flight (or A's read returned), B reads another uncached
#              20 MiB file: B's read timed, and A's;
#   dense      A reads WORK/src/a/dense.bin, one chunk (16 MiB) of random bytes: what the sparse
#              file's one data chunk costs on its own, for "the sparse file's time against its
#              data size".
# The contended/idle ratio of B's read is the figure (target <= 2); each transfer's own time
# and chunk count come from the daemon's log and status (chunks_broadcast).
# BIN2=DIR (another build's tools, e.g. the commit before) adds the variant "base": the same
# rounds with that stagefs.
#
# Env: SPARSE_SIZE (1T) RUNS (3) WORK_ROOT BIN BIN2 RESULTS
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SPARSE_SIZE=${SPARSE_SIZE:-1T}
RUNS=${RUNS:-3}
WORK=$WORK_ROOT/sparse
SRC=$WORK/src
MNT=$WORK/mnt
CACHE=$WORK/cache
NAME=${NAME:-bench_sparse}
daemon_pid=
trap standalone_cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
mkdir -p "$SRC/a" "$MNT"
chmod 755 "$SRC" "$SRC/a"
chown 65534:65534 "$SRC/a"
as_user 65534 sh -c "rm -f '$SRC/a/huge.img' && truncate -s '$SPARSE_SIZE' '$SRC/a/huge.img'"
size=$(stat -c %s "$SRC/a/huge.img")
mid=$(((size / 2) / 4096 * 4096))
printf stagefs | as_user 65534 dd of="$SRC/a/huge.img" bs=1 seek="$mid" conv=notrunc status=none
make_random_file "$WORK/one-chunk.bin" 16
cp "$WORK/one-chunk.bin" "$SRC/a/dense.bin"
chmod 644 "$SRC/a/huge.img" "$SRC/a/dense.bin"
log "sparse file: $size bytes, $(($(stat -c %b "$SRC/a/huge.img") * 512)) allocated, data at $mid"

stat_of() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1]).get(sys.argv[2], -1))' "$(status)" "$1"; }
timed_probe() {  # seconds of one open and 4-byte read at offset $3 of $2 as uid $1
  local t0 t1
  t0=$(now)
  as_user "$1" "$PY" -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); assert os.pread(fd, 4, int(sys.argv[2])) == b"stag"' "$2" "$3"
  t1=$(now)
  elapsed "$t0" "$t1"
}
# The daemon's own time for a transfer of $1 ("materialized REL (N bytes) in S s").
transfer_secs() {
  grep -o "materialized $1 ([0-9]* bytes) in [0-9.]* s" "$LOGF" | head -1 | sed -E 's/.* in ([0-9.]+) s/\1/'
}
start() {  # a fresh cache and mount with the stagefs of variant $1
  local bin=$BIN
  [ "$1" = base ] && bin=$BIN2
  rm -rf "$CACHE"
  LOGF=$WORK/daemon-$1-$r.log
  "$bin/stagefs" "$SRC" "$MNT" --cache "$CACHE" 2> "$LOGF" &
  daemon_pid=$!
  "$bin/stagefs" --wait "$MNT" --wait-timeout 60 || die "mount not ready: $(cat "$LOGF")"
}
stop() {
  unmount_if "$MNT"
  kill_tree "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=
}

variants="new"
[ -n "${BIN2:-}" ] && variants="new base"
raw_init "$NAME" "round,variant,sparse_bytes,loadavg,b_idle,b_contended,a_sparse_open,sparse_transfer,sparse_chunks,dense_open,dense_transfer"
for ((r = 1; r <= RUNS; r++)); do
  # shellcheck disable=SC2086  # the variants are words
  for v in $(round_order "$r" $variants); do
    for k in idle contended; do
      cp "$WORK/one-chunk.bin" "$SRC/other-$k.bin"
      head -c $((4 << 20)) "$WORK/one-chunk.bin" >> "$SRC/other-$k.bin"  # 20 MiB
      chmod 644 "$SRC/other-$k.bin"
    done
    la=$(loadavg)
    start "$v"
    b_idle=$(timed_cat 1234 "$MNT/other-idle.bin")
    stop
    start "$v"
    ( timed_probe 65534 "$MNT/a/huge.img" "$mid" > "$WORK/a.time" ) &
    a_pid=$!
    wait_in_flight a/huge.img "$a_pid" 600
    b_cont=$(timed_cat 1234 "$MNT/other-contended.bin")
    wait "$a_pid"
    a_open=$(cat "$WORK/a.time")
    for _ in $(seq 12000); do  # the sparse file's transfer logged (it may end after A's read)
      [ -n "$(transfer_secs a/huge.img)" ] && break
      sleep 0.05
    done
    chunks=$(stat_of chunks_broadcast)
    sparse_t=$(transfer_secs a/huge.img)
    stop
    start "$v"
    dense_open=$(timed_cat 65534 "$MNT/a/dense.bin")
    dense_t=$(transfer_secs a/dense.bin)
    stop
    # chunks: the sparse file's and the other file's 2 (both transfers of the contended mount)
    raw "$r,$v,$size,$la,$b_idle,$b_cont,$a_open,$sparse_t,$((chunks - 2)),$dense_open,$dense_t"
  done
done

"$PY" - "$RAW" "$MD" "$size" <<'EOF'
import csv, os, statistics, sys
raw, md, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [r for r in csv.DictReader(l for l in open(raw) if not l.startswith("#"))]
variants = [v for v in ("new", "base") if any(r["variant"] == v for r in rows)]
def med(v, c):
    return statistics.median(float(r[c]) for r in rows if r["variant"] == v)
def chunks(v):  # a build without the chunks_broadcast counter: not known
    n = med(v, "sparse_chunks")
    return f"{n:.0f}" if n >= 0 else "n/a"
lines = [f"# bench_sparse: a user's {size / 2**40:g} TiB sparse file (7 bytes of data) and another user's open", "",
         f"`bench/bench_sparse.sh`, standalone mount, 16 MiB chunks; {len(rows)} rounds in all, variants "
         f"interleaved; medians in seconds. Raw: {os.path.basename(raw)}.", "",
         "| variant | B's 20 MiB read, idle | while A opens the sparse file | ratio | median of per-round ratios "
         "| sparse transfer | its chunks | one 16 MiB chunk's transfer | sparse / one chunk |",
         "|---|---|---|---|---|---|---|---|---|"]
for v in variants:
    per_round = [float(r["b_contended"]) / float(r["b_idle"]) for r in rows if r["variant"] == v]
    lines.append(f"| {v} | {med(v, 'b_idle'):.3f} | {med(v, 'b_contended'):.3f} | "
                 f"{med(v, 'b_contended') / med(v, 'b_idle'):.2f} | {statistics.median(per_round):.2f} | "
                 f"{med(v, 'sparse_transfer'):.3f} | {chunks(v)} | {med(v, 'dense_transfer'):.3f} | "
                 f"{med(v, 'sparse_transfer') / med(v, 'dense_transfer'):.2f} |")
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
