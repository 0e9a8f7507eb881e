// The cast kernels (ops/cuda/cast.cu), run on the emulator, against ops::cast: f32 -> f16/bf16 with the same
// bits (round to nearest even, including ties, overflow to inf, subnormals and signed zeros), and back exactly,
// for sizes around the four-element vector and from unaligned addresses.
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cast.h"
#include "ops/cuda/cast.h"

namespace minidl::testing {
namespace {

// Values that exercise rounding: random ones at several scales, exact ties of both types, the edges of the
// f16 range and its subnormals, infinities and signed zeros.
std::vector<float> awkward_values(int64_t n) {
  std::vector<float> v = floats(random_tensor({n}, uint64_t(n), DType::f32, 100.0));
  const float special[] = {0.0f,
                           -0.0f,
                           1.0f + 1.0f / 2048,
                           1.0f + 3.0f / 2048,
                           1.0f + 1.0f / 256,
                           1.0f + 3.0f / 256,
                           65504.0f,
                           65520.0f,
                           70000.0f,
                           5.96e-8f,
                           2.98e-8f,
                           1e-6f,
                           -3e-5f,
                           INFINITY,
                           -INFINITY,
                           3.0e38f,
                           1.0e-40f,
                           -1.17549435e-38f};
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 3 == 0) v[i] = special[(i / 3) % std::size(special)];
    if (i % 3 == 1) v[i] *= 1e-4f;
  }
  return v;
}

template <class Half>
std::vector<uint16_t> bits_of(const std::vector<Half>& v) {
  static_assert(sizeof(Half) == 2);
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 2);
  return out;
}

template <class DeviceHalf>
void check_round_trip(DType dtype, cudaError_t (*to_half)(const float*, DeviceHalf*, int64_t, cudaStream_t),
                      cudaError_t (*to_float)(const DeviceHalf*, float*, int64_t, cudaStream_t)) {
  for (int64_t n : {1, 3, 4, 5, 255, 1027, 4099})
    for (int shift : {0, 1}) {
      const std::vector<float> values = awkward_values(n);
      std::vector<float> host(size_t(shift), 0.0f);
      host.insert(host.end(), values.begin(), values.end());
      DeviceBuffer<float> src(host), back(host.size());
      DeviceBuffer<DeviceHalf> half(host.size());
      ASSERT_EQ(to_half(src.get() + shift, half.get() + shift, n, nullptr), cudaSuccess);
      const Tensor want = ops::cast(Tensor::from_vector(values, {n}), dtype);
      std::vector<uint16_t> want_bits(static_cast<size_t>(n));
      std::memcpy(want_bits.data(), want.raw_data(), size_t(n) * 2);
      std::vector<uint16_t> got_bits = bits_of(half.host());
      got_bits.erase(got_bits.begin(), got_bits.begin() + shift);
      ASSERT_EQ(got_bits, want_bits) << "to 16 bits, n=" << n << " shift=" << shift;

      ASSERT_EQ(to_float(half.get() + shift, back.get() + shift, n, nullptr), cudaSuccess);
      std::vector<float> got_back = back.host();
      got_back.erase(got_back.begin(), got_back.begin() + shift);
      ASSERT_EQ(got_back, floats(ops::cast(want, DType::f32))) << "to f32, n=" << n << " shift=" << shift;
    }
}

TEST(CudaCast, F16MatchesTheCpuBitForBit) {
  check_round_trip<__half>(DType::f16, ops::cuda::cast_f32_to_f16, ops::cuda::cast_f16_to_f32);
}

TEST(CudaCast, Bf16MatchesTheCpuBitForBit) {
  check_round_trip<__nv_bfloat16>(DType::bf16, ops::cuda::cast_f32_to_bf16, ops::cuda::cast_bf16_to_f32);
}

// NaN stays NaN both ways (payloads may differ from the CPU's, as they do between CPUs).
TEST(CudaCast, NanStaysNan) {
  DeviceBuffer<float> src(std::vector<float>{std::numeric_limits<float>::quiet_NaN(), 1.0f}), back(2);
  DeviceBuffer<__nv_bfloat16> half(2);
  ASSERT_EQ(ops::cuda::cast_f32_to_bf16(src.get(), half.get(), 2, nullptr), cudaSuccess);
  ASSERT_EQ(ops::cuda::cast_bf16_to_f32(half.get(), back.get(), 2, nullptr), cudaSuccess);
  EXPECT_TRUE(std::isnan(back.host()[0]));
  EXPECT_EQ(back.host()[1], 1.0f);
}

}  // namespace
}  // namespace minidl::testing
