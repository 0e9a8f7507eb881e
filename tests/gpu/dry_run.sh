#!/usr/bin/env bash
# The GPU check's dry runs (CI's gpu_bundle stage): they prove the check's logic on a machine without a GPU. A bundle
# from scripts/gpu-bundle.sh is unpacked in a fresh folder and run by its own scripts/gpu-run.sh in a clean
# environment (env -i: no PATH, no LD_LIBRARY_PATH, no build tree). Where this user may make a mount namespace
# (root, unshare), Open MPI's install folders, its daemon (orted, mpirun) and OpenBLAS's folder are hidden too, as on
# a GPU node that has none of them: the programs must run from the bundle's own libraries.
#
#   tests/gpu/dry_run.sh build-bundle/minidl-gpu.tar.xz
#
# 1. No GPU, none required: env, load and cpu_smoke pass; the probe and every GPU step say "no GPU"; the result is
#    NO GPU (never PASS), exit 3; at most 8 files of at most 16 MiB; under 90 s.
# 2. A fake GPU: an nvidia-smi on PATH names an H200 while CUDA sees none, with --require-gpu (the GPU node's mode):
#    environment BROKEN naming cudaGetDeviceCount, the probe ENV, every other GPU step blocked, no PASS anywhere on a
#    GPU step or in the result, a non-zero exit. The same with a gpu.* binary run by hand: it fails (69), not skips.
# 3. The order and the deadline: the steps come in the documented order (figures first); with a 1-second deadline
#    every step after env is skipped "out of time" and the summary still ends in a result; a run stopped by SIGTERM
#    keeps a summary that says CUT OFF, and its files.
set -euo pipefail

if (( $# != 1 )) || [[ ! -f $1 ]]; then
  echo "dry_run: expected the bundle's .tar.xz, got '${1:-}'" >&2
  exit 2
fi
bundle_tar="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$bundle_tar"
top="$work/minidl-gpu"

hide=()
if [[ $EUID == 0 ]] && unshare -m true 2>/dev/null; then
  cat >"$work/hide.sh" <<'EOF'
#!/bin/bash
set -e
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/openblas-openmp \
         /usr/share/openmpi /etc/openmpi; do
  if [[ -d $d ]]; then mount -t tmpfs none "$d"; fi
done
for f in /usr/bin/orted /usr/bin/orterun /usr/bin/mpirun /usr/bin/mpiexec; do
  if [[ -e $f ]]; then mount --bind /dev/null "$f"; fi
done
exec "$@"
EOF
  chmod +x "$work/hide.sh"
  hide=(unshare -m "$work/hide.sh")
  echo "dry_run: Open MPI's and OpenBLAS's folders and mpirun's daemon hidden (a mount namespace)"
else
  echo "dry_run: no mount namespace here (needs root and unshare): the system's Open MPI stays visible"
fi

fail() {
  echo "dry_run: FAIL ($scenario): $*" >&2
  cat "$report/summary.txt" >&2 2>/dev/null || true
  tail -n 40 "$report/tests.log" >&2 2>/dev/null || true
  exit 1
}
# run_check [ENV=VALUE...] -- ARGS...: gpu-run.sh from the bundle in a clean environment; sets rc and elapsed.
run_check() {
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  local t0=$SECONDS
  rc=0
  (cd / && "${hide[@]}" env -i "${vars[@]}" /bin/bash "$top/scripts/gpu-run.sh" "$@" "$report") >"$work/out.txt" 2>&1 || rc=$?
  elapsed=$(( SECONDS - t0 ))
}
summary_line() { grep -E "^$1 " "$report/summary.txt" || true; }
gpu_steps() { grep -Ev '^(environment|headline|result):|^(env|load|cpu_smoke) ' "$report/summary.txt" || true; }
check_files() {
  local files big
  files=$(find "$report" -type f | wc -l)
  (( files <= 8 )) || fail "$files files in OUTDIR (at most 8): $(cd "$report" && find . -type f | tr '\n' ' ')"
  big="$(find "$report" -type f -size +16M)"
  [[ -z $big ]] || fail "files over 16 MiB: $big"
}

# ---- 1. no GPU here, none required ----
scenario="no GPU"
report="$work/report-nogpu"
run_check --
summary="$report/summary.txt"
[[ -f $summary ]] || fail "no summary.txt"
(( rc == 3 )) || fail "gpu-run.sh exited $rc, expected 3 (NO GPU)"
head -n 1 "$summary" | grep -q '^environment: OK (no GPU here' || fail "first line: $(head -n 1 "$summary")"
for name in env load cpu_smoke; do
  summary_line "$name" | grep -Eq "^$name +PASS " || fail "step $name did not pass: $(summary_line "$name")"
done
summary_line probe | grep -Eq '^probe +skipped .*no GPU .*cudaGetDeviceCount' ||
  fail "the probe should skip naming cudaGetDeviceCount: $(summary_line probe)"
others="$(gpu_steps)"
(( $(wc -l <<<"$others") >= 10 )) || fail "summary.txt lists too few GPU steps: $others"
bad="$(grep -Ev ' skipped +- +no GPU' <<<"$others" || true)"
[[ -z $bad ]] || fail "GPU steps that did not skip with 'no GPU': $bad"
tail -n 1 "$summary" | grep -q '^result: NO GPU (nothing on a GPU was checked)' || fail "last line: $(tail -n 1 "$summary")"
grep -q 'PASS' <<<"$(tail -n 1 "$summary")" && fail "the result says PASS"
check_files
(( elapsed < 90 )) || fail "the run took ${elapsed}s (at most 90)"
order="$(awk 'NR > 1 && !/^(headline|result):/ { print $1 }' "$summary" | sed 's|/.*||' | uniq | paste -sd ' ')"
echo "dry_run: no GPU: passed in ${elapsed}s: $(wc -l <<<"$others") GPU steps skipped, $(find "$report" -type f | wc -l) files"
sed 's/^/  | /' "$summary"

# ---- 2. nvidia-smi claims an H200, CUDA sees none ----
scenario="fake GPU"
report="$work/report-fake"
mkdir -p "$work/fake-bin"
cat >"$work/fake-bin/nvidia-smi" <<'EOF'
#!/bin/sh
# A stand-in that names a GPU whatever it is asked, as a node whose driver is broken may.
case "$*" in
  *--query-gpu=name*) echo "NVIDIA H200" ;;
  *--query-gpu*) echo "NVIDIA H200, 9.0, 580.00, 143771 MiB, 1980 MHz, 3201 MHz, 700.00 W, Enabled" ;;
  *) echo "NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: 13.0"; echo "| 0  NVIDIA H200 |" ;;
