// train_gpt --trace end to end: what the per-rank Chrome traces show (steps, DDP's buckets, ZeRO's collectives,
// recomputation, pipeline actions), checked against what the run measures by other means (the summary's exposed
// communication, the pipeline's measured bubble, the schedule's counts), and scripts/merge_traces.py putting the
// ranks on one clock.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "support/run_program.h"

namespace fs = std::filesystem;

namespace {

using Result = minidl::testing::ProgramResult;

Result run_with(const std::string& prefix, const std::string& args) {
  return minidl::testing::run_program(prefix + std::string(TRAIN_GPT_BIN) + " " + args);
}

std::string mpiexec(int n) {
  return std::string(MPIEXEC) + " -n " + std::to_string(n) + " --oversubscribe --allow-run-as-root ";
}

double summary_field(const std::string& out, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("summary: .*" + key + "=([-0-9.e+naif]+)"))) return NAN;
  return std::stod(m[1]);
}

nlohmann::json read_trace(const std::string& file) {
  std::ifstream in(file);
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

nlohmann::json read_trace(const std::string& dir, int rank) {
  return read_trace(dir + "/rank" + std::to_string(rank) + ".json");
}

// A complete event ("ph": "X") of one rank's trace.
struct Span {
  std::string name;
  double ts = 0, dur = 0;
  int tid = 0;
  double end() const { return ts + dur; }
  bool contains(const Span& s) const { return s.tid == tid && s.ts >= ts && s.end() <= end(); }
  bool starts_with(const std::string& prefix) const { return name.rfind(prefix, 0) == 0; }
};

// The spans of `trace` (of rank `pid` only, in a merged trace) in the order they started.
std::vector<Span> spans_of(const nlohmann::json& trace, int pid = -1) {
  std::vector<Span> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && (pid < 0 || e.at("pid") == pid))
      out.push_back({e.at("name"), e.at("ts"), e.at("dur"), e.at("tid")});
  std::stable_sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
  return out;
}

std::vector<Span> named(const std::vector<Span>& spans, const std::string& prefix) {
  std::vector<Span> out;
  for (const Span& s : spans)
    if (s.starts_with(prefix)) out.push_back(s);
  return out;
}

// The track names by thread id.
std::map<int, std::string> tracks_of(const nlohmann::json& trace) {
  std::map<int, std::string> tracks;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") tracks[e.at("tid").get<int>()] = e.at("args").at("name");
  return tracks;
}

class TrainGptTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("minidl_trace_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::string text;  // 4 KB of a repeated phrase (vocabulary of 14 bytes)
    for (int i = 0; i < 200; ++i) text += "the quick brown fox. ";
    std::ofstream(dir_ / "tiny.txt") << text;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string tiny_flags() const {
    return "--data " + path("tiny.txt") +
           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 "
           "--eval-windows 4 --log-every 1000";
  }
  // Two pipeline stages of one block each, with enough work per forward and backward (a few ms on one core)
  // that a stage's waits are not lost in the noise of the bookkeeping between actions.
  std::string pipeline_flags() const {
    return "--data " + path("tiny.txt") +
           " --layers 2 --heads 4 --embd 128 --seq 64 --batch 32 --threads 1 "
           "--eval-windows 4 --log-every 1000 --pp 2 --micro-batches 4";
  }
  fs::path dir_;
};

}  // namespace

