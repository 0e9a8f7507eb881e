#!/usr/bin/env bash
# Builds the checkpoint-reader fuzzer (tests/fuzz/fuzz_checkpoint_readers.cpp) with clang's libFuzzer, AddressSanitizer
# and UBSan, and runs it for a bounded time from the corpus in tests/fuzz/corpus/ (new inputs go to a temporary
# copy: the repository's corpus only changes by hand). Exit status: libFuzzer's (non-zero on a finding, whose
# input it writes to build-fuzz/).
#
#   scripts/fuzz.sh           # 60 seconds (what CI runs)
#   scripts/fuzz.sh 600       # longer
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
out="$root/build-fuzz"
mkdir -p "$out"
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/install-deps.sh installs clang)" >&2; exit 2; }
# Only the readers and what they need: core's dtype table and errors, nlohmann/json (header-only).
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root" \
  "$root/tests/fuzz/fuzz_checkpoint_readers.cpp" "$root/nn/safetensors_header.cpp" "$root/train/manifest.cpp" \
  "$root/core/dtype.cpp" "$root/core/error.cpp" -o "$out/fuzz_checkpoint_readers"
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp "$root"/tests/fuzz/corpus/* "$corpus/"
cd "$out"
./fuzz_checkpoint_readers -max_total_time="$seconds" -print_final_stats=1 "$corpus"
