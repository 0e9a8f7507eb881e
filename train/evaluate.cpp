#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "autograd/node.h"
#include "core/memory.h"
#include "core/rng.h"

namespace minidl::train {

namespace {

// Where the model's parameters live: windows are built on the host and moved there a batch at a time.
Device model_device(const nn::GPT& model) { return model.parameters().front().device(); }

}  // namespace

double evaluate(nn::GPT& model, const data::Batch& windows, int64_t batch, dist::ProcessGroup* dp_group) {
  autograd::NoGradGuard no_grad;
  MemoryTagGuard tag(MemTag::kActivations);
  bool was_training = model.is_training();
  model.eval();
  const int64_t n = windows.x.size(0), batches = (n + batch - 1) / batch;
  const int ranks = dp_group ? dp_group->size() : 1, me = dp_group ? dp_group->rank() : 0;
  // Batch i's summed loss on the rank that computed it, 0 elsewhere: adding the ranks' vectors is exact.
  std::vector<double> sums(size_t(batches), 0.0);
  const Device device = model_device(model);
  for (int64_t i = me; i < batches; i += ranks) {
    int64_t b = i * batch, m = std::min(batch, n - b);
    Tensor loss = model.loss(windows.x.narrow(0, b, m).to(device), windows.y.narrow(0, b, m).to(device));
    sums[size_t(i)] = loss.item() * double(m);  // every window has the same number of targets
  }
  if (ranks > 1) {
    Tensor all = Tensor::from_vector(sums, {batches}, DType::f64).to(dp_group->device());
    dp_group->all_reduce(all, dist::ReduceOp::kSum)->wait();
    sums = all.to_vector();
  }
  double total = 0;
  for (double s : sums) total += s;  // in batch order, as one process adds them
  if (was_training) model.train();
  return total / double(n);
}

std::vector<int32_t> sample(nn::GPT& model, std::vector<int32_t> tokens, int64_t n, double temperature,
                            uint64_t seed) {
  autograd::NoGradGuard no_grad;
  bool was_training = model.is_training();
  model.eval();
  const int64_t block = model.config().block_size, V = model.config().vocab_size;
  Philox rng(seed, /*stream=*/0x53414D504C45ull);  // "SAMPLE"
  std::vector<double> probs(static_cast<size_t>(V));
  for (int64_t i = 0; i < n; ++i) {
    int64_t T = std::min<int64_t>(int64_t(tokens.size()), block);
    std::vector<int32_t> ctx(tokens.end() - T, tokens.end());
    Tensor ids = Tensor::from_vector(ctx, Shape{1, T}).to(model_device(model));
    Tensor logits = model.forward(ids);  // (1, T, V)
    std::vector<double> last = logits.narrow(1, T - 1, 1).to_vector();
    double mx = *std::max_element(last.begin(), last.end()), sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += probs[size_t(v)] = std::exp((last[size_t(v)] - mx) / temperature);
    double u = rng.uniform(uint64_t(i)) * sum;
    int32_t next = int32_t(V - 1);
    for (int64_t v = 0; v < V; ++v) {
      u -= probs[size_t(v)];
      if (u < 0) {
        next = int32_t(v);
        break;
      }
    }
    tokens.push_back(next);
  }
  if (was_training) model.train();
  return tokens;
}

}  // namespace minidl::train
