// The parameter server (dist/parameter_server.h) at 3 ranks (2 workers, 1 server) and 4 (2 workers and 2 servers,
// or 3 workers and 1 server), on a nonlinear toy objective whose gradient depends on the parameters:
// - sync = DDP's arithmetic: bitwise the workers' own all-reduce average at W = 2, bitwise the replay at any W;
// - async and ssp with a slow worker: the servers' final shards are bitwise ps_replay() of their logs (the stale
//   gradients recomputed on the versions the log names, applied in the logged order), and the counts add up;
// - ssp:1 keeps its bound in every server's log, which ssp_violation() checks, and rejects a log that breaks it;
// - the teaching version (dist/naive/parameter_server.h): sync bitwise production's, async bitwise the replay of
//   its own log by production's ps_replay.
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <cmath>
#include <thread>

#include "dist/naive/parameter_server.h"
#include "dist/parameter_server.h"
#include "dist/shard.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

constexpr int64_t kNumel = 37, kSteps = 12;

// Worker w's gradient at step `step`: pulls θ towards a target of its own, through a nonlinearity, so a stale θ
// gives another gradient.
std::vector<float> gradient(int w, int64_t step, const std::vector<float>& theta) {
  std::vector<float> g(theta.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const float target = float((int64_t(i) * 7 + w * 3 + step) % 11) / 5.0f - 1.0f;
    g[i] = std::tanh(theta[i] - target) + 0.1f * theta[i] * theta[i];
  }
  return g;
}

void sgd(std::vector<float>& shard, const std::vector<float>& g) {
  for (size_t i = 0; i < shard.size(); ++i) shard[i] = shard[i] - 0.3f * g[i];
}
void sgd_at(int, std::vector<float>& shard, const std::vector<float>& g) { sgd(shard, g); }

std::vector<float> initial() {
  std::vector<float> v(static_cast<size_t>(kNumel));
  for (int64_t i = 0; i < kNumel; ++i) v[size_t(i)] = float(i % 5) * 0.25f - 0.5f;
  return v;
}

struct Outcome {
  std::vector<float> params;                    // the servers' shards, joined (on rank 0)
  std::vector<std::vector<dist::PsPush>> logs;  // every server's (on rank 0)
  std::vector<float> worker0_final;             // what worker 0's last pull returned (on rank 0)
};

// What a test needs to see, made to happen whatever the machine's load: the workers `held` push nothing until worker 0
// has had `release_after` pushes answered (or has stopped), so worker 0 runs ahead of them by construction.
struct Hold {
  std::vector<int> held;
  int64_t release_after = 0;
};

