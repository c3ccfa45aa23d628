#!/usr/bin/env bash
# profile_stage_bcast.sh: where stage-bcast's time goes (the analysis behind
# bench_stage_bcast.sh). Cold cache before every run; variants interleaved; RUNS rounds.
#
# For each variant: wall time and CPU time of every process it starts (perf stat follows
# children: task-clock = CPU-seconds summed over all threads and ranks), context switches and
# page faults. On a 2-vCPU box the CPU-seconds / 2 is a floor for the wall time.
#   sb-C          the real thing: mpirun -np RANKS stage-bcast, chunk C, dest on local disk
#   sb-C-shm      the same with dest in /dev/shm (tmpfs: no disk, fsync free): broadcast +
#                 CRC + page-cache copy only
#   sb-C-np1      one rank, one copy (no peer, the MPI broadcast to nobody): read + write + fsync
#   bcast-C       MPI_Bcast alone (bench/mpi_bcast_bw.c): SIZE_MB in chunks of C among RANKS
#                 ranks, pre-touched buffer, no files, no threads
#   cp            RANKS x cp + sync (as in bench_stage_bcast.sh)
#   cp-np1        one cp + sync
# Then one `perf record -g` of sb-16M (disk) with the top symbols, and of cp, as the profile.
# Then the writer alone (bench/writer_sim.c, one process, no MPI; results in
# profile_writer_sim.raw.csv and appended to the same .md): SIZE_MB in 16 MiB chunks, as
# Transfer::writer_loop + PosixTxn::write do it (crc64 of the chunk, one 16 MiB pwrite) against
# pwrite in 1 MiB / 2 MiB pieces, and crc+pwrite per 1 MiB piece; order rotated per round.
#
# Env: SIZE_MB (1024) RANKS (4) RUNS (3) CHUNKS ("1M 16M 64M") WRITER_RUNS (6)
#      SECTIONS ("stat record writer": which parts to run; "stat" rewrites the .md, the others
#      append to it) WORK_ROOT BIN RESULTS
set -euo pipefail
RUNS=${RUNS:-3}
. "$(dirname "$0")/lib.sh"
need_root
command -v perf >/dev/null || die "needs perf (linux-perf)"
command -v mpicc >/dev/null || die "needs mpicc (libopenmpi-dev)"

SIZE_MB=${SIZE_MB:-1024}
RANKS=${RANKS:-4}
CHUNKS=${CHUNKS:-"1M 16M 64M"}
SECTIONS=${SECTIONS:-"stat record writer"}
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
WORK=$WORK_ROOT/profile
SHM=/dev/shm/stagefs-bench-profile
SRC=$WORK/src/image
NAME=profile_stage_bcast

cleanup() {
  set +e
  rm -rf "$SHM" "$WORK"/node* "$WORK"/perf.*
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_space $(( (SIZE_MB * (RANKS + 1) + 1023) / 1024 ))
mkdir -p "$WORK"
make_random_file "$SRC" "$SIZE_MB"
mpicc -O2 -o "$WORK/mpi_bcast_bw" "$BENCH_DIR/mpi_bcast_bw.c"

kib() {  # 16M -> 16384
  local v=$1
  case $v in *K) echo "${v%K}" ;; *M) echo $(( ${v%M} * 1024 )) ;; *G) echo $(( ${v%G} * 1024 * 1024 )) ;; esac
}

reset() {
  rm -rf "$WORK"/node* "$SHM"
  for ((k = 0; k < RANKS; k++)); do mkdir -p "$WORK/node$k"; done
  drop_caches
  sleep 1
}

# measure VARIANT CMD...: runs CMD under perf stat, appends one raw line.
measure() {
  local v=$1; shift
  local la t0 t1 st
  la=$(loadavg)
  t0=$(now)
  if ! perf stat -x, -o "$WORK/perf.stat" -e task-clock,context-switches,page-faults -- "$@" > "$WORK/out" 2> "$WORK/err"; then
    log "$v failed: $(head -c 1000 "$WORK/err")"; raw "$r,$v,$la,,,,"; return 0
  fi
  t1=$(now)
  st=$("$PY" - "$WORK/perf.stat" <<'EOF'
import sys
vals = {}
for ln in open(sys.argv[1]):
    f = ln.strip().split(",")
    if len(f) > 2 and not ln.startswith("#"):
        try: vals[f[2]] = float(f[0])
        except ValueError: pass
print(f"{vals.get('task-clock', 0)/1000:.3f},{int(vals.get('context-switches', 0))},{int(vals.get('page-faults', 0))}")
EOF
)
  raw "$r,$v,$la,$(elapsed "$t0" "$t1"),$st"
}

