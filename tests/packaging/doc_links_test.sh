#!/usr/bin/env bash
# doc_links_test.sh SOURCE_DIR BUILD_DIR
#
# The documentation's links work where it is read:
#   1. in the repository: every relative link of README.md, docs/*.md, the examples' and
#      bench's README resolves (file and #anchor);
#   2. installed: `cmake --install BUILD_DIR` into a scratch prefix; every relative link of every
#      page in share/doc/stagefs resolves there too (the installed tree's layout differs: the
#      examples are in examples/, bench/ is not installed), and no page points into the
#      repository's layout (packaging/).
# Exit 0 pass, 1 fail.
set -uo pipefail
SRC=$1 BUILD=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d /var/tmp/stagefs-doclinks.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail=0
echo "== the repository's pages"
python3 "$HERE/doc_links.py" "$SRC" README.md docs/user-guide.md docs/admin-guide.md docs/design.md \
  docs/faults.md packaging/examples/README.md bench/README.md || fail=1
echo "== the installed pages"
if ! cmake --install "$BUILD" --prefix "$WORK/usr" >"$WORK/install.log" 2>&1; then
  cat "$WORK/install.log"; echo "FAIL: cmake --install"; exit 1
fi
DOC=$WORK/usr/share/doc/stagefs
for page in README.md docs/user-guide.md docs/admin-guide.md docs/design.md docs/faults.md examples/README.md; do
  [[ -f $DOC/$page ]] || { echo "FAIL: $page is not installed"; fail=1; }
done
python3 "$HERE/doc_links.py" "$DOC" || fail=1
if grep -rn '](\(\.\./\)*packaging/' "$DOC" --include='*.md'; then
  echo "FAIL: installed pages link into the repository's layout (above)"; fail=1
fi
exit "$fail"
