// Tensor parallelism applied from outside the model: a plan of (module path, style) rows, as torchtitan's apply_tp
// and picotron's apply_tensor_parallel, turns an unmodified nn::GPT (the whole model or a pipeline chunk of it) into
// this rank's part of the split model. Sequence parallelism is one more style of the same plan.
//
//   nn::GPT chunk(cfg, seed, part);                                    // built and initialised as one process does
//   dist::apply_tensor_parallel(chunk, topology.tp_group(), dist::gpt2_plan(sequence_parallel));
//   // chunk now holds its slices; forward, loss, checkpoints and generation work as before
//
// What a row does to the module its path names ('*' matches one path component):
//   colwise   a Linear's weight and bias split by columns (parts: q|k|v), ColumnParallel installed
//   rowwise   a Linear's weight split by rows, its bias replicated, RowParallel installed
//   vocab     an Embedding's table split by rows (the tied head too), VocabParallel installed
//   sequence  the module acts on this rank's positions only: a LayerNorm's parameters and an Embedding's table
//             (wpe) are marked sequence-sliced (their gradients are partial sums: train::GradSync all-reduces them),
//             an Embedding takes this rank's positions, a Dropout draws the one-process masks for them
// The placement of a colwise row's input, and of a rowwise or vocab row's output, is "sequence" under sequence
// parallelism (the activation holds T / tp positions), replicated otherwise.
//
// Initialisation: each split parameter keeps its slice of the one-process values the chunk was built with (element
// i of a slice is element i of the whole tensor, drawn by nn::GPT's one global parameter index), so the split
// model is the one-process model, gathered back bit for bit. Every parameter no row split is replicated over the
// group; every parameter carries its layout (nn/param_layout.h).
//
// Memory: a rank builds the whole chunk before slicing it (the slices are what remains).
#pragma once

#include <string>
#include <vector>

#include "dist/process_group.h"
#include "nn/gpt.h"

namespace minidl::dist {

struct ParallelStyle {
  enum Kind { kColwise, kRowwise, kVocab, kSequence } kind;
  bool sequence = false;  // colwise: the input's placement; rowwise, vocab: the output's
  int64_t parts = 1;      // colwise: the output is this many blocks (q, k, v), each split
};

struct PlanRow {
  std::string path;  // a module's path in the model, '*' for one component: "transformer.h.*.attn.c_attn"
  ParallelStyle style;
};
using TensorParallelPlan = std::vector<PlanRow>;

// GPT-2's plan (nn/gpt.h's module tree): attention by heads and the MLP column then row, the vocabulary split, and
// with sequence_parallel the LayerNorms, wpe and the dropouts on this rank's positions.
TensorParallelPlan gpt2_plan(bool sequence_parallel);
// Llama's (nn/llama.h): q, k and v column-parallel by heads (a rank holds n_head / tp query heads and
// n_kv_head / tp key/value heads, so its query heads' groups stay whole), c_proj row-parallel; gate and up split the
// same way, then c_proj; the vocabulary split, the untied lm_head (tied = false) as the tied head would be; with
// sequence_parallel the RMSNorms and the dropouts on this rank's positions.
TensorParallelPlan llama_plan(bool sequence_parallel, bool tied);
// The plan of cfg's architecture.
TensorParallelPlan plan_for(const nn::GPTConfig& cfg, bool sequence_parallel);

// Splits `model` over `group` as `plan` says, in place, before the model is moved, wrapped (GradSync) or optimised.
// A group of one leaves it as it is. Throws unless the group's size divides n_head and n_kv_head, when a row names a
// module of another kind, or when a row matches nothing in a whole model (a pipeline chunk holds only some of the
// modules).
void apply_tensor_parallel(nn::GPT& model, ProcessGroup& group, const TensorParallelPlan& plan);

}  // namespace minidl::dist
