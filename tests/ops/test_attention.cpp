// Fused causal attention: float64 finite-difference gradient checks, the f32 flash kernel against the explicit
// T x T masked softmax(Q K^T * scale) V per head written here in double loops (forward and gradients), O(T)
// memory, grouped kv heads (GQA, MQA) against multi-head attention on explicitly repeated K and V, and bad-input
// errors.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/memory.h"
#include "core/parallel.h"
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

// Grouped qkv (B, T, (H + 2 Hkv) D) as multi-head qkv (B, T, 3 H D): query head h gets kv head h / (H / Hkv)'s K
// and V, copied: Hugging Face's repeat_kv.
Tensor repeat_kv(const Tensor& qkv, int64_t H, int64_t Hkv) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (H + 2 * Hkv), C = H * D, g = H / Hkv;
  const Values x = qkv.to_vector();
  Values y(size_t(B * T * 3 * C));
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const double* row = x.data() + bt * (C + 2 * Hkv * D);
        double* out = y.data() + bt * 3 * C;
        out[h * D + d] = row[h * D + d];
        out[C + h * D + d] = row[C + h / g * D + d];
        out[2 * C + h * D + d] = row[C + Hkv * D + h / g * D + d];
      }
  return Tensor::from_vector(y, {B, T, 3 * C}, qkv.dtype());
}

// The multi-head gradient (B, T, 3 H D) of repeated K and V folded back to the grouped layout: dQ as it is, a kv
// head's dK and dV the sums (in double) over its group's query heads.
Values fold_kv(const Values& dqkv, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t C = H * D, g = H / Hkv, width = C + 2 * Hkv * D;
  Values y(size_t(B * T * width), 0.0);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const double* row = dqkv.data() + bt * 3 * C;
        double* out = y.data() + bt * width;
        out[h * D + d] = row[h * D + d];
        out[C + h / g * D + d] += row[C + h * D + d];
        out[C + Hkv * D + h / g * D + d] += row[2 * C + h * D + d];
      }
  return y;
}

// Columns [begin, end) of each (B * T) row of width `width`.
Values columns(const Values& x, int64_t width, int64_t begin, int64_t end) {
  Values y;
  for (size_t r = 0; r < x.size() / size_t(width); ++r)
    y.insert(y.end(), x.begin() + int64_t(r) * width + begin, x.begin() + int64_t(r) * width + end);
  return y;
}

// Grouped attention against multi-head attention on the repeated K and V: the forward (out, lse) and dQ are the
// same arithmetic per query head, so the same bits; dK and dV sum the group's heads in another order.
void expect_grouped_matches_repeated(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " H=" << H << " Hkv=" << Hkv << " D=" << D);
  const int64_t C = H * D, width = C + 2 * Hkv * D;
  const Tensor qkv = random_tensor({B, T, width}, seed, DType::f32),
               dout = random_tensor({B, T, C}, seed + 1, DType::f32);
  const Tensor mha_qkv = repeat_kv(qkv, H, Hkv);
  const ops::AttentionForward gqa = ops::causal_attention_forward(qkv, int(H), int(Hkv));
  const ops::AttentionForward mha = ops::causal_attention_forward(mha_qkv, int(H));
  EXPECT_EQ(gqa.out.shape(), Shape({B, T, C}));
  EXPECT_EQ(gqa.lse.shape(), Shape({B, H, T}));
  EXPECT_EQ(gqa.out.to_vector(), mha.out.to_vector()) << "out";
  EXPECT_EQ(gqa.lse.to_vector(), mha.lse.to_vector()) << "lse";
  const Tensor dqkv = ops::causal_attention_backward(dout, qkv, gqa.out, gqa.lse, int(H), int(Hkv));
  ASSERT_EQ(dqkv.shape(), qkv.shape());
  const Values got = dqkv.to_vector();
  const Values want =
      fold_kv(ops::causal_attention_backward(dout, mha_qkv, mha.out, mha.lse, int(H)).to_vector(), B, T, H, Hkv, D);
  EXPECT_EQ(columns(got, width, 0, C), columns(want, width, 0, C)) << "dq";
  expect_close(columns(got, width, C, C + Hkv * D), columns(want, width, C, C + Hkv * D), 1e-6, "dk");
  expect_close(columns(got, width, C + Hkv * D, width), columns(want, width, C + Hkv * D, width), 1e-6, "dv");
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

