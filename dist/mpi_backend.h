// MpiProcessGroup: the "mpi" backend, Open MPI's own collectives on CPU tensors. It is the reference the "ring"
// backend is tested and benchmarked against.
//
//   dist::MpiProcessGroup pg(ctx.world());
//   pg.all_reduce(grads, dist::ReduceOp::kSum)->wait();
//
// Collectives are blocking calls (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast,
// MPI_Barrier) that return a completed Work. Why not MPI_Iallreduce & co.: Open MPI 4.1 has no asynchronous
// progress thread, so a non-blocking collective only advances while its caller sits in MPI_Test/MPI_Wait and
// would not overlap with compute anyway; its libnbc schedules are also slower than the tuned blocking algorithms
// for large messages. Overlap comes from issuing collectives on a communication thread (MPI_THREAD_MULTIPLE),
// which is what DDP does. send and recv are truly asynchronous (MPI_Isend/MPI_Irecv), so a rank can post both
// before waiting, as pipeline schedules need.
//
// f16/bf16 move as 16-bit words; their reductions arrive here already staged in f32 (see process_group.h).
// kAvg is MPI_SUM followed by one division. Element counts above INT_MAX are an error (MPI counts are int).
#pragma once

#include <mpi.h>

#include "dist/process_group.h"

namespace minidl::dist {

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Duplicates `comm`; the group owns the duplicate.
  explicit MpiProcessGroup(MPI_Comm comm);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

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
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// The MPI datatype that carries `dtype` (f16/bf16 as MPI_UINT16_T: data movement only).
MPI_Datatype mpi_datatype(DType dtype);
// A tensor's element count as an MPI count; throws naming `op` when it exceeds INT_MAX.
int mpi_count(const char* op, int64_t numel);

}  // namespace minidl::dist
