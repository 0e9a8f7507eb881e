// NCCL's API (the subset in nccl.h beside this file) over MPI on host memory, for the emulated CUDA build: it lets
// CI run the "nccl" backend and the device ring (dist/cuda/) end to end without a GPU or an NCCL runtime.
//
// A communicator is an MPI communicator of its ranks, numbered as NCCL numbers them. Building it is the only
// subtle part: ncclCommInitRank gets no MPI communicator, only the unique id that the caller passed around (by
// MPI_Bcast on its own communicator) and its rank in the new one. So ncclGetUniqueId writes into the id the
// MPI_COMM_WORLD rank of the process that made it (the "root") and a sequence number; in ncclCommInitRank every
// rank tells the root its world rank, the root sends back the world ranks of all members in NCCL rank order, and
// the members build their communicator with MPI_Comm_create_group, which involves only them. The messages use
// MPI_COMM_WORLD with tags in [kTagBase, kTagBase + kTagRange), one per id, so that inits of different
// communicators never mix.
//
// Collectives call the blocking MPI collective; sends and receives post MPI_Isend/MPI_Irecv (tag 0: MPI keeps
// the messages between two ranks in order, as NCCL does) and complete at once, or at ncclGroupEnd inside a group.
// Each operation (a group is one) is work on its stream through minidl::emu::enqueue: with synchronous streams it
// runs inside the call, with deferred streams (cuda_emu/emulator.h) it runs in stream order when the host waits
// for it, and a failure there becomes the communicator's asynchronous error, as NCCL reports a kernel's.
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "cuda_emu/graph.h"

struct ncclComm {
  MPI_Comm comm;
  int rank, size;
  mutable std::atomic<int> async_error{ncclSuccess};  // read by a watchdog thread (ncclCommGetAsyncError)
};

