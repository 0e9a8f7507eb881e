// Attention over blocks of a sequence (ops/attention_blocks.h), the pieces of context parallelism's ring: a sequence
// cut into 2N chunks and dealt to N "ranks" (head-tail: rank r holds chunks r and 2N-1-r; contiguous: 2r and 2r+1),
// each rank's query chunks attending every key chunk block by block (causal: earlier chunks whole, its own the
// diagonal block, later ones skipped) and merged by logsumexp, equals attention over the whole sequence written here
// in double loops: forward, and dq, dk, dv summed from each block's backward, for N in {1, 2, 3, 4}, causal and not,
// balanced and not, f32 and f64, with grouped kv heads. The causal block over a whole sequence equals
// causal_attention on the packed qkv bitwise. Balance: the dot products per rank, equal under head-tail, not under
// the contiguous split.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/attention.h"
#include "ops/attention_blocks.h"
#include "tests/ops/nn_test_util.h"

using namespace minidl;
using namespace minidl::testing;

namespace {

struct Dims {
  int64_t B, T, H, Hkv, D;
  int64_t qw() const { return H * D; }
  int64_t kw() const { return Hkv * D; }
};

struct Whole {
  Values out, dq, dk, dv;
};

// Attention over the whole sequence, materialising each row's softmax; q (B, T, H D), k and v (B, T, Hkv D), dout
// like q. Query head h reads kv head h / (H / Hkv).
Whole reference(const Values& q, const Values& k, const Values& v, const Values& dout, const Dims& d, bool causal) {
  Whole w{Values(q.size(), 0.0), Values(q.size(), 0.0), Values(k.size(), 0.0), Values(v.size(), 0.0)};
  const double scale = 1 / std::sqrt(double(d.D));
  auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t x) { return size_t((b * d.T + t) * d.qw() + h * d.D + x); };
  auto ki = [&](int64_t b, int64_t t, int64_t h, int64_t x) {
    return size_t((b * d.T + t) * d.kw() + h / (d.H / d.Hkv) * d.D + x);
  };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        const int64_t n = causal ? i + 1 : d.T;
        Values p(static_cast<size_t>(n)), dp(static_cast<size_t>(n), 0.0);
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t x = 0; x < d.D; ++x) s += q[qi(b, i, h, x)] * k[ki(b, j, h, x)];
          p[size_t(j)] = s * scale, m = std::max(m, s * scale);
        }
        for (int64_t j = 0; j < n; ++j) z += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
        double dot = 0;
        for (int64_t j = 0; j < n; ++j) {
          p[size_t(j)] /= z;
          for (int64_t x = 0; x < d.D; ++x) {
            w.out[qi(b, i, h, x)] += p[size_t(j)] * v[ki(b, j, h, x)];
            dp[size_t(j)] += dout[qi(b, i, h, x)] * v[ki(b, j, h, x)];
            w.dv[ki(b, j, h, x)] += p[size_t(j)] * dout[qi(b, i, h, x)];
          }
          dot += p[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - dot) * scale;
          for (int64_t x = 0; x < d.D; ++x) {
            w.dq[qi(b, i, h, x)] += ds * k[ki(b, j, h, x)];
            w.dk[ki(b, j, h, x)] += ds * q[qi(b, i, h, x)];
          }
        }
      }
  return w;
}

// Rows [t0, t0 + n) of a (B, T, width) value array, as a tensor (B, n, width); and back, added.
Tensor rows(const Values& x, const Dims& d, int64_t width, int64_t t0, int64_t n, DType dtype) {
  Values out;
  for (int64_t b = 0; b < d.B; ++b)
    out.insert(out.end(), x.begin() + (b * d.T + t0) * width, x.begin() + (b * d.T + t0 + n) * width);
  return Tensor::from_vector(out, {d.B, n, width}, dtype);
}
void add_rows(Values& x, const Tensor& part, const Dims& d, int64_t width, int64_t t0) {
  const Values p = part.to_vector();
  const int64_t n = part.size(1);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t i = 0; i < n * width; ++i) x[size_t((b * d.T + t0) * width + i)] += p[size_t(b * n * width + i)];
}

// The chunks rank r holds of 2N: head-tail (r, 2N-1-r) or contiguous (2r, 2r+1).
std::vector<int64_t> chunks_of(int r, int N, bool balanced) {
  return balanced ? std::vector<int64_t>{r, 2 * N - 1 - r} : std::vector<int64_t>{2 * r, 2 * r + 1};
}

struct Ring {
  Whole got;
  std::vector<int64_t> dots;  // per rank: the query-key dot products its blocks compute
};

