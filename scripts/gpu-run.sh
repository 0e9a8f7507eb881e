#!/usr/bin/env bash
# The GPU check, run on a GPU node from an unpacked bundle (scripts/gpu-bundle.sh), with nothing installed:
#
#   tar xf minidl-gpu.tar.xz && minidl-gpu/scripts/gpu-run.sh /tmp/report
#
# It finds the CUDA libraries minidl loads (libcudart, cuBLAS and cuBLASLt, cuDNN, NCCL) in the CUDA toolkit or in
# the nvidia-* wheels of a Python's site-packages, and runs, under one deadline, in this order of value:
#   env          env.txt: the GPU, driver, clocks, power limit, where each library came from, any ldd miss
#   load         every program and test binary of the bundle starts here (its libraries resolve)
#   cpu_smoke    a two-step CPU training run without mpirun (a world of one from the bundled Open MPI)
#   tensor_core  mma, ldmatrix and cp.async on silicon: the emulator's model of them checked (test_tensor_core_gpu)
#   kernels      every hand-written kernel against the CPU op, outputs poisoned with NaN, plus GPU-only shapes
#   gpu_tests    the device tensor, allocator, graphs, cuBLAS(Lt)/cuDNN ops, GPT, the device step (every gpu.*)
#   trace        a 5-step train_gpt --device cuda --trace: trace/rank0.json must have the compute stream's track
#                (each span's device time, core/cuda/trace_hooks.cpp); open it in https://ui.perfetto.dev
#   sanitizer    compute-sanitizer memcheck, racecheck, synccheck and initcheck on the kernels' small shapes
#   bench        bench_gpt_step --device cuda: GPT-2 124M (bf16, B 16, T 1024) eager and --cuda-graph, nanoGPT's
#                config: ms/step, tokens/s, MFU, launches and syncs per step; the loss must be finite and fall over
#                20 steps on one repeated batch
# and prints summary.txt last: one line per step (what, exit code, seconds). A step that needs a GPU says "no GPU"
# and skips on a machine without one; a step that would start after the deadline is skipped and says so; each step
# is also capped on its own. OUTDIR gets env.txt, tests.log, sanitizer.log, bench.txt and summary.txt, each cut to
# its last 16 MiB, and the trace step's trace/rank0.json and its text.
#
#   MINIDL_GPU_DEADLINE=480     seconds for the whole check (default 480)
#   MINIDL_GPU_BENCH_STEPS=20   timed steps per benchmark
#
# Exit status: 0 when no step failed (skipped steps do not fail), 1 when one did, 2 on bad usage.
set -uo pipefail

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") echo "gpu-run: expected OUTDIR, the folder for the report (gpu-run.sh --help)" >&2; exit 2 ;;
  -*) echo "gpu-run: unknown option '$1' (expected OUTDIR or --help)" >&2; exit 2 ;;
