// DDP against one process over the same global batch (the equivalence rule), determinism, accumulation with
// no_sync, and unused parameters. Runs at world sizes 1-4.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "autograd/functions.h"
#include "core/rng.h"
#include "dist/ddp.h"
#include "dist/process_group.h"
#include "nn/gpt.h"
#include "optim/sgd.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

constexpr int64_t kVocab = 13, kSeq = 8, kGlobalBatch = 24;

nn::GPTConfig tiny(double dropout = 0.0) { return nn::GPTConfig{kVocab, kSeq, 2, 2, 16, dropout, true}; }

// Deterministic global batch for a step: (kGlobalBatch, kSeq) inputs and targets.
std::pair<Tensor, Tensor> global_batch(int step) {
  std::vector<int32_t> x(kGlobalBatch * kSeq), y(kGlobalBatch * kSeq);
  Philox rng(99, uint64_t(step));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = int32_t(rng.draw(i).x % kVocab);
    y[i] = int32_t(rng.draw(i).y % kVocab);
  }
  return {Tensor::from_vector(x, {kGlobalBatch, kSeq}), Tensor::from_vector(y, {kGlobalBatch, kSeq})};
}

struct TrainResult {
  std::vector<double> losses;  // mean loss of the global batch at each step
  std::vector<std::vector<double>> weights;
};

// Trains `steps` steps; with a process group, data-parallel over its ranks (each takes its slice of the global
// batch), otherwise one process on the whole batch. `micro` micro-batches per step (accumulated under no_sync).
TrainResult train(dist::ProcessGroup* pg, int steps, int micro, double dropout = 0.0) {
  nn::GPT model(tiny(dropout), 1337);
  model.train();
  // SGD, not Adam: Adam divides by the gradient's own magnitude, which turns the rounding noise of gradients that
  // are zero in exact arithmetic (the attention key bias) into full-size updates, hiding what this test compares.
  optim::SGD opt(optim::decay_groups(model.named_parameters(), 0.0), {.lr = 0.1, .momentum = 0.9});
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  int world = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
  if (pg) ddp = std::make_unique<dist::DistributedDataParallel>(model, *pg);
  int64_t per_rank = kGlobalBatch / world, per_micro = per_rank / micro;
  TrainResult run;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(s);
    double local = 0;
    for (int m = 0; m < micro; ++m) {
      int64_t begin = rank * per_rank + m * per_micro;
      model.dropout_context().first_sample = begin;  // masks follow the sample, not the rank
      Tensor loss = mul(model.loss(x.narrow(0, begin, per_micro), y.narrow(0, begin, per_micro)), 1.0 / micro);
      local += loss.item();
      if (ddp && m + 1 < micro) {
        auto guard = ddp->no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    Tensor l = Tensor::scalar(local);
    if (pg) pg->all_reduce(l, dist::ReduceOp::kAvg)->wait();
    run.losses.push_back(l.item());
    opt.step();
    opt.zero_grad();
    model.dropout_context().step += 1;
  }
  for (const Tensor& p : model.parameters()) run.weights.push_back(p.to_vector());
  return run;
}

void expect_close(const TrainResult& a, const TrainResult& b, double rel) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s)
    EXPECT_NEAR(a.losses[s], b.losses[s], rel * std::abs(b.losses[s])) << "step " << s;
  double worst = 0;
  for (size_t p = 0; p < a.weights.size(); ++p)
    for (size_t i = 0; i < a.weights[p].size(); ++i)
      worst = std::max(worst, std::abs(a.weights[p][i] - b.weights[p][i]) / std::max(1e-2, std::abs(b.weights[p][i])));
  EXPECT_LT(worst, rel) << "largest relative weight difference";
}

std::unique_ptr<dist::ProcessGroup> world_group(const char* backend) {
  return dist::make_process_group(backend, minidl::testing::mpi_context().world());
}

}  // namespace

TEST(DDP, EqualsOneProcessOverTheSameGlobalBatch) {
  TrainResult single = train(nullptr, 30, 1);
  for (const char* backend : {"mpi", "ring"}) {
    auto pg = world_group(backend);
    expect_close(train(pg.get(), 30, 1), single, 1e-4);
  }
}

TEST(DDP, EqualsOneProcessWithDropout) {
  TrainResult single = train(nullptr, 10, 1, 0.2);
  auto pg = world_group("mpi");
  expect_close(train(pg.get(), 10, 1, 0.2), single, 1e-4);
  expect_close(train(nullptr, 10, 2, 0.2), single, 1e-4);  // accumulation: micro-batches keep their masks too
}

TEST(DDP, RunToRunBitwiseDeterministic) {
  auto pg = world_group("ring");
  TrainResult a = train(pg.get(), 10, 1), b = train(pg.get(), 10, 1);
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
  EXPECT_EQ(a.weights, b.weights);
}

TEST(DDP, AccumulatedMicroBatchesEqualOneLargerBatch) {
  TrainResult single = train(nullptr, 10, 1);
  expect_close(train(nullptr, 10, 2), single, 1e-4);  // without DDP
  auto pg = world_group("mpi");
  expect_close(train(pg.get(), 10, 2), single, 1e-4);  // with DDP: no_sync on the first micro-batch
}

TEST(DDP, BucketsAreOverlappedAndAccounted) {
  auto pg = world_group("ring");
  nn::GPT model(tiny(), 1);
  dist::DDPOptions opt;
  opt.caps = {.bucket_cap_bytes = 4096, .first_bucket_cap_bytes = 1024};  // many small buckets
  dist::DistributedDataParallel ddp(model, *pg, opt);
  EXPECT_GT(ddp.buckets().size(), 3u);
  auto [x, y] = global_batch(0);
  const auto t0 = std::chrono::steady_clock::now();
  model.loss(x, y).backward();
  const double backward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ddp.last_step().buckets, int(ddp.buckets().size()));
  // The communication thread's time in the collectives, and the main thread's wait for them at the end of the
  // backward: both inside the backward's own time. With more than one rank the buckets travel: not zero.
  const double comm = ddp.last_step().comm_ms, exposed = ddp.last_step().exposed_comm_ms;
  EXPECT_GE(exposed, 0.0);
  EXPECT_LE(exposed, backward_ms);
  EXPECT_LE(comm, backward_ms);
  if (pg->size() > 1) EXPECT_GT(comm, 0.0);
}

TEST(DDP, UnusedParameterIsReportedByNameOrAllowed) {
  auto pg = world_group("mpi");
  nn::GPT model(tiny(), 1);
  Tensor extra = Tensor::zeros({3}).set_requires_grad(true);
  model.register_parameter("never_used", extra);
  auto [x, y] = global_batch(0);
  {
    dist::DistributedDataParallel ddp(model, *pg);
    try {
      model.loss(x, y).backward();
      ADD_FAILURE() << "expected an error naming never_used";
    } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("never_used"), std::string::npos) << e.what(); }
  }
  model.zero_grad();
  dist::DDPOptions allow;
  allow.allow_unused_parameters = true;
  dist::DistributedDataParallel ddp(model, *pg, allow);
  model.loss(x, y).backward();
  EXPECT_FALSE(extra.grad().defined()) << "no rank used it: its gradient stays undefined, as in PyTorch";
}
