#include "dist/ring_transport.h"

#include <atomic>
#include <climits>

#include "dist/init.h"

namespace minidl::dist {

namespace {

char* byte_range(const Tensor& t, int64_t byte_offset, int64_t bytes) {
  MINIDL_ASSERT(byte_offset >= 0 && bytes >= 0 && byte_offset + bytes <= int64_t(t.nbytes()),
                "ring transport: byte range [", byte_offset, ", ", byte_offset + bytes, ") outside a tensor of ",
                t.nbytes(), " bytes");
  MINIDL_CHECK(bytes <= INT_MAX, "ring transport: a message of ", bytes, " bytes exceeds MPI's limit of ", INT_MAX);
  return static_cast<char*>(t.raw_data()) + byte_offset;
}

}  // namespace

MpiRingTransport::MpiRingTransport(MPI_Comm comm) {
  MINIDL_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MINIDL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MINIDL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiRingTransport::~MpiRingTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& [ticket, request] : requests_) MPI_Wait(&request, MPI_STATUS_IGNORE);
  MPI_Comm_free(&comm_);
}

RingTransport::Ticket MpiRingTransport::start_send(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer,
                                                   int tag) {
  MPI_Request request;
  MINIDL_MPI_CHECK(MPI_Isend(byte_range(tensor, byte_offset, bytes), int(bytes), MPI_BYTE, peer, tag, comm_, &request));
  return add(request);
}

RingTransport::Ticket MpiRingTransport::start_recv(const Tensor& tensor, int64_t byte_offset, int64_t bytes, int peer,
                                                   int tag) {
  MPI_Request request;
  MINIDL_MPI_CHECK(MPI_Irecv(byte_range(tensor, byte_offset, bytes), int(bytes), MPI_BYTE, peer, tag, comm_, &request));
  return add(request);
}

void MpiRingTransport::wait(Ticket ticket) {
  MPI_Request request = take(ticket);
  MINIDL_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
}

bool MpiRingTransport::test(Ticket ticket) {
  // Test a copy of the handle outside the lock (MPI_Test may progress other transfers); MPI only rewrites the
  // handle when it completes, and then the table entry is retired.
  MPI_Request request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    request = requests_.at(ticket);
  }
  int done = 0;
  MINIDL_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  if (done) take(ticket);
  return done != 0;
}

RingTransport::Ticket MpiRingTransport::add(MPI_Request request) {
  std::lock_guard<std::mutex> lock(mutex_);
  requests_.emplace(next_, request);
  return next_++;
}

MPI_Request MpiRingTransport::take(Ticket ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = requests_.find(ticket);
  MINIDL_ASSERT(it != requests_.end(), "ring transport: ticket ", ticket, " was already waited on");
  MPI_Request request = it->second;
  requests_.erase(it);
  return request;
}

namespace {
std::atomic<RingTransportFactory> g_cuda_transport{nullptr};
}  // namespace

void register_ring_transport_factory(DeviceKind kind, RingTransportFactory factory) {
  MINIDL_CHECK(kind == DeviceKind::kCUDA, "register_ring_transport_factory: the CPU transport is MPI's, built in");
  g_cuda_transport.store(factory);
}

std::unique_ptr<RingTransport> make_ring_transport(MPI_Comm comm, Device device) {
  if (device.is_cpu()) return std::make_unique<MpiRingTransport>(comm);
  RingTransportFactory factory = g_cuda_transport.load();
  MINIDL_CHECK(factory != nullptr, "ring backend on ", device,
               ": this build has no device transport for the ring (NCCL): link minidl_cuda_backend (built when CUDA "
               "and NCCL are found) and call minidl::cuda::register_backend() first");
  return factory(comm, device);
}

}  // namespace minidl::dist
