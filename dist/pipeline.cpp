#include "dist/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "dist/process_group.h"

namespace minidl::dist {

namespace {

bool is_compute(ActionKind k) { return k == ActionKind::kForward || k == ActionKind::kBackward; }
bool is_send(ActionKind k) { return k == ActionKind::kSendActivation || k == ActionKind::kSendGrad; }
bool is_recv(ActionKind k) { return k == ActionKind::kRecvActivation || k == ActionKind::kRecvGrad; }

int global_chunk(const PipelineSpec& s, int rank, int local) { return local * s.stages + rank; }
int rank_of_chunk(const PipelineSpec& s, int chunk) { return chunk % s.stages; }
int local_of_chunk(const PipelineSpec& s, int chunk) { return chunk / s.stages; }

// A message of one step: an activation going into `consumer` (a global chunk) or a gradient going back into it.
struct Message {
  bool grad = false;
  int micro = 0;
  int consumer = 0;
  auto operator<=>(const Message&) const = default;
};

// The message a send or receive action carries.
Message message_of(const PipelineSpec& s, const Action& a, int rank) {
  const int c = global_chunk(s, rank, a.chunk);
  switch (a.kind) {
    case ActionKind::kSendActivation: return {false, a.micro, c + 1};
    case ActionKind::kRecvActivation: return {false, a.micro, c};
    case ActionKind::kSendGrad: return {true, a.micro, c - 1};
    case ActionKind::kRecvGrad: return {true, a.micro, c};
    default: MINIDL_ASSERT(false, "message_of: ", describe(a), " is not a send or a receive");
  }
  return {};
}

std::string describe(const Message& m) {
  std::ostringstream os;
  os << (m.grad ? "gradient" : "activation") << " m=" << m.micro << " into chunk " << m.consumer;
  return os.str();
}

// What a compute needs from another chunk, if anything: the forward of chunk c > 0 its input activation, the
// backward of chunk c < C - 1 the gradient of its output.
bool needs_message(const PipelineSpec& s, const Action& a, int rank, Message& out) {
  const int c = global_chunk(s, rank, a.chunk), C = s.chunks();
  if (a.kind == ActionKind::kForward && c > 0)
    out = {false, a.micro, c};
  else if (a.kind == ActionKind::kBackward && c < C - 1)
    out = {true, a.micro, c};
  else
    return false;
  return true;
}

// The compute order of one rank, before communication is inserted.
std::vector<Action> compute_order(const PipelineSpec& s, int r) {
  const int p = s.stages, M = s.micro_batches, V = s.virtual_stages;
  std::vector<Action> out;
  auto F = [&](int m, int v) { out.push_back({ActionKind::kForward, m, v, -1}); };
  auto B = [&](int m, int v) { out.push_back({ActionKind::kBackward, m, v, -1}); };
  switch (s.kind) {
    case ScheduleKind::kGPipe:
      for (int m = 0; m < M; ++m) F(m, 0);
      for (int m = 0; m < M; ++m) B(m, 0);
      break;
    case ScheduleKind::k1F1B: {
      const int warm = std::min(p - r - 1, M);
      for (int m = 0; m < warm; ++m) F(m, 0);
      for (int i = 0; i < M - warm; ++i) {
        F(warm + i, 0);
        B(i, 0);
      }
      for (int m = M - warm; m < M; ++m) B(m, 0);
      break;
    }
    case ScheduleKind::kInterleaved: {
      // The k-th forward of a rank: groups of p micro-batches, each group through chunk 0, 1, ..., V - 1; the k-th
      // backward mirrors it through chunk V - 1 down to 0. Warm-up as Megatron-LM's: enough forwards that the
      // rank's first backward finds its gradient already on the way.
      const int total = M * V;
      auto micro = [&](int k) { return (k / (p * V)) * p + k % p; };
      auto fchunk = [&](int k) { return (k / p) % V; };
      auto bchunk = [&](int k) { return V - 1 - (k / p) % V; };
      const int warm = std::min((p - r - 1) * 2 + (V - 1) * p, total);
      for (int k = 0; k < warm; ++k) F(micro(k), fchunk(k));
      for (int i = 0; i < total - warm; ++i) {
        F(micro(warm + i), fchunk(warm + i));
        B(micro(i), bchunk(i));
      }
      for (int k = total - warm; k < total; ++k) B(micro(k), bchunk(k));
      break;
    }
  }
  return out;
}

}  // namespace

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  MINIDL_CHECK(false, "--schedule: expected gpipe, 1f1b or interleaved, got '", name, "'");
  return ScheduleKind::k1F1B;
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward: return "forward";
    case ActionKind::kBackward: return "backward";
    case ActionKind::kSendActivation: return "send activation";
    case ActionKind::kRecvActivation: return "recv activation";
    case ActionKind::kSendGrad: return "send gradient";
    case ActionKind::kRecvGrad: return "recv gradient";
    case ActionKind::kOptimizerStep: return "optimizer step";
  }
  return "?";
}

