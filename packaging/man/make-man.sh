#!/usr/bin/env bash
# make-man.sh COMMAND VERSION INCLUDE.h2m OUT.1
# Generates a command's man page from its --help with help2man (name, examples, exit status
# and the rest from INCLUDE.h2m), then checks that every option of --help made it into the
# page (check-options.sh): the build fails otherwise. Indented example lines in the --help
# description are kept as they are (help2man would fill them into one paragraph).
set -euo pipefail
cmd=$1 version=$2 include=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)
export LC_ALL=C
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
help2man --no-info --section=1 --version-string="$version" --include="$include" \
  --output="$tmp/raw.1" "$cmd"
# .IP blocks (indented lines of the --help text) become no-fill blocks
awk 'nf && /^\./ { print ".fi"; nf = 0 }
     { print }
     /^\.IP$/ { print ".nf"; nf = 1 }' "$tmp/raw.1" >"$tmp/page.1"
"$cmd" --help >"$tmp/help.txt"
"$here/check-options.sh" "$tmp/help.txt" "$tmp/page.1"
mv "$tmp/page.1" "$out"
