#include "dist/cuda/nccl_transport.h"

#include "core/trace.h"

#include "dist/init.h"

namespace minidl::dist {

namespace detail {
void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  const int rank = ::minidl::detail::process_rank();
  throw Error(::minidl::detail::concat(
      call, " failed", rank >= 0 ? " on rank " : "", rank >= 0 ? std::to_string(rank) : std::string(), ": ",
      ncclGetErrorString(status), " (ncclResult_t ", int(status), ") (", file, ":", line, ")"));
}
}  // namespace detail

Device default_cuda_device(MPI_Comm comm) {
  MPI_Comm host;
  int rank = 0, local_rank = 0;
  MINIDL_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MINIDL_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host));
  MINIDL_MPI_CHECK(MPI_Comm_rank(host, &local_rank));
  MINIDL_MPI_CHECK(MPI_Comm_free(&host));
  const int devices = cuda::device_count();
  MINIDL_CHECK(devices > 0, "nccl: this process sees no CUDA device");
  return Device::cuda(local_rank % devices);
}

NcclTransport::NcclTransport(MPI_Comm comm, Device device) : device_(device) {
  MINIDL_CHECK(device.is_cuda(), "nccl: expected a CUDA device, got ", device);
  MINIDL_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  MINIDL_MPI_CHECK(MPI_Comm_size(comm, &size_));
  cuda::DeviceGuard guard(device.index);
  MINIDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  compute_ready_ = std::make_unique<cuda::Event>(false);
  // A group of one has nothing to send: no communicator (NCCL's bootstrap opens sockets and allocates device
  // buffers, for nothing), and NcclProcessGroup's collectives become copies.
  if (size_ == 1) return;
  // Rank 0's id, with whether it could make one: a rank 0 that failed must not leave the others in MPI_Bcast.
  struct {
    int ok = 1;
    ncclUniqueId id{};
  } bootstrap;
  ncclResult_t made = ncclSuccess;
  if (rank_ == 0) {
    made = ncclGetUniqueId(&bootstrap.id);
    bootstrap.ok = made == ncclSuccess;
  }
  MINIDL_MPI_CHECK(MPI_Bcast(&bootstrap, sizeof bootstrap, MPI_BYTE, 0, comm));
  if (rank_ == 0) MINIDL_NCCL_CHECK(made);
  MINIDL_CHECK(bootstrap.ok, "nccl: rank 0 of the group could not create an NCCL unique id");
  MINIDL_NCCL_CHECK(ncclCommInitRank(&comm_, size_, bootstrap.id, rank_));
}

NcclTransport::~NcclTransport() {
  // Transfers never flushed had no matching partner yet; issuing them now could only hang.
  cuda::DeviceGuard guard(device_.index);
  cudaStreamSynchronize(stream_);
  cuda::detail::count_host_sync();
  if (comm_ != nullptr) ncclCommDestroy(comm_);
  compute_ready_.reset();
  cudaStreamDestroy(stream_);
}

RingTransport::Ticket NcclTransport::start_send(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer,
                                                int /*tag*/) {
  return queue(true, tensor, byte_offset, bytes, peer);
}

RingTransport::Ticket NcclTransport::start_recv(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer,
                                                int /*tag*/) {
  return queue(false, tensor, byte_offset, bytes, peer);
}

RingTransport::Ticket NcclTransport::queue(bool send, const Tensor& tensor, int64_t byte_offset, int64_t bytes,
                                           int peer) {
  MINIDL_ASSERT(tensor.device() == device_, "nccl transport on ", device_, " got a tensor on ", tensor.device());
  MINIDL_ASSERT(byte_offset >= 0 && bytes >= 0 && byte_offset + bytes <= int64_t(tensor.nbytes()),
                "nccl transport: byte range [", byte_offset, ", ", byte_offset + bytes, ") outside a tensor of ",
                tensor.nbytes(), " bytes");
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({next_, send, static_cast<char*>(tensor.raw_device_data()) + byte_offset, size_t(bytes), peer});
  return next_++;
}

