// Fused causal attention: float64 finite-difference gradient checks, the f32 flash kernel against the explicit
// T x T masked softmax(Q K^T * scale) V per head written here in double loops (forward and gradients), O(T)
// memory, and bad-input errors.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/memory.h"
#include "ops/attention.h"
#include "tests/ops/nn_test_util.h"
#include "tests/support/gradcheck.h"

using namespace minidl;
using namespace minidl::testing;

namespace {

struct Reference {
  Values out, dqkv;
};

// qkv: (B, T, 3C) values; R: (B, T, C) output gradient. Materialises S and P (T x T) per head.
Reference reference_attention(const Values& qkv, const Values& R, int64_t B, int64_t T, int64_t C, int64_t H) {
  int64_t D = C / H;
  double scale = 1 / std::sqrt(double(D));
  Reference ref{Values(size_t(B * T * C), 0.0), Values(qkv.size(), 0.0)};
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return size_t(b * T * 3 * C + t * 3 * C + part * C + h * D + d);
  };
  auto out_at = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return size_t(b * T * C + t * C + h * D + d); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      Values P(size_t(T * T), 0.0), dP(size_t(T * T), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qkv[at(b, i, 0, h, d)] * qkv[at(b, j, 1, h, d)];
          P[size_t(i * T + j)] = s * scale;
          m = std::max(m, s * scale);
        }
        for (int64_t j = 0; j <= i; ++j) z += std::exp(P[size_t(i * T + j)] - m);
        for (int64_t j = 0; j <= i; ++j) P[size_t(i * T + j)] = std::exp(P[size_t(i * T + j)] - m) / z;
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < D; ++d) {
            ref.out[out_at(b, i, h, d)] += P[size_t(i * T + j)] * qkv[at(b, j, 2, h, d)];
            // dP = dO V^T, dV = P^T dO
            dP[size_t(i * T + j)] += R[out_at(b, i, h, d)] * qkv[at(b, j, 2, h, d)];
            ref.dqkv[at(b, j, 2, h, d)] += P[size_t(i * T + j)] * R[out_at(b, i, h, d)];
          }
      }
      for (int64_t i = 0; i < T; ++i) {
        // Softmax backward on the explicit row: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik).
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += P[size_t(i * T + j)] * dP[size_t(i * T + j)];
        for (int64_t j = 0; j <= i; ++j) {
          double dS = P[size_t(i * T + j)] * (dP[size_t(i * T + j)] - dot) * scale;
          for (int64_t d = 0; d < D; ++d) {
            ref.dqkv[at(b, i, 0, h, d)] += dS * qkv[at(b, j, 1, h, d)];
            ref.dqkv[at(b, j, 1, h, d)] += dS * qkv[at(b, i, 0, h, d)];
          }
        }
      }
    }
  return ref;
}

void expect_matches_reference(int64_t B, int64_t T, int64_t C, int n_head, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " C=" << C << " H=" << n_head);
  Tensor qkv = random_tensor({B, T, 3 * C}, seed, DType::f32);
  qkv.set_requires_grad(true);
  Values R = random_values(B * T * C, seed + 1);
  ForwardBackward fb =
      forward_backward([&](const std::vector<Tensor>& in) { return causal_attention(in[0], n_head); }, {qkv}, R);
  Values r32 = Tensor::from_vector(R, {B * T * C}).to_vector();  // R as the f32 backward sees it
  Reference ref = reference_attention(qkv.to_vector(), r32, B, T, C, n_head);
  expect_close(fb.out, ref.out, 1e-5, "attention out");
  expect_close(fb.grad[0], ref.dqkv, 1e-5, "attention dqkv");
}

}  // namespace

TEST(CausalAttention, GradCheckF64SmallRagged) {
  Tensor qkv = random_tensor({2, 5, 3 * 6}, 30, DType::f64);  // T = 5, C = 6, H = 2 -> D = 3
  qkv.set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], 2); }, {qkv});
}

TEST(CausalAttention, GradCheckF64AcrossBlocks) {
  Tensor qkv = random_tensor({1, 70, 3 * 15}, 31, DType::f64);  // T = 70: two blocks; C = 15, H = 3 -> D = 5
  qkv.set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], 3); }, {qkv});
}

TEST(CausalAttention, MatchesExplicitMaskedSoftmaxF32) {
  expect_matches_reference(2, 5, 6, 2, 32);
  expect_matches_reference(2, 70, 48, 3, 33);   // D = 16, last block of 6 queries
  expect_matches_reference(1, 130, 30, 5, 34);  // D = 6, three blocks
  expect_matches_reference(1, 64, 64, 2, 35);   // D = 32, exactly one block
  expect_matches_reference(1, 70, 128, 2, 36);  // D = 64
}

// The flash kernel keeps O(T) memory: nothing near T x T is allocated in forward or backward.
TEST(CausalAttention, NeverAllocatesTxT) {
  const int64_t T = 1024, C = 8;
  Tensor qkv = random_tensor({1, T, 3 * C}, 37, DType::f32);
  Tensor dout = random_tensor({1, T, C}, 38, DType::f32);
  ledger().reset_peaks();
  int64_t before = ledger().current_total();
  ops::AttentionForward f = ops::causal_attention_forward(qkv, 1);
  Tensor dqkv = ops::causal_attention_backward(dout, qkv, f.out, f.lse, 1);
  int64_t extra = ledger().peak_total() - before;
  // out + lse + dqkv = (C + 1 + 3C) * T floats; a T x T score matrix alone would be 4 MiB.
  EXPECT_LT(extra, 4 * T * T / 8) << "peak extra bytes " << extra;
  EXPECT_EQ(dqkv.shape(), qkv.shape());
}

TEST(CausalAttention, BadQkvNamesExpectedAndGot) {
  expect_error([] { causal_attention(Tensor::zeros({1, 4, 20}), 2); }, {"multiple of 6", "got 20", "n_head = 2"});
  expect_error([] { causal_attention(Tensor::zeros({4, 18}), 2); }, {"(B, T, 3C)", "got (4, 18)"});
  expect_error([] { causal_attention(Tensor::zeros({1, 4, 18}, DType::i64), 2); }, {"f32 or f64", "got i64"});
}
