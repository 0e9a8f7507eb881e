// Local SGD and DiLoCo (dist/local_sgd.h) against their oracles, every rank a replica, at 2 and 3 ranks:
// - local SGD at H = 1 with SGD = DDP within 1e-6 (parameters averaged instead of gradients: rounding apart);
// - DiLoCo with inner SGD, H = 1, outer lr 1 and no momentum = DDP within 1e-6;
// - a constant-gradient mock at R = 2, H = 6 against a golden parameter history (torchft's regression test's
//   shape), which a pseudo-gradient of the wrong sign fails;
// - R replicas = one process training R models in turn and doing the outer step by hand, bitwise at 2 ranks (a sum
//   of two floats does not depend on their order), within 1e-6 at 3; the teaching version (dist/naive/local_sgd.h)
//   = production, bitwise at 2;
// - the counters: ceil(steps / H) syncs of 4 bytes a parameter each.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "core/rng.h"
#include "dist/ddp.h"
#include "dist/local_sgd.h"
#include "dist/naive/local_sgd.h"
#include "dist/process_group.h"
#include "nn/gpt.h"
#include "optim/sgd.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

constexpr int64_t kVocab = 13, kSeq = 8, kGlobalBatch = 24;

const dist::Context& ctx() { return minidl::testing::mpi_context(); }
nn::GPTConfig tiny() { return nn::GPTConfig{kVocab, kSeq, 2, 2, 16, 0.0, true}; }

std::pair<Tensor, Tensor> global_batch(int step) {
  std::vector<int32_t> x(kGlobalBatch * kSeq), y(kGlobalBatch * kSeq);
  Philox rng(7, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {kGlobalBatch, kSeq}), Tensor::from_vector(y, {kGlobalBatch, kSeq})};
}

std::vector<std::vector<float>> weights(nn::GPT& model) {
  std::vector<std::vector<float>> w;
  for (const Tensor& p : model.parameters()) w.push_back(p.detach().to_float_vector());
  return w;
}

// One inner step of replica `r` of `n` on its slice of the step's global batch.
void inner_step(nn::GPT& model, optim::SGD& opt, int step, int r, int n) {
  auto [x, y] = global_batch(step);
  const int64_t rows = kGlobalBatch / n;
  model.loss(x.narrow(0, r * rows, rows), y.narrow(0, r * rows, rows)).backward();
  opt.step();
  opt.zero_grad();
}

std::unique_ptr<optim::SGD> sgd(nn::GPT& model) {
  return std::make_unique<optim::SGD>(optim::decay_groups(model.named_parameters(), 0.0), optim::SGDOptions{.lr = 0.1});
}

enum class Run { kDDP, kLocalSgd, kDiLoCoAsLocalSgd, kDiLoCo, kNaiveDiLoCo };

// `steps` steps over the world, every rank a replica (or a DDP rank); each rank's model from its own seed, so the
// start-up broadcast is part of what is compared.
std::vector<std::vector<float>> train(Run run, int steps, int64_t every, dist::OuterStats* stats = nullptr) {
  auto pg = dist::make_process_group("mpi", ctx().world());
  nn::GPT model(tiny(), 1000 + uint64_t(ctx().rank()));
  model.train();
  std::unique_ptr<optim::SGD> opt = sgd(model);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::OuterSync> outer;
  std::unique_ptr<dist::naive::LocalSgd> naive;
  dist::OuterOptions o{.kind = dist::OuterKind::kDiLoCo, .every = every};
  if (run == Run::kDDP) ddp = std::make_unique<dist::DistributedDataParallel>(model, *pg);
  if (run == Run::kLocalSgd) o.kind = dist::OuterKind::kLocalSgd;
  if (run == Run::kDiLoCoAsLocalSgd) o.lr = 1, o.momentum = 0;
  if (run == Run::kNaiveDiLoCo)
    naive = std::make_unique<dist::naive::LocalSgd>(model, *pg,
                                                    dist::naive::LocalSgdOptions{.diloco = true, .every = int(every)});
  else if (run != Run::kDDP)
    outer = std::make_unique<dist::OuterSync>(model.parameters(), *pg, o);
  for (int s = 0; s < steps; ++s) {
    inner_step(model, *opt, s, pg->rank(), pg->size());
    if (outer) outer->after_step(s + 1);
    if (naive) naive->after_step(s + 1);
  }
  if (outer) outer->finish(steps);
  if (stats && outer) *stats = outer->stats();
  return weights(model);
}

double worst_rel(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t p = 0; p < a.size(); ++p)
    for (size_t i = 0; i < a[p].size(); ++i)
      worst = std::max(worst, std::abs(double(a[p][i]) - b[p][i]) / std::max(1e-2, std::abs(double(b[p][i]))));
  return worst;
}

}  // namespace

TEST(LocalSgd, AtOneStepWithSgdEqualsDDP) {
  const auto ddp = train(Run::kDDP, 5, 1);
  EXPECT_LT(worst_rel(train(Run::kLocalSgd, 5, 1), ddp), 1e-6);
  EXPECT_LT(worst_rel(train(Run::kDiLoCoAsLocalSgd, 5, 1), ddp), 1e-6);
}

