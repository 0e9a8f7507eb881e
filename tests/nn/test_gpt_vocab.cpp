// The vocabulary padded to a multiple of GPTConfig::vocab_pad (nn/gpt.h) is invisible outside the model: a padded
// and an unpadded model of the same seed train to the same losses and gradients (within 1e-6 / 1e-5: the GEMMs are
// not bitwise across widths), their checkpoints have the same layout (the same bytes before training) and load into
// each other; the parameter, logits and parameter counts are those of the real V.
// Also the cross-entropy node's overwrite of dead logits (autograd/functions.h): never when someone can still read
// them, and the gradients the same either way.
//
// The same source builds test_gpt_device (tests/nn/CMakeLists.txt) with MINIDL_TEST_EMULATED_CUDA: the models then
// run on the emulated CUDA device (the 16-bit classifier under bf16 autocast, and a launch count showing that no
// cast surrounds it), and test_gpt_gpu on a real GPU (skips without one).
#include <gtest/gtest.h>

#include "tests/support/test_device.h"

#if defined(MINIDL_TEST_CUDA)
#define GPT_VOCAB_SUITE GPTVocabCuda
#else
#define GPT_VOCAB_SUITE GPTVocab
#endif

#include <cmath>
#include <optional>

#include "autograd/autocast.h"
#include "core/rng.h"
#include "nn/checkpoint.h"
#include "nn/gpt.h"
#include "ops/cast.h"
#include "optim/adamw.h"
#include "test_util.h"

using namespace minidl;
using minidl::testing::test_device;

namespace {

// V = 65 (Shakespeare's characters) pads to 72 (a multiple of 8: 64's would add 63 rows); tiny otherwise.
nn::GPTConfig config(int64_t vocab_pad) {
  nn::GPTConfig c{.vocab_size = 65, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .dropout = 0.1};
  c.vocab_pad = vocab_pad;
  return c;
}

Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  std::vector<int64_t> v(size_t(B * T));
  Philox rng(seed, 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(rng.draw(i).x % 65u);
  v[0] = 64;  // the last real id: the row next to the padding
  return Tensor::from_vector(v, Shape{B, T});
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> grads;  // after the last step's backward
  std::string checkpoint;                  // the bytes of save_gpt after the last step
};

// Three AdamW steps (weight decay on, dropout on) of a model with the given padding.
TrainRun train(int64_t vocab_pad, DType amp) {
  nn::GPT model(config(vocab_pad), 7);
  model.to(test_device());
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-2});
  TrainRun r;
  for (int64_t s = 0; s < 3; ++s) {
    model.dropout_context().step = s;
    opt.zero_grad();
    {
      std::optional<autograd::AutocastGuard> guard;
      if (amp != DType::f32) guard.emplace(amp);
      Tensor loss = model.loss(tokens(2, 16, 2 * s).to(test_device()), tokens(2, 16, 2 * s + 1).to(test_device()));
      r.losses.push_back(loss.item());
      loss.backward();
    }
    if (s == 2)
      for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad().to_vector());
    opt.step();
  }
  minidl::testing::TempDir dir;
  nn::save_gpt(dir.file("model.safetensors"), model, "[]");
  r.checkpoint = minidl::testing::read_bytes(dir.file("model.safetensors"));
  return r;
}

}  // namespace

TEST(GPT_VOCAB_SUITE, PaddedAndUnpaddedModelsTrainTheSame) {
  SKIP_WITHOUT_DEVICE();
  for (DType amp : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(amp));
    const TrainRun padded = train(64, amp), plain = train(1, amp);
    ASSERT_EQ(padded.losses.size(), plain.losses.size());
    // A real GPU's GEMMs may pick another algorithm for 65 and 72 columns, and under bf16 a last-bit difference
    // can flip a logit's 16-bit rounding; the CPU's BLAS and the emulator's GEMM stay within 1e-6 in both.
#if defined(MINIDL_TEST_GPU)
    const double tol = amp == DType::f32 ? 1e-6 : 1e-2, grad_tol = amp == DType::f32 ? 1e-5 : 5e-2;
#else
    const double tol = 1e-6, grad_tol = 1e-5;
#endif
    for (size_t s = 0; s < plain.losses.size(); ++s)
      EXPECT_NEAR(padded.losses[s], plain.losses[s], tol * std::abs(plain.losses[s])) << "step " << s;
    ASSERT_EQ(padded.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      ASSERT_EQ(padded.grads[i].size(), plain.grads[i].size()) << "parameter " << i;
      double scale = 1e-12;
      for (double g : plain.grads[i]) scale = std::max(scale, std::abs(g));
      for (size_t j = 0; j < plain.grads[i].size(); ++j)
        ASSERT_NEAR(padded.grads[i][j], plain.grads[i][j], grad_tol * scale) << "parameter " << i << " element " << j;
    }
    // Not bitwise: the BLAS (and the device GEMM) take other kernels for 65 and 72 columns, so the logits differ
    // in the last bits, and the weights with them. The checkpoints have the same layout (same size, same header).
    ASSERT_EQ(padded.checkpoint.size(), plain.checkpoint.size());
    const size_t header = 8 + size_t(*reinterpret_cast<const uint64_t*>(plain.checkpoint.data()));
    EXPECT_EQ(padded.checkpoint.substr(0, header), plain.checkpoint.substr(0, header));
  }
}

TEST(GPT_VOCAB_SUITE, UntrainedCheckpointsAreTheSameBytes) {
  SKIP_WITHOUT_DEVICE();
  minidl::testing::TempDir dir;
  nn::GPT padded(config(64), 9), plain(config(1), 9);
  padded.to(test_device());
  nn::save_gpt(dir.file("padded.safetensors"), padded, "[]");
  nn::save_gpt(dir.file("plain.safetensors"), plain, "[]");
  EXPECT_TRUE(minidl::testing::read_bytes(dir.file("padded.safetensors")) ==
              minidl::testing::read_bytes(dir.file("plain.safetensors")));
}

