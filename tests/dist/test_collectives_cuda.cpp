// The device backends against the "mpi" backend on the host: every collective of "nccl", and of "ring" on a CUDA
// device (NCCL point-to-point plus dist's reduction kernels), must give the bytes that MPI gives on the same
// integer-valued data, for every dtype, reduction and awkward element count, at world sizes 1-4. Runs on the
// emulated CUDA backend (minidl_cuda_backend_emu), where NCCL is dist/cuda/nccl_emu's MPI version.
#include <gtest/gtest.h>
#include <nccl.h>  // dist/cuda/nccl_emu's, in this emulated build: minidl_nccl_emu_communicators_created

#include <cstring>
#include <random>

#include "core/cuda/cuda.h"
#include "dist/cuda/backend.h"
#include "dist_test_util.h"

namespace minidl::testing {
namespace {

using dist::ReduceOp;

const Device kDevice = Device::cuda(0);

std::vector<uint8_t> host_bytes(const Tensor& t) {
  Tensor host = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(host.raw_data());
  return std::vector<uint8_t>(p, p + host.nbytes());
}

// "nccl", the ring on the device with its default 512 KiB slices, and with 256-byte slices (many per chunk).
std::vector<std::string> device_configs() { return {"nccl", "ring", "ring_small_slices"}; }

class DeviceCollectives : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    cuda::register_backend();
    if (GetParam() == "nccl")
      group_ = dist::make_process_group("nccl", MPI_COMM_WORLD, kDevice);
    else
      group_ = std::make_unique<dist::RingProcessGroup>(
          MPI_COMM_WORLD, kDevice, GetParam() == "ring" ? dist::RingOptions{} : dist::RingOptions{256});
    reference_ = std::make_unique<dist::MpiProcessGroup>(MPI_COMM_WORLD);
  }
  int rank() const { return group_->rank(); }
  int n() const { return group_->size(); }
  std::unique_ptr<dist::ProcessGroup> group_, reference_;
};

TEST_P(DeviceCollectives, AllReduceEqualsMpi) {
  for (DType dtype : kAllDTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      for (int64_t numel : {int64_t(0), int64_t(1), int64_t(n() - 1), 7 * int64_t(n()) + 1, int64_t(1001)}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << dist::reduce_op_name(op) << " numel " << numel);
        Tensor expected = pattern_tensor(rank(), numel, dtype);
        Tensor t = expected.to(kDevice);
        reference_->all_reduce(expected, op)->wait();
        group_->all_reduce(t, op)->wait();
        EXPECT_EQ(host_bytes(t), host_bytes(expected));
      }
}

TEST_P(DeviceCollectives, ReduceScatterEqualsMpi) {
  for (DType dtype : kAllDTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      for (int64_t per_rank : {int64_t(0), int64_t(1), int64_t(13), int64_t(301)}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << dist::reduce_op_name(op) << " per rank " << per_rank);
        Tensor input = pattern_tensor(rank(), per_rank * n(), dtype);
        Tensor expected = Tensor::full({per_rank}, -1.0, dtype);
        Tensor input_d = input.to(kDevice), output_d = expected.to(kDevice);
        reference_->reduce_scatter(expected, input, op)->wait();
        group_->reduce_scatter(output_d, input_d, op)->wait();
        EXPECT_EQ(host_bytes(output_d), host_bytes(expected));
        EXPECT_EQ(host_bytes(input_d), host_bytes(input)) << "input changed";
      }
}

TEST_P(DeviceCollectives, AllGatherEqualsMpi) {
  for (DType dtype : kAllDTypes)
    for (int64_t per_rank : {int64_t(0), int64_t(1), int64_t(13), int64_t(3001)}) {
      SCOPED_TRACE(::testing::Message() << dtype << " per rank " << per_rank);
      Tensor input = pattern_tensor(rank(), per_rank, dtype);
      Tensor expected = Tensor::full({n(), per_rank}, -1.0, dtype);
      Tensor input_d = input.to(kDevice), output_d = expected.to(kDevice);
      reference_->all_gather(expected, input)->wait();
      group_->all_gather(output_d, input_d)->wait();
      EXPECT_EQ(host_bytes(output_d), host_bytes(expected));
    }
}

TEST_P(DeviceCollectives, BroadcastEqualsMpi) {
  for (DType dtype : kAllDTypes)
    for (int root = 0; root < n(); ++root)
      for (int64_t numel : {int64_t(0), int64_t(1), int64_t(1001)}) {
        SCOPED_TRACE(::testing::Message() << dtype << " root " << root << " numel " << numel);
        Tensor expected = pattern_tensor(rank(), numel, dtype);
        Tensor t = expected.to(kDevice);
        reference_->broadcast(expected, root)->wait();
        group_->broadcast(t, root)->wait();
        EXPECT_EQ(host_bytes(t), host_bytes(expected));
      }
}