// Runs `steps` steps with `servers` servers (the other ranks work); worker `slow` sleeps `ms` before each push, the
// others 1 ms.
// Rank 0 (a worker) collects the servers' shards and logs.
Outcome run(int servers, dist::PsOptions options, int slow = -1, int ms = 0, const Hold& hold = {}) {
  const int world = ctx().world_size(), rank = ctx().rank();
  const dist::PsLayout layout{.workers = world - servers, .servers = servers, .numel = kNumel};
  Outcome out;
  if (rank >= layout.workers) {
    const int j = rank - layout.workers;
    const dist::ShardRange r = dist::shard_range(kNumel, servers, j);
    const std::vector<float> all = initial();
    dist::ParameterServer server(ctx().world(), layout, j, {all.begin() + r.begin, all.begin() + r.end}, sgd, options);
    server.serve(kSteps);
    std::vector<int64_t> log;  // to rank 0: the shard, then the log flattened
    for (const dist::PsPush& p : server.log()) log.insert(log.end(), {p.worker, p.step, p.computed, p.version});
    MPI_Send(server.shard().data(), int(server.shard().size()), MPI_FLOAT, 0, 1, ctx().world());
    const int n = int(log.size());
    MPI_Send(&n, 1, MPI_INT, 0, 2, ctx().world());
    MPI_Send(log.data(), n, MPI_INT64_T, 0, 3, ctx().world());
    return out;
  }
  dist::PsWorker worker(ctx().world(), layout, rank);
  std::vector<float> theta = worker.pull();
  const bool held = std::count(hold.held.begin(), hold.held.end(), rank) > 0;
  bool released = hold.held.empty();
  auto release = [&] {  // worker 0: a token to each held worker, once
    for (int w : hold.held) MPI_Send(&rank, 1, MPI_INT, w, 9, ctx().world());
    released = true;
  };
  int token = 0;
  if (held) MPI_Recv(&token, 1, MPI_INT, 0, 9, ctx().world(), MPI_STATUS_IGNORE);
  for (int64_t s = 0; !worker.stopped(); ++s) {
    // Everyone computes for 1 ms, the slow worker for `ms`: with one server the fast ones push more of the
    // steps · W gradients, and the slow one's arrive stale.
    if (slow >= 0) std::this_thread::sleep_for(std::chrono::milliseconds(rank == slow ? ms : 1));
    theta = worker.push_pull(s, gradient(rank, s, theta));
    if (rank == 0 && !released && s + 1 >= hold.release_after) release();
  }
  if (rank == 0 && !released) release();
  const std::vector<float> last = worker.final_pull();  // every worker's last gradient in
  if (rank != 0) return out;
  out.worker0_final = last;
  out.params.resize(size_t(kNumel));
  for (int j = 0; j < servers; ++j) {
    const dist::ShardRange r = dist::shard_range(kNumel, servers, j);
    const int src = layout.workers + j;
    MPI_Recv(out.params.data() + r.begin, int(r.size()), MPI_FLOAT, src, 1, ctx().world(), MPI_STATUS_IGNORE);
    int n = 0;
    MPI_Recv(&n, 1, MPI_INT, src, 2, ctx().world(), MPI_STATUS_IGNORE);
    std::vector<int64_t> flat(static_cast<size_t>(n));
    MPI_Recv(flat.data(), n, MPI_INT64_T, src, 3, ctx().world(), MPI_STATUS_IGNORE);
    std::vector<dist::PsPush> log;
    for (size_t e = 0; e + 3 < flat.size(); e += 4)
      log.push_back({int(flat[e]), flat[e + 1], flat[e + 2], flat[e + 3]});
    out.logs.push_back(std::move(log));
  }
  return out;
}

// 1 server, and at 4 ranks 2 as well.
std::vector<int> server_counts() { return ctx().world_size() >= 4 ? std::vector<int>{1, 2} : std::vector<int>{1}; }

}  // namespace

// Sync: every worker gets the same parameters each step; at 2 workers they are bitwise what the workers' own
// all-reduce average (MPI's sum of two, then / 2, then the same SGD) gives; at any W, bitwise the replay.
TEST(ParameterServer, SyncIsDdpsArithmeticAndItsReplay) {
  for (int servers : server_counts()) {
    SCOPED_TRACE(std::to_string(servers) + " servers");
    const int workers = ctx().world_size() - servers;
    Outcome o = run(servers, dist::ps_options("sync"));
    if (ctx().rank() != 0) continue;
    EXPECT_EQ(o.worker0_final, o.params);
    const dist::PsLayout layout{workers, servers, kNumel};
    EXPECT_EQ(dist::ps_replay(layout, o.logs, initial(), gradient, sgd_at, dist::ps_options("sync")), o.params);
    if (workers == 2) {  // DDP by hand: mean of the two gradients (a sum of two floats is MPI's in any order)
      std::vector<float> theta = initial();
      for (int64_t s = 0; s < kSteps; ++s) {
        const std::vector<float> g0 = gradient(0, s, theta), g1 = gradient(1, s, theta);
        std::vector<float> mean(g0.size());
        for (size_t i = 0; i < mean.size(); ++i) mean[i] = (g1[i] + g0[i]) / 2.0f;
        sgd(theta, mean);
      }
      EXPECT_EQ(theta, o.params);
    }
    for (const auto& log : o.logs) {
      ASSERT_EQ(log.size(), size_t(workers * kSteps));
      for (const dist::PsPush& p : log) EXPECT_EQ(p.computed, p.step);  // nobody is stale in sync
    }
  }
}

