#include "dist/parameter_server.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "core/error.h"
#include "dist/init.h"
#include "dist/shard.h"

namespace minidl::dist {

namespace {

constexpr int kPushTag = 7101, kParamsTag = 7102, kFinalTag = 7103;

// A message: two int64 (a step or -1, and a version) and the floats of one shard, packed into `m`. The buffers a
// message passes through are kept between messages (`m` here, `buffer` below): allocated afresh, a model-sized
// buffer faults its pages in on every push and pull (about 7 ms of a baby step's ~100 ms).
void send_message(MPI_Comm comm, int dest, int tag, std::vector<char>& m, int64_t a, int64_t b, const float* data,
                  int64_t n) {
  m.resize(2 * sizeof(int64_t) + size_t(n) * sizeof(float));
  std::memcpy(m.data(), &a, sizeof a);
  std::memcpy(m.data() + sizeof a, &b, sizeof b);
  if (n > 0) std::memcpy(m.data() + 2 * sizeof a, data, size_t(n) * sizeof(float));
  MINIDL_MPI_CHECK(MPI_Send(m.data(), int(m.size()), MPI_BYTE, dest, tag, comm));
}

struct Message {
  int source = 0;
  int64_t a = 0, b = 0;
  const float* data = nullptr;  // n floats inside the receive buffer, until the next receive into it
  int64_t n = 0;
  void copy_to(std::vector<float>& out) const { out.assign(data, data + n); }
};

Message receive_message(MPI_Comm comm, int source, int tag, std::vector<char>& buffer) {
  MPI_Status status;
  MINIDL_MPI_CHECK(MPI_Probe(source, tag, comm, &status));
  int bytes = 0;
  MINIDL_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &bytes));
  buffer.resize(static_cast<size_t>(bytes));
  MINIDL_MPI_CHECK(MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE));
  Message out;
  out.source = status.MPI_SOURCE;
  std::memcpy(&out.a, buffer.data(), sizeof out.a);
  std::memcpy(&out.b, buffer.data() + sizeof out.a, sizeof out.b);
  out.n = int64_t((size_t(bytes) - 2 * sizeof(int64_t)) / sizeof(float));
  out.data = reinterpret_cast<const float*>(buffer.data() + 2 * sizeof(int64_t));  // 16 bytes into new[]'s block
  return out;
}

ShardRange range_of(const PsLayout& l, int server) { return {l.begin(server), l.end(server)}; }

// The update a server applies, shared with the replay so that both round alike: async and ssp divide each gradient
// by W; sync sums the W gradients in worker order, then divides.
void divide(std::vector<float>& g, int workers) {
  for (float& x : g) x = x / float(workers);
}
void mean_in_worker_order(const std::vector<const std::vector<float>*>& g, std::vector<float>& sum) {
  sum = *g[0];
  for (size_t w = 1; w < g.size(); ++w)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + (*g[w])[i];
  divide(sum, int(g.size()));
}

}  // namespace

int64_t PsLayout::begin(int server) const {
  return bounds.empty() ? shard_range(numel, servers, server).begin : bounds[size_t(server)];
}
int64_t PsLayout::end(int server) const {
  return bounds.empty() ? shard_range(numel, servers, server).end : bounds[size_t(server) + 1];
}

std::vector<int64_t> bounds_at_tensors(const std::vector<int64_t>& sizes, int servers) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<int64_t> bounds{0};
  int64_t at = 0;
  size_t t = 0;
  for (int j = 1; j < servers; ++j) {
    while (t < sizes.size() && at < total * j / servers) at += sizes[t++];
    bounds.push_back(at);
  }
  bounds.push_back(total);
  return bounds;
}

PsOptions ps_options(const std::string& text) {
  if (text == "sync") return {PsMode::kSync, 0, 0};
  if (text == "async") return {PsMode::kAsync, 0, 0};
  long long s = -1;
  char extra = 0;
  MINIDL_CHECK(std::sscanf(text.c_str(), "ssp:%lld%c", &s, &extra) == 1 && s >= 0, "parameter-server mode '", text,
               "': expected sync, async or ssp:S with S >= 0 (the staleness bound)");
  return {PsMode::kSsp, int64_t(s), 0};
}