esac
if (( $# != 1 )); then
  echo "gpu-run: expected one argument, OUTDIR, got $#" >&2
  exit 2
fi
for var in MINIDL_GPU_DEADLINE MINIDL_GPU_BENCH_STEPS; do
  if [[ -n "${!var:-}" && ! "${!var}" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu-run: $var: expected a positive whole number, got '${!var}'" >&2
    exit 2
  fi
done
deadline="${MINIDL_GPU_DEADLINE:-480}"
bench_steps="${MINIDL_GPU_BENCH_STEPS:-20}"

bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -d "$bundle/tests" || ! -d "$bundle/lib" ]]; then
  echo "gpu-run: $bundle is not an unpacked bundle (no tests/ or lib/); make one with scripts/gpu-bundle.sh" >&2
  exit 2
fi
mkdir -p "$1" || { echo "gpu-run: cannot create OUTDIR '$1'" >&2; exit 2; }
out="$(cd "$1" && pwd)"
start=$SECONDS
export PATH="${PATH:-/usr/bin:/bin}:/usr/local/cuda/bin:/usr/bin:/bin"
[[ -n "${CUDA_HOME:-}" ]] && PATH="$CUDA_HOME/bin:$PATH"
tests_log="$out/tests.log" sanitizer_log="$out/sanitizer.log" bench_txt="$out/bench.txt" env_txt="$out/env.txt"
summary="$out/summary.txt"
: >"$tests_log"; : >"$sanitizer_log"; : >"$bench_txt"; : >"$summary"

# ---- the CUDA libraries: the toolkit, the system, or Python's nvidia-* wheels ----
python_site_dirs() {
  local py
  for py in python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]: print(d)' 2>/dev/null
  done
  compgen -G '/usr/local/lib/python3*/dist-packages' ; compgen -G '/usr/lib/python3*/dist-packages'
  compgen -G '/opt/conda/lib/python3*/site-packages'; compgen -G "${HOME:-/root}/.local/lib/python3*/site-packages"
}
candidate_dirs() {
  local d
  for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64; do
    [[ -d $d ]] && echo "$d"
  done
  python_site_dirs 2>/dev/null | sort -u | while read -r d; do
    [[ -d $d/nvidia ]] && compgen -G "$d/nvidia/*/lib"
  done
}
mapfile -t dirs < <(candidate_dirs | awk '!seen[$0]++')
lib_report=()
library_path=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libcuda.so.1; do
  found=""
  for d in "${dirs[@]}"; do
    if [[ -e $d/$lib ]]; then found="$d"; break; fi
  done
  if [[ -z $found && $lib == libcuda.so.1 ]]; then  # the driver's, where ldconfig knows it
    found="$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l { sub("/[^/]*$", "", $NF); print $NF; exit }')"
  fi
  version=""
  [[ -n $found && -e $found/$lib ]] && version=" ($(basename "$(readlink -f "$found/$lib")"))"
  lib_report+=("$lib: ${found:-not found}$version")
  [[ -n $found && ":$library_path:" != *":$found:"* ]] && library_path="$library_path:$found"
done
export LD_LIBRARY_PATH="$bundle/lib$library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Open MPI from the bundle: its plug-ins, and a world of one without mpirun's daemon (dist::init sets the latter).
export OMPI_MCA_mca_base_component_path="$bundle/lib/openmpi3"
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_show_load_errors=0
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
fi
have_gpu() { [[ -n $gpu_name ]]; }

# ---- steps ----
failed=0
# step NAME CAP_SECONDS NEEDS_GPU(gpu|any) LOG COMMAND...: runs COMMAND under the cap and the deadline, output
# appended to LOG under a header; one line in summary.txt.
step() {
  local name="$1" cap="$2" needs="$3" log="$4"
  shift 4
  local left=$(( deadline - (SECONDS - start) ))
  if [[ $needs == gpu ]] && ! have_gpu; then
    printf '%-34s skipped   -      no GPU\n' "$name" >>"$summary"
    return 0
  fi
  if (( left < 5 )); then
    printf '%-34s skipped   -      out of time (deadline %ss)\n' "$name" "$deadline" >>"$summary"
    return 0
  fi
  (( cap > left )) && cap=$left
  local t0=$SECONDS rc before
  before=$(stat -c %s "$log")
  printf '\n===== %s (cap %ss): %s\n' "$name" "$cap" "$*" >>"$log"
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs it in a child bash
    timeout --kill-after=10 "$cap" bash -c '"$@"' "$name" "$@" >>"$log" 2>&1
  else
    timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
  fi
  rc=$?
  local note=""
  (( rc == 124 || rc == 137 )) && note="timed out after ${cap}s"
  local counts
  counts="$(tail -c +$(( before + 1 )) "$log" | grep -Eo '\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?' | sed 's/\[  //; s/ *\] / /' |
            paste -sd ',' - | sed 's/,/, /g')"
  [[ -n $counts ]] && note="${note:+$note; }$counts"
  (( rc != 0 )) && failed=1
  printf '%-34s rc %-4s %4ds  %s\n' "$name" "$rc" $(( SECONDS - t0 )) "$note" >>"$summary"
  return 0
}

