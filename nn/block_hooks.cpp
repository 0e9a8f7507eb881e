#include "nn/block_hooks.h"

#include "autograd/node.h"

namespace minidl::nn {

Tensor BlockModule::run_block(int64_t i, const Tensor& x, const std::function<Tensor(const Tensor&)>& forward) const {
  BlockHooks* hooks = hooks_;
  if (hooks) hooks->before_block(i, false);
  Tensor y = forward(x);
  if (hooks) hooks->after_block(i, false);
  if (hooks && autograd::any_requires_grad({y})) {
    // An identity node on the block's output: its backward runs once the output's gradient is complete, before
    // anything of the block's own backward.
    y = autograd::record("BlockBackwardHook", {y}, y.detach(), [hooks, i](const Tensor& gy) {
      hooks->before_block_backward(i);
      return std::vector<Tensor>{gy};
    });
  }
  return y;
}

}  // namespace minidl::nn
