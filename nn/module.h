// Module: the base of every layer. It owns named parameters, buffers and child modules, and gives them the dotted
// names that checkpoints use (Hugging Face GPT-2 style, e.g. "transformer.h.0.attn.c_attn.weight").
//
//   class Affine : public Module {
//    public:
//     Affine(int64_t n) {
//       MemoryTagGuard tag(MemTag::kParams);           // parameters are charged to the params ledger tag
//       scale = register_parameter("scale", Tensor::ones({n}));
//       inner = register_module("inner", std::make_shared<Linear>(n, n));
//     }
//     Tensor scale;
//     std::shared_ptr<Linear> inner;
//   };
//   for (auto& [name, p] : model.named_parameters()) ...   // "scale", "inner.weight", "inner.bias"
//   model.load_state_dict(other.state_dict());
//
// Contracts:
// - Names are listed recursively in registration order: a module's own parameters first, then each child's.
// - A Tensor is a shared handle, so the member a layer keeps and the registered entry are the same tensor;
//   load_state_dict and zero_grad work in place and never replace a parameter's storage (optimizers, DDP and
//   ZeRO may hold views of it).
// - Modules are not copyable (a copy would silently share parameters); share them through std::shared_ptr.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace minidl::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// name -> tensor. Ordered by name so that iterating it is deterministic.
using StateDict = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Registers a trainable tensor (marks it requires_grad) and returns it. Names are unique within a module and
  // contain no '.'.
  Tensor register_parameter(const std::string& name, Tensor value);
  // Registers a non-trainable tensor that belongs to the state (e.g. running statistics).
  Tensor register_buffer(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    add_child(name, child);
    return child;
  }

  // Replaces the registered child `name` (a parallelism keeping part of a module: expert parallelism keeps a rank's
  // experts). Throws unless the name is registered.
  void replace_module(const std::string& name, std::shared_ptr<Module> child);

  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Direct children, in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  // Training mode (dropout active) for this module and all its children.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Parameters and buffers by dotted name. The tensors are the module's own (no copy).
  StateDict state_dict() const;
  // Copies each entry into the tensor of the same name (converting dtype if needed). A shape mismatch is always
  // an error; with strict, so are names the module has but the dict lacks (missing) and names the dict has but
  // the module lacks (unexpected). The error lists every offending name with the expected and found shapes.
  void load_state_dict(const StateDict& dict, bool strict = true);

  // Fills every existing gradient with zeros in place (keeps the storage: DDP/ZeRO may hold views of it).
  void zero_grad();

  // Moves every parameter and buffer (and gradient) of this module and its children to `device`, in place:
  // layers and optimizers holding the tensors see the new data. Call it before making an optimizer.
  void to(Device device);
  // Elements in all parameters, counting a tensor shared by two names once.
  int64_t num_parameters() const;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool buffers, NamedTensors& out) const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A list of modules named "0", "1", ... (HF's nn.ModuleList: "transformer.h.3.ln_1.weight"). A list that holds a
// contiguous part of a longer one (a pipeline stage's blocks) starts its names at first_index: entry i (local) is
// named first_index + i, so its parameters keep the names they have in the whole list.
template <class M>
class ModuleList : public Module {
 public:
  explicit ModuleList(int64_t first_index = 0) : first_index_(first_index) {
    MINIDL_CHECK(first_index >= 0, "ModuleList: expected first_index >= 0, got ", first_index);
  }
  void push_back(std::shared_ptr<M> m) {
    items_.push_back(register_module(std::to_string(first_index_ + int64_t(items_.size())), m));
  }
  size_t size() const { return items_.size(); }
  // Local index: entry i is named first_index() + i.
  M& operator[](size_t i) const { return *items_[i]; }
  int64_t first_index() const { return first_index_; }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  int64_t first_index_;
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace minidl::nn
