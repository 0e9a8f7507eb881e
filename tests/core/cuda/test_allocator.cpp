// The caching stream-ordered allocator (steady state without cudaMalloc, 512-byte rounding, size classes, the cuda:0
// ledger, empty_cache), streams, events, the device guard, pinned buffers and MINIDL_CUDA_CHECK, on the emulator.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "cuda_test.h"
#include "core/tensor.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);

class CudaCore : public testing::CudaTest {};

TEST_F(CudaCore, SteadyStateMakesNoNewCudaMalloc) {
  const Shape shapes[] = {{7}, {128, 64}, {3, 1000}, {1}, {128, 64}};
  auto step = [&] {
    std::vector<Tensor> live;
    for (const Shape& s : shapes) live.push_back(Tensor::empty(s, DType::f32, kCuda));
    Tensor scratch = Tensor::zeros({512}, DType::bf16, kCuda);  // freed before the others
  };
  const cuda::AllocatorStats before = cuda::allocator_stats(0);
  step();
  const int64_t mallocs = cuda::allocator_stats(0).cuda_mallocs;
  for (int i = 0; i < 20; ++i) step();
  EXPECT_EQ(cuda::allocator_stats(0).cuda_mallocs, mallocs);
  EXPECT_EQ(cuda::allocator_stats(0).cuda_frees, before.cuda_frees);
  EXPECT_EQ(cuda::allocator_stats(0).allocated_bytes, before.allocated_bytes);
}

TEST_F(CudaCore, BlocksAreRoundedTo512Bytes) {
  size_t rounded = 0;
  void* p = cuda::allocate(1, 0, &rounded);
  EXPECT_EQ(rounded, 512u);
  cuda::free(p, 0);
  void* q = cuda::allocate(513, 0, &rounded);
  EXPECT_EQ(rounded, 1024u);
  cuda::free(q, 0);
  // 400 bytes reuse a cached 512-byte block.
  const int64_t mallocs = cuda::allocator_stats(0).cuda_mallocs;
  void* r = cuda::allocate(400, 0, &rounded);
  EXPECT_EQ(rounded, 512u);
  EXPECT_EQ(cuda::allocator_stats(0).cuda_mallocs, mallocs);
  cuda::free(r, 0);
}

TEST_F(CudaCore, BlocksComeInSizeClasses) {
  EXPECT_EQ(cuda::size_class(0), 512u);
  EXPECT_EQ(cuda::size_class(513), 1024u);
  EXPECT_EQ(cuda::size_class(4096), 4096u);
  EXPECT_EQ(cuda::size_class(4097), 4608u);        // 4096 + 4096 / 8
  EXPECT_EQ(cuda::size_class(1000000), 1048576u);  // a multiple of 2^19 / 8
  for (size_t n = 1; n < (size_t(1) << 30); n = n * 3 + 7) {
    const size_t c = cuda::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, std::max<size_t>(n + cuda::kBlockRound - 1, n + n / 8)) << n;
    EXPECT_EQ(c % cuda::kBlockRound, 0u) << n;
  }
  // A block of a class serves every request of that class; the ledger is charged the request's 512-byte rounding.
  size_t rounded = 0;
  void* p = cuda::allocate(600 * 1024, 0);
  cuda::free(p, 0);
  const int64_t mallocs = cuda::allocator_stats(0).cuda_mallocs;
  const int64_t live = ledger(kCuda).current(MemTag::kOther);
  void* q = cuda::allocate(600 * 1024 - 20000, 0, &rounded);  // both of class 655360
  EXPECT_EQ(cuda::allocator_stats(0).cuda_mallocs, mallocs);
  EXPECT_EQ(rounded, size_t(600 * 1024 - 20000 + 32));  // 1161 x 512
  EXPECT_EQ(ledger(kCuda).current(MemTag::kOther), live + int64_t(rounded));
  cuda::free(q, 0);
}

// A mixture of experts' rows per expert change every step. Steps of 6 tensors of random sizes between 400 and 800
// KB need at most 6 blocks of each size class those sizes fall in; a cache keyed by each rounded size kept a block
// per size ever seen (about 800 sizes here) until cudaMalloc failed.
TEST_F(CudaCore, ChangingShapesReuseBlocksOfTheirClass) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> floats(100'000, 200'000);
  std::set<size_t> classes;
  const cuda::AllocatorStats before = cuda::allocator_stats(0);
  for (int step = 0; step < 300; ++step) {
    std::vector<Tensor> live;
    for (int i = 0; i < 6; ++i) {
      live.push_back(Tensor::empty({floats(rng)}, DType::f32, kCuda));
      classes.insert(cuda::size_class(size_t(live.back().numel()) * 4));
    }
  }
  const cuda::AllocatorStats after = cuda::allocator_stats(0);
  EXPECT_EQ(classes.size(), 9u);  // 425984 to 524288 by 32768, 589824 to 851968 by 65536
  EXPECT_LE(after.cuda_mallocs - before.cuda_mallocs, 6 * 9);
  EXPECT_LE(after.cached_bytes - before.cached_bytes, 6 * 9 * 851968);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
}

