// For tests built with minidl_add_mpi_test: the distributed context their main() created.
//
//   TEST(Dist, WorldSize) { EXPECT_GE(minidl::testing::mpi_context().world_size(), 1); }
//
// Multi-rank tests must keep every rank on the same sequence of collectives: check results with EXPECT_*, not
// ASSERT_* (an ASSERT that fails on one rank returns early and leaves the others waiting in the next collective).
#pragma once

#include "dist/init.h"

namespace minidl::testing {

const dist::Context& mpi_context();

}  // namespace minidl::testing