# env.txt
{
  echo "minidl gpu-run, $(date -u +%Y-%m-%dT%H:%M:%SZ), deadline ${deadline}s"
  echo "host: $(uname -n) $(uname -sr), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  if have_gpu; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.memory,power.limit \
      --format=csv 2>&1
    nvidia-smi 2>&1 | sed -n '1,4p'
  else
    echo "gpu: no GPU (nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists none' || echo 'not found'))"
  fi
  echo "libraries:"
  printf '  %s\n' "${lib_report[@]}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "compute-sanitizer: $(command -v compute-sanitizer || echo 'not found')"
  echo "bundle:"
  sed 's/^/  /' "$bundle/manifest.txt" 2>/dev/null | head -n 12
  echo "ldd misses (bundle programs and tests, with the library path above):"
  misses="$(for f in "$bundle"/bin/* "$bundle"/tests/*; do ldd "$f" 2>&1 | awk -v f="${f#"$bundle/"}" '/not found/ { print "  " f ": " $1 }'; done | sort -u)"
  echo "${misses:-  none}"
} >"$env_txt" 2>&1
printf '%-34s rc %-4s %4ds  %s\n' "env" 0 $(( SECONDS - start )) "${gpu_name:-no GPU}" >>"$summary"

# Every binary starts (its libraries load) and lists its tests or its flags.
load_all() {
  local f rc=0
  for f in "$bundle"/tests/*; do "$f" --gtest_list_tests >/dev/null || { echo "does not start: $f"; rc=1; }; done
  for f in "$bundle"/bin/*; do "$f" --help >/dev/null || { echo "does not start: $f"; rc=1; }; done
  return $rc
}
export bundle bench_steps bench_txt gpu_name
export -f load_all
step load 30 any "$tests_log" load_all
step cpu_smoke 60 any "$tests_log" "$bundle/bin/bench_gpt_step" --device cpu --layers 1 --heads 2 --embd 32 --seq 16 \
  --batch 2 --steps 2 --warmup 1 --threads 2

gtest=(--gtest_brief=1 --gtest_color=no)
step tensor_core 60 gpu "$tests_log" "$bundle/tests/test_tensor_core_gpu" "${gtest[@]}"
step kernels 150 gpu "$tests_log" "$bundle/tests/test_cuda_kernels_gpu" "${gtest[@]}"
for t in "$bundle"/tests/test_*_gpu; do
  case "$(basename "$t")" in test_tensor_core_gpu|test_cuda_kernels_gpu) continue ;; esac
  step "gpu_tests/$(basename "$t")" 90 gpu "$tests_log" "$t" "${gtest[@]}"
done

# A short traced run on a made-up text: the device's tracks must be in the trace.
trace_run() {
  local text="$out/trace-text.txt"
  for _ in $(seq 300); do printf 'the quick brown fox jumps over the lazy dog. '; done >"$text"
  "$bundle/bin/train_gpt" --device cuda --data "$text" --layers 2 --heads 2 --embd 64 --seq 64 --batch 8 --steps 5 \
    --log-every 1 --eval-windows 4 --trace "$out/trace" || return
  grep -o '"device [0-9]*: [a-z ]*stream"' "$out/trace/rank0.json" | sort -u
  grep -q '"device 0: compute stream"' "$out/trace/rank0.json" ||
    { echo "trace: no device track in $out/trace/rank0.json"; return 1; }
}
export out
export -f trace_run
step trace 60 gpu "$tests_log" trace_run

small_shapes='--gtest_filter=-GpuShapes/*:FlashAttentionGrid.*'
for tool in memcheck racecheck synccheck initcheck; do
  if command -v compute-sanitizer >/dev/null 2>&1 || ! have_gpu; then
    step "sanitizer/$tool" 90 gpu "$sanitizer_log" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      --print-limit 20 "$bundle/tests/test_cuda_kernels_gpu" "$small_shapes" "${gtest[@]}"
  else
    printf '%-34s skipped   -      compute-sanitizer not found\n' "sanitizer/$tool" >>"$summary"
  fi
done

# bench_one LABEL FLAGS...: one bench_gpt_step run (its table to the step's log) and a line of its JSON's fields.
bench_one() {
  local label="$1"
  shift
  local output rc
  output="$("$bundle/bin/bench_gpt_step" --device cuda --json --same-batch --steps "$bench_steps" --warmup 3 "$@" 2>&1)"
  rc=$?
  echo "$output"
  (( rc == 0 )) || return $rc
  local json
  json="$(tail -n 1 <<<"$output")"
  field() { grep -Eo "\"$1\": [^,}]+" <<<"$json" | head -n 1 | sed 's/.*: //; s/"//g'; }
  local first last verdict
  first="$(field loss_first)" last="$(field loss_last)"
  if awk -v a="$first" -v b="$last" 'BEGIN { exit !(a == a + 0 && b == b + 0 && a < 1e30 && b < a) }'; then
    verdict="falls"
  else
    verdict="DOES NOT FALL or is not finite"
    rc=1
  fi
  printf '%s: %s ms/step, %s tokens/s, MFU %s, launches/step %s, syncs/step %s, loss %s -> %s over %s steps (%s)\n' \
    "$label" "$(field ms_per_step)" "$(field tokens_per_s)" "$(field mfu)" "$(field launches_per_step)" \
    "$(field syncs_per_step)" "$first" "$last" "$bench_steps" "$verdict" >>"$bench_txt.lines"
  # The lower bound of the same step on this GPU's datasheet (bench_gpu_roofline knows H100 and A100).
  local roofline_gpu=""
  case "$gpu_name" in *H100*|*H200*) roofline_gpu=H100 ;; *A100*) roofline_gpu=A100 ;; esac
  local -a shape=()
  while (( $# )); do
    case "$1" in --cuda-graph) shift ;; *) shape+=("$1" "$2"); shift 2 ;; esac
  done
  if [[ -n $roofline_gpu ]]; then
    echo "  roofline ($roofline_gpu datasheet): $("$bundle/bin/bench_gpu_roofline" --gpu "$roofline_gpu" "${shape[@]}" 2>&1 |
      tail -n 1)" >>"$bench_txt.lines"
  fi
  return $rc
}
export -f bench_one
gpt2=(--layers 12 --heads 12 --embd 768 --seq 1024 --batch 16 --vocab 50257 --amp bf16)
nanogpt=(--layers 6 --heads 6 --embd 384 --seq 256 --batch 8 --vocab 65 --amp bf16)
: >"$bench_txt.lines"
step bench/gpt2-124m 150 gpu "$bench_txt" bench_one gpt2-124m "${gpt2[@]}"
step bench/gpt2-124m-cuda-graph 150 gpu "$bench_txt" bench_one gpt2-124m-cuda-graph "${gpt2[@]}" --cuda-graph
step bench/nanogpt 90 gpu "$bench_txt" bench_one nanogpt "${nanogpt[@]}"
if [[ -s "$bench_txt.lines" ]]; then
  { echo; echo "===== results"; cat "$bench_txt.lines"; } >>"$bench_txt"
fi
rm -f "$bench_txt.lines"

# Each file at most 16 MiB (its end kept: that is where failures are summarised); empty logs removed.
for f in "$tests_log" "$sanitizer_log" "$bench_txt"; do
  if (( $(stat -c %s "$f") > 16 * 1048576 )); then
    tail -c $(( 16 * 1048576 - 100 )) "$f" >"$f.cut" && { echo "[cut to its last 16 MiB]"; cat "$f.cut"; } >"$f"
    rm -f "$f.cut"
  fi
  [[ -s $f ]] || rm -f "$f"
done
printf '%-34s %s after %ds (deadline %ss)\n' "result" "$( (( failed )) && echo FAIL || echo PASS)" \
  $(( SECONDS - start )) "$deadline" >>"$summary"
cat "$summary"
exit $failed
