// Ring attention in its shortest correct form: what dist/context_parallel.h computes, without overlap, autograd or
// the model's seam. Each of n ranks holds T/n positions of the sequence; attention needs every earlier position's
// keys and values, so they travel round a ring while each rank keeps its queries.
//
//   auto [out, lse] = naive::ring_attention_forward(qkv, H, Hkv, group);     // qkv of this rank's T/n positions
//   Tensor dqkv = naive::ring_attention_backward(dout, qkv, out, lse, H, Hkv, group);
//
// The split (head-tail): cut the sequence into 2n chunks of c = T/2n; rank r holds chunks r and 2n-1-r, in that
// order. Causal attention of query chunk i against key chunk j is a full block for j < i, the masked diagonal for
// j = i, nothing for j > i. Rank r's queries then meet r + (2n-1-r) = 2n-1 full blocks and 2 diagonals: the same
// work on every rank (a contiguous split would give the last rank about twice the average).
//
// Forward. At step s = 0..n-1 rank r holds the keys and values of rank r-s (its own at s = 0) and folds each block
// into a running (out, lse) per query chunk by the log-sum-exp: with lse_b the block's,
//   out -= sigmoid(lse_b - lse) (out - out_b),   lse -= logsigmoid(lse - lse_b)
// (ops::merge_attention_blocks, in f32), which is softmax over the union of the keys seen so far. Then it passes
// the block on to r+1 and takes r-1's: n-1 sends of 2 (T/n) Hkv D values per batch row.
//
// Backward. The gradient of a block's keys and values needs the queries of every rank that attended to them, so
// the keys and values go round again with their gradient beside them: the holder adds its queries' share (each
// block's backward uses the row's merged out and lse, so P = exp(S - lse) is the true probability) and passes
// both on. After n hops the gradient is home. Communication: n-1 K/V sends and n gradient sends.
#pragma once

#include <cmath>
#include <vector>

#include "dist/process_group.h"
#include "ops/attention_blocks.h"
#include "ops/elementwise.h"

namespace minidl::dist::naive {

struct RingAttentionForward {
  std::vector<Tensor> out, lse;  // per query chunk: (B, c, H D) and (B, H, c)
};

namespace detail {

// Everything one rank needs: its q chunks and its K|V block (2, B, T/n, Hkv D), f32.
struct Local {
  int64_t B, c, H, Hkv, D;
  std::vector<int64_t> chunks;  // the global chunk ids this rank holds
  std::vector<Tensor> q;        // per chunk (B, c, H D)
  Tensor kv;
};

inline std::vector<int64_t> chunks_of(int rank, int n) { return {rank, 2 * int64_t(n) - 1 - rank}; }

inline Local local(const Tensor& qkv, int H, int Hkv, const ProcessGroup& g) {
  const int64_t B = qkv.size(0), Tl = qkv.size(1), D = qkv.size(2) / (H + 2 * Hkv);
  Local l{B, Tl / 2, H, Hkv, D, chunks_of(g.rank(), g.size()), {}, Tensor::empty({2, B, Tl, Hkv * D})};
  for (int64_t a = 0; a < 2; ++a) l.q.push_back(qkv.narrow(1, a * l.c, l.c).narrow(2, 0, H * D).contiguous());
  l.kv.narrow(0, 0, 1).view({B, Tl, Hkv * D}).copy_(qkv.narrow(2, H * D, Hkv * D));
  l.kv.narrow(0, 1, 1).view({B, Tl, Hkv * D}).copy_(qkv.narrow(2, (H + Hkv) * D, Hkv * D));
  return l;
}

// Chunk b of K (which = 0) or V (which = 1) of a block.
inline Tensor piece(const Tensor& block, int which, int64_t b, int64_t c) {
  const Tensor half = block.narrow(0, which, 1).view({block.size(1), block.size(2), block.size(3)});
  return half.narrow(1, b * c, c).contiguous();
}

// Sends `mine` to rank r+1 and returns what rank r-1 sent.
inline Tensor pass_on(ProcessGroup& g, const Tensor& mine, int tag) {
  const int n = g.size(), r = g.rank();
  Tensor theirs = Tensor::empty(mine.shape(), mine.dtype());
  auto send = g.send(mine, (r + 1) % n, tag);  // first: a receive waits for its sender (--check-collectives)
  g.recv(theirs, (r - 1 + n) % n, tag)->wait();
  send->wait();
  return theirs;
}

}  // namespace detail

// qkv: (B, T/n, (H + 2 Hkv) D) f32, this rank's positions (chunk r, then chunk 2n-1-r).
inline RingAttentionForward ring_attention_forward(const Tensor& qkv, int H, int Hkv, ProcessGroup& g) {
  const detail::Local l = detail::local(qkv, H, Hkv, g);
  const int n = g.size();
  RingAttentionForward f;
  for (int a = 0; a < 2; ++a) {
    f.out.push_back(Tensor::zeros({l.B, l.c, H * l.D}));
    f.lse.push_back(Tensor::full({l.B, H, l.c}, -INFINITY));  // nothing seen yet
  }
  Tensor block = l.kv;
  for (int s = 0; s < n; ++s) {
    // EXERCISE(ring_attention): at step s you hold rank r-s's block (its chunk ids: detail::chunks_of). For each of
    // your query chunks a and its key chunks b: skip a later key chunk; else attend (ops::attention_block_forward on
    // detail::piece(block, 0 or 1, b, c), causal on the diagonal) and fold the result into f.out[a], f.lse[a]
    // (ops::merge_attention_blocks). Then, but after the last step, pass the block on (detail::pass_on, tag 0).
    const std::vector<int64_t> theirs = detail::chunks_of((g.rank() - s + n) % n, n);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        if (theirs[b] > l.chunks[a]) continue;  // a later key chunk: masked out entirely
        ops::AttentionForward part = ops::attention_block_forward(
            l.q[a], detail::piece(block, 0, b, l.c), detail::piece(block, 1, b, l.c), H, Hkv, theirs[b] == l.chunks[a]);
        ops::merge_attention_blocks(f.out[a], f.lse[a], part.out, part.lse);
      }
    if (s + 1 < n) block = detail::pass_on(g, block, 0);
    // END EXERCISE
  }
  return f;
}

