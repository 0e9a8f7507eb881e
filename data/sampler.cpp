#include "data/sampler.h"

#include <algorithm>

#include "core/rng.h"
#include "ops/kernels/sample_windows.h"
#include "ops/sample_windows.h"

namespace minidl::data {

// Copies window tokens[start, start + seq] into row `row` of x and y.
static void fill_row(const std::vector<int32_t>& tokens, int64_t start, int64_t seq, int64_t row, Batch& b) {
  const int32_t* src = tokens.data() + start;
  std::copy(src, src + seq, b.x.data<int32_t>() + row * seq);
  std::copy(src + 1, src + seq + 1, b.y.data<int32_t>() + row * seq);
}

static Batch empty_batch(int64_t n, int64_t seq) {
  return {Tensor::empty({n, seq}, DType::i32), Tensor::empty({n, seq}, DType::i32)};
}

BatchSampler::BatchSampler(std::vector<int32_t> tokens, int64_t seq, int64_t global_batch, uint64_t seed)
    : tokens_(std::move(tokens)), seq_(seq), global_batch_(global_batch), seed_(seed) {
  MINIDL_CHECK(seq >= 1, "BatchSampler: expected seq >= 1, got ", seq);
  MINIDL_CHECK(global_batch >= 1, "BatchSampler: expected global_batch >= 1, got ", global_batch);
  MINIDL_CHECK(int64_t(tokens_.size()) >= seq + 1, "BatchSampler: the split has ", tokens_.size(),
               " tokens, fewer than seq + 1 = ", seq + 1, " needed for one window");
}

int64_t BatchSampler::start_offset(int64_t step, int64_t sample) const {
  return int64_t(ops::kernels::window_start(Philox(seed_, kSamplerStream), uint64_t(step), uint64_t(global_batch_),
                                            uint64_t(sample), uint64_t(int64_t(tokens_.size()) - seq_)));
}

Batch BatchSampler::batch(int64_t step, int64_t begin, int64_t n) const {
  MINIDL_CHECK(step >= 0, "BatchSampler::batch: expected step >= 0, got ", step);
  MINIDL_CHECK(begin >= 0 && n >= 1 && begin + n <= global_batch_, "BatchSampler::batch: slice [", begin, ", ",
               begin + n, ") is not a non-empty part of the global batch [0, ", global_batch_, ")");
  Batch b = empty_batch(n, seq_);
  for (int64_t row = 0; row < n; ++row) fill_row(tokens_, start_offset(step, begin + row), seq_, row, b);
  return b;
}

DeviceBatchSampler::DeviceBatchSampler(const std::vector<int32_t>& tokens, int64_t seq, int64_t global_batch,
                                       uint64_t seed, Device device)
    : seq_(seq), global_batch_(global_batch), seed_(seed) {
  MINIDL_CHECK(device.is_cuda(), "DeviceBatchSampler: expected a CUDA device, got ", device);
  MINIDL_CHECK(seq >= 1, "DeviceBatchSampler: expected seq >= 1, got ", seq);
  MINIDL_CHECK(global_batch >= 1, "DeviceBatchSampler: expected global_batch >= 1, got ", global_batch);
  MINIDL_CHECK(int64_t(tokens.size()) >= seq + 1, "DeviceBatchSampler: the split has ", tokens.size(),
               " tokens, fewer than seq + 1 = ", seq + 1, " needed for one window");
  MemoryTagGuard tag(MemTag::kOther);  // the data, kept for the sampler's life
  tokens_ = Tensor::from_vector(tokens, {int64_t(tokens.size())}, DType::i32).to(device);  // the one upload
}

Batch DeviceBatchSampler::batch(int64_t step, int64_t begin, int64_t n) {
  MINIDL_CHECK(step >= 0, "DeviceBatchSampler::batch: expected step >= 0, got ", step);
  return draw(step, Tensor(), begin, n);
}

Batch DeviceBatchSampler::batch(const Tensor& step, int64_t begin, int64_t n) {
  MINIDL_CHECK(step.defined(), "DeviceBatchSampler::batch: expected a step tensor, got an undefined one");
  return draw(0, step, begin, n);
}

Batch DeviceBatchSampler::draw(int64_t step, const Tensor& step_on_device, int64_t begin, int64_t n) {
  MINIDL_CHECK(begin >= 0 && n >= 1 && begin + n <= global_batch_, "DeviceBatchSampler::batch: slice [", begin, ", ",
               begin + n, ") is not a non-empty part of the global batch [0, ", global_batch_, ")");
  if (!out_.x.defined() || out_.x.size(0) != n) {
    MemoryTagGuard tag(MemTag::kActivations);  // what an uploaded batch counted as
    out_ = {Tensor::empty({n, seq_}, DType::i64, device()), Tensor::empty({n, seq_}, DType::i64, device())};
  }
  ops::sample_windows_(tokens_, seq_, {seed_, kSamplerStream, global_batch_, step, step_on_device, begin}, out_.x,
                       out_.y);
  return out_;
}

Batch eval_windows(const std::vector<int32_t>& tokens, int64_t seq, int64_t n_windows) {
  MINIDL_CHECK(seq >= 1, "eval_windows: expected seq >= 1, got ", seq);
  MINIDL_CHECK(n_windows >= 1, "eval_windows: expected n_windows >= 1, got ", n_windows);
  int64_t available = int64_t(tokens.size()) / (seq + 1);
  MINIDL_CHECK(n_windows <= available, "eval_windows: asked for ", n_windows, " windows of seq + 1 = ", seq + 1,
               " tokens, but the split's ", tokens.size(), " tokens hold only ", available);
  Batch b = empty_batch(n_windows, seq);
  for (int64_t k = 0; k < n_windows; ++k) fill_row(tokens, k * (seq + 1), seq, k, b);
  return b;
}

}  // namespace minidl::data
