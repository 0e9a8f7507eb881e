// The reducer under DDP, on the cases that used to go wrong: ranks whose gradients become ready in different
// orders, gradients accumulated under no_sync for a parameter the synchronising backward does not reach,
// parameters no rank uses, an exception in the middle of backward, and gradients as views of the buckets.
// Runs at world sizes 1-4 on "mpi" and "ring".
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "dist/ddp.h"
#include "optim/adamw.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

// A module of plain parameters p0, p1, ... of the given sizes.
struct Params : nn::Module {
  explicit Params(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i)
      p.push_back(register_parameter("p" + std::to_string(i), Tensor::zeros({sizes[i]}).set_requires_grad(true)));
  }
  std::vector<Tensor> p;
};

// sum(c * p): the gradient of p is c everywhere.
Tensor linear(const Tensor& p, double c) { return sum(mul(p, c)); }

// One bucket per parameter.
dist::DDPOptions one_bucket_each(bool allow_unused) {
  dist::DDPOptions o;
  o.caps = {.bucket_cap_bytes = 4, .first_bucket_cap_bytes = 4};
  o.allow_unused_parameters = allow_unused;
  return o;
}

std::unique_ptr<dist::ProcessGroup> world_group(const std::string& backend) {
  return dist::make_process_group(backend, minidl::testing::mpi_context().world());
}

const std::vector<std::string> kBackends = {"mpi", "ring"};

}  // namespace

// Rank r's loss is sum_i (10 r + i + 1) · p_i, except that ranks >= 1 do not use the last parameter, whose bucket
// (the first: buckets follow reverse registration) is ready first on rank 0 and only at the end of backward on the
// others. Buckets of different sizes: reduced out of order they would pair different buckets in one collective.
TEST(Reducer, BucketsAreReducedInIndexOrderWhateverOrderTheyBecomeReady) {
  const int n = minidl::testing::mpi_context().world_size(), me = minidl::testing::mpi_context().rank();
  for (const std::string& backend : kBackends) {
    SCOPED_TRACE(backend);
    auto pg = world_group(backend);
    Params m({1, 2, 3, 4});
    dist::DistributedDataParallel ddp(m, *pg, one_bucket_each(/*allow_unused=*/true));
    EXPECT_EQ(ddp.buckets().size(), 4u);
    Tensor loss = linear(m.p[0], 10 * me + 1);
    for (int i = 1; i < 4; ++i)
      if (i < 3 || me == 0) loss = add(loss, linear(m.p[i], 10 * me + i + 1));
    loss.backward();
    for (int i = 0; i < 4; ++i) {
      double expected = 0;
      for (int r = 0; r < n; ++r)
        if (i < 3 || r == 0) expected += 10 * r + i + 1;
      expected = double(float(expected) / float(n));  // the gradients are f32, averaged in f32
      ASSERT_TRUE(m.p[i].grad().defined());
      EXPECT_EQ(m.p[i].grad().to_vector(), std::vector<double>(size_t(i + 1), expected)) << "p" << i;
    }
  }
}

// Micro-batch 1 (no_sync) uses a and b; micro-batch 2 (synchronising) uses only b. a's accumulated gradient must
// be averaged, not replaced by zero.
TEST(Reducer, GradientAccumulatedUnderNoSyncSurvivesAnUnusedSynchronisingBackward) {
  const int me = minidl::testing::mpi_context().rank(), n = minidl::testing::mpi_context().world_size();
  for (const std::string& backend : kBackends) {
    SCOPED_TRACE(backend);
    auto pg = world_group(backend);
    Params m({3, 2});
    dist::DistributedDataParallel ddp(m, *pg, one_bucket_each(/*allow_unused=*/false));
    {
      auto guard = ddp.no_sync();
      add(linear(m.p[0], 2 + me), linear(m.p[1], 3)).backward();
    }
    linear(m.p[1], 5).backward();
    double mean_a = double(float(n * (n + 3) / 2) / float(n));  // mean of 2 + r over the ranks, in f32
    EXPECT_EQ(m.p[0].grad().to_vector(), std::vector<double>(3, mean_a));
    EXPECT_EQ(m.p[1].grad().to_vector(), std::vector<double>(2, 8.0));
  }
}