std::string describe(const Action& a) {
  std::ostringstream os;
  os << action_kind_name(a.kind);
  if (a.kind == ActionKind::kOptimizerStep) return os.str();
  os << " m=" << a.micro << " v=" << a.chunk;
  if (is_send(a.kind)) os << " to rank " << a.peer;
  if (is_recv(a.kind)) os << " from rank " << a.peer;
  return os.str();
}

void PipelineSpec::validate() const {
  MINIDL_CHECK(stages >= 1, "pipeline: expected at least 1 stage (--pp), got ", stages);
  MINIDL_CHECK(micro_batches >= 1, "pipeline: expected at least 1 micro-batch (--micro-batches), got ", micro_batches);
  MINIDL_CHECK(virtual_stages >= 1, "pipeline: expected at least 1 virtual stage (--virtual-stages), got ",
               virtual_stages);
  MINIDL_CHECK(kind == ScheduleKind::kInterleaved || virtual_stages == 1, "--virtual-stages ", virtual_stages,
               " needs --schedule interleaved (", schedule_kind_name(kind), " runs one chunk per rank)");
  MINIDL_CHECK(kind != ScheduleKind::kInterleaved || micro_batches % stages == 0,
               "--schedule interleaved: "
               "--micro-batches ",
               micro_batches, " must be a multiple of --pp ", stages,
               " (forwards run in groups of pp micro-batches per chunk)");
  MINIDL_CHECK(int64_t(2) * micro_batches * chunks() <= ProcessGroup::kMaxTag + 1, "pipeline: ", micro_batches,
               " micro-batches x ", chunks(), " chunks need more message tags than the ", ProcessGroup::kMaxTag + 1,
               " a process group has");
}

int message_tag(const PipelineSpec& s, const Action& a, int rank) {
  Message m = message_of(s, a, rank);
  return ((m.grad ? 1 : 0) * s.micro_batches + m.micro) * s.chunks() + m.consumer;
}

