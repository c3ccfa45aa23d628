#!/usr/bin/env bash
# chunk_size_follows_source_test.sh STAGE_BCAST MPIRUN... - ranks started with different
# --chunk-size values all follow the source rank's (it travels in the manifest), and with
# different --bcast-segment values too (the source rank's is broadcast before the transfer).
# Three ranks acting as nodes from one MPMD command line: rank 0 with --chunk-size 4M, ranks 1
# and 2 with 16M; each of chain and mpi, with rank 0 and then rank 2 as the source: the copy
# succeeds, every node's copy equals the source, and the report counts the source rank's chunks.
# Exit 0 pass, 1 fail.
set -uo pipefail
SB=$1
shift
WORK=$(mktemp -d /var/tmp/stagefs-chunkfollow.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SRC=$WORK/src.img
SIZE=$((20 * 1048576 + 12345))
head -c "$SIZE" /dev/urandom >"$SRC"
fail=0
for algo in chain mpi; do
  for root in 0 2; do
    rm -rf "$WORK"/node*
    common=(--source "$SRC" --dest "$WORK/node%n/img" --ranks-as-nodes --source-rank "$root"
            --bcast-algorithm "$algo" --stall-timeout 60 --json)
    name="$algo, source rank $root"
    if ! timeout 120 "$@" -np 1 "$SB" "${common[@]}" --chunk-size 4M : -np 2 "$SB" "${common[@]}" --chunk-size 16M \
      >"$WORK/out" 2>"$WORK/err"; then
      echo "FAIL: $name: stage-bcast failed:"; tail -n 5 "$WORK/err"; fail=1; continue
    fi
    for k in 0 1 2; do
      cmp -s "$SRC" "$WORK/node$k/img" || { echo "FAIL: $name: node $k's copy differs"; fail=1; }
    done
    chunk=$((root == 0 ? 4 * 1048576 : 16 * 1048576))
    want=$(((SIZE + chunk - 1) / chunk))
    got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["chunks"])' "$WORK/out" 2>/dev/null)
    [ "$got" = "$want" ] || { echo "FAIL: $name: $got chunks, want $want (the source rank's chunk size)"; fail=1; }
    echo "ok: $name"
  done
done
# --bcast-segment the same way: rank 0 with 1M, ranks 1 and 2 with 64K; a chain's receivers post
# receives of the sender's message size, so every rank must use the source rank's.
for root in 0 2; do
  rm -rf "$WORK"/node*
  common=(--source "$SRC" --dest "$WORK/node%n/img" --ranks-as-nodes --source-rank "$root"
          --bcast-algorithm chain --stall-timeout 60 --json)
  name="--bcast-segment, source rank $root"
  if ! timeout 120 "$@" -np 1 "$SB" "${common[@]}" --bcast-segment 1M : -np 2 "$SB" "${common[@]}" \
    --bcast-segment 64K >"$WORK/out" 2>"$WORK/err"; then
    echo "FAIL: $name: stage-bcast failed:"; tail -n 5 "$WORK/err"; fail=1; continue
  fi
  for k in 0 1 2; do
    cmp -s "$SRC" "$WORK/node$k/img" || { echo "FAIL: $name: node $k's copy differs"; fail=1; }
  done
  echo "ok: $name"
done
exit "$fail"
