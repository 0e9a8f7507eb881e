// train::CudaGraphStep: train_step captured once as a CUDA graph and replayed (train_gpt --cuda-graph).
//
//   train::CudaGraphStep graph_step(model, opt, options);           // options as for train_step
//   for (step ...) {
//     train::StepResult r = graph_step.step(batch, lr);             // host batch; eager warm-up, then replays
//     if (logging) r.read();
//   }
//
// The first kWarmupSteps steps run eagerly (the allocator caches every size the step asks for, AdamW's state and
// the gradients exist). The next step is captured (forward, backward, unscale, clip, the optimizer, zero_grad:
// cuda::Graph, core/cuda/graph.h) and every step from then on is one graph launch. Each step first checks the
// host batch (the ids' range, GPT::loss's messages) and copies it into the graph's static input buffers on the
// compute stream (core/upload.h): the only host -> device copies of a step. The learning rate is written on the
// device by a fill kernel before each step and read there by AdamW (AdamW::read_lr_from), and AdamW's step count
// advances on the device, so a replay follows the schedule. With dropout, the step of the masks' Philox offset is
// written on the device the same way (nn::DropoutContext::step_on_device), so a replay draws the eager step's masks.
// What a replay cannot change is refused by name: a batch of another shape or with another count of targets
// (ignored -1 targets).
// With a data::DeviceBatchSampler (train_gpt --device cuda) the batch is drawn inside the step instead: the sampling
// kernel is captured with the rest and reads the step from a device scalar written (a fill kernel) before each
// step, so a replay draws that step's batch and a step copies nothing to the device at all:
//
//   data::DeviceBatchSampler batches = train::device_sampler(model, split, seq, global_batch, seed);
//   train::StepResult r = graph_step.step(batches, step, begin, n, lr);   // the same slice every step
// The StepResult of a replay holds the graph's output buffers (loss, norm, overflow flag, scale): read() it before
// the next step overwrites them.
#pragma once

#include <functional>
#include <memory>

#include "train/step.h"

namespace minidl::train {

struct TrainConfig;
// --cuda-graph's refusals, by name: expected --device cuda, one process (no --dp/--tp/--pp > 1, no --zero).
// TrainConfig::validate calls it.
void validate_cuda_graph(const TrainConfig& config, int world);

class CudaGraphStep {
 public:
  static constexpr int kWarmupSteps = 2;

  // Throws unless the model is on a CUDA device and `options` has no GradSync (one process). With dropout > 0 the
  // model's dropout context reads its step on the device until this object is destroyed.
  CudaGraphStep(nn::GPT& model, optim::AdamW& optimizer, const StepOptions& options);
  ~CudaGraphStep();

  // One step on `batch` (host i32/i64 ids and targets) at learning rate `lr`; StepResult as train_step's with
  // read_back false (pending until read()).
  StepResult step(const data::Batch& batch, double lr);
  // One step on samples [begin, begin + n) of `sampler`'s global batch of `step`, drawn on the device inside the
  // step (captured with it). Every call must use the same sampler, begin and n once the step is captured; the
  // sampler must outlive this object (the graph's kernels read its buffers).
  StepResult step(data::DeviceBatchSampler& sampler, int64_t step, int64_t begin, int64_t n, double lr);

  bool captured() const;
  int64_t steps() const { return steps_; }

 private:
  // The step shared by both inputs: `inputs` gives the step's device batch (run inside the capture), `targets`
  // its count of targets.
  StepResult run(const std::function<data::Batch()>& inputs, int64_t targets, double lr);

  nn::GPT& model_;
  optim::AdamW& optimizer_;
  StepOptions options_;
  Device device_;
  Tensor ids_, targets_;       // the static inputs (i64, on the device)
  int64_t target_count_ = -1;  // of the captured step
  Tensor lr_;                  // f64 {1} on the device: the learning rate every step's AdamW reads
  Tensor dropout_step_;        // i64 {1} on the device: the dropout masks' step (undefined without dropout)
  Tensor sample_step_;         // i64 {1} on the device: the step a DeviceBatchSampler draws (undefined: host batches)
  // The inputs of the captured step: a sampler's slice (sampler_ non-null) or the host batches' buffers above.
  const data::DeviceBatchSampler* sampler_ = nullptr;
  int64_t sample_begin_ = 0, sample_rows_ = 0;
  // The captured step: a handle of the backend's graph (core/device_backend.h), freed by the destructor.
  const DeviceBackend* backend_ = nullptr;
  std::unique_ptr<void, void (*)(void*)> graph_{nullptr, [](void*) {}};
  StepResult captured_;  // its on_device tensors are the graph's outputs
  int64_t steps_ = 0;
};

}  // namespace minidl::train
