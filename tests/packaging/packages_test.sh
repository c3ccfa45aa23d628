#!/usr/bin/env bash
# packages_test.sh BUILD_DIR VERSION REVISION
#
# Builds the .deb and the .rpm from BUILD_DIR with CPack, installs the .deb into the running
# system with `apt-get install ./stagefs_*.deb`, uses what it installed, and purges it.
#
# Checks:
#   1. cpack makes stagefs_*.deb and stagefs-*.rpm
#   2. the .deb's Depends come from dpkg-shlibdeps (libfuse3-3, libopenmpi3, libisal2,
#      libspdlog) plus fuse3; it holds both commands, both man pages, the docs and examples,
#      and the admin kit (libexec/stagefs/slurm-prolog, slurm-epilog; /etc/stagefs/stagefs.conf
#      as a conffile)
#   3. the .rpm requires fuse3, fuse3-libs, openmpi, isa-l, spdlog, fmt and the sonames
#      (libfuse3.so.3, libmpi.so.40, libisal.so.2); it holds the commands, man pages and the
#      admin kit, the settings marked %config
#   4. apt-get install ./stagefs_*.deb succeeds; dpkg says installed
#   5. stagefs --version / stage-bcast --version (from /usr/bin, found on PATH) print
#      "<name> VERSION (git REVISION)": the revision this build was configured from
#   6. stage-bcast --help exits 0 and lists --source
#   7. man stagefs / man stage-bcast find the installed pages and show their options
#   8. a standalone mount with the installed stagefs (no launcher): a file read through the
#      mount equals the source, the cache holds the copy, fusermount3 -u ends the daemon with 0
#   9. apt-get purge removes it: not installed, none of its files left, every package that
#      was installed before still is, none that the install pulled in is
#
# The system is left as found even on failure or interruption: an EXIT trap purges the
# package (and any package the install pulled in), and the test runs in a private mount
# namespace of its own, so a mount it made dies with it. It will not touch a system where a
# stagefs package (or /usr/bin/stagefs, /usr/bin/stage-bcast) already exists: skipped (77).
# Also skipped: not root, no apt-get/dpkg/cpack. Concurrent runs are serialized by a lock.
set -uo pipefail
NAME=packaging
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../slurm/checks.sh
source "$HERE/../slurm/checks.sh"

(($# == 3)) || { echo "usage: $0 BUILD_DIR VERSION REVISION" >&2; exit 2; }
BUILD_DIR=$(cd "$1" && pwd) || exit 1
VERSION=$2 REVISION=$3

[[ $(id -u) == 0 ]] || skip "needs root (installs a package)"
for t in apt-get dpkg dpkg-deb cpack unshare flock; do
  command -v "$t" >/dev/null || skip "$t not installed"
done
# a private mount namespace: the standalone mount cannot outlive the test
if [[ -z ${PKGTEST_IN_NS:-} ]]; then
  PKGTEST_IN_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
exec 8>/run/lock/stagefs-packaging-test.lock
flock -w 300 8 || { echo "FAIL: another packaging test holds the lock"; exit 1; }

installed_state() { dpkg-query -W -f='${db:Status-Status}' stagefs 2>/dev/null; }
not_installed() { [[ $(installed_state) == "" || $(installed_state) == not-installed ]]; }
not_installed || skip "a stagefs package is already on this system ($(installed_state)): not touching it"
for f in /usr/bin/stagefs /usr/bin/stage-bcast; do
  [[ -e $f ]] && skip "$f exists (not from a package): not touching it"
done

APT=(apt-get -y -q -o DPkg::Lock::Timeout=120 --no-install-recommends)
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
package_set() { dpkg-query -W -f='${db:Status-Status} ${Package}\n' | awk '$1 == "installed" { print $2 }' | sort; }
BEFORE=$(package_set)
WORK=$(mktemp -d /var/tmp/stagefs-pkgtest.XXXXXX)
chmod 0755 "$WORK" # apt's _apt user reads the .deb from here
INSTALLED=0 DAEMON='' PULLED=()

# purge what this test installed: stagefs and the packages its install pulled in (from apt's
# own plan, not a before/after diff: other people may install packages meanwhile)
purge() { "${APT[@]}" purge stagefs "${PULLED[@]}" >"$WORK/purge.log" 2>&1; }
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $DAEMON ]] && kill -0 "$DAEMON" 2>/dev/null; then
    fusermount3 -u "$WORK/mnt" 2>/dev/null || umount -l "$WORK/mnt" 2>/dev/null
    kill "$DAEMON" 2>/dev/null
  fi
  if ((INSTALLED)) && ! not_installed; then
    echo "---- cleanup: purging the package"
    purge || { echo "warning: purge failed:"; show "$WORK/purge.log"; }
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS
# -- 1. packages
info "cpack (DEB, RPM) from $BUILD_DIR"
if ! (cd "$BUILD_DIR" && cpack -G "DEB;RPM" -B "$WORK/pkgs") >"$WORK/cpack.log" 2>&1; then
  fail "cpack makes the packages"; show "$WORK/cpack.log"; finish; exit 1