TEST(GPT_VOCAB_SUITE, PaddingIsInvisibleOutsideTheModel) {
  SKIP_WITHOUT_DEVICE();
  nn::GPT padded(config(64), 3), plain(config(1), 3);
  EXPECT_EQ(padded.config().padded_vocab(), 72);
  nn::GPTConfig gpt2;
  gpt2.vocab_size = 50257;
  EXPECT_EQ(gpt2.padded_vocab(), 50304) << "vocab_pad 64, by default";
  gpt2.vocab_pad = 1;
  EXPECT_EQ(gpt2.padded_vocab(), 50257);
  EXPECT_EQ(padded.config(), plain.config()) << "vocab_pad is layout, not the model";
  EXPECT_EQ(padded.wte->weight.shape(), (Shape{65, 32}));
  EXPECT_EQ(padded.num_parameters(), plain.num_parameters());
  EXPECT_EQ(padded.flops_per_token(16), plain.flops_per_token(16));
  EXPECT_EQ(nn::gpt_config_to_json(padded.config()), nn::gpt_config_to_json(plain.config()));

  // Module::to moves the V rows only; the next head puts them back into a padded buffer, and the ledger charges
  // that buffer to the parameters.
  padded.to(test_device());
  plain.to(test_device());
  padded.eval();
  plain.eval();
  const Tensor ids = tokens(2, 16, 5).to(test_device());
  const Tensor logits = padded.forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{2, 16, 65})) << "never a padded id (sampling reads these)";
  EXPECT_EQ(padded.wte->weight.impl()->storage->bytes(), size_t(72 * 32 * 4))
      << "the weight is back in a padded buffer";
  const std::vector<double> got = logits.to_vector(), want = plain.forward(ids).to_vector();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6) << "logit " << i;

  // A checkpoint written by one loads into the other.
  minidl::testing::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  nn::GPT trained(config(1), 11);
  nn::save_gpt(path, trained, "[]");
  nn::GPT loaded(nn::load_gpt(path).config, 3);
  EXPECT_EQ(loaded.config().vocab_pad, 64) << "a loaded model pads by default";
  nn::load_into(loaded, path);
  trained.eval();
  loaded.eval();
  const Tensor cpu_ids = tokens(2, 16, 6);
  const double want_loss = trained.loss(cpu_ids, tokens(2, 16, 7)).item();
  EXPECT_NEAR(loaded.loss(cpu_ids, tokens(2, 16, 7)).item(), want_loss, 1e-6 * want_loss);
}

// dlogits are written over the logits only when nothing else holds them (then the backward allocates no (N, Vp)
// buffer for them: its activation peak is lower); the gradient is the same either way.
TEST(GPT_VOCAB_SUITE, CrossEntropyOverwritesOnlyDeadLogits) {
  SKIP_WITHOUT_DEVICE();
  const Device device = test_device();
  const int64_t N = 64, Vp = 128, V = 65;
  std::vector<int64_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = i % 9 == 4 ? -1 : (i * 7) % V;
  const Tensor targets = Tensor::from_vector(t, {N}).to(device);
  Tensor rows = Tensor::arange(N).reshape({N, 1});
  rows = (rows * Tensor::scalar(0.01)).to(device);
  std::vector<std::vector<double>> grads;
  std::vector<int64_t> backward_peaks;
  for (bool keep : {true, false}) {
    MemoryTagGuard tag(MemTag::kActivations);
    Tensor w = Tensor::ones({1, Vp}).to(device);
    w.set_requires_grad(true);
    Tensor logits = matmul(rows, w);  // (N, Vp), columns [V, Vp) padding
    const std::vector<double> before = logits.to_vector();
    Tensor loss = cross_entropy(logits, targets, -1, Reduction::kMean, V);
    Tensor kept = keep ? logits : Tensor();
    logits = Tensor();
    MemoryLedger& mem = ledger(device);
    mem.reset_peaks();
    const int64_t at_start = mem.current(MemTag::kActivations);
    loss.backward();
    backward_peaks.push_back(mem.peak(MemTag::kActivations) - at_start);
    if (keep) { EXPECT_EQ(kept.to_vector(), before) << "logits someone holds are never overwritten"; }
    grads.push_back(w.grad().to_vector());
  }
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_LE(backward_peaks[1] + N * Vp * 4, backward_peaks[0]) << "no dlogits buffer when the logits are dead";
}

#if defined(MINIDL_TEST_CUDA)
// Under bf16 autocast the classifier reads the 16-bit logits as they are: the same number of launches as over f32
// logits (a cast to f32 and its backward would add two).
TEST(GPT_VOCAB_SUITE, NoCastAroundTheClassifierUnderBf16) {
  SKIP_WITHOUT_DEVICE();
  const Tensor targets = tokens(4, 16, 2).reshape({64}).to(test_device());
  auto launches = [&](DType dt) {
    Tensor logits = ops::cast(Tensor::zeros({64, 128}), dt).to(test_device());
    logits.set_requires_grad(true);
    autograd::AutocastGuard guard(DType::bf16);
    const cuda::Counters before = cuda::counters();
    Tensor loss = cross_entropy(logits, targets, -1, Reduction::kMean, 65);
    loss.backward();
    return (cuda::counters() - before).kernel_launches;
  };
  EXPECT_EQ(launches(DType::bf16), launches(DType::f32));
}
#endif
