// PowerSGD (dist/powersgd.h) at 2 and 3 ranks against what it must equal:
// - at full rank (r = min(n, m)) the projection is the identity: the exact f32 mean, within rounding;
// - error feedback telescopes: the sum of what was sent plus the ranks' mean error equals the sum of the mean
//   gradients, after any number of rank-1 steps;
// - the first start_iter steps are all_reduce's average bitwise, with no error kept; then a matrix costs (n + m)·r
//   values, counted by the group's bytes;
// - DDP with the hook at full rank gives plain DDP's gradients; --comm-hook's bad ranks are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "dist/ddp.h"
#include "dist/powersgd.h"
#include "nn/gpt.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

// A bucket of a 6 x 4 matrix, a 5 x 3 matrix and a 7-vector, as a reducer lays it out.
std::vector<Tensor> params() { return {Tensor::zeros({6, 4}), Tensor::zeros({5, 3}), Tensor::zeros({7})}; }
std::vector<dist::BucketSpec> layout() { return {dist::BucketSpec{DType::f32, {0, 1, 2}, {0, 24, 39}, 46}}; }

std::vector<float> draws(int rank, int step) {
  Philox rng(3, uint64_t(rank) * 100 + uint64_t(step));
  std::vector<float> v(46);
  for (size_t i = 0; i < v.size(); ++i) v[i] = rng.normal(i);
  return v;
}

std::vector<double> mean_over_ranks(int n, int step) {
  std::vector<double> m(46, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> d = draws(r, step);
    for (size_t i = 0; i < m.size(); ++i) m[i] += double(d[i]) / n;
  }
  return m;
}

}  // namespace

TEST(PowerSgd, FullRankIsTheExactMean) {
  auto pg = dist::make_process_group("mpi", ctx().world());
  dist::PowerSgd hook({.rank = 8, .start_iter = 0, .min_compression_rate = 0});
  hook.bind(layout(), params());
  Tensor buffer = Tensor::from_vector(draws(pg->rank(), 0), {46});
  hook.reduce(*pg, 0, buffer)->wait();
  const std::vector<double> got = buffer.to_vector(), want = mean_over_ranks(pg->size(), 0);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

// Rank 1: each step sends a poor approximation, but nothing is lost: Σ_t M̂_t + mean_k e_k = Σ_t mean_k g_k,t.
TEST(PowerSgd, ErrorFeedbackTelescopes) {
  auto pg = dist::make_process_group("mpi", ctx().world());
  dist::PowerSgd hook({.rank = 1, .start_iter = 0, .min_compression_rate = 0});
  hook.bind(layout(), params());
  std::vector<double> sent(46, 0.0), want(46, 0.0);
  for (int step = 0; step < 6; ++step) {
    Tensor buffer = Tensor::from_vector(draws(pg->rank(), step), {46});
    hook.reduce(*pg, 0, buffer)->wait();
    const std::vector<double> got = buffer.to_vector(), mean = mean_over_ranks(pg->size(), step);
    for (size_t i = 0; i < sent.size(); ++i) sent[i] += got[i], want[i] += mean[i];
  }
  Tensor error = Tensor::from_vector(hook.error(0), {46});
  pg->all_reduce(error, dist::ReduceOp::kAvg)->wait();
  const std::vector<double> e = error.to_vector();
  double worst_compression = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_NEAR(sent[i] + e[i], want[i], 1e-4) << i;
    worst_compression = std::max(worst_compression, std::abs(sent[i] - want[i]));
  }
  EXPECT_GT(worst_compression, 1e-2) << "rank 1 sent the exact mean: the test would not see a lost error";
}

// The first start_iter steps are plain f32 averages; then (n + m)·r values a matrix, plus the vector whole.
TEST(PowerSgd, PlainAveragesFirstThenLowRankBytes) {
  auto pg = dist::make_process_group("mpi", ctx().world());
  dist::PowerSgd hook({.rank = 2, .start_iter = 2, .min_compression_rate = 0});
  hook.bind(layout(), params());
  for (int step = 0; step < 3; ++step) {
    Tensor buffer = Tensor::from_vector(draws(pg->rank(), step), {46});
    Tensor plain = buffer.clone();
    pg->all_reduce(plain, dist::ReduceOp::kAvg)->wait();
    const uint64_t before = pg->all_reduce_bytes();
    hook.reduce(*pg, 0, buffer)->wait();
    const uint64_t bytes = pg->all_reduce_bytes() - before;
    if (step < 2) {
      EXPECT_EQ(buffer.to_vector(), plain.to_vector()) << step;
      EXPECT_TRUE(hook.error(0).empty());
      EXPECT_EQ(bytes, 46u * 4);
    } else {
      EXPECT_EQ(bytes, uint64_t((6 + 4) * 2 + (5 + 3) * 2 + 7) * 4);  // P's, then the Qs and the vector
      EXPECT_EQ(hook.error(0).size(), 46u);
    }
  }
}

// DDP over a tiny GPT with PowerSGD at a rank no matrix exceeds: plain DDP's gradients, within rounding.
TEST(PowerSgd, DdpAtFullRankGivesDdpsGradients) {
  auto pg = dist::make_process_group("mpi", ctx().world());
  const nn::GPTConfig cfg{11, 8, 1, 2, 16, 0.0, true};
  std::vector<int32_t> x(2 * 8), y(2 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 5 + size_t(pg->rank())) % 11), y[i] = int32_t(i % 11);
  auto grads = [&](std::shared_ptr<dist::PowerSgd> hook) {
    nn::GPT model(cfg, 9);
    dist::DistributedDataParallel ddp(model, *pg, dist::DDPOptions{.powersgd = hook});
    model.loss(Tensor::from_vector(x, {2, 8}), Tensor::from_vector(y, {2, 8})).backward();
    std::vector<std::vector<double>> g;
    for (const Tensor& p : model.parameters()) g.push_back(p.grad().to_vector());
    return g;
  };
  const auto want = grads(nullptr);
  const auto got = grads(
      std::make_shared<dist::PowerSgd>(dist::PowerSgdOptions{.rank = 64, .start_iter = 0, .min_compression_rate = 0}));
  for (size_t p = 0; p < want.size(); ++p)
    for (size_t i = 0; i < want[p].size(); ++i) EXPECT_NEAR(got[p][i], want[p][i], 2e-5) << p << " " << i;
  EXPECT_THROW(dist::PowerSgd({.rank = 0}), Error);
}
