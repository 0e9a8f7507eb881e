#include "dist/context_parallel.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/trace.h"
#include "nn/llama.h"
#include "ops/attention_blocks.h"
#include "ops/cast.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/kernels/dropout.h"

namespace minidl::dist {

namespace {

std::atomic<int64_t> forward_kv_sends{0}, backward_kv_sends{0}, backward_grad_sends{0}, sent_bytes{0};

// Message tags on the context-parallel group: one per stream of messages, so a block never meets another's receive.
constexpr int kForwardKvTag = 0, kBackwardKvTag = 1, kBackwardGradTag = 2;

// One step of the ring: `mine` goes to rank r+1 while rank r-1's arrives in `next` (both posted now, waited by the
// returned function), so the caller computes on `mine` meanwhile. The send is posted first: under
// --check-collectives a receive first waits for its sender's fingerprint, which every rank posting its receive
// first would never send.
void wait_ring(Work& w) {
  const trace::Span span("ring wait");  // what the blocks' attention did not hide
  w.wait();
}
struct Exchange {
  std::shared_ptr<Work> send, recv;
  void wait() const {
    wait_ring(*recv);
    wait_ring(*send);
  }
};
Exchange exchange(ProcessGroup& g, const Tensor& mine, Tensor& next, int tag, std::atomic<int64_t>& counter) {
  const int n = g.size(), r = g.rank();
  Exchange e;
  e.send = g.send(mine, (r + 1) % n, tag);
  e.recv = g.recv(next, (r - 1 + n) % n, tag);
  counter.fetch_add(1);
  sent_bytes.fetch_add(int64_t(mine.nbytes()));
  return e;
}

// The pieces of one rank's attention: its queries per chunk, and a K/V block (2, B, T/n, Hkv D) cut into chunks.
struct Dims {
  int64_t B, Tl, Tc, H, Hkv, D;
};

Tensor chunk_of(const Tensor& t, int64_t c, const Dims& d) { return t.narrow(1, c * d.Tc, d.Tc).contiguous(); }
// K (i = 0) or V (i = 1) of a block (2, B, T/n, Hkv D), as (B, T/n, Hkv D): a view.
Tensor half_of(const Tensor& block, int64_t i) {
  return block.narrow(0, i, 1).view({block.size(1), block.size(2), block.size(3)});
}
// The query chunks side by side again: (B, T/n, W).
Tensor joined(const std::vector<Tensor>& chunks) {
  if (chunks.size() == 1) return chunks[0];
  const int64_t Tc = chunks[0].size(1);
  Tensor out = Tensor::empty({chunks[0].size(0), Tc * int64_t(chunks.size()), chunks[0].size(2)}, chunks[0].dtype(),
                             chunks[0].device());
  for (size_t i = 0; i < chunks.size(); ++i) out.narrow(1, int64_t(i) * Tc, Tc).copy_(chunks[i]);
  return out;
}

// Which (query chunk, key chunk) pairs of global chunk ids attend, and how: causal skips later keys and masks the
// diagonal.
enum class Pair { kSkip, kDiagonal, kFull };
Pair pair_kind(int64_t query_chunk, int64_t key_chunk, bool causal) {
  if (!causal) return Pair::kFull;
  if (key_chunk > query_chunk) return Pair::kSkip;
  return key_chunk == query_chunk ? Pair::kDiagonal : Pair::kFull;
}

}  // namespace

ContextParallelTraffic context_parallel_traffic() {
  return {forward_kv_sends.load(), backward_kv_sends.load(), backward_grad_sends.load(), sent_bytes.load()};
}
void reset_context_parallel_traffic() {
  forward_kv_sends = 0;
  backward_kv_sends = 0;
  backward_grad_sends = 0;
  sent_bytes = 0;
}

ContextParallel::ContextParallel(ProcessGroup& group, int64_t T, CpSplit split) : group_(group), T_(T), split_(split) {
  const int n = group.size();
  const int64_t parts = split == CpSplit::kHeadTail ? 2 * int64_t(n) : n;
  MINIDL_CHECK(T >= parts && T % parts == 0, "context parallelism: the sequence length ", T, " must be a multiple of ",
               split == CpSplit::kHeadTail ? "2 x --cp = " : "--cp = ", parts,
               split == CpSplit::kHeadTail ? " (head-tail balancing cuts it into 2 x cp chunks)" : "");
}

int64_t ContextParallel::chunk() const { return split_ == CpSplit::kHeadTail ? T_ / (2 * size()) : T_ / size(); }

std::vector<int64_t> ContextParallel::chunks_of(int rank) const {
  if (split_ == CpSplit::kContiguous) return {rank};
  return {rank, 2 * int64_t(size()) - 1 - rank};
}

std::vector<nn::PositionRun> ContextParallel::runs() const {
  std::vector<nn::PositionRun> out;
  const int64_t c = chunk();
  int64_t local = 0;
  for (int64_t id : chunks_of(group_.rank())) {
    out.push_back({local, id * c, c});
    local += c;
  }
  return out;
}

int64_t ContextParallel::dot_products(int rank, bool causal) const {
  const int64_t c = chunk();
  const int64_t chunks = split_ == CpSplit::kHeadTail ? 2 * int64_t(size()) : size();
  int64_t dots = 0;
  for (int64_t query : chunks_of(rank))
    for (int64_t key = 0; key < chunks; ++key) {
      const Pair p = pair_kind(query, key, causal);
      dots += p == Pair::kFull ? c * c : p == Pair::kDiagonal ? c * (c + 1) / 2 : 0;
    }
  return dots;
}

Tensor ContextParallel::split(const Tensor& x) const {
  MINIDL_CHECK(x.dim() >= 2 && x.size(1) == T_, "context parallelism: expected (B, T = ", T_, ", ...), got ",
               x.shape());
  if (size() == 1) return x;
  autograd::NoGradGuard raw;
  Shape shape = x.shape();
  shape[1] = local();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  for (const nn::PositionRun& r : runs()) {
    Tensor dst = out.narrow(1, r.local, r.length);
    dst.copy_(x.narrow(1, r.global, r.length));
  }
  return out;
}

Tensor ContextParallel::gather(const Tensor& x) const {
  MINIDL_CHECK(x.dim() >= 2 && x.size(1) == local(), "context parallelism: expected (B, T / cp = ", local(),
               ", ...), got ", x.shape());
  if (size() == 1) return x;
  autograd::NoGradGuard raw;
  // Each rank's positions side by side (rank-major), then every run put back where it belongs.
  Shape shape = x.shape();
  std::vector<int64_t> dims{int64_t(size())};
  dims.insert(dims.end(), shape.begin(), shape.end());
  const Shape ranks_shape(dims);
  Tensor all = Tensor::empty(ranks_shape, x.dtype(), x.device());
  group_.all_gather(all, x.contiguous())->wait();
  shape[1] = T_;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const int64_t c = chunk();
  for (int r = 0; r < size(); ++r) {
    int64_t local_at = 0;
    for (int64_t id : chunks_of(r)) {
      Tensor dst = out.narrow(1, id * c, c);
      dst.copy_(all.narrow(0, r, 1).reshape(x.shape()).narrow(1, local_at, c));
      local_at += c;
    }
  }
  return out;
}

Tensor ContextParallel::attention(const Tensor& qkv_in, int H, int Hkv, bool causal) const {
  const Tensor x = autograd::autocast_to_half(qkv_in).contiguous();
  MINIDL_CHECK(
      x.dim() == 3 && x.size(1) == local() && H >= 1 && Hkv >= 1 && H % Hkv == 0 && x.size(2) % (H + 2 * Hkv) == 0,
      "context parallelism: expected qkv of shape (B, T / cp = ", local(), ", (H + 2 Hkv) D) with H = ", H,
      ", Hkv = ", Hkv, ", got ", x.shape());
  const int64_t D = x.size(2) / (H + 2 * Hkv);
  const Dims d{x.size(0), local(), chunk(), H, Hkv, D};
  const DType work = x.dtype() == DType::f64 ? DType::f64 : DType::f32;  // blocks merge in f32 or wider
  const Device dev = x.device();
  ProcessGroup* group = &group_;
  const int n = group->size(), me = group->rank();
  const std::vector<int64_t> my_chunks = chunks_of(me);
  const int64_t per = int64_t(my_chunks.size());

  // q of each chunk and K|V as one buffer (2, B, T/n, Hkv D), in the working precision. Built in forward and
  // again in backward from qkv, which backward keeps instead (the same bytes as q, k and v).
  struct Pieces {
    std::vector<Tensor> q_chunks;
    Tensor kv;
  };
  auto pieces = [=](const Tensor& qkv) {
    const Tensor xw = qkv.dtype() == work ? qkv : ops::cast(qkv, work);
    Pieces p{{}, Tensor::empty({2, d.B, d.Tl, Hkv * D}, work, dev)};
    for (int64_t a = 0; a < per; ++a) p.q_chunks.push_back(chunk_of(xw.narrow(2, 0, H * D), a, d));
    half_of(p.kv, 0).copy_(xw.narrow(2, H * D, Hkv * D));
    half_of(p.kv, 1).copy_(xw.narrow(2, (H + Hkv) * D, Hkv * D));
    return p;
  };
  const Pieces mine = pieces(x);
  const std::vector<Tensor>& q_chunks = mine.q_chunks;
  const Tensor& kv = mine.kv;
  auto k_chunk = [d](const Tensor& block, int64_t b) { return chunk_of(half_of(block, 0), b, d); };
  auto v_chunk = [d](const Tensor& block, int64_t b) { return chunk_of(half_of(block, 1), b, d); };

  // Forward: the running output and lse of each query chunk, every block of the ring merged in.
  std::vector<Tensor> out(static_cast<size_t>(per)), lse(static_cast<size_t>(per));
  for (int64_t a = 0; a < per; ++a) {
    out[size_t(a)] = Tensor::zeros({d.B, d.Tc, H * D}, work, dev);
    lse[size_t(a)] = Tensor::full({d.B, H, d.Tc}, -std::numeric_limits<double>::infinity(), work, dev);
  }
  {
    autograd::NoGradGuard raw;
    Tensor cur = kv, next;
    const Tensor arriving[2] = {Tensor::empty(kv.shape(), work, dev), Tensor::empty(kv.shape(), work, dev)};
    for (int s = 0; s < n; ++s) {
      const int owner = (me - s + n) % n;
      std::optional<Exchange> ex;
      next = arriving[s % 2];  // never kv itself, which backward reads again
      if (s + 1 < n) ex = exchange(*group, cur, next, kForwardKvTag, forward_kv_sends);
      const std::vector<int64_t> their = chunks_of(owner);
      for (int64_t a = 0; a < per; ++a)
        for (int64_t b = 0; b < per; ++b) {
          const Pair p = pair_kind(my_chunks[size_t(a)], their[size_t(b)], causal);
          if (p == Pair::kSkip) continue;
          ops::AttentionForward f = ops::attention_block_forward(q_chunks[size_t(a)], k_chunk(cur, b), v_chunk(cur, b),
                                                                 H, Hkv, p == Pair::kDiagonal);
          ops::merge_attention_blocks(out[size_t(a)], lse[size_t(a)], f.out, f.lse);
        }
      if (ex) {
        ex->wait();
        cur = next;
      }
    }
  }
  Tensor merged = joined(out);
  Tensor y = merged.dtype() == x.dtype() ? merged : ops::cast(merged, x.dtype());

  // Backward keeps q, K|V, the merged output (once: the output itself when no cast made another) and lse, as many
  // bytes as the fused attention keeps of the whole qkv and its output.
  const ContextParallel* self = this;
  const Tensor kept = merged.detach(), qkv_kept = x.detach();
  return autograd::record("RingAttention", {x}, y, [=, lse = lse](const Tensor& gy) {
    const Pieces again = pieces(qkv_kept);
    const std::vector<Tensor>& q_chunks = again.q_chunks;
    const Tensor& kv = again.kv;
    Tensor dy = gy.contiguous();
    if (dy.dtype() != work) dy = ops::cast(dy, work);
    std::vector<Tensor> dy_chunks, out, dq(static_cast<size_t>(per));
    for (int64_t a = 0; a < per; ++a) {
      dy_chunks.push_back(chunk_of(dy, a, d));
      out.push_back(chunk_of(kept, a, d));
      dq[size_t(a)] = Tensor::zeros({d.B, d.Tc, H * D}, work, dev);
    }
    // The keys and values go round again; the gradient of the block a rank holds travels with it. At step s this
    // rank computes its queries' share of the held block's gradient while the sum of the earlier holders' shares
    // arrives from r-1; share plus arrival goes on to r+1 as the next step begins, waited for after that step's
    // attention. Each step posts, in this order on every rank: the gradient's send and receive, then the keys'
    // (NCCL's untagged messages match in posting order, and its batched groups pair step by step: nccl_transport.h).
    // After step n-1 one more hop brings each block's gradient home.
    Tensor cur = kv, next;
    const Tensor arriving[2] = {Tensor::empty(kv.shape(), work, dev), Tensor::empty(kv.shape(), work, dev)};
    Tensor incoming = Tensor::empty(kv.shape(), work, dev), sending[2], grad;
    std::shared_ptr<Work> grad_in, grad_out;
    const int right = (me + 1) % n, left = (me - 1 + n) % n;
    auto pass_grad = [&](const Tensor& g, Tensor& into) {  // g on to r+1, r-1's into `into`
      grad_out = group->send(g, right, kBackwardGradTag);
      grad_in = group->recv(into, left, kBackwardGradTag);
      backward_grad_sends.fetch_add(1);
      sent_bytes.fetch_add(int64_t(g.nbytes()));
    };
    for (int s = 0; s < n; ++s) {
      const int owner = (me - s + n) % n;
      if (s > 0) pass_grad(sending[(s - 1) % 2], incoming);
      std::optional<Exchange> ex;
      next = arriving[s % 2];
      if (s + 1 < n) ex = exchange(*group, cur, next, kBackwardKvTag, backward_kv_sends);
      const std::vector<int64_t> their = self->chunks_of(owner);
      const Tensor& held = cur;  // rank `owner`'s keys and values, arrived (never this rank's own at every step)
      Tensor share = Tensor::zeros(kv.shape(), work, dev);
      for (int64_t a = 0; a < per; ++a)
        for (int64_t b = 0; b < per; ++b) {
          const Pair p = pair_kind(my_chunks[size_t(a)], their[size_t(b)], causal);
          if (p == Pair::kSkip) continue;
          ops::AttentionBlockGrads bg = ops::attention_block_backward(
              dy_chunks[size_t(a)], q_chunks[size_t(a)], k_chunk(held, b), v_chunk(held, b), out[size_t(a)],
              lse[size_t(a)], H, Hkv, p == Pair::kDiagonal);
          dq[size_t(a)] = ops::add(dq[size_t(a)], bg.dq);
          Tensor dk = half_of(share, 0).narrow(1, b * d.Tc, d.Tc);
          Tensor dv = half_of(share, 1).narrow(1, b * d.Tc, d.Tc);
          dk.copy_(ops::add(dk.contiguous(), bg.dk));
          dv.copy_(ops::add(dv.contiguous(), bg.dv));
        }
      if (s > 0) {  // the previous step's hop (its buffer is the other of sending[]) and what it brought
        wait_ring(*grad_out);
        wait_ring(*grad_in);
      }
      sending[s % 2] = s > 0 ? ops::add(incoming, share) : share;
      if (ex) {
        ex->wait();
        cur = next;
      }
    }
    grad = sending[(n - 1) % 2];
    if (n > 1) {  // the last hop: every block's gradient home
      Tensor home = Tensor::empty(kv.shape(), work, dev);
      pass_grad(grad, home);
      wait_ring(*grad_out);
      wait_ring(*grad_in);
      grad = home;
    }
    // dqkv = [dq | dk | dv] in qkv's layout and dtype.
    Tensor dqkv = Tensor::empty({d.B, d.Tl, (H + 2 * Hkv) * D}, work, dev);
    dqkv.narrow(2, 0, H * D).copy_(joined(dq));
    dqkv.narrow(2, H * D, Hkv * D).copy_(half_of(grad, 0));
    dqkv.narrow(2, (H + Hkv) * D, Hkv * D).copy_(half_of(grad, 1));
    return std::vector<Tensor>{dqkv.dtype() == x.dtype() ? dqkv : ops::cast(dqkv, x.dtype())};
  });
}

namespace {

class RingAttentionStyle final : public nn::AttentionStyle {
 public:
  explicit RingAttentionStyle(const ContextParallel& cp) : cp_(cp) {}
  Tensor attend(const Tensor& qkv, int n_head, int n_kv_head) const override {
    return cp_.attention(qkv, n_head, n_kv_head, true);
  }
  std::vector<nn::PositionRun> runs(int64_t T) const override {
    MINIDL_CHECK(T == cp_.local(), "context parallelism: the model got ", T, " positions, the split gives ",
                 cp_.local(), " (sequence ", cp_.sequence(), " over cp ", cp_.size(), ")");
    return cp_.runs();
  }

