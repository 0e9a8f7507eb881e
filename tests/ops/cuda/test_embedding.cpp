// The embedding kernels (ops/cuda/embedding.cu), run on the emulator, against ops::embedding_forward and
// embedding_backward: widths around the warp and the block (1, 33, 64, 300), vocabularies around the block's 64
// rows, repeated ids (the same row from many positions, some rows never used). The deterministic backward must
// give the CPU op's bits and the same bits again; the atomic one matches within f32 tolerance.
#include "device_buffer.h"
#include "nn_test_util.h"
#include "ops/cuda/embedding.h"
#include "ops/embedding.h"

namespace minidl::testing {
namespace {

struct EmbeddingCase {
  int64_t vocab;
  int C;
  int64_t n;
};

class CudaEmbedding : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(CudaEmbedding, ForwardAndBothBackwardsMatchTheCpuOp) {
  const auto [vocab, C, n] = GetParam();
  std::vector<int64_t> id_values(static_cast<size_t>(n));
  // Skewed: every fourth position is id 0, the rest spread over the vocabulary.
  for (int64_t i = 0; i < n; ++i) id_values[size_t(i)] = i % 4 == 0 ? 0 : (i * 40503 + 7) % vocab;
  const Tensor ids = Tensor::from_vector(id_values, {n});
  const Tensor weight = random_tensor({vocab, C}, 21, DType::f32), grad = random_tensor({n, C}, 22, DType::f32);
  const Tensor want_out = ops::embedding_forward(weight, ids);
  const Tensor want_dweight = ops::embedding_backward(grad, ids, vocab);

  DeviceBuffer<float> dweight_in(floats(weight)), dgrad(floats(grad)), out(n * C), dweight(vocab * C);
  DeviceBuffer<int64_t> dids(id_values);
  ASSERT_EQ(ops::cuda::embedding_forward(dweight_in.get(), dids.get(), out.get(), n, C, nullptr), cudaSuccess);
  EXPECT_EQ(out.host(), floats(want_out));

  ASSERT_EQ(ops::cuda::embedding_backward(dgrad.get(), dids.get(), dweight.get(), n, vocab, C, true, nullptr),
            cudaSuccess);
  const std::vector<float> first = dweight.host();
  EXPECT_EQ(first, floats(want_dweight)) << "deterministic backward: the CPU op's bits";
  ASSERT_EQ(ops::cuda::embedding_backward(dgrad.get(), dids.get(), dweight.get(), n, vocab, C, true, nullptr),
            cudaSuccess);
  EXPECT_EQ(dweight.host(), first) << "deterministic backward: run to run";

  ASSERT_EQ(ops::cuda::embedding_backward(dgrad.get(), dids.get(), dweight.get(), n, vocab, C, false, nullptr),
            cudaSuccess);
  expect_close(doubles(dweight.host()), want_dweight.to_vector(), 1e-5, "atomic backward");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaEmbedding,
                         ::testing::Values(EmbeddingCase{1, 1, 3}, EmbeddingCase{5, 33, 17}, EmbeddingCase{64, 64, 100},
                                           EmbeddingCase{65, 300, 70}, EmbeddingCase{200, 8, 2500}),
                         [](const auto& info) {
                           return "vocab" + std::to_string(info.param.vocab) + "_C" + std::to_string(info.param.C) +
                                  "_n" + std::to_string(info.param.n);
                         });

}  // namespace
}  // namespace minidl::testing
