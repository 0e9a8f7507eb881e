#!/usr/bin/env bash
# The GPU check, run on a GPU node from an unpacked bundle (scripts/gpu-bundle.sh), with nothing installed:
#
#   tar xf minidl-gpu.tar.xz && minidl-gpu/scripts/gpu-run.sh --require-gpu /tmp/report
#   minidl-gpu/scripts/gpu-run.sh --require-gpu --only kernels,sanitizer/memcheck /tmp/again   # a second call
#
# It fails closed: a step passes only when it ran on a GPU and its tests passed there. It finds the CUDA libraries
# (the toolkit, the system, or the nvidia-* wheels of a Python's site-packages, /opt/*/.venv included) and runs,
# under one deadline, figures first:
#   env          env.txt: OS, glibc, the GPU by nvidia-smi (every call under a 10 s timeout), each CUDA library
#                found and the nvidia_* wheels it came from
#   probe        gpu_probe --ceilings: driver and runtime versions, the device, one bf16 cuBLASLt GEMM against the
#                CPU, cuDNN's and NCCL's versions, the libraries really loaded, the measured bf16 8192^3 GEMM and
#                device-to-device copy ceilings (appended to env.txt). Every GPU step needs it to pass.
#   load         every program and test binary starts (its libraries resolve). A loader error here or in the
#                probe means the bundle does not fit this system: the run says so at once (scripts/gpu-build-there.sh
#                builds on the node instead)
#   bench        GPT-2 124M (B 16, T 1024, bf16): bench_gpt_step eager and --cuda-graph, interleaved with
#                bench/torch_gpt_step.py (PyTorch eager and torch.compile) in two rounds; min/median/max ms/step,
#                tokens/s, MFU against the datasheet and the measured peak, the clocks meanwhile, the roofline;
#                the ratio minidl / PyTorch is the summary's headline
#   tensor_core  mma, ldmatrix and cp.async on silicon (test_tensor_core_gpu)
#   kernels      every hand-written kernel against the CPU op (test_cuda_kernels_gpu)
#   gpu_tests/*  every other gpu.* binary
#   trace        train_gpt --trace on the GPT-2 124M configuration (Tiny Shakespeare, GPT-2 BPE): each block's
#                forward and backward device time (profile.txt), the trace in trace/rank0.json
#   ncu          where Nsight Compute works: per-kernel device times of one GPT-2 step, top 15 (profile.txt)
#   sanitizer/*  compute-sanitizer memcheck, racecheck and synccheck on the kernels' small shapes, and initcheck
#                with the tests' 0xFF fill off (MINIDL_TEST_NO_POISON=1); each 60 s at most, blocked when the
#                kernels' plain run failed
#   cpu_smoke    a two-step CPU training run (a world of one, no mpirun)
#
# Each step is tagged PASS, FAIL, TIMEOUT, ENV (a loader error, exit 127, no CUDA device, a library that cannot
# be opened), blocked (a step it needs did not pass), or skipped (no GPU here and none required, out of time, a
# tool missing). summary.txt is rewritten after every step, so a run cut off still holds what it measured:
#   environment: OK | BROKEN (<what>)
#   headline: minidl / PyTorch ...            (once the benchmark has run)
#   <step>  <tag>  <seconds>  <note>          (one line a step)
#   result: PASS | FAIL | NO GPU (nothing on a GPU was checked) | BROKEN ENVIRONMENT | CUT OFF
# OUTDIR gets at most 7 files, each cut to its last 16 MiB: summary.txt env.txt bench.txt (the table) tests.log
# (every program's output, the benchmarks' too) sanitizer.log profile.txt trace/rank0.json; gpu-build-there.sh
# adds build-there.log.
#
#   --require-gpu     the mode for a GPU node: a GPU that cannot be used is a broken environment, never a skip
#                     (the gpu.* binaries then fail instead of skipping without a device: MINIDL_REQUIRE_GPU=1)
#   --only LIST       run only these steps (comma-separated names or prefixes: bench,kernels,sanitizer/initcheck);
#                     probe always runs
#   MINIDL_GPU_DEADLINE=330      seconds for the whole check
#   MINIDL_GPU_BENCH_STEPS=50    timed steps per benchmark series (split over the two rounds)
#   MINIDL_GPU_GTEST_FILTER=...  a --gtest_filter for the test steps (rerun what failed, with full output)
#
# Exit status: 0 PASS; 1 FAIL; 2 bad usage; 3 NO GPU; 4 BROKEN ENVIRONMENT; 5 CUT OFF by a signal.
set -uo pipefail

