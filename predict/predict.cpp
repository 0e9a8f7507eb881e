#include "predict/predict.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "dist/local_sgd.h"
#include "dist/parameter_server.h"
#include "predict/collectives.h"
#include "predict/compute.h"
#include "predict/outer.h"
#include "predict/overlap.h"

namespace minidl::predict {

namespace {

// Per micro-batch on one pipeline rank: compute and tensor-parallel communication, forward and backward.
struct RankCost {
  double fc = 0, ft = 0, bc = 0, bt = 0, fx = 0, bx = 0;  // compute, tp's collectives, cp's exposed ring sends
  double fe = 0, be = 0;                                  // ep's all-to-alls
  double f() const { return fc + ft + fx + fe; }
  double b() const { return bc + bt + bx + be; }
};

dist::PipelineSpec pipeline_spec(const Layout& l) { return {l.schedule, l.pp, l.micro_batches, l.virtual_stages}; }

Prediction predict_unchecked(const Workload& w, const Layout& l, const Machine& m, bool with_baseline);

// The rates of a prediction whose time is known: MFU, tokens/s, and efficiency against one GPU (the same global
// batch in micro-batches of b, accumulated).
void finish_rates(Prediction& out, const Workload& w, const Layout& l, const Machine& m, bool with_baseline) {
  const double step = out.time.total();
  const int64_t T = w.model.block_size;
  out.model_flops = model_flops_per_token(w.model, T) * double(w.global_batch) * double(T);
  out.mfu = out.model_flops / (step * l.gpus() * m.peak_flops(l.amp));
  out.tokens_per_s = double(w.global_batch) * double(T) / step;
  out.single_gpu_step = step;
  if (with_baseline && l.gpus() > 1) {
    Layout one;
    one.micro_batches = int(w.global_batch / out.micro_batch);
    one.recompute = l.recompute;
    one.amp = l.amp;
    out.single_gpu_step = predict_unchecked(w, one, m, false).time.total();
  }
  out.efficiency = out.single_gpu_step / (l.gpus() * step);
}

// One synchronous group: dp × cp × tp × pp.
Prediction predict_group(const Workload& w, const Layout& l, const Machine& m) {
  const nn::GPTConfig& model = w.model;
  const int64_t T = model.block_size, b = w.global_batch / (int64_t(l.dp) * l.micro_batches);
  const int64_t Tl = T / l.cp;  // the positions of a sequence one rank holds
  const double C = double(model.n_embd), s = l.amp == DType::f32 ? 4.0 : 2.0;
  // The gradients' group is dp × cp: with cp after tp in the rank order it is the dp axis of this grid.
  const int dpg = l.dp * l.cp;
  const dist::Grid grid{dpg, l.tp, l.pp};
  const int p = l.pp, V = l.virtual_stages, M = l.micro_batches;
  Prediction out;
  out.workload = w;
  out.layout = l;
  out.micro_batch = b;

  // ---- per micro-batch costs of a block, the embedding and the head ----
  const ComputeQuery cq{model, l.tp, l.sequence_parallel, l.amp, b, T, l.recompute, l.cp, false, l.ep};
  const double block_f = ops_seconds(block_forward_ops(cq), m, l.amp);
  const double block_b = ops_seconds(block_backward_ops(cq), m, l.amp);
  const double head_f = ops_seconds(head_forward_ops(cq), m, l.amp);
  const double head_b = ops_seconds(head_backward_ops(cq), m, l.amp);
  const double emb_f = ops_seconds(embedding_forward_ops(cq), m, l.amp);
  const double emb_b = ops_seconds(embedding_backward_ops(cq), m, l.amp);
  // Tensor parallelism: all-reduces of the b·T·C activations, 2 per block forward (Megatron's g after each
  // row-parallel layer) and one per column-parallel layer backward (its f: 2 for GPT-2, 5 for a Llama, whose q, k,
  // v, gate and up are separate layers), recomputation repeating its part's; the embedding's one forward, the head
  // input's one backward, and the vocabulary-parallel loss's three of b·T floats (max, sum of exps, target logit).
  // Sequence parallelism replaces each all-reduce by what dist/sequence_parallel.cpp runs, each collective at the
  // link measured for it (a reduce-scatter can move a byte far slower than an all-reduce) plus its two layout copies
  // ((B, T, C) to the sequence-major (T, B, C) its flat chunks need, and back: the whole activation and one rank's
  // 1/tp of it, each read and written, at the memory-bound ops' speed). Per block forward: an all-gather before each
  // column-parallel layer (GPT-2 2, Llama 5) and 2 reduce-scatters (after the row-parallel ones); backward: the
  // reduce-scatters' conjugate all-gathers, the column-parallel layers' re-gathers of their inputs
  // (sequence_parallel_linear keeps only this rank's positions) and their input gradients' reduce-scatters: GPT-2
  // 4 all-gathers and 2 reduce-scatters, Llama 7 and 5.
  // Recomputation reruns its part's forward ones. The embedding scatters its sums (backward: a gather), the head
  // gathers ln_f's output (backward: a scatter).
  double tp_block_f = 0, tp_block_b = 0, tp_emb_f = 0, tp_emb_b = 0, tp_head_f = 0, tp_head_b = 0;
  if (l.tp > 1) {
    const Link& link = group_link(grid, Axis::kTp, m);
    const double bytes = double(b) * double(Tl) * C * s;
    const double rerun = l.recompute == nn::Recompute::kBlock ? 2 : l.recompute == nn::Recompute::kNone ? 0 : 1;
    const double loss = 3 * all_reduce(l.tp, double(b) * double(Tl) * 4, link);
    // The column-parallel layers of a block, each with its own f (and, under sequence parallelism, its own gather):
    // GPT-2's c_attn and c_fc; a Llama's q, k, v, gate and up.
    const double col = model.llama() ? 5 : 2;
    if (!l.sequence_parallel) {
      const double act = all_reduce(l.tp, bytes, link);
      tp_block_f = 2 * act;
      tp_block_b = (col + rerun) * act;
      tp_emb_f = act;
      tp_head_f = loss;
      tp_head_b = act;
    } else {
      const double copies = 2 * (bytes + bytes / l.tp) / (m.mem_bw * m.eff.elementwise);
      const double gather =
          ring_all_gather(l.tp, bytes, group_link(grid, Axis::kTp, m, Collective::kAllGather)) + copies;
      const double scatter =
          ring_reduce_scatter(l.tp, bytes, group_link(grid, Axis::kTp, m, Collective::kReduceScatter)) + copies;
      tp_block_f = col * gather + 2 * scatter;
      tp_block_b = (2 + col) * gather + col * scatter + rerun / 2 * (col * gather + 2 * scatter);
      tp_emb_f = scatter;
      tp_emb_b = gather;
      tp_head_f = gather + loss;
      tp_head_b = scatter;
    }
  }

  // Context parallelism's ring, per block: cp - 1 K|V blocks forward, each hidden behind one step's block attention
  // (attention / cp) where the machine overlaps; backward the same again plus cp f32 gradient blocks, exposed; a
  // recomputation's forward sends again. The cp group's ranks are tp apart: the dp axis of the grid {cp, tp, 1}.
  double cp_block_f = 0, cp_block_b = 0;
  if (l.cp > 1) {
    const Link& link = group_link(dist::Grid{l.cp, l.tp, 1}, Axis::kDp, m);
    const double kv_width = double(model.kv_heads() * model.head_size()) / l.tp;
    const double kv = point_to_point(2 * double(b) * double(Tl) * kv_width * s, link);
    const double grad = point_to_point(2 * double(b) * double(Tl) * kv_width * 4, link);
    double attn_f = 0, attn_b = 0;
    for (const OpCost& op : block_forward_ops(cq))
      if (op.cls == OpClass::kAttention) attn_f += op_seconds(op, m, l.amp);
    for (const OpCost& op : block_backward_ops(cq))
      if (op.cls == OpClass::kAttention) attn_b += op_seconds(op, m, l.amp);
    const double rerun = l.recompute == nn::Recompute::kNone || l.recompute == nn::Recompute::kMlp ? 0 : 1;
    const double exposed_f = m.cpu ? kv : std::max(0.0, kv - attn_f / l.cp);
    // Backward's attention holds the rerun forward's too (backward_ops adds recomputation): its own share is the
    // rest; each of its cp - 1 steps hides one K|V hop.
    const double own_b = std::max(0.0, attn_b - rerun * attn_f);
    const double exposed_b = m.cpu ? kv : std::max(0.0, kv - own_b / l.cp);
    cp_block_f = (l.cp - 1) * exposed_f;
    cp_block_b = (l.cp - 1) * exposed_b + l.cp * grad + rerun * (l.cp - 1) * exposed_f;
  }

  // ---- a mixture of experts: an MoE block's compute, and its all-to-alls under expert parallelism ----
  // Per MoE block and micro-batch forward: the counts (E f64 values a rank), then the routed rows out and home
  // (dist/expert_parallel.cpp), each of moe_rows · C activations; backward the rows' gradients both ways again, a
  // recomputation (block or mlp) the forward's too. Blocking, on the critical path. The ep group is ep
  // consecutive dp ranks, tp apart: the dp axis of the grid {ep, tp, 1}.
  ComputeQuery mcq = cq;
  mcq.moe_block = true;
  const double moe_f = model.moe() ? ops_seconds(block_forward_ops(mcq), m, l.amp) : block_f;
  const double moe_b = model.moe() ? ops_seconds(block_backward_ops(mcq), m, l.amp) : block_b;
  double ep_f = 0, ep_b = 0;
  if (l.ep > 1) {
    const Link& link = group_link(dist::Grid{l.ep, l.tp, 1}, Axis::kDp, m, Collective::kAllToAll);
    const double rows = all_to_all(l.ep, moe_rows(mcq) * C * s, link);
    ep_f = all_to_all(l.ep, 8 * double(model.moe_experts), link) + 2 * rows;
    const bool rerun = l.recompute == nn::Recompute::kBlock || l.recompute == nn::Recompute::kMlp;
    ep_b = 2 * rows + (rerun ? ep_f : 0);
  }

  // ---- pipeline: blocks per rank as the trainer splits them, the slowest rank's costs into simulate ----
  const train::MemoryQuery mq{model, l.zero, dpg, l.amp, l.recompute, b, Tl, M, l.tp, l.sequence_parallel, l.ep};
  const train::MemoryPlan whole = train::predict_memory(mq);
  const std::vector<int64_t> starts = dist::split_layers(model.n_layer, p * V, int64_t(whole.block),
                                                         int64_t(whole.persistent), int64_t(whole.persistent));
  // Each rank's blocks (chunk c on rank c % p), in order, and how many of them are MoE blocks.
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(p));
  for (int c = 0; c < p * V; ++c)
    for (int64_t i = starts[size_t(c)]; i < starts[size_t(c) + 1]; ++i) held[size_t(c % p)].push_back(i);
  std::vector<int64_t> blocks(size_t(p), 0), moe_blocks(size_t(p), 0);
  for (int r = 0; r < p; ++r) {
    blocks[size_t(r)] = int64_t(held[size_t(r)].size());
    for (int64_t i : held[size_t(r)]) moe_blocks[size_t(r)] += model.moe_layer(i);
  }
  std::vector<RankCost> ranks(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    RankCost& rc = ranks[size_t(r)];
    const double n = double(blocks[size_t(r)]), e = double(moe_blocks[size_t(r)]);
    rc = {(n - e) * block_f + e * moe_f,
          n * tp_block_f,
          (n - e) * block_b + e * moe_b,
          n * tp_block_b,
          n * cp_block_f,
          n * cp_block_b,
          e * ep_f,
          e * ep_b};
    if (r == 0) rc.fc += emb_f, rc.ft += tp_emb_f, rc.bc += emb_b, rc.bt += tp_emb_b;
    if (r == p - 1) rc.fc += head_f, rc.ft += tp_head_f, rc.bc += head_b, rc.bt += tp_head_b;
  }
  const auto slowest = std::max_element(
      ranks.begin(), ranks.end(), [](const RankCost& a, const RankCost& b) { return a.f() + a.b() < b.f() + b.b(); });
  const RankCost slow = *slowest;
  const int slow_rank = int(slowest - ranks.begin());
  // The slowest rank's compute by op class: its blocks, and the embedding or the head if it holds them.
  auto both = [&](const std::vector<OpCost>& forward, const std::vector<OpCost>& backward) {
    ClassSeconds c = class_seconds(forward, m, l.amp);
    c += class_seconds(backward, m, l.amp);
    return c;
  };
  const double slow_moe = double(moe_blocks[size_t(slow_rank)]);
  ClassSeconds by_class =
      both(block_forward_ops(cq), block_backward_ops(cq)) * (double(blocks[size_t(slow_rank)]) - slow_moe);
  if (slow_moe > 0) by_class += both(block_forward_ops(mcq), block_backward_ops(mcq)) * slow_moe;
  if (slow_rank == 0) by_class += both(embedding_forward_ops(cq), embedding_backward_ops(cq));
  if (slow_rank == p - 1) by_class += both(head_forward_ops(cq), head_backward_ops(cq));
  out.compute_by_class = by_class * double(M);
  const PipelineTime pipe = pipeline_time(pipeline_spec(l), slow.f(), slow.b());
  out.forward = slow.f();
  out.backward = slow.b();
  out.bubble_fraction = pipe.bubble_fraction;
  out.time.compute = M * (slow.fc + slow.bc);
  out.time.tp_comm = M * (slow.ft + slow.bt);
  out.time.cp_comm = M * (slow.fx + slow.bx);
  out.time.ep_comm = M * (slow.fe + slow.be);
  out.time.bubble = pipe.bubble;
  if (p > 1) {
    const Link& link = group_link(grid, Axis::kPp, m);
    const double message = double(b) * double(Tl) * C * s / (l.sequence_parallel ? l.tp : 1);
    const double wte = double((model.vocab_size + l.tp - 1) / l.tp) * C * 4;
    out.time.pp_comm = 2 * (p - 1) * point_to_point(message, link) + all_reduce(2, wte, link);
  }

