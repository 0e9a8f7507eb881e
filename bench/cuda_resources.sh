#!/usr/bin/env bash
# Per-kernel resource report from ptxas: registers, static shared memory, stack and spills, for every kernel in
# ops/cuda/*.cu and dist/cuda/*.cu and each architecture given (default: 80 90, CI's Ampere and Hopper targets).
#
#   bench/cuda_resources.sh            # table for sm_80 and sm_90; exit status 1 if any kernel spills
#   bench/cuda_resources.sh 86 89      # other architectures
#
# Spills (registers stored to local memory) cost a round trip to L1/L2 per access: the hand-written kernels must
# have none. Needs nvcc (CUDA_HOME, default /usr/local/cuda) and c++filt.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
archs=("$@")
[[ ${#archs[@]} -gt 0 ]] || archs=(80 90)

printf '%-14s %-36s %-6s %5s %10s %8s %12s %11s\n' file kernel arch regs smem_bytes stack spill_stores spill_loads
spilled=0
for arch in "${archs[@]}"; do
  for source in "$root"/ops/cuda/*.cu "$root"/dist/cuda/*.cu; do
    # ptxas prints, per kernel: "Compiling entry function 'NAME'", "N bytes stack frame, N bytes spill stores,
    # N bytes spill loads", then "Used N registers, ... [N bytes smem, ...]".
    report="$("$nvcc" -std=c++20 -I"$root" -arch=sm_"$arch" -Xptxas -v -c "$source" -o /dev/null 2>&1)"
    while IFS=$'\t' read -r name regs smem stack stores loads; do
      printf '%-14s %-36s %-6s %5s %10s %8s %12s %11s\n' "$(basename "$source")" "$(c++filt "$name" | sed -E 's/\(anonymous namespace\)::|minidl::ops::cuda:://g; s/\(.*//; s/^void //')" \
        "sm_$arch" "$regs" "$smem" "$stack" "$stores" "$loads"
      (( stores + loads > 0 )) && spilled=1
    done < <(awk '
      /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); name = substr($0, RSTART + 1, RLENGTH - 2) }
      /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
      /Used [0-9]+ registers/ {
        regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
        smem = 0
        if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ .*/, "", smem) }
        printf "%s\t%s\t%s\t%s\t%s\t%s\n", name, regs, smem, stack, stores, loads
      }' <<<"$report")
  done
done
if (( spilled )); then
  echo "cuda_resources: some kernels spill registers (see above)" >&2
  exit 1
fi
