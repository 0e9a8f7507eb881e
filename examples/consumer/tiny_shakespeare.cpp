// A tiny character-level GPT trained for a few steps on Shakespeare with AdamW, through an installed minidl:
// the smallest program of one's own (examples/consumer/CMakeLists.txt builds it). Prints the loss of each step;
// exits 1 if the last loss is not clearly below the first, 2 on a usage error.
//
//   tiny_shakespeare [STEPS] [DEVICE] [CORPUS]   # 30 steps, cpu, the corpus installed with minidl by default
//   tiny_shakespeare 8 cuda                      # on GPU 0, when minidl was built with a CUDA backend
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "train/device.h"
#include "train/step.h"

using namespace minidl;

int run(int steps, const std::string& device_flag, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "tiny_shakespeare: cannot read the corpus '%s'\n", path.c_str());
    return 2;
  }
  // Bytes are the tokens: a vocabulary of 256, no tokenizer file needed.
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<int32_t> tokens(text.begin(), text.begin() + std::min<size_t>(text.size(), 100000));
  for (int32_t& t : tokens) t &= 0xff;

  nn::GPTConfig config;
  config.vocab_size = 256;
  config.block_size = 32;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 64;
  nn::GPT model(config, /*seed=*/1);
  const Device device = train::select_device(device_flag);
  model.to(device);  // before the optimizer: it keeps views of the parameters
  std::printf("a GPT of %lld parameters on %s\n", (long long)model.num_parameters(),
              train::device_name(device).c_str());
  optim::AdamW optimizer(optim::decay_groups(model.named_parameters(), 0.1), {.lr = 3e-3});
  data::BatchSampler sampler(tokens, config.block_size, /*global_batch=*/8, /*seed=*/1);

  train::StepOptions options;
  options.lr = 3e-3;
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    train::StepResult r = train::train_step(model, optimizer, sampler.batch(step), options);
    std::printf("step %2d  loss %.4f  grad_norm %.3f\n", step, r.loss, r.grad_norm);
    (step == 0 ? first : last) = r.loss;
  }
  if (steps > 1 && !(last < first - 0.5)) {
    std::fprintf(stderr, "tiny_shakespeare: loss did not fall: first %.4f, last %.4f\n", first, last);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  if (steps < 1) {
    std::fprintf(stderr,
                 "usage: tiny_shakespeare [STEPS] [DEVICE] [CORPUS]: STEPS must be a whole number >= 1, "
                 "got '%s'\n",
                 argv[1]);
    return 2;
  }
  try {
    return run(steps, argc > 2 ? argv[2] : "cpu", argc > 3 ? argv[3] : CORPUS);
  } catch (const Error& e) {  // minidl's errors say what was expected and what was found
    std::fprintf(stderr, "tiny_shakespeare: error: %s\n", e.what());
    return 2;
  }
}
