// What the multi-rank steps on the (emulated) CUDA device share (tests/train/test_tp_device.cpp,
// test_pipeline_device.cpp): the tiny GPT, its batches and step options, a fixture base that runs at 2 or 4 MPI
// ranks, and the one-process reference that accumulates over the same micro-batches on the same device.
//
//   class MyOnDevice : public testing::DistDeviceTest {
//     void SetUp() override {
//       set_up_ranks("pp 2 (x dp 2): runs at 2 and 4 ranks");
//       if (IsSkipped()) return;
//       ...  // device_ is this rank's device
//     }
//   };
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/cuda_test.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "support/mpi_test.h"
#include "train/step.h"

namespace minidl::testing {

// Vocabulary 17 (9 rows per tp rank, the last one padding); head dimension 16, the CUDA attention's smallest.
inline const nn::GPTConfig kTinyDeviceGpt{17, 8, 2, 2, 32, 0.0, true};

// (rows, seq) ids and targets below 17, shifted by `shift`; ignore_one: target 3 is -1 (ignored, not counted).
inline data::Batch tiny_device_batch(int64_t rows, int64_t seq, int shift, bool ignore_one) {
  std::vector<int32_t> ids(size_t(rows * seq)), targets(size_t(rows * seq));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t((i * 7 + size_t(shift)) % 17), targets[i] = int32_t((i * 5 + size_t(shift)) % 17);
  if (ignore_one) targets[3] = -1;
  return {Tensor::from_vector(ids, {rows, seq}), Tensor::from_vector(targets, {rows, seq})};
}

// lr 1e-2 with the clip at 0.05, below the norm (so it is applied); fp16: f16 autocast with `scaler`.
inline train::StepOptions tiny_step_options(bool fp16, bool read_back, optim::GradScaler& scaler) {
  train::StepOptions o;
  o.lr = 1e-2;
  o.grad_clip = 0.05;
  o.read_back = read_back;
  if (fp16) {
    o.amp = DType::f16;
    o.scaler = &scaler;
  }
  return o;
}

class DistDeviceTest : public CudaTest {
 protected:
  // Skips (IsSkipped() is then true) without a device or at other than 2 or 4 ranks, saying `what` runs; sets
  // device_ otherwise.
  void set_up_ranks(const char* what) {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    const dist::Context& ctx = mpi_context();
    if (ctx.world_size() != 2 && ctx.world_size() != 4) GTEST_SKIP() << what;
    device_ = Device::cuda(ctx.rank() % cuda::device_count());  // on the emulator every rank shares device 0
  }

  // One process, the whole model on device_, the losses of `steps` steps (read back) accumulating over
  // `grad_accum` micro-batches of batch(step).
  template <class BatchFn>
  std::vector<double> one_process(bool fp16, int steps, int grad_accum, BatchFn batch) {
    nn::GPT model(kTinyDeviceGpt, 1337);
    model.to(device_);
    model.train();
    optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-2});
    optim::GradScaler scaler;
    train::StepOptions o = tiny_step_options(fp16, true, scaler);
    o.micro_batches = grad_accum;
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(train::train_step(model, opt, batch(s), o).loss);
    return losses;
  }

  Device device_;
};

// A steady-state device step's counters: no device allocation, no host wait, no read-back, and `uploads` copies to
// the device (0 for a batch drawn on the device).
inline void expect_no_round_trip(const cuda::Counters& c, int64_t uploads) {
  EXPECT_EQ(c.device_mallocs, 0);
  EXPECT_EQ(c.host_syncs, 0);
  EXPECT_EQ(c.d2h_copies, 0);
  EXPECT_EQ(c.h2d_copies, uploads);
}

}  // namespace minidl::testing
