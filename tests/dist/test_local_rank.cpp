// dist::local_rank_from_environment against the variables each launcher sets (Open MPI's mpirun, MPICH's Hydra,
// PMIx, Slurm's srun), their precedence, and the fallback (nullopt: dist::init then splits the world).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "dist/local_rank.h"

namespace minidl::testing {
namespace {

using Environment = std::map<std::string, std::string>;

std::optional<dist::LocalPlacement> placement(const Environment& env, int world_rank = 0) {
  return dist::local_rank_from_environment(world_rank, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

void expect_placement(const Environment& env, int world_rank, int local_rank, int ranks_on_host,
                      const std::string& launcher) {
  auto p = placement(env, world_rank);
  ASSERT_TRUE(p.has_value()) << "expected " << launcher << "'s variables to be read";
  EXPECT_EQ(p->local_rank, local_rank);
  EXPECT_EQ(p->ranks_on_host, ranks_on_host);
  EXPECT_EQ(p->launcher, launcher);
}

TEST(LocalRank, OpenMpi) {
  expect_placement({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}, 7, 3, 4, "Open MPI");
}

TEST(LocalRank, MpichHydra) {
  expect_placement({{"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}, 5, 1, 2, "MPICH");
}

TEST(LocalRank, Pmix) {
  expect_placement({{"PMIX_RANK", "6"}, {"PMIX_LOCAL_RANK", "2"}, {"PMIX_LOCAL_SIZE", "8"}}, 6, 2, 8, "PMIx");
}

// srun -N 3 -n 8 --ntasks-per-node=3: nodes 0 and 1 run 3 tasks, node 2 runs 2; world rank 7 is node 2's second.
TEST(LocalRank, SlurmStepLayout) {
  Environment srun = {{"SLURM_PROCID", "7"},
                      {"SLURM_LOCALID", "1"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_STEP_TASKS_PER_NODE", "3(x2),2"},
                      {"SLURM_TASKS_PER_NODE", "4(x3)"}};
  expect_placement(srun, 7, 1, 2, "Slurm");  // the step's layout wins over the job's
  srun.erase("SLURM_STEP_TASKS_PER_NODE");
  expect_placement(srun, 7, 1, 4, "Slurm");  // the job's, when the step's is missing
}

TEST(LocalRank, SlurmTasksPerNodeText) {
  EXPECT_EQ(dist::slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(dist::slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(dist::slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(dist::slurm_tasks_on_node("5,4(x3)", 0), 5);
  EXPECT_EQ(dist::slurm_tasks_on_node("5,4(x3)", 3), 4);
  EXPECT_EQ(dist::slurm_tasks_on_node("2(x3),1", 4), std::nullopt) << "no node 4";
  for (const char* bad : {"", "x", "2(x3", "2(x)", "2(x0)", "-1", "2,,1", "2(y3)"})
    EXPECT_EQ(dist::slurm_tasks_on_node(bad, 0), std::nullopt) << "'" << bad << "'";
}

// mpirun inside an sbatch script: every process inherits the script's SLURM_LOCALID=0 and SLURM_PROCID=0, which
// say nothing about ranks mpirun started; Open MPI's own variables win, and Slurm's alone count only for rank 0.
TEST(LocalRank, SlurmVariablesOfAnotherProcessAreIgnored) {
  Environment batch = {
      {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "1"}};
  EXPECT_EQ(placement(batch, 3), std::nullopt) << "SLURM_PROCID 0 describes another process than rank 3";
  batch["OMPI_COMM_WORLD_LOCAL_RANK"] = "3";
  batch["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  expect_placement(batch, 3, 3, 4, "Open MPI");
}

TEST(LocalRank, NothingOrNonsenseFallsBackToTheSplit) {
  EXPECT_EQ(placement({}), std::nullopt);
  EXPECT_EQ(placement({{"OMPI_COMM_WORLD_LOCAL_RANK", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), std::nullopt)
      << "local rank must be below the local count";
  EXPECT_EQ(placement({{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}), std::nullopt) << "no count";
  EXPECT_EQ(placement({{"MPI_LOCALRANKID", "one"}, {"MPI_LOCALNRANKS", "2"}}), std::nullopt);
  EXPECT_EQ(placement({{"PMIX_LOCAL_RANK", "-1"}, {"PMIX_LOCAL_SIZE", "2"}}), std::nullopt);
  EXPECT_EQ(placement({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}}), std::nullopt)
      << "Slurm without a tasks-per-node layout";
  EXPECT_EQ(
      placement({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2"}}),
      std::nullopt)
      << "SLURM_LOCALID beyond the node's task count";
  // A malformed first source does not hide a good later one.
  expect_placement({{"OMPI_COMM_WORLD_LOCAL_RANK", "x"},
                    {"SLURM_PROCID", "0"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_NODEID", "0"},
                    {"SLURM_TASKS_PER_NODE", "2"}},
                   0, 0, 2, "Slurm");
}

}  // namespace
}  // namespace minidl::testing