usage() { sed -n '2,46p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
require_gpu=0 only="" outdir=""
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --require-gpu) require_gpu=1 ;;
    --only)
      [[ $# -ge 2 && -n $2 ]] || { echo "gpu-run: --only: expected a comma-separated list of steps" >&2; exit 2; }
      only="$2"; shift ;;
    -*) echo "gpu-run: unknown option '$1' (expected --require-gpu, --only LIST, OUTDIR or --help)" >&2; exit 2 ;;
    *)
      [[ -z $outdir ]] || { echo "gpu-run: expected one OUTDIR, got '$outdir' and '$1'" >&2; exit 2; }
      outdir="$1" ;;
  esac
  shift
done
[[ -n $outdir ]] || { echo "gpu-run: expected OUTDIR, the folder for the report (gpu-run.sh --help)" >&2; exit 2; }
for var in MINIDL_GPU_DEADLINE MINIDL_GPU_BENCH_STEPS; do
  if [[ -n "${!var:-}" && ! "${!var}" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu-run: $var: expected a positive whole number, got '${!var}'" >&2
    exit 2
  fi
done
deadline="${MINIDL_GPU_DEADLINE:-330}"
bench_steps="${MINIDL_GPU_BENCH_STEPS:-50}"

bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -d "$bundle/tests" || ! -d "$bundle/lib" || ! -d "$bundle/bin" ]]; then
  echo "gpu-run: $bundle is not an unpacked bundle (no bin/, tests/ or lib/); make one with scripts/gpu-bundle.sh" >&2
  exit 2
fi
mkdir -p "$outdir" || { echo "gpu-run: cannot create OUTDIR '$outdir'" >&2; exit 2; }
out="$(cd "$outdir" && pwd)"
start=$SECONDS
export PATH="${PATH:-/usr/bin:/bin}:/usr/local/cuda/bin:/usr/bin:/bin"
[[ -n "${CUDA_HOME:-}" ]] && PATH="$CUDA_HOME/bin:$PATH"
work="$(mktemp -d)"
summary="$out/summary.txt" env_txt="$out/env.txt" bench_txt="$out/bench.txt"
tests_log="$out/tests.log" bench_log="$out/tests.log" sanitizer_log="$out/sanitizer.log" profile_txt="$out/profile.txt"
rm -rf "$out/trace"
for f in "$summary" "$env_txt" "$bench_txt" "$tests_log" "$sanitizer_log" "$profile_txt"; do : >"$f"; done
rm -f "$out/bench.log"

# ---- the summary, rewritten whole after every step ----
lines=()            # one per step: "name|tag|seconds|note"
declare -A tag_of=()
headline="" result_override=""
no_gpu_reason=""    # set when there is no GPU here and none is required: GPU steps skip
env_broken=""       # what broke the environment (the first ENV step)
render() {
  local env_line="environment: OK" l name tag secs note ran_gpu=0 failed=0 out_of_time=0
  if [[ -n $env_broken ]]; then env_line="environment: BROKEN ($env_broken)"
  elif [[ -n $no_gpu_reason ]]; then env_line="environment: OK (no GPU here: $no_gpu_reason; the CPU steps only)"
  fi
  {
    echo "$env_line"
    [[ -n $headline ]] && echo "headline: $headline"
    for l in "${lines[@]}"; do
      IFS='|' read -r name tag secs note <<<"$l"
      printf '%-34s %-8s %5s  %s\n' "$name" "$tag" "$secs" "$note"
      case "$tag" in PASS|FAIL|TIMEOUT) [[ " $cpu_steps " == *" $name "* ]] || ran_gpu=1 ;; esac
      case "$tag" in FAIL|TIMEOUT|ENV) failed=1 ;; esac
      [[ $note == "out of time"* ]] && out_of_time=$(( out_of_time + 1 ))
    done
    local result
    if [[ -n $result_override ]]; then result="$result_override"
    elif [[ -n $env_broken ]]; then result="BROKEN ENVIRONMENT ($env_broken; nothing on a GPU was checked)"
    elif (( ! ran_gpu && failed )); then result="FAIL (and nothing on a GPU was checked)"
    elif (( ! ran_gpu )); then result="NO GPU (nothing on a GPU was checked)"
    elif (( failed )); then result="FAIL"
    elif (( out_of_time )); then result="PASS ($out_of_time steps not run: out of time)"
    else result="PASS"
    fi
    printf 'result: %s after %ds (deadline %ss)\n' "$result" $(( SECONDS - start )) "$deadline"
  } >"$summary.part"
  mv "$summary.part" "$summary"
}
exit_code() {
  local last
  last="$(tail -n 1 "$summary")"
  case "$last" in
    "result: PASS"*) echo 0 ;; "result: NO GPU"*) echo 3 ;; "result: BROKEN"*) echo 4 ;; "result: CUT OFF"*) echo 5 ;;
    *) echo 1 ;;
  esac
}
record() {  # record NAME TAG SECONDS NOTE
  lines+=("$1|$2|$3|$4")
  tag_of[$1]="$2"
  render
  printf '%-34s %-8s %5s  %s\n' "$1" "$2" "$3" "$4"
}
cpu_steps="env load cpu_smoke"

