// The training step's modes at the library level: gradient accumulation equals one big batch, mixed precision
// trains close to f32, and an fp16 run's loss scale adapts (backs off on overflow, grows after clean steps).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "core/parallel.h"
#include "data/text_dataset.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/step.h"

using namespace minidl;

namespace {

std::string corpus_path() {
  const char* dir = std::getenv("MINIDL_DATA_DIR");
  return std::string(dir ? dir : MINIDL_TEST_DATA_DIR) + "/tinyshakespeare.txt";
}

const data::TextDataset& dataset() {
  static data::TextDataset ds(corpus_path());
  return ds;
}

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> weights;
};

Trained run_training(train::StepOptions options, int steps, int64_t batch = 12, optim::GradScaler* scaler = nullptr,
                     std::vector<double>* scales = nullptr) {
  set_num_threads(2);
  const data::TextDataset& ds = dataset();
  nn::GPT model(nn::GPTConfig{ds.tokenizer().size(), 32, 2, 2, 32, 0.0, true}, 1337);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {3e-3});
  data::BatchSampler sampler(ds.train(), 32, batch, 1337);
  options.lr = 3e-3;
  options.scaler = scaler;
  Trained t;
  for (int s = 0; s < steps; ++s) {
    t.losses.push_back(train::train_step(model, opt, sampler.batch(s), options).loss);
    if (scales) scales->push_back(scaler->current_scale());
  }
  for (const Tensor& p : model.parameters()) t.weights.push_back(p.to_vector());
  return t;
}

// Weights compared as a whole: ||a - b|| / ||b|| over every parameter, and the largest elementwise difference
// against 1e-4 (the weights are O(0.01..1)). Not per tensor relative to its own size: the key part of c_attn.bias
// has an exactly-zero true gradient (softmax ignores a constant added to every score of a query), so its gradient
// is summation-order noise, which AdamW's m / sqrt(v) turns into +-lr steps of either sign — a tensor of tiny
// values whose relative difference says nothing about accumulation.
struct WeightDiff {
  double rel_l2, max_abs;
};
WeightDiff weight_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double diff = 0, norm = 1e-30, max_abs = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) {
      double d = a[t][i] - b[t][i];
      diff += d * d;
      norm += b[t][i] * b[t][i];
      max_abs = std::max(max_abs, std::abs(d));
    }
  return {std::sqrt(diff / norm), max_abs};
}

}  // namespace

TEST(GradAccum, FourMicroBatchesEqualOneBatchOverTwentySteps) {
  train::StepOptions one, four;
  four.micro_batches = 4;  // micro-batches of 3
  Trained a = run_training(one, 20), b = run_training(four, 20);
  for (size_t s = 0; s < a.losses.size(); ++s)
    EXPECT_NEAR(b.losses[s], a.losses[s], 1e-4 * std::abs(a.losses[s])) << "step " << s;
  WeightDiff d = weight_diff(b.weights, a.weights);
  EXPECT_LT(d.rel_l2, 1e-4);
  EXPECT_LT(d.max_abs, 1e-4);
}

TEST(GradAccum, NoSyncHookSeesAllButTheLastMicroBatch) {
  train::StepOptions o;
  o.micro_batches = 3;
  struct Recorder : train::GradSync {
    std::vector<bool> calls;
    int ends = 0;
    void before_backward(int, bool last) override { calls.push_back(last); }
    void after_backward() override { ++ends; }
  } recorder;
  o.grad_sync = &recorder;
  run_training(o, 2);
  EXPECT_EQ(recorder.calls, (std::vector<bool>{false, false, true, false, false, true}));
  EXPECT_EQ(recorder.ends, 2);
}

TEST(GradAccum, ABatchThatDoesNotSplitIsAnError) {
  train::StepOptions o;
  o.micro_batches = 5;
  try {
    run_training(o, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("into 5 equal micro-batches"), std::string::npos) << msg;
  }
}

TEST(MixedPrecision, Bf16AndFp16TrainCloseToF32) {
  train::StepOptions f32, bf16, fp16;
  bf16.amp = DType::bf16;
  fp16.amp = DType::f16;
  optim::GradScaler scaler;
  Trained a = run_training(f32, 40), b = run_training(bf16, 40), c = run_training(fp16, 40, 12, &scaler);
  double la = (a.losses[37] + a.losses[38] + a.losses[39]) / 3;
  EXPECT_LT(la, a.losses[0] - 0.5);  // it learns
  EXPECT_NEAR((b.losses[37] + b.losses[38] + b.losses[39]) / 3, la, 0.05);
  EXPECT_NEAR((c.losses[37] + c.losses[38] + c.losses[39]) / 3, la, 0.05);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(MixedPrecision, Fp16LossScaleBacksOffAndGrows) {
  // A scale so large that the f16 gradients overflow, and a tiny growth interval: the scaler must back off until
  // they fit, then grow again after 3 clean steps.
  optim::GradScaler scaler({.init_scale = 1099511627776.0, .growth_interval = 3, .max_scale = 1099511627776.0});
  train::StepOptions o;
  o.amp = DType::f16;
  std::vector<double> scales;
  Trained t = run_training(o, 30, 12, &scaler, &scales);
  int backoffs = 0, growths = 0;
  double prev = 1099511627776.0;
  for (double s : scales) {
    backoffs += s < prev;
    growths += s > prev;
    prev = s;
  }
  EXPECT_GE(backoffs, 1);
  EXPECT_GE(growths, 1);
  EXPECT_GE(scaler.skipped_steps(), 1);
  EXPECT_LT(scaler.skipped_steps(), 30);
  for (double l : t.losses) EXPECT_TRUE(std::isfinite(l));
}
