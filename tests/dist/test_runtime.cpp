// The runtime around the collectives: the context, the configuration check, chunk boundaries, the rank grid,
// and what a backend that lacks an operation says.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dist/shard.h"
#include "dist/topology.h"
#include "dist_test_util.h"

namespace minidl::testing {
namespace {

TEST(Context, AgreesWithMpi) {
  const dist::Context& ctx = mpi_context();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(ctx.rank(), rank);
  EXPECT_EQ(ctx.world_size(), size);
  EXPECT_GE(ctx.local_rank(), 0);
  EXPECT_LT(ctx.local_rank(), ctx.ranks_on_host());
  EXPECT_EQ(ctx.device_index(), ctx.local_rank());
  EXPECT_GE(ctx.threads_per_rank(), 1);
  EXPECT_GE(ctx.thread_level(), MPI_THREAD_SERIALIZED);
  // The launcher's placement (dist/local_rank.h) is MPI's own split into hosts, on one host (all ranks) and on
  // several (tests/dist/test_multi_host.py runs this across two): as many ranks, numbered in world-rank order.
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int host_rank = -1, host_size = -1;
  MPI_Comm_rank(host, &host_rank);
  MPI_Comm_size(host, &host_size);
  EXPECT_EQ(ctx.ranks_on_host(), host_size);
  EXPECT_EQ(ctx.local_rank(), host_rank);
  // The local ranks of a host are a permutation of 0..ranks_on_host-1.
  std::vector<int> locals(host_size);
  int mine = ctx.local_rank();
  MPI_Allgather(&mine, 1, MPI_INT, locals.data(), 1, MPI_INT, host);
  MPI_Comm_free(&host);
  std::sort(locals.begin(), locals.end());
  for (int i = 0; i < host_size; ++i) EXPECT_EQ(locals[i], i);
}

TEST(ConfigCheck, SameConfigPasses) {
  EXPECT_NO_THROW(dist::check_same_config(mpi_context(), {{"model", "gpt"}, {"batch", "12"}}));
  EXPECT_NO_THROW(dist::check_same_config(mpi_context(), {}));
}

TEST(ConfigCheck, EveryRankStopsNamingTheDifferingField) {
  const dist::Context& ctx = mpi_context();
  const std::string batch = ctx.rank() == 1 ? "16" : "12";
  auto check = [&] { dist::check_same_config(ctx, {{"model", "gpt"}, {"batch", batch}, {"seed", "1337"}}); };
  if (ctx.world_size() == 1) {
    EXPECT_NO_THROW(check());
    return;
  }
  try {
    check();
    ADD_FAILURE() << "rank " << ctx.rank() << " did not throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("batch: rank 0 has '12', rank 1 has '16'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("seed"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("model"), std::string::npos) << msg;
  }
}

TEST(ConfigCheck, DifferentNumberOfFields) {
  const dist::Context& ctx = mpi_context();
  std::vector<std::pair<std::string, std::string>> fields = {{"a", "1"}};
  if (ctx.rank() == ctx.world_size() - 1 && ctx.world_size() > 1) fields.push_back({"b", "2"});
  if (ctx.world_size() == 1) return;
  EXPECT_THROW(dist::check_same_config(ctx, fields), Error);
}

TEST(ChunkRange, CoversTheBufferWithNearEqualChunks) {
  for (int64_t numel : {0, 1, 2, 3, 5, 7, 64, 1001})
    for (int parts : {1, 2, 3, 4, 7}) {
      int64_t next = 0, smallest = numel, largest = 0;
      for (int i = 0; i < parts; ++i) {
        dist::ShardRange c = dist::shard_range(numel, parts, i);
        EXPECT_EQ(c.begin, next);
        next = c.end;
        smallest = std::min(smallest, c.size());
        largest = std::max(largest, c.size());
      }
      EXPECT_EQ(next, numel);
      EXPECT_LE(largest - smallest, 1);
      EXPECT_EQ(dist::shard_range(numel, parts, 0).size(), largest) << "chunk 0 is a largest chunk";
    }
  EXPECT_EQ(dist::shard_range(2, 4, 3).size(), 0);
}

TEST(Grid, TensorParallelVariesFastest) {
  dist::Grid grid{.dp = 2, .tp = 2, .pp = 1};
  EXPECT_EQ(grid.coord_of(0), (dist::GridCoord{0, 0, 0}));
  EXPECT_EQ(grid.coord_of(1), (dist::GridCoord{.dp = 0, .tp = 1, .pp = 0}));
  EXPECT_EQ(grid.coord_of(2), (dist::GridCoord{.dp = 1, .tp = 0, .pp = 0}));
  dist::Grid pipe{.dp = 1, .tp = 2, .pp = 2};
  EXPECT_EQ(pipe.coord_of(3), (dist::GridCoord{.dp = 0, .tp = 1, .pp = 1}));
  EXPECT_EQ(pipe.coord_of(2), (dist::GridCoord{.dp = 0, .tp = 0, .pp = 1}));
}

const std::vector<dist::Grid> kGridsOf4 = {{4, 1, 1}, {1, 4, 1}, {1, 1, 4}, {2, 2, 1}, {2, 1, 2}, {1, 2, 2}};

TEST(Grid, RankAndCoordinatesRoundTrip) {
  for (const dist::Grid& g : kGridsOf4) {
    std::vector<int> seen(4, 0);
    for (int r = 0; r < 4; ++r) {
      dist::GridCoord c = g.coord_of(r);
      EXPECT_EQ(g.rank_of(c), r);
      EXPECT_EQ(r, (c.pp * g.dp + c.dp) * g.tp + c.tp);
      ++seen[r];
    }
    EXPECT_EQ(seen, std::vector<int>(4, 1));
  }
}

TEST(Grid, MismatchedWorldIsAClearError) {
  try {
    dist::Grid{.dp = 3, .tp = 1, .pp = 1}.check_world(4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dp × tp × pp = 3 × 1 × 1 = 3 does not match the world size 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dist::Grid({.dp = 0, .tp = 2, .pp = 2}).check_world(0), Error);
  const int n = mpi_context().world_size();
  EXPECT_THROW(dist::Topology(MPI_COMM_WORLD, {.dp = n + 1, .tp = 1, .pp = 1}, "mpi"), Error);
  EXPECT_THROW(dist::Topology(MPI_COMM_WORLD, {.dp = n, .tp = 1, .pp = 1}, "nccl"), Error);
}

// The groups along each axis hold exactly the ranks the grid says: summing world ranks over a group gives the
// sum of the ranks that share this rank's other two coordinates.
TEST(Topology, GroupsFollowTheGrid) {
  const int n = mpi_context().world_size(), me = mpi_context().rank();
  std::vector<dist::Grid> grids = {{n, 1, 1}, {1, n, 1}, {1, 1, n}};
  if (n == 4) grids = kGridsOf4;
  for (const std::string backend : {"mpi", "ring"})
    for (const dist::Grid& g : grids) {
      SCOPED_TRACE(::testing::Message() << backend << " dp " << g.dp << " tp " << g.tp << " pp " << g.pp);
      dist::Topology topo(MPI_COMM_WORLD, g, backend);
      const dist::GridCoord c = topo.coord();
      EXPECT_EQ(c, g.coord_of(me));
      struct Axis {
        dist::ProcessGroup& group;
        int size, coord;
        int dist::GridCoord::*field;
      };
      for (Axis axis : {Axis{topo.dp_group(), g.dp, c.dp, &dist::GridCoord::dp},
                        Axis{topo.tp_group(), g.tp, c.tp, &dist::GridCoord::tp},
                        Axis{topo.pp_group(), g.pp, c.pp, &dist::GridCoord::pp}}) {
        EXPECT_EQ(axis.group.size(), axis.size);
        EXPECT_EQ(axis.group.rank(), axis.coord);
        Tensor t = Tensor::full({1}, double(me), DType::i64);
        axis.group.all_reduce(t, dist::ReduceOp::kSum)->wait();
        int64_t expected = 0;
        for (int i = 0; i < axis.size; ++i) {
          dist::GridCoord other = c;
          other.*axis.field = i;
          expected += g.rank_of(other);
        }
        EXPECT_EQ(int64_t(t.item()), expected);
      }
      // The embedding group: first and last stage of this (dp, tp); none on a middle stage.
      const bool holds_embedding = c.pp == 0 || c.pp == g.pp - 1;
      ASSERT_EQ(topo.embedding_group() != nullptr, holds_embedding);
      if (holds_embedding) {
        Tensor t = Tensor::full({1}, double(me), DType::i64);
        topo.embedding_group()->all_reduce(t, dist::ReduceOp::kSum)->wait();
        int64_t expected = g.rank_of({c.dp, c.tp, 0});
        if (g.pp > 1) expected += g.rank_of({c.dp, c.tp, g.pp - 1});
        EXPECT_EQ(int64_t(t.item()), expected);
        EXPECT_EQ(topo.embedding_group()->size(), g.pp > 1 ? 2 : 1);
      }
      // The model-parallel group: every (tp, pp) of this dp replica.
      Tensor t = Tensor::full({1}, double(me), DType::i64);
      topo.model_parallel_group().all_reduce(t, dist::ReduceOp::kSum)->wait();
      int64_t expected = 0;
      for (int pp = 0; pp < g.pp; ++pp)
        for (int tp = 0; tp < g.tp; ++tp) expected += g.rank_of({c.dp, tp, pp});
      EXPECT_EQ(int64_t(t.item()), expected);
      EXPECT_EQ(topo.model_parallel_group().size(), g.tp * g.pp);
    }
}

// The sum of the group's members' world ranks (each rank contributes `me`): which ranks a group joined.
static int64_t member_sum(dist::ProcessGroup& group, int me) {
  Tensor t = Tensor::full({1}, double(me), DType::i64);
  group.all_reduce(t, dist::ReduceOp::kSum)->wait();
  return int64_t(t.item());
}

// Expert parallelism cuts the dp group into ep groups of ep consecutive dp ranks (ranked dp rank % ep), and the
// expert-dp group joins the ranks at the same place in each (ranked dp rank / ep): dist/topology.h.
TEST(Topology, ExpertParallelGroupsCutTheDpGroup) {
  const int n = mpi_context().world_size(), me = mpi_context().rank();
  std::vector<dist::Grid> grids = {{.dp = n, .ep = n}, {.dp = n}};
  if (n == 4) grids.push_back({.dp = 4, .ep = 2}), grids.push_back({.dp = 2, .tp = 2, .ep = 2});
  for (const dist::Grid& g : grids) {
    SCOPED_TRACE(::testing::Message() << "dp " << g.dp << " tp " << g.tp << " ep " << g.ep);
    dist::Topology topo(MPI_COMM_WORLD, g, "mpi");
    const dist::GridCoord c = topo.coord();
    int64_t ep_sum = 0, edp_sum = 0;
    for (int d = 0; d < g.dp; ++d) {
      const int64_t r = g.rank_of({.dp = d, .tp = c.tp, .pp = c.pp});
      if (d / g.ep == c.dp / g.ep) ep_sum += r;
      if (d % g.ep == c.dp % g.ep) edp_sum += r;
    }
    EXPECT_EQ(topo.ep_group().size(), g.ep);
    EXPECT_EQ(topo.ep_group().rank(), c.dp % g.ep);
    EXPECT_EQ(member_sum(topo.ep_group(), me), ep_sum);
    EXPECT_EQ(topo.expert_dp_group().size(), g.dp / g.ep);
    EXPECT_EQ(topo.expert_dp_group().rank(), c.dp / g.ep);
    EXPECT_EQ(member_sum(topo.expert_dp_group(), me), edp_sum);
  }
  EXPECT_THROW(dist::Topology(MPI_COMM_WORLD, dist::Grid{.dp = n, .ep = n + 1}, "mpi"), Error);
}

// With a cp axis (tp-cp-dp-pp, tp fastest): the cp group is cp consecutive blocks of tp ranks, and the dp group,
// the gradients' group, spans dp and cp together, ranked dp · cp + cp (dist/topology.h).
TEST(Topology, ContextParallelGroupsFollowTheGrid) {
  const int n = mpi_context().world_size(), me = mpi_context().rank();
  std::vector<dist::Grid> grids = {{.cp = n}};
  if (n == 4)
    grids = {{.cp = 4}, {.dp = 2, .cp = 2}, {.tp = 2, .cp = 2}, {.pp = 2, .cp = 2}};
  else if (n == 2)
    grids = {{.cp = 2}};
  for (const dist::Grid& g : grids) {
    SCOPED_TRACE(::testing::Message() << "dp " << g.dp << " cp " << g.cp << " tp " << g.tp << " pp " << g.pp);
    for (int r = 0; r < g.size(); ++r) {
      const dist::GridCoord c = g.coord_of(r);
      EXPECT_EQ(g.rank_of(c), r);
      EXPECT_EQ(r, ((c.pp * g.dp + c.dp) * g.cp + c.cp) * g.tp + c.tp);
    }
    dist::Topology topo(MPI_COMM_WORLD, g, "mpi");
    const dist::GridCoord c = topo.coord();
    int64_t cp_sum = 0, dp_sum = 0, mp_sum = 0;
    for (int i = 0; i < g.cp; ++i) cp_sum += g.rank_of({.dp = c.dp, .tp = c.tp, .pp = c.pp, .cp = i});
    for (int d = 0; d < g.dp; ++d)
      for (int i = 0; i < g.cp; ++i) dp_sum += g.rank_of({.dp = d, .tp = c.tp, .pp = c.pp, .cp = i});
    for (int pp = 0; pp < g.pp; ++pp)
      for (int tp = 0; tp < g.tp; ++tp) mp_sum += g.rank_of({.dp = c.dp, .tp = tp, .pp = pp, .cp = c.cp});
    EXPECT_EQ(topo.cp_group().size(), g.cp);
    EXPECT_EQ(topo.cp_group().rank(), c.cp);
    EXPECT_EQ(member_sum(topo.cp_group(), me), cp_sum);
    EXPECT_EQ(topo.dp_group().size(), g.dp * g.cp);
    EXPECT_EQ(topo.dp_group().rank(), c.dp * g.cp + c.cp);
    EXPECT_EQ(member_sum(topo.dp_group(), me), dp_sum);
    EXPECT_EQ(topo.model_parallel_group().size(), g.tp * g.pp);
    EXPECT_EQ(member_sum(topo.model_parallel_group(), me), mp_sum);
    EXPECT_EQ(topo.tp_group().rank(), c.tp);
    EXPECT_EQ(topo.pp_group().rank(), c.pp);
  }
  try {
    dist::Grid{.dp = 1, .cp = 3}.check_world(4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dp × cp × tp × pp = 1 × 3 × 1 × 1 = 3 does not match the world size 4"),
              std::string::npos)
        << e.what();
  }
}

// A backend that implements nothing: every operation names the backend and itself.
class EmptyBackend : public dist::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "empty"; }
};

TEST(ProcessGroup, UnimplementedOperationsSayWhichAndWhere) {
  EmptyBackend pg;
  Tensor t = Tensor::zeros({3});
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { pg.all_reduce(t, dist::ReduceOp::kSum); }), "backend empty does not support all_reduce");
  EXPECT_EQ(message([&] { pg.reduce_scatter(t, t, dist::ReduceOp::kSum); }),
            "backend empty does not support reduce_scatter");
  EXPECT_EQ(message([&] { pg.all_gather(t, t); }), "backend empty does not support all_gather");
  EXPECT_EQ(message([&] { pg.broadcast(t, 0); }), "backend empty does not support broadcast");
  EXPECT_EQ(message([&] { pg.send(t, 0, 0); }), "backend empty does not support send");
  EXPECT_EQ(message([&] { pg.recv(t, 0, 0); }), "backend empty does not support recv");
  EXPECT_EQ(message([&] { pg.barrier(); }), "backend empty does not support barrier");
  EXPECT_THROW(dist::make_process_group("gloo", MPI_COMM_WORLD), Error);
}

TEST(MpiCheck, ErrorsNameTheCallTheRankAndMpisText) {
  try {
    MINIDL_MPI_CHECK(MPI_Send(nullptr, 1, MPI_INT, 1 << 20, 0, MPI_COMM_WORLD));  // no such rank
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("MPI_Send(nullptr, 1, MPI_INT, 1 << 20, 0, MPI_COMM_WORLD) failed on rank " +
                       std::to_string(mpi_context().rank())),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("MPI_ERR_RANK"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_runtime.cpp:"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace minidl::testing
