// Attention over blocks (ops/attention_blocks.h) on device tensors, run by the emulated backend
// (ops/cuda/attention_blocks.cu), against the CPU op: the diagonal (causal) block and full blocks of other shapes,
// grouped kv heads, the block backward from a merged out and lse, and the merge itself, in f32 within 1e-5 (the
// same formulas, other summation orders: the CPU's head kernels tile their sums).
#include "ops/attention_blocks.h"
#include "tensor_ops_test.h"

namespace minidl::testing {
namespace {

struct BlockCase {
  int64_t B, Tq, Tk;
  int H, Hkv;
  int64_t D;
  bool causal;
};

TEST_F(CudaTensorOps, AttentionBlocksMatchTheCpu) {
  for (const BlockCase& c : {BlockCase{2, 5, 5, 4, 4, 8, true}, BlockCase{2, 3, 7, 4, 2, 8, false},
                             BlockCase{1, 6, 6, 2, 1, 16, true}, BlockCase{3, 4, 2, 4, 1, 4, false}}) {
    const std::string name = "B " + std::to_string(c.B) + " Tq " + std::to_string(c.Tq) + " Tk " +
                             std::to_string(c.Tk) + " H " + std::to_string(c.H) + " Hkv " + std::to_string(c.Hkv) +
                             (c.causal ? " causal" : " full");
    const Tensor q = random_tensor({c.B, c.Tq, c.H * c.D}, 1, DType::f32);
    const Tensor k = random_tensor({c.B, c.Tk, c.Hkv * c.D}, 2, DType::f32);
    const Tensor v = random_tensor({c.B, c.Tk, c.Hkv * c.D}, 3, DType::f32);
    const Tensor dout = random_tensor({c.B, c.Tq, c.H * c.D}, 4, DType::f32);
    const ops::AttentionForward want = ops::attention_block_forward(q, k, v, c.H, c.Hkv, c.causal);
    const ops::AttentionForward got =
        ops::attention_block_forward(q.to(kCuda), k.to(kCuda), v.to(kCuda), c.H, c.Hkv, c.causal);
    expect_device_matches(got.out, want.out, 1e-5, "out " + name);
    expect_device_matches(got.lse, want.lse, 1e-5, "lse " + name);
    // The backward from another block's merged row statistics: this block's out and lse merged with a second one.
    const Tensor k2 = random_tensor({c.B, c.Tq, c.Hkv * c.D}, 5, DType::f32);
    const Tensor v2 = random_tensor({c.B, c.Tq, c.Hkv * c.D}, 6, DType::f32);
    const ops::AttentionForward other = ops::attention_block_forward(q, k2, v2, c.H, c.Hkv, true);
    Tensor out = want.out.clone(), lse = want.lse.clone();
    ops::merge_attention_blocks(out, lse, other.out, other.lse);
    Tensor out_d = got.out.clone(), lse_d = got.lse.clone();
    ops::merge_attention_blocks(out_d, lse_d, other.out.to(kCuda), other.lse.to(kCuda));
    expect_device_matches(out_d, out, 1e-5, "merged out " + name);
    expect_device_matches(lse_d, lse, 1e-5, "merged lse " + name);
    const ops::AttentionBlockGrads gw = ops::attention_block_backward(dout, q, k, v, out, lse, c.H, c.Hkv, c.causal);
    const ops::AttentionBlockGrads gd = ops::attention_block_backward(
        dout.to(kCuda), q.to(kCuda), k.to(kCuda), v.to(kCuda), out.to(kCuda), lse.to(kCuda), c.H, c.Hkv, c.causal);
    expect_device_matches(gd.dq, gw.dq, 1e-5, "dq " + name);
    expect_device_matches(gd.dk, gw.dk, 1e-5, "dk " + name);
    expect_device_matches(gd.dv, gw.dv, 1e-5, "dv " + name);
  }
}

// A row the block saw nothing of (lse_b = -inf) keeps its output; a row with nothing yet (lse = -inf) takes the
// block's.
TEST_F(CudaTensorOps, AttentionBlockMergeEdgesMatchTheCpu) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor out = random_tensor({1, 2, 4}, 7, DType::f32), lse = Tensor::from_vector(Values{-inf, 0.5}, {1, 1, 2});
  const Tensor out_b = random_tensor({1, 2, 4}, 8, DType::f32),
               lse_b = Tensor::from_vector(Values{0.25, -inf}, {1, 1, 2});
  Tensor out_d = out.to(kCuda), lse_d = lse.to(kCuda);
  ops::merge_attention_blocks(out, lse, out_b, lse_b);
  ops::merge_attention_blocks(out_d, lse_d, out_b.to(kCuda), lse_b.to(kCuda));
  expect_device_matches(out_d, out, 0, "out");
  expect_device_matches(lse_d, lse, 0, "lse");
}

}  // namespace
}  // namespace minidl::testing
