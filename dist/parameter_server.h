// A parameter server: S server ranks hold the parameters, W worker ranks compute gradients, push them and pull the
// parameters back. Synchronous, asynchronous and bounded-staleness (SSP) training, with a log that makes the
// asynchronous runs reproducible in one process.
//
//   // ranks 0 .. W-1 work, W .. W+S-1 serve (one communicator, the host's MPI)
//   dist::PsLayout layout{.workers = W, .servers = S, .numel = flat_params.size()};
//   if (rank >= W) {
//     dist::ParameterServer server(comm, layout, rank - W, my_shard_of(flat_params), apply_sgd, {.mode = kAsync});
//     server.serve(steps);                     // until every worker pushed `steps` gradients
//   } else {
//     dist::PsWorker worker(comm, layout, rank);
//     std::vector<float> theta = worker.pull();                     // version 0 from every server
//     for (int64_t s = 0; !worker.stopped(); ++s) theta = worker.push_pull(s, gradient(theta, s));
//     theta = worker.final_pull();                                  // every worker's last gradient in
//   }
//
// Sharding: the flat parameter vector is cut into S contiguous ranges (dist/shard.h's shard_range); server j owns
// range j, so a worker's push is S messages, one slice each, and so is its pull. Per step a worker sends and
// receives 4·Ψ bytes in all (Ψ parameters) and each server 4·Ψ/S · W: the servers' links carry W times a worker's
// traffic, which is why there are S of them (DDP's ring moves 2(N−1)/N·4Ψ per rank and needs no server).
//
// Modes (PsMode), with v the number of gradients a server has applied to its shard (its version):
//   sync   the server waits for all W workers' gradients of a step, sums them in worker order 0 .. W−1, divides by
//          W, applies the update once (v += 1) and sends every worker the new shard: DDP's arithmetic (at W = 2 its
//          sum is DDP's bitwise; the order fixes it at any W).
//   async  each gradient is applied as it arrives, divided by W (so W pushes move as far as one sync step), and only
//          its worker gets the new shard back at once: nobody waits for anybody, and a gradient may have been
//          computed on a version older than the one it is applied to (its staleness: v at apply − v it was
//          computed on). With one server the run is steps · W gradients from whoever is fastest: a straggler
//          pushes fewer, and the throughput holds.
//   ssp s  async, but a worker that has pushed c gradients gets its reply only once every worker has pushed at
//          least c − s (stale synchronous parallel, Ho et al. 2013): nobody is ever more than s steps ahead of
//          the slowest. s = 0 is lock-step (but still applies the gradients one at a time).
//
// The log: each server records every gradient it applies (worker, step, the version the worker computed it on,
// the version after). ps_replay() re-runs the training in one process from the logs: it recomputes each gradient
// on the shards at the versions the log names and applies them in each server's order; the result is bitwise the
// distributed run's (tests/dist/test_parameter_server.cpp), however the messages raced.
#pragma once

#include <cstdint>
#include <functional>
#include <mpi.h>
#include <string>
#include <vector>

namespace minidl::dist {

enum class PsMode { kSync, kAsync, kSsp };

struct PsOptions {
  PsMode mode = PsMode::kSync;
  int64_t staleness = 0;  // ssp's s
  // sync with one server: each step takes the first W − backup gradients to arrive (summed in worker order, divided
  // by W − backup) and drops the rest (Chen et al. 2016, arXiv 1604.00981): a straggler no longer sets the pace.
  int backup = 0;
};
// "sync", "async" or "ssp:S" (S >= 0); throws naming the accepted forms otherwise.
PsOptions ps_options(const std::string& text);

struct PsLayout {
  int workers = 1, servers = 1;  // ranks 0 .. workers-1 work, the next `servers` ranks serve
  int64_t numel = 0;             // the flat parameter vector's length
  // Where server j's range starts (servers + 1 offsets, the last numel): cut at parameter boundaries so a server
  // holds whole tensors (its optimizer then sees parameters, not pieces). Empty: shard_range's equal split.
  std::vector<int64_t> bounds{};
  int64_t begin(int server) const;
  int64_t end(int server) const;
};
// Bounds for tensors of `sizes` elements, in order: cut before the tensor where the running total first reaches
// j/servers of the whole, for each j (a server may get none when one tensor is larger than a share).
std::vector<int64_t> bounds_at_tensors(const std::vector<int64_t>& sizes, int servers);

// One applied push.
struct PsPush {
  int worker = 0;
  int64_t step = 0;      // the worker's step (its push count before it)
  int64_t computed = 0;  // the shard's version the gradient was computed on
  int64_t version = 0;   // the shard's version after applying it (sync: one version per step, W entries share it)
};

// What a server does to its shard with a gradient (already divided by W; sync: the mean). `shard` and `grad` have
// the shard's length.
using PsApply = std::function<void(std::vector<float>& shard, const std::vector<float>& grad)>;

class ParameterServer {
 public:
  // Server `index` (0 .. servers-1) of `layout` on `comm`, starting from `shard` (its range of the parameters).
  ParameterServer(MPI_Comm comm, PsLayout layout, int index, std::vector<float> shard, PsApply apply,
                  PsOptions options);
  // Until every worker has pushed `steps` gradients (answering each pull and push as its mode says); then every
  // worker gets the final shard (PsWorker::final_pull).
  void serve(int64_t steps);
  const std::vector<float>& shard() const { return shard_; }
  const std::vector<PsPush>& log() const { return log_; }
  // Per worker: the gradients dropped because they came after the step was taken (backup workers).
  const std::vector<int64_t>& dropped() const { return dropped_; }

