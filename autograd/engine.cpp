// The backward engine: an iterative (no recursion) traversal that counts each node's dependencies, then runs
// nodes whose gradients are complete, latest-created first, so that parameter gradients become ready in reverse
// order of use — the order DDP's buckets are filled in.
#include <atomic>
#include <queue>
#include <unordered_map>
#include <utility>

#include "autograd/node.h"
#include "ops/elementwise.h"

namespace minidl::autograd {

static std::atomic<uint64_t> g_next_sequence_nr{0};

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(g_next_sequence_nr++) {}

std::vector<Tensor> LambdaNode::apply(std::vector<Tensor>& grads) {
  MINIDL_ASSERT(grads.size() == 1);
  MINIDL_CHECK(fn_, "backward through ", name(), " a second time: its saved tensors were freed by the first");
  // The backward function (and the activations it captured) is released as soon as it has run.
  BackwardFn fn = std::move(fn_);
  fn_ = nullptr;
  std::vector<Tensor> out = fn(grads[0]);
  MINIDL_ASSERT(out.size() == next_edges().size(), name(), " returned ", out.size(), " gradients for ",
                next_edges().size(), " inputs");
  return out;
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>& grads) {
  auto impl = leaf_.lock();
  const bool added = std::exchange(added_in_place_, false);  // leaf.grad() already holds a contribution
  if (!impl || !(grads[0].defined() || added)) return {};
  Tensor leaf(impl);
  Tensor g = grads[0];
  Tensor acc = leaf.grad();
  if (g.defined()) {
    MINIDL_ASSERT(g.shape() == leaf.shape(), "gradient shape ", g.shape(), " for leaf of shape ", leaf.shape());
    if (!acc.defined()) {
      MemoryTagGuard tag(MemTag::kGrads);
      acc = Tensor::empty(leaf.shape(), leaf.dtype(), leaf.device());
      acc.copy_(g);
      leaf.set_grad(acc);
    } else {
      ops::add_(acc, g);
    }
  }
  for (auto& hook : impl->autograd.grad_ready_hooks) hook(acc);
  return {};
}

static thread_local bool t_grad_enabled = true;
bool grad_mode_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  AutogradMeta& meta = t.impl()->autograd;
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  if (!meta.requires_grad) return {};
  std::shared_ptr<Node> acc = meta.accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.accumulator = acc;
  }
  return {acc, 0};
}

namespace {

template <class List>
bool requires_grad_in(const List& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && (t.requires_grad() || t.grad_fn())) return true;
  return false;
}

template <class List>
Tensor record_over(const char* name, const List& inputs, Tensor output, BackwardFn backward) {
  if (!requires_grad_in(inputs)) return output;
  auto node = std::make_shared<LambdaNode>(name, std::move(backward));
  for (const Tensor& t : inputs) node->next_edges().push_back(gradient_edge(t));
  output.impl()->autograd.grad_fn = std::move(node);
  output.impl()->autograd.output_nr = 0;
  return output;
}

}  // namespace

bool any_requires_grad(std::initializer_list<Tensor> inputs) { return requires_grad_in(inputs); }
bool any_requires_grad(const std::vector<Tensor>& inputs) { return requires_grad_in(inputs); }

Tensor record(const char* name, std::initializer_list<Tensor> inputs, Tensor output, BackwardFn backward) {
  return record_over(name, inputs, std::move(output), std::move(backward));
}
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor output, BackwardFn backward) {
  return record_over(name, inputs, std::move(output), std::move(backward));
}

static thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

void queue_callback(std::function<void()> fn) {
  MINIDL_CHECK(t_callbacks, "queue_callback: called outside a backward pass");
  t_callbacks->push_back(std::move(fn));
}

