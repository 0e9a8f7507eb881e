// broadcast, send/recv and barrier of every backend, and the ring against the MPI library bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "dist_test_util.h"

namespace minidl::testing {
namespace {

using dist::ReduceOp;

class PointToPoint : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { group_ = make_group(GetParam(), MPI_COMM_WORLD); }
  int rank() const { return group_->rank(); }
  int n() const { return group_->size(); }
  std::unique_ptr<dist::ProcessGroup> group_;
};

TEST_P(PointToPoint, BroadcastFromEveryRoot) {
  for (DType dtype : kAllDTypes)
    for (int root = 0; root < n(); ++root)
      for (int64_t numel : {int64_t(0), int64_t(1), int64_t(1001), int64_t(GetParam() == "ring" ? 400000 : 3001)}) {
        SCOPED_TRACE(::testing::Message() << dtype << " root " << root << " numel " << numel);
        Tensor t = pattern_tensor(rank(), numel, dtype);
        group_->broadcast(t, root)->wait();
        EXPECT_EQ(t.to_vector(), pattern_tensor(root, numel, dtype).to_vector());
      }
}

// Each rank sends to its right neighbour and receives from its left, both posted before either is waited on.
TEST_P(PointToPoint, SendRecvAroundTheRing) {
  const int right = (rank() + 1) % n(), left = (rank() + n() - 1) % n();
  for (DType dtype : kAllDTypes)
    for (int64_t numel : {int64_t(0), int64_t(1), int64_t(100003)}) {
      SCOPED_TRACE(::testing::Message() << dtype << " numel " << numel);
      Tensor out = pattern_tensor(rank(), numel, dtype);
      Tensor in = Tensor::zeros({numel}, dtype);
      auto r = group_->recv(in, left, 5);
      auto s = group_->send(out, right, 5);
      r->wait();
      s->wait();
      EXPECT_EQ(in.to_vector(), pattern_tensor(left, numel, dtype).to_vector());
    }
}

// Tags keep messages apart: two messages received in the opposite order to the one they were sent in.
TEST_P(PointToPoint, TagsMatchMessages) {
  const int right = (rank() + 1) % n(), left = (rank() + n() - 1) % n();
  Tensor a = Tensor::full({10}, 100.0 + rank()), b = Tensor::full({20}, 200.0 + rank());
  Tensor got_a = Tensor::zeros({10}), got_b = Tensor::zeros({20});
  auto rb = group_->recv(got_b, left, 2);
  auto ra = group_->recv(got_a, left, 1);
  auto sa = group_->send(a, right, 1);
  auto sb = group_->send(b, right, 2);
  while (!rb->is_completed()) {}
  ra->wait();
  sa->wait();
  sb->wait();
  EXPECT_EQ(got_a.to_vector(), std::vector<double>(10, 100.0 + left));
  EXPECT_EQ(got_b.to_vector(), std::vector<double>(20, 200.0 + left));
}

TEST_P(PointToPoint, BarrierCompletes) {
  for (int i = 0; i < 3; ++i) {
    auto work = group_->barrier();
    work->wait();
    EXPECT_TRUE(work->is_completed());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PointToPoint, ::testing::ValuesIn(backend_configs()),
                         [](const auto& info) { return info.param; });

// On integer-valued f32 data every sum is exact, so the ring must reproduce the library's result bit for bit,
// whatever order either adds in.
TEST(RingVsMpi, BitwiseEqualOnIntegerValuedFloats) {
  dist::MpiProcessGroup mpi(MPI_COMM_WORLD);
  dist::RingProcessGroup ring(MPI_COMM_WORLD, dist::RingOptions{4096});
  std::mt19937 rng(1234 + mpi.rank());
  std::uniform_int_distribution<int> value(-1000, 1000);
  for (int64_t numel : {int64_t(1), int64_t(mpi.size() + 1), int64_t(12345), int64_t(1 << 20)})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      SCOPED_TRACE(::testing::Message() << dist::reduce_op_name(op) << " numel " << numel);
      std::vector<float> v(numel);
      for (float& x : v) x = float(value(rng));
      Tensor a = Tensor::from_vector(v, {numel}), b = Tensor::from_vector(v, {numel});
      mpi.all_reduce(a, op)->wait();
      ring.all_reduce(b, op)->wait();
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);

      const int64_t per_rank = numel;
      std::vector<float> big(per_rank * mpi.size());
      for (float& x : big) x = float(value(rng));
      Tensor input = Tensor::from_vector(big, {int64_t(big.size())});
      Tensor out_mpi = Tensor::zeros({per_rank}), out_ring = Tensor::zeros({per_rank});
      mpi.reduce_scatter(out_mpi, input, op)->wait();
      ring.reduce_scatter(out_ring, input, op)->wait();
      EXPECT_EQ(std::memcmp(out_mpi.raw_data(), out_ring.raw_data(), out_mpi.nbytes()), 0);
    }
}

}  // namespace
}  // namespace minidl::testing