// Async with worker 1 slow: the fast workers race ahead and the slow one's gradients arrive stale; whatever the
// interleaving was, the replay of the logs is the servers' result bit for bit.
TEST(ParameterServer, AsyncIsBitwiseItsReplay) {
  for (int servers : server_counts()) {
    SCOPED_TRACE(std::to_string(servers) + " servers");
    const int workers = ctx().world_size() - servers;
    std::vector<int> others;
    for (int w = 1; w < workers; ++w) others.push_back(w);
    Outcome o = run(servers, dist::ps_options("async"), /*slow=*/1, /*ms=*/3, Hold{others, 3});
    if (ctx().rank() != 0) continue;
    const dist::PsLayout layout{workers, servers, kNumel};
    EXPECT_EQ(dist::ps_replay(layout, o.logs, initial(), gradient, sgd_at, dist::ps_options("async")), o.params);
    int64_t stale = 0;
    for (const auto& log : o.logs) {
      ASSERT_EQ(log.size(), size_t(workers * kSteps));
      for (const dist::PsPush& p : log) stale += p.version - 1 - p.computed;
    }
    EXPECT_GT(stale, 0) << "no gradient was stale, though the other workers waited for worker 0's three pushes";
    EXPECT_EQ(o.worker0_final, o.params);  // the final pull: every worker's last gradient in
    // A log with two entries of different workers swapped replays to something else (or not at all).
    std::vector<std::vector<dist::PsPush>> swapped = o.logs;
    size_t e = 1;
    while (e < swapped[0].size() && swapped[0][e].worker == swapped[0][0].worker) ++e;
    ASSERT_LT(e, swapped[0].size());
    std::swap(swapped[0][0], swapped[0][e]);
    bool differs = true;
    try {
      differs = dist::ps_replay(layout, swapped, initial(), gradient, sgd_at, dist::ps_options("async")) != o.params;
    } catch (const Error&) {}
    EXPECT_TRUE(differs);
  }
}

// SSP with s = 1 and a slow worker: every server's log keeps the bound (and replays bitwise); async's does not.
TEST(ParameterServer, SspKeepsItsBoundAndAsyncDoesNot) {
  const int servers = 1, workers = ctx().world_size() - servers;
  Outcome o = run(servers, dist::ps_options("ssp:1"), /*slow=*/1, /*ms=*/3);
  std::vector<int> others;  // async: worker 0 three pushes ahead of everyone, by construction
  for (int w = 1; w < workers; ++w) others.push_back(w);
  Outcome a = run(servers, dist::ps_options("async"), /*slow=*/1, /*ms=*/3, Hold{others, 3});
  if (ctx().rank() != 0) return;
  const dist::PsLayout layout{workers, servers, kNumel};
  EXPECT_EQ(dist::ssp_violation(o.logs[0], workers, 1), "");
  EXPECT_EQ(dist::ps_replay(layout, o.logs, initial(), gradient, sgd_at, dist::ps_options("ssp:1")), o.params);
  EXPECT_NE(dist::ssp_violation(a.logs[0], workers, 1), "") << "worker 0's three pushes before anyone's keep s = 1";
  // A hand-made log: worker 0's step 2 applied before worker 1 pushed anything breaks s = 1.
  const std::vector<dist::PsPush> bad = {{0, 0, 0, 1}, {0, 1, 1, 2}, {0, 2, 2, 3}, {1, 0, 0, 4}};
  EXPECT_NE(dist::ssp_violation(bad, 2, 1).find("worker 0's step 2"), std::string::npos);
  EXPECT_EQ(dist::ssp_violation(bad, 2, 2), "");
}

// Backup workers (sync, one server): each step takes the first W − 1 gradients; worker 1, held until worker 0 is
// done, makes it into none, its gradients dropped as late (counted); the replay of the log (each step's entries,
// summed in worker order) is bitwise.
TEST(ParameterServer, BackupWorkersDropTheLateGradients) {
  const int workers = ctx().world_size() - 1;
  dist::PsOptions backup = dist::ps_options("sync");
  backup.backup = 1;
  Outcome o = run(1, backup, /*slow=*/1, /*ms=*/6, Hold{{1}, kSteps});  // worker 1 pushes only once 0 is done
  if (ctx().rank() != 0) return;
  const dist::PsLayout layout{workers, 1, kNumel};
  ASSERT_EQ(o.logs[0].size(), size_t((workers - 1) * kSteps));  // W − 1 a step
  int64_t slow = 0;
  for (const dist::PsPush& p : o.logs[0]) slow += p.worker == 1;
  EXPECT_EQ(slow, 0) << "the held worker made it into a step";
  EXPECT_EQ(dist::ps_replay(layout, o.logs, initial(), gradient, sgd_at, backup), o.params);
  EXPECT_EQ(o.worker0_final, o.params);
}