void NcclTransport::wait_for_compute() {
  cuda::DeviceGuard guard(device_.index);
  compute_ready_->record(cuda::current_stream(device_.index));
  compute_ready_->wait(stream_);
}

void NcclTransport::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_locked();
}

void NcclTransport::flush_locked() {
  if (pending_.empty()) return;
  cuda::DeviceGuard guard(device_.index);
  wait_for_compute();  // a send may read what a kernel on the compute stream has just written
  {
    // In a trace: the group's time on the communication stream (core/cuda/trace_hooks.cpp).
    const cuda::TraceStream timed(stream_, device_.index, "communication stream");
    const trace::Span span(trace::enabled() ? "nccl send/recv x" + std::to_string(pending_.size()) : std::string());
    if (size_ == 1) {
      copy_to_self_locked();
    } else {
      issue_group_locked();
    }
  }
  auto done = std::make_shared<cuda::Event>(false);
  done->record(stream_);
  for (const Pending& p : pending_) issued_.emplace(p.ticket, done);
  pending_.clear();
}

// A group of one sends only to itself: the k-th send queued lands in the k-th receive, as NCCL pairs them.
void NcclTransport::copy_to_self_locked() {
  std::vector<const Pending*> sends, recvs;
  for (const Pending& p : pending_) (p.send ? sends : recvs).push_back(&p);
  MINIDL_CHECK(sends.size() == recvs.size(), "nccl transport: a group of one flushed ", sends.size(),
               " send(s) to itself and ", recvs.size(), " receive(s); each send needs its receive in the same group");
  for (size_t i = 0; i < sends.size(); ++i) {
    MINIDL_CHECK(sends[i]->bytes == recvs[i]->bytes, "nccl transport: send ", i, " to itself has ", sends[i]->bytes,
                 " bytes, its receive ", recvs[i]->bytes);
    if (sends[i]->bytes > 0)
      MINIDL_CUDA_CHECK(
          cudaMemcpyAsync(recvs[i]->data, sends[i]->data, sends[i]->bytes, cudaMemcpyDeviceToDevice, stream_));
  }
}

void NcclTransport::issue_group_locked() {
  MINIDL_NCCL_CHECK(ncclGroupStart());
  try {
    for (const Pending& p : pending_) {
      if (p.send)
        MINIDL_NCCL_CHECK(ncclSend(p.data, p.bytes, ncclUint8, p.peer, comm_, stream_));
      else
        MINIDL_NCCL_CHECK(ncclRecv(p.data, p.bytes, ncclUint8, p.peer, comm_, stream_));
    }
  } catch (...) {
    // Close the group before the error leaves: an open group would swallow this thread's next NCCL calls
    // (every later collective or group would be deferred into it and never launched).
    (void)ncclGroupEnd();
    throw;
  }
  MINIDL_NCCL_CHECK(ncclGroupEnd());
}

std::shared_ptr<cuda::Event> NcclTransport::group_end_locked(Ticket ticket) {
  for (const Pending& p : pending_)
    if (p.ticket == ticket) {
      flush_locked();
      break;
    }
  auto it = issued_.find(ticket);
  MINIDL_ASSERT(it != issued_.end(), "nccl transport: ticket ", ticket, " was already waited on");
  return it->second;
}

void NcclTransport::wait(Ticket ticket) {
  std::shared_ptr<cuda::Event> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = group_end_locked(ticket);
    issued_.erase(ticket);
  }
  cuda::DeviceGuard guard(device_.index);
  done->wait(cuda::current_stream(device_.index));
}

bool NcclTransport::test(Ticket ticket) {
  std::shared_ptr<cuda::Event> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = group_end_locked(ticket);
  }
  const cudaError_t state = cudaEventQuery(done->get());
  if (state == cudaErrorNotReady) return false;
  MINIDL_CUDA_CHECK(state);
  std::lock_guard<std::mutex> lock(mutex_);
  issued_.erase(ticket);
  return true;
}

}  // namespace minidl::dist
