#include "dist/mpi_backend.h"

#include <climits>

#include "dist/init.h"
#include "dist/reduce.h"

namespace minidl::dist {

namespace {

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// MPI has no 16-bit float types: all_reduce_16bit sends them as MPI_UINT16_T under a user-defined sum that adds
// in f32 and rounds back (reduce_into's), at every step of Open MPI's algorithm.
template <DType dtype>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(dtype, ReduceOp::kSum, inout, in, *len);
}
MPI_Op sum_op_16bit(DType dtype) {
  static MPI_Op ops[2] = {MPI_OP_NULL, MPI_OP_NULL};  // created once, freed by MPI_Finalize
  MPI_Op& op = ops[dtype == DType::bf16];
  if (op == MPI_OP_NULL)
    MINIDL_MPI_CHECK(MPI_Op_create(dtype == DType::bf16 ? &sum_16bit<DType::bf16> : &sum_16bit<DType::f16>, 1, &op));
  return op;
}

// A non-blocking point-to-point operation; holds its tensor so the buffer outlives the transfer.
class MpiRequestWork final : public Work {
 public:
  MpiRequestWork(MPI_Request request, Tensor tensor) : request_(request), tensor_(std::move(tensor)) {}
  ~MpiRequestWork() override {
    // Dropping an unwaited Work must not leave MPI writing into freed memory.
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) MINIDL_MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }
  bool is_completed() override {
    int done = 1;
    if (request_ != MPI_REQUEST_NULL) MINIDL_MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }

 private:
  MPI_Request request_;
  Tensor tensor_;
};

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  MINIDL_ASSERT(false, "mpi_datatype: unknown dtype");
}

int mpi_count(const char* op, int64_t numel) {
  MINIDL_CHECK(numel <= INT_MAX, op, ": ", numel, " elements exceed MPI's count limit of ", INT_MAX);
  return int(numel);
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm) {
  MINIDL_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MINIDL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MINIDL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiProcessGroup::~MpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

std::shared_ptr<Work> MpiProcessGroup::do_all_reduce(Tensor& tensor, ReduceOp op) {
  int count = mpi_count("mpi all_reduce", tensor.numel());
  MINIDL_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, tensor.raw_data(), count, mpi_datatype(tensor.dtype()), mpi_op(op), comm_));
  if (op == ReduceOp::kAvg) divide_by(tensor.dtype(), tensor.raw_data(), tensor.numel(), size_);
  return completed_work();
}

std::shared_ptr<Work> MpiProcessGroup::do_all_reduce_16bit(Tensor& tensor, ReduceOp) {
  int count = mpi_count("mpi all_reduce_16bit", tensor.numel());
  MINIDL_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, tensor.raw_data(), count, MPI_UINT16_T, sum_op_16bit(tensor.dtype()), comm_));
  return completed_work();
}

std::shared_ptr<Work> MpiProcessGroup::do_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) {
  int count = mpi_count("mpi reduce_scatter", output.numel());
  mpi_count("mpi reduce_scatter", input.numel());
  MINIDL_MPI_CHECK(MPI_Reduce_scatter_block(input.raw_data(), output.raw_data(), count, mpi_datatype(output.dtype()),
                                            mpi_op(op), comm_));
  if (op == ReduceOp::kAvg) divide_by(output.dtype(), output.raw_data(), output.numel(), size_);
  return completed_work();
}

std::shared_ptr<Work> MpiProcessGroup::do_all_gather(Tensor& output, const Tensor& input) {
  int count = mpi_count("mpi all_gather", input.numel());
  mpi_count("mpi all_gather", output.numel());
  MPI_Datatype type = mpi_datatype(input.dtype());
  MINIDL_MPI_CHECK(MPI_Allgather(input.raw_data(), count, type, output.raw_data(), count, type, comm_));
  return completed_work();
}

std::shared_ptr<Work> MpiProcessGroup::do_all_to_all(Tensor& output, const Tensor& input,
                                                     const std::vector<int64_t>& send_counts,
                                                     const std::vector<int64_t>& recv_counts) {
  const size_t n = send_counts.size();
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  int64_t s_at = 0, r_at = 0;
  for (size_t j = 0; j < n; ++j) {
    sc[j] = mpi_count("mpi all_to_all", send_counts[j]);
    rc[j] = mpi_count("mpi all_to_all", recv_counts[j]);
    sd[j] = mpi_count("mpi all_to_all", s_at);
    rd[j] = mpi_count("mpi all_to_all", r_at);
    s_at += send_counts[j], r_at += recv_counts[j];
  }
  MPI_Datatype type = mpi_datatype(input.dtype());
  // An empty tensor has no storage to point at; MPI reads nothing of a zero count.
  static char none = 0;
  void* out = output.numel() > 0 ? output.raw_data() : &none;
  const void* in = input.numel() > 0 ? input.raw_data() : &none;
  MINIDL_MPI_CHECK(MPI_Alltoallv(in, sc.data(), sd.data(), type, out, rc.data(), rd.data(), type, comm_));
  return completed_work();
}

std::shared_ptr<Work> MpiProcessGroup::do_broadcast(Tensor& tensor, int root) {
  int count = mpi_count("mpi broadcast", tensor.numel());
  MINIDL_MPI_CHECK(MPI_Bcast(tensor.raw_data(), count, mpi_datatype(tensor.dtype()), root, comm_));
  return completed_work();
}

std::shared_ptr<Work> MpiProcessGroup::do_send(const Tensor& tensor, int dst, int tag) {
  MPI_Request request;
  MINIDL_MPI_CHECK(MPI_Isend(tensor.raw_data(), mpi_count("mpi send", tensor.numel()), mpi_datatype(tensor.dtype()),
                             dst, tag, comm_, &request));
  return std::make_shared<MpiRequestWork>(request, tensor);
}

std::shared_ptr<Work> MpiProcessGroup::do_recv(Tensor& tensor, int src, int tag) {
  MPI_Request request;
  MINIDL_MPI_CHECK(MPI_Irecv(tensor.raw_data(), mpi_count("mpi recv", tensor.numel()), mpi_datatype(tensor.dtype()),
                             src, tag, comm_, &request));
  return std::make_shared<MpiRequestWork>(request, tensor);
}

std::shared_ptr<Work> MpiProcessGroup::do_barrier() {
  MINIDL_MPI_CHECK(MPI_Barrier(comm_));
  return completed_work();
}

}  // namespace minidl::dist
