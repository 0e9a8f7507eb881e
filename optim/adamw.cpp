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

void AdamW::for_each_group(const GroupFn& fn) {
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
    if (!params.empty()) fn(params, grads, m, v, all[begin].weight_decay);
    begin = end;
  }
}

void AdamW::step() { step_zeroing(false); }

void AdamW::step_and_zero_grad() {
  if (skipped_.defined()) return Optimizer::step_and_zero_grad();  // the device's flagged kernel, then zero_grad
  step_zeroing(true);  // zeroes every gradient the update reads: zero_grad's set (it skips undefined ones too)
}

// zero_grads: each group's gradients are zeroed by the update's own pass (ops::fused_adamw_multi_): the same state
// as step() and zero_grad(), with one pass over the gradients fewer (baby config: a 3 MB memset and its parallel
// region).
void AdamW::step_zeroing(bool zero_grads) {
  ++step_;
  ops::AdamWHyper h{lr(), options_.beta1, options_.beta2, options_.eps, 0.0, step_, lr_on_device_};
  // After a step_unless on the device the count of steps taken lives there too: a flag that is never set.
  const Tensor never = skipped_.defined() ? Tensor::zeros({1}, DType::i32, skipped_.device()) : Tensor();
  for_each_group([&](auto& params, auto& grads, auto& m, auto& v, double wd) {
    h.weight_decay = wd;
    if (never.defined())
      ops::fused_adamw_multi_unless_(params, grads, m, v, h, never, skipped_, false);
    else
      ops::fused_adamw_multi_(params, grads, m, v, h, zero_grads);
  });
}

void AdamW::step_unless(const Tensor& found_inf) {
  if (found_inf.device().is_cpu()) return Optimizer::step_unless(found_inf);
  if (!skipped_.defined()) skipped_ = Tensor::zeros({1}, DType::i64, found_inf.device());
  ++step_;
  ops::AdamWHyper h{lr(), options_.beta1, options_.beta2, options_.eps, 0.0, step_, lr_on_device_};
  // Each group's call reads the skipped count; only the last one adds this step to it.
  int groups = 0, done = 0;
  for_each_group([&](auto&&...) { ++groups; });
  for_each_group([&](auto& params, auto& grads, auto& m, auto& v, double wd) {
    h.weight_decay = wd;
    ops::fused_adamw_multi_unless_(params, grads, m, v, h, found_inf, skipped_, ++done == groups);
  });
}

void AdamW::keep_step_count_on(Device device) {
  MINIDL_CHECK(device.is_cuda(), "AdamW::keep_step_count_on: expected a CUDA device, got ", device);
  if (!skipped_.defined()) skipped_ = Tensor::zeros({1}, DType::i64, device);
}

void AdamW::count_next_step_on_device() {
  MINIDL_CHECK(skipped_.defined(),
               "AdamW::count_next_step_on_device: call keep_step_count_on(device) before the "
               "warm-up steps (the count must not be allocated inside a capture)");
  ops::add_to_count_(skipped_, -1);
  --step_;
}

void AdamW::read_lr_from(const Tensor& lr) {
  MINIDL_CHECK(skipped_.defined(), "AdamW::read_lr_from: call keep_step_count_on(device) first");
  MINIDL_CHECK(lr.numel() == 1 && lr.dtype() == DType::f64 && lr.device() == skipped_.device(),
               "AdamW::read_lr_from: expected one f64 on ", skipped_.device(), ", got ", lr.shape(), " ", lr.dtype(),
               " on ", lr.device());
  lr_on_device_ = lr;
}

AdamWState AdamW::state() const {
  const int64_t skipped = skipped_.defined() ? int64_t(skipped_.item()) : 0;
  return {step_ - skipped, m_, v_};
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
  if (skipped_.defined()) skipped_.zero_();
}

}  // namespace minidl::optim