# A cut-off run (the node's time limit, Ctrl-C) keeps its summary, says so, and still trims its files.
finish() {
  local f
  for f in "$env_txt" "$bench_txt" "$tests_log" "$sanitizer_log" "$profile_txt"; do
    if [[ -f $f ]] && (( $(stat -c %s "$f") > 16 * 1048576 )); then
      tail -c $(( 16 * 1048576 - 100 )) "$f" >"$f.cut" && { echo "[cut to its last 16 MiB]"; cat "$f.cut"; } >"$f"
      rm -f "$f.cut"
    fi
    [[ -f $f && ! -s $f ]] && rm -f "$f"
  done
  rm -rf "$work"
}
on_signal() {
  result_override="CUT OFF by $1"
  render
  finish
  cat "$summary"
  exit 5
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT

selected() {  # selected NAME: is NAME in --only (by name or prefix)?
  [[ -z $only ]] && return 0
  local s
  IFS=',' read -ra picks <<<"$only"
  for s in "${picks[@]}"; do [[ $1 == "$s" || $1 == "$s"/* || $1 == "$s"* ]] && return 0; done
  return 1
}

# ---- the CUDA libraries: the toolkit, the system, or Python's nvidia-* wheels ----
python_candidates() {
  compgen -G '/opt/*/.venv/bin/python3'; compgen -G '/opt/*/bin/python3'
  local py
  for py in python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python; do
    command -v "$py" 2>/dev/null
  done
}
python_site_dirs() {
  local py
  while read -r py; do
    [[ -x $py ]] || continue
    timeout 20 "$py" -c 'import site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]: print(d)' 2>/dev/null
  done < <(python_candidates | awk '!seen[$0]++')
  compgen -G '/opt/*/.venv/lib/python3*/site-packages'; compgen -G '/usr/local/lib/python3*/dist-packages'
  compgen -G '/usr/lib/python3*/dist-packages'; compgen -G '/opt/conda/lib/python3*/site-packages'
  compgen -G "${HOME:-/root}/.local/lib/python3*/site-packages"
}
mapfile -t site_dirs < <(python_site_dirs 2>/dev/null | awk '!seen[$0]++' | while read -r d; do [[ -d $d ]] && echo "$d"; done)
candidate_dirs() {
  local d
  for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64; do
    [[ -d $d ]] && echo "$d"
  done
  for d in "${site_dirs[@]}"; do
    [[ -d $d/nvidia ]] && { compgen -G "$d/nvidia/*/lib"; compgen -G "$d/nvidia/*/*/lib"; }
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

# nvidia-smi, never without a timeout (a wedged driver makes it hang).
smi_state="not found" gpu_name=""
smi() { timeout 10 nvidia-smi "$@"; }
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name="$(smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
  rc=${PIPESTATUS[0]}
  if (( rc == 124 )); then smi_state="did not answer within 10 s"
  elif [[ -n $gpu_name ]]; then smi_state="lists $gpu_name"
  else smi_state="lists no GPU (exit $rc)"
  fi
fi
gpu_expected=$require_gpu
[[ -n $gpu_name || $smi_state == "did not answer"* ]] && gpu_expected=1

# ---- steps ----
# classify RC LOGFILE OFFSET: the tag of a finished command from its exit status and what it printed.
classify() {
  local rc="$1" text
  text="$(tail -c +$(( $3 + 1 )) "$2" 2>/dev/null | tail -c 200000)"
  if (( rc == 124 || rc == 137 )); then echo TIMEOUT
  elif (( rc == 127 || rc == 126 || rc == 69 )) ||
       grep -Eq 'error while loading shared libraries|cannot open shared object file|MINIDL_REQUIRE_GPU=1 and no CUDA device|version .GLIBC_[0-9.]+. not found' <<<"$text"; then
    echo ENV
  elif (( rc == 0 )); then echo PASS
  else echo FAIL
  fi
}
# env_reason LOGFILE OFFSET: the first line that says why the environment is broken.
env_reason() {
  tail -c +$(( $2 + 1 )) "$1" 2>/dev/null |
    grep -Em1 'error while loading shared libraries|cannot open shared object|GLIBC_|no CUDA device|environment: *BROKEN|not installed|sees no CUDA|: not found' |
    sed 's/^environment: *BROKEN (//; s/)$//' | cut -c1-160
}
# counts LOGFILE OFFSET: GoogleTest's totals, "N passed, M skipped, K failed".
counts() {
  tail -c +$(( $2 + 1 )) "$1" | awk '
    /^\[  PASSED  \] [0-9]+ test/ { p += $4 }
    /^\[  SKIPPED \] [0-9]+ test/ { s += $4 }
    /^\[  FAILED  \] [0-9]+ test/ { f += $4 }
    END { if (p + s + f > 0) printf "%d passed, %d skipped, %d failed", p, s, f }'
}

# step NAME CAP NEEDS LOG COMMAND...: NEEDS is "any", or a space-separated list of steps that must have passed
# ("probe" for anything on the GPU). Runs COMMAND under the cap and the deadline, appends its output to LOG, and
# records the step.
step() {
  local name="$1" cap="$2" needs="$3" log="$4" n
  shift 4
  selected "$name" || [[ $name == probe ]] || return 0
  local left=$(( deadline - (SECONDS - start) ))
  if (( left < 5 )); then record "$name" skipped - "out of time (deadline ${deadline}s)"; return 0; fi
  if [[ $needs != any ]]; then
    if [[ -n $no_gpu_reason && " $needs " == *" probe "* ]]; then record "$name" skipped - "no GPU"; return 0; fi
    for n in $needs; do
      if [[ ${tag_of[$n]:-} != PASS ]]; then
        record "$name" blocked - "needs $n (${tag_of[$n]:-not run})"
        return 0
      fi
    done
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
  local tag note c
  tag="$(classify "$rc" "$log" "$before")"
  c="$(counts "$log" "$before")"
  note="exit $rc${c:+; $c}"
  [[ $tag == TIMEOUT ]] && note="timed out after ${cap}s${c:+; $c}"
  if [[ $tag == PASS && -n $c ]] && awk -v c="$c" 'BEGIN { split(c, a, " "); exit !(a[1] == 0) }'; then
    tag=FAIL note="$note: no test ran on the GPU (all skipped)"
  fi
  (( rc == 86 )) && note="$note: compute-sanitizer reported errors"
  if [[ $tag == ENV ]]; then
    local why
    why="$(env_reason "$log" "$before")"
    note="$note: ${why:-see $(basename "$log")}"
    [[ -n $env_broken ]] || env_broken="$name: ${why:-exit $rc}"
  fi
  record "$name" "$tag" $(( SECONDS - t0 )) "$note"
  return 0
}

# ---- env.txt ----
{
  echo "minidl gpu-run, $(date -u +%Y-%m-%dT%H:%M:%SZ), deadline ${deadline}s$( (( require_gpu )) && echo ', --require-gpu')"
  echo "host: $(uname -n) $(uname -sr), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}" || echo unknown)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "nvidia-smi: $smi_state"
  if [[ -n $gpu_name ]]; then
    smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.memory,power.limit,persistence_mode \
      --format=csv 2>&1
    smi 2>&1 | sed -n '1,4p'
  fi
  echo "libraries found:"
  printf '  %s\n' "${lib_report[@]}"
  echo "python site-packages searched: ${site_dirs[*]:-none}"
  echo "nvidia wheels (dist-info):"
  for d in "${site_dirs[@]}"; do
    for w in "$d"/nvidia_*.dist-info "$d"/torch-*.dist-info "$d"/triton-*.dist-info; do
      [[ -d $w ]] && echo "  $(basename "$w" .dist-info)  ($d)"
    done
  done
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "compute-sanitizer: $(command -v compute-sanitizer || echo 'not found')"
  echo "ncu: $(command -v ncu || echo 'not found')"
  echo "bundle:"
  sed 's/^/  /' "$bundle/manifest.txt" 2>/dev/null | head -n 12
  echo "ldd misses (bundle programs and tests, with the library path above):"
  misses="$(for f in "$bundle"/bin/* "$bundle"/tests/*; do ldd "$f" 2>&1 | awk -v f="${f#"$bundle/"}" '/not found/ { print "  " f ": " $1 }'; done | sort -u)"
  echo "${misses:-  none}"
} >"$env_txt" 2>&1
record env PASS $(( SECONDS - start )) "nvidia-smi $smi_state"

# A mismatch between the bundle and this system shows in the probe or the load step, within seconds: said at
# once, and on the step's line.
note_mismatch() {  # note_mismatch LOG OFFSET
  if tail -c +$(( $2 + 1 )) "$1" | grep -Eq 'error while loading shared libraries|GLIBC_[0-9.]+. not found|cannot open shared object'; then
    echo "gpu-run: the bundle's programs do not load on this system (see $(basename "$1"));" \
      "scripts/gpu-build-there.sh builds the GPU targets here instead" >&2
    lines[${#lines[@]}-1]+="; the bundle does not load here: run scripts/gpu-build-there.sh"
    render
  fi
}

# The probe: ENV when no device is seen. Without a GPU here and none required, that is a machine without a GPU.
probe_offset=$(stat -c %s "$env_txt")
echo "probe:" >>"$env_txt"
"$bundle/bin/gpu_probe" --help >/dev/null 2>&1 || true
step probe 20 any "$env_txt" "$bundle/bin/gpu_probe" --ceilings
note_mismatch "$env_txt" "$probe_offset"
if [[ ${tag_of[probe]} == ENV && $gpu_expected == 0 ]] && tail -c +$(( probe_offset + 1 )) "$env_txt" | grep -q 'no CUDA device'; then
  no_gpu_reason="$(env_reason "$env_txt" "$probe_offset")"
  no_gpu_reason="${no_gpu_reason:-the probe found none}; nvidia-smi $smi_state"
  env_broken=""
  lines[${#lines[@]}-1]="probe|skipped|-|no GPU ($no_gpu_reason)"
  tag_of[probe]=skipped
  render
fi
measured_tflops="$(awk '/^gemm_bf16_8192_tflops:/ { print $2 }' "$env_txt")"
export MINIDL_REQUIRE_GPU=1  # a gpu.* binary that sees no device from here on fails (69), it does not skip

# Every binary starts (its libraries load) and lists its tests or its flags.
load_all() {
  local f rc=0
  for f in "$bundle"/tests/*; do "$f" --gtest_list_tests >/dev/null || { echo "does not start: $f"; rc=1; }; done
  for f in "$bundle"/bin/*; do "$f" --help >/dev/null || { echo "does not start: $f"; rc=1; }; done
  return $rc
}
export bundle bench_steps bench_txt bench_log gpu_name work measured_tflops out profile_txt
export -f load_all
load_offset=$(stat -c %s "$tests_log")
step load 30 any "$tests_log" load_all
note_mismatch "$tests_log" "$load_offset"

# ---- the benchmark: minidl beside PyTorch on the same card, interleaved ----
export GPT2_FLAGS="--layers 12 --heads 12 --embd 768 --seq 1024 --batch 16 --vocab 50257 --amp bf16"
torch_python() {
  local py
  while read -r py; do
    [[ -x $py ]] && timeout 60 "$py" -c 'import torch' 2>/dev/null && { echo "$py"; return 0; }
  done < <(python_candidates | awk '!seen[$0]++')
  return 1
}
export -f torch_python python_candidates
# series_stats FILE...: "min median max n" over the ms_steps arrays of the JSON files.
series_stats() {
  cat "$@" 2>/dev/null | grep -o '"ms_steps": \[[^]]*\]' | sed 's/.*\[//; s/\]//' | tr ',' '\n' | sed 's/ //g' |
    grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f %.2f %.2f %d", v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR], NR }'
}
json_field() { grep -o "\"$2\": [^,}]*" "$1" 2>/dev/null | head -n 1 | sed 's/.*: //; s/"//g'; }
export -f series_stats json_field
# The torch JSON holds both modes; split them into one file per mode with its ms_steps.
torch_split() {  # torch_split JSON MODE -> the mode's object
  local py="$1" file="$2" mode="$3"
  "$py" -c 'import json, sys
r = json.load(open(sys.argv[1]))
for m in r["modes"]:
    if m["mode"] == sys.argv[2]:
        print(json.dumps(m))' "$file" "$mode" 2>/dev/null
}
export -f torch_split
bench_results() {  # rewrites bench.txt from what the rounds have produced so far
  local py="${1:-}" peak tokens=$(( 16 * 1024 )) label files s median gflops_tf
  peak="$(json_field "$work/minidl-eager-1.json" peak_tflops)"
  {
    echo "GPT-2 124M, B 16, T 1024, bf16, $(( bench_steps / 2 )) timed steps a series a round after 10 warm-up steps, two rounds interleaved"
    echo "device: ${gpu_name:-unknown}; datasheet bf16 peak ${peak:-?} TFLOP/s; measured bf16 8192^3 GEMM ${measured_tflops:-?} TFLOP/s"
    printf '%-22s %8s %8s %8s %4s %10s %8s %10s  %s\n' series min median max n tokens/s MFU 'MFU(meas)' loss
    for label in minidl-eager minidl-cuda-graph torch-eager torch-compile; do
      files=("$work/$label"-[12].json)
      s="$(series_stats "${files[@]}")"
      if [[ -z $s ]]; then printf '%-22s %s\n' "$label" "$(cat "$work/$label.why" 2>/dev/null || echo 'not run')"; continue; fi
      read -r mn md mx n <<<"$s"
      # TFLOP/s at the pooled median: each run's own rate times its median over the pooled one.
      local f1="${files[0]}" rate run_median
      [[ -f $f1 ]] || f1="${files[1]}"
      run_median="$(json_field "$f1" ms_per_step)"
      rate="$(json_field "$f1" gflops)"; [[ -n $rate ]] && rate="$(awk -v g="$rate" 'BEGIN { print g / 1000 }')"
      [[ -z $rate ]] && rate="$(json_field "$f1" tflops)"
      awk -v l="$label" -v mn="$mn" -v md="$md" -v mx="$mx" -v n="$n" -v t="$tokens" -v r="$rate" -v rm="$run_median" \
          -v p="${peak:-0}" -v m="${measured_tflops:-0}" -v lf="$(json_field "$f1" loss_first)" -v ll="$(json_field "$f1" loss_last)" '
        BEGIN { tf = r * rm / md
                printf "%-22s %8.2f %8.2f %8.2f %4d %10.0f %7.1f%% %9s  %.4f -> %.4f\n", l, mn, md, mx, n, t / md * 1000,
                       (p > 0 ? 100 * tf / p : 0), (m > 0 ? sprintf("%.1f%%", 100 * tf / m) : "-"), lf, ll }'
      echo "$label $md" >>"$work/medians.part"
    done
    [[ -f "$work/medians.part" ]] && mv "$work/medians.part" "$work/medians"
    [[ -s "$work/clocks.csv" ]] && {
      echo "clocks during the benchmark (nvidia-smi every 0.5 s: min / median / max):"
      awk -F', *' 'NF >= 5 && $2 + 0 > 0 { sm[++n] = $2; mem[n] = $3; pw[n] = $4; tp[n] = $5 }
        function q(a, k,   i, j, t, s) { for (i = 1; i <= n; i++) s[i] = a[i]; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (s[j] + 0 < s[i] + 0) { t = s[i]; s[i] = s[j]; s[j] = t }
                                          return s[1] " / " s[int((n + 1) / 2)] " / " s[n] }
        END { if (n) { print "  SM MHz " q(sm) "; memory MHz " q(mem) "; power W " q(pw) "; temperature C " q(tp) " (" n " samples)" } }' "$work/clocks.csv"
    }
    [[ -s "$work/roofline.txt" ]] && cat "$work/roofline.txt"
  } >"$bench_txt.part"
  mv "$bench_txt.part" "$bench_txt"
}
export -f bench_results
minidl_run() {  # minidl_run LABEL ROUND FLAGS...
  local label="$1" round="$2"
  shift 2
  echo "----- $label, round $round"
  timeout 120 "$bundle/bin/bench_gpt_step" --device cuda --same-batch --warmup 10 --steps $(( bench_steps / 2 )) \
    --json-out "$work/$label-$round.json" $GPT2_FLAGS "$@"
  local rc=$?
  (( rc == 0 )) || echo "exit $rc" >"$work/$label.why"
  return $rc
}
torch_run() {  # torch_run PYTHON ROUND
  local py="$1" round="$2" m
  echo "----- torch, round $round ($py)"
  timeout 240 "$py" "$bundle/bench/torch_gpt_step.py" --warmup 10 --steps $(( bench_steps / 2 )) \
    ${measured_tflops:+--measured-tflops "$measured_tflops"} --json-out "$work/torch-$round.json"
  local rc=$?
  if (( rc != 0 )); then
    echo "exit $rc (bench.log)" >"$work/torch-eager.why"; cp "$work/torch-eager.why" "$work/torch-compile.why"
    return 0  # PyTorch's failure is reported beside minidl's figures, not as minidl's
  fi
  for m in eager compile; do torch_split "$py" "$work/torch-$round.json" "$m" >"$work/torch-$m-$round.json"; done
}
export -f minidl_run torch_run
bench_all() {
  local py rc=0 clocks_pid=""
  py="$(torch_python)" || { py=""; echo "no Python with PyTorch found" >"$work/torch-eager.why"; cp "$work/torch-eager.why" "$work/torch-compile.why"; }
  if command -v nvidia-smi >/dev/null; then
    timeout 600 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
      --format=csv,noheader,nounits -lms 500 >"$work/clocks.csv" 2>/dev/null &
    clocks_pid=$!
  fi
  minidl_run minidl-eager 1 || rc=1; bench_results "$py"
  [[ -n $py ]] && { torch_run "$py" 1; bench_results "$py"; }
  minidl_run minidl-cuda-graph 1 --cuda-graph || rc=1; bench_results "$py"
  minidl_run minidl-cuda-graph 2 --cuda-graph || rc=1; bench_results "$py"
  [[ -n $py ]] && { torch_run "$py" 2; bench_results "$py"; }
  minidl_run minidl-eager 2 || rc=1
  [[ -n $clocks_pid ]] && kill "$clocks_pid" 2>/dev/null
  local roof_gpu=""
  case "$gpu_name" in *H200*) roof_gpu=H200 ;; *H100*) roof_gpu=H100 ;; *A100*) roof_gpu=A100 ;; esac
  [[ -n $roof_gpu ]] && echo "roofline ($roof_gpu datasheet): $("$bundle/bin/bench_gpu_roofline" --gpu "$roof_gpu" \
    $GPT2_FLAGS 2>&1 | tail -n 1)" >"$work/roofline.txt"
  bench_results "$py"
  # The loss must fall on the repeated batch, in every minidl series.
  local f first last
  for f in "$work"/minidl-*.json; do
    first="$(json_field "$f" loss_first)" last="$(json_field "$f" loss_last)"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a == a + 0 && b == b + 0 && a < 1e30 && b < a) }' ||
      { echo "$(basename "$f"): the loss does not fall or is not finite ($first -> $last)"; rc=1; }
  done
  return $rc
}
export -f bench_all
step bench 300 probe "$bench_log" bench_all
if [[ -s "$work/medians" ]]; then
  headline="$(awk '{ m[$1] = $2 } END {
    s = "minidl / PyTorch ms per GPT-2 124M step (B 16, T 1024, bf16):"
    if (m["torch-eager"] > 0 && m["minidl-eager"] > 0) s = s sprintf(" eager %.2fx (%.1f / %.1f ms)", m["minidl-eager"] / m["torch-eager"], m["minidl-eager"], m["torch-eager"])
    if (m["torch-compile"] > 0 && m["minidl-cuda-graph"] > 0) s = s sprintf(", minidl cuda-graph / torch.compile %.2fx (%.1f / %.1f ms)", m["minidl-cuda-graph"] / m["torch-compile"], m["minidl-cuda-graph"], m["torch-compile"])
    if (!(m["torch-eager"] > 0)) s = s sprintf(" no PyTorch figure (minidl eager %.1f ms, cuda-graph %.1f ms)", m["minidl-eager"], m["minidl-cuda-graph"])
    print s }' "$work/medians")"
  render
fi

# ---- correctness on silicon ----
gtest=(--gtest_brief=1 --gtest_color=no)
[[ -n ${MINIDL_GPU_GTEST_FILTER:-} ]] && gtest+=("--gtest_filter=$MINIDL_GPU_GTEST_FILTER")
step tensor_core 60 probe "$tests_log" "$bundle/tests/test_tensor_core_gpu" "${gtest[@]}"
step kernels 150 probe "$tests_log" "$bundle/tests/test_cuda_kernels_gpu" "${gtest[@]}"
for t in "$bundle"/tests/test_*_gpu; do
  case "$(basename "$t")" in test_tensor_core_gpu|test_cuda_kernels_gpu) continue ;; esac
  step "gpu_tests/$(basename "$t")" 90 probe "$tests_log" "$t" "${gtest[@]}"
done

# ---- where the time goes ----
find_python() {
  local py
  while read -r py; do [[ -x $py ]] && { echo "$py"; return 0; }; done < <(python_candidates | awk '!seen[$0]++')
  return 1
}
export -f find_python
trace_run() {
  "$bundle/bin/train_gpt" --device cuda --data "$bundle/data/tinyshakespeare.txt" --tokenizer gpt2 \
    --gpt2-encoding "$bundle/data/gpt2.tiktoken" --layers 12 --heads 12 --embd 768 --seq 1024 --batch 16 --amp bf16 \
    --steps 6 --log-every 1 --eval-windows 2 --trace "$out/trace" || return
  grep -o '"device [0-9]*: [a-z ]*stream"' "$out/trace/rank0.json" | sort -u
  grep -q '"device 0: compute stream"' "$out/trace/rank0.json" ||
    { echo "trace: no device track in $out/trace/rank0.json"; return 1; }
  local py
  if py="$(find_python)"; then
    { echo "===== each block's device time (train_gpt --trace, GPT-2 124M, B 16, T 1024, bf16; the first step left out)"
      "$py" "$bundle/scripts/gpu_profile.py" blocks "$out/trace/rank0.json"; } >>"$profile_txt"
  else
    echo "no Python here: the block times are not summarised (open trace/rank0.json in https://ui.perfetto.dev)" >>"$profile_txt"
  fi
}
export -f trace_run
step trace 120 probe "$tests_log" trace_run

ncu_run() {
  local ncu csv="$work/ncu.csv" py
  ncu="$(command -v ncu)" || { echo "ncu not found"; return 3; }
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --page raw --log-file "$csv" \
    "$bundle/bin/bench_gpt_step" --device cuda --warmup 0 --steps 1 --same-batch $GPT2_FLAGS
  local rc=$?
  if ! grep -q 'gpu__time_duration' "$csv" 2>/dev/null; then
    echo "===== per-kernel times: ncu could not profile here (exit $rc): $(grep -m1 -E 'ERR|ERROR|error' "$csv" 2>/dev/null)" >>"$profile_txt"
    return 3
  fi
  py="$(find_python)" || { echo "no Python to read ncu's CSV" >>"$profile_txt"; return 3; }
  { echo "===== per-kernel device times of one GPT-2 124M step (ncu --clock-control none), top 15"
    "$py" "$bundle/scripts/gpu_profile.py" kernels "$csv" --top 15; } >>"$profile_txt"
}
export -f ncu_run
# needs_tool NAME TOOL: true when the step can go to step() (which says no GPU, blocked or out of time); otherwise
# the GPU is there but the tool is not, and the step is recorded as skipped.
needs_tool() {
  [[ ${tag_of[probe]:-} != PASS ]] && return 0
  command -v "$2" >/dev/null 2>&1 && return 0
  selected "$1" && record "$1" skipped - "$2 not found"
  return 1
}
if needs_tool ncu ncu; then
  step ncu 120 probe "$tests_log" ncu_run
  if [[ ${tag_of[ncu]:-} == FAIL ]] && grep -q 'ncu could not profile here\|ncu not found' "$profile_txt" 2>/dev/null; then
    lines[${#lines[@]}-1]="ncu|skipped|-|ncu cannot profile on this machine (profile.txt says why)"
    tag_of[ncu]=skipped
    render
  fi
else
  echo "===== per-kernel times: ncu not found on this machine" >>"$profile_txt"
fi

# ---- sanitizers: small shapes, each tool 60 s at most, only over kernels that pass plainly ----
small_shapes='--gtest_filter=-GpuShapes/*:FlashAttentionGrid.*'
sanitize() {  # sanitize TOOL: exit 86 when the tool reports an error
  local tool="$1"
  if [[ $tool == initcheck ]]; then export MINIDL_TEST_NO_POISON=1; fi
  compute-sanitizer --tool "$tool" --error-exitcode 86 --print-limit 20 \
    "$bundle/tests/test_cuda_kernels_gpu" "$small_shapes" --gtest_brief=1 --gtest_color=no
}
export small_shapes
export -f sanitize
for tool in memcheck racecheck synccheck initcheck; do
  needs_tool "sanitizer/$tool" compute-sanitizer && step "sanitizer/$tool" 60 "probe kernels" "$sanitizer_log" sanitize "$tool"
done

step cpu_smoke 60 any "$tests_log" "$bundle/bin/bench_gpt_step" --device cpu --layers 1 --heads 2 --embd 32 --seq 16 \
  --batch 2 --steps 2 --warmup 1 --threads 2

trap - TERM INT
render
finish
cat "$summary"
exit "$(exit_code)"
