#!/usr/bin/env bash
# Configures and builds minidl (Release, Ninja) into build/, from any working directory.
#
#   scripts/build.sh                        # cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
#   scripts/build.sh -DMINIDL_NATIVE=OFF    # extra arguments go to the cmake configure step
#   MINIDL_BUILD_DIR=build-asan scripts/build.sh -DMINIDL_SANITIZE=ON   # a second build tree
#   MINIDL_BUILD_TARGETS="train_gpt" scripts/build.sh   # only these targets (and what they need)
#   MINIDL_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=80;90" scripts/test.sh  # configure arguments for callers
#                                                                          # (split at spaces, before "$@")
#
# Safe to re-run: configuring an existing tree is quick and Ninja rebuilds only what changed.
# Uses all cores (nproc) unless CMAKE_BUILD_PARALLEL_LEVEL is set. Dependencies: scripts/install-deps.sh.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${MINIDL_BUILD_DIR:-build}"

# A tree configured with another generator cannot be switched to Ninja in place; say so instead of letting
# cmake fail with a less obvious message.
cache="$build_dir/CMakeCache.txt"
if [[ -f "$cache" ]] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$cache"; then
  echo "build: $root/$build_dir was configured with a generator other than Ninja;" \
       "remove it (rm -rf $build_dir) and re-run." >&2
  exit 1
fi

read -ra env_args <<<"${MINIDL_CMAKE_ARGS:-}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${env_args[@]}" "$@"
read -ra targets <<<"${MINIDL_BUILD_TARGETS:-}"
cmake --build "$build_dir" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" ${targets[@]:+--target "${targets[@]}"}