// Random integer-valued floats: every sum is exact, so any reduction order gives MPI's bits; large enough that
// the ring's chunks travel as several default slices.
TEST_P(DeviceCollectives, BitwiseEqualOnIntegerValuedFloats) {
  std::mt19937 rng(1234 + rank());
  std::uniform_int_distribution<int> value(-1000, 1000);
  for (int64_t numel : {int64_t(n() + 1), int64_t(12345), int64_t(300001)})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      SCOPED_TRACE(::testing::Message() << dist::reduce_op_name(op) << " numel " << numel);
      std::vector<float> v(numel);
      for (float& x : v) x = float(value(rng));
      Tensor expected = Tensor::from_vector(v, {numel});
      Tensor t = expected.to(kDevice);
      reference_->all_reduce(expected, op)->wait();
      group_->all_reduce(t, op)->wait();
      EXPECT_EQ(host_bytes(t), host_bytes(expected));
    }
}

// ZeRO's layout on the device: the shard is a view into the flat buffer that the collective fills or reads.
TEST_P(DeviceCollectives, OutputMayAliasInput) {
  const int64_t per_rank = 37;
  Tensor flat = Tensor::zeros({per_rank * n()}, DType::f32, kDevice);
  Tensor shard = flat.as_strided({per_rank}, {1}, rank() * per_rank);
  shard.copy_(pattern_tensor(rank(), per_rank, DType::f32));
  group_->all_gather(flat, shard)->wait();
  std::vector<double> got = flat.to_vector();
  int64_t wrong = 0;
  for (int r = 0; r < n(); ++r)
    for (int64_t i = 0; i < per_rank; ++i) wrong += got[r * per_rank + i] != pattern(r, i);
  EXPECT_EQ(wrong, 0);

  Tensor grads = pattern_tensor(rank(), per_rank * n(), DType::f32).to(kDevice);
  Tensor grad_shard = grads.as_strided({per_rank}, {1}, rank() * per_rank);
  group_->reduce_scatter(grad_shard, grads, ReduceOp::kSum)->wait();
  got = grad_shard.to_vector();
  wrong = 0;
  for (int64_t i = 0; i < per_rank; ++i)
    wrong += got[i] != expected_reduction(ReduceOp::kSum, n(), rank() * per_rank + i, DType::f32);
  EXPECT_EQ(wrong, 0);
}

// Each rank sends to its right neighbour and receives from its left, both posted before either is waited on.
TEST_P(DeviceCollectives, SendRecvAroundTheRing) {
  const int right = (rank() + 1) % n(), left = (rank() + n() - 1) % n();
  for (DType dtype : kAllDTypes)
    for (int64_t numel : {int64_t(0), int64_t(1), int64_t(10003)}) {
      SCOPED_TRACE(::testing::Message() << dtype << " numel " << numel);
      Tensor out = pattern_tensor(rank(), numel, dtype).to(kDevice);
      Tensor in = Tensor::zeros({numel}, dtype, kDevice);
      auto r = group_->recv(in, left, 5);
      auto s = group_->send(out, right, 5);
      while (!r->is_completed()) {}
      s->wait();
      EXPECT_EQ(host_bytes(in), host_bytes(pattern_tensor(left, numel, dtype)));
    }
}

// all_to_all with counts per peer (random, with zeros; all zero; one rank silent) against MPI_Alltoallv's result on
// the host, every dtype: "nccl" as one NCCL group of sends and receives, the ring on the device pairwise.
TEST_P(DeviceCollectives, AllToAllEqualsMpi) {
  for (int pattern = 0; pattern < 3; ++pattern)
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype << " pattern " << pattern);
      std::mt19937 rng(uint32_t(17 * rank() + pattern));
      std::vector<int64_t> send(static_cast<size_t>(n()));
      for (int j = 0; j < n(); ++j) send[size_t(j)] = pattern == 1 || (pattern == 2 && rank() == 0) ? 0 : rng() % 6;
      Tensor sc = Tensor::from_vector(std::vector<double>(send.begin(), send.end()), {n()}, DType::i64);
      Tensor rc = Tensor::empty({n()}, DType::i64);
      const std::vector<int64_t> ones(size_t(n()), 1);
      reference_->all_to_all(rc, sc, ones, ones)->wait();
      std::vector<int64_t> recv;
      int64_t total_send = 0, total_recv = 0;
      for (double c : rc.to_vector()) recv.push_back(int64_t(c)), total_recv += int64_t(c);
      for (int64_t c : send) total_send += c;
      const Tensor in = pattern_tensor(rank(), total_send, dtype);
      Tensor expected = Tensor::empty({total_recv}, dtype), out = Tensor::empty({total_recv}, dtype, kDevice);
      reference_->all_to_all(expected, in, send, recv)->wait();
      group_->all_to_all(out, in.to(kDevice), send, recv)->wait();
      EXPECT_EQ(host_bytes(out), host_bytes(expected));
    }
}

TEST_P(DeviceCollectives, BarrierCompletes) {
  for (int i = 0; i < 3; ++i) {
    auto work = group_->barrier();
    work->wait();
    EXPECT_TRUE(work->is_completed());
  }
}