Schedule make_schedule(const PipelineSpec& spec) {
  spec.validate();
  const int p = spec.stages, C = spec.chunks();
  Schedule out{spec, std::vector<std::vector<Action>>(size_t(p))};
  // 1. Compute orders, each producing compute followed at once by the send of what it produced.
  std::vector<std::vector<Action>> with_sends(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    for (const Action& a : compute_order(spec, r)) {
      with_sends[size_t(r)].push_back(a);
      const int c = global_chunk(spec, r, a.chunk);
      if (a.kind == ActionKind::kForward && c + 1 < C && rank_of_chunk(spec, c + 1) != r)
        with_sends[size_t(r)].push_back({ActionKind::kSendActivation, a.micro, a.chunk, rank_of_chunk(spec, c + 1)});
      if (a.kind == ActionKind::kBackward && c > 0 && rank_of_chunk(spec, c - 1) != r)
        with_sends[size_t(r)].push_back({ActionKind::kSendGrad, a.micro, a.chunk, rank_of_chunk(spec, c - 1)});
    }
  }
  // 2. Receives: before a compute that needs a message from rank a, post every receive from a up to that message,
  //    in the order a posts the sends (so the k-th receive matches the k-th send without tags).
  for (int b = 0; b < p; ++b) {
    // incoming[a]: the messages a sends to b, in a's order.
    std::vector<std::vector<Message>> incoming(static_cast<size_t>(p));
    for (int a = 0; a < p; ++a)
      for (const Action& s : with_sends[size_t(a)])
        if (is_send(s.kind) && s.peer == b) incoming[size_t(a)].push_back(message_of(spec, s, a));
    std::vector<size_t> posted(size_t(p), 0);
    std::vector<Action>& list = out.ranks[size_t(b)];
    for (const Action& a : with_sends[size_t(b)]) {
      Message need;
      if (is_compute(a.kind) && needs_message(spec, a, b, need)) {
        const int src = rank_of_chunk(spec, need.consumer + (need.grad ? 1 : -1));
        if (src != b) {
          const auto& from = incoming[size_t(src)];
          auto it = std::find(from.begin(), from.end(), need);
          MINIDL_ASSERT(it != from.end(), "make_schedule: rank ", src, " never sends ", describe(need));
          for (size_t k = posted[size_t(src)]; k <= size_t(it - from.begin()); ++k) {
            const Message& m = from[k];
            list.push_back({m.grad ? ActionKind::kRecvGrad : ActionKind::kRecvActivation, m.micro,
                            local_of_chunk(spec, m.consumer), src});
          }
          posted[size_t(src)] = std::max(posted[size_t(src)], size_t(it - from.begin()) + 1);
        }
      }
      list.push_back(a);
    }
    list.push_back({ActionKind::kOptimizerStep, 0, 0, -1});
  }
  return out;
}

