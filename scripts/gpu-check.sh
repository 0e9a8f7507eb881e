#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: builds minidl for that GPU's architecture, runs every gpu.* test
# (the device test sources against the real runtime), times bench_gpt_step --device cuda for GPT-2 124M (bf16,
# B 16, T 1024) and nanoGPT's Shakespeare config, and writes one report: pass/fail, ms/step, MFU, and the CUDA
# backend's counters per step (kernel launches, host syncs), beside bench_gpu_roofline's lower bound.
#
#   scripts/gpu-check.sh                          # report in gpu-check-report.txt, build tree build-gpu/
#   scripts/gpu-check.sh /tmp/report.txt          # the report elsewhere
#   MINIDL_BUILD_DIR=build scripts/gpu-check.sh   # another build tree
#
# Exit status: 0 when every step passed, 1 when a test or a benchmark failed, 2 when there is no GPU to check.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
build_dir="${MINIDL_BUILD_DIR:-build-gpu}"
report="${1:-$root/gpu-check-report.txt}"

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: nvidia-smi not found: this machine has no NVIDIA driver, so no GPU to check" >&2
  exit 2
fi
if ! gpu_line="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)" ||
   [[ -z "$gpu_line" ]]; then
  echo "gpu-check: nvidia-smi lists no GPU" >&2
  exit 2
fi
gpu_name="${gpu_line%%,*}"
compute_cap="$(echo "${gpu_line##*,}" | tr -d ' .')"  # "9.0" -> 90
case "$gpu_name" in
  *H100*|*H200*) roofline_gpu=H100 ;;
  *A100*) roofline_gpu=A100 ;;
  *) roofline_gpu="" ;;
esac

status=0
log_dir="$build_dir/gpu-check-logs"
{
  echo "minidl gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "gpu: $gpu_name (sm_$compute_cap)"
} >"$report"

# The real backend (nvcc for this GPU) and the programs on it.
if MINIDL_BUILD_DIR="$build_dir" MINIDL_CMAKE_ARGS="-DMINIDL_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$compute_cap" \
   "$root/scripts/build.sh" >"$root/gpu-check-build.log" 2>&1; then
  echo "build: pass" >>"$report"
else
  echo "build: FAIL (see gpu-check-build.log)" >>"$report"
  echo "gpu-check: the build failed; report in $report" >&2
  exit 1
fi
mkdir -p "$log_dir"

if ctest --test-dir "$build_dir" -R '^gpu\.' --output-on-failure -j1 >"$log_dir/ctest.log" 2>&1; then
  echo "gpu tests: pass ($(grep -Eo '[0-9]+ tests passed|tests passed, [0-9]+ tests failed out of [0-9]+' \
    "$log_dir/ctest.log" | tail -n 1))" >>"$report"
else
  status=1
  echo "gpu tests: FAIL ($(grep -E 'tests failed out of' "$log_dir/ctest.log" | tail -n 1))" >>"$report"
  grep -E '^\s+[0-9]+ - gpu\.' "$log_dir/ctest.log" | sed 's/^/  /' >>"$report"
fi

# bench_gpt_step's last line is one JSON object (--json); its fields name what the report shows.
bench() {
  local label="$1"
  shift
  local out="$log_dir/bench-$label.log"
  if "$build_dir/bin/bench_gpt_step" --device cuda --json --steps 20 --warmup 3 "$@" >"$out" 2>&1; then
    python3 - "$label" "$out" <<'PY' >>"$report"
import json, sys
label, path = sys.argv[1], sys.argv[2]
r = json.loads(open(path).read().strip().splitlines()[-1])
print(f"{label}: pass, {r['ms_per_step']:.2f} ms/step, {r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f}%, "
      f"launches/step {r.get('launches_per_step', 0):.0f}, syncs/step {r.get('syncs_per_step', 0):.1f}, "
      f"H2D {r.get('h2d_bytes_per_step', 0):.0f} B/step, D2H {r.get('d2h_bytes_per_step', 0):.0f} B/step, "
      f"cudaMalloc/step {r.get('mallocs_per_step', 0):.1f}")
PY
  else
    status=1
    echo "$label: FAIL ($(tail -n 1 "$out"))" >>"$report"
  fi
  if [[ -n "$roofline_gpu" ]]; then  # the same shape flags; --steps and --warmup are bench_gpt_step's only
    "$build_dir/bin/bench_gpu_roofline" --gpu "$roofline_gpu" "$@" 2>&1 | tail -n 1 |
      sed "s/^/  roofline ($roofline_gpu): /" >>"$report"
  fi
}

bench gpt2-124m --layers 12 --heads 12 --embd 768 --seq 1024 --batch 16 --vocab 50257 --amp bf16
bench nanogpt --layers 6 --heads 6 --embd 384 --seq 256 --batch 8 --vocab 65 --amp bf16

echo "result: $([[ $status -eq 0 ]] && echo PASS || echo FAIL) (logs in $log_dir)" >>"$report"
cat "$report"
exit "$status"
