#!/usr/bin/env bash
# The main job on the embedded default, on one machine: installs what is missing, builds, then
#   1. stage-bcast: a generated 256 MiB image staged onto 4 local ranks acting as 4 nodes,
#      then again (a no-op: every node already has it);
#   2. stagefs standalone (no launcher): a one-node cache-on-open filesystem;
#   3. stagefs on 4 local ranks acting as 4 nodes, each in its own mount namespace over its
#      own cache: one open on node 1 materializes the file on all four.
# Every step checks what it shows (the copies' checksums against the source) and the script
# exits non-zero if one does not hold; the last line says "demo passed". Everything lives under
# $DEMO (default /var/tmp/stagefs-demo) and is unmounted at the end, also on failure.
set -euo pipefail
top=$(cd "$(dirname "$0")" && pwd)
DEMO=${DEMO:-/var/tmp/stagefs-demo}
"$top/packaging/install-deps.sh"
"$top/packaging/build.sh"
B=$top/build/tools
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo
MPIRUN=(mpirun --oversubscribe -np 4)

cleanup() {
  mountpoint -q "$DEMO/mnt" && { fusermount3 -u "$DEMO/mnt" 2>/dev/null || umount -l "$DEMO/mnt"; }
  [ -n "${group_pid:-}" ] && kill "$group_pid" 2>/dev/null && wait "$group_pid" 2>/dev/null
  return 0
}
fail() { echo "demo FAILED: $*" >&2; exit 1; }
trap cleanup EXIT
cleanup  # a mount left by an earlier run that was killed
rm -rf --one-file-system "$DEMO"; mkdir -p "$DEMO/shared" "$DEMO/mnt"
echo "== generating a 256 MiB image in $DEMO/shared"
head -c $((256 << 20)) /dev/urandom > "$DEMO/shared/pytorch.sqsh"
want=$(sha256sum < "$DEMO/shared/pytorch.sqsh")
# same_as_source FILE...: every file has the source's bytes
same_as_source() {
  local f
  for f; do [ "$(sha256sum < "$f")" = "$want" ] || fail "$f differs from the source"; done
  echo "  $# cop$( (($# == 1)) && echo y || echo ies) checked: the same bytes as the source"
}

echo; echo "== 1. stage-bcast onto 4 ranks acting as 4 nodes (node%n = each rank's own /nvme)"
"${MPIRUN[@]}" "$B/stage-bcast" --ranks-as-nodes --source "$DEMO/shared/pytorch.sqsh" \
  --dest "$DEMO/node%n/nvme/pytorch.sqsh" --post-validate checksum
same_as_source "$DEMO"/node{0,1,2,3}/nvme/pytorch.sqsh
echo; echo "== again: every node has a current copy, nothing is read or sent"
"${MPIRUN[@]}" "$B/stage-bcast" --ranks-as-nodes --source "$DEMO/shared/pytorch.sqsh" \
  --dest "$DEMO/node%n/nvme/pytorch.sqsh"

echo; echo "== 2. stagefs standalone: $DEMO/mnt mirrors $DEMO/shared"
"$B/stagefs" "$DEMO/shared" "$DEMO/mnt" --cache "$DEMO/cache" 2> "$DEMO/standalone.log" &
group_pid=$!
"$B/stagefs" --wait "$DEMO/mnt"
ls -l "$DEMO/mnt"
echo "first open (materializes):"; time same_as_source "$DEMO/mnt/pytorch.sqsh"
echo "second open (served from the local copy):"; time same_as_source "$DEMO/mnt/pytorch.sqsh"
fusermount3 -u "$DEMO/mnt"; wait "$group_pid" || true; group_pid=
sed 's/^/  log: /' "$DEMO/standalone.log"

echo; echo "== 3. stagefs on 4 ranks acting as 4 nodes, one mount namespace each"
rm -rf "$DEMO"/node*/cache
"${MPIRUN[@]}" sh -c 'echo $$ > '"$DEMO"'/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private '"$B"'/stagefs '"$DEMO/shared $DEMO/mnt"' --cache '"$DEMO"'/node$OMPI_COMM_WORLD_RANK/cache' \
  2> "$DEMO/group.log" &
group_pid=$!
for r in 0 1 2 3; do  # each rank records its pid as it starts (at most 2 minutes)
  for _ in $(seq 1200); do [ -s "$DEMO/pid$r" ] && break; kill -0 "$group_pid" 2>/dev/null || break; sleep 0.1; done
  [ -s "$DEMO/pid$r" ] || { cat "$DEMO/group.log" >&2; fail "rank $r did not start"; }
done
# -r -w: the rank's root and working directory (setns alone would leave a chroot)
on_node() { local k=$1; shift; nsenter -t "$(cat "$DEMO/pid$k")" -m -r -w "$@"; }
on_node 0 "$B/stagefs" --wait "$DEMO/mnt" || { cat "$DEMO/group.log" >&2; fail "the group did not mount"; }
echo "node 1 opens the image (its reads may start before the copy ends):"
on_node 1 sh -c "sha256sum < '$DEMO/mnt/pytorch.sqsh'" | grep -qxF "$want" || fail "node 1 read other bytes"
echo "  node 1 read the source's bytes"
# The open returned as soon as the transfer ran; `stagectl prefetch` returns once a node's copy
# is complete and verified (at once where it already is).
echo "every node's copy is complete once stagectl prefetch returns there:"
for k in 0 1 2 3; do on_node $k "$B/stagectl" prefetch "$DEMO/mnt" pytorch.sqsh >/dev/null || fail "prefetch on node $k"; done
ls -l "$DEMO"/node*/cache/data/pytorch.sqsh
same_as_source "$DEMO"/node{0,1,2,3}/cache/data/pytorch.sqsh
echo "node 3 reads it from its own copy:"; on_node 3 sh -c "sha256sum < '$DEMO/mnt/pytorch.sqsh'" | grep -qxF "$want" || fail "node 3 read other bytes"
echo "  node 3 read the source's bytes"
echo "node 0's counters (stagectl stats):"; on_node 0 "$B/stagectl" stats "$DEMO/mnt" | sed 's/^/  /'
echo "unmounting node 2 stops the whole group:"
on_node 2 fusermount3 -u "$DEMO/mnt"
wait "$group_pid" || true; group_pid=
grep -E "materialized|shutting down" "$DEMO/group.log" | sed 's/^/  log: /'
n=$(grep -c "materialized pytorch.sqsh" "$DEMO/group.log" || true)
[ "$n" = 4 ] || fail "expected one materialization on each of 4 nodes, the log has $n"
echo; echo "demo passed: one broadcast put the image on 4 nodes (files in $DEMO)"
