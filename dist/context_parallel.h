// Context parallelism: the sequence split over a group of ranks, attention as a ring (Liu et al., "Ring Attention
// with Blockwise Transformers", 2023), as torchtitan's and Megatron-LM's CP run it, applied from outside the model.
//
//   dist::ContextParallel cp(group, T, dist::CpSplit::kHeadTail);   // T: the whole sequence
//   data::Batch mine{cp.split(batch.x), cp.split(batch.y)};        // labels shifted (y = x + 1) before the split
//   dist::apply_context_parallel(model, cp);                        // the model's attention, positions and dropouts
//   Tensor loss = model.loss(mine.x, mine.y);                       // the mean over this rank's T / n positions
//
// Every position lives on one rank, so everything but attention (embeddings, norms, MLPs, the loss) runs on this
// rank's positions alone; a query needs the keys and values of every earlier position, which the ring brings.
//
// The split. The sequence is cut into chunks; rank r holds
//   kHeadTail: chunks r and 2n-1-r of 2n (T % 2n == 0), the load balancing of torchtitan and Megatron;
//   kContiguous: chunk r of n (T % n == 0).
// Causal attention of query chunk i against key chunk j is nothing for j > i, the masked diagonal for j = i and
// a full block for j < i. Contiguous, rank r does r full blocks and one diagonal (units of T/n squared): the last
// rank does the most (seq 8, cp 2: 10 and 26 query-key dot products). Head-tail, rank r does (r + 2n-1-r) = 2n-1
// full blocks of (T/2n)^2 and two diagonals: the same on every rank.
//
// The ring. Each rank keeps its queries; its keys and values (one buffer: K then V) travel to rank r+1 while it
// receives rank r-1's, n-1 times. At step s rank r holds the block of rank r-s and merges its chunks' attention
// into a running output by the log-sum-exp (ops/attention_blocks.h, in f32 even when the model runs 16-bit):
//   out -= sigmoid(lse_b - lse) (out - out_b),   lse -= logsigmoid(lse - lse_b).
// The next block's receive and this block's send are posted before this block's attention, so the backend moves
// one block while the CPU computes the other (MPI and NCCL send asynchronously). On a CUDA device the blocks run
// ops/cuda/attention_blocks.cu and the ring NCCL's send/recv, which has no tags: a pair's messages match in the
// order they are posted, the same on every rank (forward K|V; backward K|V, then the gradient, each step).
//
// Backward. Forward keeps this rank's q, k, v, out and lse only; backward sends the keys and values round again
// (n-1 times), with the gradient of each block's keys and values travelling beside them: the holder of block
// r-s computes its queries' share while the earlier holders' sum arrives, adds the two and passes the sum on as
// the next step begins, and after n hops (one more than the keys) the gradient is back with its owner. Both hops,
// the keys' and the gradient's, overlap a step's block attention. Each block's gradient uses the merged out and
// lse of the whole row (the row's true probabilities), so the shares add up to the one-process gradient.
//
// Communication per attention layer and rank, with block bytes b = 2 B (T/n) Hkv D s (K and V, dtype size s):
//   forward: n-1 sends of b;   backward: n-1 sends of b and n sends of b (the gradients, in f32).
// Memory: what a forward keeps for backward is 1/n of one process's (the ring keeps this rank's qkv, its merged
// output and lse, as the fused attention does, and rebuilds its q chunks and K|V buffer in backward). In flight
// it adds two K/V blocks (this step's and the next) and, in backward, two gradient blocks.
//
// Positions: chunk c of the whole sequence starts at c T/2n (head-tail) or c T/n; GPT-2's position table and
// Llama's rotary tables are read there, and each dropout draws the masks one process draws for those positions.
// The loss is each rank's mean over its own T/n positions; with every rank holding as many, the mean of those
// means over the group is the whole sequence's (GradSync averages the gradients over dp and cp together).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/process_group.h"
#include "nn/gpt.h"

namespace minidl::dist {

enum class CpSplit { kHeadTail, kContiguous };

class ContextParallel {
 public:
  // T: the whole sequence's length. Throws naming T and the group's size unless T is a multiple of 2n (head-tail)
  // or n (contiguous).
  ContextParallel(ProcessGroup& group, int64_t T, CpSplit split = CpSplit::kHeadTail);

  ProcessGroup& group() const { return group_; }
  int size() const { return group_.size(); }
  int64_t sequence() const { return T_; }
  int64_t local() const { return T_ / size(); }  // this rank's positions
  int64_t chunk() const;                         // the length of one chunk
  CpSplit split_kind() const { return split_; }
  // The chunks rank `rank` holds, in the order they sit in its local sequence.
  std::vector<int64_t> chunks_of(int rank) const;
  // This rank's positions as runs: local index [local, local + length) is global [global, global + length).
  std::vector<nn::PositionRun> runs() const;

  // The query-key dot products rank `rank`'s attention computes per (batch, head), from the blocks the ring
  // attends (a full block Tc^2, a diagonal one Tc (Tc + 1) / 2): the balance the split gives.
  int64_t dot_products(int rank, bool causal = true) const;

  // x: (B, T, ...) -> (B, T / n, ...), this rank's positions (a copy, no autograd).
  Tensor split(const Tensor& x) const;
  // x: (B, T / n, ...) on every rank -> (B, T, ...), the whole sequence in order (a collective; no autograd).
  Tensor gather(const Tensor& x) const;

  // qkv: (B, T / n, (H + 2 Hkv) D) of this rank's positions -> (B, T / n, H D): their attention over the whole
  // sequence's keys (causal: the earlier positions), as the ring above; differentiable in qkv.
  Tensor attention(const Tensor& qkv, int n_head, int n_kv_head, bool causal = true) const;

 private:
  ProcessGroup& group_;
  int64_t T_;
  CpSplit split_;
};

// What context parallelism sent since the last reset, process-wide: forward K/V blocks, backward K/V blocks and
// backward gradient blocks (sends, and their payload bytes).
struct ContextParallelTraffic {
  int64_t forward_kv_sends = 0, backward_kv_sends = 0, backward_grad_sends = 0, bytes = 0;
};
ContextParallelTraffic context_parallel_traffic();
void reset_context_parallel_traffic();

// Makes `model` (the whole model or a pipeline chunk) compute on cp's positions: every attention through the
// ring, GPT-2's position table and Llama's rotary tables read at the global positions, every dropout drawing the
// one-process masks of those positions. Parameters are untouched (replicated over the group). A group of one
// leaves the model as it is. cp must outlive the model's use. Throws on a model whose block_size is below T.
void apply_context_parallel(nn::GPT& model, const ContextParallel& cp);

}  // namespace minidl::dist
