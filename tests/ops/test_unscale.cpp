// The fused unscale-and-check of loss scaling: finds inf and NaN wherever they are, and unscales exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn_test_util.h"
#include "ops/unscale.h"

using namespace minidl;

namespace {
// Sizes around the vector width and the parallel chunk (2^15), so tails and chunk edges are covered.
const int64_t kSizes[] = {1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 1000, 32767, 32768, 32769, 100003};
}  // namespace

TEST(Unscale, UnscalesExactlyWithAPowerOfTwoScale) {
  for (int64_t n : kSizes) {
    Tensor g = minidl::testing::random_tensor({n}, uint64_t(n), DType::f32, 1e4);
    std::vector<double> before = g.to_vector();
    EXPECT_FALSE(ops::unscale_and_check_(g, 1.0f / 65536.0f)) << n;
    std::vector<double> after = g.to_vector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(after[size_t(i)], double(float(before[size_t(i)]) / 65536.0f)) << i;
  }
}

TEST(Unscale, FindsInfAndNanAnywhere) {
  const float bad_values[] = {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()};
  for (int64_t n : kSizes)
    for (int64_t pos : {int64_t(0), n / 2, n - 1})
      for (float bad : bad_values) {
        Tensor g = minidl::testing::random_tensor({n}, 3, DType::f32);
        const float other_before = g.data<float>()[pos == 0 ? n - 1 : 0];
        g.data<float>()[pos] = bad;
        EXPECT_TRUE(ops::unscale_and_check_(g, 0.5f)) << "n=" << n << " pos=" << pos << " value=" << bad;
        if (n > 1) EXPECT_EQ(g.data<float>()[pos == 0 ? n - 1 : 0], other_before * 0.5f);  // the rest still unscaled
      }
}

TEST(Unscale, AFiniteValueThatOverflowsWhenUnscaledCounts) {
  Tensor g = Tensor::full({5}, 3e38);
  EXPECT_TRUE(ops::unscale_and_check_(g, 2.0f));  // scale 0.5: the true gradient is beyond f32's range
}

TEST(Unscale, RejectsNonF32) {
  minidl::testing::expect_error([] { ops::unscale_and_check_(Tensor::zeros({3}, DType::f64), 1.0f); }, {"f32", "f64"});
}