ParameterServer::ParameterServer(MPI_Comm comm, PsLayout layout, int index, std::vector<float> shard, PsApply apply,
                                 PsOptions options)
    : comm_(comm),
      layout_(layout),
      index_(index),
      shard_(std::move(shard)),
      apply_(std::move(apply)),
      options_(options) {
  MINIDL_CHECK(layout_.workers >= 1 && layout_.servers >= 1,
               "ParameterServer: expected at least one worker and one "
               "server, got ",
               layout_.workers, " and ", layout_.servers);
  MINIDL_CHECK(options_.backup == 0 ||
                   (options_.mode == PsMode::kSync && layout_.servers == 1 && options_.backup < layout_.workers),
               "ParameterServer: ", options_.backup, " backup workers need sync mode, one server and more workers (",
               layout_.workers, ")");
  dropped_.assign(size_t(layout_.workers), 0);
  MINIDL_CHECK(int64_t(shard_.size()) == range_of(layout_, index_).size(), "ParameterServer: server ", index_, " owns ",
               range_of(layout_, index_).size(), " parameters, got ", shard_.size());
}

void ParameterServer::reply(int worker, bool stop) {
  send_message(comm_, worker, kParamsTag, out_, stop ? 1 : 0, version_, shard_.data(), int64_t(shard_.size()));
}

void ParameterServer::serve(int64_t steps) {
  const int W = layout_.workers;
  for (int w = 0; w < W; ++w) reply(w, steps == 0);  // version 0: every worker's first pull
  if (steps == 0) {
  } else if (options_.mode == PsMode::kSync) {
    serve_sync(steps);
  } else {
    serve_async(steps);
  }
  for (int w = 0; w < W; ++w)  // the last word: everyone's last gradient is in
    send_message(comm_, w, kFinalTag, out_, -1, version_, shard_.data(), int64_t(shard_.size()));
}

void ParameterServer::serve_sync(int64_t steps) {
  const int W = layout_.workers, need = W - options_.backup;
  int stopped = 0;
  for (int64_t s = 0; s < steps; ++s) {
    grads_.resize(static_cast<size_t>(W));  // kept from step to step, as their capacity is
    std::vector<int64_t> computed(static_cast<size_t>(W));
    std::vector<char> got(static_cast<size_t>(W), 0);
    std::vector<int> in;  // who made it into this step, in arrival order
    while (int(in.size()) < need) {
      Message m = receive_message(comm_, MPI_ANY_SOURCE, kPushTag, in_);
      const int w = m.source;
      if (m.a < s) {  // a backup worker's late gradient, of a step already taken: dropped, and it catches up
        ++dropped_[size_t(w)];
        reply(w, false);
        continue;
      }
      MINIDL_CHECK(m.a == s && !got[size_t(w)], "parameter server ", index_, ": worker ", w, " pushed step ", m.a,
                   " during step ", s);
      computed[size_t(w)] = m.b;
      m.copy_to(grads_[size_t(w)]);
      got[size_t(w)] = 1;
      in.push_back(w);
    }
    std::sort(in.begin(), in.end());  // summed in worker order, whoever came first
    std::vector<const std::vector<float>*> taken;
    for (int w : in) taken.push_back(&grads_[size_t(w)]);
    mean_in_worker_order(taken, grad_);
    apply_(shard_, grad_);  // rescaled: divided by the W - b that came
    ++version_;
    for (int w : in) log_.push_back({w, s, computed[size_t(w)], version_});
    for (int w : in) reply(w, s + 1 == steps);
    if (s + 1 == steps) stopped += int(in.size());
  }
  while (stopped < W) {  // the backup workers still computing the last step: their gradient comes too late
    Message m = receive_message(comm_, MPI_ANY_SOURCE, kPushTag, in_);
    ++dropped_[size_t(m.source)];
    reply(m.source, true);
    ++stopped;
  }
}

