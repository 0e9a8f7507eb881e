// How closely two training runs' losses must agree, from the arithmetic that separates them (not from what a
// printed value shows): the tolerances of the multi-process tests against one process.
//
//   EXPECT_TRUE(losses_agree(two_ranks_loss, one_process_loss, kF32SumOrder));
//
// MINIDL_TEST_PRINT_AGREEMENT=1 prints every comparison's relative difference to stderr, to re-measure the margins.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace minidl::testing {

// f32 runs that compute the same steps and differ only in the order of their sums: each rank's partial sums then
// the collective's average against one process's sums, micro-batches accumulated against one batch, a tensor- or
// pipeline-parallel split of a product's reduction. Each order moves a sum by a few 2^-24 relative; over the tests'
// 5-20 AdamW steps of tiny models the losses then differ by at most 1.0e-7 relative (56 f32 comparisons of the
// train_gpt and resume tests, Intel Xeon family 6 model 167, AVX-512), so 1e-5 leaves a margin of 100 for other
// machines' kernels, while a sum instead of an average, or a missing rank's share, moves a loss by more than 1e-3.
constexpr double kF32SumOrder = 1e-5;
// The same with 16-bit activations (bf16: 8 bits of mantissa), whose roundings the order of the sums moves: up to
// 1.2e-4 relative in the same runs, and 1.1e-3 at tp 2 x pp 2 with sequence parallelism on an AMD EPYC (its
// dropout masks of 16-bit draws), hence 2e-3.
constexpr double kBf16SumOrder = 2e-3;

// |got - want| <= rtol * |want|, the relative difference printed on failure.
inline ::testing::AssertionResult losses_agree(double got, double want, double rtol) {
  const double rel = std::fabs(got - want) / std::fabs(want);
  if (const char* p = std::getenv("MINIDL_TEST_PRINT_AGREEMENT"); p && *p == '1')
    std::fprintf(stderr, "loss agreement: %.9g vs %.9g, relative %.3g (tolerance %.3g)\n", got, want, rel, rtol);
  if (std::isfinite(got) && std::isfinite(want) && rel <= rtol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "loss " << got << " against " << want << ": relative difference " << rel
                                       << ", tolerance " << rtol;
}

}  // namespace minidl::testing