// A parameter no rank uses keeps an undefined gradient, and AdamW leaves it alone (no decay, no moments); one that
// only rank 0 uses is averaged with the others' zeros.
TEST(Reducer, ParameterUnusedOnEveryRankKeepsAnUndefinedGradient) {
  const int me = minidl::testing::mpi_context().rank(), n = minidl::testing::mpi_context().world_size();
  auto pg = world_group("ring");
  Params m({2, 2, 2});
  m.p[2].detach().fill_(1.0);
  dist::DistributedDataParallel ddp(m, *pg, one_bucket_each(/*allow_unused=*/true));
  optim::AdamW opt(optim::decay_groups(m.named_parameters(), 0.1), {.lr = 0.1});
  Tensor loss = linear(m.p[0], 1.0);
  if (me == 0) loss = add(loss, linear(m.p[1], 4.0));
  loss.backward();
  EXPECT_FALSE(m.p[2].grad().defined()) << "no rank used p2";
  ASSERT_TRUE(m.p[1].grad().defined());
  EXPECT_EQ(m.p[1].grad().to_vector(), std::vector<double>(2, double(4.0f / float(n))));
  opt.step();
  EXPECT_EQ(m.p[2].to_vector(), std::vector<double>(2, 1.0)) << "skipped: no weight decay";
}

// An op whose backward throws: the reducer must be usable for the next backward.
TEST(Reducer, ExceptionDuringBackwardLeavesTheReducerUsable) {
  const int n = minidl::testing::mpi_context().world_size(), me = minidl::testing::mpi_context().rank();
  auto pg = world_group("mpi");
  Params m({2, 2});
  dist::DistributedDataParallel ddp(m, *pg, one_bucket_each(/*allow_unused=*/false));
  // The throwing node is recorded first, so it runs after p1's gradient is ready (later nodes run first): a pass
  // has begun and p1's bucket may be in flight when the exception comes.
  Tensor boom = autograd::record("boom", {m.p[0]}, m.p[0].detach().clone(), [](const Tensor&) -> std::vector<Tensor> {
    MINIDL_CHECK(false, "boom");
    return {};
  });
  Tensor bad = add(sum(boom), linear(m.p[1], 1.0));
  EXPECT_THROW(bad.backward(), Error);
  m.zero_grad();
  add(linear(m.p[0], me + 1), linear(m.p[1], 2.0)).backward();
  EXPECT_EQ(m.p[0].grad().to_vector(), std::vector<double>(2, double(float(n * (n + 1) / 2) / float(n))));
  EXPECT_EQ(m.p[1].grad().to_vector(), std::vector<double>(2, 2.0));
}

// After the first backward a parameter's gradient is its span of the bucket: the next steps copy nothing.
TEST(Reducer, GradientsAreViewsOfTheBuckets) {
  auto pg = world_group("mpi");
  Params m({5, 3});
  dist::DistributedDataParallel ddp(m, *pg, {});
  ASSERT_EQ(ddp.buckets().size(), 1u);
  for (int step = 0; step < 2; ++step) {
    add(linear(m.p[0], 1.0), linear(m.p[1], 2.0)).backward();
    Tensor& bucket = ddp.reducer().buffer(0);
    EXPECT_EQ(bucket.numel() % pg->size(), 0) << "padded to a multiple of the group size";
    for (const Tensor& p : m.p) {
      EXPECT_TRUE(p.grad().shares_storage(bucket));
      EXPECT_EQ(p.grad().shape(), p.shape());
    }
    m.zero_grad();
  }
}