 private:
  const ContextParallel& cp_;
};

// ids [0, T / n) -> the rows of this rank's global positions.
class ContextParallelPositions final : public nn::EmbeddingStyle {
 public:
  explicit ContextParallelPositions(const ContextParallel& cp) : cp_(cp) {}
  Tensor forward(const nn::Embedding& e, const Tensor& ids) const override {
    MINIDL_CHECK(ids.dim() == 1 && ids.size(0) == cp_.local(), "context parallelism: expected ", cp_.local(),
                 " position ids, got ", ids.shape());
    Tensor global = Tensor::empty({cp_.local()}, DType::i64);
    int64_t* p = global.data<int64_t>();
    for (const nn::PositionRun& r : cp_.runs())
      for (int64_t i = 0; i < r.length; ++i) p[r.local + i] = r.global + i;
    return embedding(e.weight, global.to(ids.device()));
  }

 private:
  const ContextParallel& cp_;
};

// The masks one process draws for this rank's positions: per sample and run, the run starts at Philox element
// ((first_sample + b) T + global) C of the step.
class ContextParallelDropout final : public nn::DropoutStyle {
 public:
  explicit ContextParallelDropout(const ContextParallel& cp) : cp_(cp) {}
  Tensor forward(const nn::Dropout& dropout, const Tensor& x) const override {
    if (!dropout.is_training() || dropout.p() == 0.0) return x;
    MINIDL_CHECK(x.dim() == 3 && x.size(1) == cp_.local(),
                 "context parallel dropout: expected (B, T / cp = ", cp_.local(), ", C), got ", x.shape());
    const nn::DropoutContext& ctx = dropout.context();
    const int64_t B = x.size(0), C = x.size(2), T = cp_.sequence();
    struct Piece {
      int64_t b, local, length;
      uint64_t offset;
    };
    std::vector<Piece> pieces;
    for (int64_t b = 0; b < B; ++b)
      for (const nn::PositionRun& r : cp_.runs()) {
        const int64_t first_element = ((ctx.first_sample + b) * T + r.global) * C;
        constexpr int64_t kPer = ops::kernels::kDropoutPerDraw;
        MINIDL_CHECK(first_element % kPer == 0, "context parallel dropout: a chunk begins at element ", first_element,
                     ", not a multiple of ", kPer, "; use a model whose n_embd is a multiple of ", kPer);
        pieces.push_back(
            {b, r.local, r.length, ctx.step * nn::DropoutContext::kOffsetsPerStep + uint64_t(first_element / kPer)});
      }
    const double p = dropout.p();
    const uint64_t seed = ctx.seed, stream = dropout.stream();
    auto apply = [=](const Tensor& in) {  // linear in its input: backward masks the gradient the same way
      Tensor src = in.contiguous(), out = Tensor::empty(in.shape(), in.dtype(), in.device());
      for (const Piece& piece : pieces) {
        Tensor dst = out.narrow(0, piece.b, 1).narrow(1, piece.local, piece.length);
        dst.copy_(ops::dropout(src.narrow(0, piece.b, 1).narrow(1, piece.local, piece.length).contiguous(), p, seed,
                               stream, piece.offset));
      }
      return out;
    };
    Tensor y;
    {
      autograd::NoGradGuard raw;
      y = apply(x);
    }
    return autograd::record("ContextParallelDropout", {x}, y,
                            [apply](const Tensor& gy) { return std::vector<Tensor>{apply(gy)}; });
  }

