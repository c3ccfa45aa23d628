#!/usr/bin/env bash
# check-fresh-clone.sh [--suite]
# The README's quick start on a pristine Debian 12: debootstrap --variant=minbase bookworm into a
# throwaway chroot, a fresh clone of this repository's HEAD (tracked files only) inside it, then
# `./demo.sh` three times in a row, which must install what it needs, build and pass each time.
# --suite also runs `tests/run-all.sh` there (the whole suite: about as long again as CI).
#
# A release check, run by hand before each release (not in CI: the chroot's package installs and
# its build add about as much time as the demo itself). Needs root, debootstrap, git and access to
# the Debian mirror. The chroot (under /var/tmp) and its mounts are removed at the end, also on
# failure.
set -euo pipefail
suite=0
case "${1:-}" in
  --suite) suite=1 ;;
  "") ;;
  -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--suite]" >&2; exit 2 ;;
esac
top=$(cd "$(dirname "$0")/.." && pwd)
for c in debootstrap git; do
  command -v "$c" >/dev/null || { echo "needs $c (packaging/install-deps.sh)" >&2; exit 2; }
done
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# A private mount namespace: every mount made below ends with this script.
if [[ -z ${FRESH_CHECK_IN_NS:-} ]]; then
  FRESH_CHECK_IN_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
root=$(mktemp -d /var/tmp/stagefs-fresh.XXXXXX)
chmod 0755 "$root"
cleanup() {
  # the demo's own mounts first (it unmounts them itself; this is for a killed run)
  awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
echo "== debootstrap bookworm (minbase) into $root"
debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
# The chroot's / must be a mount point, as on a real machine: the demo's `unshare -m
# --propagation private` changes the propagation of /.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount -t devpts -o newinstance devpts "$root/dev/pts" 2>/dev/null || true
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
echo "== a fresh clone of $(git -C "$top" rev-parse --short HEAD)"
git clone -q --no-hardlinks "$top" "$root/root/stagefs"
# minbase has no git, so the version reads "(git unknown)"; the tree is what was committed
in_root() {
  chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
for run in 1 2 3; do
  echo "== ./demo.sh, run $run of 3"
  in_root sh -c 'cd /root/stagefs && ./demo.sh' >"$root/demo$run.log" 2>&1 ||
    { tail -40 "$root/demo$run.log"; echo "check-fresh-clone: demo run $run FAILED" >&2; exit 1; }
  tail -1 "$root/demo$run.log"
done
if ((suite)); then
  echo "== tests/run-all.sh"
  in_root sh -c 'cd /root/stagefs && tests/run-all.sh' >"$root/suite.log" 2>&1 ||
    { tail -60 "$root/suite.log"; echo "check-fresh-clone: the suite FAILED" >&2; exit 1; }
  grep -E 'tests passed|tests failed' "$root/suite.log" | tail -5
fi
echo "== check-fresh-clone passed: the quick start works on a pristine Debian 12"
