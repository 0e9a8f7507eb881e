// dist::clock_offset_to_rank0 against clocks whose offsets the test sets: rank r's clock runs 7 ms x r ahead of
// rank 0's, so each rank must find an offset of -7 ms x r within the uncertainty it reports (Cristian's bound:
// rank 0 read its clock between the ping's send and the reply's arrival).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>

#include "core/error.h"
#include "dist/clock_sync.h"

namespace minidl::testing {
namespace {

TEST(ClockSync, FindsEachRanksOffsetFromRankZero) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const double skew_us = 7000.0 * rank;
  const auto now_us = [skew_us] {
    const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
    return std::chrono::duration<double, std::micro>(since_epoch).count() + skew_us;
  };
  const dist::ClockOffset c = dist::clock_offset_to_rank0(MPI_COMM_WORLD, now_us);
  if (rank == 0) {
    EXPECT_EQ(c.offset_us, 0.0);
    EXPECT_EQ(c.uncertainty_us, 0.0);
  } else {
    EXPECT_GT(c.uncertainty_us, 0.0);
    EXPECT_NEAR(c.offset_us, -skew_us, c.uncertainty_us + 1e-3);
  }
  EXPECT_THROW(dist::clock_offset_to_rank0(MPI_COMM_WORLD, now_us, 0), Error);
}

}  // namespace
}  // namespace minidl::testing