  // ---- data parallelism on the first pipeline rank (all of the model when pp = 1) ----
  // Under expert parallelism an MoE block's experts average over the dp / ep ranks holding them (the expert-dp
  // group: dp ranks ep apart, the dp axis of the grid {dp / ep, ep · tp, 1}), in buckets of their own; the rest
  // over the dp group.
  const double ln_f = model.bias ? 2 * C : C;
  double rank0_blocks = 0, rank0_experts = 0;
  for (int64_t i : held[0]) {
    rank0_blocks += train::block_params(model, i, l.tp, l.ep);
    rank0_experts += l.ep > 1 ? train::expert_params(model, i, l.ep) : 0;
  }
  const double rank0_params = whole.persistent - (p > 1 ? ln_f : 0) + rank0_blocks;
  const int expert_dp = dpg / l.ep;
  if (dpg > 1) {
    const Link& reduce_link =
        group_link(grid, Axis::kDp, m, l.zero == 0 ? Collective::kAllReduce : Collective::kReduceScatter);
    const Link& gather_link = group_link(grid, Axis::kDp, m, Collective::kAllGather);
    const Link& expert_link = group_link(dist::Grid{expert_dp, l.ep * l.tp, 1}, Axis::kDp, m);
    // Units in registration order (embedding, blocks, ln_f), ready as the last micro-batch's backward passes them:
    // the head and ln_f first, the blocks from the last, the embedding (and the tied wte) at the end.
    const RankCost& r0 = ranks[0];
    std::vector<GradUnit> units, expert_units;
    double t = p == 1 ? head_b + tp_head_b : 0;
    const double end = r0.b();
    units.push_back({int64_t(whole.persistent - ln_f), end});
    std::vector<double> ready(held[0].size());
    for (size_t j = held[0].size(); j-- > 0;) {
      const bool moe = model.moe_layer(held[0][j]);
      t += (moe ? moe_b + ep_b : block_b) + tp_block_b;
      ready[j] = t;
    }
    for (size_t j = 0; j < held[0].size(); ++j) {
      const int64_t i = held[0][j];
      const double experts = l.ep > 1 ? train::expert_params(model, i, l.ep) : 0;
      units.push_back({int64_t(train::block_params(model, i, l.tp, l.ep) - experts), ready[j]});
      if (experts > 0) expert_units.push_back({int64_t(experts), ready[j]});
    }
    if (p == 1) units.push_back({int64_t(ln_f), p == 1 ? head_b + tp_head_b : 0});
    std::vector<BucketTiming> timed;
    for (const Bucket& bk : gradient_buckets(units)) {
      const double bytes = 4 * double(bk.numel);
      const double cost =
          l.zero == 0 ? all_reduce(dpg, bytes, reduce_link) : ring_reduce_scatter(dpg, bytes, reduce_link);
      timed.push_back({bk.ready, cost});
    }
    if (expert_dp > 1)
      for (const Bucket& bk : gradient_buckets(expert_units))
        timed.push_back({bk.ready, all_reduce(expert_dp, 4 * double(bk.numel), expert_link)});
    std::stable_sort(timed.begin(), timed.end(),
                     [](const BucketTiming& a, const BucketTiming& b) { return a.ready < b.ready; });
    const OverlapResult o = overlap_buckets(timed, end);
    out.time.dp_comm = o.exposed;
    out.dp_comm_total = o.comm_total;
    out.dp_collective = l.zero == 0 ? "all-reduce" : "reduce-scatter + all-gather";
    if (l.zero == 1 || l.zero == 2) {
      const double gather = ring_all_gather(dpg, 4 * rank0_params, gather_link);
      out.time.dp_comm += gather;
      out.dp_comm_total += gather;
    } else if (l.zero == 3) {
      // Blocks gathered before their forward and their backward (a recomputation finds its block gathered),
      // prefetched while the previous block computes: the first gather waits, the others only where longer.
      const double g = ring_all_gather(dpg, 4 * whole.block, gather_link);
      const double n = double(model.n_layer), bf = block_f + tp_block_f, per_block = block_b + tp_block_b;
      const double exposed = 2 * g + (n - 1) * (std::max(0.0, g - bf) + std::max(0.0, g - per_block));
      const double persistent = ring_all_gather(dpg, 4 * whole.persistent, gather_link);
      out.time.dp_comm += M * exposed + persistent;
      out.dp_comm_total += M * 2 * n * g + persistent;
      out.dp_collective = "reduce-scatter + all-gather (blocks gathered per pass)";
    }
    // The gradient norm's experts: their squares summed over the ep group (one float).
    if (l.ep > 1) {
      const double norm = all_reduce(l.ep, 8, group_link(dist::Grid{l.ep, l.tp, 1}, Axis::kDp, m));
      out.time.dp_comm += norm;
      out.dp_comm_total += norm;
    }
    // On the CPU host a rank's collectives run on its own core: MPI's shared-memory copies and reductions are the
    // core's work, and its progress loop polls there. So nothing hides behind the backward: all of it is exposed.
    if (m.cpu) out.time.dp_comm = out.dp_comm_total;
  }

