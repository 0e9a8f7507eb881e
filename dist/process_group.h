// ProcessGroup: the collectives every parallel mode is built from, on tensors, with an async Work handle.
//
//   auto pg = dist::make_process_group("ring", ctx.world());   // or "mpi"; "nccl" for CUDA tensors
//   Tensor g = ...;                                            // same shape and dtype on every rank
//   pg->all_reduce(g, dist::ReduceOp::kAvg)->wait();            // g = mean over ranks
//   Tensor shard = Tensor::empty({g.numel() / pg->size()});
//   pg->reduce_scatter(shard, g, dist::ReduceOp::kSum)->wait(); // shard = rank's slice of the sum
//
// Contract, for every backend:
// - Tensors are contiguous and on the device the group serves (device(): the CPU for "mpi", the CPU or a CUDA
//   device for "ring", a CUDA device for "nccl"); every rank passes tensors of the same dtype and element count,
//   and calls the collectives of a group in the same order. One thread at a time issues collectives on a group
//   (a communication thread may own it).
// - Every dtype works (f32, f64, f16, bf16, i32, i64, u8). Reductions of f16/bf16 accumulate in f32 and round
//   once at the end, on every backend, so results do not depend on the backend's reduction order more than f32
//   does (the price: f32 on the wire, twice the bytes). NCCL could reduce f16/bf16 natively, but it would round
//   at every hop of its ring, so "nccl" too converts to f32 on the device first (all_reduce_16bit asks for the
//   16-bit wire and its roundings, for the compression hooks). Integer sums must fit the dtype;
//   kAvg on integers is the sum divided by size() with C++ integer division (truncation toward zero), as NCCL
//   does.
// - kAvg is the sum divided by size() once, at the end (never a running average).
// - Zero elements is a no-op on every rank. all_reduce and broadcast take any element count; reduce_scatter and
//   all_gather need input.numel() == size() * output.numel() (resp. the reverse) by definition.
// - reduce_scatter and all_gather accept an output that overlaps the input (a ZeRO shard that is a view of the
//   flat buffer): the input is copied first.
// - The returned Work must be waited on (or polled until complete) before the tensors are read or written, and
//   keeps them alive until then. Errors surface as minidl::Error, from the call or from wait().
// - On a CUDA device, communication runs on the group's own stream, after the work already queued on the
//   device's compute stream (cuda::current_stream), and wait() makes the compute stream wait for it without
//   blocking the host: kernels queued afterwards, and host reads (which synchronise the compute stream), see
//   the result. is_completed() asks whether the device has finished it.
// - Point-to-point tags: on the CPU a recv matches the send with its tag. NCCL has no tags, so on a CUDA device
//   ("nccl", and "ring" on a device) the messages between two ranks match in the order they were posted; the
//   tag is still checked for range.
// - An operation a backend does not implement throws "backend <name> does not support <op>".
// - Every call is stamped with the group's next sequence number and recorded in the flight recorder, whose
//   watchdog ends a job whose call does not complete in time, naming the ranks that have not joined it
//   (dist/flight_recorder.h). Zero-element calls are no-ops and are not recorded.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/mpi_fwd.h"

namespace minidl::dist {

enum class ReduceOp { kSum, kAvg, kMax };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max"

// Handle to an operation that may still be running.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation has finished and its outputs hold the result; rethrows what the operation hit.
  virtual void wait() = 0;
  // True once wait() would return at once. Never blocks; may make progress on the operation.
  virtual bool is_completed() = 0;
};

// A Work that is already done (what blocking implementations return).
std::shared_ptr<Work> completed_work();

