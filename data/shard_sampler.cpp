#include "data/shard_sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/token_shards.h"

namespace minidl::data {

namespace {

// Philox streams of the shard orders and of the window orders, apart from every other draw of the same seed.
constexpr uint64_t kShardOrderStream = 0x5348'4152'4400'0000ull;   // "SHARD"
constexpr uint64_t kWindowOrderStream = 0x5749'4E44'0000'0000ull;  // "WIND"

// A permutation of [0, n) by Fisher-Yates with Philox(seed, stream)'s draws.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  const Philox rng(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    const uint4x r = rng.draw(uint64_t(i));
    const uint64_t draw64 = (uint64_t(r.x) << 32) | r.y;
    std::swap(p[size_t(i)], p[size_t(draw64 % uint64_t(i + 1))]);
  }
  return p;
}

}  // namespace

ShardSampler::ShardSampler(std::vector<std::string> files, int64_t seq, int64_t global_batch, uint64_t seed,
                           int64_t vocab)
    : files_(std::move(files)), seq_(seq), global_batch_(global_batch), vocab_(vocab), seed_(seed) {
  MINIDL_CHECK(!files_.empty() && seq >= 1 && global_batch >= 1, "ShardSampler: expected training shards, seq >= 1 ",
               "and a global batch >= 1");
  for (const std::string& f : files_) {
    const int64_t tokens = shard_token_count(f);
    const int64_t windows = tokens > seq ? (tokens - 1) / seq : 0;
    MINIDL_CHECK(windows >= global_batch, "token shard ", f, ": ", tokens, " tokens make ", windows, " windows of ",
                 seq + 1, " tokens, fewer than one global batch of ", global_batch);
    steps_of_.push_back(windows / global_batch);
    steps_per_epoch_ += steps_of_.back();
  }
}

std::vector<int64_t> ShardSampler::shard_order(int64_t epoch) const {
  return permutation(int64_t(files_.size()), seed_, kShardOrderStream + uint64_t(epoch));
}

ShardSampler::Place ShardSampler::place(int64_t step) const {
  MINIDL_CHECK(step >= 0, "ShardSampler: expected a step >= 0, got ", step);
  const int64_t epoch = step / steps_per_epoch_;
  int64_t rest = step % steps_per_epoch_;
  for (int64_t shard : shard_order(epoch)) {
    if (rest < steps_of_[size_t(shard)]) return {epoch, shard, rest};
    rest -= steps_of_[size_t(shard)];
  }
  MINIDL_ASSERT(false, "ShardSampler: step ", step, " fell past its epoch");
  return {};
}

const std::string& ShardSampler::shard_of(int64_t step) const { return files_[size_t(place(step).shard)]; }

Batch ShardSampler::batch(int64_t step, int64_t begin, int64_t n) {
  MINIDL_CHECK(begin >= 0 && n >= 1 && begin + n <= global_batch_, "ShardSampler::batch: expected rows [begin, ",
               "begin + n) inside the global batch of ", global_batch_, ", got begin ", begin, ", n ", n);
  const Place at = place(step);
  if (at.epoch != loaded_epoch_ || at.shard != loaded_shard_) {  // the only shard in memory
    tokens_ = read_token_shard(files_[size_t(at.shard)]);
    for (size_t i = 0; vocab_ > 0 && i < tokens_.size(); ++i)
      MINIDL_CHECK(tokens_[i] < vocab_, "token shard ", files_[size_t(at.shard)], ": token ", i, " is ", tokens_[i],
                   ", not one of the tokenizer's ", vocab_, " ids");
    windows_ = permutation((int64_t(tokens_.size()) - 1) / seq_, seed_,
                           kWindowOrderStream + uint64_t(at.epoch) * uint64_t(files_.size()) + uint64_t(at.shard));
    loaded_epoch_ = at.epoch;
    loaded_shard_ = at.shard;
  }
  std::vector<int32_t> x(size_t(n * seq_)), y(size_t(n * seq_));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t start = windows_[size_t(at.step_in_shard * global_batch_ + begin + r)] * seq_;
    std::copy_n(tokens_.begin() + start, seq_, x.begin() + r * seq_);
    std::copy_n(tokens_.begin() + start + 1, seq_, y.begin() + r * seq_);
  }
  return {Tensor::from_vector(x, {n, seq_}), Tensor::from_vector(y, {n, seq_})};
}

}  // namespace minidl::data