fi
debs=("$WORK"/pkgs/stagefs_*.deb) rpms=("$WORK"/pkgs/stagefs-*.rpm)
DEB=${debs[0]} RPM=${rpms[0]}
check "cpack made a .deb ($(basename "${DEB:-none}"))" test -s "$DEB"
check "cpack made an .rpm ($(basename "${RPM:-none}"))" test -s "$RPM"
echo "    cpack took $((SECONDS - t0))s"
[[ -s $DEB ]] || { finish; exit 1; }

# -- 2. .deb metadata and contents
depends=$(dpkg-deb -f "$DEB" Depends)
echo "    Depends: $depends"
has_all() { # has_all TEXT WORD...: every WORD is in TEXT
  local text=$1 w; shift
  for w in "$@"; do grep -qF -- "$w" <<<"$text" || { echo "    missing: $w"; return 1; }; done
}
check ".deb depends on fuse3 and the libraries dpkg-shlibdeps found" \
  has_all "$depends" "fuse3," libfuse3-3 libopenmpi3 libisal2 libspdlog "libc6 (>="
files=$(dpkg-deb -c "$DEB" | awk '{ print $6 }')
check ".deb holds the commands, man pages, docs and examples" has_all "$files" \
  ./usr/bin/stagefs ./usr/bin/stage-bcast ./usr/share/man/man1/stagefs.1 \
  ./usr/share/man/man1/stagefs-run.1 ./usr/share/man/man1/stage-bcast.1 ./usr/share/doc/stagefs/README.md \
  ./usr/share/doc/stagefs/docs/user-guide.md ./usr/share/doc/stagefs/docs/admin-guide.md \
  ./usr/share/doc/stagefs/docs/design.md ./usr/share/doc/stagefs/docs/faults.md \
  ./usr/share/doc/stagefs/examples/container.sbatch ./usr/share/doc/stagefs/examples/stage-image.sbatch \
  ./usr/share/doc/stagefs/examples/dataset.sbatch ./usr/share/doc/stagefs/examples/pyxis.sbatch
check ".deb holds the admin kit: the Slurm prolog and epilog, the site's settings (a conffile)" has_all \
  "$files $(dpkg-deb -I "$DEB" conffiles 2>/dev/null)" ./usr/libexec/stagefs/slurm-prolog \
  ./usr/libexec/stagefs/slurm-epilog ./usr/libexec/stagefs/kit.sh ./etc/stagefs/stagefs.conf \
  /etc/stagefs/stagefs.conf

# -- 3. .rpm metadata and contents
if [[ -s $RPM ]] && command -v rpm >/dev/null; then
  requires=$(rpm -qpR "$RPM" 2>/dev/null)
  echo "    Requires: $(grep -v '^rpmlib\|GLIBC\|GLIBCXX\|CXXABI\|GCC_' <<<"$requires" | paste -sd' ')"
  check ".rpm requires fuse3, fuse3-libs, openmpi, isa-l, spdlog, fmt and the library sonames" \
    has_all "$requires" fuse3 fuse3-libs openmpi isa-l spdlog fmt "libfuse3.so.3()(64bit)" \
    "libmpi.so.40()(64bit)" "libisal.so.2()(64bit)"
  check ".rpm holds the commands, man pages and the admin kit" has_all "$(rpm -qpl "$RPM" 2>/dev/null)" \
    /usr/bin/stagefs /usr/bin/stage-bcast /usr/share/man/man1/stagefs.1 /usr/share/man/man1/stage-bcast.1 \
    /usr/libexec/stagefs/slurm-prolog /usr/libexec/stagefs/slurm-epilog /etc/stagefs/stagefs.conf
  check ".rpm marks the site's settings as configuration" \
    test "$(rpm -qpc "$RPM" 2>/dev/null)" = /etc/stagefs/stagefs.conf
fi

# -- 4. install
info "apt-get install ./$(basename "$DEB")"
ti=$SECONDS
# what apt will install besides stagefs (nothing where the build dependencies are present)
mapfile -t PULLED < <(cd "$WORK/pkgs" && "${APT[@]}" -s install "./$(basename "$DEB")" 2>/dev/null |
  awk '$1 == "Inst" && $2 != "stagefs" { print $2 }')
