// BatchSampler: random training windows whose global batch depends only on (seed, step), never on how many ranks
// share it. Each rank asks for its slice [begin, begin + n) of the global batch; concatenating the slices of any
// number of ranks reproduces the global batch exactly, which is what makes every parallel mode comparable with a
// single process.
//
// Sample b of step s starts at
//   offset = draw64 % (len - seq),   draw64 = (x << 32) | y of Philox(seed, kSamplerStream).draw(s * B + b)
// with B the global batch, so offset is in [0, len - seq - 1] and the window tokens[offset, offset + seq] fits.
// The modulo bias is at most (len - seq) / 2^64 per offset (about 1e-13 for a million tokens): negligible.
// x[b] = tokens[offset, offset + seq), y[b] = tokens[offset + 1, offset + seq + 1): the next-token targets.
//
//   data::BatchSampler sampler(ds.train(), /*seq=*/256, /*global_batch=*/64, /*seed=*/1337);
//   auto [begin, n] = ...this rank's share of the 64 samples...;
//   data::Batch b = sampler.batch(step, begin, n);   // b.x, b.y: (n, 256) i32
//
// DeviceBatchSampler draws the same batches on a CUDA device from a split uploaded once (ops/sample_windows.h): a
// training step then copies nothing to the device for its batch.
//
//   data::DeviceBatchSampler dev(ds.train(), 256, 64, 1337, Device::cuda(0));   // tokens checked by the caller
//   data::Batch b = dev.batch(step, begin, n);   // b.x, b.y: (n, 256) i64 on cuda:0, sampler.batch's values
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace minidl::data {

// Philox stream id of the sampler's draws, so they never coincide with draws for initialisation or dropout made
// from the same seed on other streams.
inline constexpr uint64_t kSamplerStream = 0x5341'4D50;  // ASCII "SAMP"; any fixed value would do

struct Batch {
  Tensor x;  // (n, seq) i32 inputs
  Tensor y;  // (n, seq) i32 targets: x shifted left by one token
};

class BatchSampler {
 public:
  // tokens: the split to sample from (copied); needs at least seq + 1 tokens.
  BatchSampler(std::vector<int32_t> tokens, int64_t seq, int64_t global_batch, uint64_t seed);

  // Samples [begin, begin + n) of the global batch of `step`; 0 <= begin, 1 <= n, begin + n <= global_batch.
  Batch batch(int64_t step, int64_t begin, int64_t n) const;
  // The whole global batch of `step`.
  Batch batch(int64_t step) const { return batch(step, 0, global_batch_); }
  // Where sample `sample` of step `step` starts in the split.
  int64_t start_offset(int64_t step, int64_t sample) const;

  int64_t seq() const { return seq_; }
  int64_t global_batch() const { return global_batch_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t seq_, global_batch_;
  uint64_t seed_;
};

// BatchSampler's batches, gathered on a device by one kernel from the split, which lives there from construction
// on. The batches are i64 (the device kernels' index type) and land in buffers the sampler owns: each call
// overwrites the previous call's batch (ordered on the device's compute stream, so a step launched before has read
// it by then). Validates no token: the caller checks the split against its model's vocabulary once
// (train::device_sampler), since the kernels downstream index with the ids unchecked.
class DeviceBatchSampler {
 public:
  // tokens: the split (uploaded once, as i32); needs at least seq + 1 tokens; device: a CUDA device.
  DeviceBatchSampler(const std::vector<int32_t>& tokens, int64_t seq, int64_t global_batch, uint64_t seed,
                     Device device);

  // Samples [begin, begin + n) of the global batch of `step`, as BatchSampler::batch(step, begin, n) in i64 on the
  // device; 0 <= begin, 1 <= n, begin + n <= global_batch.
  Batch batch(int64_t step, int64_t begin, int64_t n);
  // The same with the step read from `step` (i64 {1} on the device) when the kernel runs: a CUDA graph that
  // captured this call draws the batch of the step's current value on each replay.
  Batch batch(const Tensor& step, int64_t begin, int64_t n);

  int64_t seq() const { return seq_; }
  int64_t global_batch() const { return global_batch_; }
  Device device() const { return tokens_.device(); }

 private:
  Batch draw(int64_t step, const Tensor& step_on_device, int64_t begin, int64_t n);

  Tensor tokens_;  // (len) i32 on the device
  int64_t seq_, global_batch_;
  uint64_t seed_;
  Batch out_;  // (n, seq) i64 on the device, reused while n stays the same
};

// Deterministic evaluation windows: the first n_windows non-overlapping windows of seq + 1 tokens from the start of
// `tokens`; window k covers tokens[k * (seq + 1), (k + 1) * (seq + 1)), x = its first seq tokens, y = its last seq.
// Asking for more windows than fit is an error naming both numbers.
Batch eval_windows(const std::vector<int32_t>& tokens, int64_t seq, int64_t n_windows);

}  // namespace minidl::data