  // ---- optimizer ----
  const double updated = l.zero >= 1 ? rank0_params / dpg : rank0_params;
  out.time.optimizer = ops_seconds(optimizer_ops(updated, rank0_params, l.amp), m, l.amp);
  // Expert parallelism divides the experts' averaged gradients by ep after backward (8 bytes a parameter).
  if (l.ep > 1) out.time.optimizer += 8 * rank0_experts / (m.mem_bw * m.eff.elementwise);
  // ZeRO-3 runs with pp = 1 only: the first rank's blocks are all of them.
  out.time.zero_copies = ops_seconds(zero_ops(l.zero, rank0_params, rank0_blocks, M, l.amp, m.cpu), m, l.amp);

  // ---- memory: the rank holding the most blocks, its activations times the chunks in flight ----
  nn::GPTConfig worst = model;
  worst.n_layer = *std::max_element(blocks.begin(), blocks.end());
  train::MemoryQuery wq = mq;
  wq.model = worst;
  out.memory = train::predict_memory(wq);
  out.activations_in_flight = pipe.peak_in_flight;
  out.activation_bytes = out.memory.activations * pipe.peak_in_flight / V;
  out.memory_peak = out.memory.peak() - out.memory.activations + out.activation_bytes;
  out.fits = out.memory_peak <= m.mem_capacity;

