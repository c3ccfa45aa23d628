#!/usr/bin/env bash
# bench_stage_bcast.sh: how fast stage-bcast stages one file onto 4 "nodes" of one machine,
# compared with what the same machine does without it.
#
# What it measures (cold page cache before every run, destinations removed between runs so
# every run really copies; variants interleaved A B C ... A B C ...):
#   sb-<CHUNK>  mpirun --oversubscribe -np RANKS stage-bcast --ranks-as-nodes --source SRC
#               --dest WORK/node%n/img --chunk-size CHUNK --json   (stage-bcast fsyncs each copy)
#               wall = mpirun start to end (includes MPI start-up/teardown);
#               total/copy = the tool's own report (starts after MPI_Init).
#   cp          RANKS parallel `cp SRC WORK/nodeK/img`, then `sync`: start to end of sync.
#   dd          the disk's own write speed for the same bytes: RANKS parallel
#               `dd if=/dev/zero of=WORK/ddK bs=16M count=SIZE_MB/16 conv=fdatasync`
#               (buffered writes + fdatasync, the same write path stage-bcast and cp use).
#   mpi-true    `mpirun -np RANKS true`: the launcher's own cost, to read the wall times.
#   sb-<CHUNK>@2  with BIN2 set: the same with $BIN2/stage-bcast (A/B of two builds, interleaved)
# Targets: stage-bcast/cp <= 1.0 and stage-bcast/dd <= 1.3 (default chunk 16M).
#
# Env: SIZE_MB (1024) RANKS (4) RUNS (5) CHUNKS ("4M 16M 64M") TIMEOUT (600) BIN2 WORK_ROOT BIN
#      RESULTS KEEP=1
# Output: table on stdout, bench/results/bench_stage_bcast.md, raw runs in .raw.csv.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

SIZE_MB=${SIZE_MB:-1024}
RANKS=${RANKS:-4}
CHUNKS=${CHUNKS:-"4M 16M 64M"}
TIMEOUT=${TIMEOUT:-600}   # seconds one stage-bcast run may take
WORK=$WORK_ROOT/bcast
SRC=$WORK/src/image
NAME=bench_stage_bcast

