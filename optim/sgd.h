// SGD with momentum, with PyTorch's semantics (dampening 0, no Nesterov):
//   g = grad + weight_decay * p          (L2 weight decay, coupled, as torch.optim.SGD)
//   buf = momentum * buf + g             (buf starts at zero, so the first step has buf = g, as in PyTorch)
//   p = p - lr * buf
// With momentum 0 no buffer is allocated and the update is p -= lr * g.
//
//   optim::SGD opt({{model.parameters(), /*weight_decay=*/0.0}}, {.lr = 0.1, .momentum = 0.9});
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include "optim/optimizer.h"

namespace minidl::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);
  void step() override;
  double momentum() const { return momentum_; }
  // The momentum buffers of all parameters back to back in group order (undefined when momentum is 0).
  const Tensor& momentum_buffer() const { return buf_; }

 private:
  double momentum_;
  Tensor buf_;
};

}  // namespace minidl::optim