// --trace at 2 ranks: each rank's file is Chrome trace JSON with the required fields; every step has its span, its
// forwards and backwards; DDP's buckets run on the communication thread's track; and the main thread's waits for
// them ("wait for buckets", the communication the backward could not hide) add up to the summary's exposed_comm_ms
// (its mean over the timed steps, within 5% or the summary's rounding).
TEST_F(TrainGptTrace, StepsAndTheirCommunication) {
  Result r = run_with(mpiexec(2), tiny_flags() + " --steps 10 --trace " + path("trace"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const nlohmann::json trace = read_trace(path("trace"), rank);
    ASSERT_TRUE(trace.contains("traceEvents")) << "no trace file";
    std::map<int, std::string> tracks;
    std::map<std::string, int> spans;
    double waits_after_first = 0;
    for (const auto& e : trace.at("traceEvents")) {
      ASSERT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid")) << e.dump();
      EXPECT_EQ(e.at("pid").get<int>(), rank);
      const std::string ph = e.at("ph"), name = e.at("name");
      if (ph == "M" && name == "thread_name") tracks[e.at("tid").get<int>()] = e.at("args").at("name");
      if (ph != "X") continue;
      ASSERT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("tid")) << e.dump();
      const std::string kind = name.substr(0, name.find(' '));
      ++spans[kind];
      if (kind == "bucket") EXPECT_EQ(tracks[e.at("tid").get<int>()], "comm") << e.dump();
      if (name == "wait for buckets" && spans["wait"] > 1) waits_after_first += e.at("dur").get<double>() / 1e3;
    }
    EXPECT_EQ(spans["step"], 10);
    EXPECT_EQ(spans["forward"], 10);
    EXPECT_EQ(spans["backward"], 10);
    EXPECT_EQ(spans["optimizer"], 10);
    EXPECT_GE(spans["bucket"], 10);
    if (rank == 0) {
      const double summary = summary_field(r.out, "exposed_comm_ms"), traced = waits_after_first / 9;
      EXPECT_LE(std::abs(traced - summary), std::max(0.05 * summary, 0.006)) << "trace " << traced << " ms";
    }
  }
  Result merged =
      minidl::testing::run_program("python3 " + std::string(SOURCE_DIR) + "/scripts/merge_traces.py " + path("trace"));
  EXPECT_EQ(merged.code, 0) << merged.out;
  EXPECT_TRUE(fs::exists(path("trace") + "/merged.json"));
}

// --device cuda --dp 2 (the emulated device, its streams deferred as a GPU's run behind the host): every rank's
// trace has a track per stream. The compute stream's has each step's forward, backward and optimizer; the
// communication stream's has the NCCL collectives. A stream runs one thing at a time, so two spans on its track
// are nested or apart; no device span starts before the host span that queued it; and what the streams' order
// forces is there: in every step a bucket's all-reduce runs after the backward started (it reduces the backward's
// gradients) and before the optimizer starts (the compute stream waits for it).
TEST_F(TrainGptTrace, DeviceTimeOnEachStream) {
#if !defined(TRAIN_GPT_EMULATED_CUDA)
  GTEST_SKIP() << "needs the emulated CUDA build (-DMINIDL_CUDA_EMULATION=ON)";
#endif
  const int steps = 3;
  Result r = run_with(mpiexec(2), "--data " + path("tiny.txt") +
                                      " --layers 2 --heads 2 --embd 32 --seq 16 --batch 4 --threads 1 "
                                      "--eval-windows 4 --log-every 1000 --device cuda --dp 2 --steps " +
                                      std::to_string(steps) + " --trace " + path("trace"));
  ASSERT_EQ(r.code, 0) << r.out;
  constexpr double kTolUs = 1000;  // the device clock's placement on the trace's (core/cuda/trace_hooks.cpp)
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const nlohmann::json trace = read_trace(path("trace"), rank);
    ASSERT_TRUE(trace.contains("traceEvents")) << "no trace file";
    std::map<int, std::string> tracks = tracks_of(trace);
    std::map<std::string, std::vector<Span>> by_track;
    for (const Span& s : spans_of(trace)) by_track[tracks[s.tid]].push_back(s);
    const std::vector<Span>& compute = by_track["device 0: compute stream"];
    const std::vector<Span>& comm = by_track["device 0: communication stream"];
    ASSERT_FALSE(compute.empty()) << "no compute stream track";
    ASSERT_FALSE(comm.empty()) << "no communication stream track";
    const std::vector<Span> forwards = named(compute, "forward"), backwards = named(compute, "backward"),
                            optimizers = named(compute, "optimizer");
    ASSERT_EQ(int(forwards.size()), steps);
    ASSERT_EQ(int(backwards.size()), steps);
    ASSERT_EQ(int(optimizers.size()), steps);
    for (const Span& s : comm) EXPECT_TRUE(s.starts_with("nccl ")) << s.name;
    for (const Span& s : compute)  // the communication thread's spans are timed only on the collectives' stream
      EXPECT_FALSE(s.starts_with("bucket") || s.starts_with("nccl ")) << s.name;

    for (const auto& [track, spans] : by_track) {
      if (track.rfind("device", 0) != 0) continue;
      for (size_t i = 0; i < spans.size(); ++i)
        for (size_t j = i + 1; j < spans.size() && spans[j].ts < spans[i].end(); ++j)
          EXPECT_LE(spans[j].end(), spans[i].end() + 1)
              << track << ": " << spans[i].name << " and " << spans[j].name << " overlap without nesting";
    }
    // Each device span against the host span of the same name and rank in order.
    std::map<std::string, std::vector<Span>> host;
    for (const auto& [track, spans] : by_track)
      if (track.rfind("device", 0) != 0)
        for (const Span& s : spans) host[s.name].push_back(s);
    for (auto& [name, spans] : host)
      std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
    for (const std::vector<Span>* track : {&compute, &comm}) {
      std::map<std::string, size_t> seen;
      for (const Span& d : *track) {
        const size_t k = seen[d.name]++;
        ASSERT_LT(k, host[d.name].size()) << "a device span without its host span: " << d.name;
        EXPECT_GE(d.ts, host[d.name][k].ts - kTolUs) << d.name << " started on the device before the host queued it";
      }
    }
    for (int k = 0; k < steps; ++k) {
      bool reduced = false;
      for (const Span& s : comm)
        reduced |= s.starts_with("nccl all-reduce") && s.ts >= backwards[k].ts - kTolUs &&
                   s.end() <= optimizers[k].ts + kTolUs;
      EXPECT_TRUE(reduced) << "step " << k + 1 << ": no all-reduce between the backward's start and the optimizer";
    }
  }
}

