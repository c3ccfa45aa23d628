#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is missing, builds
# (warnings are errors), and runs every ctest label: unit, mpi, mount, slurm.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/packaging/install-deps.sh"
"$top/packaging/build.sh"
cd "$top/build"
export OMPI_MCA_btl_tcp_if_include=lo
ctest --output-on-failure -L unit -j2
ctest --output-on-failure -LE unit
