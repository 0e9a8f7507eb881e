#!/usr/bin/env bash
# Mutation testing by hand: plants each bug of a curated list (below) in the source, one at a time, builds with the
# compiler cache, runs the tests that exist to see it, and puts the source back. A mutant is caught when a test
# fails (or the build does: a mutant that no longer compiles is listed as such, and the list needs mending).
#
#   scripts/mutants.sh              # every mutant; prints caught/total and the survivors
#   scripts/mutants.sh --list       # the list, one line each
#   scripts/mutants.sh ring ddp     # only the mutants whose names are given
#
# Not part of CI (a mutant costs a rebuild and its tests: about 30 minutes for the list on 2 cores); run it before
# closing a test issue and after large changes. MINIDL_BUILD_DIR names the build tree (default build: the Release
# tree with the emulated CUDA backend that scripts/test.sh and CI's test stage configure). Sources are restored
# from a copy taken before each mutation, also when the script is interrupted; uncommitted changes are safe.
#
# Each mutant is three lines and a blank one:
#   name ; file ; ctest arguments (the tests that exist to see it) ; what the bug is
#   - the exact text to replace (once in the file; \n for a newline)
#   + its replacement
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
build_dir="${MINIDL_BUILD_DIR:-build}"

mutants() {
  cat <<'EOF'
ring ; dist/ring_backend.cpp ; -R ^test_dist\.np|^test_dist_cuda\.np ; the ring's reduce-scatter reads the wrong chunk index (off by one)
- schedule.steps.push_back({mod(rank - s - 2, n), true});
+ schedule.steps.push_back({mod(rank - s - 1, n), true});

ddp_sum ; dist/ddp.cpp ; -R ^test_ddp\.np|DataParallel ; DDP sums the gradients instead of averaging them
- return g.all_reduce(bucket, ReduceOp::kAvg);
+ return g.all_reduce(bucket, ReduceOp::kSum);

shard_short ; dist/shard.h ; -R ^test_zero\.np|^test_dist\.np|Zero ; a shard one element short
- return {begin, begin + base + (index < extra ? 1 : 0)};
+ return {begin, begin + base + (index < extra ? 1 : 0) - (index == 0 && base > 1 ? 1 : 0)};

tp_bias ; dist/tensor_parallel.cpp ; -R ^test_dist_tensor_parallel\.np|TensorParallel ; a row-parallel bias added on every tensor-parallel rank before the reduction
-   Tensor partial = matmul(x, weight);\n  Tensor y = sequence_parallel
+   Tensor partial = matmul(x, weight);\n  if (bias.defined()) partial = add(partial, autograd::autocast_to(bias, partial.dtype()));\n  Tensor y = sequence_parallel

pipeline_1f1b ; dist/pipeline.cpp ; -R ^test_dist_pipeline\.np|Pipeline ; 1F1B's steady state runs the backward before its forward
-         F(warm + i, 0);\n        B(i, 0);
+         B(i, 0);\n        F(warm + i, 0);

softmax_backward ; ops/cpu/softmax.cpp ; -R Softmax|CrossEntropy|Attention|GradCheck ; softmax's backward subtracts twice the dot product
- simd::mul_sub_row(yr, dyr, simd::dot_row(dyr, yr, V), pdx + r * V, V);
+ simd::mul_sub_row(yr, dyr, 2 * simd::dot_row(dyr, yr, V), pdx + r * V, V);

layernorm_eps ; ops/cpu/simd/rows.cpp ; -R LayerNorm|Simd\. ; layer norm's epsilon outside the square root
- rs = float(1.0 / std::sqrt(sq / double(n) + eps));
+ rs = float(1.0 / (std::sqrt(sq / double(n)) + eps));

layernorm_eps_cuda ; ops/cuda/layernorm.cu ; -R CudaLayerNorm|cuda_kernels ; the CUDA layer norm's epsilon outside the square root
- const float rs = rsqrtf(warp_sum(squares) / C + eps);
+ const float rs = 1.0f / (sqrtf(warp_sum(squares) / C) + eps);

gelu_grad ; ops/kernels/gelu.h ; -R Gelu|GELU|gelu|cuda_kernels ; GELU's derivative with 2 for the cubic term's 3
- (T(1) + T(3) * k1 * x * x)
+ (T(1) + T(2) * k1 * x * x)

adamw_bias_correction ; ops/kernels/adamw.h ; -R AdamW|cuda_kernels ; AdamW's first bias correction one step late
- double bias_correction1 = 1.0 - pow(beta1, double(t));
+ double bias_correction1 = 1.0 - pow(beta1, double(t + 1));

adamw_decay ; ops/kernels/adamw.h ; -R AdamW|cuda_kernels ; AdamW's decoupled weight decay left out
-   p *= c.decay;\n
+ \n

scaler_growth ; optim/grad_scaler.cpp ; -R GradScaler|MixedPrecision|Fp16 ; the loss scaler grows one clean step late
- if (++s.clean_steps >= options_.growth_interval) {
+ if (++s.clean_steps > options_.growth_interval) {

clip_always ; optim/clip.cpp ; -R Clip|AdamW|GradNorm|DeviceStep ; gradients clipped on every step (scaled up when the norm is below the limit)
- if (std::isfinite(norm) && norm > max_norm) scale_grads
+ if (std::isfinite(norm)) scale_grads

embedding_tile ; ops/cuda/embedding.cu ; -R CudaEmbedding|cuda_kernels ; the CUDA embedding backward reads grad_out without its tile's offset
- dweight[v * C + c] += grad_out[(first + k) * C + c];
+ dweight[v * C + c] += grad_out[k * C + c];

checkpoint_clean_steps ; train/checkpoint.cpp ; -R Resume\.(EightSteps|Fp16) ; the loss scaler's clean steps not restored on load
- g.at("clean_steps").get<int64_t>(),
+ int64_t(0),

checkpoint_skipped_steps ; train/checkpoint.cpp ; -R Resume\.(EightSteps|Fp16) ; the loss scaler's skipped steps not restored on load
- g.at("skipped_steps").get<int64_t>()};
+ int64_t(0)};

ignored_targets ; train/step.cpp ; -R ^Training\.|^GradAccum\. ; ignored (-1) targets counted in the loss's divisor
- for (double v : y.to_vector()) n += v != -1.0;
+ for (double v : y.to_vector()) n += 1;

lr_on_skip ; train/trainer.cpp ; -R TrainGpt\.Fp16 ; fp16: the learning-rate schedule advances on skipped steps
- if (holds_on_skip) schedule_step += unread_steps - new_skips;
+ if (holds_on_skip) schedule_step += unread_steps;

zero3_piece ; dist/zero3.cpp ; -R ^test_zero\.np|Zero ; ZeRO-3: each shard piece one element short at its parameter's end
- std::min(first + shard, spec.offsets[s] + params[spec.params[s]].numel());
+ std::min(first + shard, spec.offsets[s] + params[spec.params[s]].numel() - 1);

sp_dropout ; dist/sequence_parallel.cpp ; -R TensorParallel|^test_dist_tensor_parallel\.np ; sequence parallelism: dropout's offset ignores the slice's first position
- ((ctx.first_sample + b) * T + first_position) * C;
+ ((ctx.first_sample + b) * T) * C;

pipeline_tied_wte ; train/pipeline_step.cpp ; -R Pipeline|^test_dist_pipeline\.np|^test_dist_3d ; the tied wte's gradient averaged over the embedding group instead of summed
- emb->all_reduce(g, dist::ReduceOp::kSum)->wait();
+ emb->all_reduce(g, dist::ReduceOp::kAvg)->wait();

zero_reshard ; dist/zero_state.cpp ; -R Resume|Zero ; resharding a checkpoint into ZeRO shards: each piece read from its tensor's start
- narrow(0, piece.begin - spec.offsets[piece.slot], piece.numel)
+ narrow(0, 0, piece.numel)

device_sampler ; ops/cuda/sample_windows.cu ; -R DeviceSampler|DeviceBatch|SampleWindows ; the device sampler's targets not shifted by one token
- y[r * seq + i] = window[i + 1];
+ y[r * seq + i] = window[i];

unscale_inf ; ops/kernels/unscale.h ; -R Unscale|GradScaler|cuda_kernels ; unscaling misses infinities (only NaN counts as an overflow)
- return !(std::fabs(g) <= FLT_MAX);
+ return std::isnan(g);

cross_entropy_ignore ; ops/cpu/cross_entropy.cpp ; -R CrossEntropy|Ignore ; cross-entropy counts ignored targets
-     if (v == ignore_index) continue;
+     if (v == ignore_index && false) continue;

nccl_group_of_one ; dist/cuda/nccl_backend.cpp ; -R ^test_dist_cuda\.np ; a group of one copies nothing in its all-gather
-     if (size() == 1) return copy_for_group_of_one(output, input, stream);\n    MINIDL_NCCL_CHECK(ncclAllGather(
+     if (size() == 1) return;\n    MINIDL_NCCL_CHECK(ncclAllGather(

EOF
}

# The list as records: name, file, ctest arguments, what, old, new (one per line, fields tab-separated).
records() {
  mutants | python3 -c '
import sys
blocks = [b for b in sys.stdin.read().split("\n\n") if b.strip()]
for b in blocks:
    head, old, new = b.strip("\n").split("\n")
    name, path, tests, what = [f.strip() for f in head.split(" ; ", 3)]
    assert old.startswith("- ") and new.startswith("+ "), b
    print("\t".join([name, path, tests, what, old[2:], new[2:]]))
'
}

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ ${1:-} == --list ]]; then
  records | awk -F'\t' '{ printf "%-26s %-34s %s\n", $1, $2, $4 }'
  exit 0
fi
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "mutants: $build_dir is not a configured build tree (run scripts/build.sh first, or set MINIDL_BUILD_DIR)" >&2
  exit 2
fi
wanted=" $* "
known=" $(records | cut -f1 | tr '\n' ' ') "
for w in "$@"; do
  [[ $known == *" $w "* ]] || { echo "mutants: no mutant named '$w' (scripts/mutants.sh --list)" >&2; exit 2; }
done

backup="$(mktemp)"
current=""
restore() { [[ -n $current ]] && cp "$backup" "$current"; current=""; }
trap 'restore; rm -f "$backup"' EXIT
trap 'exit 130' INT TERM

total=0 caught=0
survivors=() broken=()
log_dir="$build_dir/mutants"
mkdir -p "$log_dir"
while IFS=$'\t' read -r -u 3 name file tests what old new; do
  [[ $# -gt 0 && $wanted != *" $name "* ]] && continue
  total=$((total + 1))
  cp "$file" "$backup"
  current="$file"
  if ! python3 - "$file" "$old" "$new" <<'PY'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"{path}: the text to replace occurs {text.count(old)} times (expected once): {old!r}")
open(path, "w").write(text.replace(old, new))
PY
  then
    restore
    broken+=("$name (stale: its text is not in $file once)")
    echo "[$total] $name: STALE"
    continue
  fi
  t0=$SECONDS
  log="$log_dir/$name.log"
  if ! cmake --build "$build_dir" -j "$(nproc)" >"$log" 2>&1; then
    restore
    broken+=("$name (does not compile: $log)")
    echo "[$total] $name: DOES NOT COMPILE ($log)"
    continue
  fi
  read -ra ctest_args <<<"$tests"
  if ctest --test-dir "$build_dir" -j2 --timeout 300 --stop-on-failure "${ctest_args[@]}" >>"$log" 2>&1; then
    survivors+=("$name: $what ($file; tests: $tests)")
    verdict="SURVIVED"
  else
    caught=$((caught + 1))
    verdict="caught by $(grep -m1 -Eo '[0-9]+ - [^ ]+' "$log" | sed 's/^[0-9]* - //')"
  fi
  restore
  echo "[$total] $name: $verdict ($((SECONDS - t0)) s)"
done 3< <(records)

# Rebuild the restored sources, so the tree is what the working copy says.
cmake --build "$build_dir" -j "$(nproc)" >"$log_dir/restore.log" 2>&1 || echo "mutants: the final rebuild failed" >&2
echo
echo "mutants: $caught/$total caught"
(( ${#survivors[@]} == 0 )) || printf '  survived: %s\n' "${survivors[@]}"
(( ${#broken[@]} == 0 )) || printf '  not run: %s\n' "${broken[@]}"
(( ${#survivors[@]} == 0 && ${#broken[@]} == 0 ))
