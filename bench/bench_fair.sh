#!/usr/bin/env bash
# bench_fair.sh: how long one user's open waits behind another user's directory of N small
# files, through a standalone stagefs mount, with bounded batches (the defaults:
# --batch-max-files 4096 --batch-max-bytes 256M) and without (both 0: one batch for the
# whole directory, the behaviour before bounded batches).
#
# How, per variant and round (variants interleaved): a fresh cache and mount. User A
# (uid 65534) opens one file of WORK/src/u, a directory of N files of 100 bytes (o+r); once
# the daemon's status shows the batch of u/ in flight, user B (uid 1234) opens
# WORK/src/other/six.txt (6 bytes, uncached): B's wait is timed, and A's. Then, once the mount
# is idle (every slice of u/ staged), A opens a file just created in u/ and, once its batch
# is in flight (or A's open returned), B opens another uncached file: both timed. The status is polled every 50 ms
# (a bench, not a test: the poll only decides when B starts).
#
# Env: N (20000) RUNS (3) WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

N=${N:-20000}
RUNS=${RUNS:-3}
WORK=$WORK_ROOT/fair
SRC=$WORK/src
MNT=$WORK/mnt
CACHE=$WORK/cache
NAME=bench_fair
daemon_pid=
trap standalone_cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
mkdir -p "$SRC/other" "$MNT"
if [ "$(find "$SRC/u" -maxdepth 1 -type f -name 'f*' 2>/dev/null | wc -l)" != "$N" ]; then
  log "creating $N files of 100 bytes in $SRC/u"
  rm -rf "$SRC/u" && mkdir -p "$SRC/u"
  "$PY" -c 'import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(os.path.join(d, f"f{i:06d}"), "w") as f: f.write("x" * 100)' "$SRC/u" "$N"
  chown -R 65534:65534 "$SRC/u"
fi
chmod 755 "$SRC" "$SRC/u" "$SRC/other"

wait_idle() {  # until nothing is in flight and no open waits (at most 600 s)
  for _ in $(seq 12000); do
    s=$(status)
    if echo "$s" | grep -q '"transfer":null' && echo "$s" | grep -q '"waiting":0'; then return 0; fi
    sleep 0.05
  done
  die "mount not idle: $(status)"
}

# A (uid 65534) opens $1; once u/ is in flight, B (uid 1234) opens $2. Seconds of each in
# A_SECS and B_SECS.
a_then_b() {
  local ta=$WORK/a.time a_pid
  ( timed_cat 65534 "$1" > "$ta" ) &
  a_pid=$!
  wait_in_flight u/ "$a_pid"
  B_SECS=$(timed_cat 1234 "$2")
  wait "$a_pid"
  A_SECS=$(cat "$ta")
}

raw_init "$NAME" "round,variant,n,loadavg,b_wait,a_open,new_a_open,new_b_wait"
for ((r = 1; r <= RUNS; r++)); do
  for v in $(round_order "$r" unbounded bounded); do
    args=()
    [ "$v" = unbounded ] && args=(--batch-max-files 0 --batch-max-bytes 0)
    rm -rf "$CACHE" "$SRC/u/new"*
    printf 'hello\n' > "$SRC/other/six.txt"
    printf 'hello2\n' > "$SRC/other/seven.txt"
    chmod 644 "$SRC/other/"*
    LOGF=$WORK/daemon-$v.log
    "$BIN/stagefs" "$SRC" "$MNT" --cache "$CACHE" "${args[@]}" 2> "$LOGF" &
    daemon_pid=$!
    "$BIN/stagefs" --wait "$MNT" --wait-timeout 60 || die "mount not ready: $(cat "$LOGF")"
    la=$(loadavg)
    a_then_b "$MNT/u/f000100" "$MNT/other/six.txt"
    a=$A_SECS b=$B_SECS
    wait_idle
    printf 'new\n' > "$SRC/u/new-$r"
    chmod 644 "$SRC/u/new-$r"
    a_then_b "$MNT/u/new-$r" "$MNT/other/seven.txt"
    raw "$r,$v,$N,$la,$b,$a,$A_SECS,$B_SECS"
    unmount_if "$MNT"
    kill_tree "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=
  done
done

"$PY" - "$RAW" "$MD" "$N" <<'EOF'
import csv, statistics, sys
raw, md, n = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [r for r in csv.DictReader(l for l in open(raw) if not l.startswith("#"))]
cols = [("b_wait", "B's open of an unrelated 6-byte file while A's directory is staged"),
        ("a_open", "A's open of one file of its directory of small files"),
        ("new_a_open", "A's open of a new file in the staged directory"),
        ("new_b_wait", "B's open of an unrelated file meanwhile")]
med = {(v, c): statistics.median(float(r[c]) for r in rows if r["variant"] == v)
       for v in ("unbounded", "bounded") for c, _ in cols}
with open(md, "w") as f:
    f.write(f"# bench_fair: one user's directory of {n} small files, another user's open\n\n")
    f.write(open(raw).readline().lstrip("# "))
    f.write(f"\nStandalone mount, {len(rows) // 2} round(s) per variant, medians in seconds. "
            "unbounded: --batch-max-files 0 --batch-max-bytes 0 (one batch per directory, as "
            "before bounded batches); bounded: the defaults (4096 files, 256M).\n\n")
    f.write("| what | unbounded | bounded | unbounded / bounded |\n|---|---|---|---|\n")
    for c, what in cols:
        u, b = med[("unbounded", c)], med[("bounded", c)]
        f.write(f"| {what} | {u:.3f} | {b:.3f} | {u / b if b > 0 else float('inf'):.1f} |\n")
print(open(md).read())
EOF
