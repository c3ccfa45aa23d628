#!/usr/bin/env bash
# The main job on the embedded default, on one machine: installs what is missing, builds, then
#   1. stage-bcast: a generated 256 MiB image staged onto 4 local ranks acting as 4 nodes,
#      then again (a no-op: every node already has it);
#   2. stagefs standalone (no launcher): a one-node cache-on-open filesystem;
#   3. stagefs on 4 local ranks acting as 4 nodes, each in its own mount namespace over its
#      own cache: one open on node 1 materializes the file on all four.
# Everything lives under $DEMO (default /var/tmp/stagefs-demo) and is unmounted at the end.
set -euo pipefail
top=$(cd "$(dirname "$0")" && pwd)
DEMO=${DEMO:-/var/tmp/stagefs-demo}
"$top/packaging/install-deps.sh"
"$top/packaging/build.sh"
B=$top/build/tools
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo
MPIRUN=(mpirun --oversubscribe -np 4)

cleanup() {
  for m in "$DEMO/mnt"; do mountpoint -q "$m" && fusermount3 -u "$m" 2>/dev/null || true; done
  [ -n "${group_pid:-}" ] && kill "$group_pid" 2>/dev/null && wait "$group_pid" 2>/dev/null || true
}
trap cleanup EXIT
rm -rf "$DEMO"; mkdir -p "$DEMO/shared" "$DEMO/mnt"
echo "== generating a 256 MiB image in $DEMO/shared"
head -c $((256 << 20)) /dev/urandom > "$DEMO/shared/pytorch.sqsh"

echo; echo "== 1. stage-bcast onto 4 ranks acting as 4 nodes (node%n = each rank's own /nvme)"
"${MPIRUN[@]}" "$B/stage-bcast" --ranks-as-nodes --source "$DEMO/shared/pytorch.sqsh" \
  --dest "$DEMO/node%n/nvme/pytorch.sqsh" --post-validate checksum
echo; echo "== again: every node has a current copy, nothing is read or sent"
"${MPIRUN[@]}" "$B/stage-bcast" --ranks-as-nodes --source "$DEMO/shared/pytorch.sqsh" \
  --dest "$DEMO/node%n/nvme/pytorch.sqsh"

echo; echo "== 2. stagefs standalone: $DEMO/mnt mirrors $DEMO/shared"
"$B/stagefs" "$DEMO/shared" "$DEMO/mnt" --cache "$DEMO/cache" 2> "$DEMO/standalone.log" &
group_pid=$!
"$B/stagefs" --wait "$DEMO/mnt"
ls -l "$DEMO/mnt"
echo "first open (materializes):"; time sha256sum "$DEMO/mnt/pytorch.sqsh"
echo "second open (served from the local copy):"; time sha256sum "$DEMO/mnt/pytorch.sqsh"
fusermount3 -u "$DEMO/mnt"; wait "$group_pid" || true; group_pid=
sed 's/^/  log: /' "$DEMO/standalone.log"

echo; echo "== 3. stagefs on 4 ranks acting as 4 nodes, one mount namespace each"
rm -rf "$DEMO"/node*/cache
"${MPIRUN[@]}" sh -c 'echo $$ > '"$DEMO"'/pid$OMPI_COMM_WORLD_RANK; exec unshare -m --propagation private '"$B"'/stagefs '"$DEMO/shared $DEMO/mnt"' --cache '"$DEMO"'/node$OMPI_COMM_WORLD_RANK/cache' \
  2> "$DEMO/group.log" &
group_pid=$!
for r in 0 1 2 3; do  # each rank records its pid as it starts (bounded wait)
  for _ in $(seq 100); do [ -s "$DEMO/pid$r" ] && break; sleep 0.1; done
done
on_node() { local k=$1; shift; nsenter -t "$(cat "$DEMO/pid$k")" -m "$@"; }
on_node 0 "$B/stagefs" --wait "$DEMO/mnt"
echo "node 1 opens the image:"; on_node 1 sha256sum "$DEMO/mnt/pytorch.sqsh"
echo "every node's cache now holds it:"
ls -l "$DEMO"/node*/cache/data/pytorch.sqsh
echo "node 3 reads it from its own copy:"; on_node 3 sha256sum "$DEMO/mnt/pytorch.sqsh"
echo "coordinator's counters:"; on_node 0 python3 -c "import os;print(os.getxattr('$DEMO/mnt','user.stagefs.stats').decode())"
echo "unmounting node 2 stops the whole group:"
on_node 2 fusermount3 -u "$DEMO/mnt"
wait "$group_pid" || true; group_pid=
grep -E "materialized|shutting down" "$DEMO/group.log" | sed 's/^/  log: /'
echo; echo "demo done (files in $DEMO)"
