// all_reduce, reduce_scatter and all_gather of every backend against a direct computation, for every dtype,
// reduction and awkward element count, at whatever world size the test runs with (1 to 4).
#include <gtest/gtest.h>

#include "dist_test_util.h"

namespace minidl::testing {
namespace {

using dist::ReduceOp;

class Collectives : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { group_ = make_group(GetParam(), MPI_COMM_WORLD); }
  int rank() const { return group_->rank(); }
  int n() const { return group_->size(); }
  std::unique_ptr<dist::ProcessGroup> group_;
};

TEST_P(Collectives, AllReduceEqualsDirectComputation) {
  for (DType dtype : kAllDTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      for (int64_t numel : interesting_counts(n(), GetParam(), dtype)) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << dist::reduce_op_name(op) << " numel " << numel);
        Tensor t = pattern_tensor(rank(), numel, dtype);
        group_->all_reduce(t, op)->wait();
        std::vector<double> got = t.to_vector();
        int64_t wrong = 0, first_wrong = -1;
        for (int64_t i = 0; i < numel; ++i)
          if (got[i] != expected_reduction(op, n(), i, dtype) && wrong++ == 0) first_wrong = i;
        EXPECT_EQ(wrong, 0) << "first wrong element " << first_wrong << ": got " << got[first_wrong] << ", expected "
                            << expected_reduction(op, n(), first_wrong, dtype);
      }
}

TEST_P(Collectives, ReduceScatterEqualsDirectComputation) {
  for (DType dtype : kAllDTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      for (int64_t per_rank : {int64_t(0), int64_t(1), int64_t(13), int64_t(GetParam() == "ring" ? 70001 : 301)}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << dist::reduce_op_name(op) << " per rank " << per_rank);
        Tensor input = pattern_tensor(rank(), per_rank * n(), dtype);
        Tensor output = Tensor::full({per_rank}, -1.0, dtype);
        group_->reduce_scatter(output, input, op)->wait();
        std::vector<double> got = output.to_vector();
        int64_t wrong = 0;
        for (int64_t i = 0; i < per_rank; ++i)
          wrong += got[i] != expected_reduction(op, n(), rank() * per_rank + i, dtype);
        EXPECT_EQ(wrong, 0);
        EXPECT_EQ(input.to_vector(), pattern_tensor(rank(), per_rank * n(), dtype).to_vector()) << "input changed";
      }
}

TEST_P(Collectives, AllGatherEqualsDirectComputation) {
  for (DType dtype : kAllDTypes)
    for (int64_t per_rank : {int64_t(0), int64_t(1), int64_t(13), int64_t(GetParam() == "ring" ? 300001 : 301)}) {
      SCOPED_TRACE(::testing::Message() << dtype << " per rank " << per_rank);
      Tensor input = pattern_tensor(rank(), per_rank, dtype);
      Tensor output = Tensor::full({n(), per_rank}, -1.0, dtype);
      group_->all_gather(output, input)->wait();
      std::vector<double> got = output.to_vector();
      int64_t wrong = 0;
      for (int r = 0; r < n(); ++r)
        for (int64_t i = 0; i < per_rank; ++i) wrong += got[r * per_rank + i] != pattern(r, i);
      EXPECT_EQ(wrong, 0);
    }
}

// ZeRO's layout: the shard a rank owns is a view into the flat buffer that the collective fills or reads.
TEST_P(Collectives, OutputMayAliasInput) {
  const int64_t per_rank = 37;
  Tensor flat = Tensor::zeros({per_rank * n()});
  Tensor shard = flat.as_strided({per_rank}, {1}, rank() * per_rank);
  shard.copy_(pattern_tensor(rank(), per_rank, DType::f32));
  group_->all_gather(flat, shard)->wait();
  int64_t wrong = 0;
  std::vector<double> got = flat.to_vector();
  for (int r = 0; r < n(); ++r)
    for (int64_t i = 0; i < per_rank; ++i) wrong += got[r * per_rank + i] != pattern(r, i);
  EXPECT_EQ(wrong, 0);

  Tensor grads = pattern_tensor(rank(), per_rank * n(), DType::f32);
  Tensor grad_shard = grads.as_strided({per_rank}, {1}, rank() * per_rank);
  group_->reduce_scatter(grad_shard, grads, ReduceOp::kSum)->wait();
  wrong = 0;
  got = grad_shard.to_vector();
  for (int64_t i = 0; i < per_rank; ++i)
    wrong += got[i] != expected_reduction(ReduceOp::kSum, n(), rank() * per_rank + i, DType::f32);
  EXPECT_EQ(wrong, 0);
}

TEST_P(Collectives, RejectsBadArguments) {
  Tensor a = Tensor::zeros({4, 6});
  Tensor not_contiguous = a.transpose(0, 1);
  EXPECT_THROW(group_->all_reduce(not_contiguous, ReduceOp::kSum), Error);
  Tensor out = Tensor::zeros({5});
  EXPECT_THROW(group_->reduce_scatter(out, Tensor::zeros({5 * n() + 1}), ReduceOp::kSum), Error);
  EXPECT_THROW(group_->all_gather(out, Tensor::zeros({5}, DType::f64)), Error);
  EXPECT_THROW(group_->broadcast(out, n()), Error);
  EXPECT_THROW(group_->send(out, -1, 0), Error);
  EXPECT_THROW(group_->recv(out, 0, dist::ProcessGroup::kMaxTag + 1), Error);
  try {
    group_->broadcast(out, -1);
    ADD_FAILURE() << "broadcast from root -1 did not throw";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("root -1"), std::string::npos) << e.what(); }
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives, ::testing::ValuesIn(backend_configs()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace minidl::testing