void ParameterServer::serve_async(int64_t steps) {
  const int W = layout_.workers;
  // One server decides when the run ends: after steps · W gradients from whoever pushed them, so fast workers do
  // more of them than a straggler. With several servers each worker pushes `steps` (they could not agree which
  // gradient was the last one otherwise).
  const bool shared_budget = layout_.servers == 1;
  const int64_t budget = steps * W;
  std::vector<int64_t> clock(size_t(W), 0);  // pushes applied per worker
  std::vector<int> waiting;                  // ssp: workers whose reply is held back
  int stopped = 0;
  int64_t applied = 0;
  auto stop = [&](int u) { reply(u, true), ++stopped; };
  while (stopped < W) {
    Message m = receive_message(comm_, MPI_ANY_SOURCE, kPushTag, in_);
    const int w = m.source;
    if (applied == budget) {  // the budget is spent: a gradient computed meanwhile is dropped
      stop(w);
      continue;
    }
    MINIDL_CHECK(m.a == clock[size_t(w)], "parameter server ", index_, ": worker ", w, " pushed step ", m.a,
                 ", expected ", clock[size_t(w)]);
    m.copy_to(grad_);
    divide(grad_, W);
    apply_(shard_, grad_);
    ++version_, ++applied, ++clock[size_t(w)];
    log_.push_back({w, m.a, m.b, version_});
    if (applied == budget) {  // the last one: everyone held back stops too
      stop(w);
      for (int u : waiting) stop(u);
      waiting.clear();
      continue;
    }
    if (!shared_budget && clock[size_t(w)] == steps) {
      stop(w);
    } else if (options_.mode == PsMode::kAsync) {
      reply(w, false);
      continue;
    } else {
      waiting.push_back(w);
    }
    // SSP: a worker at clock c may go on once the slowest has clock >= c - s.
    const int64_t slowest = *std::min_element(clock.begin(), clock.end());
    std::vector<int> still;
    for (int u : waiting) {
      if (clock[size_t(u)] - slowest <= options_.staleness)
        reply(u, false);
      else
        still.push_back(u);
    }
    waiting = std::move(still);
  }
}

std::vector<int64_t> staleness_histogram(const std::vector<std::vector<PsPush>>& logs) {
  std::vector<int64_t> h;
  for (const std::vector<PsPush>& log : logs)
    for (const PsPush& p : log) {
      const auto k = size_t(p.version - 1 - p.computed);
      if (h.size() <= k) h.resize(k + 1, 0);
      ++h[k];
    }
  return h;
}

PsWorker::PsWorker(MPI_Comm comm, PsLayout layout, int worker)
    : comm_(comm), layout_(layout), worker_(worker), versions_(size_t(layout.servers), 0) {}

const std::vector<float>& PsWorker::receive(int tag) {
  params_.resize(size_t(layout_.numel));
  for (int j = 0; j < layout_.servers; ++j) {
    Message m = receive_message(comm_, layout_.workers + j, tag, in_);
    const ShardRange r = range_of(layout_, j);
    MINIDL_CHECK(m.n == r.size(), "parameter-server worker ", worker_, ": server ", j, " sent ", m.n,
                 " parameters, expected ", r.size());
    std::copy(m.data, m.data + m.n, params_.begin() + r.begin);
    versions_[size_t(j)] = m.b;
    stopped_ = stopped_ || m.a == 1;
  }
  return params_;
}

const std::vector<float>& PsWorker::pull() { return receive(kParamsTag); }

const std::vector<float>& PsWorker::final_pull() { return receive(kFinalTag); }

const std::vector<float>& PsWorker::push_pull(int64_t step, const std::vector<float>& grad) {
  MINIDL_CHECK(int64_t(grad.size()) == layout_.numel, "parameter-server worker ", worker_, ": a gradient of ",
               grad.size(), " values, expected ", layout_.numel);
  for (int j = 0; j < layout_.servers; ++j) {
    const ShardRange r = range_of(layout_, j);
    send_message(comm_, layout_.workers + j, kPushTag, out_, step, versions_[size_t(j)], grad.data() + r.begin,
                 r.size());
  }
  return receive(kParamsTag);
}

std::string ssp_violation(const std::vector<PsPush>& log, int workers, int64_t staleness) {
  std::vector<int64_t> pushed(size_t(workers), 0);
  for (size_t e = 0; e < log.size(); ++e) {
    const PsPush& p = log[e];
    for (int w = 0; w < workers; ++w)
      if (pushed[size_t(w)] < p.step - staleness)
        return "entry " + std::to_string(e) + ": worker " + std::to_string(p.worker) + "'s step " +
               std::to_string(p.step) + " was applied when worker " + std::to_string(w) + " had pushed only " +
               std::to_string(pushed[size_t(w)]) + " (bound " + std::to_string(staleness) + ")";
    ++pushed[size_t(p.worker)];
  }
  return "";
}

