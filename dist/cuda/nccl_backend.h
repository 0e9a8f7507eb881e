// NcclProcessGroup: the "nccl" backend — NCCL's collectives on CUDA device tensors, on the group's own
// communication stream. Part of the CUDA backend library (minidl never links NCCL); programs reach it through
// dist::make_process_group("nccl", comm) once minidl::cuda::register_backend() has run.
//
//   auto pg = dist::make_process_group("nccl", ctx.world());        // cuda:<local rank>
//   pg->all_reduce(grads, dist::ReduceOp::kAvg)->wait();            // the compute stream waits; the host does not
//
// Every operation is ordered after the work already queued on the device's compute stream (an event), runs on
// the communication stream, and returns a Work holding an event at its end: wait() makes the compute stream wait
// for it, is_completed() queries it. barrier() alone blocks the host, until the device has passed it.
//
// Reductions: kSum and kMax are ncclSum and ncclMax; kAvg is ncclSum followed by one division on the device
// (NCCL's ncclAvg scales each input by 1/n for floats, which rounds differently from the contract's sum / n).
// f16/bf16 arrive staged in f32 (process_group.h). all_to_all is one NCCL group of a send and a receive per peer
// with a non-zero count (this rank's own part a device copy), as PyTorch's and DeepSpeed's all_to_all_single are;
// a group of one copies. send/recv go through the transport's batched groups
// (nccl_transport.h): messages between two ranks match in the order they were posted; tags are not used.
#pragma once

#include <memory>

#include "dist/cuda/nccl_transport.h"
#include "dist/flight_recorder.h"
#include "dist/process_group.h"

namespace minidl::dist {

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Collective over `comm` (bootstrap: nccl_transport.h); `device` must be a CUDA device.
  NcclProcessGroup(MPI_Comm comm, Device device);

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  std::string name() const override { return "nccl"; }
  Device device() const override { return transport_->device(); }
  ~NcclProcessGroup() override;
  // Registers async_error() with the watchdog (ProcessGroup::watch_async_errors).
  void watch_async_errors() override;
  // ncclCommGetAsyncError's result, named ("ncclRemoteError: remote process exited ..."), or empty.
  std::string async_error();

 protected:
  std::shared_ptr<Work> do_all_reduce(Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> do_all_reduce_16bit(Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> do_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) override;
  std::shared_ptr<Work> do_all_gather(Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> do_broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> do_all_to_all(Tensor& output, const Tensor& input, const std::vector<int64_t>& send_counts,
                                      const std::vector<int64_t>& recv_counts) override;
  std::shared_ptr<Work> do_send(const Tensor& tensor, int dst, int tag) override;
  std::shared_ptr<Work> do_recv(Tensor& tensor, int src, int tag) override;
  std::shared_ptr<Work> do_barrier() override;

 private:
  // Runs launch(stream) on the communication stream after the compute stream's queued work, as the span `what`
  // (timed on that stream) in a trace; the Work keeps `tensors` alive until it is waited on.
  template <class Launch>
  std::shared_ptr<Work> enqueue(const char* what, std::vector<Tensor> tensors, Launch&& launch);

  std::unique_ptr<NcclTransport> transport_;
  std::unique_ptr<AsyncErrorWatch> watch_;  // destroyed first (the destructor): the watchdog polls the transport
};

}  // namespace minidl::dist
