// NcclTransport: an NCCL communicator on one CUDA device, with its own communication stream, bootstrapped through
// MPI; and, as a RingTransport, NCCL point-to-point on device tensors, so the ring collectives of
// dist/ring_backend.cpp run on the GPU unchanged. NcclProcessGroup (nccl_backend.h) uses the same communicator for
// NCCL's own collectives. Part of the CUDA backend library, which minidl does not link.
//
//   NcclTransport t(ctx.world(), Device::cuda(0));
//   auto r = t.start_recv(x, 0, x.nbytes(), left, 0);
//   auto s = t.start_send(y, 0, y.nbytes(), right, 0);
//   t.wait(r);  t.wait(s);                // both went out as one NCCL group; the compute stream now waits for it
//
// Why sends and receives are batched: a lone ncclSend blocks its stream until the peer posts the matching
// ncclRecv, so in a ring where every rank first sends right and then receives from the left, every rank would
// wait forever. NCCL's answer is a group (ncclGroupStart/End): the operations in it progress together. So
// start_send/start_recv only queue; the queue goes out as one group, ordered after the work already queued on the
// device's compute stream, at the first wait() or test() of one of its tickets (or flush()). The ring starts a
// step's sends and receives before it waits for any, so each step is one group, paired on every rank.
//
// wait() does not block the host: it makes the compute stream wait for the transfer's group (an event), which is
// exactly what a consumer on that stream needs (the ring's reduction kernel, a later copy or host read). NCCL has
// no tags: messages between two ranks match in the order they were started, so `tag` is ignored.
#pragma once

#include <nccl.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda.h"
#include "dist/ring_transport.h"

// Runs an NCCL call; on failure throws minidl::Error with NCCL's error text, the rank and file:line.
#define MINIDL_NCCL_CHECK(call) MINIDL_STATUS_CHECK(call, #call, ncclSuccess, ::minidl::dist::detail::throw_nccl_error)

namespace minidl::dist {

namespace detail {
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line);
}  // namespace detail

class NcclTransport final : public RingTransport {
 public:
  // Collective over `comm`: rank 0 makes the NCCL unique id, MPI_Bcast hands it to the others, and every rank
  // joins with ncclCommInitRank on `device` (a CUDA device; one per rank on real GPUs, as NCCL requires). A
  // `comm` of one rank makes no NCCL communicator: its sends to itself are copies into the matching receives.
  NcclTransport(MPI_Comm comm, Device device);
  // Waits for the communication stream, then destroys the communicator.
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  Ticket start_send(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer, int tag) override;
  Ticket start_recv(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer, int tag) override;
  void wait(Ticket ticket) override;
  bool test(Ticket ticket) override;

  // Issues the queued sends and receives as one group. Call it before anything else goes on the communication
  // stream, so that every rank issues its NCCL operations in the same order.
  void flush();
  // Makes the communication stream wait for the work queued so far on the device's compute stream.
  void wait_for_compute();
  // The communicator; null in a group of one, which makes none.
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct Pending {
    Ticket ticket;
    bool send;
    void* data;
    size_t bytes;
    int peer;
  };
  Ticket queue(bool send, const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer);
  void flush_locked();
  void issue_group_locked();   // the queue as one NCCL group
  void copy_to_self_locked();  // the queue of a group of one: each send copied into its receive
  // The event that ends `ticket`'s group, issuing the group first if it is still queued.
  std::shared_ptr<cuda::Event> group_end_locked(Ticket ticket);

  Device device_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Event> compute_ready_;  // made on device_, like every event recorded on its streams
  std::mutex mutex_;
  Ticket next_ = 0;
  std::vector<Pending> pending_;
  std::unordered_map<Ticket, std::shared_ptr<cuda::Event>> issued_;  // ticket -> the end of its group
};

// The CUDA device a rank uses when none is given: its rank among the ranks of `comm` on its host, modulo the
// devices this process sees. Collective over `comm`.
Device default_cuda_device(MPI_Comm comm);

}  // namespace minidl::dist