TEST_F(CudaCore, LedgerCountsCurrentAndPeakPerTag) {
  MemoryLedger& l = ledger(kCuda);
  l.reset_peaks();
  const int64_t base = l.current(MemTag::kActivations), base_params = l.current(MemTag::kParams);
  {
    MemoryTagGuard tag(MemTag::kActivations);
    Tensor a = Tensor::empty({256}, DType::f32, kCuda);  // 1024 B
    Tensor b = Tensor::empty({100}, DType::f32, kCuda);  // 400 B -> 512 B
    EXPECT_EQ(l.current(MemTag::kActivations), base + 1536);
    { Tensor c = Tensor::empty({512}, DType::f32, kCuda); }  // 2048 B, freed at once
    EXPECT_EQ(l.current(MemTag::kActivations), base + 1536);
    EXPECT_EQ(l.peak(MemTag::kActivations), base + 3584);
    MemoryTagGuard params(MemTag::kParams);
    Tensor w = Tensor::zeros({128}, DType::f32, kCuda);
    EXPECT_EQ(l.current(MemTag::kParams), base_params + 512);
    EXPECT_EQ(l.current(MemTag::kActivations), base + 1536);
  }
  EXPECT_EQ(l.current(MemTag::kActivations), base);
  EXPECT_EQ(l.current(MemTag::kParams), base_params);
  EXPECT_EQ(l.peak(MemTag::kActivations), base + 3584);
  EXPECT_EQ(ledger().current(MemTag::kActivations), 0) << "device bytes must not reach the CPU ledger";
}

TEST_F(CudaCore, EmptyCacheReturnsCachedBlocks) {
  { Tensor t = Tensor::empty({1 << 16}, DType::f32, kCuda); }
  EXPECT_GE(cuda::allocator_stats(0).cached_bytes, int64_t(1) << 18);
  const int64_t frees = cuda::allocator_stats(0).cuda_frees;
  cuda::empty_cache();
  EXPECT_EQ(cuda::allocator_stats(0).cached_bytes, 0);
  EXPECT_GT(cuda::allocator_stats(0).cuda_frees, frees);
}

TEST_F(CudaCore, StreamsEventsGuardAndPinnedMemory) {
  EXPECT_GE(cuda::device_count(), 1);
  cudaStream_t s = cuda::current_stream(0);
  EXPECT_NE(s, nullptr);
  EXPECT_EQ(cuda::current_stream(0), s);
  { cuda::DeviceGuard guard(0); }

  cuda::PinnedBuffer pinned(64 * sizeof(float));
  for (int i = 0; i < 64; ++i) pinned.as<float>()[i] = float(i);
  Tensor d = Tensor::empty({64}, DType::f32, kCuda);
  cuda::Event start, end;
  start.record(s);
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(d.device_data<float>(), pinned.data(), pinned.bytes(), cudaMemcpyHostToDevice, s));
  end.record(s);
  end.wait(s);
  end.synchronize();
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  EXPECT_EQ(d.to_vector()[63], 63.0);

  cuda::PinnedBuffer moved = std::move(pinned);
  EXPECT_EQ(pinned.data(), nullptr);
  EXPECT_EQ(moved.bytes(), 64 * sizeof(float));
}

TEST_F(CudaCore, CudaCheckNamesTheCallTheErrorTheRankAndTheLine) {
  int not_allocated = 0;
  try {
    MINIDL_CUDA_CHECK(cudaFree(&not_allocated));
    ADD_FAILURE() << "expected minidl::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaFree(&not_allocated) failed"), std::string::npos) << m;
    EXPECT_NE(m.find("(cudaError"), std::string::npos) << m;  // CUDA's error name
    EXPECT_NE(m.find("test_allocator.cpp:"), std::string::npos) << m;
  }
  (void)cudaGetLastError();
  detail::set_process_rank(3);
  try {
    cuda::DeviceGuard guard(cuda::device_count());  // one past the last device
    ADD_FAILURE() << "expected minidl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaSetDevice(device) failed on rank 3"), std::string::npos) << e.what();
  }
  (void)cudaGetLastError();
  detail::set_process_rank(-1);
}

}  // namespace
}  // namespace minidl
