#include "examples/gpt_training.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "autograd/node.h"
#include "core/rng.h"
#include "optim/clip.h"

namespace minidl::train {

StepResult train_step(nn::GPT& model, optim::AdamW& optimizer, const data::Batch& batch, double lr,
                      double grad_clip) {
  StepResult r;
  {
    MemoryTagGuard tag(MemTag::kActivations);
    Tensor loss = model.loss(batch.x, batch.y);
    r.loss = loss.item();
    loss.backward();
  }
  std::vector<Tensor> params = model.parameters();
  double norm_sq = optim::grad_norm_squared(params);
  r.grad_norm = std::sqrt(norm_sq);
  if (grad_clip > 0) {
    double factor = optim::clip_factor(r.grad_norm, grad_clip);
    if (factor < 1.0) optim::scale_grads(params, factor);
  }
  optimizer.set_lr(lr);
  optimizer.step();
  optimizer.zero_grad();
  model.dropout_context().step += 1;
  return r;
}

double evaluate(nn::GPT& model, const data::Batch& windows, int64_t batch) {
  autograd::NoGradGuard no_grad;
  MemoryTagGuard tag(MemTag::kActivations);
  bool was_training = model.is_training();
  model.eval();
  int64_t n = windows.x.size(0);
  double total = 0;
  for (int64_t b = 0; b < n; b += batch) {
    int64_t m = std::min(batch, n - b);
    Tensor loss = model.loss(windows.x.narrow(0, b, m), windows.y.narrow(0, b, m));
    total += loss.item() * double(m);  // every window has the same number of targets
  }
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
    Tensor ids = Tensor::from_vector(ctx, Shape{1, T});
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

double peak_rss_mb() {
  // VmHWM is this process image's high-water mark. getrusage's ru_maxrss would do, except that Linux carries it
  // across exec: a program started by a large parent (a Python benchmark driver) would report the parent's peak.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // the value is in kB
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

}  // namespace minidl::train
