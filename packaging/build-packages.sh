#!/usr/bin/env bash
# Release packages: configures a Release build without tests in BUILD_DIR (default
# build-release/), builds it and makes the .deb (and the .rpm where rpmbuild exists) in
# BUILD_DIR/packages. Extra arguments go to cmake. Install with
#   apt-get install ./build-release/packages/stagefs_*.deb
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build-release}
cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
(cd "$build" && cpack -B "$build/packages")
ls -l "$build"/packages/*.deb "$build"/packages/*.rpm 2>/dev/null || true
