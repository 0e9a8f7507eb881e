// The vectorisable exp of the CPU attention and cross-entropy kernels (ops/cpu/exp.h) against std::exp.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/exp.h"

using minidl::ops::cpu::exp_vectorizable;

TEST(CpuExp, WithinTwoUlpOfStdExpOverTheFloatRange) {
  // 2 ulp of a float relative to its value is at most 2 * 2^-23; the Cephes polynomial measures ~1.4 * 2^-24.
  const double tol = 2 * std::ldexp(1.0, -23);
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    double want = std::exp(double(x));
    ASSERT_NEAR(exp_vectorizable(x), want, tol * want) << "x = " << x;
  }
  EXPECT_EQ(exp_vectorizable(0.0f), 1.0f);
  // Very negative inputs (masked scores) give exactly 0; NaN stays NaN.
  EXPECT_EQ(exp_vectorizable(-INFINITY), 0.0f);
  EXPECT_EQ(exp_vectorizable(-88.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_vectorizable(NAN)));
}
