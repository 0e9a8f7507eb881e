#include "dist/tp_plan.h"

#include <sstream>

#include "autograd/node.h"
#include "core/memory.h"
#include "dist/tensor_parallel.h"
#include "nn/param_layout.h"

namespace minidl::dist {

TensorParallelPlan gpt2_plan(bool sequence_parallel) {
  using S = ParallelStyle;
  const bool sp = sequence_parallel;
  TensorParallelPlan plan{{"transformer.wte", {S::kVocab, sp}},
                          {"transformer.h.*.attn.c_attn", {S::kColwise, sp, 3}},
                          {"transformer.h.*.attn.c_proj", {S::kRowwise, sp}},
                          {"transformer.h.*.mlp.c_fc", {S::kColwise, sp}},
                          {"transformer.h.*.mlp.c_proj", {S::kRowwise, sp}}};
  if (sp)
    for (const char* path :
         {"transformer.wpe", "transformer.drop", "transformer.h.*.ln_1", "transformer.h.*.attn.resid_dropout",
          "transformer.h.*.ln_2", "transformer.h.*.mlp.dropout", "transformer.ln_f"})
      plan.push_back({path, {S::kSequence}});
  return plan;
}

TensorParallelPlan llama_plan(bool sequence_parallel, bool tied) {
  using S = ParallelStyle;
  const bool sp = sequence_parallel;
  TensorParallelPlan plan{{"transformer.wte", {S::kVocab, sp}},
                          {"transformer.h.*.attn.q_proj", {S::kColwise, sp}},
                          {"transformer.h.*.attn.k_proj", {S::kColwise, sp}},
                          {"transformer.h.*.attn.v_proj", {S::kColwise, sp}},
                          {"transformer.h.*.attn.c_proj", {S::kRowwise, sp}},
                          {"transformer.h.*.mlp.gate_proj", {S::kColwise, sp}},
                          {"transformer.h.*.mlp.up_proj", {S::kColwise, sp}},
                          {"transformer.h.*.mlp.c_proj", {S::kRowwise, sp}}};
  if (!tied) plan.push_back({"lm_head", {S::kVocab, sp}});
  if (sp)
    for (const char* path : {"transformer.drop", "transformer.h.*.ln_1", "transformer.h.*.attn.resid_dropout",
                             "transformer.h.*.ln_2", "transformer.h.*.mlp.dropout", "transformer.ln_f"})
      plan.push_back({path, {S::kSequence}});
  return plan;
}

TensorParallelPlan plan_for(const nn::GPTConfig& cfg, bool sequence_parallel) {
  return cfg.llama() ? llama_plan(sequence_parallel, cfg.tie_embeddings) : gpt2_plan(sequence_parallel);
}

namespace {

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream in(path);
  for (std::string part; std::getline(in, part, '.');) out.push_back(part);
  return out;
}

// The modules under `m` whose path from it matches `parts` from `at` on.
void collect(nn::Module& m, const std::vector<std::string>& parts, size_t at, std::vector<nn::Module*>& out) {
  if (at == parts.size()) {
    out.push_back(&m);
    return;
  }
  for (const auto& [name, child] : m.children())
    if (parts[at] == "*" || parts[at] == name) collect(*child, parts, at + 1, out);
}

// The plan row's module as the kind its style works on.
template <class M>
M& as(nn::Module& m, const PlanRow& row, const char* kind) {
  M* typed = dynamic_cast<M*>(&m);
  MINIDL_CHECK(typed != nullptr, "tensor parallel plan: ", row.path, " is not ", kind);
  return *typed;
}

// p becomes this rank's part of it under `layout` (the one-process values it holds now, sliced).
void place(Tensor& p, const nn::ParamLayout& layout) {
  if (layout.is_split()) p.set_data(layout.slice(p.detach()));
  nn::set_layout(p, layout);
}

void apply(nn::Module& m, const PlanRow& row, ProcessGroup& group) {
  const int n = group.size(), r = group.rank();
  const ParallelStyle& s = row.style;
  switch (s.kind) {
    case ParallelStyle::kColwise: {
      auto& l = as<nn::Linear>(m, row, "a Linear");
      const int64_t out = l.weight.size(1);
      MINIDL_CHECK(out % (s.parts * n) == 0, "tensor parallelism: ", row.path, "'s ", out,
                   " outputs do not split into ", s.parts, " part(s) x ", n, " ranks");
      place(l.weight, {l.weight.shape(), 1, s.parts, n, r, &group});
      if (l.bias.defined()) place(l.bias, {l.bias.shape(), 0, s.parts, n, r, &group});
      l.style = std::make_shared<ColumnParallel>(group, s.sequence);
      return;
    }
    case ParallelStyle::kRowwise: {
      auto& l = as<nn::Linear>(m, row, "a Linear");
      MINIDL_CHECK(l.weight.size(0) % n == 0, "tensor parallelism: ", row.path, "'s ", l.weight.size(0),
                   " inputs do not split over ", n, " ranks");
      place(l.weight, {l.weight.shape(), 0, 1, n, r, &group});
      if (l.bias.defined()) place(l.bias, {l.bias.shape(), -1, 1, n, r, &group, s.sequence});  // added once
      l.style = std::make_shared<RowParallel>(group, s.sequence);
      return;
    }
    case ParallelStyle::kVocab: {
      auto& e = as<nn::Embedding>(m, row, "an Embedding");
      const int64_t vocab = e.weight.size(0);
      place(e.weight, {e.weight.shape(), 0, 1, n, r, &group});
      e.style = std::make_shared<VocabParallel>(group, vocab, s.sequence);
      return;
    }
    case ParallelStyle::kSequence: {
      if (auto* ln = dynamic_cast<nn::LayerNorm*>(&m)) {
        for (Tensor* p : {&ln->weight, &ln->bias})
          if (p->defined()) place(*p, {p->shape(), -1, 1, n, r, &group, true});
      } else if (auto* rms = dynamic_cast<nn::RMSNorm*>(&m)) {
        place(rms->weight, {rms->weight.shape(), -1, 1, n, r, &group, true});
      } else if (auto* e = dynamic_cast<nn::Embedding*>(&m)) {
        place(e->weight, {e->weight.shape(), -1, 1, n, r, &group, true});
        e->style = std::make_shared<SequenceShardedPositions>(group);
      } else {
        as<nn::Dropout>(m, row, "a LayerNorm, an RMSNorm, an Embedding or a Dropout").style =
            std::make_shared<SequenceParallelDropout>(group);
      }
      return;
    }
  }
}

}  // namespace

