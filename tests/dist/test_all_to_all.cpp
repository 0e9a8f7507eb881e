// all_to_all with counts per peer, every CPU backend against MPI_Alltoallv itself (the oracle, on the world): random
// counts with zeros among them, every count zero, one rank sending nothing, every dtype, at 2, 3 and 4 ranks; the
// counts exchanged first by an all_to_all of one count per peer, as expert parallelism does; bad counts refused.
#include <gtest/gtest.h>
#include <mpi.h>

#include "core/rng.h"
#include "dist_test_util.h"

namespace minidl::testing {
namespace {

class AllToAll : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { group_ = make_group(GetParam(), MPI_COMM_WORLD); }
  int rank() const { return group_->rank(); }
  int n() const { return group_->size(); }
  std::unique_ptr<dist::ProcessGroup> group_;
};

// What MPI_Alltoallv gives for the same buffers (f64 carries every dtype's values exactly here).
std::vector<double> oracle(const std::vector<double>& in, const std::vector<int64_t>& sc,
                           const std::vector<int64_t>& rc) {
  const int n = int(sc.size());
  std::vector<int> s(n), sd(n), r(n), rd(n);
  int at_s = 0, at_r = 0;
  for (int j = 0; j < n; ++j)
    s[j] = int(sc[j]), r[j] = int(rc[j]), sd[j] = at_s, rd[j] = at_r, at_s += s[j], at_r += r[j];
  std::vector<double> out(size_t(at_r) + 1);  // never empty: MPI wants a buffer
  std::vector<double> src(in);
  src.push_back(0);
  MPI_Alltoallv(src.data(), s.data(), sd.data(), MPI_DOUBLE, out.data(), r.data(), rd.data(), MPI_DOUBLE,
                MPI_COMM_WORLD);
  out.pop_back();
  return out;
}

TEST_P(AllToAll, EqualsMpiAlltoallv) {
  for (int pattern_id = 0; pattern_id < 4; ++pattern_id)
    for (DType dtype : kAllDTypes) {
      // The counts this rank sends each peer: 0 .. 5 at random (zeros among them), all zero, or rank 0 silent.
      std::vector<int64_t> send(static_cast<size_t>(n()));
      Philox rng(uint64_t(pattern_id) + 1, uint64_t(rank()));
      for (int j = 0; j < n(); ++j) {
        send[size_t(j)] = int64_t(rng.draw(uint64_t(j)).x % 6);
        if (pattern_id == 1) send[size_t(j)] = 0;
        if (pattern_id == 2 && rank() == 0) send[size_t(j)] = 0;
        if (pattern_id == 3) send[size_t(j)] = 1000 + j;  // big enough for several of the ring's small slices
      }
      // The counts first: one per peer.
      Tensor sc = Tensor::from_vector(std::vector<double>(send.begin(), send.end()), {n()}, DType::i64);
      Tensor rc = Tensor::empty({n()}, DType::i64);
      const std::vector<int64_t> ones(size_t(n()), 1);
      group_->all_to_all(rc, sc, ones, ones)->wait();
      std::vector<int64_t> recv;
      for (double c : rc.to_vector()) recv.push_back(int64_t(c));
      int64_t total_send = 0, total_recv = 0;
      for (int j = 0; j < n(); ++j) total_send += send[size_t(j)], total_recv += recv[size_t(j)];
      Tensor in = pattern_tensor(rank(), total_send, dtype, 31 * rank());
      Tensor out = Tensor::empty({total_recv}, dtype);
      group_->all_to_all(out, in, send, recv)->wait();
      SCOPED_TRACE(::testing::Message() << dtype << ", pattern " << pattern_id << ", rank " << rank());
      EXPECT_EQ(out.to_vector(), oracle(in.to_vector(), send, recv));
    }
}

TEST_P(AllToAll, RefusesCountsThatDoNotAddUp) {
  std::vector<int64_t> counts(size_t(n()), 2);
  Tensor in = Tensor::empty({2 * n() + 1}), out = Tensor::empty({2 * n()});
  try {
    group_->all_to_all(out, in, counts, counts);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the send counts add up to " + std::to_string(2 * n())), std::string::npos)
        << e.what();
  }
  try {
    group_->all_to_all(out, out, std::vector<int64_t>{2}, counts);
    if (n() != 1) FAIL() << "expected a refusal";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("a count per rank"), std::string::npos) << e.what(); }
}

INSTANTIATE_TEST_SUITE_P(Backends, AllToAll, ::testing::ValuesIn(backend_configs()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace minidl::testing
