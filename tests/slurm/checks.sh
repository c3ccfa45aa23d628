# Sourced by the Slurm tests: PASS/FAIL bookkeeping and the closing line CI reads.
# The sourcing script sets NAME before calling finish.
npass=0
nfail=0
pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
info() { echo "---- $*"; }
skip() { echo "SKIP: $*"; exit 77; }
# check DESC CMD... : PASS/FAIL on CMD's status
check() {
  local desc=$1; shift
  if "$@"; then pass "$desc"; else fail "$desc"; fi
}
# show a log file indented (bounded)
show() { sed -e 's/^/    | /' "$1" | head -n "${2:-40}"; }
# the closing line, and the exit status
finish() {
  echo "$NAME: $npass passed, $nfail failed"
  ((nfail == 0))
}
