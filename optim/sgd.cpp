#include "optim/sgd.h"

#include "core/parallel.h"

namespace minidl::optim {

static constexpr int64_t kSGDGrain = 1 << 14;

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer(std::move(groups), options.lr, "SGD"), momentum_(options.momentum) {
  MINIDL_CHECK(momentum_ >= 0.0, "SGD: expected momentum >= 0, got ", momentum_);
  if (momentum_ != 0.0) buf_ = zeros_state();
}

void SGD::step() {
  const float lr = float(this->lr()), momentum = float(momentum_);
  for (const Slot& s : slots()) {
    Tensor g = grad_of(s);
    if (!g.defined()) continue;
    float* __restrict p = s.param.data<float>();
    const float* __restrict gp = g.data<float>();
    float* __restrict b = buf_.defined() ? slice(buf_, s).data<float>() : nullptr;
    const float wd = float(s.weight_decay);
    parallel_for(0, s.param.numel(), kSGDGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float d = gp[i] + wd * p[i];
        if (b) d = b[i] = momentum * b[i] + d;
        p[i] -= lr * d;
      }
    });
  }
}

}  // namespace minidl::optim
