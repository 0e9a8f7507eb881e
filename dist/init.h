// Starting the distributed runtime: MPI, ranks, local ranks, threads per rank, and checks that every rank agrees.
//
//   int main(int argc, char** argv) {
//     auto ctx = minidl::dist::init(argc, argv);      // works under `mpirun -n N` and as a plain process
//     minidl::dist::check_same_config(ctx, {{"batch", std::to_string(batch)}, {"dp", std::to_string(dp)}});
//     auto world = minidl::dist::make_process_group("ring", ctx.world());
//     ...
//   }                                                  // ~Context() finalizes MPI
//
// The Context owns MPI: process groups and Topology objects made from it must be destroyed before it.
// Errors from MPI calls go through MINIDL_MPI_CHECK, which throws minidl::Error naming the call, MPI's own error
// text, the rank, host, pid and file:line.
#pragma once

#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace minidl::dist {

class Context {
 public:
  Context(Context&& other) noexcept;
  Context& operator=(Context&&) = delete;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // Calls MPI_Finalize if init() initialised MPI. Every rank must get here: a rank that fails alone should call
  // abort() instead, or the others wait for it forever.
  ~Context();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Rank among the ranks on this host (0 .. ranks_on_host()-1) and their number.
  int local_rank() const { return local_rank_; }
  int ranks_on_host() const { return ranks_on_host_; }
  // CPU threads this rank uses by default: the host's cores divided among its ranks (init() applies it).
  int threads_per_rank() const { return threads_per_rank_; }
  // The accelerator this rank drives on a GPU machine: its local rank.
  int device_index() const { return local_rank_; }
  // MPI_THREAD_MULTIPLE (any thread may call MPI at any time) or MPI_THREAD_SERIALIZED (one thread at a time).
  int thread_level() const { return thread_level_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }

  // Stops every rank of the job now (MPI_Abort) with `exit_code`: for a failure that only this rank saw.
  [[noreturn]] void abort(int exit_code) const;

 private:
  friend Context init(int& argc, char**& argv);

  // Whether an MPI launcher (mpirun/mpiexec, srun, hydra) started this process: it set one of the rank variables
  // Open MPI, PMI or PMIx give each rank.
  bool under_mpi_launcher();
  Context() = default;
  bool owns_mpi_ = false;
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, ranks_on_host_ = 1, threads_per_rank_ = 1;
  int thread_level_ = 0;
};

// Initialises MPI (MPI_THREAD_MULTIPLE if the library provides it, else at least SERIALIZED: DDP's communication
// thread needs one of them). Started without a launcher (no mpirun: under_mpi_launcher() is false), the process is
// a world of one that starts no Open MPI daemon (ess_singleton_isolated): a GPU node with no Open MPI installed
// runs single-process programs from the bundled libraries alone (scripts/gpu-bundle.sh). It then finds the local
// rank (from the launcher's variables: mpirun's, srun's, ...: dist/local_rank.h; else from a shared-memory split of
// MPI_COMM_WORLD) and sets the thread pool to threads_per_rank(). If MPI is already initialised, uses it and leaves
// finalising to whoever initialised it. MPI errors on MPI_COMM_WORLD (and communicators made from it) are returned,
// not fatal, so MINIDL_MPI_CHECK can report them.
Context init(int& argc, char**& argv);

// Whether an MPI launcher (mpirun/mpiexec, srun, hydra) started this process: it set one of the rank variables
// Open MPI, PMI or PMIx give each rank.
bool under_mpi_launcher();

// Stops every rank with the same minidl::Error if any rank's configuration differs from rank 0's. `fields` are
// (name, value) pairs in the same order on every rank. Ranks exchange a 64-bit hash per field; only the fields
// that differ are then gathered as text, so the message names each one with rank 0's value and the differing
// ranks' values:
//   "configuration differs across ranks: batch: rank 0 has '12', rank 1 has '16'"
// Collective over ctx.world(): every rank must call it.
void check_same_config(const Context& ctx, const std::vector<std::pair<std::string, std::string>>& fields);

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace minidl::dist

// Runs an MPI call; on failure throws minidl::Error with MPI's error text, the rank and file:line.
#define MINIDL_MPI_CHECK(call) MINIDL_STATUS_CHECK(call, #call, MPI_SUCCESS, ::minidl::dist::detail::throw_mpi_error)
