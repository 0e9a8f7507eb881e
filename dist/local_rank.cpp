#include "dist/local_rank.h"

#include <cstdint>
#include <cstdlib>

namespace minidl::dist {

namespace {

// A whole non-negative number in decimal; nullopt for unset, empty, signed or trailing text.
std::optional<int> parse_count(const char* text) {
  if (!text || *text < '0' || *text > '9') return std::nullopt;
  char* end = nullptr;
  long x = std::strtol(text, &end, 10);
  if (*end != '\0' || x > 1 << 30) return std::nullopt;
  return int(x);
}

std::optional<LocalPlacement> from_pair(const EnvLookup& getenv, const char* rank_var, const char* size_var,
                                        const char* launcher) {
  std::optional<int> rank = parse_count(getenv(rank_var)), size = parse_count(getenv(size_var));
  if (!rank || !size || *rank >= *size) return std::nullopt;
  return LocalPlacement{*rank, *size, launcher};
}

std::optional<LocalPlacement> from_slurm(int world_rank, const EnvLookup& getenv) {
  std::optional<int> procid = parse_count(getenv("SLURM_PROCID"));
  std::optional<int> localid = parse_count(getenv("SLURM_LOCALID"));
  std::optional<int> node = parse_count(getenv("SLURM_NODEID"));
  if (!procid || *procid != world_rank || !localid || !node) return std::nullopt;
  const char* layout = getenv("SLURM_STEP_TASKS_PER_NODE");
  if (!layout) layout = getenv("SLURM_TASKS_PER_NODE");
  if (!layout) return std::nullopt;
  std::optional<int> size = slurm_tasks_on_node(layout, *node);
  if (!size || *localid >= *size) return std::nullopt;
  return LocalPlacement{*localid, *size, "Slurm"};
}

}  // namespace

std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // Comma-separated groups, each "count" or "count(xrepeat)", in node order; all of them read, so that malformed
  // text is refused whichever node asks.
  std::optional<int> tasks;
  size_t pos = 0;
  int64_t first_node = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    std::string group = tasks_per_node.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? tasks_per_node.size() : comma + 1;
    std::optional<int> count, repeat = 1;
    if (size_t paren = group.find("(x"); paren != std::string::npos) {
      if (group.back() != ')') return std::nullopt;
      count = parse_count(group.substr(0, paren).c_str());
      repeat = parse_count(group.substr(paren + 2, group.size() - paren - 3).c_str());
    } else {
      count = parse_count(group.c_str());
    }
    if (!count || !repeat || *repeat == 0) return std::nullopt;
    if (!tasks && node < first_node + *repeat) tasks = count;
    first_node += *repeat;
  }
  if (tasks_per_node.empty() || tasks_per_node.back() == ',') return std::nullopt;
  return tasks;
}

std::optional<LocalPlacement> local_rank_from_environment(int world_rank, const EnvLookup& getenv) {
  if (auto p = from_pair(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI")) return p;
  if (auto p = from_pair(getenv, "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPICH")) return p;
  if (auto p = from_pair(getenv, "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE", "PMIx")) return p;
  return from_slurm(world_rank, getenv);
}

}  // namespace minidl::dist
