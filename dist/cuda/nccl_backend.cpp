#include "dist/cuda/nccl_backend.h"

#include <algorithm>
#include <cstdio>

#include "core/trace.h"

#include "dist/cuda/tensor_kernels.h"

namespace minidl::dist {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  MINIDL_ASSERT(false, "nccl_type: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

// kAvg's division, on the communication stream right after the sum.
void finish_average(ReduceOp op, Tensor& t, int size, cudaStream_t stream) {
  if (op != ReduceOp::kAvg || size == 1) return;
  MINIDL_CUDA_CHECK(cuda_kernels::divide_by(element_type(t.dtype()), t.raw_device_data(), t.numel(), size, stream));
}

// A collective queued on the communication stream: `done` is recorded at its end.
class NcclWork final : public Work {
 public:
  NcclWork(Device device, std::shared_ptr<cuda::Event> done, std::vector<Tensor> tensors)
      : device_(device), done_(std::move(done)), tensors_(std::move(tensors)) {}
  ~NcclWork() override {
    // Unwaited: still order the compute stream after the collective, so that the caching allocator cannot hand
    // the tensors' memory to a kernel that would run while NCCL still uses it.
    if (!waited_) cudaStreamWaitEvent(cuda::current_stream(device_.index), done_->get(), 0);
  }
  void wait() override {
    cuda::DeviceGuard guard(device_.index);
    done_->wait(cuda::current_stream(device_.index));
    waited_ = true;
  }
  bool is_completed() override {
    const cudaError_t state = cudaEventQuery(done_->get());
    if (state == cudaErrorNotReady) return false;
    MINIDL_CUDA_CHECK(state);
    return true;
  }

 private:
  Device device_;
  std::shared_ptr<cuda::Event> done_;
  std::vector<Tensor> tensors_;
  bool waited_ = false;
};

// A send or recv queued on the transport.
class NcclPointToPointWork final : public Work {
 public:
  NcclPointToPointWork(NcclTransport* transport, RingTransport::Ticket ticket, Tensor tensor)
      : transport_(transport), ticket_(ticket), tensor_(std::move(tensor)) {}
  ~NcclPointToPointWork() override {
    if (done_) return;
    try {
      transport_->wait(ticket_);
    } catch (const Error&) {  // a destructor must not throw; the error already surfaced or will at the next call
    }
  }
  void wait() override {
    if (!done_) transport_->wait(ticket_);
    done_ = true;
  }
  bool is_completed() override { return done_ || (done_ = transport_->test(ticket_)); }

 private:
  NcclTransport* transport_;
  RingTransport::Ticket ticket_;
  Tensor tensor_;
  bool done_ = false;
};

}  // namespace

std::string NcclProcessGroup::async_error() {
  ncclResult_t error = ncclSuccess;
  if (ncclCommGetAsyncError(transport_->comm(), &error) != ncclSuccess || error == ncclSuccess) return "";
  const char* names[] = {"ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                         "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  const std::string name =
      int(error) >= 0 && int(error) < 8 ? names[int(error)] : "nccl error " + std::to_string(int(error));
  return name + ": " + ncclGetErrorString(error);
}

NcclProcessGroup::NcclProcessGroup(MPI_Comm comm, Device device) {
  MINIDL_CHECK(device.is_cuda(), "nccl: the backend serves CUDA tensors, got device ", device);
  transport_ = std::make_unique<NcclTransport>(comm, device);
}

NcclProcessGroup::~NcclProcessGroup() { watch_.reset(); }  // no poll of the transport from here on

void NcclProcessGroup::watch_async_errors() {
  watch_.reset();  // one watch at a time (set_label renames the group)
  watch_ = std::make_unique<AsyncErrorWatch>(label(), [this] { return async_error(); });
}

// "nccl all-reduce 4.0 MiB": a collective's span in a trace, with the larger of its buffers.
static std::string describe(const char* what, const std::vector<Tensor>& tensors) {
  size_t bytes = 0;
  for (const Tensor& t : tensors) bytes = std::max(bytes, t.nbytes());
  char size[32];
  std::snprintf(size, sizeof size, " %.1f MiB", double(bytes) / (1 << 20));
  return what + std::string(size);
}

template <class Launch>
std::shared_ptr<Work> NcclProcessGroup::enqueue(const char* what, std::vector<Tensor> tensors, Launch&& launch) {
  transport_->flush();  // point-to-point queued before this goes first, in the order every rank posted it
  cuda::DeviceGuard guard(device().index);
  transport_->wait_for_compute();
  {
    // In a trace: the collective's time on the communication stream (core/cuda/trace_hooks.cpp).
    const cuda::TraceStream timed(transport_->stream(), device().index, "communication stream");
    const trace::Span span(trace::enabled() ? describe(what, tensors) : std::string());
    launch(transport_->stream());
  }
  auto done = std::make_shared<cuda::Event>(false);
  done->record(transport_->stream());
  return std::make_shared<NcclWork>(device(), std::move(done), std::move(tensors));
}

// In a group of one (no communicator: NcclTransport) every collective is its own result: all-reduce and broadcast
// leave the tensor as it is, reduce-scatter and all-gather copy input to output, on the same stream as NCCL would.
static void copy_for_group_of_one(Tensor& output, const Tensor& input, cudaStream_t stream) {
  if (output.raw_device_data() == input.raw_device_data()) return;
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(output.raw_device_data(), input.raw_device_data(), output.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream));
}

std::shared_ptr<Work> NcclProcessGroup::do_all_reduce(Tensor& tensor, ReduceOp op) {
  return enqueue("nccl all-reduce", {tensor}, [&](cudaStream_t stream) {
    if (size() == 1) return;
    void* data = tensor.raw_device_data();
    MINIDL_NCCL_CHECK(ncclAllReduce(data, data, size_t(tensor.numel()), nccl_type(tensor.dtype()), nccl_op(op),
                                    transport_->comm(), stream));
    finish_average(op, tensor, size(), stream);
  });
}

// NCCL reduces f16/bf16 natively (each hop rounds), which all_reduce_16bit asks for (a sum).
std::shared_ptr<Work> NcclProcessGroup::do_all_reduce_16bit(Tensor& tensor, ReduceOp op) {
  return do_all_reduce(tensor, op);
}

std::shared_ptr<Work> NcclProcessGroup::do_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) {
  return enqueue("nccl reduce-scatter", {output, input}, [&](cudaStream_t stream) {
    if (size() == 1) return copy_for_group_of_one(output, input, stream);
    MINIDL_NCCL_CHECK(ncclReduceScatter(input.raw_device_data(), output.raw_device_data(), size_t(output.numel()),
                                        nccl_type(output.dtype()), nccl_op(op), transport_->comm(), stream));
    finish_average(op, output, size(), stream);
  });
}

