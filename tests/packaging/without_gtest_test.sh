#!/usr/bin/env bash
# without_gtest_test.sh SOURCE_DIR
#
# A site installs stagefs without GoogleTest: configured with -DBUILD_TESTING=OFF and with
# GoogleTest made unfindable (CMAKE_DISABLE_FIND_PACKAGE_GTest), the project configures, has
# no test targets, and builds a command (stagectl, the quickest) that runs. The
# other commands build the same way; building them all again would double this test's time.
# Exit 0 pass, 1 fail.
set -uo pipefail
SRC=$1
WORK=$(mktemp -d /var/tmp/stagefs-nogtest.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail=0
if ! cmake -S "$SRC" -B "$WORK/build" -DBUILD_TESTING=OFF -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
     -DSTAGEFS_MAN=OFF >"$WORK/configure.log" 2>&1; then
  cat "$WORK/configure.log"; echo "FAIL: configure without GoogleTest"; exit 1
fi
echo "ok: configured without GoogleTest"
targets=$(cmake --build "$WORK/build" --target help)
for t in stagefs stage-bcast stagectl; do
  grep -qw "$t" <<<"$targets" || { echo "FAIL: no target $t"; fail=1; }
done
for t in unit_tests polite_wait; do
  grep -qw "$t" <<<"$targets" && { echo "FAIL: test target $t exists without tests"; fail=1; }
done
if ! cmake --build "$WORK/build" --target stagectl -j2 >"$WORK/build.log" 2>&1; then
  tail -n 30 "$WORK/build.log"; echo "FAIL: build stagectl"; exit 1
fi
"$WORK/build/tools/stagectl" --version || { echo "FAIL: stagectl --version"; fail=1; }
echo "ok: stagectl built without GoogleTest"
exit "$fail"