  out.rank_params = rank0_params;
  return out;
}

// Beyond one group (predict/outer.h): R replicas of the group meeting every H steps, or W workers of a parameter
// server, each predicted as the group it trains in, plus what their meeting costs.
Prediction predict_beyond_group(const Workload& w, const Layout& l, const Machine& m) {
  Layout group = l;
  group.sync = OuterSync::kNone, group.replicas = 1, group.sync_every = 1, group.ps_servers = 0;
  Workload part = w;
  Prediction out;
  if (l.ps_servers > 0) {
    // A worker trains the whole model on its share of the batch; its optimizer step is the push and the pull.
    group.dp = 1;
    part.global_batch = w.global_batch / l.dp;
    out = predict_group(part, group, m);
    const double shard = out.rank_params / l.ps_servers;
    const double adamw = ops_seconds(optimizer_ops(shard, shard, l.amp), m, l.amp);
    const PsExchange x = ps_exchange(out.rank_params, l.dp, l.ps_servers, l.ps_mode == PsMode::kSync, out.time.compute,
                                     adamw, m.intra, m);
    out.time.optimizer = x.optimizer;
    out.time.outer = x.exchange;
    // The worker holds no optimizer state (the servers do, a shard each).
    out.memory_peak -= out.memory.optimizer;
    out.memory.optimizer = 0;
  } else {
    part.global_batch = w.global_batch / l.replicas;
    out = predict_group(part, group, m);
    // The replicas' ranks at one coordinate: one node's link if the whole job fits in a node.
    const Link& link = l.gpus() <= m.gpus_per_node ? m.intra_for(Collective::kAllReduce) : m.inter;
    out.time.outer =
        outer_sync_seconds(out.rank_params, l.replicas, l.sync == OuterSync::kDiLoCo, link, m) / l.sync_every;
  }
  out.fits = out.memory_peak <= m.mem_capacity;
  out.workload = w;
  out.layout = l;
  return out;
}

Prediction predict_unchecked(const Workload& w, const Layout& l, const Machine& m, bool with_baseline) {
  Prediction out =
      l.ps_servers > 0 || l.sync != OuterSync::kNone ? predict_beyond_group(w, l, m) : predict_group(w, l, m);
  finish_rates(out, w, l, m, with_baseline);
  return out;
}

}  // namespace

