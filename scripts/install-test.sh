#!/usr/bin/env bash
# minidl as another project uses it: build the libraries (not the tests or programs), `cmake --install` them to a
# temporary prefix, then configure, build and run examples/consumer/ against that prefix; then move the prefix
# elsewhere and do it again (the package must hold no absolute path of its own). A package whose minidl::device is
# the emulated CUDA backend also trains on device "cuda"; one with the real backend also links a program to it.
#
#   scripts/install-test.sh                     # CPU-only build in build-install/ (-DMINIDL_ENABLE_CUDA=OFF ...)
#   MINIDL_BUILD_DIR=build scripts/install-test.sh   # install an already configured tree instead (its CUDA targets
#                                                     # too: the CI's test stage's build, with the emulated backend)
#   MINIDL_CMAKE_ARGS="-D..." scripts/install-test.sh   # extra configure arguments (split at spaces)
#
# Uses CMAKE_BUILD_PARALLEL_LEVEL jobs (default: nproc). Leaves nothing behind but the build tree.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

if [[ -n "${MINIDL_BUILD_DIR:-}" ]]; then
  build_dir="$MINIDL_BUILD_DIR"
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    echo "install-test: MINIDL_BUILD_DIR=$build_dir is not a configured build tree (no CMakeCache.txt)" >&2
    exit 2
  fi
else
  build_dir=build-install
  read -ra env_args <<<"${MINIDL_CMAKE_ARGS:-}"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINIDL_ENABLE_CUDA=OFF -DMINIDL_CUDA_EMULATOR=OFF \
    -DMINIDL_BUILD_TESTS=OFF -DMINIDL_BUILD_BENCH=OFF "${env_args[@]}"
fi
cmake --build "$build_dir" -j "$jobs" --target minidl_libraries

work="$(mktemp -d "${TMPDIR:-/tmp}/minidl-install-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log"
echo "install-test: installed $(grep -c '^-- Installing' "$work/install.log") files under $prefix"

# No path of this machine's build may be in the package: the prefix is about to move.
if grep -rlF -e "$root" -e "$prefix" "$prefix/lib/cmake/minidl"; then
  echo "install-test: the files above hold an absolute path ($root or $prefix)" >&2
  exit 1
fi

# A package whose minidl::device is the emulated CUDA backend (-DMINIDL_CUDA_EMULATION=ON) runs the consumer on
# device "cuda" too: that the backend, linked whole from its archive, registers itself in another project's program.
emulated=no
if grep -q '^add_library(minidl::cuda_backend_emu ' "$prefix/lib/cmake/minidl/minidlTargets.cmake"; then
  emulated=yes
fi

# consumer PREFIX NAME: configure, build and run examples/consumer against PREFIX (its own build tree, out of
# minidl's), 8 steps on the CPU whose loss must fall (the program checks), and 4 on the emulated device if any.
consumer() {
  local at="$1" name="$2" out="$work/consumer-$2"
  echo "install-test: examples/consumer against $at ($name)"
  cmake -S examples/consumer -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$at" >"$out.log" ||
    { cat "$out.log"; echo "install-test: configuring the consumer against $at failed" >&2; exit 1; }
  cmake --build "$out" -j "$jobs"
  OMP_NUM_THREADS=2 "$out/tiny_shakespeare" 8
  # The programs of docs/library.md build against the same prefix and run: the MLP, and ZeRO-3 on it in one process.
  cmake -S examples/library -B "$out-library" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$at" \
    >"$out-library.log" || { cat "$out-library.log"; echo "install-test: configuring examples/library failed" >&2; exit 1; }
  cmake --build "$out-library" -j "$jobs" --target example_mlp example_mlp_zero
  OMP_NUM_THREADS=2 "$out-library/example_mlp" | tail -1
  OMP_NUM_THREADS=2 "$out-library/example_mlp_zero" 3 | tail -1
  if [[ $emulated == yes ]]; then
    OMP_NUM_THREADS=2 "$out/tiny_shakespeare" 4 cuda
  fi
}
consumer "$prefix" installed

mv "$prefix" "$work/moved"
consumer "$work/moved" moved

# A package with the real CUDA backend: a program linking minidl::cuda_backend builds (its libraries, CUDA's
# runtime, cuDNN, NCCL, found again by the package) and starts (the backend registers itself; no GPU is touched).
if grep -q '^add_library(minidl::cuda_backend ' "$work/moved/lib/cmake/minidl/minidlTargets.cmake"; then
  echo "install-test: a program linking minidl::cuda_backend"
  mkdir -p "$work/cuda-link"
  cat >"$work/cuda-link/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(cuda_link LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(minidl CONFIG REQUIRED)
add_executable(cuda_link main.cpp)
target_link_libraries(cuda_link PRIVATE minidl::cuda_backend)
CMAKE
  printf '#include "core/tensor.h"\nint main() { return minidl::Tensor::zeros({2}).numel() == 2 ? 0 : 1; }\n' \
    >"$work/cuda-link/main.cpp"
  cmake -S "$work/cuda-link" -B "$work/cuda-link/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/moved" >/dev/null
  cmake --build "$work/cuda-link/build"
  "$work/cuda-link/build/cuda_link"
fi
echo "install-test: passed"