 private:
  const ContextParallel& cp_;
};

void visit(nn::Module& m, const std::function<void(nn::Module&)>& f) {
  f(m);
  for (const auto& [name, child] : m.children()) visit(*child, f);
}

}  // namespace

void apply_context_parallel(nn::GPT& model, const ContextParallel& cp) {
  if (cp.size() == 1) return;
  MINIDL_CHECK(cp.sequence() <= model.config().block_size, "context parallelism: the sequence ", cp.sequence(),
               " is longer than the model's block_size ", model.config().block_size);
  auto attention = std::make_shared<RingAttentionStyle>(cp);
  auto dropout = std::make_shared<ContextParallelDropout>(cp);
  visit(model, [&](nn::Module& m) {
    if (auto* a = dynamic_cast<nn::CausalSelfAttention*>(&m)) a->style = attention;
    if (auto* a = dynamic_cast<nn::LlamaAttention*>(&m)) a->style = attention;
    if (auto* dr = dynamic_cast<nn::Dropout*>(&m)) {
      MINIDL_CHECK(!dr->style,
                   "context parallelism: a dropout already has a style (sequence parallelism?); "
                   "--cp does not combine with --sequence-parallel");
      dr->style = dropout;
    }
  });
  if (model.wpe) model.wpe->style = std::make_shared<ContextParallelPositions>(cp);
}

}  // namespace minidl::dist
