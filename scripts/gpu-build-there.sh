#!/usr/bin/env bash
# Builds the GPU targets on the GPU node itself, from the copied source tree, then runs the same check
# (scripts/gpu-run.sh --require-gpu). For a node where the bundle's prebuilt programs do not run: the probe or the
# load step says so in the first seconds of gpu-node.sh's run (docs/cuda.md, "The second call").
#
#   bash scripts/gpu-build-there.sh "$OUT"                                   # bundle at build-bundle/minidl-gpu.tar.xz
#   bash scripts/gpu-build-there.sh "$OUT" path/to/minidl-gpu.tar.xz [--only kernels ...]
#
# What it uses: the node's nvcc, CMake (3.25 or newer), ninja and C++ compiler, all its cores, for the node's own
# GPU architecture (CMAKE_CUDA_ARCHITECTURES=native; MINIDL_THERE_ARCHS overrides it). What the node lacks comes from
# the bundle: its devkit/ (the headers and CMake packages of CLI11, nlohmann_json, Highway, GoogleTest, PCRE2,
# Open MPI and OpenBLAS, link-time names for the bundle's own libraries in lib/, stand-ins for Open MPI's compiler
# wrappers), and cuDNN and NCCL from the toolkit or the nvidia-* wheels of a Python's site-packages. The build goes
# to build-there/ (kept between calls on a warm node: a second call only relinks what changed), then the built
# programs and tests are staged beside the bundle's scripts, data and libraries (less libstdc++, libgcc_s and
# libgomp: the node's own compiler's are the ones its binaries need) and checked under the time this call has left
# (540 s in all; MINIDL_THERE_BUDGET).
#
# It refuses at once, saying why, where it cannot work: a tool missing, or a glibc older than the one the bundle's
# libraries were built against (the manifest's "glibc:" line), since those libraries would not load either.
#
# Exit status: gpu-run.sh's (0 PASS, 1 FAIL, 3 NO GPU, 4 BROKEN ENVIRONMENT, 5 CUT OFF); 2 on bad usage; 6 when the
# node cannot build (a tool missing, glibc too old, the configuration or the build failed: build-there.log says why).
set -uo pipefail

usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
(( $# >= 1 )) || { echo "gpu-build-there: expected OUTDIR (gpu-build-there.sh --help)" >&2; exit 2; }
outdir="$1"
shift
bundle_tar="build-bundle/minidl-gpu.tar.xz"
if (( $# )) && [[ $1 != -* ]]; then bundle_tar="$1"; shift; fi
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
budget="${MINIDL_THERE_BUDGET:-540}"
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "gpu-build-there: MINIDL_THERE_BUDGET: expected seconds, got '$budget'" >&2; exit 2; }
cd "$src"
[[ -f $bundle_tar ]] || { echo "gpu-build-there: no bundle at '$bundle_tar' (carry build-bundle/minidl-gpu.tar.xz)" >&2; exit 2; }
mkdir -p "$outdir" || { echo "gpu-build-there: cannot create OUTDIR '$outdir'" >&2; exit 2; }
out="$(cd "$outdir" && pwd)"
log="$out/build-there.log"
: >"$log"
say() { echo "gpu-build-there: $*" | tee -a "$log" >&2; }
cannot() { say "cannot build here: $*"; exit 6; }
export PATH="${PATH:-/usr/bin:/bin}:/usr/local/cuda/bin:/usr/bin:/bin"

# ---- what the node must have ----
for tool in cmake ninja nvcc; do command -v "$tool" >/dev/null || cannot "$tool not found on PATH (nor /usr/local/cuda/bin)"; done
cxx="$(command -v g++ || command -v c++ || command -v clang++)" || cannot "no C++ compiler (g++, c++ or clang++)"
cmake_version="$(cmake --version | head -n 1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?')"
awk -v v="$cmake_version" 'BEGIN { split(v, a, "."); exit !(a[1] > 3 || (a[1] == 3 && a[2] >= 25)) }' ||
  cannot "CMake $cmake_version is older than 3.25"

# ---- the bundle: its kit, libraries, scripts and data ----
kit_root="$src/build-there/bundle"
rm -rf "$kit_root"
mkdir -p "$kit_root"
if command -v xz >/dev/null; then
  tar -C "$kit_root" -xJf "$bundle_tar" || cannot "tar could not unpack $bundle_tar"
else
  py="$(compgen -G '/opt/*/.venv/bin/python3' | head -n 1)"; py="${py:-$(command -v python3)}"
  [[ -n $py ]] || cannot "neither xz nor a Python to unpack $bundle_tar"
  "$py" -c 'import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2])' "$bundle_tar" "$kit_root" || cannot "Python's tarfile could not unpack $bundle_tar"
fi
bundle="$kit_root/minidl-gpu"
kit="$bundle/devkit"
[[ -d $kit ]] || cannot "the bundle has no devkit/ (made by an older scripts/gpu-bundle.sh)"
built_glibc="$(awk '/^glibc: / { print $2 }' "$bundle/manifest.txt")"
node_glibc="$(ldd --version 2>&1 | head -n 1 | grep -Eo '[0-9]+\.[0-9]+$')"
if [[ -n $built_glibc && -n $node_glibc ]] &&
   ! awk -v n="$node_glibc" -v b="$built_glibc" 'BEGIN { split(n, x, "."); split(b, y, "."); exit !(x[1] > y[1] || (x[1] == y[1] && x[2] >= y[2])) }'; then
  cannot "this node's glibc $node_glibc is older than $built_glibc, which the bundle's libraries (Open MPI, OpenBLAS," \
    "Highway) need; build the bundle on a distribution with glibc <= $node_glibc"
fi
multiarch="$(basename "$(dirname "$(compgen -G "$kit/lib/*/openmpi" | head -n 1)")")"

# cuDNN and NCCL: the toolkit's, or a wheel's.
roots=()
for d in /opt/*/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages /usr/lib/python3*/dist-packages; do
  [[ -d $d/nvidia/cudnn ]] && roots+=("-DCUDNN_ROOT=$d/nvidia/cudnn")
  [[ -d $d/nvidia/nccl ]] && roots+=("-DNCCL_ROOT=$d/nvidia/nccl")
done
archs="${MINIDL_THERE_ARCHS:-native}"
build="$src/build-there/build"
t0=$SECONDS
say "configuring ($cxx, nvcc $(nvcc --version | grep -Eo 'release [0-9.]+'), CMake $cmake_version, architectures $archs)"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DMINIDL_ENABLE_CUDA=ON -DMINIDL_CUDA_EMULATOR=OFF -DMINIDL_CUDA_EMULATION=OFF "-DCMAKE_CUDA_ARCHITECTURES=$archs" \
  -DCMAKE_CUDA_FLAGS=-lineinfo -DCMAKE_PREFIX_PATH="$kit" -DPKG_CONFIG_EXECUTABLE=/nonexistent \
  -DMINIDL_PCRE2_INCLUDE_DIR="$kit/include" -DMINIDL_PCRE2_LIBRARY="$kit/lib/$multiarch/libpcre2-8.so" \
  -DMINIDL_OPENBLAS_LIBRARY="$kit/lib/$multiarch/openblas-openmp/libopenblas.so" \
  -DMINIDL_OPENBLAS_INCLUDE_DIR="$kit/include/$multiarch/openblas-openmp" \
  -DMPI_CXX_COMPILER="$kit/bin/mpicxx" -DMPI_C_COMPILER="$kit/bin/mpicc" \
  "${roots[@]}" >>"$log" 2>&1 ||
  { tail -n 30 "$log" >&2; rm -f "$build/CMakeCache.txt"; cannot "CMake could not configure (build-there.log)"; }
[[ -f $build/gpu_test_targets.txt ]] || cannot "the configuration has no real CUDA backend (build-there.log)"
read -ra test_targets <<<"$(tr ';' ' ' <"$build/gpu_test_targets.txt")"
programs=(gpu_probe bench_gpt_step bench_gpu_roofline bench_collectives train_gpt)
# The bundle's libraries less libstdc++, libgcc_s and libgomp (the node's own compiler's are the ones its binaries
# need): what the test binaries load when the build lists their tests, and what the check runs with.
there="$src/build-there/stage/minidl-gpu"
rm -rf "$src/build-there/stage"
mkdir -p "$there/bin" "$there/tests"
cp -R "$bundle/scripts" "$bundle/bench" "$bundle/data" "$bundle/lib" "$there/"
rm -f "$there"/lib/libstdc++.so* "$there"/lib/libgcc_s.so* "$there"/lib/libgomp.so*
say "building ${#programs[@]} programs and ${#test_targets[@]} test binaries on $(nproc) cores"
LD_LIBRARY_PATH="$there/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cmake --build "$build" -j "$(nproc)" --target "${programs[@]}" "${test_targets[@]}" >>"$log" 2>&1 ||
  { grep -E 'error|Error' "$log" | head -n 20 >&2; cannot "the build failed (build-there.log)"; }
say "built in $(( SECONDS - t0 ))s"

# ---- stage the built programs beside the bundle's scripts, data and libraries, and check ----
cp "$bundle/manifest.txt" "$there/manifest.txt"
echo "rebuilt on the node: $(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ), architectures $archs" >>"$there/manifest.txt"
for p in "${programs[@]}"; do install -m 755 "$build/bin/$p" "$there/bin/"; done
for t in "${test_targets[@]}"; do install -m 755 "$build/tests/$t" "$there/tests/"; done
left=$(( budget - SECONDS ))
(( left >= 60 )) || { say "no time left to check (${left}s of ${budget}s): call again, the build is kept"; exit 5; }
export MINIDL_GPU_DEADLINE="${MINIDL_GPU_DEADLINE:-$(( left - 30 < 330 ? left - 30 : 330 ))}"
say "checking with a ${MINIDL_GPU_DEADLINE}s deadline"
exec bash "$there/scripts/gpu-run.sh" --require-gpu "$@" "$out"
