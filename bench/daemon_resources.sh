#!/usr/bin/env bash
# daemon_resources.sh: what one node's stagefs daemon takes (CPU, memory), idle and during a
# transfer, so that the admin guide can say what the daemon step needs and how to give it.
#
# A group of RANKS daemons (mpirun, ranks acting as nodes, each in its own mount namespace and
# in a memory cgroup of its own, as a Slurm step with --mem would be), a SIZE_MB file opened on
# node 1 (rank 0 reads the source, the others receive and write). Per round and rank:
#   idle      CPU (% of one core) over IDLE s after the mount is ready; RSS
#   transfer  CPU (% of one core) from the open until every node counts the transfer (the read
#             may end first: reads during the copy); the largest RSS sampled every 0.1 s; the
#             cgroup's peak memory (memory.max_usage_in_bytes: RSS plus the page cache the
#             buffered cache writes fill, which Slurm's --mem counts too); the transfer's time
# Variants, interleaved: unlimited cgroups, and cgroups limited to LIMIT_MB (the page cache is
# reclaimed within the limit): the ratio of the transfer times says what the limit costs.
# Results: bench/results/daemon_resources.md (medians over RUNS rounds) and .raw.csv.
#
# Env: SIZE_MB (1024) RANKS (4) IDLE (10) LIMIT_MB (256) RUNS (5, lib.sh) WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail

. "$(dirname "$0")/lib.sh"
need_root
[ -d /sys/fs/cgroup/memory ] || die "needs the cgroup v1 memory controller"

SIZE_MB=${SIZE_MB:-1024}
RANKS=${RANKS:-4}
IDLE=${IDLE:-10}
LIMIT_MB=${LIMIT_MB:-256}
WORK=$WORK_ROOT/resources
MNT=$WORK/mnt
NAME=daemon_resources
HZ=$(getconf CLK_TCK)
CGROOT=/sys/fs/cgroup/memory/stagefs-bench.$$