class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "ring", "nccl"
  // The device this group's tensors must live on.
  virtual Device device() const { return Device::cpu(); }

  // tensor = op over ranks of tensor, in place.
  std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOp op);
  // The same, but an f16/bf16 tensor stays 16-bit on the wire and in every partial sum, each rounded to the dtype
  // where all_reduce accumulates in f32 (NCCL's native reduction; "mpi" with a user-defined op, "ring" hop by hop):
  // half the bytes, for a rounding at every hop. What the bf16/fp16 communication hooks use (dist/comm_hook.h),
  // dividing by size() first. kSum only; other dtypes as all_reduce. Not "ring" on a device.
  std::shared_ptr<Work> all_reduce_16bit(Tensor& tensor, ReduceOp op);
  // The bytes this group's all-reduces carried so far, in the dtype on the wire (f32 for all_reduce's staged
  // f16/bf16): what a compression hook halves. Any thread may read it.
  uint64_t all_reduce_bytes() const { return all_reduce_bytes_.load(); }
  // output = slice `rank()` of (op over ranks of input), where input is viewed flat as size() slices of
  // output.numel() elements.
  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op);
  // output (flat) = concatenation over ranks r of rank r's input.
  std::shared_ptr<Work> all_gather(Tensor& output, const Tensor& input);
  // tensor = rank `root`'s tensor.
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root);
  // All-to-all with counts per peer (MPI_Alltoallv; what expert parallelism's token exchange is): input holds
  // send_counts[0] elements for rank 0, then send_counts[1] for rank 1, ...; output receives recv_counts[j] elements
  // from rank j, in rank order (this rank's own part copied across). recv_counts[j] must be rank j's
  // send_counts[rank()]: exchange the counts first (an all_to_all of one count per peer). Every rank sends
  // sum(send_counts) and receives sum(recv_counts) elements, zeros allowed. "mpi": MPI_Alltoallv; "ring": a
  // pairwise exchange in size() - 1 rounds (round k: to rank + k, from rank - k), on the CPU and on a device;
  // "nccl": one NCCL group of a send and a receive per peer with a non-zero count (the own part a device copy).
  std::shared_ptr<Work> all_to_all(Tensor& output, const Tensor& input, const std::vector<int64_t>& send_counts,
                                   const std::vector<int64_t>& recv_counts);
  // Point-to-point. A send matches the recv on `dst` with the same tag; tags are 0 .. kMaxTag.
  static constexpr int kMaxTag = 32766;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag);
  std::shared_ptr<Work> recv(Tensor& tensor, int src, int tag);
  // Completes on a rank once every rank of the group has called it.
  std::shared_ptr<Work> barrier();

  // What the flight recorder and the watchdog call the group ("dp", "tp", ...; default: the backend's name), and its
  // ranks' ranks in MPI_COMM_WORLD (make_process_group sets them; a group made otherwise: 0 .. size() - 1).
  std::string label() const { return label_.empty() ? name() : label_; }
  void set_label(std::string label) {
    label_ = std::move(label);
    watch_async_errors();  // again, under the new name
  }
  std::vector<int> world_ranks() const;
  void set_world_ranks(std::vector<int> ranks) { world_ranks_ = std::move(ranks); }
  // --check-collectives: before each call the ranks exchange its fingerprint (sequence number, op, dtype, count,
  // root or peer, reduce op) over `comm`, a side channel of their own (make_process_group sets one up while
  // dist::checking_collectives() is on), and every rank throws naming both fingerprints and their ranks on a
  // mismatch. A collective compares over the whole group; a recv compares with the matching send's.
  void set_check_channel(MPI_Comm comm) { check_comm_ = comm; }
  // Called by make_process_group once the group has its label: a backend whose errors can arrive outside any call
  // (NCCL's asynchronous errors: a peer died, a link broke) registers a poll with the watchdog
  // (dist::AsyncErrorWatch, dist/flight_recorder.h) and destroys it first in its own destructor. Not the base's
  // job: by the time ~ProcessGroup runs, the backend's part is gone while the watchdog's thread could still poll it.
  virtual void watch_async_errors() {}

 protected:
  // What a backend implements. The public methods above have validated the arguments, skipped empty tensors,
  // staged f16/bf16 reductions through f32 and separated overlapping inputs, so a backend sees contiguous,
  // non-empty tensors on its device: reductions only in f32, f64, i32, i64, u8; data movement in any dtype.
  // The defaults throw "backend <name> does not support <op>".
  virtual std::shared_ptr<Work> do_all_reduce(Tensor& tensor, ReduceOp op);
  virtual std::shared_ptr<Work> do_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op);
  virtual std::shared_ptr<Work> do_all_gather(Tensor& output, const Tensor& input);
  virtual std::shared_ptr<Work> do_broadcast(Tensor& tensor, int root);
  virtual std::shared_ptr<Work> do_all_to_all(Tensor& output, const Tensor& input,
                                              const std::vector<int64_t>& send_counts,
                                              const std::vector<int64_t>& recv_counts);
  virtual std::shared_ptr<Work> do_send(const Tensor& tensor, int dst, int tag);
  virtual std::shared_ptr<Work> do_recv(Tensor& tensor, int src, int tag);
  virtual std::shared_ptr<Work> do_barrier();
  // all_reduce_16bit of an f16/bf16 tensor (a sum).
  virtual std::shared_ptr<Work> do_all_reduce_16bit(Tensor& tensor, ReduceOp op);

 private:
  [[noreturn]] void unsupported(const char* op) const;
  void check_tensor(const char* op, const Tensor& t) const;
  // Records the call in the flight recorder, runs it, and hands back a Work that reports its completion.
  template <class Call>
  std::shared_ptr<Work> recorded(const char* op, const Tensor& t, int peer, const char* reduce_op, Call call,
                                 int tag = -1);

  void check_fingerprint(const char* op, const Tensor& t, int peer, const char* reduce_op, int tag);

  std::string label_;
  std::vector<int> world_ranks_;
  MPI_Comm check_comm_ = nullptr;  // none (not MPI_COMM_NULL, which needs <mpi.h>: set_check_channel never stores it)
  int64_t checked_seq_ = 0;
  std::atomic<uint64_t> all_reduce_bytes_{0};
};

// Whether new process groups get a fingerprint side channel (--check-collectives; MINIDL_CHECK_COLLECTIVES=1 at
// dist::init). Set it before the groups are made.
void set_checking_collectives(bool on);
bool checking_collectives();

// Makes a process group of `backend` ("mpi", "ring" or "nccl") over the ranks of `comm` (which it duplicates, so
// the caller's own traffic on `comm` never mixes with the group's), serving tensors on `device`:
//   "mpi"   the CPU only;
//   "ring"  the CPU (MPI point-to-point), or a CUDA device (NCCL point-to-point: needs the CUDA backend);
//   "nccl"  a CUDA device; by default this rank's local rank on the host, modulo the number of devices.
// Collective over `comm`. Destroy the group before MPI is finalised.
//
//   minidl::cuda::register_backend();       // dist/cuda/backend.h: also registers "nccl" and the device ring
//   auto pg = dist::make_process_group("nccl", ctx.world(), Device::cuda(ctx.device_index()));
std::unique_ptr<ProcessGroup> make_process_group(const std::string& backend, MPI_Comm comm,
                                                 std::optional<Device> device = std::nullopt);

// How a backend that lives outside the minidl library (the CUDA backend: minidl never links CUDA or NCCL) plugs
// into make_process_group. `device` is make_process_group's, unresolved. Registering nullptr removes a backend.
using ProcessGroupFactory = std::unique_ptr<ProcessGroup> (*)(MPI_Comm comm, std::optional<Device> device);
void register_process_group_factory(const std::string& backend, ProcessGroupFactory factory);

}  // namespace minidl::dist
