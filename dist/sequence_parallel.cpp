#include "dist/sequence_parallel.h"

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "dist/tensor_parallel.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/kernels/dropout.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace minidl::dist {

namespace {

// A contiguous copy of the view t. On a device by the elementwise copy kernel (ops::broadcast_to to t's own
// shape), since Tensor::contiguous() converts a device view through a host copy.
Tensor contiguous_copy(const Tensor& t) {
  return t.device().is_cpu() ? t.contiguous() : ops::broadcast_to(t, t.shape());
}

// The collectives work on flat contiguous chunks; a chunk of the sequence of (B, T, C) is not one, of (T, B, C) it
// is. Raw (no autograd): the autograd functions below call them forward and backward.
Tensor sequence_all_gather(const Tensor& x, ProcessGroup& group) {
  MINIDL_CHECK(x.dim() == 3, "sequence parallelism: expected (B, T, C), got ", x.shape());
  const int64_t n = group.size(), B = x.size(0), Tr = x.size(1), C = x.size(2);
  Tensor whole = Tensor::empty({n * Tr, B, C}, x.dtype(), x.device());
  counted_all_gather(whole, contiguous_copy(x.transpose(0, 1)), group);
  return contiguous_copy(whole.transpose(0, 1));
}

Tensor sequence_reduce_scatter(const Tensor& x, ProcessGroup& group) {
  MINIDL_CHECK(x.dim() == 3, "sequence parallelism: expected (B, T, C), got ", x.shape());
  const int64_t n = group.size(), B = x.size(0), T = x.size(1), C = x.size(2);
  MINIDL_CHECK(T % n == 0, "sequence parallelism: the sequence length T = ", T, " must be a multiple of --tp ", n);
  Tensor mine = Tensor::empty({T / n, B, C}, x.dtype(), x.device());
  counted_reduce_scatter(mine, contiguous_copy(x.transpose(0, 1)), group);
  return contiguous_copy(mine.transpose(0, 1));
}

}  // namespace

Tensor reduce_scatter_to_sequence_parallel(const Tensor& x, ProcessGroup& group) {
  if (group.size() == 1) return x;
  ProcessGroup* g = &group;
  Tensor y;
  {
    autograd::NoGradGuard raw;
    y = sequence_reduce_scatter(x, group);
  }
  return autograd::record("SequenceParallelReduceScatter", {x}, y,
                          [g](const Tensor& gy) { return std::vector<Tensor>{sequence_all_gather(gy, *g)}; });
}

Tensor gather_from_sequence_parallel(const Tensor& x, ProcessGroup& group) {
  if (group.size() == 1) return x;
  ProcessGroup* g = &group;
  Tensor y;
  {
    autograd::NoGradGuard raw;
    y = sequence_all_gather(x, group);
  }
  return autograd::record("SequenceParallelAllGather", {x}, y,
                          [g](const Tensor& gy) { return std::vector<Tensor>{sequence_reduce_scatter(gy, *g)}; });
}

Tensor sequence_parallel_linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                                ProcessGroup& group) {
  if (group.size() == 1) return linear(x_in, weight_in, bias_in);
  // The operands autocast would give linear(): their casts are recorded, so the gradients flow back through them.
  const Tensor x = autograd::autocast_to_half(x_in), weight = autograd::autocast_to_half(weight_in);
  const Tensor bias = bias_in.defined() ? autograd::autocast_to_half(bias_in) : Tensor();
  const Tensor xd = x.detach(), wd = weight.detach();
  Tensor out;
  {
    autograd::NoGradGuard raw;
    out = ops::linear(sequence_all_gather(xd, group), wd, bias.defined() ? bias.detach() : Tensor());
  }
  ProcessGroup* g = &group;
  const bool has_bias = bias.defined();
  return autograd::record("SequenceParallelLinear", {x, weight, bias}, out, [=](const Tensor& gy) {
    const int64_t in = wd.size(0), outs = wd.size(1);
    Tensor g2 = gy.contiguous().reshape({-1, outs});
    Tensor whole = sequence_all_gather(xd, *g);  // again: forward kept only this rank's positions
    Tensor gw = ops::matmul(whole.reshape({-1, in}), g2, true, false);
    Tensor gb = has_bias ? ops::sum(g2, 0) : Tensor();
    Tensor gx = sequence_reduce_scatter(ops::matmul(g2, wd, false, true).reshape(whole.shape()), *g);
    return std::vector<Tensor>{gx, gw, gb};
  });
}

Tensor sequence_parallel_dropout(const nn::Dropout& dropout, const nn::DropoutContext& ctx, const Tensor& x,
                                 ProcessGroup& group) {
  if (!dropout.is_training() || dropout.p() == 0.0) return x;
  MINIDL_CHECK(x.dim() == 3, "sequence_parallel_dropout: expected (B, T / tp, C), got ", x.shape());
  const int64_t B = x.size(0), Tr = x.size(1), C = x.size(2), T = Tr * group.size();
  const int64_t first_position = int64_t(group.rank()) * Tr;
  // Sample b's positions are one contiguous run of Tr * C elements in x and in the one-process activation.
  std::vector<uint64_t> offsets(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first_element = ((ctx.first_sample + b) * T + first_position) * C;
    constexpr int64_t kPer = ops::kernels::kDropoutPerDraw;  // elements per Philox draw
    MINIDL_CHECK(first_element % kPer == 0, "sequence parallel dropout: a sequence slice begins at element ",
                 first_element, ", not a multiple of ", kPer, "; use a model whose n_embd is a multiple of ", kPer);
    offsets[size_t(b)] = ctx.step * nn::DropoutContext::kOffsetsPerStep + uint64_t(first_element / kPer);
  }
  const double p = dropout.p();
  const uint64_t seed = ctx.seed, stream = dropout.stream();
  // y = x * mask / (1 - p) is linear in x: backward applies the same masks to the gradient.
  auto apply = [=](const Tensor& in) {
    Tensor src = in.contiguous(), out = Tensor::empty(in.shape(), in.dtype(), in.device());
    for (int64_t b = 0; b < B; ++b) {
      Tensor dst = out.narrow(0, b, 1);
      dst.copy_(ops::dropout(src.narrow(0, b, 1), p, seed, stream, offsets[size_t(b)]));
    }
    return out;
  };
  Tensor y;
  {
    autograd::NoGradGuard raw;
    y = apply(x);
  }
  return autograd::record("SequenceParallelDropout", {x}, y,
                          [apply](const Tensor& gy) { return std::vector<Tensor>{apply(gy)}; });
}

}  // namespace minidl::dist
