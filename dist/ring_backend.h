// RingProcessGroup: the "ring" backend — minidl's own collectives, built from point-to-point messages around a
// ring of ranks (rank r sends to r+1 and receives from r-1). This is the algorithm NCCL and Horovod use for large
// all-reduces; ring_backend.cpp derives why it is bandwidth-optimal.
//
//   dist::RingProcessGroup pg(ctx.world());                       // MPI point-to-point on CPU tensors
//   pg.all_reduce(grads, dist::ReduceOp::kAvg)->wait();
//   dist::RingProcessGroup small(ctx.world(), {.slice_bytes = 4096});  // more, smaller pipeline slices
//   dist::RingProcessGroup gpu(ctx.world(), Device::cuda(0));     // NCCL point-to-point on device tensors
//
// Collectives run to completion in the calling thread and return a completed Work (overlap comes from a
// communication thread, as for the "mpi" backend); send/recv are asynchronous. On a device "completion" is in
// stream order (process_group.h): the host only queues the transfers and the reductions. Results equal the
// "mpi" backend's bitwise whenever the sums are exact (e.g. integer-valued floats); otherwise they differ only
// by summation order.
#pragma once

#include <memory>

#include "dist/process_group.h"
#include "dist/shard.h"
#include "dist/ring_transport.h"

namespace minidl::dist {

struct RingOptions {
  // Each chunk travels as slices of this many bytes (the last one shorter), so that while slice k is being
  // reduced, slice k+1 is already on the wire, and a rank forwards slice k before the rest of its chunk arrived.
  // 512 KiB: large enough that per-message overhead is small, small enough to fill the pipeline quickly.
  int64_t slice_bytes = 512 * 1024;
};

class RingProcessGroup final : public ProcessGroup {
 public:
  // MPI point-to-point over a duplicate of `comm`.
  explicit RingProcessGroup(MPI_Comm comm, RingOptions options = {});
  // The transport make_ring_transport(comm, device) gives: MPI on the CPU, NCCL on a CUDA device.
  RingProcessGroup(MPI_Comm comm, Device device, RingOptions options = {});
  // Any transport (a test double, or NCCL point-to-point on a GPU build).
  explicit RingProcessGroup(std::unique_ptr<RingTransport> transport, RingOptions options = {});

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  std::string name() const override { return "ring"; }
  Device device() const override { return transport_->device(); }
  const RingOptions& options() const { return options_; }

 protected:
  std::shared_ptr<Work> do_all_reduce(Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> do_all_reduce_16bit(Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> do_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) override;
  std::shared_ptr<Work> do_all_gather(Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> do_all_to_all(Tensor& output, const Tensor& input, const std::vector<int64_t>& send_counts,
                                      const std::vector<int64_t>& recv_counts) override;
  std::shared_ptr<Work> do_broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> do_send(const Tensor& tensor, int dst, int tag) override;
  std::shared_ptr<Work> do_recv(Tensor& tensor, int src, int tag) override;
  std::shared_ptr<Work> do_barrier() override;

 private:
  std::unique_ptr<RingTransport> transport_;
  RingOptions options_;
};

}  // namespace minidl::dist
