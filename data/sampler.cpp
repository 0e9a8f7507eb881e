#include "data/sampler.h"

#include <algorithm>

#include "core/rng.h"

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
  uint4x r = Philox(seed_, kSamplerStream).draw(uint64_t(step) * uint64_t(global_batch_) + uint64_t(sample));
  uint64_t draw64 = (uint64_t(r.x) << 32) | r.y;
  return int64_t(draw64 % uint64_t(int64_t(tokens_.size()) - seq_));
}

Batch BatchSampler::batch(int64_t step, int64_t begin, int64_t n) const {
  MINIDL_CHECK(step >= 0, "BatchSampler::batch: expected step >= 0, got ", step);
  MINIDL_CHECK(begin >= 0 && n >= 1 && begin + n <= global_batch_, "BatchSampler::batch: slice [", begin, ", ",
               begin + n, ") is not a non-empty part of the global batch [0, ", global_batch_, ")");
  Batch b = empty_batch(n, seq_);
  for (int64_t row = 0; row < n; ++row) fill_row(tokens_, start_offset(step, begin + row), seq_, row, b);
  return b;
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