esac
EOF
chmod +x "$work/fake-bin/nvidia-smi"
run_check "PATH=$work/fake-bin:/usr/bin:/bin" -- --require-gpu
summary="$report/summary.txt"
[[ -f $summary ]] || fail "no summary.txt"
(( rc != 0 )) || fail "gpu-run.sh exited 0"
head -n 1 "$summary" | grep -q '^environment: BROKEN (probe: .*cudaGetDeviceCount' || fail "first line: $(head -n 1 "$summary")"
summary_line probe | grep -Eq '^probe +ENV ' || fail "the probe is not ENV: $(summary_line probe)"
others="$(gpu_steps | grep -v '^probe ')"
bad="$(grep -Ev ' (blocked|FAIL|ENV) ' <<<"$others" || true)"
[[ -z $bad ]] || fail "GPU steps neither blocked nor failed: $bad"
grep -E ' PASS ' <<<"$(gpu_steps)" && fail "a GPU step says PASS"
tail -n 1 "$summary" | grep -q 'PASS' && fail "the result says PASS: $(tail -n 1 "$summary")"
check_files
# A gpu.* binary in the GPU node's mode fails, naming the error, instead of skipping every test.
trc=0
(cd / && env -i MINIDL_REQUIRE_GPU=1 LD_LIBRARY_PATH="$top/lib:/usr/local/cuda/lib64" \
  "$top/tests/test_tensor_core_gpu" >"$work/t.txt" 2>&1) || trc=$?
(( trc == 69 )) || fail "test_tensor_core_gpu with MINIDL_REQUIRE_GPU=1 exited $trc, expected 69: $(cat "$work/t.txt")"
grep -q 'cudaGetDeviceCount' "$work/t.txt" || fail "its message names no cudaGetDeviceCount error: $(cat "$work/t.txt")"
echo "dry_run: fake GPU: exit $rc, environment BROKEN, $(wc -l <<<"$others") GPU steps blocked or failed"
sed 's/^/  | /' "$summary"

# ---- 3. the step order, the deadline, a run cut off ----
scenario="order and deadline"
want="env probe load bench tensor_core kernels gpu_tests trace ncu sanitizer cpu_smoke"
[[ $order == "$want" ]] || fail "the steps ran in the order '$order', expected '$want'"
report="$work/report-deadline"
run_check MINIDL_GPU_DEADLINE=1 --
summary="$report/summary.txt"
late="$(awk 'NR > 1 && !/^(headline|result):/ && $1 != "env"' "$summary")"
bad="$(grep -Ev ' skipped +- +out of time \(deadline 1s\)' <<<"$late" || true)"
[[ -z $bad ]] || fail "steps after the deadline that ran: $bad"
grep -q 'out of time' <<<"$late" || fail "no step says out of time"
tail -n 1 "$summary" | grep -q '^result: ' || fail "no result line after the deadline"
report="$work/report-cut"
mkdir -p "$report"
# Stopped while a step runs (as a node's time limit would stop it): gpu-run.sh and the step's timeout. Without a GPU
# the run is over a few milliseconds after its probe, faster than a poll can catch it, so here the CPU smoke step's
# program lasts: bench_gpt_step (this scenario is the bundle's last use) starts for the load step's --help, and
# otherwise sleeps.
mv "$top/bin/bench_gpt_step" "$top/bin/bench_gpt_step.real"
printf '#!/bin/sh\n[ "$1" = --help ] && exit 0\nexec /bin/sleep 120\n' >"$top/bin/bench_gpt_step"
chmod +x "$top/bin/bench_gpt_step"
(cd / && "${hide[@]}" env -i /bin/bash "$top/scripts/gpu-run.sh" "$report" >/dev/null 2>&1) &
pid=$!
for _ in $(seq 600); do grep -q '^load ' "$report/summary.txt" 2>/dev/null && break; sleep 0.05; done
runner="$(pgrep -f "gpu-run.sh $report" | head -n 1 || true)"
[[ -n $runner ]] || fail "gpu-run.sh finished before it could be stopped"
grep -q '^cpu_smoke ' "$report/summary.txt" && fail "the CPU smoke step finished though its program sleeps"
pkill -TERM -P "$runner" 2>/dev/null || true
kill -TERM "$runner" 2>/dev/null || true
crc=0
wait "$pid" || crc=$?
tail -n 1 "$report/summary.txt" | grep -q '^result: CUT OFF by SIGTERM' || fail "after SIGTERM: $(tail -n 1 "$report/summary.txt")"
grep -q '^env ' "$report/summary.txt" || fail "the cut-off summary lost the steps that finished"
check_files
echo "dry_run: order and deadline: '$order'; a 1 s deadline skips $(grep -c 'out of time' <<<"$late") steps; SIGTERM leaves a CUT OFF summary (exit $crc)"