namespace {

constexpr uint32_t kIdMagic = 0x6c63636e;  // "nccl"
struct IdContents {
  uint32_t magic;
  int root_world_rank;
  int sequence;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES);

constexpr int kTagBase = 20000, kTagRange = 10000;  // MPI guarantees tags up to 32767
std::atomic<int> g_sequence{0};
std::atomic<int> g_communicators_created{0};

// Posts one send or receive, adding its request.
using Post = std::function<int(std::vector<MPI_Request>&)>;

// Sends and receives called inside ncclGroupStart/ncclGroupEnd, posted together at the end, per thread like NCCL's
// group state.
thread_local int g_group_depth = 0;
thread_local std::vector<Post> g_group_posts;
thread_local ncclComm_t g_group_comm = nullptr;
thread_local cudaStream_t g_group_stream = nullptr;

ncclResult_t from_mpi(int rc) { return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

// The MPI type that carries `type`; f16/bf16 travel as 16-bit words and cannot be reduced here.
bool mpi_type(ncclDataType_t type, MPI_Datatype* out, size_t* bytes, bool for_reduction) {
  switch (type) {
    case ncclInt8: *out = MPI_INT8_T, *bytes = 1; return true;
    case ncclUint8: *out = MPI_UINT8_T, *bytes = 1; return true;
    case ncclInt32: *out = MPI_INT32_T, *bytes = 4; return true;
    case ncclUint32: *out = MPI_UINT32_T, *bytes = 4; return true;
    case ncclInt64: *out = MPI_INT64_T, *bytes = 8; return true;
    case ncclUint64: *out = MPI_UINT64_T, *bytes = 8; return true;
    case ncclFloat32: *out = MPI_FLOAT, *bytes = 4; return true;
    case ncclFloat64: *out = MPI_DOUBLE, *bytes = 8; return true;
    case ncclFloat16:
    case ncclBfloat16: *out = MPI_UINT16_T, *bytes = 2; return !for_reduction;
    default: return false;
  }
}

bool mpi_op(ncclRedOp_t op, MPI_Op* out) {
  switch (op) {
    case ncclSum: *out = MPI_SUM; return true;
    case ncclProd: *out = MPI_PROD; return true;
    case ncclMax: *out = MPI_MAX; return true;
    case ncclMin: *out = MPI_MIN; return true;
    default: return false;
  }
}

// Every operation passes here: where MINIDL_NCCL_EMU_ASYNC_ERROR's injected error is raised.
void count_operation(const ncclComm* comm) {
  static const long inject_at = [] {
    const char* v = std::getenv("MINIDL_NCCL_EMU_ASYNC_ERROR");
    return v ? std::atol(v) : 0L;
  }();
  static std::atomic<long> operations{0};
  if (inject_at > 0 && ++operations == inject_at) comm->async_error = ncclRemoteError;
}

bool valid(const ncclComm* comm, size_t count) {
  if (comm == nullptr || count > size_t(INT_MAX)) return false;
  count_operation(comm);
  return true;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// Runs `op` on `stream`: inside this call (synchronous streams), or queued in stream order (module comment).
ncclResult_t on_stream(ncclComm_t comm, cudaStream_t stream, std::function<ncclResult_t()> op) {
  if (!minidl::emu::defers(stream)) return op();
  const cudaError_t queued = minidl::emu::enqueue(stream, [comm, op = std::move(op)] {
    if (op() != ncclSuccess) comm->async_error = ncclSystemError;
    return cudaSuccess;
  });
  return queued == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

// Posts the sends and receives of one group (or one alone) and waits for them all.
ncclResult_t post_all(ncclComm_t comm, cudaStream_t stream, std::vector<Post> posts) {
  return on_stream(comm, stream, [posts = std::move(posts)] {
    std::vector<MPI_Request> requests;
    for (const Post& post : posts)
      if (post(requests) != MPI_SUCCESS) return ncclSystemError;
    return from_mpi(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  });
}

// A point-to-point operation: posted now, or at the enclosing group's end.
ncclResult_t post_or_defer(ncclComm_t comm, cudaStream_t stream, Post post) {
  if (g_group_depth == 0) return post_all(comm, stream, {std::move(post)});
  if (g_group_posts.empty()) {
    g_group_comm = comm;
    g_group_stream = stream;
  }
  g_group_posts.push_back(std::move(post));
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return ncclInvalidArgument;
  IdContents id{kIdMagic, 0, g_sequence.fetch_add(1)};
  if (MPI_Comm_rank(MPI_COMM_WORLD, &id.root_world_rank) != MPI_SUCCESS) return ncclSystemError;
  std::memset(unique_id->internal, 0, NCCL_UNIQUE_ID_BYTES);
  std::memcpy(unique_id->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  IdContents id;
  std::memcpy(&id, comm_id.internal, sizeof id);
  if (id.magic != kIdMagic) return ncclInvalidArgument;
  int world_rank = 0;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &world_rank) != MPI_SUCCESS) return ncclSystemError;
  const int tag = kTagBase + id.sequence % kTagRange;

  std::vector<int> members(size_t(nranks), -1);  // world rank of each NCCL rank
  if (world_rank == id.root_world_rank) {
    members[size_t(rank)] = world_rank;
    for (int i = 1; i < nranks; ++i) {
      int member[2];  // NCCL rank, world rank
      if (MPI_Recv(member, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return ncclSystemError;
      if (member[0] < 0 || member[0] >= nranks || members[size_t(member[0])] != -1) return ncclInvalidUsage;
      members[size_t(member[0])] = member[1];
    }
    for (int r = 0; r < nranks; ++r) {
      if (r == rank) continue;
      if (MPI_Send(members.data(), nranks, MPI_INT, members[size_t(r)], tag, MPI_COMM_WORLD) != MPI_SUCCESS)
        return ncclSystemError;
    }
  } else {
    int member[2] = {rank, world_rank};
    if (MPI_Send(member, 2, MPI_INT, id.root_world_rank, tag, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Recv(members.data(), nranks, MPI_INT, id.root_world_rank, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS)
      return ncclSystemError;
  }

  MPI_Group world_group, group;
  MPI_Comm mpi_comm;
  if (MPI_Comm_group(MPI_COMM_WORLD, &world_group) != MPI_SUCCESS ||
      MPI_Group_incl(world_group, nranks, members.data(), &group) != MPI_SUCCESS ||
      MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &mpi_comm) != MPI_SUCCESS)
    return ncclSystemError;
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  *comm = new ncclComm{mpi_comm, rank, nranks};
  g_communicators_created.fetch_add(1);
  return ncclSuccess;
}

int minidl_nccl_emu_communicators_created() { return g_communicators_created.load(); }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm->comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) return ncclInvalidArgument;
  *asyncError = ncclResult_t(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (an MPI call failed in the emulated NCCL)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument (or not provided by the emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  MPI_Datatype type;
  MPI_Op mop;
  size_t elem;
  if (!valid(comm, count) || !mpi_type(datatype, &type, &elem, true) || !mpi_op(op, &mop)) return ncclInvalidArgument;
  const void* in = sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
  return on_stream(comm, stream,
                   [=] { return from_mpi(MPI_Allreduce(in, recvbuff, int(count), type, mop, comm->comm)); });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  MPI_Datatype type;
  MPI_Op mop;
  size_t elem;
  if (!valid(comm, recvcount * size_t(comm ? comm->size : 1)) || !mpi_type(datatype, &type, &elem, true) ||
      !mpi_op(op, &mop))
    return ncclInvalidArgument;
  return on_stream(comm, stream, [=] {
    const size_t in_bytes = recvcount * elem * size_t(comm->size);
    const void* in = sendbuff;
    std::vector<char> copy;  // MPI forbids an output inside the input; NCCL allows its own slice of it
    if (overlaps(sendbuff, in_bytes, recvbuff, recvcount * elem)) {
      copy.assign(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + in_bytes);
      in = copy.data();
    }
    return from_mpi(MPI_Reduce_scatter_block(in, recvbuff, int(recvcount), type, mop, comm->comm));
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  MPI_Datatype type;
  size_t elem;
  if (!valid(comm, sendcount * size_t(comm ? comm->size : 1)) || !mpi_type(datatype, &type, &elem, false))
    return ncclInvalidArgument;
  return on_stream(comm, stream, [=] {
    const size_t bytes = sendcount * elem;
    const void* own_slot = static_cast<const char*>(recvbuff) + bytes * size_t(comm->rank);
    const void* in = sendbuff;
    std::vector<char> copy;
    if (sendbuff == own_slot) {
      in = MPI_IN_PLACE;
    } else if (overlaps(sendbuff, bytes, recvbuff, bytes * size_t(comm->size))) {
      copy.assign(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + bytes);
      in = copy.data();
    }
    return from_mpi(MPI_Allgather(in, int(sendcount), type, recvbuff, int(sendcount), type, comm->comm));
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  MPI_Datatype type;
  size_t elem;
  if (!valid(comm, count) || root < 0 || root >= comm->size || !mpi_type(datatype, &type, &elem, false))
    return ncclInvalidArgument;
  return on_stream(comm, stream, [=] {
    if (comm->rank == root && sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, count * elem);
    return from_mpi(MPI_Bcast(recvbuff, int(count), type, root, comm->comm));
  });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  MPI_Datatype type;
  size_t elem;
  if (!valid(comm, count) || peer < 0 || peer >= comm->size || !mpi_type(datatype, &type, &elem, false))
    return ncclInvalidArgument;
  return post_or_defer(comm, stream, [=](std::vector<MPI_Request>& requests) {
    return MPI_Isend(sendbuff, int(count), type, peer, 0, comm->comm, &requests.emplace_back());
  });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  MPI_Datatype type;
  size_t elem;
  if (!valid(comm, count) || peer < 0 || peer >= comm->size || !mpi_type(datatype, &type, &elem, false))
    return ncclInvalidArgument;
  return post_or_defer(comm, stream, [=](std::vector<MPI_Request>& requests) {
    return MPI_Irecv(recvbuff, int(count), type, peer, 0, comm->comm, &requests.emplace_back());
  });
}

ncclResult_t ncclGroupStart(void) {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth > 0 || g_group_posts.empty()) return ncclSuccess;
  std::vector<Post> posts = std::move(g_group_posts);
  g_group_posts.clear();
  return post_all(g_group_comm, g_group_stream, std::move(posts));
}

}  // extern "C"