void apply_tensor_parallel(nn::GPT& model, ProcessGroup& group, const TensorParallelPlan& plan) {
  if (group.size() == 1) return;
  const nn::GPTConfig& cfg = model.config();
  MINIDL_CHECK(cfg.n_head % group.size() == 0, "tensor parallelism: --tp ", group.size(), " must divide --heads ",
               cfg.n_head, " (attention is split by heads)");
  MINIDL_CHECK(cfg.kv_heads() % group.size() == 0, "tensor parallelism: num_key_value_heads ", cfg.kv_heads(),
               " is not divisible by --tp ", group.size(), " (each rank holds whole key/value heads)");
  autograd::NoGradGuard no_grad;
  MemoryTagGuard tag(MemTag::kParams);
  const nn::GPTStage& part = model.stage();
  const bool whole = part.embedding && part.head && part.first_block == 0 && part.last_block == cfg.n_layer;
  for (const PlanRow& row : plan) {
    std::vector<nn::Module*> matched;
    collect(model, components(row.path), 0, matched);
    MINIDL_CHECK(!matched.empty() || !whole, "tensor parallel plan: no module of the model is ", row.path);
    for (nn::Module* m : matched) apply(*m, row, group);
  }
  for (auto& [name, p] : model.named_parameters())  // every other parameter: the same on every rank of the group
    if (!nn::layout_of(p).group) place(p, {p.shape(), -1, 1, group.size(), group.rank(), &group});
}

}  // namespace minidl::dist