// Every rank's query chunks against every rank's key chunks (the ring's N steps, in ring order from its own),
// merged; then each block's backward on the merged out and lse, dq summed per query chunk, dk and dv per key chunk.
Ring ring(const Values& q, const Values& k, const Values& v, const Values& dout, const Dims& d, int N, bool causal,
          bool balanced, DType dtype) {
  const int64_t c = d.T / (2 * N);
  Ring r{{Values(q.size(), 0.0), Values(q.size(), 0.0), Values(k.size(), 0.0), Values(v.size(), 0.0)},
         std::vector<int64_t>(size_t(N), 0)};
  for (int rank = 0; rank < N; ++rank)
    for (int64_t i : chunks_of(rank, N, balanced)) {
      const Tensor qc = rows(q, d, d.qw(), i * c, c, dtype), dc = rows(dout, d, d.qw(), i * c, c, dtype);
      Tensor out = Tensor::zeros({d.B, c, d.qw()}, dtype);
      Tensor lse = Tensor::full({d.B, d.H, c}, -std::numeric_limits<double>::infinity(), dtype);
      std::vector<std::pair<int64_t, bool>> blocks;  // (key chunk, diagonal)
      for (int step = 0; step < N; ++step)
        for (int64_t j : chunks_of((rank - step + N) % N, N, balanced))
          if (!causal || j <= i) blocks.emplace_back(j, causal && j == i);
      for (auto [j, diagonal] : blocks) {
        ops::AttentionForward f =
            ops::attention_block_forward(qc, rows(k, d, d.kw(), j * c, c, dtype), rows(v, d, d.kw(), j * c, c, dtype),
                                         int(d.H), int(d.Hkv), diagonal);
        ops::merge_attention_blocks(out, lse, f.out, f.lse);
        r.dots[size_t(rank)] += diagonal ? c * (c + 1) / 2 : c * c;
      }
      add_rows(r.got.out, out, d, d.qw(), i * c);
      for (auto [j, diagonal] : blocks) {
        ops::AttentionBlockGrads g = ops::attention_block_backward(dc, qc, rows(k, d, d.kw(), j * c, c, dtype),
                                                                   rows(v, d, d.kw(), j * c, c, dtype), out, lse,
                                                                   int(d.H), int(d.Hkv), diagonal);
        add_rows(r.got.dq, g.dq, d, d.qw(), i * c);
        add_rows(r.got.dk, g.dk, d, d.kw(), j * c);
        add_rows(r.got.dv, g.dv, d, d.kw(), j * c);
      }
    }
  return r;
}

void expect_ring_equals_whole(const Dims& d, int N, bool causal, bool balanced, DType dtype, double rtol) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " T=" << d.T << " H=" << d.H << " Hkv=" << d.Hkv
                                    << (causal ? " causal" : " full") << (balanced ? " head-tail" : " contiguous")
                                    << " " << dtype);
  const uint64_t seed = uint64_t(100 * N + 10 * causal + balanced);
  // The values as the dtype holds them, so that the reference sees the kernel's inputs.
  auto held = [&](Values x) { return Tensor::from_vector(x, {int64_t(x.size())}, dtype).to_vector(); };
  const int64_t nq = d.B * d.T * d.qw(), nk = d.B * d.T * d.kw();
  const Values q = held(random_values(nq, seed)), k = held(random_values(nk, seed + 1));
  const Values v = held(random_values(nk, seed + 2)), g = held(random_values(nq, seed + 3));
  const Whole want = reference(q, k, v, g, d, causal);
  const Ring got = ring(q, k, v, g, d, N, causal, balanced, dtype);
  expect_close(got.got.out, want.out, rtol, "out");
  expect_close(got.got.dq, want.dq, rtol, "dq");
  expect_close(got.got.dk, want.dk, rtol, "dk");
  expect_close(got.got.dv, want.dv, rtol, "dv");
}

TEST(AttentionBlocks, HeadTailRingEqualsTheWholeSequenceF32) {
  for (int N = 1; N <= 4; ++N)
    for (bool causal : {true, false})
      for (bool balanced : {true, false})
        expect_ring_equals_whole({2, 2 * N * 5, 4, 2, 8}, N, causal, balanced, DType::f32, 1e-5);
}

TEST(AttentionBlocks, RingEqualsTheWholeSequenceF64AcrossKernelTiles) {
  // Chunks of 70 rows: two 64-row tiles each, the second ragged. Multi-query (Hkv = 1) and multi-head.
  expect_ring_equals_whole({1, 280, 2, 1, 4}, 2, true, true, DType::f64, 1e-10);
  expect_ring_equals_whole({1, 140, 2, 2, 4}, 1, false, true, DType::f64, 1e-10);
  expect_ring_equals_whole({1, 280, 2, 2, 4}, 2, false, false, DType::f32, 1e-5);
}

