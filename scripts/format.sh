#!/usr/bin/env bash
# Formats minidl's C++ (every tracked .h, .cpp, .cu and .cuh) with clang-format 14, Debian 12's, as .clang-format
# says; CI runs the check (.ci/run, stage docs).
#
#   scripts/format.sh            # rewrite the files that differ
#   scripts/format.sh --check    # change nothing; exit 1 naming each file that differs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

format=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z $format ]]; then
  echo "format: clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
  differ=()
  for f in "${files[@]}"; do
    "$format" --style=file --dry-run --Werror "$f" 2>/dev/null || differ+=("$f")
  done
  if ((${#differ[@]})); then
    printf 'format: not as .clang-format says: %s\n' "${differ[@]}" >&2
    echo "format: ${#differ[@]} of ${#files[@]} files differ; run scripts/format.sh" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files as .clang-format says"
else
  "$format" --style=file -i "${files[@]}"
fi
