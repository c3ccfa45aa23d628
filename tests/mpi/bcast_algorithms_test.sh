#!/usr/bin/env bash
# bcast_algorithms_test.sh STAGE_BCAST NP MPIRUN... - every --bcast-algorithm over real MPI.
# NP ranks acting as nodes, source rank NP-2 (not 0), a file of odd size with a hole in the
# middle (zero chunks skip the broadcast), 1 MiB chunks (the last one partial); each of chain,
# tree, mpi and auto, with the default segment and an odd one (7K): every copy equals the
# source. Exit 0 pass, 1 fail.
set -uo pipefail
SB=$1 NP=$2
shift 2
WORK=$(mktemp -d /var/tmp/stagefs-algos.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SRC=$WORK/src.img
head -c 3000001 /dev/urandom >"$SRC"
truncate -s $((3000001 + 3 * 1048576)) "$SRC"          # a 3 MiB hole
head -c 4194327 /dev/urandom >>"$SRC"
ROOT=$((NP >= 2 ? NP - 2 : 0))
fail=0
for algo in chain tree mpi auto; do
  for seg in "" 7K; do
    rm -rf "$WORK"/node*
    name="$algo${seg:+ segment $seg}"
    if ! timeout 120 "$@" -np "$NP" "$SB" --source "$SRC" --dest "$WORK/node%n/img" --ranks-as-nodes \
      --source-rank "$ROOT" --chunk-size 1M --bcast-algorithm "$algo" ${seg:+--bcast-segment "$seg"} \
      --stall-timeout 60 >"$WORK/out" 2>&1; then
      echo "FAIL: $name: stage-bcast failed:"; tail -n 5 "$WORK/out"; fail=1; continue
    fi
    for ((k = 0; k < NP; k++)); do
      cmp -s "$SRC" "$WORK/node$k/img" || { echo "FAIL: $name: node $k's copy differs"; fail=1; }
    done
    echo "ok: $name ($NP ranks, root $ROOT)"
  done
done
exit "$fail"
