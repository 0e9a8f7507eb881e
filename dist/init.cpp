#include "dist/init.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "core/parallel.h"
#include "dist/flight_recorder.h"
#include "dist/local_rank.h"
#include "dist/process_group.h"

namespace minidl::dist {

namespace detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", code);
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  throw Error(::minidl::detail::concat(call, " failed on rank ", rank, " (host ", host, ", pid ", getpid(), "): ", text,
                                       " (", file, ":", line, ")"));
}

}  // namespace detail

namespace {

// FNV-1a: a stable hash (std::hash may differ between builds, and ranks may run different binaries by mistake).
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

Context::Context(Context&& o) noexcept
    : owns_mpi_(std::exchange(o.owns_mpi_, false)),
      rank_(o.rank_),
      world_size_(o.world_size_),
      local_rank_(o.local_rank_),
      ranks_on_host_(o.ranks_on_host_),
      threads_per_rank_(o.threads_per_rank_),
      thread_level_(o.thread_level_) {}

Context::~Context() {
  stop_watchdog();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

void Context::abort(int exit_code) const {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever does
}

bool under_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}

Context init(int& argc, char**& argv) {
  Context ctx;
  int initialized = 0;
  MINIDL_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // A rank's communication thread waits inside MPI while its compute threads work; Open MPI's default is to spin
    // at full speed there, taking a core from the computation it is meant to overlap. Yielding while idle gives
    // the core back (the user's own setting wins: overwrite = 0).
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    // A singleton (no launcher) would fork Open MPI's daemon, orted, found through PATH, to serve a spawn that
    // minidl never asks for; a node without Open MPI installed has none, and MPI_Init would fail. Isolated, the
    // singleton is a world of one by itself.
    if (!under_mpi_launcher()) setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    MINIDL_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &ctx.thread_level_));
    ctx.owns_mpi_ = true;
  } else {
    MINIDL_MPI_CHECK(MPI_Query_thread(&ctx.thread_level_));
  }
  MINIDL_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MINIDL_CHECK(ctx.thread_level_ >= MPI_THREAD_SERIALIZED, "dist::init: the MPI library provides thread level ",
               ctx.thread_level_, "; minidl needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE");
  MINIDL_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank_));
  ::minidl::detail::set_process_rank(ctx.rank_);
  MINIDL_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &ctx.world_size_));

  // The launcher (mpirun, srun, ...) tells each process where it stands on its host (dist/local_rank.h); without
  // one (a singleton, an unknown launcher) the same numbers come from a split of the world into shared-memory islands.
  int local_rank = 0, local_size = 1;
  if (auto placement = local_rank_from_environment(ctx.rank_, [](const char* name) { return std::getenv(name); })) {
    local_rank = placement->local_rank;
    local_size = placement->ranks_on_host;
  } else {
    MPI_Comm node;
    MINIDL_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx.rank_, MPI_INFO_NULL, &node));
    MINIDL_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    MINIDL_MPI_CHECK(MPI_Comm_size(node, &local_size));
    MINIDL_MPI_CHECK(MPI_Comm_free(&node));
  }
  ctx.local_rank_ = local_rank;
  ctx.ranks_on_host_ = local_size;
  ctx.threads_per_rank_ = default_num_threads(local_size);
  set_num_threads(ctx.threads_per_rank_);
  // The watchdog (dist/flight_recorder.h), configured from the environment; the job's id (rank 0's process id)
  // names its default debug directory, the same on every rank.
  int job = int(::getpid());
  MINIDL_MPI_CHECK(MPI_Bcast(&job, 1, MPI_INT, 0, MPI_COMM_WORLD));
  start_watchdog(watchdog_options_from_environment(std::to_string(job)), ctx.rank_);
  if (const char* check = std::getenv("MINIDL_CHECK_COLLECTIVES"); check && std::string(check) == "1")
    set_checking_collectives(true);
  return ctx;
}

void check_same_config(const Context& ctx, const std::vector<std::pair<std::string, std::string>>& fields) {
  const MPI_Comm world = ctx.world();
  const int n = ctx.world_size();
  const int k = int(fields.size());

  std::vector<int> counts(n);
  MINIDL_MPI_CHECK(MPI_Allgather(&k, 1, MPI_INT, counts.data(), 1, MPI_INT, world));
  for (int r = 1; r < n; ++r)
    MINIDL_CHECK(counts[r] == counts[0], "configuration differs across ranks: rank 0 has ", counts[0], " fields, rank ",
                 r, " has ", counts[r]);

  std::vector<uint64_t> mine(k), all(size_t(n) * k);
  for (int i = 0; i < k; ++i) mine[i] = fnv1a(fields[i].second, fnv1a(fields[i].first + '\0'));
  MINIDL_MPI_CHECK(MPI_Allgather(mine.data(), k, MPI_UINT64_T, all.data(), k, MPI_UINT64_T, world));

  // Every rank sees the same hash table, so every rank finds the same differing fields and takes the same path
  // through the gathers below (no rank can be left waiting in a collective the others skipped).
  std::ostringstream msg;
  int differing = 0;
  for (int i = 0; i < k; ++i) {
    std::vector<int> ranks;
    for (int r = 1; r < n; ++r)
      if (all[size_t(r) * k + i] != all[i]) ranks.push_back(r);
    if (ranks.empty()) continue;

    // Gather this field's "name\0value" from every rank (only fields that differ travel as text).
    std::string text = fields[i].first + '\0' + fields[i].second;
    int len = int(text.size());
    std::vector<int> lens(n), displs(n);
    MINIDL_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, world));
    for (int r = 1; r < n; ++r) displs[r] = displs[r - 1] + lens[r - 1];
    std::string texts(size_t(displs[n - 1] + lens[n - 1]), '\0');
    MINIDL_MPI_CHECK(
        MPI_Allgatherv(text.data(), len, MPI_CHAR, texts.data(), lens.data(), displs.data(), MPI_CHAR, world));
    auto name_of = [&](int r) { return std::string(texts.c_str() + displs[r]); };
    auto value_of = [&](int r) {
      size_t nl = name_of(r).size() + 1;
      return texts.substr(displs[r] + nl, lens[r] - nl);
    };

    msg << (differing++ ? "; " : "") << name_of(0) << ": rank 0 has '" << value_of(0) << "'";
    constexpr size_t kMaxRanksNamed = 4;
    for (size_t j = 0; j < ranks.size() && j < kMaxRanksNamed; ++j) {
      int r = ranks[j];
      msg << ", rank " << r << " has ";
      if (name_of(r) != name_of(0)) msg << "field '" << name_of(r) << "' = ";
      msg << "'" << value_of(r) << "'";
    }
    if (ranks.size() > kMaxRanksNamed) msg << " (and " << ranks.size() - kMaxRanksNamed << " more ranks)";
  }
  MINIDL_CHECK(differing == 0, "configuration differs across ranks: ", msg.str());
}

}  // namespace minidl::dist
