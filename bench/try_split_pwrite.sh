#!/usr/bin/env bash
# try_split_pwrite.sh: would stage-bcast be faster if its writer made <= 1 MiB pwrites
# instead of one pwrite per 16 MiB chunk? Measured on the real binary, without changing
# product code, through an LD_PRELOAD shim (bench/split_pwrite.c) that splits large pwrites.
#
# Same setup as bench_stage_bcast.sh (SIZE_MB onto RANKS ranks-as-nodes on local disk, cold
# cache, destinations removed between runs), variants interleaved per round:
#   sb-16M          stage-bcast --chunk-size 16M as shipped
#   sb-16M-split1M  the same with LD_PRELOAD=split_pwrite.so (pwrite pieces of SPLIT_KIB)
#   cp              RANKS x cp + sync (the reference of the target)
# Metric: wall clock of the whole command; also CPU-seconds of all its processes (perf stat).
#
# Env: SIZE_MB (1024) RANKS (4) RUNS (5) CHUNK (16M) SPLIT_KIB (1024) WORK_ROOT BIN RESULTS
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
command -v perf >/dev/null || die "needs perf (linux-perf)"

SIZE_MB=${SIZE_MB:-1024}
RANKS=${RANKS:-4}
CHUNK=${CHUNK:-16M}
SPLIT_KIB=${SPLIT_KIB:-1024}
WORK=$WORK_ROOT/split
SRC=$WORK/src/image
NAME=try_split_pwrite

cleanup() { set +e; rm -rf "$WORK"/node*; [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

need_space $(( (SIZE_MB * (RANKS + 1) + 1023) / 1024 ))
mkdir -p "$WORK"
make_random_file "$SRC" "$SIZE_MB"
cc -O2 -shared -fPIC -o "$WORK/split_pwrite.so" "$BENCH_DIR/split_pwrite.c" -ldl

reset() {
  rm -rf "$WORK"/node*
  for ((k = 0; k < RANKS; k++)); do mkdir -p "$WORK/node$k"; done
  drop_caches
  sleep 1
}
measure() {  # VARIANT CMD...: RES "wall,cpu_s" of CMD under perf stat
  local v=$1 t0 t1 cpu
  shift
  t0=$(now)
  if ! perf stat -x, -o "$WORK/perf.stat" -e task-clock -- "$@" > /dev/null 2> "$WORK/err"; then
    log "$v failed: $(head -c 1000 "$WORK/err")"; return 1
  fi
  t1=$(now)
  cpu=$(awk -F, '$3 == "task-clock" { printf "%.3f", $1 / 1000 }' "$WORK/perf.stat")
  RES="$(elapsed "$t0" "$t1"),$cpu"
}
cp_n() { local k; for ((k = 0; k < $1; k++)); do cp "$SRC" "$WORK/node$k/img" & done; wait; sync; }
export -f cp_n
export SRC WORK

SB=(timeout -k 5 600 mpirun --oversubscribe -np "$RANKS")
ARGS=("$BIN/stage-bcast" --ranks-as-nodes --source "$SRC" --dest "$WORK/node%n/img" --chunk-size "$CHUNK" --json)
raw_init "$NAME" "round,variant,loadavg,wall,cpu_s"
run_variant() {  # on fresh destinations, after a drop of the page cache
  reset
  case $1 in
    cp) measure "$1" bash -c "cp_n $RANKS" ;;
    *-split*) measure "$1" "${SB[@]}" -x LD_PRELOAD="$WORK/split_pwrite.so" -x SPLIT_PWRITE_KIB="$SPLIT_KIB" "${ARGS[@]}" ;;
    *) measure "$1" "${SB[@]}" "${ARGS[@]}" ;;
  esac
}
rounds run_variant "," "sb-$CHUNK" "sb-$CHUNK-split${SPLIT_KIB}K" cp

"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric wall --cols cpu_s \
  --title "stage-bcast with its pwrites split to ${SPLIT_KIB} KiB (LD_PRELOAD shim) vs as shipped: $SIZE_MB MiB onto $RANKS ranks-as-nodes, cold cache" \
  --ratio "split/shipped=sb-$CHUNK-split${SPLIT_KIB}K/sb-$CHUNK" --ratio "shipped/cp=sb-$CHUNK/cp" \
  --ratio "split/cp=sb-$CHUNK-split${SPLIT_KIB}K/cp" \
  --note "The shim only changes how many bytes each pwrite() call of the writer carries; every byte, CRC and fsync is the same."
