#include "train/cuda_graph.h"

#include "core/device_backend.h"
#include "core/upload.h"
#include "ops/cast.h"
#include "train/trainer.h"

namespace minidl::train {

namespace {

int64_t counted_targets(const Tensor& y) {
  int64_t n = 0;
  for (double v : y.to_vector()) n += v != -1.0;
  return n;
}

Device model_device(nn::GPT& model) {
  const Device d = model.parameters().front().device();
  MINIDL_CHECK(d.is_cuda(), "--cuda-graph: expected a model on a CUDA device, got ", d);
  return d;
}

}  // namespace

void validate_cuda_graph(const TrainConfig& c, int world) {
  MINIDL_CHECK(c.device.rfind("cuda", 0) == 0, "--cuda-graph: expected --device cuda, got --device ", c.device);
  MINIDL_CHECK(world == 1 && c.dp <= 1 && c.tp == 1 && c.pp == 1 && c.zero == 0,
               "--cuda-graph: expected one "
               "process without --dp/--tp/--pp/--zero (the collectives are not captured), got ",
               world,
               " ranks, "
               "--dp ",
               c.dp, " --tp ", c.tp, " --pp ", c.pp, " --zero ", c.zero);
}

CudaGraphStep::CudaGraphStep(nn::GPT& model, optim::AdamW& optimizer, const StepOptions& options)
    : model_(model), optimizer_(optimizer), options_(options), device_(model_device(model)) {
  backend_ = find_device_backend(DeviceKind::kCUDA);
  MINIDL_CHECK(backend_ && backend_->graph_capture, "--cuda-graph: this program's CUDA backend cannot capture graphs");
  MINIDL_CHECK(options.grad_sync->name() == "none",
               "--cuda-graph: expected one process without a gradient "
               "synchronisation (dp = tp = pp = 1, no ZeRO)");
  options_.read_back = false;
  optimizer_.keep_step_count_on(device_);
  lr_ = Tensor::zeros({1}, DType::f64, device_);
  optimizer_.read_lr_from(lr_);
  if (model.config().dropout > 0.0) {
    // The masks' step is read on the device (nn::DropoutContext::step_on_device), written before each step.
    dropout_step_ = Tensor::zeros({1}, DType::i64, device_);
    model_.dropout_context().step_on_device = dropout_step_;
  }
}

CudaGraphStep::~CudaGraphStep() {
  if (dropout_step_.defined()) model_.dropout_context().step_on_device = Tensor();
}
bool CudaGraphStep::captured() const { return graph_ != nullptr; }

StepResult CudaGraphStep::step(const data::Batch& batch, double lr) {
  MINIDL_CHECK(batch.x.shape() == batch.y.shape() && batch.x.dim() == 2,
               "--cuda-graph: expected ids and targets "
               "of one shape (B, T), got ",
               batch.x.shape(), " and ", batch.y.shape());
  MINIDL_CHECK(batch.x.device().is_cpu() && batch.y.device().is_cpu(), "--cuda-graph: expected a host batch, got ",
               batch.x.device());
  MINIDL_CHECK(!(captured() && sampler_),
               "--cuda-graph: the captured step draws its batch from a sampler; a host "
               "batch cannot replace it");
  model_.check_ids(batch.x, "token ids", false);
  model_.check_ids(batch.y, "targets", true);
  const int64_t targets = counted_targets(batch.y);
  if (!ids_.defined()) {
    MemoryTagGuard tag(MemTag::kActivations);
    ids_ = Tensor::empty(batch.x.shape(), DType::i64, device_);
    targets_ = Tensor::empty(batch.y.shape(), DType::i64, device_);
  }
  MINIDL_CHECK(batch.x.shape() == ids_.shape(), "--cuda-graph: every batch must have the shape ", ids_.shape(),
               " of the first, got ", batch.x.shape());
  upload_async(ids_, ops::cast(batch.x.contiguous(), DType::i64));
  upload_async(targets_, ops::cast(batch.y.contiguous(), DType::i64));
  const data::Batch on_device{ids_, targets_};
  return run([&] { return on_device; }, targets, lr);
}

StepResult CudaGraphStep::step(data::DeviceBatchSampler& sampler, int64_t step, int64_t begin, int64_t n, double lr) {
  MINIDL_CHECK(sampler.device() == device_, "--cuda-graph: expected a sampler on the model's device ", device_,
               ", got ", sampler.device());
  MINIDL_CHECK(step >= 0, "--cuda-graph: expected step >= 0, got ", step);
  if (!sample_step_.defined()) sample_step_ = Tensor::zeros({1}, DType::i64, device_);
  if (captured()) {
    MINIDL_CHECK(sampler_ == &sampler && begin == sample_begin_ && n == sample_rows_,
                 "--cuda-graph: the batch's "
                 "sampler and slice are part of the captured step and must stay samples [",
                 sample_begin_, ", ", sample_begin_ + sample_rows_, "), got [", begin, ", ", begin + n, ")");
  } else {
    sampler_ = &sampler, sample_begin_ = begin, sample_rows_ = n;
  }
  sample_step_.fill_(double(step));  // a fill kernel, like the learning rate: the captured sampling reads it
  return run([&] { return sampler.batch(sample_step_, begin, n); }, n * sampler.seq(), lr);
}

StepResult CudaGraphStep::run(const std::function<data::Batch()>& inputs, int64_t targets, double lr) {
  StepOptions o = options_;
  o.lr = lr;
  o.target_count = targets;
  o.batch_checked = true;  // a host batch was checked before its upload, a sampler's split when it was made
  lr_.fill_(lr);           // a fill kernel with the value as its argument: no copy (AdamW reads it when the step runs)
  nn::DropoutContext& dropout = model_.dropout_context();
  const uint64_t dropout_step = dropout.step;
  // Likewise the dropout step (exact in a double below 2^53 steps).
  if (dropout_step_.defined()) dropout_step_.fill_(double(dropout_step));
  ++steps_;
  if (steps_ <= kWarmupSteps) return train_step(model_, optimizer_, inputs(), o);
  if (!graph_) {
    target_count_ = targets;
    graph_ = {backend_->graph_capture(device_.index,
                                      [&] {
                                        optimizer_.count_next_step_on_device();
                                        captured_ = train_step(model_, optimizer_, inputs(), o);
                                      }),
              backend_->graph_destroy};
  }
  MINIDL_CHECK(targets == target_count_,
               "--cuda-graph: the batch's count of targets is part of the captured step "
               "and must stay ",
               target_count_, ", got ", targets, " at step ", steps_);
  backend_->graph_replay(graph_.get());
  dropout.step = dropout_step + 1;  // what train_step does on the host (the capture's call did it once)
  return captured_;
}

}  // namespace minidl::train
