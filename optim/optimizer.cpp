#include "optim/optimizer.h"

#include <cstring>
#include <unordered_set>

#include "core/memory.h"
#include "core/parallel.h"

namespace minidl::optim {

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, const char* name)
    : groups_(std::move(groups)), name_(name) {
  set_lr(lr);
  std::unordered_set<const TensorImpl*> seen;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    MINIDL_CHECK(group.weight_decay >= 0.0, name_, ": expected weight_decay >= 0 in group ", gi, ", got ",
                 group.weight_decay);
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      const Tensor& p = group.params[pi];
      MINIDL_CHECK(p.defined(), name_, ": parameter ", pi, " of group ", gi, " is undefined");
      MINIDL_CHECK(p.requires_grad() && p.is_leaf(), name_, ": parameter ", pi, " of group ", gi,
                   " must be a leaf that requires grad");
      MINIDL_CHECK(p.dtype() == DType::f32 && p.is_contiguous(), name_, ": expected parameter ", pi, " of group ", gi,
                   " to be contiguous f32, got dtype ", p.dtype(), " shape ", p.shape(), " strides ", p.strides());
      const std::string& owner = p.impl()->autograd.update_owner;
      MINIDL_CHECK(owner.empty(), name_, ": parameter ", pi, " of group ", gi, " is updated by ", owner);
      MINIDL_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", pi, " of group ", gi,
                   " appears more than once");
      slots_.push_back({p, group.weight_decay, numel_});
      numel_ += p.numel();
    }
  }
  MINIDL_CHECK(!slots_.empty(), name_, ": got an empty parameter list");
}

void Optimizer::set_lr(double lr) {
  MINIDL_CHECK(lr >= 0.0, name_, ": expected lr >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::step_unless(const Tensor& found_inf) {
  if (found_inf.item() == 0) step();
}

void Optimizer::zero_grad() {
  // The contiguous CPU gradients in one parallel pass (about 50 small tensors in a GPT: one fork and join for all);
  // the others, on a device or strided, one by one.
  std::vector<Tensor> host;
  std::vector<int64_t> bytes;
  for (const Slot& s : slots_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    if (g.device().is_cpu() && g.is_contiguous()) {
      host.push_back(g);
      bytes.push_back(int64_t(g.nbytes()));
    } else {
      g.zero_();
    }
  }
  parallel_for_parts(bytes, int64_t(1) << 16, [&](size_t i, int64_t begin, int64_t end) {
    std::memset(static_cast<char*>(host[i].raw_data()) + begin, 0, size_t(end - begin));
  });
}

Tensor Optimizer::grad_of(const Slot& slot) const {
  Tensor g = slot.param.grad();
  if (!g.defined()) return g;
  MINIDL_CHECK(g.dtype() == DType::f32 && g.is_contiguous() && g.numel() == slot.param.numel(), name_,
               ": expected a contiguous f32 gradient of shape ", slot.param.shape(), ", got dtype ", g.dtype(),
               " shape ", g.shape());
  return g;
}

Tensor Optimizer::slice(const Tensor& flat, const Slot& slot) {
  const Shape& shape = slot.param.shape();
  return flat.as_strided(shape, contiguous_strides(shape), slot.offset);
}

Tensor Optimizer::state_of(const Tensor& flat, const Tensor& param) const {
  MINIDL_CHECK(flat.numel() == numel_, name_, "::state_of: expected a flat buffer of ", numel_, " elements, got ",
               flat.numel());
  for (const Slot& s : slots_)
    if (s.param.same(param)) return slice(flat, s);
  MINIDL_CHECK(false, name_, "::state_of: the tensor of shape ", param.shape(), " is not one of its parameters");
  return {};
}

Tensor Optimizer::zeros_state() const {
  MemoryTagGuard tag(MemTag::kOptimizer);
  return Tensor::zeros({numel_}, DType::f32, slots_.front().param.device());
}

std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                     double weight_decay) {
  ParamGroup decayed{{}, weight_decay}, undecayed{{}, 0.0};
  for (const auto& [name, p] : named_params) {
    MINIDL_CHECK(p.defined(), "decay_groups: parameter '", name, "' is undefined");
    (p.dim() >= 2 ? decayed : undecayed).params.push_back(p);
  }
  return {decayed, undecayed};
}

}  // namespace minidl::optim