 private:
  void reply(int worker, bool stop);
  void serve_sync(int64_t steps);
  void serve_async(int64_t steps);  // async and ssp

  MPI_Comm comm_;
  PsLayout layout_;
  int index_;
  std::vector<float> shard_;
  PsApply apply_;
  PsOptions options_;
  int64_t version_ = 0;
  std::vector<PsPush> log_;
  std::vector<int64_t> dropped_;
  std::vector<char> out_, in_;             // the message buffers, kept between messages
  std::vector<std::vector<float>> grads_;  // sync: the step's gradient per worker
  std::vector<float> grad_;                // what apply_ is given
};

class PsWorker {
 public:
  PsWorker(MPI_Comm comm, PsLayout layout, int worker);
  // The parameters at every server's version 0.
  const std::vector<float>& pull();
  // Pushes the gradient of step `step` (computed on what the last pull returned) and returns the parameters the
  // servers send back (sync: after everyone's step; async: at once; ssp: within the bound).
  const std::vector<float>& push_pull(int64_t step, const std::vector<float>& grad);
  // Whether the servers said this was the last push: in sync after `steps` of them; asynchronously with one server
  // once steps · W gradients are in, whoever pushed them (a gradient pushed after that is dropped), with several
  // after this worker's `steps`.
  bool stopped() const { return stopped_; }
  // After the last push_pull: the parameters once every worker's last gradient is in.
  const std::vector<float>& final_pull();

 private:
  const std::vector<float>& receive(int tag);

  MPI_Comm comm_;
  PsLayout layout_;
  int worker_;
  std::vector<int64_t> versions_;  // per server: the version of the shard last received
  bool stopped_ = false;
  std::vector<float> params_;   // what pull, push_pull and final_pull return: valid until the next of them
  std::vector<char> out_, in_;  // the message buffers, kept between messages
};

// Staleness of the applied gradients in `logs`: histogram[k] = how many were applied k versions after the one they
// were computed on (a sync step's gradients all go to the version before theirs: 0).
std::vector<int64_t> staleness_histogram(const std::vector<std::vector<PsPush>>& logs);

// Whether a server's log keeps SSP's bound: when worker u's gradient of step t was applied, every worker had
// already pushed at least t − s gradients (so none ran more than s steps ahead of the slowest). Empty when it
// holds; else the first entry that breaks it, named.
std::string ssp_violation(const std::vector<PsPush>& log, int workers, int64_t staleness);

// The one-process replay of a run from its servers' logs (log[j]: server j's): starts from `initial` (the whole
// flat vector), and for each logged push recomputes `gradient(worker, step, params)` on the parameters that worker
// had pulled (each shard at the version the logs name) and applies it as the server did. Returns the final flat
// parameters, bitwise the servers' shards.
using PsGradient = std::function<std::vector<float>(int worker, int64_t step, const std::vector<float>& params)>;
// What server `server` applies: its PsApply (a stateful optimizer keeps one state per server).
using PsReplayApply = std::function<void(int server, std::vector<float>& shard, const std::vector<float>& grad)>;
std::vector<float> ps_replay(const PsLayout& layout, const std::vector<std::vector<PsPush>>& logs,
                             std::vector<float> initial, const PsGradient& gradient, const PsReplayApply& apply,
                             PsOptions options);

}  // namespace minidl::dist
