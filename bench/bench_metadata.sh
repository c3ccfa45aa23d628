#!/usr/bin/env bash
# bench_metadata.sh: `ls -l` of one directory of N entries through a standalone stagefs mount
# vs on the source directly, warm (target mount/source <= 1.5).
#
# How: WORK/src/big holds N empty files. One mount (empty cache; nothing is opened, so nothing
# is materialized). Both sides are listed once untimed (the kernel's dentries and inodes, and
# the daemon's node table, are then warm), then RUNS interleaved timed pairs of
# `ls -l --color=never DIR > /dev/null` (order alternates per round). For every entry ls
# asks lstat, getxattr(security.selinux) and getxattr(system.posix_acl_access): through the
# mount the getxattrs reach the daemon (no kernel cache answers them). The daemon's xattr
# counters (user.stagefs.stats, if it reports them) are logged after the runs.
#
# SOURCE_FS=ramfs puts the source on a ramfs (a filesystem without security.* or ACL xattrs,
# as NFS is for security.*): there getxattr answers EOPNOTSUPP, which ls remembers per device,
# on the source and through the mount alike.
#
# BIN2=DIR adds a variant "base": the same listing through a second mount run by DIR/stagefs
# (an older build), interleaved with the others.
#
# Env: N (100000) RUNS (5) BIN2 SOURCE_FS (the WORK_ROOT filesystem, or ramfs) WORK_ROOT BIN RESULTS KEEP=1
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

N=${N:-100000}
WORK=$WORK_ROOT/meta
SRC=$WORK/src
MNT=$WORK/mnt
CACHE=$WORK/cache
SOURCE_FS=${SOURCE_FS:-}
NAME=bench_metadata${SOURCE_FS:+_$SOURCE_FS}

MNT2=$WORK/mnt2
daemon_pid=
daemon2_pid=
cleanup() {
  set +e
  unmount_if "$MNT"
  unmount_if "$MNT2"
  [ -n "$daemon_pid" ] && kill_tree "$daemon_pid"
  [ -n "$daemon2_pid" ] && kill_tree "$daemon2_pid"
  [ -n "$SOURCE_FS" ] && umount "$SRC" 2>/dev/null
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_bin stagefs
mkdir -p "$SRC" "$MNT"
if [ -n "$SOURCE_FS" ]; then mount -t "$SOURCE_FS" none "$SRC" || die "cannot mount a $SOURCE_FS"; fi
mkdir -p "$SRC/big"
if [ "$(find "$SRC/big" -maxdepth 1 -type f | wc -l)" != "$N" ]; then
  log "creating $N files in $SRC/big"
  rm -rf "$SRC/big" && mkdir -p "$SRC/big"
  "$PY" -c 'import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n): open(os.path.join(d, f"f{i:06d}"), "w").close()' "$SRC/big" "$N"
fi

rm -rf "$CACHE"
LOGF=$WORK/daemon.log
"$BIN/stagefs" "$SRC" "$MNT" --cache "$CACHE" 2> "$LOGF" &
daemon_pid=$!
"$BIN/stagefs" --wait "$MNT" --wait-timeout 60 || die "mount not ready: $(cat "$LOGF")"
variants="mount source"
if [ -n "${BIN2:-}" ]; then
  mkdir -p "$MNT2"
  rm -rf "$CACHE.2"
  "$BIN2/stagefs" "$SRC" "$MNT2" --cache "$CACHE.2" 2> "$WORK/daemon2.log" &
  daemon2_pid=$!
  "$BIN2/stagefs" --wait "$MNT2" --wait-timeout 60 || die "base mount not ready: $(cat "$WORK/daemon2.log")"
  variants="mount source base"
fi

ls_time() {  # seconds of one `ls -l DIR`
  local t0 t1
  t0=$(now)
  LC_ALL=C ls -l --color=never "$1" > /dev/null
  t1=$(now)
  elapsed "$t0" "$t1"
}
dir_of() {
  case $1 in
    mount) echo "$MNT/big" ;;
    base) echo "$MNT2/big" ;;
    *) echo "$SRC/big" ;;
  esac
}

raw_init "$NAME" "round,variant,loadavg,secs"
for what in $variants; do ls_time "$(dir_of $what)" > /dev/null; done  # warm-up, untimed
ls_run() { RES=$(ls_time "$(dir_of "$1")"); }
# shellcheck disable=SC2086  # the variants are words
rounds --alternate ls_run "" $variants
stats=$(getfattr --only-values -n user.stagefs.stats "$MNT" 2>/dev/null || true)
log "daemon stats: $stats"

fusermount3 -u "$MNT" 2>/dev/null || true
wait "$daemon_pid" 2>/dev/null || true
daemon_pid=
if [ -n "$daemon2_pid" ]; then
  fusermount3 -u "$MNT2" 2>/dev/null || true
  wait "$daemon2_pid" 2>/dev/null || true
  daemon2_pid=
fi

"$PY" "$BENCH_DIR/summarize.py" "$RAW" "$MD" --metric secs \
  --title "metadata: ls -l of a directory of $N entries, warm, through a standalone mount vs the source (${SOURCE_FS:-$(df -PT "$WORK_ROOT" | awk 'NR==2 {print $2}')})" \
  --ratio "ls -l warm=mount/source" --target "ls -l warm<=1.5" \
  ${BIN2:+--ratio "base build=base/source" --ratio "this build vs base=mount/base"} \
  --note "Every entry costs lstat + getxattr(security.selinux) + getxattr(system.posix_acl_access); through the mount each getxattr is one FUSE round trip to the daemon."