// --pp 2 with 4 micro-batches: each stage's idle time read off its trace is the bubble the run measures, within
// 10%. From the trace, idle is the time of the schedule's span ("schedule": the window Stage::Timing divides by)
// that the stage spent outside its actions' spans (forwards, backwards, posting sends and receives), to which the
// waits for a peer nested in them are added back (a forward on stage 1 starts by waiting for its activation). The
// run measures only the time blocked on a peer ("pipeline measured bubble per stage", over the steps after the
// first). What no span covers is the loop between actions and the recording of the spans themselves: 0.4 points
// of a 9% bubble on a quiet machine, but it grows with the host's load (a preempted loop), and it failed the 10%
// bound in 2 of 5 full ctest -j2 runs. So that gap is read off the trace too (the window less the union of its
// actions' spans) and taken out before the comparison, which then holds at any load: what remains is the trace's
// waits against the run's own timer of them. A wrong reading is tens of points off (the wait halved: 44.7%
// against 22.1%); the gap itself is printed.
TEST_F(TrainGptTrace, ShowsThePipelineBubble) {
  const int steps = 6, micro_batches = 4;
  Result r = run_with(mpiexec(2), pipeline_flags() + " --steps " + std::to_string(steps) + " --trace " + path("trace"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  const std::regex measured_line("pipeline measured bubble per stage \\(%\\): ([0-9.]+) ([0-9.]+)");
  ASSERT_TRUE(std::regex_search(r.out, m, measured_line)) << r.out;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("stage " + std::to_string(rank));
    const std::vector<Span> spans = spans_of(read_trace(path("trace"), rank));
    const std::vector<Span> windows = named(spans, "schedule");
    ASSERT_EQ(windows.size(), size_t(steps));
    EXPECT_EQ(named(spans, "forward").size(), size_t(steps * micro_batches));
    EXPECT_EQ(named(spans, "backward").size(), size_t(steps * micro_batches));
    double window_us = 0, compute_us = 0, covered_us = 0;
    for (size_t w = 1; w < windows.size(); ++w) {  // the measured bubble leaves the first step out
      window_us += windows[w].dur;
      std::vector<std::pair<double, double>> actions;  // [start, end) of each action span in the window
      for (const Span& action : spans) {
        if (action.name == "wait for peer" && windows[w].contains(action))
          actions.emplace_back(action.ts, action.end());  // a wait is covered, whether in an action or not
        if (!(action.starts_with("forward") || action.starts_with("backward") || action.starts_with("send ") ||
              action.starts_with("recv ")) ||
            !windows[w].contains(action))
          continue;
        compute_us += action.dur;
        actions.emplace_back(action.ts, action.end());
        for (const Span& wait : spans)
          if (wait.name == "wait for peer" && action.contains(wait)) compute_us -= wait.dur;
      }
      std::sort(actions.begin(), actions.end());
      double reach = -1e300;  // the union of the actions' intervals
      for (const auto& [start, end] : actions) {
        if (end > reach) covered_us += end - std::max(start, reach);
        reach = std::max(reach, end);
      }
    }
    const double traced = 100 * (window_us - compute_us) / window_us, measured = std::stod(m[size_t(rank + 1)]);
    const double gap = 100 * (window_us - covered_us) / window_us;  // no span covers it: the loop, the recording
    EXPECT_GT(measured, 1.0) << "stage " << rank << " never waited: no bubble to compare\n" << r.out;
    EXPECT_GE(gap, -0.01) << "the actions' spans cover more than the window";
    EXPECT_LE(std::abs(traced - gap - measured), 0.10 * measured)
        << "idle in the trace " << traced << "% (of which " << gap << "% outside every span), measured " << measured
        << "%\n"
        << r.out;
    std::printf("stage %d: idle in the trace %.2f%% (%.2f%% outside every span), measured %.2f%%\n", rank, traced, gap,
                measured);
  }
}

// The merged trace is on rank 0's clock. Rank 1 starts its clock 200 ms after rank 0's (a test hook standing for a
// rank that left the barrier late): the offset its file records is that delay (it cannot be less; a loaded host
// may add a little), scripts/merge_traces.py adds it to every rank-1 timestamp, and then every message arrives after
// it was sent: stage 1's wait for a forward's activation ends after stage 0's forward of that micro-batch ended
// (without the offset, 200 ms before). Both runs, with and without the hook, measure the offset the host's own
// monotonic clock says.
TEST_F(TrainGptTrace, MergedTraceIsOnRankZerosClock) {
  const std::string flags = pipeline_flags() + " --steps 2 --trace " + path("trace");
  Result r = run_with("MINIDL_TEST_TRACE_LATE_RANK=1:200 " + mpiexec(2) + "-x MINIDL_TEST_TRACE_LATE_RANK ", flags);
  ASSERT_EQ(r.code, 0) << r.out;
  Result merged = minidl::testing::run_program("python3 " + std::string(SOURCE_DIR) + "/scripts/merge_traces.py " +
                                               path("trace") + " -o " + path("merged.json"));
  ASSERT_EQ(merged.code, 0) << merged.out;
  const nlohmann::json rank0 = read_trace(path("trace"), 0), rank1 = read_trace(path("trace"), 1);
  const nlohmann::json all = read_trace(path("merged.json"));
  ASSERT_TRUE(rank1.contains("otherData")) << rank1.dump().substr(0, 300);
  EXPECT_EQ(rank0.at("otherData").at("clock_offset_us").get<double>(), 0.0);
  const double offset = rank1.at("otherData").at("clock_offset_us");
  const double uncertainty = rank1.at("otherData").at("clock_uncertainty_us");
  // About 200 ms: the ranks leave one barrier together only roughly (0.6 ms apart once on a loaded CI machine);
  // the exact check against the host's monotonic clock is below.
  EXPECT_GE(offset, 200e3 - uncertainty - 5e3) << "rank 1's clock started 200 ms late";
  EXPECT_LE(offset, 230e3);

  std::vector<double> own, shifted;  // rank 1's timestamps in its file and in the merged file, in file order
  for (const auto& e : rank1.at("traceEvents"))
    if (e.contains("ts")) own.push_back(e.at("ts"));
  for (const auto& e : all.at("traceEvents"))
    if (e.contains("ts") && e.at("pid") == 1) shifted.push_back(e.at("ts"));
  ASSERT_EQ(shifted.size(), own.size());
  for (size_t i = 0; i < own.size(); ++i) ASSERT_NEAR(shifted[i], own[i] + offset, 1e-3) << "event " << i;

  const std::vector<Span> merged0 = spans_of(all, 0), merged1 = spans_of(all, 1);
  const std::vector<Span> sent = named(merged0, "forward"), received = named(merged1, "forward");
  ASSERT_EQ(sent.size(), received.size());
  ASSERT_FALSE(sent.empty());
  for (size_t i = 0; i < sent.size(); ++i) {
    ASSERT_EQ(sent[i].name, received[i].name);  // "forward m=k ...": the same micro-batch
    double arrived = -1;
    for (const Span& wait : merged1)
      if (wait.name == "wait for peer" && received[i].contains(wait)) arrived = wait.end();
    ASSERT_GE(arrived, 0) << received[i].name << " has no wait for its activation";
    EXPECT_GE(arrived + uncertainty, sent[i].end()) << received[i].name << ": received before it was sent";
  }

  // The truth on one host: both ranks' starts on the host's monotonic clock (steady_start_us). The measured offset
  // is rank 1's start minus rank 0's, to within its uncertainty (half the best round trip) plus 0.5 ms for a rank
  // descheduled between its ping-pong's send and its clock read on a loaded machine. Without the delay too: ranks
  // that left one barrier are not at the same moment (4 ms apart on a loaded CI machine).
  Result local = run_with(mpiexec(2), flags + "_local");
  ASSERT_EQ(local.code, 0) << local.out;
  for (const std::string& dir : {path("trace"), path("trace_local")}) {
    SCOPED_TRACE(dir);
    const nlohmann::json c0 = read_trace(dir, 0).at("otherData"), c1 = read_trace(dir, 1).at("otherData");
    const double truth = c1.at("steady_start_us").get<double>() - c0.at("steady_start_us").get<double>();
    EXPECT_NEAR(c1.at("clock_offset_us").get<double>(), truth, c1.at("clock_uncertainty_us").get<double>() + 500);
  }
}

// --zero 3 --recompute block at 2 ranks: ZeRO-3's collectives and the recomputations have spans, as many per step
// as the algorithm makes (dist/zero3.h): each block gathered for its forward and again for its backward (the
// recomputation finds it gathered), one reduce-scatter per block and one for the persistent unit, one all-gather of
// the persistent unit after the optimizer; and one recomputation per block. The gathers and reduce-scatters run on
// the communication thread's track. Each block's forward and backward is a span: the forwards in block order inside
// the step's forward, the backwards in reverse order inside its backward, each holding its block's recomputation
// and the main thread's wait for its gather.
TEST_F(TrainGptTrace, ShowsZeroCollectivesAndRecomputation) {
  const int steps = 3, layers = 2;
  std::string flags =
      tiny_flags() + " --steps " + std::to_string(steps) + " --zero 3 --recompute block --trace " + path("trace");
  flags.replace(flags.find("--layers 1"), 10, "--layers " + std::to_string(layers));
  Result r = run_with(mpiexec(2), flags);
  ASSERT_EQ(r.code, 0) << r.out;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const nlohmann::json trace = read_trace(path("trace"), rank);
    const std::map<int, std::string> tracks = tracks_of(trace);
    const std::vector<Span> spans = spans_of(trace), step_spans = named(spans, "step");
    ASSERT_EQ(step_spans.size(), size_t(steps));
    std::map<std::string, int> in_steps;  // by the name's first two words
    for (const Span& s : spans) {
      bool in_step = false;
      for (const Span& step : step_spans) in_step |= s.ts >= step.ts && s.end() <= step.end();
      if (!in_step) continue;
      const size_t second = s.name.find(' ', s.name.find(' ') + 1);
      ++in_steps[s.name.substr(0, second)];
      if (s.starts_with("all-gather block") || s.starts_with("reduce-scatter"))
        EXPECT_EQ(tracks.at(s.tid), "comm") << s.name;
    }
    EXPECT_EQ(in_steps["all-gather block"], steps * 2 * layers);
    EXPECT_EQ(in_steps["reduce-scatter bucket"], steps * (layers + 1));
    EXPECT_EQ(in_steps["all-gather parameters"], steps);
    EXPECT_EQ(in_steps["recompute"], steps * layers);
    EXPECT_EQ(in_steps["block 0"] + in_steps["block 1"], steps * 2 * layers);

    for (const Span& step : step_spans) {
      std::vector<Span> in_step;
      for (const Span& s : spans)
        if (s.tid == step.tid && step.contains(s)) in_step.push_back(s);
      const std::vector<Span> forward = named(in_step, "forward"), backward = named(in_step, "backward");
      ASSERT_EQ(forward.size(), 1u);
      ASSERT_EQ(backward.size(), 1u);
      std::vector<std::string> order;
      for (const Span& s : named(in_step, "block ")) {
        order.push_back(s.name);
        EXPECT_TRUE((s.name.find("forward") != std::string::npos ? forward : backward)[0].contains(s)) << s.name;
        if (s.name.find("backward") == std::string::npos) continue;
        int recomputes = 0, waits = 0;
        for (const Span& inner : in_step) {
          recomputes += inner.name == "recompute" && s.contains(inner);
          waits += inner.name == "wait for all-gather" && s.contains(inner);
        }
        EXPECT_EQ(recomputes, 1) << s.name << " holds its block's recomputation";
        EXPECT_EQ(waits, 1) << s.name << " holds the wait for its block's gather";
      }
      EXPECT_EQ(order, (std::vector<std::string>{"block 0 forward", "block 1 forward", "block 1 backward",
                                                 "block 0 backward"}));
    }
  }
}
