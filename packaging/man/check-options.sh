#!/usr/bin/env bash
# check-options.sh HELP_TEXT MAN_PAGE
# Fails (exit 1, naming them) when an option listed in a command's --help output has no
# entry of its own in the man page: every option token of a --help option line ("-h,--help",
# "--cache TEXT", ...) must be in the tag of a .TP entry of the roff source. Run by the man
# page build step (so the build fails) and by the ctest packaging.man_options.
set -euo pipefail
help=$1 man=$2
[[ -s $help ]] || { echo "check-options: empty --help text: $help" >&2; exit 1; }
[[ -s $man ]] || { echo "check-options: empty man page: $man" >&2; exit 1; }

# the option tokens of --help: first word of each line that starts with blanks and a dash
help_opts=$(sed -nE 's/^[[:space:]]+(-[^[:space:]]*).*/\1/p' "$help" | tr ',' '\n' | grep -E '^-' | sort -u)
# the tags of the man page's .TP entries, font escapes removed, "\-" made "-"
man_opts=$(awk 'tag { print; tag = 0; next } /^\.TP/ { tag = 1 }' "$man" |
  sed -E 's/\\f[BIRP]//g; s/\\[,\/]//g; s/\\-/-/g' | awk '{ print $1 }' | tr ',' '\n' |
  grep -E '^-' | sort -u)
[[ -n $help_opts ]] || { echo "check-options: no options found in $help" >&2; exit 1; }
missing=$(comm -23 <(echo "$help_opts") <(echo "$man_opts"))
if [[ -n $missing ]]; then
  echo "check-options: in --help but not in $man: $(tr "\n" " " <<<"$missing")" >&2
  exit 1
fi
