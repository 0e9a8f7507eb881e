#include "train/batches.h"

#include <chrono>

#include "core/trace.h"

namespace minidl::train {

Batches::Batches(const data::TextDataset& ds, const Stage& stage, const TrainConfig& o, int64_t seq, int64_t first,
                 int64_t n)
    : first_(first), n_(n) {
  if (!ds.train_shards().empty())
    streamed_.emplace(ds.train_shards(), seq, o.batch, o.seed, ds.tokenizer().size());
  else if (stage.device().is_cuda())
    on_device_.emplace(device_sampler(stage.chunk(0), ds.train(), seq, o.batch, o.seed));
  else
    in_memory_.emplace(ds.train(), seq, o.batch, o.seed);
}

StepResult Batches::step(Stage& stage, optim::Optimizer& optimizer, int64_t step, StepOptions so) {
  if (graph_) return graph_->step(*on_device_, step, first_, n_, so.lr);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<trace::Span> span(std::in_place, "data");
  const data::Batch b = on_device_   ? draw_checked(*on_device_, step, first_, n_, so)
                        : in_memory_ ? in_memory_->batch(step, first_, n_)
                                     : streamed_->batch(step, first_, n_);
  data_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  span.reset();
  return train_step(stage, optimizer, b, so);
}

void Batches::capture(Stage& stage, optim::AdamW& optimizer, StepOptions so) {
  so.grad_sync = &GradSync::one_process();  // one process: nothing to synchronise
  so.micro_batches = stage.spec().micro_batches;
  graph_ = std::make_unique<CudaGraphStep>(stage.chunk(0), optimizer, so);
}

}  // namespace minidl::train
