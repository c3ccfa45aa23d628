#!/usr/bin/env bash
# man_options_test.sh CHECKER MAN_DIR COMMAND...
# For every command: its man page MAN_DIR/<name>.1 exists, and every option its --help lists
# has an entry there (packaging/man/check-options.sh, the check the build also runs). Then a
# negative control: the same page against a --help with one more option must fail the check,
# so a checker that passes everything cannot pass this test.
set -uo pipefail
checker=$1 mandir=$2
shift 2
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for cmd in "$@"; do
  name=$(basename "$cmd") page=$mandir/$(basename "$cmd").1
  if [[ ! -s $page ]]; then echo "FAIL: $name: no man page $page"; fails=$((fails + 1)); continue; fi
  "$cmd" --help >"$tmp/$name.help" || { echo "FAIL: $name --help exits $?"; fails=$((fails + 1)); continue; }
  n=$(grep -cE '^[[:space:]]+-' "$tmp/$name.help")
  if "$checker" "$tmp/$name.help" "$page"; then
    echo "PASS: $name: all $n option lines of --help have an entry in $(basename "$page")"
  else
    echo "FAIL: $name: an option of --help is missing from $page"; fails=$((fails + 1))
  fi
  { cat "$tmp/$name.help"; echo "  --not-in-the-man-page TEXT   a new option"; } >"$tmp/$name.more"
  if "$checker" "$tmp/$name.more" "$page" 2>"$tmp/$name.err"; then
    echo "FAIL: $name: the check passes a --help with an option the page lacks"; fails=$((fails + 1))
  elif grep -q -- '--not-in-the-man-page' "$tmp/$name.err"; then
    echo "PASS: $name: the check fails for an option the page lacks, and names it"
  else
    echo "FAIL: $name: the check fails without naming the missing option"; fails=$((fails + 1))
  fi
done
echo "man_options: $fails failed"
((fails == 0))
