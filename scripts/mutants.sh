#!/usr/bin/env bash
# Mutation testing by hand: plants each bug of a curated list (below) in the source, one at a time, builds with the
# compiler cache, runs the tests that exist to see it, and puts the source back. A mutant is caught when a test
# fails (or the build does: a mutant that no longer compiles is listed as such, and the list needs mending).
#
#   scripts/mutants.sh              # every mutant; prints caught/total and the survivors
#   scripts/mutants.sh ring ddp     # only the mutants whose names are given
#   scripts/mutants.sh --check      # builds nothing: does every mutant (or each one named after it) still apply?
#   scripts/mutants.sh --list       # the list, one line each
#
# A mutant applies when its file exists, its text occurs there exactly once and its replacement differs from it.
# --check prints a line for each one that does not (name, file, why: file missing, pattern not found, found N
# times, replacement unchanged) and exits 1, or prints "N mutants apply" and exits 0. CI's docs stage runs it, so a
# change that moves a mutant's code fails there until the mutant is mended (git log -S'<its text>' and grep find
# where the code went; plant the same kind of bug there, against tests that exist). The building mode refuses a
# stale mutant the same way: it is not run nor counted as caught, it is listed as stale, and the script exits 1.
#
# The building mode is not part of CI (a mutant costs a rebuild and its tests: about 30 minutes for the list on 2
# cores); run it before closing a test issue and after large changes. MINIDL_BUILD_DIR names the build tree
# (default build: the Release tree with the emulated CUDA backend that scripts/test.sh and CI's test stage
# configure). Sources are restored from a copy taken before each mutation, also when the script is interrupted;
# uncommitted changes are safe. Exit status: 0 when every mutant run was caught (--check: every one applies), 1
# when one survived, did not compile or is stale, 2 on a usage error or a malformed list.
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