void validate_schedule(const Schedule& s) {
  const PipelineSpec& spec = s.spec;
  spec.validate();
  const int p = spec.stages, M = spec.micro_batches, V = spec.virtual_stages, C = spec.chunks();
  MINIDL_CHECK(int(s.ranks.size()) == p, "pipeline schedule: expected action lists for ", p, " ranks, got ",
               s.ranks.size());
  std::string late_receive;
  for (int r = 0; r < p; ++r) {
    const auto& list = s.ranks[size_t(r)];
    auto at = [&](size_t i) {
      return "rank " + std::to_string(r) + ", action #" + std::to_string(i) + " (" + describe(list[i]) + ")";
    };
    std::map<std::tuple<int, int, int>, int> seen;  // (kind, micro, chunk) -> count
    std::map<Message, size_t> received;             // messages whose receive is posted, at which position
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      MINIDL_CHECK(a.kind != ActionKind::kOptimizerStep || i + 1 == list.size(), "pipeline schedule: ", at(i),
                   ": the optimizer step must be the last action");
      if (a.kind == ActionKind::kOptimizerStep) continue;
      MINIDL_CHECK(a.micro >= 0 && a.micro < M && a.chunk >= 0 && a.chunk < V, "pipeline schedule: ", at(i),
                   ": expected micro-batch < ", M, " and chunk < ", V);
      const int c = global_chunk(spec, r, a.chunk);
      if (is_compute(a.kind)) {
        MINIDL_CHECK(a.peer == -1, "pipeline schedule: ", at(i), ": a compute has no peer");
        int& n = seen[{int(a.kind), a.micro, a.chunk}];
        MINIDL_CHECK(++n == 1, "pipeline schedule: ", at(i), ": runs twice");
        MINIDL_CHECK(a.kind == ActionKind::kForward || seen.count({int(ActionKind::kForward), a.micro, a.chunk}),
                     "pipeline schedule: ", at(i), ": backward before its forward");
        Message need;
        if (needs_message(spec, a, r, need) && rank_of_chunk(spec, need.consumer + (need.grad ? 1 : -1)) != r &&
            !received.count(need) && late_receive.empty())  // reported after the pairs, which say why
          late_receive = "pipeline schedule: " + at(i) + " needs the " + describe(need) + " but rank " +
                         std::to_string(r) + " has posted no receive for it before";
        continue;
      }
      MINIDL_CHECK(a.peer >= 0 && a.peer < p, "pipeline schedule: ", at(i), ": expected a peer in [0, ", p, ")");
      MINIDL_CHECK(a.peer != r, "pipeline schedule: ", at(i), ": rank ", r,
                   " would wait on itself (a chunk's neighbour on the same rank is handed over in memory)");
      const Message m = message_of(spec, a, r);
      MINIDL_CHECK(m.consumer >= 0 && m.consumer < C, "pipeline schedule: ", at(i), ": chunk ", c, " has no ",
                   m.grad ? "previous" : "next", " chunk to talk to");
      const int other = is_send(a.kind) ? m.consumer : m.consumer + (m.grad ? 1 : -1);
      MINIDL_CHECK(rank_of_chunk(spec, other) == a.peer, "pipeline schedule: ", at(i), ": chunk ", other,
                   " lives on rank ", rank_of_chunk(spec, other), ", not on rank ", a.peer);
      if (is_send(a.kind)) {
        const ActionKind producer = m.grad ? ActionKind::kBackward : ActionKind::kForward;
        MINIDL_CHECK(seen.count({int(producer), a.micro, a.chunk}), "pipeline schedule: ", at(i),
                     ": posted before the ", action_kind_name(producer), " that produces it");
      } else {
        MINIDL_CHECK(received.emplace(m, i).second, "pipeline schedule: ", at(i), ": received twice");
      }
    }
    for (int v = 0; v < V; ++v)
      for (int m = 0; m < M; ++m)
        for (ActionKind k : {ActionKind::kForward, ActionKind::kBackward})
          MINIDL_CHECK(seen.count({int(k), m, v}), "pipeline schedule: rank ", r, " never runs the ",
                       action_kind_name(k), " of m=", m, " v=", v);
    MINIDL_CHECK(!list.empty() && list.back().kind == ActionKind::kOptimizerStep, "pipeline schedule: rank ", r,
                 " does not end with the optimizer step");
  }
  // Posting order, pair by pair: the k-th send from a to b and the k-th receive on b from a are the same message.
  for (int a = 0; a < p; ++a) {
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      std::vector<std::pair<size_t, Message>> sends, recvs;
      for (size_t i = 0; i < s.ranks[size_t(a)].size(); ++i) {
        const Action& x = s.ranks[size_t(a)][i];
        if (is_send(x.kind) && x.peer == b) sends.push_back({i, message_of(spec, x, a)});
      }
      for (size_t i = 0; i < s.ranks[size_t(b)].size(); ++i) {
        const Action& x = s.ranks[size_t(b)][i];
        if (is_recv(x.kind) && x.peer == a) recvs.push_back({i, message_of(spec, x, b)});
      }
      for (size_t k = 0; k < std::max(sends.size(), recvs.size()); ++k) {
        auto act = [&](int r, size_t i) {
          return "rank " + std::to_string(r) + " action #" + std::to_string(i) + " (" +
                 describe(s.ranks[size_t(r)][i]) + ")";
        };
        MINIDL_CHECK(k < recvs.size(), "pipeline schedule: ", act(a, sends[k].first), " is message ", k + 1,
                     " from rank ", a, " to rank ", b, ", but rank ", b, " posts only ", recvs.size(),
                     " receive(s) from rank ", a, ": the send has no matching receive");
        MINIDL_CHECK(k < sends.size(), "pipeline schedule: ", act(b, recvs[k].first), " is receive ", k + 1,
                     " from rank ", a, " on rank ", b, ", but rank ", a, " posts only ", sends.size(),
                     " send(s) to rank ", b, ": the receive has no matching send");
        auto has = [](const std::vector<std::pair<size_t, Message>>& v, const Message& m) {
          return std::any_of(v.begin(), v.end(), [&](const auto& x) { return x.second == m; });
        };
        MINIDL_CHECK(has(recvs, sends[k].second), "pipeline schedule: ", act(a, sends[k].first),
                     " has no matching "
                     "receive on rank ",
                     b, " (the ", describe(sends[k].second), " is never received)");
        MINIDL_CHECK(has(sends, recvs[k].second), "pipeline schedule: ", act(b, recvs[k].first),
                     " has no matching "
                     "send on rank ",
                     a, " (the ", describe(recvs[k].second), " is never sent)");
        MINIDL_CHECK(sends[k].second == recvs[k].second, "pipeline schedule: message ", k + 1, " from rank ", a,
                     " to rank ", b, " is posted in a different order on the two sides: ", act(a, sends[k].first),
                     " sends the ", describe(sends[k].second), " but ", act(b, recvs[k].first), " receives the ",
                     describe(recvs[k].second), " (without tags they would be swapped)");
      }
    }
  }
  MINIDL_CHECK(late_receive.empty(), late_receive);
  simulate(s);  // throws on a deadlock
}

