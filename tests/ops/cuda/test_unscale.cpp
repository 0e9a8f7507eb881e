// The fused unscale-and-check kernel (ops/cuda/unscale.cu), run on the emulator, against
// ops::unscale_and_check_: exact unscaling, and inf/NaN found at the first, middle and last element, around the
// vector width and the block size, from aligned and unaligned addresses.
#include <cmath>
#include <limits>

#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cuda/unscale.h"
#include "ops/unscale.h"

namespace minidl::testing {
namespace {

const int64_t kSizes[] = {1, 3, 4, 5, 31, 33, 255, 256, 257, 1025, 4099};

// Runs the kernel on `values` placed `offset` floats into a device buffer; returns the flag and the results.
std::pair<int, std::vector<float>> unscale_on_device(const std::vector<float>& values, float inv_scale, int offset) {
  std::vector<float> host(size_t(offset), 0.0f);
  host.insert(host.end(), values.begin(), values.end());
  DeviceBuffer<float> grad(host);
  DeviceBuffer<int> found_inf(std::vector<int>{0});
  EXPECT_EQ(
      ops::cuda::unscale_and_check(grad.get() + offset, int64_t(values.size()), inv_scale, found_inf.get(), nullptr),
      cudaSuccess);
  const std::vector<float> out = grad.host();
  return {found_inf.host()[0], std::vector<float>(out.begin() + offset, out.end())};
}

TEST(CudaUnscale, FiniteGradientsUnscaleExactlyLikeTheCpuOp) {
  for (int64_t n : kSizes)
    for (int offset : {0, 1}) {
      const Tensor g = random_tensor({n}, uint64_t(n), DType::f32, 1e4);
      const auto [found, got] = unscale_on_device(floats(g), 1.0f / 1024.0f, offset);
      EXPECT_FALSE(ops::unscale_and_check_(g, 1.0f / 1024.0f));
      EXPECT_EQ(found, 0) << "n=" << n;
      EXPECT_EQ(got, floats(g)) << "n=" << n << " offset=" << offset;
    }
}

TEST(CudaUnscale, FindsInfAndNanAtFirstMiddleAndLast) {
  const float bad_values[] = {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()};
  for (int64_t n : kSizes)
    for (int64_t pos : {int64_t(0), n / 2, n - 1})
      for (float bad : bad_values)
        for (int offset : {0, 3}) {
          std::vector<float> values = floats(random_tensor({n}, 5, DType::f32));
          values[size_t(pos)] = bad;
          const Tensor g = Tensor::from_vector(values, {n});
          const auto [found, got] = unscale_on_device(values, 0.5f, offset);
          const std::string what = "n=" + std::to_string(n) + " pos=" + std::to_string(pos);
          EXPECT_TRUE(ops::unscale_and_check_(g, 0.5f)) << what;
          EXPECT_EQ(found, 1) << what << " value=" << bad;
          const std::vector<float> want = floats(g);
          for (int64_t i = 0; i < n; ++i)
            if (i != pos) { ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << what << " i=" << i; }
        }
}

// A finite gradient that overflows when multiplied (a scale below 1) counts as inf, as on the CPU.
TEST(CudaUnscale, OverflowFromTheMultiplyCounts) {
  const auto [found, got] = unscale_on_device({1.0f, 3e38f, 2.0f}, 4.0f, 0);
  EXPECT_EQ(found, 1);
  EXPECT_TRUE(std::isinf(got[1]));
}

}  // namespace
}  // namespace minidl::testing
