#include "nn/block_hooks.h"

#include <memory>
#include <string>

#include "autograd/node.h"
#include "core/trace.h"

namespace minidl::nn {

Tensor BlockModule::run_block(int64_t i, const Tensor& x, const std::function<Tensor(const Tensor&)>& forward) const {
  BlockHooks* hooks = hooks_;
  // While tracing, the block's backward is a span too: it opens when the block's output gradient is complete (the
  // node on the output, below) and closes when its input's is (an identity node on the input), so a recomputation,
  // ZeRO-3's gather and the block's own backward nest in it. Only then is the input wrapped: off, the graph is the
  // same as without tracing.
  std::shared_ptr<std::unique_ptr<trace::Span>> backward_span;
  Tensor in = x;
  if (trace::enabled() && autograd::any_requires_grad({x})) {
    backward_span = std::make_shared<std::unique_ptr<trace::Span>>();
    in = autograd::record("BlockBackwardEnd", {x}, x.detach(), [backward_span](const Tensor& gx) {
      backward_span->reset();
      return std::vector<Tensor>{gx};
    });
  }
  if (hooks) hooks->before_block(i, false);
  Tensor y;
  {
    const trace::Span span(trace::enabled() ? "block " + std::to_string(i) + " forward" : std::string());
    y = forward(in);
  }
  if (hooks) hooks->after_block(i, false);
  if ((hooks || backward_span) && autograd::any_requires_grad({y})) {
    // An identity node on the block's output: its backward runs once the output's gradient is complete, before
    // anything of the block's own backward.
    y = autograd::record("BlockBackwardHook", {y}, y.detach(), [hooks, i, backward_span](const Tensor& gy) {
      if (backward_span) *backward_span = std::make_unique<trace::Span>("block " + std::to_string(i) + " backward");
      if (hooks) hooks->before_block_backward(i);
      return std::vector<Tensor>{gy};
    });
  }
  return y;
}

}  // namespace minidl::nn