mpirun_pid=
cleanup() {
  set +e
  [ -n "$mpirun_pid" ] && kill_tree "$mpirun_pid"
  jobs -p | while read -r p; do kill "$p" 2>/dev/null; done
  rm -rf "$WORK"/node* "$WORK"/dd*
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

BIN2=${BIN2:-}
need_bin stage-bcast
need_space $(( (SIZE_MB * (2 * RANKS + 1) + 1023) / 1024 ))
mkdir -p "$WORK"
make_random_file "$SRC" "$SIZE_MB"

reset_dests() {
  rm -rf "$WORK"/node* "$WORK"/dd*
  for ((k = 0; k < RANKS; k++)); do mkdir -p "$WORK/node$k"; done
  drop_caches
  sleep 1   # let the discard of the freed blocks and the drop settle
}

run_sb() {  # $1 chunk [$2 bin dir]
  local out t0 t1 bin=${2:-$BIN}
  t0=$(now)
  out=$(timeout -k 5 "$TIMEOUT" mpirun --oversubscribe -np "$RANKS" "$bin/stage-bcast" --ranks-as-nodes \
        --source "$SRC" --dest "$WORK/node%n/img" --chunk-size "$1" --json 2>"$WORK/sb.err") || {
    log "stage-bcast failed: $(head -c 2000 "$WORK/sb.err")"; return 1; }
  t1=$(now)
  "$PY" - "$out" <<'EOF' >/dev/null || return 1
import json, sys
r = json.loads(sys.argv[1])
assert r["ok"] and r["nodes_written"] >= 1, r
EOF
  local total copy
  total=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"]["total"])' "$out")
  copy=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"]["copy"])' "$out")
  RES="$(elapsed "$t0" "$t1"),$total,$copy"
}

run_cp() {
  local t0 t1 pids=()
  t0=$(now)
  for ((k = 0; k < RANKS; k++)); do cp "$SRC" "$WORK/node$k/img" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
  sync
  t1=$(now)
  local w; w=$(elapsed "$t0" "$t1"); RES="$w,$w,"
}

run_dd() {
  local t0 t1 pids=()
  t0=$(now)
  for ((k = 0; k < RANKS; k++)); do
    dd if=/dev/zero of="$WORK/dd$k" bs=16M count=$((SIZE_MB / 16)) conv=fdatasync status=none & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  t1=$(now)
  local w; w=$(elapsed "$t0" "$t1"); RES="$w,$w,"
}

run_mpi_true() {
  local t0 t1
  t0=$(now)
  timeout -k 5 60 mpirun --oversubscribe -np "$RANKS" true
  t1=$(now)
  local w; w=$(elapsed "$t0" "$t1"); RES="$w,$w,"
}

variants=()
for c in $CHUNKS; do variants+=("sb-$c"); [ -n "$BIN2" ] && variants+=("sb-$c@2"); done
variants+=(cp dd mpi-true)

# One run of a variant on fresh destinations, after a drop of the page cache.
run_variant() {
  reset_dests
  case $1 in
    sb-*) # Open MPI 4.1 start-up sometimes fails under concurrent jobs (PMIx
          # "Unreachable"): retry once on a fresh destination, note it in the raw log
          c=${1#sb-}; b=$BIN; [[ $c == *@2 ]] && { c=${c%@2}; b=$BIN2; }
          run_sb "$c" "$b" || { log "retrying $1"; reset_dests; LA="$(loadavg) retry"; run_sb "$c" "$b"; } ;;
    cp) run_cp ;;
    dd) run_dd ;;
    mpi-true) run_mpi_true ;;
  esac
}

raw_init "$NAME" "round,variant,loadavg,wall,total,copy"
rounds run_variant ",," "${variants[@]}"
rm -rf "$WORK"/node* "$WORK"/dd*

ratios=() targets=()
for c in $CHUNKS; do
  ratios+=(--ratio "sb-$c/cp=sb-$c/cp" --ratio "sb-$c/dd=sb-$c/dd")
  targets+=(--target "sb-$c/cp<=1.0" --target "sb-$c/dd<=1.3")
  if [ -n "$BIN2" ]; then
    ratios+=(--ratio "sb-$c@2/cp=sb-$c@2/cp" --ratio "sb-$c@2/dd=sb-$c@2/dd" --ratio "sb-$c@2/sb-$c=sb-$c@2/sb-$c")
    targets+=(--target "sb-$c@2/cp<=1.0" --target "sb-$c@2/dd<=1.3")
  fi
done
bins="BIN=$BIN"; [ -n "$BIN2" ] && bins="$bins; @2 = BIN2=$BIN2"
GiB=$("$PY" -c "print(f'{$SIZE_MB*$RANKS/1024:g}')")
"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric wall --cols total,copy \
  --title "stage-bcast vs cp+sync vs dd: $SIZE_MB MiB onto $RANKS ranks-as-nodes ($GiB GiB written), cold cache; metric = wall clock incl. mpirun" \
  "${ratios[@]}" "${targets[@]}" \
  --note "dd = $RANKS x \`dd if=/dev/zero bs=16M conv=fdatasync\` (buffered + fdatasync). cp = $RANKS parallel cp + sync. mpi-true = \`mpirun -np $RANKS true\` (launcher overhead contained in every sb wall time). Binaries: $bins."
"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --append --metric total --cols copy \
  --title "the same runs, metric = stage-bcast's own 'Total time' (after MPI_Init; cp/dd: wall)" \
  "${ratios[@]}" "${targets[@]}" --only "$(IFS=,; echo "${variants[*]}" | sed 's/,mpi-true//')"