// torchft's DiLoCo regression test's shape: every replica's gradient constant, so a window of H steps moves replica
// r by H·lr·g_r exactly and every outer step is a closed form. Replica r's gradient is (r + 1)·c, so at R = 2 the
// pseudo-gradient is Δ = H·lr·1.5·c = 0.9·c (H 6, inner lr 0.1) in every window, and with η 0.7, μ 0.9 (Nesterov):
//   m1 = Δ,          θ1 = θ0 − 0.7·(Δ + 0.9·m1) = θ0 − 1.197·c
//   m2 = 1.9·Δ,      θ2 = θ1 − 0.7·(Δ + 0.9·m2) = θ1 − 1.7073·c
//   m3 = 2.71·Δ,     θ3 = θ2 − 0.7·(Δ + 0.9·m3) = θ2 − 2.16657·c
TEST(LocalSgd, ConstantGradientMockMatchesTheGoldenHistory) {
  if (ctx().world_size() != 2) GTEST_SKIP() << "the golden history is R = 2's";
  auto pg = dist::make_process_group("mpi", ctx().world());
  const std::vector<float> c = {1.0f, -2.0f, 0.5f, 3.0f};
  Tensor theta = Tensor::full({4}, 1.0);
  dist::OuterSync outer({theta}, *pg, {.kind = dist::OuterKind::kDiLoCo, .every = 6});
  const std::vector<std::vector<float>> golden = {{-0.197f, 3.394f, 0.4015f, -2.591f},
                                                  {-1.9043f, 6.8086f, -0.45215f, -7.7129f},
                                                  {-4.07087f, 11.14174f, -1.535435f, -14.21261f}};
  std::vector<std::vector<float>> history;
  for (int step = 1; step <= 18; ++step) {
    std::vector<float> p = theta.to_float_vector();
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * float(pg->rank() + 1) * c[i];  // inner SGD, constant grad
    theta.copy_(Tensor::from_vector(p, {4}));
    if (outer.after_step(step)) history.push_back(theta.to_float_vector());
  }
  ASSERT_EQ(history.size(), golden.size());
  for (size_t w = 0; w < golden.size(); ++w)
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(history[w][i], golden[w][i], 1e-4) << "window " << w << " element " << i;
  EXPECT_EQ(outer.stats().syncs, 3);
}

// The replicas against one process that trains R models in turn, each on its slice, and does DiLoCo's outer step
// by hand: the mean of the R pseudo-gradients summed in replica order, then torch.optim.SGD's Nesterov rule.
TEST(LocalSgd, ReplicasEqualAOneProcessSimulation) {
  const int n = ctx().world_size(), steps = 7;
  const int64_t every = 3;  // two whole windows and a last one cut short at step 7
  dist::OuterStats stats;
  const auto distributed = train(Run::kDiLoCo, steps, every, &stats);
  std::vector<std::unique_ptr<nn::GPT>> models;
  std::vector<std::unique_ptr<optim::SGD>> opts;
  for (int r = 0; r < n; ++r) {
    models.push_back(std::make_unique<nn::GPT>(tiny(), 1000));  // replica 0's seed: the broadcast's result
    models.back()->train();
    opts.push_back(sgd(*models.back()));
  }
  std::vector<float> global, momentum;
  for (const Tensor& p : models[0]->parameters()) {
    const std::vector<float> v = p.detach().to_float_vector();
    global.insert(global.end(), v.begin(), v.end());
  }
  momentum.assign(global.size(), 0.0f);
  auto outer_step = [&] {
    std::vector<float> sum(global.size(), 0.0f);
    for (int r = 0; r < n; ++r) {
      size_t at = 0;
      for (const Tensor& p : models[r]->parameters())
        for (float v : p.detach().to_float_vector()) sum[at] = sum[at] + (global[at] - v), ++at;
    }
    for (size_t i = 0; i < global.size(); ++i) {
      const float d = sum[i] / float(n), m = 0.9f * momentum[i] + d;
      momentum[i] = m;
      global[i] = global[i] - 0.7f * (d + 0.9f * m);
    }
    for (int r = 0; r < n; ++r) {
      size_t at = 0;
      for (Tensor& p : models[r]->parameters()) {
        const std::vector<float> piece(global.begin() + at, global.begin() + at + p.numel());
        p.detach().copy_(Tensor::from_vector(piece, p.shape()));
        at += p.numel();
      }
    }
  };
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < n; ++r) inner_step(*models[r], *opts[r], s, r, n);
    if ((s + 1) % every == 0 || s + 1 == steps) outer_step();
  }
  const auto simulated = weights(*models[0]);
  if (n == 2)
    EXPECT_EQ(distributed, simulated);
  else
    EXPECT_LT(worst_rel(distributed, simulated), 1e-6);
  // ceil(7 / 3) = 3 syncs, each of the model's f32 parameters.
  int64_t numel = 0;
  for (const Tensor& p : models[0]->parameters()) numel += p.numel();
  EXPECT_EQ(stats.syncs, 3);
  EXPECT_EQ(stats.bytes, uint64_t(3 * numel * 4));
}

TEST(LocalSgd, NaiveEqualsProduction) {
  const auto production = train(Run::kDiLoCo, 6, 3), naive = train(Run::kNaiveDiLoCo, 6, 3);
  if (ctx().world_size() == 2)
    EXPECT_EQ(naive, production);
  else
    EXPECT_LT(worst_rel(naive, production), 1e-6);
}

TEST(LocalSgd, RefusesWhatItCannotDo) {
  auto pg = dist::make_process_group("mpi", ctx().world());
  Tensor p = Tensor::zeros({3});
  EXPECT_THROW(dist::OuterSync({p}, *pg, {.every = 0}), Error);
  EXPECT_THROW(dist::OuterSync({Tensor::zeros({3}, DType::bf16)}, *pg, {}), Error);
  EXPECT_THROW(dist::outer_kind("powersgd"), Error);
}