((${#PULLED[@]} == 0)) || echo "    the install pulls in: ${PULLED[*]}"
INSTALLED=1 # from here on, cleanup purges
if (cd "$WORK/pkgs" && "${APT[@]}" install "./$(basename "$DEB")") >"$WORK/install.log" 2>&1; then
  pass "apt-get install ./$(basename "$DEB") succeeds ($((SECONDS - ti))s)"
else
  fail "apt-get install ./$(basename "$DEB")"; show "$WORK/install.log"; finish; exit 1
fi
check "dpkg says stagefs is installed" test "$(installed_state)" = installed
PKG_FILES=$(dpkg -L stagefs | while read -r f; do [[ -f $f ]] && echo "$f"; done)

# -- 5, 6. the installed commands
export PATH=/usr/sbin:/usr/bin:/sbin:/bin # the installed commands, not a build tree
check "stagefs on PATH is /usr/bin/stagefs" test "$(command -v stagefs)" = /usr/bin/stagefs
v1=$(stagefs --version 2>&1) v2=$(stage-bcast --version 2>&1)
echo "    $v1 / $v2"
check "stagefs --version prints \"stagefs $VERSION (git $REVISION)\"" \
  test "$v1" = "stagefs $VERSION (git $REVISION)"
check "stage-bcast --version prints \"stage-bcast $VERSION (git $REVISION)\"" \
  test "$v2" = "stage-bcast $VERSION (git $REVISION)"
help_ok() { stage-bcast --help >"$WORK/help.txt" 2>&1 && grep -q -- '--source' "$WORK/help.txt"; }
check "stage-bcast --help exits 0 and lists --source" help_ok

# -- 7. man
man_ok() { # man_ok NAME OPTION
  local page
  page=$(man -w "$1" 2>/dev/null)
  [[ $page == /usr/share/man/man1/$1.1* ]] || { echo "    man -w $1: '$page'"; return 1; }
  MANWIDTH=120 man -P cat "$1" >"$WORK/man-$1.txt" 2>&1 || { echo "    man $1 failed"; return 1; }
  grep -q -- "$2" "$WORK/man-$1.txt" && grep -q 'EXIT STATUS' "$WORK/man-$1.txt"
}
check "man stagefs shows the installed page (with --cache, EXIT STATUS)" man_ok stagefs --cache
check "man stage-bcast shows the installed page (with --source, EXIT STATUS)" man_ok stage-bcast --source

# -- 8. standalone mount with the installed binary
if [[ -c /dev/fuse ]] && command -v fusermount3 >/dev/null; then
  info "standalone mount: stagefs $WORK/src $WORK/mnt --cache $WORK/cache"
  mkdir -p "$WORK/src/sub" "$WORK/mnt"
  head -c $((5 << 20)) /dev/urandom >"$WORK/src/sub/blob.bin"
  want=$(sha256sum <"$WORK/src/sub/blob.bin")
  stagefs "$WORK/src" "$WORK/mnt" --cache "$WORK/cache" 2>"$WORK/stagefs.log" &
  DAEMON=$!
  if stagefs --wait "$WORK/mnt" --wait-timeout 20; then
    pass "the installed stagefs mounts standalone (stagefs --wait returns 0)"
    check "a file read through the mount equals the source" \
      test "$(sha256sum <"$WORK/mnt/sub/blob.bin")" = "$want"
    check "the cache holds the copy" test "$(sha256sum <"$WORK/cache/data/sub/blob.bin" 2>/dev/null)" = "$want"
    fusermount3 -u "$WORK/mnt"
  else
    fail "the installed stagefs mounts standalone"
  fi
  rc=0
  timeout 15 tail --pid="$DAEMON" -f /dev/null
  if kill -0 "$DAEMON" 2>/dev/null; then
    fail "stagefs exits within 15 s of fusermount3 -u"
  else
    wait "$DAEMON" || rc=$?
    check "stagefs exits 0 after fusermount3 -u" test "$rc" = 0
    DAEMON=
  fi
  ((nfail == 0)) || show "$WORK/stagefs.log"
else
  echo "SKIP: standalone mount (no /dev/fuse or fusermount3)"
fi

# -- 9. remove
info "apt-get purge stagefs"
tr=$SECONDS
if purge; then pass "apt-get purge stagefs succeeds ($((SECONDS - tr))s)"; else fail "apt-get purge stagefs"; show "$WORK/purge.log"; fi
check "dpkg says stagefs is not installed" not_installed
left() {
  local f n=0
  for f in $PKG_FILES; do [[ -e $f ]] && { echo "    left: $f"; n=$((n + 1)); }; done
  ((n == 0))
}
check "none of the package's $(wc -w <<<"$PKG_FILES") files is left" left
same_set() { # nothing the test installed is left, nothing that was there is gone
  local after
  after=$(package_set)
  [[ -z $(comm -23 <(echo "$BEFORE") <(echo "$after")) ]] || { echo "    gone: $(comm -23 <(echo "$BEFORE") <(echo "$after") | paste -sd' ')"; return 1; }
  [[ -z $(comm -12 <(printf '%s\n' stagefs "${PULLED[@]}" | sort) <(echo "$after")) ]] || { echo "    still installed"; return 1; }
}
check "installed packages: all that were there before, none of what the test installed" same_set
INSTALLED=0

echo "---- total time $((SECONDS - t0))s"
finish