group_pid=
cleanup() {
  set +e
  stop_group
  for ((k = 0; k < RANKS; k++)); do rmdir "$CGROOT/rank$k" 2>/dev/null; done
  rmdir "$CGROOT" 2>/dev/null
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
need_space $(((SIZE_MB * (RANKS + 1)) / 1024 + 1))
mkdir -p "$WORK/src" "$MNT" "$CGROOT"
make_random_file "$WORK/src/img" "$SIZE_MB"

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
pct() { "$PY" -c "import sys; print(f'{int(sys.argv[1]) / $HZ / float(sys.argv[2]) * 100:.1f}')" "$1" "$2"; }
mib() { echo $(($1 / 1024)); }
transfers() {  # transfers node $1's daemon took part in
  on_node "$1" "$PY" -c 'import json,os,sys; print(json.loads(os.getxattr(sys.argv[1], "user.stagefs.stats"))["transfers"])' "$MNT"
}

start_group() {  # $1: the cgroups' limit in MiB (0: none)
  rm -rf "$WORK"/pid* "$WORK"/node*
  local k
  for ((k = 0; k < RANKS; k++)); do
    mkdir -p "$CGROOT/rank$k"
    echo -1 > "$CGROOT/rank$k/memory.limit_in_bytes"
    [ "$1" = 0 ] || echo $(($1 << 20)) > "$CGROOT/rank$k/memory.limit_in_bytes"
    echo 0 > "$CGROOT/rank$k/memory.max_usage_in_bytes"
  done
  timeout -k 5 600 mpirun --oversubscribe -np "$RANKS" sh -c 'echo $$ > '"$CGROOT"'/rank$OMPI_COMM_WORLD_RANK/cgroup.procs; echo $$ > '"$WORK"'/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private '"$BIN"'/stagefs '"$WORK/src $MNT"' --cache '"$WORK"'/node$OMPI_COMM_WORLD_RANK/cache' \
    2> "$WORK/group.log" &
  group_pid=$!
  for ((k = 0; k < RANKS; k++)); do
    for _ in $(seq 300); do [ -s "$WORK/pid$k" ] && break; sleep 0.1; done
    [ -s "$WORK/pid$k" ] || die "rank $k did not start: $(tail -5 "$WORK/group.log")"
  done
  on_node 0 "$BIN/stagefs" --wait "$MNT" --wait-timeout 120 >/dev/null || die "not ready: $(tail -5 "$WORK/group.log")"
}

one_round() {  # $1 round, $2 variant, $3 limit MiB
  local r=$1 v=$2 k pids=() a=() b=() rss=() peak=() t0 t1 la
  start_group "$3"
  for ((k = 0; k < RANKS; k++)); do pids+=("$(cat "$WORK/pid$k")"); done
  la=$(loadavg | tr " " ",")
  for ((k = 0; k < RANKS; k++)); do a+=("$(ticks "${pids[$k]}")"); done
  sleep "$IDLE"  # the idle window being measured
  for ((k = 0; k < RANKS; k++)); do
    raw "$r,$v,$k,idle,$la,$(pct $(($(ticks "${pids[$k]}") - a[k])) "$IDLE"),$(mib "$(rss_kb "${pids[$k]}")"),,,"
    a[k]=$(ticks "${pids[$k]}")
    rss+=(0)
    echo 0 > "$CGROOT/rank$k/memory.max_usage_in_bytes"
  done
  la=$(loadavg | tr " " ",")
  t0=$(now)
  on_node 1 sh -c "cat '$MNT/img' > /dev/null" &
  local reader=$!
  while kill -0 "$reader" 2>/dev/null; do  # sampling while the transfer runs
    for ((k = 0; k < RANKS; k++)); do
      local m; m=$(rss_kb "${pids[$k]}"); [ "$m" -gt "${rss[$k]}" ] && rss[k]=$m
    done
    sleep 0.1
  done
  wait "$reader" || die "the read on node 1 failed: $(tail -5 "$WORK/group.log")"
  # The read may end before the copy is published everywhere (reads during the copy).
  for ((k = 0; k < RANKS; k++)); do
    for _ in $(seq 600); do [ "$(transfers "$k")" -ge 1 ] && break; sleep 0.1; done
  done
  t1=$(now)
  local secs; secs=$(elapsed "$t0" "$t1")
  for ((k = 0; k < RANKS; k++)); do
    b=$(ticks "${pids[$k]}")
    peak=$(cat "$CGROOT/rank$k/memory.max_usage_in_bytes")
    raw "$r,$v,$k,transfer,$la,$(pct $((b - a[k])) "$secs"),$(mib "${rss[$k]}"),$((peak >> 20)),$secs,$(cmp -s "$WORK/src/img" "$WORK/node$k/cache/data/img" && echo ok || echo DIFF)"
  done
  stop_group
}

raw_init "$NAME" "round,variant,rank,phase,load1,load5,load15,cpu_pct_core,rss_mib,cgroup_peak_mib,transfer_s,copy"
for ((r = 1; r <= RUNS; r++)); do
  one_round "$r" unlimited 0
  one_round "$r" "limit${LIMIT_MB}M" "$LIMIT_MB"
done

"$PY" - "$RAW" "$MD" "$SIZE_MB" "$RANKS" "$IDLE" "$LIMIT_MB" <<'EOF'
import csv, statistics, sys
raw, md, size, ranks, idle, limit = sys.argv[1:]
rows = [r for r in csv.DictReader(l for l in open(raw) if not l.startswith("#"))]
head = open(raw).readline().strip()
def med(xs):
    xs = [float(x) for x in xs if x not in ("", None)]
    return statistics.median(xs) if xs else float("nan")
out = ["## stagefs daemon: CPU and memory per node, idle and during a transfer", "",
       "`%s`  " % head.lstrip("# "),
       "`SIZE=%s MiB RANKS=%s (ranks as nodes, one machine) IDLE=%ss; medians over the rounds`" % (size, ranks, idle), "",
       "| variant | rank | idle CPU (% core) | idle RSS (MiB) | transfer CPU (% core) | transfer RSS max (MiB) | cgroup peak incl. page cache (MiB) | transfer (s) | copies |",
       "|---|---|---|---|---|---|---|---|---|"]
variants = sorted({r["variant"] for r in rows}, key=lambda v: (v != "unlimited", v))
times = {}
for v in variants:
    for k in range(int(ranks)):
        i = [r for r in rows if r["variant"] == v and r["rank"] == str(k) and r["phase"] == "idle"]
        t = [r for r in rows if r["variant"] == v and r["rank"] == str(k) and r["phase"] == "transfer"]
        times[v] = [float(r["transfer_s"]) for r in t]
        out.append("| %s | %d | %.1f | %.0f | %.1f | %.0f | %.0f | %.2f | %s |" % (
            v, k, med(r["cpu_pct_core"] for r in i), med(r["rss_mib"] for r in i),
            med(r["cpu_pct_core"] for r in t), med(r["rss_mib"] for r in t),
            med(r["cgroup_peak_mib"] for r in t), med(r["transfer_s"] for r in t),
            "ok" if all(r["copy"] == "ok" for r in t) else "DIFF"))
lim = [v for v in variants if v != "unlimited"]
if lim and times.get("unlimited"):
    per_round = [a / b for a, b in zip(times[lim[0]], times["unlimited"])]
    out += ["", "Transfer time %s / unlimited: ratio of medians %.2f, median of per-round ratios %.2f." % (
        lim[0], statistics.median(times[lim[0]]) / statistics.median(times["unlimited"]), statistics.median(per_round))]
out += ["", "rank 0 reads the source and feeds the chain; rank 1 is the node whose open asked; every rank "
        "writes its copy. RSS: the daemon process; cgroup peak: what a Slurm step's memory limit counts "
        "(RSS plus the page cache its buffered cache writes fill)."]
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
