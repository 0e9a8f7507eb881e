#include "autograd/checkpoint.h"

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/trace.h"

namespace minidl::autograd {

namespace {

// Next edges: the inputs in order, then the parameters. Output i of the region is output i of this node.
class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, const std::vector<Tensor>& inputs, std::vector<Tensor> params, DType autocast,
                 uint32_t outputs)
      : Node("checkpoint"), fn_(std::move(fn)), params_(std::move(params)), autocast_(autocast), outputs_(outputs) {
    for (const Tensor& t : inputs) {
      inputs_.push_back(t.detach());  // the storage, not the history
      needs_grad_.push_back(t.requires_grad() || t.grad_fn() != nullptr);
    }
  }

  uint32_t num_outputs() const override { return outputs_; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    MINIDL_CHECK(fn_, "backward through a checkpointed region a second time: its inputs were released by the first");
    // Released when this returns: the recomputed graph and the kept inputs live only as long as this backward.
    CheckpointFn fn = std::move(fn_);
    fn_ = nullptr;
    std::vector<Tensor> inputs = std::move(inputs_), params = std::move(params_);

    EnableGradGuard grad_on;
    AutocastGuard autocast(autocast_);
    std::vector<Tensor> targets;  // the input copies, then the parameters: where gradients are captured
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor copy = inputs[i].detach();
      if (needs_grad_[i]) copy.set_requires_grad(true);
      targets.push_back(copy);
    }
    std::vector<Tensor> outs;
    {
      const trace::Span span("recompute");
      outs = fn(std::vector<Tensor>(targets.begin(), targets.end()));
    }
    MINIDL_CHECK(outs.size() == grads.size(), "checkpoint: the recomputation returned ", outs.size(),
                 " outputs but the forward returned ", grads.size(), "; fn must be deterministic");
    targets.insert(targets.end(), params.begin(), params.end());

    std::vector<Tensor> roots, root_grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!grads[i].defined() || !(outs[i].grad_fn() || outs[i].requires_grad())) continue;
      roots.push_back(outs[i]);
      root_grads.push_back(grads[i]);
    }
    if (roots.empty()) return std::vector<Tensor>(next_edges().size());
    return grad(roots, root_grads, targets);
  }

 private:
  CheckpointFn fn_;
  std::vector<Tensor> inputs_;
  std::vector<bool> needs_grad_;
  std::vector<Tensor> params_;
  DType autocast_;
  uint32_t outputs_;
};

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params) {
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  // Recorded whenever grad mode is on, even if no input requires grad: parameters used inside fn may.
  if (!grad_mode_enabled()) return outs;
  auto node = std::make_shared<CheckpointNode>(fn, inputs, params, autocast_dtype(), uint32_t(outs.size()));
  for (const Tensor& t : inputs) node->next_edges().push_back(gradient_edge(t));
  for (const Tensor& p : params) node->next_edges().push_back(gradient_edge(p));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].defined() || !is_floating(outs[i].dtype())) continue;
    // A fresh handle: fn may return one of its inputs (an identity dropout), whose history must not change.
    outs[i] = outs[i].detach();
    outs[i].impl()->autograd.grad_fn = node;
    outs[i].impl()->autograd.output_nr = uint32_t(i);
  }
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const std::vector<Tensor>& params) {
  CheckpointFn wrapped = [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; };
  return checkpoint(wrapped, {input}, params)[0];
}

}  // namespace minidl::autograd
