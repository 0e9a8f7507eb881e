#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "autograd/node.h"
#include "core/memory.h"
#include "core/rng.h"

namespace minidl::train {

double evaluate(Stage& stage, const data::Batch& windows, int64_t batch, dist::ProcessGroup* dp_group) {
  autograd::NoGradGuard no_grad;
  MemoryTagGuard tag(MemTag::kActivations);
  const bool was_training = stage.chunk(0).is_training();
  stage.train(false);
  dist::ProcessGroup* pp = stage.pp_group();
  const int p = stage.spec().stages, C = stage.spec().chunks();
  // The batches are dealt over the dp coordinate; a context-parallel group (dp group rank dp · cp + cp rank:
  // dist/topology.h) evaluates each of its batches together, each rank its positions, their means added / cp.
  const int cp = stage.context_parallel_size();
  MINIDL_CHECK(cp == 1 || dp_group, "evaluate: a context-parallel stage needs the dp group its cp ranks are in");
  const int ranks = dp_group ? dp_group->size() / cp : 1, me = dp_group ? dp_group->rank() / cp : 0;
  const Device device = stage.device();
  const int64_t n = windows.x.size(0), batches = (n + batch - 1) / batch, T = windows.x.size(1) / cp;
  std::vector<double> sums(size_t(batches), 0.0);
  // Expert parallelism exchanges tokens inside the forward: every rank of an ep group runs as many forwards, a
  // rank past the last batch re-running the first one and dropping its loss.
  const bool lockstep = stage.expert_parallel();
  const int64_t rounds = (batches + ranks - 1) / ranks;
  for (int64_t i = me; lockstep ? i < rounds * ranks : i < batches; i += ranks) {
    const bool spare = i >= batches;
    const int64_t b = spare ? 0 : i * batch, m = std::min(batch, n - b);
    // The chunks in global order: a single chain, so blocking sends and receives cannot deadlock.
    Tensor x;
    for (int c = 0; c < C; ++c) {
      if (c % p != stage.rank()) continue;
      nn::GPT& chunk = stage.chunk(c / p);
      if (c == 0) {
        x = chunk.embed(stage.positions_of(windows.x.narrow(0, b, m)).to(device));
      } else {
        x = Tensor::empty({m, stage.positions_per_rank(T), stage.config().n_embd}, DType::f32, device);
        pp->recv(x, (c - 1) % p, 0)->wait();
      }
      x = chunk.blocks(chunk.stage().first_block, chunk.stage().last_block, x);
      if (c == C - 1) {
        const double loss = chunk.head_loss(x, stage.positions_of(windows.y.narrow(0, b, m)).to(device)).item();
        if (!spare) sums[size_t(i)] = loss * double(m) / cp;
      } else {
        x = x.contiguous();
        pp->send(x, (c + 1) % p, 0)->wait();
      }
    }
  }
  if (p > 1 || ranks * cp > 1) {
    Tensor all = Tensor::from_vector(sums, {batches}, DType::f64).to(pp ? pp->device() : dp_group->device());
    if (p > 1) pp->all_reduce(all, dist::ReduceOp::kSum)->wait();
    if (ranks * cp > 1) dp_group->all_reduce(all, dist::ReduceOp::kSum)->wait();
    sums = all.to_vector();
  }
  double total = 0;
  for (double s : sums) total += s;  // in batch order, as one process adds them
  if (was_training) stage.train(true);
  return total / double(n);
}

namespace {

// The next token from the last position's logits: greedy at temperature 0, else drawn from softmax(logits / T)
// over the top k (all when k <= 0) with the uniform u in [0, 1).
int32_t pick(const std::vector<double>& logits, const GenerateOptions& o, double u) {
  const int64_t V = int64_t(logits.size());
  if (o.temperature == 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double floor = -std::numeric_limits<double>::infinity();  // logits below it cannot be drawn
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<double> sorted(logits);
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    floor = sorted[size_t(o.top_k - 1)];
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(size_t(V), 0.0);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v)
    if (logits[size_t(v)] >= floor) sum += probs[size_t(v)] = std::exp((logits[size_t(v)] - mx) / o.temperature);
  u *= sum;
  for (int64_t v = 0; v < V; ++v) {
    u -= probs[size_t(v)];
    if (u < 0 && probs[size_t(v)] > 0) return int32_t(v);
  }
  for (int64_t v = V - 1; v >= 0; --v)  // rounding left u >= 0: the last token that can be drawn
    if (probs[size_t(v)] > 0) return int32_t(v);
  return int32_t(V - 1);
}

}  // namespace

std::vector<int32_t> generate(nn::GPT& model, std::vector<int32_t> tokens, const GenerateOptions& o) {
  MINIDL_CHECK(!tokens.empty(), "generate: expected a prompt of at least one token");
  MINIDL_CHECK(o.temperature >= 0 && std::isfinite(o.temperature), "generate: expected a temperature >= 0, got ",
               o.temperature);
  MINIDL_CHECK(o.max_new_tokens >= 0, "generate: expected max_new_tokens >= 0, got ", o.max_new_tokens);
  autograd::NoGradGuard no_grad;
  bool was_training = model.is_training();
  model.eval();
  const int64_t block = model.config().block_size;
  const bool cached = o.kv_cache && model.supports_kv_cache();
  const Device device = model.parameters().front().device();
  Philox rng(o.seed, /*stream=*/0x53414D504C45ull);  // "SAMPLE"
  nn::KVCache cache;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t T = std::min<int64_t>(int64_t(tokens.size()), block);
    Tensor logits;
    if (cached && cache.length > 0 && cache.length < block) {  // one new position
      logits =
          model.forward_cached(Tensor::from_vector(std::vector<int32_t>{tokens.back()}, Shape{1, 1}).to(device), cache);
    } else {  // the whole window: the first token, or a window that slid
      const Tensor ids =
          Tensor::from_vector(std::vector<int32_t>(tokens.end() - T, tokens.end()), Shape{1, T}).to(device);
      if (cached) {
        cache = nn::KVCache{};
        logits = model.forward_cached(ids, cache);
      } else {
        logits = model.forward(ids);
      }
    }
    const std::vector<double> last = logits.narrow(1, logits.size(1) - 1, 1).to_vector();
    tokens.push_back(pick(last, o, rng.uniform(uint64_t(i))));
  }
  if (was_training) model.train();
  return tokens;
}

}  // namespace minidl::train