SimResult simulate(const Schedule& s, double forward_time, double backward_time) {
  const PipelineSpec& spec = s.spec;
  const int p = int(s.ranks.size());
  const double tf = forward_time / spec.virtual_stages, tb = backward_time / spec.virtual_stages;
  SimResult out;
  out.busy.assign(size_t(p), 0.0);
  out.peak_in_flight.assign(size_t(p), 0);
  out.slots.assign(size_t(p), {});
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> clock(size_t(p), 0.0);
  std::vector<int> in_flight(size_t(p), 0);
  std::map<Message, double> arrived;  // message -> time its send was posted
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = s.ranks[size_t(r)];
      while (next[size_t(r)] < list.size()) {
        const Action& a = list[next[size_t(r)]];
        double start = clock[size_t(r)];
        Message need;
        if (is_compute(a.kind) && needs_message(spec, a, r, need) &&
            rank_of_chunk(spec, need.consumer + (need.grad ? 1 : -1)) != r) {
          auto it = arrived.find(need);
          if (it == arrived.end()) break;  // waits for a message not sent yet
          start = std::max(start, it->second);
        }
        if (is_send(a.kind)) arrived[message_of(spec, a, r)] = clock[size_t(r)];
        if (is_compute(a.kind)) {
          const double d = a.kind == ActionKind::kForward ? tf : tb;
          out.slots[size_t(r)].push_back({start, start + d});
          clock[size_t(r)] = start + d;
          out.busy[size_t(r)] += d;
          in_flight[size_t(r)] += a.kind == ActionKind::kForward ? 1 : -1;
          out.peak_in_flight[size_t(r)] = std::max(out.peak_in_flight[size_t(r)], in_flight[size_t(r)]);
        } else {
          out.slots[size_t(r)].push_back({clock[size_t(r)], clock[size_t(r)]});
        }
        ++next[size_t(r)];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int r = 0; r < p; ++r) {
    if (next[size_t(r)] == s.ranks[size_t(r)].size()) continue;
    const Action& a = s.ranks[size_t(r)][next[size_t(r)]];
    Message need;
    needs_message(spec, a, r, need);
    stuck << "\n  rank " << r << " waits at action #" << next[size_t(r)] << " (" << describe(a) << ") for the "
          << describe(need) << " from rank " << rank_of_chunk(spec, need.consumer + (need.grad ? 1 : -1))
          << ", which is never sent before it";
  }
  MINIDL_CHECK(stuck.str().empty(), "pipeline schedule ", schedule_kind_name(spec.kind), " deadlocks:", stuck.str());
  for (double c : clock) out.makespan = std::max(out.makespan, c);
  return out;
}

double SimResult::bubble_fraction() const {
  if (makespan <= 0 || busy.empty()) return 0.0;
  double sum = 0;
  for (double b : busy) sum += b;
  return 1.0 - sum / (double(busy.size()) * makespan);
}

double bubble_formula(const PipelineSpec& s) {
  const double p = s.stages, vm = double(s.virtual_stages) * s.micro_batches;
  return (p - 1) / (vm + p - 1);
}