OuterSync parse_outer_sync(const std::string& name) {
  if (name == "ddp") return OuterSync::kNone;
  return dist::outer_kind(name) == dist::OuterKind::kDiLoCo ? OuterSync::kDiLoCo : OuterSync::kLocalSgd;
}

PsMode parse_ps_mode(const std::string& text) {
  const dist::PsMode mode = dist::ps_options(text).mode;
  return mode == dist::PsMode::kSync ? PsMode::kSync : mode == dist::PsMode::kAsync ? PsMode::kAsync : PsMode::kSsp;
}

std::string describe(const Layout& l) {
  std::ostringstream os;
  os << "dp " << l.dp;
  if (l.cp > 1) os << " cp " << l.cp;
  if (l.ep > 1) os << " ep " << l.ep;
  os << " tp " << l.tp << " pp " << l.pp;
  if (l.virtual_stages > 1) os << " V " << l.virtual_stages;
  os << " M " << l.micro_batches << " zero " << l.zero;
  if (l.recompute != nn::Recompute::kNone) os << " recompute " << nn::recompute_name(l.recompute);
  if (l.sequence_parallel) os << " sp";
  if (l.pp > 1 && l.schedule != dist::ScheduleKind::k1F1B && l.schedule != dist::ScheduleKind::kInterleaved)
    os << " " << dist::schedule_kind_name(l.schedule);
  if (l.sync != OuterSync::kNone)
    os << " " << (l.sync == OuterSync::kDiLoCo ? "diloco" : "local-sgd") << " R " << l.replicas << " H "
       << l.sync_every;
  if (l.ps_servers > 0)
    os << " ps " << l.ps_servers << " "
       << (l.ps_mode == PsMode::kSync    ? "sync"
           : l.ps_mode == PsMode::kAsync ? "async"
                                         : "ssp");
  return os.str();
}

