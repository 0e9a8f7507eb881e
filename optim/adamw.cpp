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
  // One multi-tensor call per run of parameters with the same weight decay (a group): one launch on a GPU.
  const std::vector<Slot>& all = slots();
  for (size_t begin = 0; begin < all.size();) {
    size_t end = begin;
    std::vector<Tensor> params, grads, m, v;
    for (; end < all.size() && all[end].weight_decay == all[begin].weight_decay; ++end) {
      Tensor g = grad_of(all[end]);
      if (!g.defined()) continue;  // a parameter no backward reached
      params.push_back(all[end].param);
      grads.push_back(g);
      m.push_back(slice(m_, all[end]));
      v.push_back(slice(v_, all[end]));
    }
    h.weight_decay = all[begin].weight_decay;
    if (!params.empty()) ops::fused_adamw_multi_(params, grads, m, v, h);
    begin = end;
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