namespace {

// Where grad() collects: for each node of an input, the (gradient slot, result index) pairs to read from it.
using Captures = std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>>;

// The innermost backward pass in progress on this thread: the nodes it captures instead of running (grad()'s
// inputs), for accumulate_in_place; its gradient slots and the node it is running, for take_pending_gradient.
thread_local const Captures* t_pass_captures = nullptr;
using Buffers = std::unordered_map<Node*, std::vector<Tensor>>;
thread_local Buffers* t_pass_buffers = nullptr;
thread_local Node* t_pass_node = nullptr;

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, const Captures& captures,
                  std::vector<Tensor>& captured) {
  struct Pass {
    const Captures* outer = t_pass_captures;
    Buffers* outer_buffers = t_pass_buffers;
    Node* outer_node = t_pass_node;
    ~Pass() {
      t_pass_captures = outer;
      t_pass_buffers = outer_buffers;
      t_pass_node = outer_node;
    }
  } pass;
  t_pass_captures = &captures;
  t_pass_node = nullptr;
  // Callbacks belong to the outermost backward: a backward run inside one (activation checkpointing's
  // recomputation) must not end the outer pass's wait early.
  std::vector<std::function<void()>> callbacks;
  bool outermost = t_callbacks == nullptr;
  if (outermost) t_callbacks = &callbacks;
  struct Restore {
    bool active;
    ~Restore() {
      if (active) t_callbacks = nullptr;
    }
  } restore{outermost};
  MINIDL_CHECK(grad_roots.empty() || roots.size() == grad_roots.size(), "backward: ", roots.size(), " roots but ",
               grad_roots.size(), " root gradients");
  // The roots' edges, taken once and held: a leaf root's AccumulateGrad exists only through these references until
  // the pass ends (the leaf keeps a weak one), so taking the edge again would make a new node.
  std::vector<Edge> root_edges;
  for (const Tensor& r : roots) {
    root_edges.push_back(gradient_edge(r));
    MINIDL_CHECK(root_edges.back().node, "backward: tensor of shape ", r.shape(),
                 " does not require grad and has no grad_fn");
  }
  // Pass 1: count, for every reachable node, how many edges point at it; a root counts once more per time it is
  // given, so a node given twice (backward({l, l})) runs once, after both its gradients arrived.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  for (const Edge& e : root_edges)
    if (dependencies.emplace(e.node.get(), 0).second) stack.push_back(e.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (captures.count(n)) continue;  // grad(): the traversal stops at an input
    for (Edge& e : n->next_edges()) {
      if (!e.node) continue;
      auto [it, inserted] = dependencies.emplace(e.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.node.get());
    }
  }
  for (const Edge& e : root_edges) ++dependencies[e.node.get()];

  // Pass 2: run ready nodes, latest first; gradients for a node's outputs are summed in its input buffer.
  Buffers buffers;
  t_pass_buffers = &buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  auto cmp = [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);

  auto deliver = [&](const Edge& e, const Tensor& g) {
    if (!e.node) return;
    std::vector<Tensor>& buf = buffers[e.node.get()];
    if (buf.empty()) buf.resize(e.node->num_outputs());
    if (g.defined()) {
      Tensor& slot = buf[e.input_nr];
      if (!slot.defined()) {
        slot = g;
      } else {
        // Never mutate a gradient tensor another node may still hold: sum into a fresh one.
        slot = ops::add(slot, g);
      }
    }
    keep_alive.emplace(e.node.get(), e.node);
    if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
  };

  for (size_t i = 0; i < roots.size(); ++i) {
    Tensor g = grad_roots.empty() ? Tensor() : grad_roots[i];
    if (!g.defined()) {
      MINIDL_CHECK(roots[i].numel() == 1, "backward: a root of shape ", roots[i].shape(),
                   " is not a scalar; pass its gradient explicitly");
      g = Tensor::ones(roots[i].shape(), roots[i].dtype(), roots[i].device());
    }
    MINIDL_CHECK(g.shape() == roots[i].shape(), "backward: root gradient shape ", g.shape(),
                 " differs from root shape ", roots[i].shape());
    deliver(root_edges[i], g);
  }

  NoGradGuard no_grad;  // backward itself is not recorded
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    if (auto it = captures.find(n); it != captures.end()) {
      for (auto [slot, index] : it->second) captured[index] = grads[slot];
      keep_alive.erase(n);
      continue;
    }
    t_pass_node = n;
    std::vector<Tensor> in_grads = n->apply(grads);
    t_pass_node = nullptr;
    auto& edges = n->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) deliver(edges[i], i < in_grads.size() ? in_grads[i] : Tensor());
    keep_alive.erase(n);
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {  // a callback may queue another: take it out before running it
    std::function<void()> fn = std::move(callbacks[i]);
    fn();
  }
}

}  // namespace

bool accumulate_in_place(const Tensor& leaf, const std::function<void(Tensor& grad)>& add) {
  if (!t_pass_captures || !leaf.defined() || !leaf.requires_grad() || leaf.grad_fn()) return false;
  std::shared_ptr<Node> node = leaf.impl()->autograd.accumulator.lock();
  if (!node || t_pass_captures->count(node.get())) return false;
  Tensor grad = leaf.grad();
  if (!grad.defined() || !grad.is_contiguous() || grad.shape() != leaf.shape() || grad.dtype() != leaf.dtype() ||
      grad.device() != leaf.device())
    return false;
  add(grad);
  static_cast<AccumulateGrad*>(node.get())->added_in_place();
  return true;
}

Tensor take_pending_gradient(size_t input) {
  if (!t_pass_node || !t_pass_buffers || input >= t_pass_node->next_edges().size()) return {};
  const Edge& e = t_pass_node->next_edges()[input];
  if (!e.node) return {};
  auto it = t_pass_buffers->find(e.node.get());
  if (it == t_pass_buffers->end() || e.input_nr >= it->second.size()) return {};
  return std::exchange(it->second[e.input_nr], Tensor());
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots) {
  std::vector<Tensor> none;
  run_backward(roots, grad_roots, {}, none);
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                         const std::vector<Tensor>& inputs) {
  Captures captures;
  std::vector<std::shared_ptr<Node>> input_nodes;  // gradient_edge may create a leaf's AccumulateGrad: keep it
  for (size_t i = 0; i < inputs.size(); ++i) {
    Edge e = gradient_edge(inputs[i]);
    if (!e.node) continue;
    captures[e.node.get()].push_back({e.input_nr, i});
    input_nodes.push_back(e.node);
  }
  std::vector<Tensor> captured(inputs.size());
  run_backward(roots, grad_roots, captures, captured);
  return captured;
}

}  // namespace minidl::autograd

namespace minidl {
void Tensor::backward(const Tensor& grad) const { autograd::backward({*this}, {grad}); }
}  // namespace minidl