std::string refusal(const Workload& w, const Layout& l) {
  const nn::GPTConfig& m = w.model;
  std::ostringstream why;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.virtual_stages < 1 || l.micro_batches < 1)
    why << "dp, tp, pp, virtual stages and micro-batches must be >= 1";
  else if (m.n_head % l.tp != 0)
    why << "tp " << l.tp << " does not divide the " << m.n_head << " heads";
  else if (m.kv_heads() % l.tp != 0)
    why << "num_key_value_heads " << m.kv_heads() << " is not divisible by tp " << l.tp;
  else if (int64_t(l.pp) * l.virtual_stages > m.n_layer)
    why << "pp " << l.pp << " x virtual stages " << l.virtual_stages << " exceeds the " << m.n_layer << " layers";
  else if (l.replicas < 1 || l.sync_every < 1 || l.ps_servers < 0)
    why << "replicas and sync_every must be >= 1 and the servers >= 0";
  else if (l.sync == OuterSync::kNone && (l.replicas != 1 || l.sync_every != 1))
    why << "replicas " << l.replicas << " and sync_every " << l.sync_every << " need local SGD or DiLoCo";
  else if (l.sync != OuterSync::kNone && l.zero > 2)
    why << "local SGD and DiLoCo with ZeRO-3 (the outer step needs whole parameters between steps)";
  else if (l.ps_servers > 0 && (l.tp != 1 || l.pp != 1 || l.zero != 0 || l.sync != OuterSync::kNone))
    why << "a parameter server's workers train whole models: not with tp, pp, ZeRO or an outer sync";
  else if (l.ps_servers > 0 && l.amp == DType::f16)
    why << "a parameter server runs in f32 or bf16 (no fp16 loss scaling)";
  else if (w.global_batch % (int64_t(l.replicas) * l.dp) != 0)
    why << "dp " << l.dp << (l.replicas > 1 ? " x replicas " + std::to_string(l.replicas) : std::string())
        << " does not divide the global batch " << w.global_batch;
  else if ((w.global_batch / l.replicas / l.dp) % l.micro_batches != 0)
    why << l.micro_batches << " micro-batches do not divide the per-rank batch " << w.global_batch / l.replicas / l.dp;
  else if (l.zero < 0 || l.zero > 3)
    why << "ZeRO stage must be 0-3, got " << l.zero;
  else if (l.zero == 3 && l.pp > 1)
    why << "ZeRO-3 with pp > 1 (minidl gathers blocks per pass, not per pipeline chunk)";
  else if (l.sequence_parallel && l.tp == 1)
    why << "sequence parallelism needs tp > 1";
  else if (l.cp < 1 || w.model.block_size % (2 * l.cp) != 0)
    why << "cp " << l.cp << ": the sequence " << w.model.block_size << " must be a multiple of 2 x cp";
  else if (l.cp > 1 && (l.sequence_parallel || l.ps_servers > 0 || l.sync != OuterSync::kNone))
    why << "cp with sequence parallelism, a parameter server or an outer sync (train_gpt refuses them)";
  else if (l.ep < 1 || (l.ep > 1 && !m.moe()))
    why << "ep " << l.ep << ": expert parallelism spreads a mixture of experts' experts (moe_experts > 0)";
  else if (m.moe() && (l.tp > 1 || l.cp > 1 || l.sync != OuterSync::kNone || l.ps_servers > 0))
    why << "a mixture of experts with tp, cp, an outer sync or a parameter server (train_gpt refuses them)";
  else if (m.moe_experts % l.ep != 0 || l.dp % l.ep != 0)
    why << "ep " << l.ep << " must divide the " << m.moe_experts << " experts and dp " << l.dp;
  else if (l.ep > 1 && (l.zero > 0 || l.pp > 1))
    why << "ep with ZeRO or pp (train_gpt refuses them)";
  else if (l.virtual_stages > 1 && (l.pp == 1 || l.micro_batches % l.pp != 0))
    why << "interleaving needs pp > 1 and micro-batches a multiple of pp (" << l.micro_batches << ", pp " << l.pp
        << ")";
  else {
    try {
      pipeline_spec(l).validate();
    } catch (const Error& e) { why << e.what(); }
  }
  return why.str();
}

