#include <gtest/gtest.h>

#include "core/tensor.h"

using namespace minidl;

static Tensor iota(const Shape& s, DType dt = DType::f32) { return Tensor::arange(s.numel(), dt).reshape(s); }

TEST(Tensor, FactoriesAndMetadata) {
  Tensor t = Tensor::full({2, 3}, 1.5);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector(), std::vector<double>(6, 1.5));
  EXPECT_EQ(Tensor::scalar(3).item(), 3.0);
  EXPECT_THROW(t.size(2), Error);
}

// randn and rand (the factories the headers' examples use): element i is the generator's i-th draw, so a tensor is
// a pure function of (seed, stream, shape), in any dtype.
TEST(Tensor, RandomFactoriesArePhiloxDraws) {
  const Philox rng(42, 3);
  const Tensor n = Tensor::randn({3, 4}, rng), u = Tensor::rand({5}, rng, DType::f64);
  EXPECT_EQ(n.shape(), (Shape{3, 4}));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(n.to_vector()[size_t(i)], double(rng.normal(uint64_t(i))));
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(u.to_vector()[size_t(i)], double(rng.uniform(uint64_t(i))));
    EXPECT_GE(u.to_vector()[size_t(i)], 0.0);
    EXPECT_LT(u.to_vector()[size_t(i)], 1.0);
  }
  EXPECT_EQ(u.dtype(), DType::f64);
  EXPECT_EQ(Tensor::randn({3, 4}, Philox(42, 3)).to_vector(), n.to_vector());
  EXPECT_NE(Tensor::randn({3, 4}, Philox(42, 4)).to_vector(), n.to_vector());
}

TEST(Tensor, TransposeIsAViewAndContiguousCopies) {
  Tensor x = iota({2, 3});
  Tensor t = x.transpose(0, 1);
  EXPECT_TRUE(t.shares_storage(x));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(x));
  EXPECT_EQ(c.to_vector(), t.to_vector());
  EXPECT_TRUE(x.contiguous().same(x));  // no copy when already contiguous
}

