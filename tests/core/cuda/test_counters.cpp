// The CUDA backend's counters (cuda::counters(), core/cuda/cuda.h): a known sequence of copies, a kernel, a
// synchronization and allocations is counted exactly, on the emulator and on a GPU alike.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test.h"
#include "core/tensor.h"
#include "ops/elementwise.h"

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

}  // namespace
}  // namespace minidl
