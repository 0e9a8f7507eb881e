// Training-loop properties on a small corpus: the loss goes down, and a run is bitwise reproducible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "data/text_dataset.h"
#include "ops/matmul.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/step.h"

using namespace minidl;

namespace {

std::string corpus_path() {
  const char* dir = std::getenv("MINIDL_DATA_DIR");
  return std::string(dir ? dir : MINIDL_TEST_DATA_DIR) + "/tinyshakespeare.txt";
}

std::vector<double> run_losses(const data::TextDataset& ds, int steps, int threads, int64_t seq = 32,
                               int64_t embd = 32) {
  set_num_threads(threads);
  nn::GPTConfig cfg{ds.tokenizer().size(), seq, 2, 2, embd, 0.1, true};  // dropout on: masks must be reproducible
  nn::GPT model(cfg, 1337);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {3e-3});
  data::BatchSampler sampler(ds.train(), seq, 8, 1337);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(train::train_step(model, opt, sampler.batch(s), {.lr = 3e-3}).loss);
  return losses;
}

}  // namespace

TEST(Training, LossDecreasesOnShakespeare) {
  data::TextDataset ds(corpus_path());
  std::vector<double> l = run_losses(ds, 60, 1);
  double first = (l[0] + l[1] + l[2]) / 3, last = (l[57] + l[58] + l[59]) / 3;
  EXPECT_NEAR(first, std::log(double(ds.tokenizer().size())), 0.3);  // starts near uniform
  EXPECT_LT(last, first - 1.0);
}

TEST(Training, SameSeedAndThreadsGiveBitwiseIdenticalLosses) {
  data::TextDataset ds(corpus_path());
  for (int threads : {1, 2}) {
    std::vector<double> a = run_losses(ds, 50, threads), b = run_losses(ds, 50, threads);
    for (int s = 0; s < 50; ++s) ASSERT_EQ(a[size_t(s)], b[size_t(s)]) << "step " << s << " threads " << threads;
  }
}

// On AVX2 and AVX-512 the linear layers' products run minidl's own kernel, whose sums do not depend on the thread
// count (ops/matmul.h), and so nothing in a step does: 1 and 2 threads give the same losses, bit for bit. The
// shapes (512 tokens, width 64) are big enough that every product is split over the threads, and the weight
// gradients take the two-halves path. Under SSE4 the products go to OpenBLAS, whose weight gradients are summed
// in one partial product per thread.
TEST(Training, OneAndTwoThreadsGiveBitwiseIdenticalLosses) {
  if (ops::cpu_gemm() != ops::CpuGemm::kMinidl) GTEST_SKIP() << "the products run OpenBLAS (MINIDL_CPU_ISA=sse4)";
  data::TextDataset ds(corpus_path());
  std::vector<double> one = run_losses(ds, 20, 1, 64, 64), two = run_losses(ds, 20, 2, 64, 64);
  for (int s = 0; s < 20; ++s) ASSERT_EQ(one[size_t(s)], two[size_t(s)]) << "step " << s;
}

TEST(Training, SteadyStateStepsDoNotAskTheSystemForMemory) {
  data::TextDataset ds(corpus_path());
  set_num_threads(2);
  nn::GPT model(nn::GPTConfig{ds.tokenizer().size(), 32, 2, 2, 32, 0.1, true}, 1);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  data::BatchSampler sampler(ds.train(), 32, 8, 1);
  for (int s = 0; s < 3; ++s) train::train_step(model, opt, sampler.batch(s), {});  // warm the cache
  int64_t before = cpu_system_allocs();
  for (int s = 3; s < 13; ++s) train::train_step(model, opt, sampler.batch(s), {});
  EXPECT_EQ(cpu_system_allocs(), before) << "the caching allocator should serve every steady-state allocation";
}

// The loss of a batch with ignored targets (-1) is the mean over the targets that count, computed here in double
// from the model's own logits (log-softmax by hand): an oracle that shares no code with train_step's divisor
// (count_targets). A third of the targets ignored, in one micro-batch of two and in one batch: counting them in the
// divisor would read a loss 2/3 of the right one.
TEST(Training, IgnoredTargetsAreLeftOutOfTheLossMean) {
  const int64_t vocab = 11, seq = 6, rows = 4;
  nn::GPTConfig cfg{vocab, seq, 1, 2, 16, 0.0, true};
  std::vector<double> x(size_t(rows * seq)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = double((i * 7 + 3) % size_t(vocab));
    y[i] = i % 3 == 2 ? -1.0 : double((i * 5 + 1) % size_t(vocab));
  }
  const data::Batch batch{Tensor::from_vector(x, {rows, seq}, DType::i32),
                          Tensor::from_vector(y, {rows, seq}, DType::i32)};
  for (int64_t accum : {1, 2}) {
    SCOPED_TRACE("grad_accum " + std::to_string(accum));
    nn::GPT model(cfg, 7);
    const std::vector<double> logits = model.forward(batch.x).to_vector();  // (rows, seq, vocab), before the step
    double sum = 0;
    int64_t counted = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      if (y[i] < 0) continue;
      const double* row = logits.data() + i * size_t(vocab);
      double max = row[0], z = 0;
      for (int64_t v = 1; v < vocab; ++v) max = std::max(max, row[v]);
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(row[v] - max);
      sum += max + std::log(z) - row[size_t(y[i])];
      ++counted;
    }
    ASSERT_EQ(counted, rows * seq * 2 / 3);
    optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
    train::StepOptions o;
    o.micro_batches = accum;
    const train::StepResult r = train::train_step(model, opt, batch, o);
    EXPECT_NEAR(r.loss, sum / double(counted), 1e-5 * sum / double(counted));  // f32 logits and sums
  }
}