Prediction predict(const Workload& w, const Layout& l, const Machine& machine) {
  machine.validate();
  w.model.validate();
  MINIDL_CHECK(w.global_batch >= 1, "predict: the global batch must be >= 1, got ", w.global_batch);
  const std::string why = refusal(w, l);
  MINIDL_CHECK(why.empty(), "predict: layout ", describe(l), " refused: ", why);
  return predict_unchecked(w, l, machine, true);
}

PipelineTime pipeline_time(const dist::PipelineSpec& spec, double forward, double backward) {
  const dist::SimResult sim = dist::simulate(dist::make_schedule(spec), forward, backward);
  PipelineTime out;
  out.makespan = sim.makespan;
  // The busiest rank computes M·(F + B); the rest of the makespan it waits.
  out.bubble = std::max(0.0, sim.makespan - spec.micro_batches * (forward + backward));
  out.bubble_fraction = sim.bubble_fraction();
  out.peak_in_flight = *std::max_element(sim.peak_in_flight.begin(), sim.peak_in_flight.end());
  return out;
}

std::vector<PlanRow> plan(const Workload& w, int gpus, DType amp, const Machine& machine, double budget_bytes,
                          int max_micro_batches) {
  MINIDL_CHECK(gpus >= 1, "plan: the GPU count must be >= 1, got ", gpus);
  machine.validate();
  w.model.validate();
  std::vector<PlanRow> valid, refused;
  for (int dp = 1; dp <= gpus; ++dp) {
    if (gpus % dp != 0) continue;
    for (int tp = 1; tp <= gpus / dp; ++tp) {
      if ((gpus / dp) % tp != 0) continue;
      const int pp = gpus / dp / tp;
      std::vector<int> micro;
      if (w.global_batch % dp != 0)
        micro.push_back(1);  // refused for dp; one row says so
      else
        for (int64_t mb = 1; mb <= std::min<int64_t>(w.global_batch / dp, max_micro_batches); ++mb)
          if ((w.global_batch / dp) % mb == 0) micro.push_back(int(mb));
      for (int V : pp > 1 ? std::vector<int>{1, 2} : std::vector<int>{1})
        for (int M : micro)
          for (int zero = 0; zero <= 3; ++zero)
            for (nn::Recompute rc : {nn::Recompute::kNone, nn::Recompute::kBlock})
              for (bool sp : tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
                Layout l{dp, tp, pp, V, M, zero, rc, amp, sp};
                if (V > 1) l.schedule = dist::ScheduleKind::kInterleaved;
                PlanRow row{l, refusal(w, l), {}};
                if (row.refused.empty()) {
                  row.prediction = predict_unchecked(w, l, machine, true);
                  if (row.prediction.memory_peak > budget_bytes) {
                    std::ostringstream os;
                    os.setf(std::ios::fixed);
                    os.precision(1);
                    os << "needs " << row.prediction.memory_peak / double(1ull << 30) << " GiB per GPU, over the "
                       << budget_bytes / double(1ull << 30) << " GiB budget";
                    row.refused = os.str();
                  }
                }
                (row.refused.empty() ? valid : refused).push_back(std::move(row));
              }
    }
  }
  std::stable_sort(valid.begin(), valid.end(), [](const PlanRow& a, const PlanRow& b) {
    const double ta = a.prediction.time.total(), tb = b.prediction.time.total();
    if (ta != tb) return ta < tb;
    if (a.prediction.memory_peak != b.prediction.memory_peak)
      return a.prediction.memory_peak < b.prediction.memory_peak;
    return describe(a.layout) < describe(b.layout);
  });
  for (PlanRow& r : refused) valid.push_back(std::move(r));
  return valid;
}

}  // namespace minidl::predict
