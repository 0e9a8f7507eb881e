#include "optim/adamw.h"

#include "ops/adamw.h"

namespace minidl::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(std::move(groups), options.lr, "AdamW"), options_(options) {
  MINIDL_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "AdamW: expected 0 <= beta1 < 1, got ", options.beta1);
  MINIDL_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "AdamW: expected 0 <= beta2 < 1, got ", options.beta2);
  MINIDL_CHECK(options.eps >= 0.0, "AdamW: expected eps >= 0, got ", options.eps);
  m_ = zeros_state();
  v_ = zeros_state();
}

void AdamW::step() {
  ++step_;
  ops::AdamWHyper h{lr(), options_.beta1, options_.beta2, options_.eps, 0.0, step_};
  for (const Slot& s : slots()) {
    h.weight_decay = s.weight_decay;
    ops::fused_adamw_(s.param, grad_of(s), slice(m_, s), slice(v_, s), h);
  }
}

void AdamW::load_state(const AdamWState& state) {
  MINIDL_CHECK(state.step >= 0, "AdamW::load_state: expected step >= 0, got ", state.step);
  for (const Tensor* t : {&state.m, &state.v}) {
    MINIDL_CHECK(t->defined() && t->numel() == numel(), "AdamW::load_state: expected m and v with ", numel(),
                 " elements, got ", t->defined() ? t->numel() : 0);
  }
  m_.copy_(state.m.reshape({numel()}));
  v_.copy_(state.v.reshape({numel()}));
  step_ = state.step;
}

}  // namespace minidl::optim
