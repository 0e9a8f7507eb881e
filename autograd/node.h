// The autograd graph. Every differentiable op that sees an input requiring grad records a Node: the backward
// function of the op, with edges to the nodes that produced its inputs. Leaves that require grad get an
// AccumulateGrad node, which adds the incoming gradient into tensor.grad() and then fires the leaf's
// gradient-ready hooks (DDP, ZeRO and the pipeline hang off them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minidl::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: the input needs no gradient
  uint32_t input_nr = 0;       // which gradient slot of `node`
};

class Node {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  // grads[i] is the gradient w.r.t. this node's output i (undefined if none flowed). Returns one gradient per
  // next edge (undefined for inputs that need none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads) = 0;
  virtual uint32_t num_outputs() const { return 1; }

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge>& next_edges() { return next_edges_; }

 private:
  std::string name_;
  uint64_t sequence_nr_;  // creation order; backward runs later nodes first
  std::vector<Edge> next_edges_;
};

// A node whose backward is a lambda (the usual case: written next to the op's forward).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

class LambdaNode final : public Node {
 public:
  LambdaNode(std::string name, BackwardFn fn) : Node(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;

 private:
  BackwardFn fn_;
};

// Adds gradients into a leaf's grad() and fires its gradient-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;
  // Called when a node before it has added its contribution to the leaf's grad() itself (accumulate_in_place,
  // below): apply then fires the hooks even if no gradient arrives.
  void added_in_place() { added_in_place_ = true; }

 private:
  std::weak_ptr<TensorImpl> leaf_;
  bool added_in_place_ = false;
};

// Is gradient recording on for this thread? (NoGradGuard turns it off.)
bool grad_mode_enabled();

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Turns recording back on in its scope: activation checkpointing re-runs a forward inside backward, which itself
// runs under NoGradGuard.
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// Edge to the node that will receive t's gradient (its grad_fn, or its AccumulateGrad if a leaf requiring grad).
Edge gradient_edge(const Tensor& t);

// Records `output` as produced by an op over `inputs` with the given backward, if grad mode is on and any input
// requires grad; returns output (now carrying grad_fn). backward returns one gradient per input, in order
// (undefined for inputs that need none or are not differentiable).
//
//   Tensor y = ops::gelu_forward(x);
//   return record("gelu", {x}, y, [x](const Tensor& gy) { return std::vector<Tensor>{ops::gelu_backward(gy, x)}; });
Tensor record(const char* name, std::initializer_list<Tensor> inputs, Tensor output, BackwardFn backward);
// The same over a list whose length is known only at run time (cat of n parts, an MoE's experts).
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor output, BackwardFn backward);
// True if recording would happen for these inputs (lets an op skip saving tensors for backward).
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Runs backward from `roots` with the given root gradients: one per root (ones for a scalar root when undefined), or
// none at all (every root a scalar). A tensor given twice counts twice, as in PyTorch: backward({l, l}, {}) is the
// backward of l + l, and for a leaf w, backward({w, w}, {g1, g2}) adds g1 + g2 to w.grad() (its hooks fire once).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots);

// Like backward, but returns the gradients that arrive at `inputs` (one per input; undefined where none arrives or
// the input has no gradient edge) instead of passing them on: the nodes of `inputs` do not run, so a leaf input's
// grad() is untouched and its hooks do not fire, and the traversal does not go past them. Gradients reaching any
// other leaf accumulate as in backward. (torch.autograd.grad; activation checkpointing is built on it.)
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                         const std::vector<Tensor>& inputs);

// Gradient-accumulation fusion (Megatron-LM's gradient_accumulation_fusion), for a backward function that can add
// a leaf's gradient straight into leaf.grad(): a weight gradient's GEMM with beta = 1 spares a fresh gradient
// tensor and AccumulateGrad's pass adding it in (docs/decisions.md, "gradient-accumulation fusion"). If the
// backward pass in progress on this thread accumulates into `leaf` (a leaf that requires grad and is not one of
// grad()'s inputs) and leaf.grad() is defined, contiguous, and of the leaf's shape, dtype and device, this runs
// add(grad), which must add the contribution to grad in place, and returns true: the backward function then
// returns an undefined gradient for that input, and the leaf's AccumulateGrad adds only what other nodes send (a
// tied weight's other uses) and fires the gradient-ready hooks once, after all of it, as always. Otherwise it
// returns false, and the function returns the gradient as usual.
//
//   if (!autograd::accumulate_in_place(w, [&](Tensor& gw) { ops::matmul_add_(gw, x, g, true, false); }))
//     dw = ops::matmul(x, g, true, false);
bool accumulate_in_place(const Tensor& leaf, const std::function<void(Tensor& grad)>& add);

// Gradient-sum fusion, for a backward function whose kernel can add a gradient in its own pass (layer norm's
// backward adds the residual stream's gradient from the stream's other uses, as llm.c's layernorm_backward adds
// into dinp). Called by the backward function of the node the pass is running: if the gradient slot its input
// `input` (an index into the node's inputs, in record's order) feeds already holds what other nodes delivered,
// takes that gradient out and returns it; the function must then return, for that input, its own gradient plus
// the one taken, which the engine puts in the emptied slot instead of summing the two into a fresh tensor (one
// pass over the gradient fewer). Returns an undefined tensor when nothing was delivered yet, outside a pass, or for
// an input with no gradient edge. Sums of two gradients commute bit for bit, so the fused sum has the engine's bits
// whichever of the two came first.
//
//   Tensor other = autograd::take_pending_gradient(0);
//   Tensor dx = other.defined() ? ops::add_layernorm_backward(g, other, x, ...).dx : ops::layernorm_backward(...).dx;
Tensor take_pending_gradient(size_t input);

// Runs `fn` once the outermost backward pass in progress on this thread has finished: DDP waits for its gradient
// buckets there. Called outside a backward pass it is an error.
void queue_callback(std::function<void()> fn);

}  // namespace minidl::autograd