TEST_P(DeviceCollectives, RejectsHostTensors) {
  EXPECT_EQ(group_->device(), kDevice);
  Tensor host = Tensor::zeros({4});
  try {
    group_->all_reduce(host, ReduceOp::kSum);
    ADD_FAILURE() << "all_reduce of a CPU tensor did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected a tensor on cuda:0"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceCollectives, ::testing::ValuesIn(device_configs()),
                         [](const auto& info) { return info.param; });

// Groups over sub-communicators: the even and the odd world ranks, numbered in reverse, so that the rank that makes
// the NCCL id is neither world rank 0 nor the same process in both groups, and the two groups start at once.
TEST(DeviceSubgroups, EvenAndOddRanksReduceSeparately) {
  cuda::register_backend();
  const int world_rank = mpi_context().rank();
  MPI_Comm half;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &half), MPI_SUCCESS);
  {
    dist::MpiProcessGroup reference(half);
    auto nccl = dist::make_process_group("nccl", half, kDevice);
    dist::RingProcessGroup ring(half, kDevice, dist::RingOptions{256});
    EXPECT_EQ(nccl->size(), reference.size());
    EXPECT_EQ(nccl->rank(), reference.rank());
    Tensor expected = pattern_tensor(world_rank, 1001, DType::i64);
    Tensor a = expected.to(kDevice), b = expected.to(kDevice);
    reference.all_reduce(expected, ReduceOp::kSum)->wait();
    nccl->all_reduce(a, ReduceOp::kSum)->wait();
    ring.all_reduce(b, ReduceOp::kSum)->wait();
    EXPECT_EQ(host_bytes(a), host_bytes(expected));
    EXPECT_EQ(host_bytes(b), host_bytes(expected));
  }
  MPI_Comm_free(&half);
}

// A group of one (MPI_COMM_SELF, at every world size) makes no NCCL communicator, and its collectives are the
// input itself: what a single-process run on a GPU does (no NCCL bootstrap, which opens sockets and device buffers).
TEST(DeviceGroupOfOne, MakesNoCommunicatorAndEveryCollectiveIsItsInput) {
  cuda::register_backend();
  const int made_before = minidl_nccl_emu_communicators_created();
  {
    auto nccl = dist::make_process_group("nccl", MPI_COMM_SELF, kDevice);
    ASSERT_EQ(nccl->size(), 1);
    const Tensor want = pattern_tensor(3, 1001, DType::f32);
    Tensor t = want.to(kDevice);
    nccl->all_reduce(t, ReduceOp::kAvg)->wait();
    nccl->broadcast(t, 0)->wait();
    EXPECT_EQ(host_bytes(t), host_bytes(want));
    Tensor scattered = Tensor::zeros({1001}, DType::f32, kDevice),
           gathered = Tensor::zeros({1001}, DType::f32, kDevice);
    nccl->reduce_scatter(scattered, t, ReduceOp::kSum)->wait();
    nccl->all_gather(gathered, scattered)->wait();
    EXPECT_EQ(host_bytes(scattered), host_bytes(want));
    EXPECT_EQ(host_bytes(gathered), host_bytes(want));
    Tensor received = Tensor::zeros({1001}, DType::f32, kDevice);
    auto r = nccl->recv(received, 0, 1);
    nccl->send(t, 0, 1)->wait();
    r->wait();
    EXPECT_EQ(host_bytes(received), host_bytes(want));
    nccl->barrier()->wait();
  }
  EXPECT_EQ(minidl_nccl_emu_communicators_created(), made_before) << "a group of one made an NCCL communicator";
}

// Without the CUDA backend's registration, "nccl" and the device ring fail saying what to link.
TEST(DeviceBackendRegistration, MissingBackendsSayWhatToLink) {
  cuda::register_backend();
  dist::register_process_group_factory("nccl", nullptr);
  dist::register_ring_transport_factory(DeviceKind::kCUDA, nullptr);
  auto message_of = [](auto&& make) {
    try {
      make();
    } catch (const Error& e) { return std::string(e.what()); }
    return std::string("(no error)");
  };
  std::string nccl = message_of([] { dist::make_process_group("nccl", MPI_COMM_WORLD); });
  std::string ring = message_of([] { dist::make_process_group("ring", MPI_COMM_WORLD, kDevice); });
  cuda::register_backend();  // restores both
  EXPECT_NE(nccl.find("this build has no NCCL backend: link minidl_cuda_backend"), std::string::npos) << nccl;
  EXPECT_NE(ring.find("no device transport for the ring"), std::string::npos) << ring;
  EXPECT_THROW(dist::make_process_group("mpi", MPI_COMM_WORLD, kDevice), Error);
  EXPECT_THROW(dist::make_process_group("gloo", MPI_COMM_WORLD), Error);
  // The default device of "nccl": this rank's local rank modulo the devices (the emulator has one).
  EXPECT_EQ(dist::make_process_group("nccl", MPI_COMM_WORLD)->device(), kDevice);
}

}  // namespace
}  // namespace minidl::testing
