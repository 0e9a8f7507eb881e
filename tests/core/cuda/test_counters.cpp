// The CUDA backend's counters (cuda::counters(), core/cuda/cuda.h): a known sequence of copies, a kernel, a
// synchronization and allocations is counted exactly, on the emulator and on a GPU alike.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test.h"
#include "core/tensor.h"
#include "core/upload.h"
#include "nn/gpt.h"
#include "ops/elementwise.h"
#include "optim/adamw.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);

class CudaCounters : public testing::CudaTest {};

TEST_F(CudaCounters, CountCopiesLaunchesSyncsAndAllocations) {
  const Tensor host = Tensor::from_vector(std::vector<float>(1000, 1.5f), {1000});
  cuda::reset_counters();
  Tensor x = host.to(kCuda);  // one host -> device copy of 4000 bytes
  cuda::Counters c = cuda::counters();
  EXPECT_EQ(c.h2d_copies, 1);
  EXPECT_EQ(c.h2d_bytes, 4000);
  EXPECT_EQ(c.kernel_launches, 0);
  EXPECT_EQ(c.d2h_copies, 0);

  const cuda::Counters before_add = cuda::counters();
  Tensor y = ops::add(x, x);  // one elementwise kernel
  c = cuda::counters() - before_add;
  EXPECT_EQ(c.kernel_launches, 1);
  EXPECT_EQ(c.host_syncs, 0);
  EXPECT_EQ(c.h2d_copies + c.d2h_copies + c.d2d_copies, 0);

  const cuda::Counters before_sync = cuda::counters();
  cuda::Event done;
  done.record(cuda::current_stream(0));
  done.synchronize();  // one host synchronization
  EXPECT_EQ((cuda::counters() - before_sync).host_syncs, 1);

  const cuda::Counters before_read = cuda::counters();
  const std::vector<double> values = y.to_vector();  // one device -> host copy, waited for
  c = cuda::counters() - before_read;
  EXPECT_EQ(values[999], 3.0);
  EXPECT_EQ(c.d2h_copies, 1);
  EXPECT_EQ(c.d2h_bytes, 4000);
  EXPECT_EQ(c.host_syncs, 1);

  // A size no other test asks for: the first block is a cudaMalloc, the second comes from the cache.
  const cuda::Counters before_alloc = cuda::counters();
  void* p = cuda::allocate(777 * cuda::kBlockRound, 0);
  cuda::free(p, 0);
  void* q = cuda::allocate(777 * cuda::kBlockRound, 0);
  cuda::free(q, 0);
  EXPECT_EQ((cuda::counters() - before_alloc).device_mallocs, 1);

  cuda::reset_counters();
  c = cuda::counters();
  EXPECT_EQ(c.kernel_launches + c.host_syncs + c.h2d_bytes + c.d2h_bytes + c.device_mallocs, 0);
}

TEST_F(CudaCounters, FillOnTheDeviceCopiesNothing) {
  cuda::reset_counters();
  Tensor a = Tensor::full({37}, 1.5, DType::f32, kCuda);  // a fill kernel (its bytes differ)
  Tensor b = Tensor::full({5}, -3, DType::i64, kCuda);
  Tensor c = Tensor::ones({9}, DType::bf16, kCuda);
  Tensor z = Tensor::full({6}, 2.0, DType::f32, kCuda);
  z.zero_();  // a memset
  const cuda::Counters counted = cuda::counters();
  EXPECT_EQ(counted.h2d_copies + counted.d2h_copies + counted.host_syncs, 0);
  EXPECT_EQ(counted.kernel_launches, 4);
  EXPECT_EQ(counted.memsets, 1);
  EXPECT_EQ(a.to_vector(), std::vector<double>(37, 1.5));
  EXPECT_EQ(b.to_vector(), std::vector<double>(5, -3.0));
  EXPECT_EQ(c.to_vector(), std::vector<double>(9, 1.0));
  EXPECT_EQ(z.to_vector(), std::vector<double>(6, 0.0));
  Tensor strided = Tensor::zeros({4, 6}, DType::f32, kCuda).transpose(0, 1);  // not contiguous: through the host
  strided.fill_(2.0);
  EXPECT_EQ(strided.to_vector(), std::vector<double>(24, 2.0));
}

// upload_async copies through a pinned staging ring: one host -> device copy each, no host wait, and the source may
// be overwritten as soon as the call returns (more uploads than the ring has buffers, each checked after).
TEST_F(CudaCounters, UploadAsyncCopiesWithoutWaiting) {
  std::vector<Tensor> dst;
  std::vector<float> values(300);
  Tensor src = Tensor::empty({300}, DType::f32);
  cuda::reset_counters();
  for (int k = 0; k < 20; ++k) {
    for (size_t i = 0; i < values.size(); ++i) src.data<float>()[i] = float(k * 1000 + int(i));
    dst.push_back(Tensor::empty({300}, DType::f32, kCuda));
    upload_async(dst.back(), src);
  }
  const cuda::Counters c = cuda::counters();
  EXPECT_EQ(c.h2d_copies, 20);
  EXPECT_EQ(c.h2d_bytes, 20 * 300 * 4);
#if defined(MINIDL_TEST_EMULATED_CUDA)
  EXPECT_EQ(c.host_syncs, 0);  // each buffer's copy is done when it comes round again
#else
  EXPECT_LE(c.host_syncs, 20 - 8);  // a GPU may still be copying out of a buffer the ring comes back to
#endif
  EXPECT_EQ(c.d2h_copies, 0);
  for (int k = 0; k < 20; ++k) {
    const std::vector<double> got = dst[size_t(k)].to_vector();
    EXPECT_EQ(got.front(), k * 1000.0);
    EXPECT_EQ(got.back(), k * 1000.0 + 299);
  }
  EXPECT_THROW(upload_async(dst.front(), Tensor::empty({299}, DType::f32)), Error);
}

// A steady-state training step on the device (forward from a host batch, backward, AdamW, zero_grad, no loss read):
// no cudaMalloc, nothing read back, no host wait, and only the batch's upload (ids and targets, asynchronous copies
// from pinned staging) crosses to the device. train::train_step with clipping and fp16 loss scaling adds nothing to
// that when its numbers are not read back (tests/train/test_device_step.cpp; docs/decisions.md, "No host round trips in
// a device step").
TEST_F(CudaCounters, SteadyStateTrainingStepMakesNoRoundTrip) {
  nn::GPT model(nn::GPTConfig{17, 8, 2, 2, 32, 0.0, true}, 1337);
  model.to(kCuda);
  model.train();
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {1e-3});
  std::vector<int32_t> ids(2 * 8), targets(2 * 8);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 % 17), targets[i] = int32_t(i * 5 % 17);
  const Tensor x = Tensor::from_vector(ids, {2, 8}), y = Tensor::from_vector(targets, {2, 8});
  auto step = [&] {
    Tensor loss = model.loss(x, y, Reduction::kSum);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  step();
  step();  // the allocator's cache and the position ids are warm
  const cuda::Counters before = cuda::counters();
  step();
  const cuda::Counters c = cuda::counters() - before;
  EXPECT_EQ(c.device_mallocs, 0);
  EXPECT_EQ(c.d2h_copies, 0);
  EXPECT_EQ(c.h2d_copies, 2);             // ids and targets
  EXPECT_EQ(c.h2d_bytes, 2 * 2 * 8 * 8);  // as i64
  EXPECT_EQ(c.host_syncs, 0);             // GPT::loss uploads them through pinned staging (core/upload.h)
  EXPECT_GT(c.kernel_launches, 0);
}

}  // namespace
}  // namespace minidl