std::string draw_schedule(const Schedule& s) {
  const PipelineSpec& spec = s.spec;
  const int V = spec.virtual_stages;
  // One cell per unit: a chunk's forward 1, its backward 2 (the usual B ≈ 2F).
  SimResult sim = simulate(s, double(V), 2.0 * V);
  const int cells = int(std::lround(sim.makespan));
  std::ostringstream os;
  os << "schedule " << schedule_kind_name(spec.kind) << ": pp=" << spec.stages
     << " micro-batches=" << spec.micro_batches;
  if (V > 1) os << " virtual-stages=" << V << " (letter = local chunk)";
  os << "; F = forward, B = backward (2 units), . = idle\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const size_t width = V > 1 ? 4 : 3;
    std::vector<std::string> row(size_t(cells), width == 4 ? " .  " : " . ");
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (!is_compute(a.kind)) continue;
      auto [t0, t1] = sim.slots[r][i];
      std::string text(1, a.kind == ActionKind::kForward ? 'F' : 'B');  // not "F" + ...: GCC 12's -Wrestrict misfires
      text += std::to_string(a.micro);
      if (V > 1) text += char('a' + a.chunk % 26);
      text.resize(width, ' ');
      for (int c = int(std::lround(t0)); c < int(std::lround(t1)) && c < cells; ++c) row[size_t(c)] = text;
    }
    os << "rank " << r << " |";
    for (const std::string& c : row) os << c;
    os << "|\n";
  }
  char line[160];
  std::snprintf(line, sizeof line,
                "bubble: %.1f%% simulated, %.1f%% = (p-1)/(V*M+p-1) by formula; peak micro-batches "
                "in flight per rank:",
                100 * sim.bubble_fraction(), 100 * bubble_formula(spec));
  os << line;
  for (int n : sim.peak_in_flight) os << ' ' << n;
  os << '\n';
  return os.str();
}

std::vector<int64_t> split_layers(int64_t n_layer, int chunks, int64_t block_params, int64_t first_extra,
                                  int64_t last_extra) {
  MINIDL_CHECK(chunks >= 1 && n_layer >= chunks, "pipeline: ", chunks,
               " model chunks (--pp x --virtual-stages) "
               "but the model has only ",
               n_layer, " blocks (--layers): every chunk needs at least one block");
  // best[k][i]: the smallest largest-chunk cost splitting blocks [0, i) into k chunks; cut[k][i] its last cut.
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(size_t(chunks) + 1, std::vector<int64_t>(size_t(n_layer) + 1, inf));
  std::vector<std::vector<int64_t>> cut(size_t(chunks) + 1, std::vector<int64_t>(size_t(n_layer) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= chunks; ++k)
    for (int64_t i = k; i <= n_layer; ++i)
      for (int64_t j = k - 1; j < i; ++j) {
        if (best[size_t(k - 1)][size_t(j)] == inf) continue;
        int64_t cost = (i - j) * block_params + (k == 1 ? first_extra : 0) + (k == chunks ? last_extra : 0);
        int64_t worst = std::max(best[size_t(k - 1)][size_t(j)], cost);
        if (worst < best[size_t(k)][size_t(i)]) {
          best[size_t(k)][size_t(i)] = worst;
          cut[size_t(k)][size_t(i)] = j;
        }
      }
  std::vector<int64_t> starts(size_t(chunks) + 1);
  starts[size_t(chunks)] = n_layer;
  for (int k = chunks; k >= 1; --k) starts[size_t(k - 1)] = cut[size_t(k)][size_t(starts[size_t(k)])];
  return starts;
}

std::vector<int64_t> parse_layer_split(const std::string& text, int64_t n_layer, int chunks) {
  std::vector<int64_t> starts{0};
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long long n = std::strtoll(item.c_str(), &end, 10);
    MINIDL_CHECK(!item.empty() && *end == '\0' && n >= 1, "--pp-layers '", text,
                 "': expected comma-separated positive block counts, got '", item, "'");
    starts.push_back(starts.back() + n);
  }
  MINIDL_CHECK(int(starts.size()) - 1 == chunks, "--pp-layers '", text, "': expected ", chunks,
               " counts (--pp x --virtual-stages), got ", starts.size() - 1);
  MINIDL_CHECK(starts.back() == n_layer, "--pp-layers '", text, "': the counts add up to ", starts.back(),
               " blocks, but the model has ", n_layer, " (--layers)");
  return starts;
}

}  // namespace minidl::dist
