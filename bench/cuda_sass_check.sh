#!/usr/bin/env bash
# Checks the machine code of the tensor-core kernels: every kernel of the files below, for each architecture given
# (default: 80 90, CI's Ampere and Hopper targets), must contain tensor-core MMAs (HMMA), shared-memory matrix loads
# (LDSM, from ldmatrix) and asynchronous global-to-shared copies (LDGSTS, from cp.async). Exit status 1 otherwise:
# a refactoring that silently falls back to scalar code, or a build that drops the inline PTX, fails here rather
# than only in a benchmark. These kernels must not spill registers either (ptxas's report of the same compile; for
# every kernel of the tree, bench/cuda_resources.sh).
#
#   bench/cuda_sass_check.sh            # sm_80 and sm_90
#   bench/cuda_sass_check.sh 86         # other architectures
#
# Needs nvcc (CUDA_HOME, default /usr/local/cuda) and cuobjdump: $CUOBJDUMP, else CUDA_HOME/bin/cuobjdump, else on
# PATH; cuobjdump runs nvdisasm, found beside it or on PATH. When the toolkit lacks them, pip's
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm ship both (nvidia/cu13/bin/).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
nvcc="$cuda_home/bin/nvcc"
cuobjdump="${CUOBJDUMP:-}"
[[ -n "$cuobjdump" ]] || { [[ -x "$cuda_home/bin/cuobjdump" ]] && cuobjdump="$cuda_home/bin/cuobjdump"; } ||
  cuobjdump="$(command -v cuobjdump || true)"
if [[ -z "$cuobjdump" ]]; then
  echo "cuda_sass_check: no cuobjdump (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump)" >&2
  exit 2
fi
archs=("$@")
[[ ${#archs[@]} -gt 0 ]] || archs=(80 90)
sources=(ops/cuda/flash_attention.cu ops/cuda/flash_attention_backward.cu)
# Kernels without matrix products (the backward's row-dot prologue) are exempt.
exempt='row_dot_kernel'
required=(HMMA LDSM LDGSTS)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0
printf '%-30s %-40s %-6s %6s %6s %7s\n' file kernel arch HMMA LDSM LDGSTS
for arch in "${archs[@]}"; do
  for source in "${sources[@]}"; do
    cubin="$tmp/$(basename "$source" .cu)_sm$arch.cubin"
    "$nvcc" -std=c++20 -I"$root" -arch=sm_"$arch" -Xptxas -v -cubin -o "$cubin" "$root/$source" 2>"$cubin.ptxas"
    if grep -E 'bytes spill (stores|loads)' "$cubin.ptxas" | grep -qvE ' 0 bytes spill stores, 0 bytes spill loads'; then
      echo "cuda_sass_check: a kernel of $source spills registers on sm_$arch:" >&2
      grep -B1 -E '[1-9][0-9]* bytes spill' "$cubin.ptxas" >&2
      failed=1
    fi
    PATH="$(dirname "$cuobjdump"):$PATH" "$cuobjdump" -sass "$cubin" >"$cubin.sass"
    grep -q 'Function : ' "$cubin.sass" || { echo "cuda_sass_check: no kernel in $source (sm_$arch)" >&2; exit 1; }
    # cuobjdump -sass prints "Function : NAME" before each kernel's instructions.
    while IFS=$'\t' read -r name hmma ldsm ldgsts; do
      short="$(c++filt "$name" | sed -E 's/\(anonymous namespace\)::|minidl::ops::cuda:://g; s/\(.*//; s/^void //')"
      printf '%-30s %-40s %-6s %6s %6s %7s\n' "$(basename "$source")" "$short" "sm_$arch" "$hmma" "$ldsm" "$ldgsts"
      [[ "$short" =~ $exempt ]] && continue
      if (( hmma == 0 || ldsm == 0 || ldgsts == 0 )); then
        echo "cuda_sass_check: $short (sm_$arch) lacks one of ${required[*]}" >&2
        failed=1
      fi
    done < <(awk '
      /Function : / { if (name != "") printf "%s\t%d\t%d\t%d\n", name, h, l, g; name = $3; h = l = g = 0 }
      /HMMA/ { ++h } /LDSM/ { ++l } /LDGSTS/ { ++g }
      END { if (name != "") printf "%s\t%d\t%d\t%d\n", name, h, l, g }' "$cubin.sass")
  done
done
exit "$failed"