TEST(AttentionBlocks, HeadTailBalancesTheCausalWorkTheContiguousSplitDoesNot) {
  const Dims d{1, 48, 1, 1, 2};
  const Values x = random_values(d.B * d.T * d.D, 7);
  for (int N : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N);
    const std::vector<int64_t> even = ring(x, x, x, x, d, N, true, true, DType::f64).dots;
    const std::vector<int64_t> split = ring(x, x, x, x, d, N, true, false, DType::f64).dots;
    int64_t total = 0;
    for (int64_t n : even) total += n;
    EXPECT_EQ(total, d.T * (d.T + 1) / 2);  // every causal pair once
    for (int64_t n : even) EXPECT_EQ(n, even[0]);
    EXPECT_GT(split.back(), 2 * split.front());  // N 2: 300 and 876; N 4: 78 against the last rank's 510
  }
}

TEST(AttentionBlocks, TheWholeSequenceAsOneCausalBlockIsCausalAttentionBitwise) {
  const int64_t B = 2, T = 100, H = 4, Hkv = 2, D = 8;
  Tensor qkv = random_tensor({B, T, (H + 2 * Hkv) * D}, 3, DType::f32);
  Tensor q = qkv.narrow(2, 0, H * D).contiguous(), k = qkv.narrow(2, H * D, Hkv * D).contiguous();
  Tensor v = qkv.narrow(2, (H + Hkv) * D, Hkv * D).contiguous();
  Tensor dout = random_tensor({B, T, H * D}, 4, DType::f32);
  ops::AttentionForward packed = ops::causal_attention_forward(qkv, int(H), int(Hkv));
  ops::AttentionForward block = ops::attention_block_forward(q, k, v, int(H), int(Hkv), true);
  EXPECT_EQ(block.out.to_vector(), packed.out.to_vector());
  EXPECT_EQ(block.lse.to_vector(), packed.lse.to_vector());
  Tensor dqkv = ops::causal_attention_backward(dout, qkv, packed.out, packed.lse, int(H), int(Hkv));
  ops::AttentionBlockGrads g =
      ops::attention_block_backward(dout, q, k, v, block.out, block.lse, int(H), int(Hkv), true);
  EXPECT_EQ(g.dq.to_vector(), dqkv.narrow(2, 0, H * D).contiguous().to_vector());
  EXPECT_EQ(g.dk.to_vector(), dqkv.narrow(2, H * D, Hkv * D).contiguous().to_vector());
  EXPECT_EQ(g.dv.to_vector(), dqkv.narrow(2, (H + Hkv) * D, Hkv * D).contiguous().to_vector());
}

TEST(AttentionBlocks, MergeTakesTheFirstBlockWholeAndIgnoresAnEmptyOne) {
  Tensor out = Tensor::zeros({1, 2, 4}), lse = Tensor::full({1, 2, 2}, -std::numeric_limits<double>::infinity());
  Tensor ob = random_tensor({1, 2, 4}, 5, DType::f32), lb = random_tensor({1, 2, 2}, 6, DType::f32);
  ops::merge_attention_blocks(out, lse, ob, lb);
  EXPECT_EQ(out.to_vector(), ob.to_vector());
  EXPECT_EQ(lse.to_vector(), lb.to_vector());
  Tensor none = Tensor::full({1, 2, 2}, -std::numeric_limits<double>::infinity());
  ops::merge_attention_blocks(out, lse, Tensor::full({1, 2, 4}, NAN), none);
  EXPECT_EQ(out.to_vector(), ob.to_vector());
  EXPECT_EQ(lse.to_vector(), lb.to_vector());
}

TEST(AttentionBlocks, BadBlocksNameWhatWasExpectedAndGiven) {
  Tensor q = Tensor::zeros({1, 4, 8}), k = Tensor::zeros({1, 6, 8});
  expect_error([&] { ops::attention_block_forward(q, k, k, 2, 2, true); }, {"Tq = Tk", "Tq = 4", "Tk = 6"});
  Tensor narrow = Tensor::zeros({1, 6, 6});
  expect_error([&] { ops::attention_block_forward(q, narrow, narrow, 2, 2, false); },
               {"expected k of shape (1, Tk, 8)", "(1, 6, 6)"});
  expect_error([&] { ops::attention_block_forward(q, k, k, 2, 3, false); }, {"multiple of n_kv_head", "2 and 3"});
}

}  // namespace
