#include "examples/gpt_training.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>

#if defined(MINIDL_HAVE_CUDA_BACKEND)
#include "core/cuda/cuda.h"
#endif

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "core/rng.h"
#include "ops/cast.h"
#include "optim/clip.h"

namespace minidl::train {

namespace {

// Targets that count towards the loss (not the ignore index -1).
int64_t count_targets(const Tensor& y) {
  int64_t n = 0;
  for (double v : y.to_vector()) n += v != -1.0;
  return n;
}

// Where the model's parameters live: batches are built on the host and moved there a micro-batch at a time.
Device model_device(const nn::GPT& model) { return model.parameters().front().device(); }

}  // namespace

StepResult train_step(nn::GPT& model, optim::AdamW& optimizer, const data::Batch& batch, const StepOptions& o) {
  const int64_t rows = batch.x.size(0), k = o.grad_accum;
  MINIDL_CHECK(k >= 1 && rows % k == 0, "train_step: a batch of ", rows, " sequences does not split into grad_accum = ",
               k, " equal micro-batches");
  MINIDL_CHECK(o.amp == DType::f32 || ops::is_half(o.amp), "train_step: amp must be f32 (off), bf16 or f16, got ",
               o.amp);
  const int64_t micro = rows / k;
  const Device device = model_device(model);
  // The normaliser of the whole step. Under DDP each rank divides by its own slice's count and DDP averages over
  // ranks: with equal-sized slices and no ignored targets that is the global mean exactly.
  const double inv_targets = 1.0 / double(std::max<int64_t>(1, count_targets(batch.y)));
  StepResult r;
  r.loss_scale = o.scaler ? o.scaler->current_scale() : 1.0;
  {
    MemoryTagGuard tag(MemTag::kActivations);
    // One guard over every micro-batch: the 16-bit weight copies are made once per step (autograd/autocast.h).
    std::optional<autograd::AutocastGuard> autocast;
    if (o.amp != DType::f32) autocast.emplace(o.amp);
    // Micro-batch m holds samples [first + m * micro, ...) of the global batch: its dropout masks are those one big
    // batch would draw for the same samples (nn::DropoutContext).
    nn::DropoutContext& dropout = model.dropout_context();
    const int64_t first = dropout.first_sample;
    Tensor loss_sum;
    for (int64_t m = 0; m < k; ++m) {
      Tensor x = batch.x.narrow(0, m * micro, micro).to(device), y = batch.y.narrow(0, m * micro, micro).to(device);
      dropout.first_sample = first + m * micro;
      Tensor loss = mul(model.loss(x, y, Reduction::kSum), inv_targets);
      // Summed where the loss lives and read once after the last micro-batch (on a GPU: one sync per step).
      loss_sum = loss_sum.defined() ? add(loss_sum, loss.detach()) : loss.detach();
      if (o.scaler) loss = o.scaler->scale(loss);
      // DDP hook: no_sync() for all but the last micro-batch, whose backward launches the bucketed all-reduce.
      if (o.grad_sync) o.grad_sync(/*sync=*/m + 1 == k);
      loss.backward();
    }
    dropout.first_sample = first;
    dropout.step += 1;
    r.loss = loss_sum.item();
  }
  std::vector<Tensor> params = model.parameters();
  bool overflow = o.scaler && o.scaler->unscale_and_check(params);
  r.grad_norm = overflow ? INFINITY : std::sqrt(optim::grad_norm_squared(params));
  if (o.grad_clip > 0 && !overflow) {
    double factor = optim::clip_factor(r.grad_norm, o.grad_clip);
    if (factor < 1.0) optim::scale_grads(params, factor);
  }
  optimizer.set_lr(o.lr);
  if (o.scaler) {
    optim::ScalerStep s = o.scaler->step(optimizer);
    r.applied = s.applied;
    r.skip_reason = s.reason;
  } else {
    optimizer.step();
  }
  optimizer.zero_grad();
  return r;
}

StepResult train_step(nn::GPT& model, optim::AdamW& optimizer, const data::Batch& batch, double lr,
                      double grad_clip) {
  StepOptions o;
  o.lr = lr;
  o.grad_clip = grad_clip;
  return train_step(model, optimizer, batch, o);
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
    Device device = model_device(model);
    Tensor loss = model.loss(windows.x.narrow(0, b, m).to(device), windows.y.narrow(0, b, m).to(device));
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

Device select_device(const std::string& flag, int local_rank) {
  if (flag == "cpu") return Device::cpu();
  int index = local_rank;
  bool ok = flag == "cuda";
  if (!ok && flag.rfind("cuda:", 0) == 0 && flag.size() > 5 &&
      flag.find_first_not_of("0123456789", 5) == std::string::npos) {
    index = std::stoi(flag.substr(5));
    ok = true;
  }
  MINIDL_CHECK(ok, "--device: expected cpu, cuda or cuda:N, got '", flag, "'");
#if defined(MINIDL_HAVE_CUDA_BACKEND)
  cuda::register_backend();
  int count = cuda::device_count();
  MINIDL_CHECK(count > 0, "--device ", flag, ": no CUDA device is visible");
  if (flag == "cuda") index = local_rank % count;  // one GPU per rank; ranks share GPUs when there are fewer
  MINIDL_CHECK(index < count, "--device ", flag, ": no such device (this machine has ", count, " CUDA device",
               count == 1 ? "" : "s", ")");
  return Device::cuda(index);
#else
  MINIDL_CHECK(false, "--device ", flag, ": this build has no CUDA backend (configure with nvcc and the CUDA "
               "toolkit found, or with -DMINIDL_CUDA_EMULATION=ON to run the device path on the CPU emulator)");
  return Device::cpu();
#endif
}

std::string device_name(Device device) {
#if defined(MINIDL_HAVE_CUDA_BACKEND)
  if (device.is_cuda()) return cuda::device_name(device.index);
#endif
  return device.is_cpu() ? "cpu" : "cuda";
}

double gpu_peak_tflops(const std::string& name, DType dtype, bool tf32) {
  // NVIDIA's datasheet figures without sparsity: {16-bit tensor, TF32 tensor, FP32}.
  struct Peak {
    const char* match;
    double half, tf32, fp32;
  };
  static const Peak kPeaks[] = {
      {"H200", 989.4, 494.7, 66.9},    {"H100 PCIe", 756.0, 378.0, 51.2}, {"H100", 989.4, 494.7, 66.9},
      {"A100", 312.0, 156.0, 19.5},    {"A10G", 70.0, 35.0, 31.2},        {"A10", 125.0, 62.5, 31.2},
      {"L40S", 362.1, 183.0, 91.6},    {"L4", 121.0, 60.0, 30.3},         {"RTX 4090", 165.2, 82.6, 82.6},
      {"RTX 3090", 71.0, 35.6, 35.6},  {"V100", 125.0, 0.0, 15.7},        {"T4", 65.0, 0.0, 8.1}};
  for (const Peak& p : kPeaks)
    if (name.find(p.match) != std::string::npos)
      return dtype != DType::f32 ? p.half : (tf32 && p.tf32 > 0 ? p.tf32 : p.fp32);
  return 0.0;
}

bool cuda_is_emulated() {
#if defined(MINIDL_CUDA_EMULATED)
  return true;
#else
  return false;
#endif
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