// copy_ between strided tensors of one dtype (rows by memcpy, element by element where the last dimension is
// strided, a broadcast's zero stride) against the values read one by one; and a copy within one storage, which may
// overlap, as if the source were read first.
TEST(Tensor, StridedCopiesAreElementwise) {
  for (DType dt : {DType::f32, DType::bf16, DType::i32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = iota({3, 4, 5}, dt);
    const std::vector<Tensor> sources = {x.transpose(0, 1), x.transpose(1, 2), x.narrow(2, 1, 3),
                                         x.as_strided({3, 4, 5}, {5, 0, 1}, 2), x.narrow(0, 1, 2).transpose(0, 2)};
    for (const Tensor& src : sources) {
      Tensor dst = Tensor::zeros(src.shape(), dt);
      dst.copy_(src);
      EXPECT_EQ(dst.to_vector(), src.to_vector());
      const Shape& sh = src.shape();
      Tensor strided_dst = Tensor::zeros({sh[2], sh[1], sh[0]}, dt).transpose(0, 2);
      strided_dst.copy_(src);
      EXPECT_EQ(strided_dst.to_vector(), src.to_vector());
    }
  }
  Tensor y = iota({4, 3});
  y.narrow(0, 1, 3).copy_(y.narrow(0, 0, 3).transpose(0, 1).contiguous().transpose(0, 1));
  EXPECT_EQ(y.to_vector(), (std::vector<double>{0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
  Tensor z = iota({3, 3});
  z.copy_(z.transpose(0, 1));  // overlapping: the general path reads the whole source first
  EXPECT_EQ(z.to_vector(), (std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

TEST(Tensor, NarrowAndReshape) {
  Tensor x = iota({4, 5});
  Tensor n = x.narrow(1, 1, 3);
  EXPECT_EQ(n.shape(), (Shape{4, 3}));
  EXPECT_EQ(n.to_vector()[0], 1);
  EXPECT_EQ(n.to_vector()[3], 6);
  Tensor r = x.reshape({2, -1});
  EXPECT_EQ(r.shape(), (Shape{2, 10}));
  EXPECT_TRUE(r.shares_storage(x));
  Tensor rn = n.reshape({12});  // not viewable -> copy
  EXPECT_FALSE(rn.shares_storage(x));
  EXPECT_EQ(rn.to_vector()[3], 6);
  EXPECT_THROW(x.reshape({3, -1}), Error);
  EXPECT_THROW(x.narrow(0, 3, 2), Error);
  EXPECT_THROW(n.view({12}), Error);
}

// to_float_vector reads a contiguous f32 tensor in one copy; views (with their offset and strides) and other dtypes
// take the elementwise path. Both give the values in row-major order.
TEST(Tensor, ToFloatVectorReadsViewsAndDtypesInOrder) {
  Tensor x = Tensor::arange(24).reshape({2, 3, 4});
  const std::vector<double> all = x.to_vector();
  EXPECT_EQ(x.to_float_vector(), std::vector<float>(all.begin(), all.end()));
  for (const Tensor& v : {x.narrow(1, 1, 2), x.transpose(0, 2), x.narrow(0, 1, 1), x.to(DType::f16)}) {
    const std::vector<double> want = v.to_vector();
    EXPECT_EQ(v.to_float_vector(), std::vector<float>(want.begin(), want.end())) << v.shape();
  }
  const std::vector<float> tail = x.narrow(0, 1, 1).to_float_vector();  // contiguous, at an offset
  EXPECT_EQ(tail.front(), 12.0f);
  EXPECT_EQ(tail.size(), 12u);
}

TEST(Tensor, CastsRoundTrip) {
  Tensor x = Tensor::from_vector(std::vector<double>{1.0, -2.5, 0.1, 65504.0, 1e-7}, {5});
  Tensor h = x.to(DType::f16);
  Tensor b = x.to(DType::bf16);
  std::vector<double> hv = h.to(DType::f32).to_vector(), bv = b.to(DType::f32).to_vector();
  EXPECT_EQ(hv[0], 1.0);
  EXPECT_EQ(hv[1], -2.5);
  EXPECT_NEAR(hv[2], 0.1, 1e-4);
  EXPECT_EQ(hv[3], 65504.0);
  EXPECT_NEAR(hv[4], 1e-7, 6e-8);  // subnormal in f16
  EXPECT_EQ(bv[1], -2.5);
  EXPECT_NEAR(bv[2], 0.1, 1e-3);
}

TEST(Half, RoundToNearestEvenExhaustive) {
  // Every f16 value converts to float and back unchanged.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    f16 h{uint16_t(bits)};
    float f = to_float(h);
    if (f != f) continue;  // NaN payloads may differ
    ASSERT_EQ(to_f16(f).bits, h.bits) << bits;
  }
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    bf16 h{uint16_t(bits)};
    float f = to_float(h);
    if (f != f) continue;
    ASSERT_EQ(to_bf16(f).bits, h.bits) << bits;
  }
  // Ties go to even: 1 + 2^-11 is halfway between 1 and the next f16.
  EXPECT_EQ(to_f16(1.0f + 1.0f / 2048).bits, to_f16(1.0f).bits);
}

TEST(Tensor, BadInputsNameWhatWasExpected) {
  Tensor x = Tensor::zeros({2, 2});
  try {
    x.data<int32_t>();
    FAIL();
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos); }
  EXPECT_THROW(Tensor::zeros({2}).copy_(Tensor::zeros({3})), Error);
  EXPECT_THROW(Tensor::from_vector(std::vector<double>{1, 2, 3}, {2, 2}), Error);
}

namespace minidl {
namespace {

// test_core links no device backend: a CUDA tensor is refused with a message that says what to link.
TEST(TensorDevice, CpuOnlyBuildRefusesCudaTensorsByName) {
  try {
    Tensor::zeros({2}, DType::f32, Device::cuda(0));
    ADD_FAILURE() << "expected minidl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "cannot allocate on cuda:0: this build of minidl has no CUDA backend (link minidl_cuda_backend)"),
              std::string::npos)
        << e.what();
  }
  Tensor x = Tensor::ones({2});
  EXPECT_THROW(x.to(Device::cuda(0)), Error);
  EXPECT_TRUE(x.to(Device::cpu()).same(x));
}

}  // namespace
}  // namespace minidl