TEST(ParameterServer, ModesByName) {
  EXPECT_EQ(dist::ps_options("ssp:3").staleness, 3);
  EXPECT_EQ(dist::ps_options("ssp:3").mode, dist::PsMode::kSsp);
  for (const char* bad : {"ssp", "ssp:-1", "ssp:2x", "hogwild"}) EXPECT_THROW(dist::ps_options(bad), Error) << bad;
  // Servers' ranges cut at tensor boundaries: the cut comes after the tensor that reaches half of 37.
  EXPECT_EQ(dist::bounds_at_tensors({10, 5, 20, 2}, 2), (std::vector<int64_t>{0, 35, 37}));
  EXPECT_EQ(dist::bounds_at_tensors({10, 5, 20, 2}, 1), (std::vector<int64_t>{0, 37}));
  // Staleness from logs: the second push was computed on version 0 but applied to version 1.
  EXPECT_EQ(dist::staleness_histogram({{{0, 0, 0, 1}, {1, 0, 0, 2}}}), (std::vector<int64_t>{1, 1}));
  const dist::PsLayout cut{.workers = 2, .servers = 2, .numel = 37, .bounds = {0, 35, 37}};
  EXPECT_EQ(cut.begin(1), 35);
  EXPECT_EQ(cut.end(1), 37);
}

// The teaching version on its own communicator: sync gives production's bits; async's log, replayed by production,
// gives the teaching server's θ.
TEST(ParameterServer, NaiveEqualsProduction) {
  const int workers = ctx().world_size() - 1, rank = ctx().rank();
  const Outcome production = run(1, dist::ps_options("sync"));
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    MPI_Comm comm;
    MPI_Comm_dup(ctx().world(), &comm);
    std::vector<float> theta = initial();
    std::vector<dist::naive::PsEntry> log;
    if (rank == workers) {
      log = dist::naive::serve(comm, workers, theta, kSteps, async, sgd);
    } else {
      if (async && rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      dist::naive::work(comm, workers, kNumel, kSteps,
                        [&](int64_t s, const std::vector<float>& t) { return gradient(rank, s, t); });
    }
    // The server's θ and log to rank 0.
    std::vector<int64_t> flat;
    for (const auto& e : log) flat.insert(flat.end(), {e.worker, e.step, e.computed});
    int n = int(flat.size());
    if (rank == workers) {
      MPI_Send(theta.data(), int(kNumel), MPI_FLOAT, 0, 11, comm);
      MPI_Send(&n, 1, MPI_INT, 0, 12, comm);
      MPI_Send(flat.data(), n, MPI_INT64_T, 0, 13, comm);
    } else if (rank == 0) {
      MPI_Recv(theta.data(), int(kNumel), MPI_FLOAT, workers, 11, comm, MPI_STATUS_IGNORE);
      MPI_Recv(&n, 1, MPI_INT, workers, 12, comm, MPI_STATUS_IGNORE);
      flat.resize(size_t(n));
      MPI_Recv(flat.data(), n, MPI_INT64_T, workers, 13, comm, MPI_STATUS_IGNORE);
      std::vector<dist::PsPush> replayable;
      for (size_t e = 0; e + 2 < flat.size(); e += 3)  // the version after: a step's (sync) or a push's (async)
        replayable.push_back({int(flat[e]), flat[e + 1], flat[e + 2], async ? int64_t(e / 3) + 1 : flat[e + 1] + 1});
      const dist::PsLayout layout{workers, 1, kNumel};
      if (!async) EXPECT_EQ(theta, production.params);
      EXPECT_EQ(dist::ps_replay(layout, {replayable}, initial(), gradient, sgd_at,
                                dist::ps_options(async ? "async" : "sync")),
                theta);
    }
    MPI_Comm_free(&comm);
  }
}