// dout: (B, T/n, H D); f: the forward's result -> dqkv in qkv's layout.
inline Tensor ring_attention_backward(const Tensor& dout, const Tensor& qkv, const RingAttentionForward& f, int H,
                                      int Hkv, ProcessGroup& g) {
  const detail::Local l = detail::local(qkv, H, Hkv, g);
  const int n = g.size();
  std::vector<Tensor> dq{Tensor::zeros({l.B, l.c, H * l.D}), Tensor::zeros({l.B, l.c, H * l.D})};
  Tensor block = l.kv, grad = Tensor::zeros(l.kv.shape());  // the gradient of the block this rank holds
  for (int s = 0; s < n; ++s) {
    // EXERCISE(ring_attention): the forward's pairs again, each through ops::attention_block_backward (with the
    // row's merged f.out[a], f.lse[a]): add its dq into dq[a], its dk and dv into key chunk b of `share` (K in its
    // first half, V in its second); add share to `grad`, what the block's earlier holders added. Then pass grad on
    // (tag 2: after n hops it is home) and, but after the last step, the block (tag 1).
    const std::vector<int64_t> theirs = detail::chunks_of((g.rank() - s + n) % n, n);
    Tensor share = Tensor::zeros(l.kv.shape());  // this rank's queries' part of the held block's gradient
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        if (theirs[b] > l.chunks[a]) continue;
        ops::AttentionBlockGrads part = ops::attention_block_backward(
            dout.narrow(1, a * l.c, l.c).contiguous(), l.q[a], detail::piece(block, 0, b, l.c),
            detail::piece(block, 1, b, l.c), f.out[a], f.lse[a], H, Hkv, theirs[b] == l.chunks[a]);
        dq[a] = ops::add(dq[a], part.dq);
        for (int which = 0; which < 2; ++which) {
          Tensor dst = share.narrow(0, which, 1).view({l.B, 2 * l.c, Hkv * l.D}).narrow(1, b * l.c, l.c);
          dst.copy_(ops::add(dst.contiguous(), which == 0 ? part.dk : part.dv));
        }
      }
    grad = ops::add(grad, share);
    if (n > 1) grad = detail::pass_on(g, grad, 2);  // on to the next holder; after step n-1, home
    if (s + 1 < n) block = detail::pass_on(g, block, 1);
    // END EXERCISE
  }
  const int64_t Tl = 2 * l.c, D = l.D;
  Tensor dqkv = Tensor::empty(qkv.shape());
  for (int a = 0; a < 2; ++a) dqkv.narrow(1, a * l.c, l.c).narrow(2, 0, H * D).copy_(dq[a]);
  dqkv.narrow(2, H * D, Hkv * D).copy_(grad.narrow(0, 0, 1).view({l.B, Tl, Hkv * D}));
  dqkv.narrow(2, (H + Hkv) * D, Hkv * D).copy_(grad.narrow(0, 1, 1).view({l.B, Tl, Hkv * D}));
  return dqkv;
}

}  // namespace minidl::dist::naive
