// The emulated tensor-core primitives (cuda_emu/tensor_core.h) against plain references: mma_m16n8k16 for f16 and
// bf16 with fragments placed by the PTX ISA's layouts, ldmatrix x1/x2/x4 with and without .trans, cp.async groups
// (a missing wait reads poison, wait_group 1 lands only the older group), and ldmatrix + mma composed the way the
// attention kernels use them. The same source runs on a GPU (test_tensor_core_gpu, MINIDL_TEST_GPU: tests/gpu),
// the check of the emulator's model against silicon; there shared memory holds no poison and a copy not yet waited
// for may have landed already, so only what the PTX ISA promises is checked.
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor_core_kernels.h"
#include "tests/support/device_buffer.h"

namespace emu_test {
namespace {

using minidl::testing::DeviceBuffer;

template <class T>
T to16(float x);
template <>
__half to16<__half>(float x) {
  return __float2half(x);
}
template <>
__nv_bfloat16 to16<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
float to32(__half x) { return __half2float(x); }
float to32(__nv_bfloat16 x) { return __bfloat162float(x); }

// Small distinct values (exact in both 16-bit types) so a misplaced element changes the result.
template <class T>
void check_mma(cudaError_t (*run)(const T*, const T*, const float*, float*)) {
  std::vector<T> a(256), b(128);
  std::vector<float> c(128);
  for (int i = 0; i < 256; ++i) a[i] = to16<T>(float((i * 7) % 17 - 8) / 8);
  for (int i = 0; i < 128; ++i) b[i] = to16<T>(float((i * 5) % 13 - 6) / 4);
  for (int i = 0; i < 128; ++i) c[i] = float(i % 9) - 4;
  DeviceBuffer<T> da(a), db(b);
  DeviceBuffer<float> dc(c), dd(128);
  ASSERT_EQ(run(da.get(), db.get(), dc.get(), dd.get()), cudaSuccess);
  const std::vector<float> d = dd.host();
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double want = c[r * 8 + n];
      for (int k = 0; k < 16; ++k) want += double(to32(a[r * 16 + k])) * to32(b[k * 8 + n]);
      EXPECT_EQ(d[r * 8 + n], float(want)) << "row " << r << " col " << n;  // exact: small dyadic values
    }
}

TEST(TensorCore, MmaF16MatchesAPlainProduct) { check_mma<__half>(mma_tile_f16); }
TEST(TensorCore, MmaBF16MatchesAPlainProduct) { check_mma<__nv_bfloat16>(mma_tile_bf16); }

TEST(TensorCore, LdmatrixGivesEachLaneItsPairs) {
  std::vector<uint16_t> in(256);
  for (int i = 0; i < 256; ++i) in[i] = uint16_t(1000 + i);  // matrix i / 64, row i / 8 % 8, column i % 8
  DeviceBuffer<uint16_t> din(in);
  for (int matrices : {1, 2, 4})
    for (bool trans : {false, true}) {
      DeviceBuffer<uint32_t> dout(std::vector<uint32_t>(128, 0));
      ASSERT_EQ(ldmatrix_lanes(din.get(), dout.get(), matrices, trans), cudaSuccess);
      const std::vector<uint32_t> out = dout.host();
      for (int lane = 0; lane < 32; ++lane)
        for (int m = 0; m < matrices; ++m) {
          const int a = lane / 4, b = 2 * (lane % 4);
          const uint32_t lo = trans ? in[m * 64 + b * 8 + a] : in[m * 64 + a * 8 + b];
          const uint32_t hi = trans ? in[m * 64 + (b + 1) * 8 + a] : in[m * 64 + a * 8 + b + 1];
          EXPECT_EQ(out[lane * 4 + m], lo | hi << 16)
              << "x" << matrices << (trans ? ".trans" : "") << " lane " << lane << " matrix " << m;
        }
    }
}

// out after async_copy_groups: which 16-byte chunks hold the input, which the emulator's poison.
std::vector<int> landed_chunks(int wait_groups) {
#if !defined(MINIDL_TEST_GPU)
  // Reading a copy that has not landed is what initcheck stops; here, what the read sees without it.
  minidl::emu::Options o = minidl::emu::options();
  o.checks &= ~minidl::emu::kInitcheck;
  const minidl::emu::Options saved = minidl::emu::options();
  minidl::emu::set_options(o);
  struct Restore {
    minidl::emu::Options saved;
    ~Restore() { minidl::emu::set_options(saved); }
  } restore{saved};
#endif
  std::vector<float> in(256);
  for (int i = 0; i < 256; ++i) in[i] = float(i);
  DeviceBuffer<float> din(in), dout(256);
  EXPECT_EQ(async_copy_groups(din.get(), dout.get(), wait_groups), cudaSuccess);
  const std::vector<float> out = dout.host();
  std::vector<int> landed(64);
  for (int c = 0; c < 64; ++c) {
    bool all = true, poison = true;
    for (int k = 0; k < 4; ++k) {
      uint32_t bits;
      std::memcpy(&bits, &out[4 * c + k], 4);
      all &= out[4 * c + k] == in[4 * c + k];
      poison &= bits == 0xffffffffu;
    }
#if !defined(MINIDL_TEST_GPU)
    EXPECT_TRUE(all || poison) << "chunk " << c;
#else
    (void)poison;
#endif
    landed[c] = all;
  }
  return landed;
}

TEST(TensorCore, AsyncCopyLandsAtItsWait) {
  for (int landed : landed_chunks(0)) EXPECT_EQ(landed, 1);
}

#if !defined(MINIDL_TEST_GPU)  // on silicon a copy not waited for may have landed: nothing to check
TEST(TensorCore, AsyncCopyWithoutWaitReadsPoison) {
  for (int landed : landed_chunks(-1)) EXPECT_EQ(landed, 0);
}
#endif

TEST(TensorCore, AsyncCopyWaitGroupOneLeavesTheNewestGroupInFlight) {
  const std::vector<int> landed = landed_chunks(1);
  for (int c = 0; c < 64; ++c) {
    if (c % 2 == 0) {
      EXPECT_EQ(landed[c], 1) << "chunk " << c;  // group 0 (even threads) has landed
    } else {
#if !defined(MINIDL_TEST_GPU)
      EXPECT_EQ(landed[c], 0) << "chunk " << c;  // the emulator holds the newest group back until its wait
#endif
    }
  }
}

TEST(TensorCore, LdmatrixAndMmaThroughSharedMemory) {
  std::vector<__nv_bfloat16> a(256), b(128);
  for (int i = 0; i < 256; ++i) a[i] = __float2bfloat16(float((i * 3) % 11 - 5) / 4);
  for (int i = 0; i < 128; ++i) b[i] = __float2bfloat16(float((i * 5) % 7 - 3) / 2);
  DeviceBuffer<__nv_bfloat16> da(a), db(b);
  for (int layout : {0, 1}) {
    DeviceBuffer<float> dd(128);
    ASSERT_EQ(smem_mma_bf16(da.get(), db.get(), dd.get(), layout), cudaSuccess);
    const std::vector<float> d = dd.host();
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double want = 0;
        for (int k = 0; k < 16; ++k)
          want +=
              double(__bfloat162float(a[r * 16 + k])) * __bfloat162float(layout == 0 ? b[n * 16 + k] : b[k * 8 + n]);
        EXPECT_EQ(d[r * 8 + n], float(want)) << "b layout " << layout << " row " << r << " col " << n;
      }
  }
}

}  // namespace
}  // namespace emu_test
