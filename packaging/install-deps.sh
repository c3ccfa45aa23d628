#!/usr/bin/env bash
# Installs, from Debian 12's packages, whatever the build, the tests and the demo need and this
# machine lacks. Idempotent; needs root (or sudo).
set -euo pipefail
pkgs=(
  build-essential cmake pkg-config python3          # build
  libfuse3-dev fuse3                                 # the mount
  libopenmpi-dev openmpi-bin libpmix-dev             # MPI (pmix for srun --mpi=pmix)
  libisal-dev libspdlog-dev libcli11-dev libgtest-dev  # CRC, logs, options, tests
  nlohmann-json3-dev prometheus-cpp-dev              # status JSON, metrics exposition
  python3-prometheus-client                          # tests: parse the metrics file
  squashfs-tools squashfuse                          # tests: a real image consumer
  slurm-wlm munge                                    # tests: a real Slurm on simulated nodes
  iproute2 util-linux procps                         # tests: namespaces, nsenter, pgrep
  clang libclang-rt-14-dev                           # tests: libFuzzer and sanitizers
  help2man man-db rpm                                # man pages from --help; .rpm (rpmbuild); man
  charliecloud-runtime busybox-static attr           # tests: ch-run from /stage, a tiny image, getfattr
  acl                                                # tests: setfacl (POSIX ACLs on the source)
  gdb file                                           # tests: classify a core (tests/slurm/checks.sh ompi_init_crash)
  debootstrap                                        # packaging/check-clean-install.sh (manual)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
