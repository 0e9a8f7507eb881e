// Where a rank stands on its host, read from what its launcher put in the environment: the local rank picks the
// rank's GPU (Context::device_index) and the local count divides the host's cores among its ranks.
//
//   auto placement = dist::local_rank_from_environment(world_rank, [](const char* name) { return std::getenv(name); });
//   if (!placement) { /* no launcher said: split MPI_COMM_WORLD into shared-memory islands (dist::init does) */ }
//
// The launchers read, first match wins:
//   Open MPI (mpirun)      OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   MPICH / Hydra          MPI_LOCALRANKID, MPI_LOCALNRANKS
//   PMIx launchers         PMIX_LOCAL_RANK, PMIX_LOCAL_SIZE (PMIx itself passes these as job attributes; only
//                          launchers or wrappers that export them to the environment are seen here)
//   Slurm (srun)           SLURM_LOCALID, and the count from SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE)
//                          at this node's index SLURM_NODEID: "2(x3),1" means 2 tasks on nodes 0-2, 1 on node 3.
//                          SLURM_NTASKS_PER_NODE is not read: it is what the job asked for, not the step's layout.
// Slurm's variables are trusted only when SLURM_PROCID equals this process's MPI rank: a batch script's own
// variables (SLURM_LOCALID=0) are inherited by every process that mpirun starts inside it, and describe the script.
// A source whose values are missing, malformed or inconsistent (local rank >= local count) is skipped.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace minidl::dist {

struct LocalPlacement {
  int local_rank = 0;  // 0 .. ranks_on_host-1
  int ranks_on_host = 1;
  std::string launcher;  // which variables said so: "Open MPI", "MPICH", "PMIx" or "Slurm"
};

// getenv: returns a variable's value, or nullptr when it is unset (std::getenv, or a table in a test).
using EnvLookup = std::function<const char*(const char* name)>;

// This process's place on its host from the launcher's variables; nullopt when no launcher's variables say.
std::optional<LocalPlacement> local_rank_from_environment(int world_rank, const EnvLookup& getenv);

// Slurm's task counts per node ("2(x3),1") at node `node`: 2 for nodes 0-2, 1 for node 3; nullopt when the text is
// malformed or has no such node.
std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace minidl::dist