sb() {  # np dest chunk: sets SB to the command line (perf stat needs a real program)
  SB=(timeout -k 5 600 mpirun --oversubscribe -np "$1" "$BIN/stage-bcast" --ranks-as-nodes --source "$SRC"
      --dest "$2/node%n/img" --chunk-size "$3" --json)
}
cp_n() {  # n
  local pids=() k
  for ((k = 0; k < $1; k++)); do cp "$SRC" "$WORK/node$k/img" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
  sync
}
export -f cp_n
export SRC WORK

if has stat; then
raw_init "$NAME" "round,variant,loadavg,wall,cpu_s,ctx_switches,page_faults"
for ((r = 1; r <= RUNS; r++)); do
  for c in $CHUNKS; do
    sb "$RANKS" "$WORK" "$c"; reset; measure "sb-$c" "${SB[@]}"
    sb "$RANKS" "$SHM" "$c"; reset; measure "sb-$c-shm" "${SB[@]}"
    sb 1 "$WORK" "$c"; reset; measure "sb-$c-np1" "${SB[@]}"
    reset; measure "bcast-$c" timeout 300 mpirun --oversubscribe -np "$RANKS" "$WORK/mpi_bcast_bw" "$SIZE_MB" "$(kib "$c")"
  done
  reset; measure cp bash -c "cp_n $RANKS"
  reset; measure cp-np1 bash -c "cp_n 1"
done

"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric wall --cols cpu_s,ctx_switches,page_faults \
  --title "where stage-bcast's time goes: $SIZE_MB MiB, $RANKS ranks-as-nodes, cold cache (cpu_s = CPU-seconds of all processes)" \
  --ratio "sb-16M/cp=sb-16M/cp" --ratio "sb-16M-shm/cp=sb-16M-shm/cp" --ratio "sb-16M-np1/cp-np1=sb-16M-np1/cp-np1" \
  --note "2 vCPUs: wall >= cpu_s / 2 whatever the overlap."
fi
MD=$RESULTS/$NAME.md

if has record; then
  profile() {  # title cmd...
    local title=$1; shift
    reset
    perf record -q -g -o "$WORK/perf.data" -- "$@" > /dev/null 2>&1 || true
    {
      echo "### perf profile: $title (self time, top 25; all processes of the run)"
      echo '```'
      perf report -i "$WORK/perf.data" --no-children --sort comm,dso,sym --stdio -g none 2>/dev/null |
        grep -E '^ +[0-9]' | head -25 || true   # head closes the pipe early: not a failure
      echo '```'
      echo
    } | tee -a "$MD"
  }
  sb "$RANKS" "$WORK" 16M
  profile "stage-bcast -np $RANKS, chunk 16M, disk" "${SB[@]}"
  profile "$RANKS x cp + sync" bash -c "cp_n $RANKS"
fi

# ---- the writer alone: does the size of one pwrite matter? -------------------------------
if has writer; then
WRITER_RUNS=${WRITER_RUNS:-6}
cc -O2 -o "$WORK/writer_sim" "$BENCH_DIR/writer_sim.c" -lisal || die "writer_sim needs libisal-dev"
raw_init profile_writer_sim "round,variant,loadavg,cpu_s,wall"
MD=$RESULTS/$NAME.md   # the table goes into profile_stage_bcast.md too
wv=("whole 16384" "split 1024" "split 2048" "blocks 1024")
for ((r = 1; r <= WRITER_RUNS; r++)); do
  for ((i = 0; i < ${#wv[@]}; i++)); do
    set -- ${wv[$(( (i + r) % ${#wv[@]} ))]}
    rm -f "$WORK/ws.out"; drop_caches; sleep 1
    la=$(loadavg)
    out=$("$WORK/writer_sim" "$1" "$WORK/ws.out" "$SIZE_MB" 16 "$2")
    cpu=$(sed -n 's/.* cpu=\([0-9.]*\) .*/\1/p' <<< "$out"); wall=$(sed -n 's/.* wall=\([0-9.]*\) .*/\1/p' <<< "$out")
    raw "$r,$1-$2K,$la,$cpu,$wall"
  done
done
rm -f "$WORK/ws.out"
"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --append --metric cpu_s --cols wall \
  --title "the writer alone (writer_sim.c): $SIZE_MB MiB in 16 MiB chunks, CPU-seconds by pwrite size" \
  --ratio "one 16M pwrite / 1M pwrites=whole-16384K/split-1024K" --ratio "crc+pwrite per 1M / 1M pwrites=blocks-1024K/split-1024K" \
  --note "whole = today's order (crc64 of the 16 MiB chunk, then ONE 16 MiB pwrite); split-N = crc64 of the chunk, then pwrite in N KiB pieces; blocks = crc64+pwrite per 1 MiB piece."
fi
