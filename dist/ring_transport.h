// RingTransport: the only thing the ring algorithms need from the machine — start sending or receiving a byte
// range of a tensor to or from a peer, and wait for it. MpiRingTransport does it with MPI_Isend/MPI_Irecv on CPU
// tensors; the CUDA backend adds one over ncclSend/ncclRecv on device tensors (dist/cuda/nccl_transport.h,
// reached through make_ring_transport), and ring_backend.cpp stays as it is.
//
//   MpiRingTransport t(ctx.world());
//   auto s = t.start_send(x, /*byte_offset=*/0, /*bytes=*/x.nbytes(), /*peer=*/1, /*tag=*/0);
//   t.wait(s);
//
// Messages between two peers with the same tag arrive in the order they were started (MPI's non-overtaking
// rule); the ring relies on it to stream slices with a single tag. A device transport has no tags at all: its
// messages between two peers match in the order they were started.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/tensor.h"

namespace minidl::dist {

class RingTransport {
 public:
  using Ticket = int64_t;
  virtual ~RingTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the tensors it moves live.
  virtual Device device() const { return Device::cpu(); }
  // Starts moving bytes [byte_offset, byte_offset + bytes) of a contiguous tensor. The range must stay untouched
  // (send) or unread (recv) until wait(ticket) returns; the caller keeps the tensor alive until then.
  virtual Ticket start_send(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer, int tag) = 0;
  virtual Ticket start_recv(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer, int tag) = 0;
  // Blocks until the transfer finished; each ticket is waited on (or tested complete) exactly once. On a device
  // "finished" is in stream order: work queued on the device's compute stream after wait() returns sees the
  // data (that is where the ring's reductions run), and the host does not block.
  virtual void wait(Ticket ticket) = 0;
  // True (and the ticket retired) once the transfer finished; never blocks.
  virtual bool test(Ticket ticket) = 0;
};

// Point-to-point MPI on host memory, over a duplicate of `comm` that the transport owns. Thread-safe (tickets
// live in a locked table), so a communication thread and the main thread may share it.
class MpiRingTransport final : public RingTransport {
 public:
  explicit MpiRingTransport(MPI_Comm comm);
  ~MpiRingTransport() override;
  MpiRingTransport(const MpiRingTransport&) = delete;
  MpiRingTransport& operator=(const MpiRingTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Ticket start_send(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer, int tag) override;
  Ticket start_recv(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer, int tag) override;
  void wait(Ticket ticket) override;
  bool test(Ticket ticket) override;

 private:
  Ticket add(MPI_Request request);
  MPI_Request take(Ticket ticket);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  Ticket next_ = 0;
  std::unordered_map<Ticket, MPI_Request> requests_;
};

// A transport for tensors on `device` over the ranks of `comm`: MpiRingTransport on the CPU, otherwise the one
// registered for the device's kind (the CUDA backend registers NCCL's; without it this throws, naming the device).
std::unique_ptr<RingTransport> make_ring_transport(MPI_Comm comm, Device device);

// How the CUDA backend, which minidl does not link, provides the device transport. nullptr removes it.
using RingTransportFactory = std::unique_ptr<RingTransport> (*)(MPI_Comm comm, Device device);
void register_ring_transport_factory(DeviceKind kind, RingTransportFactory factory);

}  // namespace minidl::dist