std::shared_ptr<Work> NcclProcessGroup::do_all_gather(Tensor& output, const Tensor& input) {
  return enqueue("nccl all-gather", {output, input}, [&](cudaStream_t stream) {
    if (size() == 1) return copy_for_group_of_one(output, input, stream);
    MINIDL_NCCL_CHECK(ncclAllGather(input.raw_device_data(), output.raw_device_data(), size_t(input.numel()),
                                    nccl_type(input.dtype()), transport_->comm(), stream));
  });
}

std::shared_ptr<Work> NcclProcessGroup::do_broadcast(Tensor& tensor, int root) {
  return enqueue("nccl broadcast", {tensor}, [&](cudaStream_t stream) {
    if (size() == 1) return;
    void* data = tensor.raw_device_data();
    MINIDL_NCCL_CHECK(
        ncclBroadcast(data, data, size_t(tensor.numel()), nccl_type(tensor.dtype()), root, transport_->comm(), stream));
  });
}

// One group of point-to-point calls: peer j gets send_counts[j] elements from their offset in input, and
// recv_counts[j] arrive from it at theirs in output (both in rank order); this rank's own part is copied.
std::shared_ptr<Work> NcclProcessGroup::do_all_to_all(Tensor& output, const Tensor& input,
                                                      const std::vector<int64_t>& send_counts,
                                                      const std::vector<int64_t>& recv_counts) {
  return enqueue("nccl all-to-all", {output, input}, [&](cudaStream_t stream) {
    const size_t elem = dtype_size(input.dtype());
    const auto* in = static_cast<const uint8_t*>(input.raw_device_data());
    auto* out = static_cast<uint8_t*>(output.raw_device_data());
    int64_t sent = 0, received = 0;
    const int me = rank();
    if (size() > 1) MINIDL_NCCL_CHECK(ncclGroupStart());
    for (int j = 0; j < size(); ++j) {
      const int64_t s = send_counts[size_t(j)], r = recv_counts[size_t(j)];
      if (j == me) {
        if (s > 0)
          MINIDL_CUDA_CHECK(cudaMemcpyAsync(out + received * elem, in + sent * elem, size_t(s) * elem,
                                            cudaMemcpyDeviceToDevice, stream));
      } else {
        const ncclDataType_t type = nccl_type(input.dtype());
        if (s > 0) MINIDL_NCCL_CHECK(ncclSend(in + sent * elem, size_t(s), type, j, transport_->comm(), stream));
        if (r > 0) MINIDL_NCCL_CHECK(ncclRecv(out + received * elem, size_t(r), type, j, transport_->comm(), stream));
      }
      sent += s;
      received += r;
    }
    if (size() > 1) MINIDL_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> NcclProcessGroup::do_send(const Tensor& tensor, int dst, int tag) {
  auto ticket = transport_->start_send(tensor, 0, int64_t(tensor.nbytes()), dst, tag);
  return std::make_shared<NcclPointToPointWork>(transport_.get(), ticket, tensor);
}

std::shared_ptr<Work> NcclProcessGroup::do_recv(Tensor& tensor, int src, int tag) {
  auto ticket = transport_->start_recv(tensor, 0, int64_t(tensor.nbytes()), src, tag);
  return std::make_shared<NcclPointToPointWork>(transport_.get(), ticket, tensor);
}

// An all-reduce of one integer, then the host waits for the device to finish it.
std::shared_ptr<Work> NcclProcessGroup::do_barrier() {
  Tensor token = Tensor::zeros({1}, DType::i32, device());
  auto work = do_all_reduce(token, ReduceOp::kSum);
  work->wait();
  device_backend(device(), "barrier").synchronize(device().index);
  return completed_work();
}

}  // namespace minidl::dist
