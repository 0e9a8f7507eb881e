// The pieces of a GPT training run shared by examples/train_gpt and bench/gpt_step: one optimizer step,
// deterministic evaluation, text sampling, and the run's measurements.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"

namespace minidl::train {

struct StepOptions {
  double lr = 1e-3;
  double grad_clip = 1.0;     // global L2 norm; <= 0 disables clipping
  int64_t grad_accum = 1;     // micro-batches per optimizer step; must divide the batch's rows
  DType amp = DType::f32;     // bf16 / f16: forward and backward under AutocastGuard(amp) (autograd/autocast.h)
  optim::GradScaler* scaler = nullptr;  // dynamic loss scaling (f16); null: none
  // Called before each micro-batch's backward with sync = whether it is the last micro-batch of the step. This is
  // where DDP's no_sync() goes: gradient all-reduce only on the last backward, plain local accumulation before.
  std::function<void(bool sync)> grad_sync;
};

struct StepResult {
  double loss = 0;         // mean cross-entropy over every target token of the batch
  double grad_norm = 0;    // global L2 norm before clipping (unscaled; inf when the step overflowed)
  bool applied = true;     // false: the scaler skipped the update (inf/NaN gradients)
  std::string skip_reason;
  double loss_scale = 1;   // the scale this step used (1 without a scaler)
};

// One optimizer step over `batch`, split into options.grad_accum micro-batches of equal size:
//   for each micro-batch: loss_m = sum of its token losses / (target tokens in the whole batch), backward
//   (the gradients add up to those of the mean over the whole batch, exactly as one big batch would give);
//   then unscale (with a scaler), clip, AdamW step at options.lr (or a skip), zero_grad.
// The dropout context advances by one step per call; micro-batch m sees first_sample + m * micro, so its masks are
// those of the same samples in one big batch (nn::DropoutContext).
StepResult train_step(nn::GPT& model, optim::AdamW& optimizer, const data::Batch& batch, const StepOptions& options);

// The same with defaults: full precision, one micro-batch.
StepResult train_step(nn::GPT& model, optim::AdamW& optimizer, const data::Batch& batch, double lr,
                      double grad_clip);

// Mean loss over the given windows (x, y of shape (n, seq)), in eval mode without recording gradients.
// Windows are processed `batch` at a time; the result does not depend on `batch`.
double evaluate(nn::GPT& model, const data::Batch& windows, int64_t batch);

// Generates n tokens after `prompt` by sampling from softmax(logits / temperature) with Philox(seed).
std::vector<int32_t> sample(nn::GPT& model, std::vector<int32_t> prompt, int64_t n, double temperature,
                            uint64_t seed);

// The device a program's --device flag names: "cpu", "cuda" (device `local_rank`, one GPU per rank on a host)
// or "cuda:N". For a CUDA device it registers the CUDA backend this program was linked with (minidl_device:
// the real one, or the emulated one in a -DMINIDL_CUDA_EMULATION=ON build) and checks the device exists; a
// build without one, or a machine without the device, is a clear error.
Device select_device(const std::string& flag, int local_rank = 0);
// The name of a CUDA device ("NVIDIA H100 80GB HBM3"), or "cpu".
std::string device_name(Device device);
// Dense peak TFLOP/s of a GPU, by name, for the dtype its matrix products run in (bf16/f16 tensor cores; f32 as
// TF32 tensor cores when tf32, otherwise plain FP32): the denominator of MFU. 0 when the GPU is not in the table.
double gpu_peak_tflops(const std::string& name, DType dtype, bool tf32);

// Whether this program's CUDA backend is the CPU emulator of CUDA (a -DMINIDL_CUDA_EMULATION=ON build).
bool cuda_is_emulated();

// Peak resident set size of this process in MiB (/proc/self/status VmHWM).
double peak_rss_mb();

}  // namespace minidl::train