all_to_all_offset ; dist/ring_backend.cpp ; -R ^test_dist\.np ; the ring's all-to-all writes what rank r-k sent at the place of rank r+k's part
- recv = transport_->start_recv(output, recv_at[size_t(from)] * elem
+ recv = transport_->start_recv(output, recv_at[size_t(to)] * elem

nccl_all_to_all_offset ; dist/cuda/nccl_backend.cpp ; -R ^test_dist_cuda\.np ; NCCL's all-to-all receives each peer's part at the offset of what this rank sent it
- if (r > 0) MINIDL_NCCL_CHECK(ncclRecv(out + received * elem,
+ if (r > 0) MINIDL_NCCL_CHECK(ncclRecv(out + sent * elem,

ddp_sum ; dist/comm_hook.cpp ; -R ^test_ddp\.np|DataParallel ; DDP sums the gradients instead of averaging them
- return group.all_reduce(buffer, ReduceOp::kAvg);
+ return group.all_reduce(buffer, ReduceOp::kSum);

shard_short ; dist/shard.h ; -R ^test_zero\.np|^test_dist\.np|Zero ; a shard one element short
- return {begin, begin + base + (index < extra ? 1 : 0)};
+ return {begin, begin + base + (index < extra ? 1 : 0) - (index == 0 && base > 1 ? 1 : 0)};

tp_bias ; dist/tensor_parallel.cpp ; -R ^test_dist_tensor_parallel\.np|TensorParallel ; a row-parallel bias added on every tensor-parallel rank before the reduction
-   Tensor partial = matmul(x, l.weight);\n  Tensor y = reduce(partial);
+   Tensor partial = matmul(x, l.weight);\n  if (l.bias.defined()) partial = add(partial, autograd::autocast_to(l.bias, partial.dtype()));\n  Tensor y = reduce(partial);

cp_backward_local_kv ; dist/context_parallel.cpp ; -R ^test_context_parallel\.np ; ring attention's backward reads this rank's own keys and values at every step (diffusers #14265): silently wrong gradients, a right forward
- const Tensor& held = cur;
+ const Tensor& held = kv;

cp_lse_16bit ; dist/context_parallel.cpp ; -R ^test_context_parallel\.np ; the running log-sum-exp of the ring's merge kept in bf16
- ops::merge_attention_blocks(out[size_t(a)], lse[size_t(a)], f.out, f.lse);
+ ops::merge_attention_blocks(out[size_t(a)], lse[size_t(a)], f.out, f.lse), lse[size_t(a)] = ops::cast(ops::cast(lse[size_t(a)], DType::bf16), work);

cp_gradient_not_home ; dist/context_parallel.cpp ; -R ^test_context_parallel\.np ; the keys' and values' gradients travel with the blocks n-1 times, one hop short of their owners
- grad = home;
+ (void)home;

cp_positions_local ; dist/context_parallel.cpp ; -R ^test_context_parallel\.np ; GPT-2's position table read at the local indices, not the global positions
- for (int64_t i = 0; i < r.length; ++i) p[r.local + i] = r.global + i;
+ for (int64_t i = 0; i < r.length; ++i) p[r.local + i] = r.local + i;

cp_rope_local ; nn/llama.cpp ; -R ^test_context_parallel\.np ; Llama's second run of positions (the tail chunk) turned at its local start
- turn(a.narrow(1, r1.local, r1.length), heads, r1.global)},
+ turn(a.narrow(1, r1.local, r1.length), heads, r1.local)},

cp_dropout_local ; dist/context_parallel.cpp ; -R ^test_context_parallel\.np ; a dropout under context parallelism draws the masks of the local positions
- const int64_t first_element = ((ctx.first_sample + b) * T + r.global) * C;
+ const int64_t first_element = ((ctx.first_sample + b) * T + r.local) * C;

cp_labels_after_split ; train/step.cpp ; -R ^test_context_parallel\.np|ContextParallel ; the labels shifted after the split (verl #4250): each position's target the next input this rank holds, wrong at every chunk boundary
- data::Batch{stage.positions_of(whole.x), stage.positions_of(whole.y)} : whole;
+ data::Batch{stage.positions_of(whole.x), cat({stage.positions_of(whole.x).narrow(1, 1, whole.x.size(1) / cp - 1), stage.positions_of(whole.y).narrow(1, whole.x.size(1) / cp - 1, 1)}, 1)} : whole;

cp_loss_local_tokens ; train/step.cpp ; -R ^test_context_parallel\.np|ContextParallel ; each context-parallel rank's loss divided by its own target count, not the whole sequences' over cp (verl #4250)
- double(cp) / double(std::max<int64_t>(1, o.target_count >= 0 ? o.target_count : count_targets(whole.y)));
+ 1.0 / double(std::max<int64_t>(1, count_targets(batch.y)));

cuda_attention_block_diagonal_key ; ops/cuda/attention_blocks.cu ; -R AttentionBlock|^cuda_tensor_ops ; the device block backward leaves out each key's own query on the diagonal block (dk and dv lose the diagonal's term)
- for (int64_t i = s.causal ? j : 0; i < s.Tq; ++i) {
+ for (int64_t i = s.causal ? j + 1 : 0; i < s.Tq; ++i) {

naive_ring_attention_local_kv ; dist/naive/ring_attention.h ; -R ^test_context_parallel\.np ; the teaching ring's backward never passes the keys and values on: every step reads this rank's own
- if (s + 1 < n) block = detail::pass_on(g, block, 1);
+ if (false) block = detail::pass_on(g, block, 1);

pipeline_1f1b ; dist/pipeline.cpp ; -R ^test_dist_pipeline\.np|Pipeline ; 1F1B's steady state runs the backward before its forward
-         F(warm + i, 0);\n        B(i, 0);
+         B(i, 0);\n        F(warm + i, 0);

local_sgd_sign ; dist/local_sgd.cpp ; -R ^test_local_sgd\.np ; DiLoCo's pseudo-gradient taken as local - global (torchft's PR #233): the outer step climbs
- local[i] = global_[i] - local[i];
+ local[i] = local[i] - global_[i];

predict_outer_every_step ; predict/predict.cpp ; -R ^PredictOuter\. ; the predictor charges local SGD's outer sync at every step instead of one step in H
- outer_sync_seconds(out.rank_params, l.replicas, l.sync == OuterSync::kDiLoCo, link, m) / l.sync_every;
+ outer_sync_seconds(out.rank_params, l.replicas, l.sync == OuterSync::kDiLoCo, link, m);

predict_ps_async_as_sync ; predict/predict.cpp ; -R ^PredictOuter\. ; the predictor's asynchronous parameter server serialises every worker like the synchronous one
- l.ps_mode == PsMode::kSync,
+ true,

local_sgd_resume_fresh ; train/trainer.cpp ; -R ^TrainLocalSgd\.Resumes ; a resumed replica run restarts its window from replica 0's parameters and a zero outer momentum
- if (s.resume && s.resume->replicas > 1) {
+ if (s.resume && s.resume->replicas > 1000) {

comm_hook_f32_wire ; dist/comm_hook.cpp ; -R ^test_comm_hook\.np ; the 16-bit hook sums through all_reduce's f32 staging: right values, twice the bytes
- group.all_reduce_16bit(wire, ReduceOp::kSum)->wait();
+ group.all_reduce(wire, ReduceOp::kSum)->wait();

ps_async_undivided ; dist/parameter_server.cpp ; -R ^test_parameter_server\.np ; an async server applies each gradient whole instead of divided by W (the replay divides)
- divide(grad_, W);
+ (void)W;

ps_ssp_bound ; dist/parameter_server.cpp ; -R ^test_parameter_server\.np ; SSP releases a worker s + 1 steps ahead of the slowest
- if (clock[size_t(u)] - slowest <= options_.staleness)
+ if (clock[size_t(u)] - slowest <= options_.staleness + 1)

powersgd_no_error_feedback ; dist/powersgd.cpp ; -R ^test_powersgd\.np ; PowerSGD drops what the last approximation left out instead of sending it now
- for (size_t i = 0; i < numel; ++i) g[i] += bk.error[i];  // M_k = g_k + e_k
+ for (size_t i = 0; i < numel; ++i) g[i] += 0 * bk.error[i];  // M_k = g_k + e_k

ps_replay_stale_shard ; train/ps_train.cpp ; -R ^TrainPs\.AsyncAndSsp ; the replayed server steps whatever the gradient's computation left in its tensors, not its shard's version
- write_flat(shard, params_);  // the replay's shard at this version (the server's own already is)
+ (void)shard;  // the replay's shard at this version (the server's own already is)

ps_sync_schedule ; train/ps_train.cpp ; -R ^TrainPs\.SyncIsDdp ; a sync server's learning-rate schedule runs a step ahead of DDP's
- const int64_t position = sync_ ? applied_ : applied_ / workers_;
+ const int64_t position = sync_ ? applied_ + 1 : applied_ / workers_;

softmax_backward ; ops/cpu/softmax.cpp ; -R Softmax|CrossEntropy|Attention|GradCheck ; softmax's backward subtracts twice the dot product
- simd::mul_sub_row(yr, dyr, simd::dot_row(dyr, yr, V), pdx + r * V, V);
+ simd::mul_sub_row(yr, dyr, 2 * simd::dot_row(dyr, yr, V), pdx + r * V, V);

attention_kv_head ; ops/cpu/attention.cpp ; -R ^GroupedAttention\.|^LlamaHF\. ; grouped-query attention's query head h reads kv head h % n_kv_head instead of h / (n_head / n_kv_head)
- T* k = base + d.C + kv_head(h, d.group()) * d.D;
+ T* k = base + d.C + (h % d.Hkv) * d.D;

attention_block_merge_share ; ops/cpu/attention.cpp ; -R ^AttentionBlocks\. ; merging a block's attention into the running output weighs it by the running part's share (1 - sigmoid(lse_b - lse)) instead of its own
- for (int64_t i = 0; i < D; ++i) row[i] -= w * (row[i] - rb[i]);
+ for (int64_t i = 0; i < D; ++i) row[i] -= (U(1) - w) * (row[i] - rb[i]);

attention_block_backward_causal_rows ; ops/cpu/attention.cpp ; -R ^AttentionBlocks\. ; a full (non-causal) block's backward skips the query tiles before each key tile, as the causal diagonal does
- const int64_t first_i0 = d.causal ? j0 : 0;  // the query blocks that see this key block
+ const int64_t first_i0 = j0;  // the query blocks that see this key block

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
- j.at("clean_steps").get<int64_t>(),
+ int64_t(0),

checkpoint_skipped_steps ; train/checkpoint.cpp ; -R Resume\.(EightSteps|Fp16) ; the loss scaler's skipped steps not restored on load
- j.at("skipped_steps").get<int64_t>()};
+ int64_t(0)};

ignored_targets ; train/step.cpp ; -R ^Training\.|^GradAccum\. ; ignored (-1) targets counted in the loss's divisor
- for (double v : y.to_vector()) n += v != -1.0;
+ for (double v : y.to_vector()) n += 1;

lr_on_skip ; train/read_back.cpp ; -R TrainGpt\.Fp16 ; fp16: the learning-rate schedule advances on skipped steps
- if (holds_on_skip_) schedule_step_ += unread_ - new_skips;
+ if (holds_on_skip_) schedule_step_ += unread_;

zero3_piece ; dist/zero3.cpp ; -R ^test_zero\.np|Zero ; ZeRO-3: each shard piece one element short at its parameter's end
- std::min(first + shard, spec.offsets[s] + params[spec.params[s]].numel());
+ std::min(first + shard, spec.offsets[s] + params[spec.params[s]].numel() - 1);

sp_dropout ; dist/sequence_parallel.cpp ; -R TensorParallel|^test_dist_tensor_parallel\.np ; sequence parallelism: dropout's offset ignores the slice's first position
- ((ctx.first_sample + b) * T + first_position) * C;
+ ((ctx.first_sample + b) * T + 0 * first_position) * C;

pipeline_tied_wte ; train/grad_sync.cpp ; -R Pipeline|^test_dist_pipeline\.np|^test_dist_3d ; the tied wte's gradient averaged over the embedding group instead of summed
- tied_group_->all_reduce(g, dist::ReduceOp::kSum)->wait();
+ tied_group_->all_reduce(g, dist::ReduceOp::kAvg)->wait();

naive_gpipe_newest_first ; dist/naive/gpipe.h ; -R ^test_naive\.np ; naive GPipe: the backwards newest first (a schedule the validator accepts, but not production's order: each gradient adds its pieces in another order)
- for (int m = 0; m < M; ++m) add(pass(S, s, m, false));
+ for (int m = M - 1; m >= 0; --m) add(pass(S, s, m, false));

naive_pipeline_loss_overwritten ; dist/naive/gpipe.h ; -R ^test_naive\.np ; naive pipelines: the executor keeps the last micro-batch's loss share instead of summing the M shares
- if (last) loss += float(output[m].item());
+ if (last) loss = float(output[m].item());

naive_tied_wte ; dist/naive/gpipe.h ; -R ^test_naive\.np ; naive pipelines: the tied wte's gradient averaged over the first and last stage instead of summed
- group.all_reduce(grad, ReduceOp::kSum)->wait();
+ group.all_reduce(grad, ReduceOp::kAvg)->wait();

naive_1f1b_gpipe_order ; dist/naive/one_f_one_b.h ; -R ^test_naive\.np ; naive 1F1B: every warm-up M forwards long (GPipe's order: the same gradients, but M micro-batches in flight)
- const int warmup = std::min(S - 1 - s, M);
+ const int warmup = M;

naive_1f1b_short_warmup ; dist/naive/one_f_one_b.h ; -R ^test_naive\.np ; naive 1F1B: each warm-up one forward short (the same gradients, the later stages starved)
- const int warmup = std::min(S - 1 - s, M);
+ const int warmup = std::max(0, std::min(S - 2 - s, M));

naive_1f1b_newest_first ; dist/naive/one_f_one_b.h ; -R ^test_naive\.np ; naive 1F1B: the backward of the newest micro-batch in flight instead of the oldest
- for (int m = M - warmup; m < M; ++m) add(pass(S, s, m, false));
+ for (int m = M - 1; m >= M - warmup; --m) add(pass(S, s, m, false));

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

llama_hf_rope_interleaved ; ops/cpu/rope.cpp ; -R ^LlamaHF\. ; the oracle alone against interleaved RoPE on HF weights (GPT-J's pairs where transformers rotates halves: llama2.c #286)
-           simd::rope_rows(xr, cr, sr, yr, H, half, inverse);\n          continue;
+           for (int64_t j = 0; j < H * half; ++j)\n            kernels::rope_rotate(xr[2 * j], xr[2 * j + 1], cr[j % half], inverse ? -sr[j % half] : sr[j % half], yr + 2 * j, yr + 2 * j + 1);\n          continue;

llama_hf_kv_head_modulo ; ops/cpu/attention.cpp ; -R ^LlamaHF\. ; the oracle alone against a query head reading kv head h % n_kv_head (repeat_kv's order is h / group)
- T* k = base + d.C + kv_head(h, d.group()) * d.D;
+ T* k = base + d.C + (h % d.Hkv) * d.D;

llama_eps_not_from_config ; nn/llama.cpp ; -R ^LlamaHF\. ; a Llama block's first RMSNorm takes the default eps 1e-5, not the config's (1e-6 in the oracle's models)
-   ln_1 = register_module("ln_1", std::make_shared<RMSNorm>(cfg.n_embd, cfg.norm_eps));
+   ln_1 = register_module("ln_1", std::make_shared<RMSNorm>(cfg.n_embd, 1e-5));

llama_rope_scaling_ignored ; nn/gpt.cpp ; -R ^LlamaHF\. ; the model builds its RoPE tables without the config's rope_scaling (exact at position 0, drifting with it)
-     rope = std::make_shared<RotaryTables>(cfg.block_size, cfg.head_size(), cfg.rope_theta, cfg.rope_scaling);
+     rope = std::make_shared<RotaryTables>(cfg.block_size, cfg.head_size(), cfg.rope_theta, ops::RopeScaling{});

llama_tp_kv_heads_mismatched ; dist/tp_plan.cpp ; -R ^test_dist_3d\.np ; tensor parallelism splits v by columns as one block of q|k|v parts would (parts 2), so a rank's values belong to other heads than its keys
-                           {"transformer.h.*.attn.v_proj", {S::kColwise, sp}},
+                           {"transformer.h.*.attn.v_proj", {S::kColwise, sp, 2}},

strided_copy_rows_assumed_dense ; core/tensor.cpp ; -R ^Tensor\. ; copy_ takes a source whose last dimension is strided (a transpose of the last two) as dense rows, one memcpy each
-   const bool dense = d_inner == 1 && s_inner == 1;
+   const bool dense = d_inner == 1;

hf_bpe_merged_rank ; data/bpe_tokenizer.cpp ; -R ^HfTokenizer\. ; a tokenizer.json merges the pair whose merged token has the lowest id (tiktoken's rule), not the merges' first line
-   if (merges_.empty()) return id_of(piece.substr(a, e - a));  // tiktoken: the merged bytes' rank
+   if (true) return id_of(piece.substr(a, e - a));  // tiktoken: the merged bytes' rank

hf_bpe_added_tokens_as_text ; data/bpe_tokenizer.cpp ; -R ^HfTokenizer\. ; a tokenizer.json's added tokens are not cut out of the text: "<|endoftext|>" encodes as its characters
-   if (specials_.empty()) {\n    encode_text(text, ids);
+   if (true) {\n    encode_text(text, ids);

rope_interleaved ; ops/cpu/rope.cpp ; -R Rope|^test_nn_ops|^LlamaHF\. ; RoPE rotates interleaved pairs (2i, 2i + 1, GPT-J's layout) instead of rotate_half's (i, i + D/2)
-           simd::rope_rows(xr, cr, sr, yr, H, half, inverse);\n          continue;
+           for (int64_t j = 0; j < H * half; ++j)\n            kernels::rope_rotate(xr[2 * j], xr[2 * j + 1], cr[j % half], inverse ? -sr[j % half] : sr[j % half], yr + 2 * j, yr + 2 * j + 1);\n          continue;

rope_interleaved_cuda ; ops/cuda/rope.cu ; -R RopeIsTheCpusBits|cuda_tensor_ops ; the CUDA RoPE rotates interleaved pairs instead of rotate_half's
- to_float(x[at]), to_float(x[at + half]), c, inverse ? -s : s, &y0, &y1);\n    from_float(y0, y + at);\n    from_float(y1, y + at + half);
+ to_float(x[at + i]), to_float(x[at + i + 1]), c, inverse ? -s : s, &y0, &y1);\n    from_float(y0, y + at + i);\n    from_float(y1, y + at + i + 1);

rope_backward_not_transposed ; ops/cpu/simd/norm_rope.cpp ; -R Rope|^test_nn_ops ; RoPE's backward rotates by +angle (the forward) instead of its transpose
- if (inverse) s = hn::Neg(s);
+ if (inverse && false) s = hn::Neg(s);

rope_llama3_ignored ; ops/cpu/rope.cpp ; -R Rope|^test_nn_ops|^LlamaHF\. ; rope_scaling llama3 ignored: the inverse frequencies left unscaled
-     if (scaling.type == RopeType::kLlama3) {\n      const double wavelen
+     if (scaling.type == RopeType::kNone && false) {\n      const double wavelen

rmsnorm_weight_before_cast ; ops/cpu/rmsnorm.cpp ; -R RMSNorm|^test_nn_ops ; RMS norm of 16-bit x multiplies the weight before casting xhat back (one rounding, not transformers' two)
-     RMSNormForward f = rmsnorm_rows(upcast(x), Tensor(), eps);\n    f.y = cast(mul(upcast(cast(f.y, x.dtype())), weight), x.dtype());
+     RMSNormForward f = rmsnorm_rows(upcast(x), weight, eps);\n    f.y = cast(f.y, x.dtype());

rmsnorm_weight_before_cast_cuda ; ops/cuda/rmsnorm.cu ; -R RMSNormMatchesTheCpu|cuda_tensor_ops ; the CUDA RMS norm multiplies the weight before rounding xhat to the storage type
- out.v[k] = rounded_to<T>(out.v[k] * rs) * w.v[k];
+ out.v[k] = out.v[k] * rs * w.v[k];

rmsnorm_dweight_unrounded ; ops/cpu/rmsnorm.cpp ; -R RMSNorm|^test_nn_ops ; RMS norm's 16-bit dweight takes the unrounded xhat, not the one the weight multiplied
- C, is_half(rounding) ? xhat_rounded.data() : nullptr);
+ C, nullptr);

rmsnorm_eps_ignored ; ops/cpu/simd/norm_rope.cpp ; -R RMSNorm|^test_nn_ops ; RMS norm ignores its eps argument (a fixed 1e-6 baked in)
- rs = float(1.0 / std::sqrt(sq / double(n) + eps));
+ rs = float(1.0 / std::sqrt(sq / double(n) + 0 * eps + 1e-6));

rmsnorm_eps_ignored_cuda ; ops/cuda/rmsnorm.cu ; -R RMSNormMatchesTheCpu|cuda_tensor_ops ; the CUDA RMS norm ignores its eps argument (a fixed 1e-6 baked in)
- rsqrtf(warp_sum(squares) / C + eps);
+ rsqrtf(warp_sum(squares) / C + 0 * eps + 1e-6f);

swiglu_dup ; ops/cpu/simd/activation.cpp ; -R SwiGLU|^test_nn_ops ; SwiGLU's gradient for up is dy * gate, the sigmoid left out
- du[k] = hn::Mul(hn::Mul(dy[k], g[k]), s[k]);
+ du[k] = hn::Mul(dy[k], g[k]);

swiglu_cuda_sigmoid ; ops/kernels/swiglu.h ; -R SwiGLU|cuda_tensor_ops ; SwiGLU's sigmoid for negative gates returns 1 - its value (the scalar path: f64, 16-bit on CUDA)
-   return g < T(0) ? e * q : q;
+   return g < T(0) ? T(1) - e * q : q;

moe_bias_every_micro_batch ; train/step.cpp ; -R MixtureOfExpertsMatchesOneProcess ; the expert bias updated after every micro-batch's backward, not once per optimizer step
-         if (s.input.defined()) saved[{a.micro, a.chunk}] = Saved{s.input, Tensor()};  // its gradient, to send
+         if (s.input.defined()) saved[{a.micro, a.chunk}] = Saved{s.input, Tensor()};\n        balance_experts(stage);

moe_router_16bit ; nn/moe.cpp ; -R ^MoE\. ; the router's logits computed under autocast, in 16-bit
-     const autograd::AutocastGuard full(DType::f32);
+     const autograd::AutocastGuard full(autograd::autocast_dtype());

moe_permutation_inverse ; nn/moe.cpp ; -R ^MoE\.|^MoEHF\. ; the combine reads each slot's expert row through the dispatch order instead of its inverse
- slot_rows[size_t(s)] = r.row[size_t(s)] >= 0 ? r.row[size_t(s)] : int64_t(r.order.size());
+ slot_rows[size_t(s)] = r.row[size_t(s)] >= 0 ? r.order[size_t(s)] : int64_t(r.order.size());

moe_aux_per_batch ; nn/moe.cpp ; -R ^MoEHF\.|MixtureOfExpertsMatchesOneProcess ; the auxiliary loss summed over a forward's sequences instead of averaged (its weight then depends on how the batch is split)
-     aux = sum(P * fi) * (cfg_.moe_aux_coef * double(E) / double(B));
+     aux = sum(P * fi) * (cfg_.moe_aux_coef * double(E));

moe_bias_not_read ; nn/hf_format.cpp ; -R MixtureOfExperts ; the expert biases a model file holds replaced by zeros when it is read (a resumed run chooses other experts)
-       out.emplace("transformer.h." + std::to_string(i) + ".moe.expert_bias", Tensor::zeros({cfg.moe_experts}));
+       out.insert_or_assign("transformer.h." + std::to_string(i) + ".moe.expert_bias", Tensor::zeros({cfg.moe_experts}));

ep_expert_grads_over_dp ; train/grad_sync.cpp ; -R ExpertParallelMatchesOneProcess ; an expert's gradient averaged over the whole dp group, other experts' gradients mixed in (pytorch #160285's family)
-     if (!experts.empty() && topology.expert_dp_group().size() > 1)\n      e->expert_ddp =\n          std::make_unique<dist::DistributedDataParallel>(experts, topology.expert_dp_group(),
+     if (!experts.empty() && dp.size() > 1)\n      e->expert_ddp =\n          std::make_unique<dist::DistributedDataParallel>(experts, dp,

ep_expert_grads_not_divided ; train/grad_sync.cpp ; -R ExpertParallelMatchesOneProcess ; an expert's gradient averaged over the ranks holding it only, ep times one process's (pytorch #160285's 2x at ep 2)
-         g.copy_(ops::mul(g, 1.0 / double(ep_group_->size())));
+         g.copy_(ops::mul(g, 1.0));

ep_permutation_not_inverted ; dist/expert_parallel.cpp ; -R ExpertParallelMatchesOneProcess ; the expert outputs sent home in the dispatch permutation's order instead of its inverse's
-   for (size_t i = 0; i < order.size(); ++i) inverse[size_t(order[i])] = int64_t(i);
+   for (size_t i = 0; i < order.size(); ++i) inverse[i] = order[i];

ep_expert_moments_one_writer ; train/checkpoint.cpp ; -R ExpertParallelCheckpointsResumeAtAnyEp ; every expert's AdamW moments left to dp rank 0, which holds only its own experts (the others' are never written)
-   const bool first_replica = stage.topology()->expert_dp_group().rank() == 0;
+   const bool first_replica = stage.topology()->dp_group().rank() == 0;

allocator_exact_sizes ; core/size_class.h ; -R ^Memory\. ; both caches (the CPU's and the device's) keyed by each request's rounding again: a mixture of experts' changing shapes leave a block per size ever seen (~50 MB a step)
-   if (n <= 4096) return n;
+   if (n <= (size_t(1) << 62)) return n;

cuda_allocator_exact_sizes ; core/cuda/allocator.cpp ; -R ^CudaCore\. ; the device cache keyed by each request's 512-byte rounding again: a mixture of experts' changing shapes leave a block per size ever seen, until cudaMalloc fails
-   const size_t rounded = round_up(bytes), capacity = size_class(rounded);
+   const size_t rounded = round_up(bytes), capacity = rounded;

predict_ep_rows_once ; predict/predict.cpp ; -R ^PredictMoE\. ; the predictor sends an MoE block's rows out but not home (one all-to-all of rows forward, not two)
-     ep_f = all_to_all(l.ep, 8 * double(model.moe_experts), link) + 2 * rows;
+     ep_f = all_to_all(l.ep, 8 * double(model.moe_experts), link) + rows;

predict_ep_with_zero ; predict/predict.cpp ; -R ^PredictLayouts\. ; the predictor predicts ep with ZeRO, which the trainer refuses
-   else if (l.ep > 1 && (l.zero > 0 || l.pp > 1))
+   else if (l.ep > 1 && (l.pp > 1))

predict_ep_holds_every_expert ; train/zero_memory.cpp ; -R ^PredictMoE\.|ExpertParallelMatchesOneProcess ; the memory model gives every rank all E experts under ep (the ledger holds E / ep)
-   return double(m.moe_experts / std::max(1, ep)) * 3 * double(m.n_embd) * double(m.mlp_width());
+   return double(m.moe_experts / std::max(1, 0 * ep)) * 3 * double(m.n_embd) * double(m.mlp_width());
EOF
}

# The list as records, one a line, fields separated by the unit separator (0x1f, so that no empty field is lost):
# name, file, ctest arguments, what, old, new, and whether it applies: "ok", or why not.
sep=$'\x1f'
records() {
  mutants | python3 -c '
import os, sys
blocks = [b for b in sys.stdin.read().split("\n\n") if b.strip()]
seen = set()
for b in blocks:
    lines = b.strip("\n").split("\n")
    head = lines[0].split(" ; ", 3)
    if len(lines) != 3 or len(head) != 4 or not lines[1].startswith("- ") or not lines[2].startswith("+ "):
        sys.exit("mutants: malformed entry (expected name ; file ; tests ; what, then - and + lines):\n" + b)
    name, path, tests, what = [f.strip() for f in head]
    if name in seen:
        sys.exit(f"mutants: two mutants named {name}")
    seen.add(name)
    old, new = lines[1][2:], lines[2][2:]
    pattern, replacement = old.replace("\\n", "\n"), new.replace("\\n", "\n")
    if not os.path.isfile(path):
        why = "file missing"
    else:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            count = f.read().count(pattern)
        why = ("pattern not found" if count == 0 else f"pattern found {count} times" if count > 1
               else "replacement unchanged" if replacement == pattern else "ok")
    print("\x1f".join([name, path, tests, what, old, new, why]))
'
}

usage_lines() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "${BASH_SOURCE[0]}"; }

mode=run
case ${1:-} in
  -h | --help) usage_lines; exit 0 ;;
  --list) mode=list; shift ;;
  --check) mode=check; shift ;;
  -*) echo "mutants: unknown option '$1' (scripts/mutants.sh --help)" >&2; exit 2 ;;
esac

list="$(records)" || exit 2
if [[ $mode == list ]]; then
  awk -F"$sep" '{ printf "%-26s %-34s %s\n", $1, $2, $4 }' <<<"$list"
  exit 0
fi
wanted=" $* "
known=" $(cut -d"$sep" -f1 <<<"$list" | tr '\n' ' ') "
for w in "$@"; do
  [[ $known == *" $w "* ]] || { echo "mutants: no mutant named '$w' (scripts/mutants.sh --list)" >&2; exit 2; }
done
# The mutants to check or run: those named, or all.
chosen="$list"
(( $# == 0 )) || chosen="$(awk -F"$sep" -v wanted="$wanted" 'index(wanted, " " $1 " ")' <<<"$list")"

# The mutants that do not apply, one line each: name (file): why.
stale_lines() {
  awk -F"$sep" '$7 != "ok" { printf "mutants: %s (%s): %s\n", $1, $2, $7 }' <<<"$chosen"
}
count=$(grep -c . <<<"$chosen")
stale_count=$(awk -F"$sep" '$7 != "ok"' <<<"$chosen" | grep -c .)

if [[ $mode == check ]]; then
  if (( stale_count > 0 )); then
    stale_lines
    echo "mutants: $stale_count of $count mutants do not apply (mend them in scripts/mutants.sh: see its header)" >&2
    exit 1
  fi
  echo "$count mutants apply"
  exit 0
fi

if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "mutants: $build_dir is not a configured build tree (run scripts/build.sh first, or set MINIDL_BUILD_DIR)" >&2
  exit 2
fi
if (( stale_count > 0 )); then
  stale_lines
  echo "mutants: $stale_count stale mutants will not be run (scripts/mutants.sh --check; mend them first)" >&2
fi

backup="$(mktemp)"
current=""
restore() { [[ -n $current ]] && cp "$backup" "$current"; current=""; }
trap 'restore; rm -f "$backup"' EXIT
trap 'exit 130' INT TERM

index=0 total=0 caught=0
survivors=() broken=() stale=()
log_dir="$build_dir/mutants"
mkdir -p "$log_dir"
while IFS="$sep" read -r -u 3 name file tests what old new why; do
  index=$((index + 1))
  if [[ $why != ok ]]; then
    stale+=("$name ($file: $why)")
    echo "[$index] $name: STALE, not run ($file: $why)"
    continue
  fi
  cp "$file" "$backup"
  current="$file"
  # The same check again, on the file as it is now (another edit may have landed since the list was read).
  if ! python3 - "$file" "$old" "$new" <<'PY'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
text = open(path, encoding="utf-8", errors="surrogateescape").read()
if text.count(old) != 1:
    sys.exit(f"pattern found {text.count(old)} times")
with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
    f.write(text.replace(old, new))
PY
  then
    restore
    stale+=("$name ($file: its text is no longer there once)")
    echo "[$index] $name: STALE, not run ($file)"
    continue
  fi
  total=$((total + 1))
  t0=$SECONDS
  log="$log_dir/$name.log"
  if ! cmake --build "$build_dir" -j "$(nproc)" >"$log" 2>&1; then
    restore
    broken+=("$name (does not compile: $log)")
    echo "[$index] $name: DOES NOT COMPILE ($log)"
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
  echo "[$index] $name: $verdict ($((SECONDS - t0)) s)"
done 3<<<"$chosen"

# Rebuild the restored sources, so the tree is what the working copy says.
if (( total > 0 )); then
  cmake --build "$build_dir" -j "$(nproc)" >"$log_dir/restore.log" 2>&1 || echo "mutants: the final rebuild failed" >&2
fi
echo
echo "mutants: $caught/$total caught$( (( ${#stale[@]} == 0 )) || echo ", ${#stale[@]} stale (not run)")"
(( ${#survivors[@]} == 0 )) || printf '  survived: %s\n' "${survivors[@]}"
(( ${#broken[@]} == 0 )) || printf '  not run: %s\n' "${broken[@]}"
(( ${#stale[@]} == 0 )) || printf '  stale: %s\n' "${stale[@]}"
(( ${#survivors[@]} == 0 && ${#broken[@]} == 0 && ${#stale[@]} == 0 ))
