#include "nn/module.h"

#include <set>
#include <sstream>

#include "autograd/node.h"

namespace minidl::nn {

void Module::check_new_name(const std::string& name) const {
  MINIDL_CHECK(!name.empty() && name.find('.') == std::string::npos,
               "Module: a name must be non-empty and contain no '.', got '", name, "'");
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  MINIDL_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "Module: the name '", name,
               "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  MINIDL_CHECK(value.defined(), "register_parameter('", name, "'): undefined tensor");
  MINIDL_CHECK(value.is_leaf(), "register_parameter('", name, "'): expected a leaf tensor, got the output of ",
               value.grad_fn()->name());
  value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  MINIDL_CHECK(value.defined(), "register_buffer('", name, "'): undefined tensor");
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name);
  MINIDL_CHECK(child != nullptr, "register_module('", name, "'): null module");
  children_.emplace_back(name, std::move(child));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> child) {
  MINIDL_CHECK(child != nullptr, "replace_module('", name, "'): null module");
  for (auto& [n, c] : children_)
    if (n == name) {
      c = std::move(child);
      return;
    }
  MINIDL_CHECK(false, "replace_module('", name, "'): no such child");
}

void Module::collect(const std::string& prefix, bool buffers, NamedTensors& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->train(on);
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, t] : named_parameters()) out.emplace(name, t);
  for (auto& [name, t] : named_buffers()) out.emplace(name, t);
  return out;
}

void Module::load_state_dict(const StateDict& dict, bool strict) {
  StateDict own = state_dict();
  std::ostringstream missing, unexpected, mismatched;
  for (const auto& [name, t] : own) {
    auto it = dict.find(name);
    if (it == dict.end()) {
      missing << "\n  " << name << " expected shape " << t.shape();
    } else if (it->second.shape() != t.shape()) {
      mismatched << "\n  " << name << ": expected shape " << t.shape() << ", found " << it->second.shape();
    }
  }
  for (const auto& [name, t] : dict)
    if (!own.count(name)) unexpected << "\n  " << name << " found shape " << t.shape();

  std::string problems = mismatched.str().empty() ? "" : "shape mismatch:" + mismatched.str();
  if (strict) {
    if (!missing.str().empty()) problems += "\nmissing (in the module, not in the dict):" + missing.str();
    if (!unexpected.str().empty()) problems += "\nunexpected (in the dict, not in the module):" + unexpected.str();
  }
  MINIDL_CHECK(problems.empty(), "load_state_dict: the state dict does not match the module\n", problems);

  autograd::NoGradGuard no_grad;
  for (auto& [name, t] : own) {
    auto it = dict.find(name);
    if (it != dict.end()) t.copy_(it->second);
  }
}

void Module::to(Device device) {
  autograd::NoGradGuard no_grad;
  std::set<const TensorImpl*> seen;  // a tied weight is moved once
  NamedTensors all = named_parameters(), buffers = named_buffers();
  all.insert(all.end(), buffers.begin(), buffers.end());
  for (auto& [name, t] : all) {
    if (!seen.insert(t.impl()).second || t.device() == device) continue;
    MemoryTagGuard tag(MemTag::kParams);
    t.set_data(t.detach().to(device));
    Tensor g = t.grad();
    if (g.defined()) {
      MemoryTagGuard grad_tag(MemTag::kGrads);
      g.set_data(g.to(device));
    }
  }
}

void Module::zero_grad() {
  for (auto& t : parameters())
    if (t.grad().defined()) t.grad().zero_();
}

int64_t Module::num_parameters() const {
  std::set<const TensorImpl*> seen;
  int64_t n = 0;
  for (auto& t : parameters())
    if (seen.insert(t.impl()).second) n += t.numel();
  return n;
}

}  // namespace minidl::nn
