#!/usr/bin/env bash
# Builds the libFuzzer target with clang (ASan+UBSan) and fuzzes the decoders of every message
# between ranks for FUZZ_SECONDS (default 10; longer by hand) from a seed corpus. Exit 77 without clang.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$top/build}/fuzz
command -v clang++ >/dev/null || { echo "clang++ not installed: skipped"; exit 77; }
mkdir -p "$out/corpus"
python3 "$top/tests/fuzz/make_corpus.py" "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I"$top" \
  "$top/tests/fuzz/fuzz_decode.cc" "$top/bcast/io/manifest.cc" "$top/bcast/io/chunk.cc" "$top/bcast/io/error.cc" "$top/fusefs/group/control.cc" \
  "$top/fusefs/profile/format.cc" "$top/bcast/io/crc.cc" -lisal \
  -o "$out/fuzz_decode"
"$out/fuzz_decode" -max_total_time="${FUZZ_SECONDS:-10}" -seed=1 -print_final_stats=1 "$out/corpus" 2>&1 | tail -15
