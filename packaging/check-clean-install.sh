#!/usr/bin/env bash
# check-clean-install.sh STAGEFS.deb
# Installs the .deb on a clean Debian 12 the way the README says, in a throwaway chroot:
# debootstrap --variant=minbase bookworm, then `apt-get install ./stagefs_*.deb` inside it
# (apt fetches the dependencies from deb.debian.org), then stagefs --version,
# stage-bcast --help and man stagefs there. Needs root, debootstrap and network access to the
# Debian mirror; takes a few minutes, so it is a manual check (not part of ctest). The chroot
# (under /var/tmp) is removed at the end, also on failure.
set -euo pipefail
deb=$(readlink -f "${1:?usage: $0 STAGEFS.deb}")
[[ -f $deb ]] || { echo "no such file: $1" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "needs debootstrap (packaging/install-deps.sh)" >&2; exit 2; }
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# a private mount namespace: the chroot's proc, dev and devpts mounts end with this script
if [[ -z ${CLEAN_CHECK_IN_NS:-} ]]; then
  CLEAN_CHECK_IN_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
root=$(mktemp -d /var/tmp/stagefs-clean.XXXXXX)
chmod 0755 "$root" # a system's root: apt's and man-db's unprivileged users walk it
cleanup() {
  for m in proc dev/pts dev sys; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
echo "== debootstrap bookworm (minbase) into $root"
debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount -t devpts -o newinstance devpts "$root/dev/pts" 2>/dev/null || true
cp "$deb" "$root/tmp/"
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
echo "== apt-get install ./$(basename "$deb") (and man-db, to read the page)"
in_root apt-get update -qq
in_root sh -c "cd /tmp && apt-get install -y -q ./$(basename "$deb") man-db" | tail -3
echo "== in the clean system"
in_root stagefs --version
in_root stage-bcast --version
in_root stage-bcast --help | head -3
in_root sh -c 'MANWIDTH=80 man -P cat stagefs | head -8'
echo "== dependencies apt installed for it"
# shellcheck disable=SC2016  # dpkg-query's own format
in_root dpkg-query -W -f='${Package} ${Version}\n' libfuse3-3 fuse3 libopenmpi3 libisal2 libspdlog1.10 libfmt9
in_root apt-get purge -y -q stagefs | tail -1
in_root sh -c '! command -v stagefs' && echo "== purged: stagefs gone; clean install check passed"