// Hkv = H is multi-head attention: the three-argument call is the two-argument one, bit for bit.
TEST(GroupedAttention, AsManyKvHeadsAsQueryHeadsIsMultiHead) {
  const Tensor qkv = random_tensor({2, 70, 3 * 48}, 40, DType::f32), dout = random_tensor({2, 70, 48}, 41, DType::f32);
  const ops::AttentionForward a = ops::causal_attention_forward(qkv, 3), b = ops::causal_attention_forward(qkv, 3, 3);
  EXPECT_EQ(a.out.to_vector(), b.out.to_vector());
  EXPECT_EQ(a.lse.to_vector(), b.lse.to_vector());
  EXPECT_EQ(ops::causal_attention_backward(dout, qkv, a.out, a.lse, 3).to_vector(),
            ops::causal_attention_backward(dout, qkv, b.out, b.lse, 3, 3).to_vector());
}

TEST(GroupedAttention, MatchesMultiHeadOnRepeatedKvF32) {
  expect_grouped_matches_repeated(2, 70, 6, 2, 8, 42);    // GQA, groups of 3; two query blocks
  expect_grouped_matches_repeated(2, 70, 6, 3, 8, 43);    // groups of 2
  expect_grouped_matches_repeated(1, 130, 6, 1, 16, 44);  // MQA, three blocks
  expect_grouped_matches_repeated(3, 5, 4, 2, 5, 45);     // a ragged T and D
}

TEST(GroupedAttention, BackwardBitsDoNotDependOnThreads) {
  const int64_t B = 2, T = 70, H = 6, Hkv = 2, D = 8;
  const Tensor qkv = random_tensor({B, T, (H + 2 * Hkv) * D}, 46, DType::f32);
  const Tensor dout = random_tensor({B, T, H * D}, 47, DType::f32);
  const ops::AttentionForward f = ops::causal_attention_forward(qkv, int(H), int(Hkv));
  const int threads = num_threads();
  set_num_threads(1);
  const Values one = ops::causal_attention_backward(dout, qkv, f.out, f.lse, int(H), int(Hkv)).to_vector();
  set_num_threads(std::max(2, threads));
  const Values many = ops::causal_attention_backward(dout, qkv, f.out, f.lse, int(H), int(Hkv)).to_vector();
  set_num_threads(threads);
  EXPECT_EQ(one, many);
}

TEST(GroupedAttention, GradCheckF64) {
  Tensor gqa = grad_leaf({2, 5, (4 + 2 * 2) * 3}, 48, DType::f64);  // H = 4, Hkv = 2, D = 3
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], 4, 2); }, {gqa});
  Tensor mqa = grad_leaf({1, 67, (3 + 2 * 1) * 2}, 49, DType::f64);  // H = 3, Hkv = 1, D = 2; two blocks
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], 3, 1); }, {mqa});
}

TEST(GroupedAttention, BadHeadsNameBothNumbersAndTheWidth) {
  expect_error(
      [] {
        causal_attention(Tensor::zeros({1, 4, 14 * 2}), 6, 4);
      },
      {"n_head to be a multiple of n_kv_head", "n_head = 6", "n_kv_head = 4"});
  expect_error([] { causal_attention(Tensor::zeros({1, 4, 12}), 4, 0); }, {"n_kv_head = 0"});
  expect_error(
      [] {
        causal_attention(Tensor::zeros({1, 4, 21}), 6, 2);
      },
      {"(n_head + 2 * n_kv_head) * head_dim", "n_head = 6", "n_kv_head = 2", "multiple of 10", "got 21"});
  const Tensor qkv = random_tensor({1, 4, 20}, 50, DType::f32);  // H = 6, Hkv = 2, D = 2
  const ops::AttentionForward f = ops::causal_attention_forward(qkv, 6, 2);
  expect_error(
      [&] {
        ops::causal_attention_backward(Tensor::zeros({1, 4, 20}), qkv, f.out, f.lse, 6, 2);
      },
      {"dout", "(1, 4, 12)"});
}