std::vector<float> ps_replay(const PsLayout& layout, const std::vector<std::vector<PsPush>>& logs,
                             std::vector<float> initial, const PsGradient& gradient, const PsReplayApply& apply,
                             PsOptions options) {
  const int S = layout.servers, W = layout.workers;
  MINIDL_CHECK(int(logs.size()) == S, "ps_replay: expected ", S, " server logs, got ", logs.size());
  // Every shard's versions (all of them: the model is small where one replays), and per server which version
  // each (worker, step) was computed on.
  std::vector<std::vector<std::vector<float>>> versions(static_cast<size_t>(S));
  std::vector<std::map<std::pair<int, int64_t>, int64_t>> computed(static_cast<size_t>(S));
  for (int j = 0; j < S; ++j) {
    const ShardRange r = range_of(layout, j);
    versions[size_t(j)].emplace_back(initial.begin() + r.begin, initial.begin() + r.end);
    for (const PsPush& p : logs[size_t(j)]) computed[size_t(j)][{p.worker, p.step}] = p.computed;
  }
  std::map<std::pair<int, int64_t>, std::vector<float>> grads;  // computed once, on first need
  // The gradient of (worker, step), if every shard it was computed on exists yet.
  auto grad_of = [&](int w, int64_t step) -> const std::vector<float>* {
    auto it = grads.find({w, step});
    if (it != grads.end()) return &it->second;
    std::vector<float> params(size_t(layout.numel));
    for (int k = 0; k < S; ++k) {
      auto c = computed[size_t(k)].find({w, step});
      MINIDL_CHECK(c != computed[size_t(k)].end(), "ps_replay: server ", k, "'s log has no push of worker ", w,
                   " step ", step);
      if (c->second >= int64_t(versions[size_t(k)].size())) return nullptr;  // not reached yet
      const std::vector<float>& shard = versions[size_t(k)][size_t(c->second)];
      std::copy(shard.begin(), shard.end(), params.begin() + range_of(layout, k).begin);
    }
    return &grads.emplace(std::make_pair(w, step), gradient(w, step, params)).first->second;
  };
  std::vector<size_t> at(size_t(S), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < S; ++j) {
      const std::vector<PsPush>& log = logs[size_t(j)];
      const ShardRange r = range_of(layout, j);
      auto slice = [&](const std::vector<float>& g) {
        return std::vector<float>(g.begin() + r.begin, g.begin() + r.end);
      };
      while (at[size_t(j)] < log.size()) {
        std::vector<float> shard = versions[size_t(j)].back();
        if (options.mode == PsMode::kSync) {  // a step's entries (one version), summed in worker order
          size_t end = at[size_t(j)];
          while (end < log.size() && log[end].version == log[at[size_t(j)]].version) ++end;
          std::vector<std::vector<float>> g;
          for (size_t e = at[size_t(j)]; e < end; ++e) {
            const std::vector<float>* full = grad_of(log[e].worker, log[e].step);
            if (!full) break;
            g.push_back(slice(*full));
          }
          if (g.size() < end - at[size_t(j)]) break;
          std::vector<const std::vector<float>*> taken;
          for (const std::vector<float>& x : g) taken.push_back(&x);
          std::vector<float> mean;
          mean_in_worker_order(taken, mean);
          apply(j, shard, mean);
          at[size_t(j)] = end;
        } else {
          const PsPush& p = log[at[size_t(j)]];
          const std::vector<float>* full = grad_of(p.worker, p.step);
          if (!full) break;
          std::vector<float> g = slice(*full);
          divide(g, W);
          apply(j, shard, g);
          at[size_t(j)] += 1;
        }
        versions[size_t(j)].push_back(std::move(shard));
        progress = true;
      }
    }
  }
  std::vector<float> out(size_t(layout.numel));
  for (int j = 0; j < S; ++j) {
    MINIDL_CHECK(at[size_t(j)] == logs[size_t(j)].size(), "ps_replay: server ", j,
                 "'s log cannot be replayed past "
                 "entry ",
                 at[size_t(j)], " (a push computed on a version no log produces)");
    const std::vector<float>& shard = versions[size_t(j)].back();
    std::copy(shard.begin(), shard.end(), out.begin() + range_of(layout, j).begin);
  }
  return out;
}

}  // namespace minidl::dist
