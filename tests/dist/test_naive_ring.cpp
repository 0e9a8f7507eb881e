// The teaching ring (dist/naive/ring.h) against the library's all-reduce, at 2, 3 and 4 ranks: bitwise against the
// "ring" backend (the same schedule: each chunk adds its terms in the same order), within 1e-6 of "mpi" (Open MPI
// adds them in an order of its own), for counts divisible by N, not divisible, below N, 1 and 0, each rank's data
// from its own seed, kSum and kAvg. The reduce-scatter alone leaves rank r's chunk r complete.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "dist/naive/ring.h"
#include "dist/process_group.h"
#include "dist/shard.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

Tensor rank_data(int64_t numel, int rank) {
  std::vector<float> v(static_cast<size_t>(numel));
  Philox rng(7 + uint64_t(rank), 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = rng.normal(i);
  return Tensor::from_vector(v, {numel});
}

std::vector<int64_t> counts(int n) { return {0, 1, n - 1, n, n + 1, 4 * n, 7 * n + 3, 1000}; }

}  // namespace

TEST(NaiveRing, AllReduceEqualsTheLibrarysBitwiseAndMpisWithin1e6) {
  auto ring = dist::make_process_group("ring", ctx().world());
  auto mpi = dist::make_process_group("mpi", ctx().world());
  const int n = ring->size(), r = ring->rank();
  for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg})
    for (int64_t numel : counts(n)) {
      SCOPED_TRACE(::testing::Message() << "numel " << numel << ", " << dist::reduce_op_name(op) << ", " << n
                                        << " ranks");
      Tensor naive = rank_data(numel, r), by_ring = rank_data(numel, r), by_mpi = rank_data(numel, r);
      dist::naive::ring_all_reduce(*ring, naive, op);
      ring->all_reduce(by_ring, op)->wait();
      mpi->all_reduce(by_mpi, op)->wait();
      EXPECT_EQ(naive.to_vector(), by_ring.to_vector());
      const std::vector<double> a = naive.to_vector(), b = by_mpi.to_vector();
      EXPECT_EQ(a.size(), b.size());
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        EXPECT_NEAR(a[i], b[i], 1e-6 * std::max(1.0, std::abs(b[i]))) << i;
    }
}

TEST(NaiveRing, ReduceScatterCompletesThisRanksChunk) {
  auto ring = dist::make_process_group("ring", ctx().world());
  auto mpi = dist::make_process_group("mpi", ctx().world());
  const int n = ring->size(), r = ring->rank();
  for (int64_t numel : counts(n)) {
    SCOPED_TRACE(::testing::Message() << "numel " << numel);
    Tensor naive = rank_data(numel, r), sum = rank_data(numel, r);
    dist::naive::ring_reduce_scatter(*ring, naive);
    mpi->all_reduce(sum, dist::ReduceOp::kSum)->wait();
    const std::vector<double> a = dist::naive::ring_chunk(naive, n, r).to_vector();
    const std::vector<double> b = dist::naive::ring_chunk(sum, n, r).to_vector();
    EXPECT_EQ(int64_t(a.size()), dist::shard_range(numel, n, r).size());
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      EXPECT_NEAR(a[i], b[i], 1e-6 * std::max(1.0, std::abs(b[i]))) << i;
  }
}

TEST(NaiveRing, RefusesWhatItCannotReduce) {
  auto ring = dist::make_process_group("ring", ctx().world());
  Tensor t = Tensor::zeros({4});
  EXPECT_THROW(dist::naive::ring_all_reduce(*ring, t, dist::ReduceOp::kMax), Error);
  Tensor ints = Tensor::zeros({4}, DType::i32);
  EXPECT_THROW(dist::naive::ring_all_reduce(*ring, ints, dist::ReduceOp::kSum), Error);
}
