// The dropout kernel (ops/cuda/dropout.cu), run on the emulator, against ops::dropout: the same mask bit for bit
// and the same values, for sizes around the four-element Philox group, the block and the grid stride, aligned
// and unaligned pointers, nonzero offsets and streams.
#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cuda/dropout.h"
#include "ops/dropout.h"

namespace minidl::testing {
namespace {

struct DropoutCase {
  int64_t n;
  double p;
  uint64_t stream;
  uint64_t offset;
};

// Runs the kernel on `values` placed `shift` floats into a device buffer.
std::vector<float> dropout_on_device(const std::vector<float>& values, const DropoutCase& c, uint64_t seed, int shift) {
  std::vector<float> host(size_t(shift), 0.0f);
  host.insert(host.end(), values.begin(), values.end());
  DeviceBuffer<float> x(host), y(host.size());
  EXPECT_EQ(ops::cuda::dropout(x.get() + shift, y.get() + shift, c.n, c.p, seed, c.stream, c.offset, nullptr),
            cudaSuccess);
  const std::vector<float> out = y.host();
  return std::vector<float>(out.begin() + shift, out.end());
}

class CudaDropout : public ::testing::TestWithParam<DropoutCase> {};

TEST_P(CudaDropout, MaskAndValuesAreTheCpuOps) {
  const DropoutCase c = GetParam();
  constexpr uint64_t kSeed = 0x1234abcd5678ull;
  for (int shift : {0, 1}) {
    // Ones: y's zero pattern is the mask itself.
    const Tensor ones = Tensor::ones({c.n});
    const std::vector<float> want_mask = floats(ops::dropout(ones, c.p, kSeed, c.stream, c.offset));
    EXPECT_EQ(dropout_on_device(floats(ones), c, kSeed, shift), want_mask) << "mask, shift " << shift;
    // Random values: the same products.
    const Tensor x = random_tensor({c.n}, 11, DType::f32);
    EXPECT_EQ(dropout_on_device(floats(x), c, kSeed, shift), floats(ops::dropout(x, c.p, kSeed, c.stream, c.offset)))
        << "values, shift " << shift;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaDropout,
                         ::testing::Values(DropoutCase{1, 0.5, 0, 0}, DropoutCase{3, 0.1, 0, 0},
                                           DropoutCase{4, 0.1, 1, 5}, DropoutCase{5, 0.9, 2, 0},
                                           DropoutCase{1023, 0.1, 0, 17}, DropoutCase{1026, 0.3, 7, 1ull << 33},
                                           DropoutCase{4101, 0.0, 0, 0}, DropoutCase{20001, 0.5, 3, 99}),
                         [](const auto& info) {
                           return "size" + std::to_string(info.param.n) + "_case" + std::to_string(info.index);
                         });

}  // namespace
}  // namespace minidl::testing
