#!/usr/bin/env bash
# Builds minidl for real GPUs on this (Debian, GPU-less) machine and packs what a GPU node needs to check it into one
# .tar.xz: the GPU test binaries (tests/gpu: gpu.*), gpu_probe, the benchmark programs and train_gpt, the shared
# libraries they load that a GPU node may lack, bench/torch_gpt_step.py (the PyTorch reference), Tiny Shakespeare and
# GPT-2's encoding (the trace step's data), and scripts/gpu-run.sh, which runs the check there from the unpacked
# folder with nothing installed.
#
#   scripts/gpu-bundle.sh                       # -> build-bundle/minidl-gpu.tar.xz
#   scripts/gpu-bundle.sh /tmp/minidl-gpu.tar.xz
#   MINIDL_BUNDLE_ARCHS="90" scripts/gpu-bundle.sh    # GPU architectures (default "80;90": A100, H100/H200)
#
# The build: Release, the real CUDA backend (no emulator), kernels with -lineinfo (compute-sanitizer's reports
# name source lines), in build-bundle/ (MINIDL_BUNDLE_BUILD_DIR); ccache shares the library's objects with the
# Release tree of scripts/build.sh. What goes into lib/: every shared library the programs and Open MPI's plug-ins
# load, except glibc's, the NVIDIA driver's and the CUDA libraries (libcudart, cuBLAS(Lt), cuDNN, NCCL, ...), which
# gpu-run.sh finds on the node (the CUDA toolkit, or the nvidia-* wheels in Python's site-packages). Programs and
# libraries look for each other through RUNPATH ($ORIGIN/../lib), so the folder works wherever it is unpacked.
# Open MPI's network plug-ins for fabrics (UCX, OFI, verbs, PSM) are left out: a bundle runs on one node.
#
# The audit: after packing, `ldd` (with no LD_LIBRARY_PATH) must resolve every dependency of every program, library
# and plug-in inside the bundle, to glibc, or to the driver and CUDA libraries; the script fails naming any other
# (and any library not found on this machine). The bundle must be at most 50 MiB (MINIDL_BUNDLE_MAX_MIB), so that
# it and the source tree travel together under a GPU node's 64 MiB (docs/cuda.md).
#
# Exit status: 0 on success; 1 when the build, the audit or the size check fails; 2 on bad usage.
set -euo pipefail

usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) echo "gpu-bundle: unknown option '$1' (expected an output path ending in .tar.xz, or --help)" >&2; exit 2 ;;
esac
if (( $# > 1 )); then
  echo "gpu-bundle: expected at most one argument (the output .tar.xz), got $#" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${MINIDL_BUNDLE_BUILD_DIR:-build-bundle}"
archs="${MINIDL_BUNDLE_ARCHS:-80;90}"
max_mib="${MINIDL_BUNDLE_MAX_MIB:-50}"
out="${1:-$build_dir/minidl-gpu.tar.xz}"
if [[ "$out" != *.tar.xz ]]; then
  echo "gpu-bundle: the output must end in .tar.xz, got '$out'" >&2
  exit 2
fi
case "$out" in /*) ;; *) out="$root/$out" ;; esac

fail() { echo "gpu-bundle: $*" >&2; exit 1; }
for tool in cmake ninja nvcc patchelf strip xz ldd; do
  command -v "$tool" >/dev/null || [[ $tool == nvcc && -x /usr/local/cuda/bin/nvcc ]] ||
    fail "$tool not found (scripts/install-deps.sh installs the build tools; nvcc comes with the CUDA toolkit)"
done

# ---- build ----
mkdir -p "$build_dir"
configure_log="$build_dir/configure.log"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINIDL_ENABLE_CUDA=ON -DMINIDL_CUDA_EMULATOR=OFF \
  -DMINIDL_CUDA_EMULATION=OFF "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DCMAKE_CUDA_FLAGS=-lineinfo >"$configure_log" 2>&1 ||
  { cat "$configure_log" >&2; fail "cmake could not configure $build_dir"; }
[[ -f "$build_dir/gpu_test_targets.txt" ]] ||
  fail "the build has no real CUDA backend (nvcc not found?): see $configure_log"
read -ra test_targets <<<"$(tr ';' ' ' <"$build_dir/gpu_test_targets.txt")"
programs=(gpu_probe bench_gpt_step bench_gpu_roofline bench_collectives train_gpt)
cmake --build "$build_dir" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target "${programs[@]}" "${test_targets[@]}"

# ---- stage ----
stage="$build_dir/stage"
top="$stage/minidl-gpu"
rm -rf "$stage"
mkdir -p "$top/bin" "$top/tests" "$top/lib/openmpi3" "$top/scripts" "$top/bench" "$top/data"
for p in "${programs[@]}"; do install -m 755 "$build_dir/bin/$p" "$top/bin/"; done
for t in "${test_targets[@]}"; do install -m 755 "$build_dir/tests/$t" "$top/tests/"; done
install -m 755 scripts/gpu-run.sh scripts/gpu_profile.py "$top/scripts/"
install -m 755 bench/torch_gpt_step.py "$top/bench/"
# The trace step trains GPT-2 124M on Tiny Shakespeare with GPT-2's BPE.
install -m 644 data/tinyshakespeare.txt data/gpt2.tiktoken "$top/data/"

# Which dependencies stay on the node: glibc, the NVIDIA driver, the CUDA libraries.
is_glibc() { [[ $1 =~ ^(linux-vdso|linux-gate|ld-linux.*|libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl)\.so ]]; }
is_driver_or_cuda() {
  [[ $1 =~ ^lib(cuda|nvidia-[a-z0-9-]+|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z-]*|nvJitLink|cufft|curand|cusparse|cusolver|nvToolsExt|nvtx3?[a-z]*)\.so ]]
}
# A plug-in for a network fabric: left out with its libraries.
is_fabric() { [[ $1 =~ ^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|psm_infinipath|psm2|hcoll|knem|xpmem)\.so ]]; }

# dependencies FILE: "name path" per line (path "not" when not found).
dependencies() {
  env -u LD_LIBRARY_PATH ldd "$1" | awk '{ name = $1; sub(".*/", "", name) } /=>/ { print name, $3; next } { print name, "system" }'
}

declare -A copied=()
# Copies the libraries FILE needs into lib/ (and theirs, recursively).
copy_dependencies() {
  local name path
  while read -r name path; do
    is_glibc "$name" && continue
    is_driver_or_cuda "$name" && continue
    [[ $path == not ]] && fail "$1 needs $name, which this machine cannot find (ldd: not found)"
    [[ $path == system ]] && continue
    [[ -n "${copied[$name]:-}" ]] && continue
    copied[$name]="$(readlink -f "$path")"
    install -m 644 "${copied[$name]}" "$top/lib/$name"
    copy_dependencies "$path"
  done < <(dependencies "$1")
}
for f in "$top"/bin/* "$top"/tests/*; do copy_dependencies "$f"; done

# Open MPI's plug-ins (dlopen'ed at MPI_Init from the folder gpu-run.sh names in OMPI_MCA_mca_base_component_path),
# when the programs link Open MPI.
left_out=()
if [[ -n "${copied[libmpi.so.40]:-}" ]]; then
  plugin_dir="$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')"
  [[ -d $plugin_dir ]] || plugin_dir="$(dirname "${copied[libmpi.so.40]}")/openmpi/lib/openmpi3"
  [[ -d $plugin_dir ]] || fail "libmpi.so.40 is linked, but Open MPI's plug-in folder was not found" \
    "(ompi_info --path pkglibdir names none, and $plugin_dir does not exist)"
  for plugin in "$plugin_dir"/mca_*.so; do
    fabric=""
    while read -r name _; do is_fabric "$name" && fabric="$name"; done < <(dependencies "$plugin")
    if [[ -n $fabric ]]; then left_out+=("$(basename "$plugin") ($fabric)"); continue; fi
    install -m 644 "$plugin" "$top/lib/openmpi3/"
    copy_dependencies "$plugin"
  done
fi

# Debug information out, symbols kept: compute-sanitizer's and a crash's reports name the host functions.
strip --strip-debug "$top"/bin/* "$top"/tests/*
strip --strip-unneeded "$top"/lib/*.so* "$top"/lib/openmpi3/*.so
for f in "$top"/bin/* "$top"/tests/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$top"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done
for f in "$top"/lib/openmpi3/*.so; do patchelf --set-rpath '$ORIGIN/..' "$f"; done

# ---- the kit to build on the node (scripts/gpu-build-there.sh): headers and CMake packages of the dependencies,
# a mirror of /usr's layout (so their CMake files find themselves), and link-time names for the bundle's libraries.
# With it, a node that has only nvcc, CMake, ninja and a C++ compiler builds the GPU targets. ----
kit="$top/devkit"
multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
kit_paths=(include/CLI include/nlohmann include/hwy include/gtest include/gmock include/pcre2.h
           "include/$multiarch/openblas-openmp" "lib/$multiarch/openmpi/include" share/cmake/CLI11
           share/cmake/nlohmann_json "lib/$multiarch/cmake/hwy" "lib/$multiarch/cmake/GTest")
for p in "${kit_paths[@]}" "lib/$multiarch"/libg{test,mock}{,_main}.a; do
  [[ -e /usr/$p ]] || fail "the build kit needs /usr/$p (scripts/install-deps.sh installs it)"
  mkdir -p "$kit/$(dirname "$p")"
  cp -RL "/usr/$p" "$kit/$(dirname "$p")/"
done
# kit_link LINK-PATH SONAME: a link-time name in the kit for a library of lib/.
kit_link() {
  [[ -e $top/lib/$2 ]] || fail "the build kit: $2 is not in the bundle's lib/"
  mkdir -p "$kit/$(dirname "$1")"
  ln -sf "$(realpath --relative-to="$kit/$(dirname "$1")" "$top/lib/$2")" "$kit/$1"
}
for f in $(grep -ho 'lib/[^"]*\.so[.0-9]*' "$kit/lib/$multiarch/cmake/hwy/"hwy-config-*.cmake | sort -u); do
  # hwy's CMake file checks that each of its libraries exists; minidl links libhwy alone.
  kit_link "$f" libhwy.so.1
done
kit_link "lib/$multiarch/libhwy.so" libhwy.so.1
kit_link "lib/$multiarch/libpcre2-8.so" libpcre2-8.so.0
kit_link "lib/$multiarch/libmpi.so" libmpi.so.40
kit_link "lib/$multiarch/openblas-openmp/libopenblas.so" libopenblas.so.0
# Open MPI's compiler wrappers answer CMake's FindMPI (-showme:compile, -showme:link) from their installed data
# files; these stand-ins answer the same questions with the kit's paths, and compile with the node's compiler.
mkdir -p "$kit/bin"
for wrapper in mpicc:gcc mpicxx:g++; do
  cat >"$kit/bin/${wrapper%%:*}" <<EOF
#!/bin/sh
kit="\$(cd "\$(dirname "\$0")/.." && pwd)"
inc="\$kit/lib/$multiarch/openmpi/include" lib="\$kit/lib/$multiarch"
case "\$1" in
  -showme:compile) echo "-I\$inc" ;;
  -showme:link) echo "-L\$lib -lmpi" ;;
  -showme:incdirs) echo "\$inc" ;;
  -showme:libdirs) echo "\$lib" ;;
  -showme:libs) echo "mpi" ;;
  -showme:version) echo "${wrapper%%:*}: Open MPI (minidl's build kit)" ;;
  *) exec "\${MINIDL_KIT_COMPILER:-${wrapper#*:}}" -I"\$inc" "\$@" -L"\$lib" -lmpi ;;
esac
EOF
  chmod 755 "$kit/bin/${wrapper%%:*}"
done

# ---- audit: every dependency resolves inside the bundle, or is glibc, the driver or CUDA ----
audit="$stage/ldd-audit.txt"
: >"$audit"
for f in "$top"/bin/* "$top"/tests/* "$top"/lib/*.so* "$top"/lib/openmpi3/*.so; do
  while read -r name path; do
    if is_glibc "$name"; then kind=glibc
    elif is_driver_or_cuda "$name"; then kind="driver/cuda (from the node)"
    elif [[ $path == "$(cd "$top" && pwd)"/* ]]; then kind=bundle
    else fail "audit: ${f#"$top/"} needs $name, which resolves outside the bundle ($path)"
    fi
    echo "${f#"$top/"}: $name -> $kind" >>"$audit"
  done < <(dependencies "$f")
done

# ---- manifest ----
# The Debian package that owns a library (dpkg knows merged-/usr files by their /lib path).
package_of() {
  { dpkg -S "$1" 2>/dev/null || dpkg -S "${1/#\/usr\/lib\//\/lib\/}" 2>/dev/null || true; } | head -n 1 | cut -d: -f1
}
{
  echo "minidl GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -sm), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "glibc: $(ldd --version | head -n 1 | grep -Eo '[0-9]+\.[0-9]+$')"
  echo "compiler: $(g++ --version | head -n 1)"
  echo "nvcc: $( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) | tail -n 2 | head -n 1)"
  echo "cuda architectures: $archs (-lineinfo)"
  grep -E '^(CUDNN|NCCL)_VERSION' "$build_dir/CMakeCache.txt" | sed 's/:[A-Z]*=/: /' || true
  echo "libraries in lib/ (from this machine):"
  for name in $(printf '%s\n' "${!copied[@]}" | sort); do
    pkg="$(package_of "${copied[$name]}")"
    echo "  $name  ${copied[$name]}  ${pkg:+$pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)}"
  done
  echo "Open MPI plug-ins: $(find "$top/lib/openmpi3" -name '*.so' | wc -l) in lib/openmpi3"
  (( ${#left_out[@]} == 0 )) || printf '  left out (network fabrics): %s\n' "${left_out[@]}"
  echo "programs: ${programs[*]}"
  echo "tests: ${test_targets[*]}"
} >"$top/manifest.txt"
cp "$audit" "$top/ldd-audit.txt"

mkdir -p "$(dirname "$out")"
rm -f "$out"
XZ_OPT="-6 -T0" tar -C "$stage" -cJf "$out.part" minidl-gpu
mv "$out.part" "$out"
bytes=$(stat -c %s "$out")
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "gpu-bundle: $out: $mib MiB ($(du -sh "$top" | cut -f1) unpacked), ${#copied[@]} libraries in lib/," \
  "$(wc -l <"$audit") dependencies audited"
(( bytes <= max_mib * 1048576 )) || fail "the bundle is $mib MiB, over the limit of $max_mib MiB"
