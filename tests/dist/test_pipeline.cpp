// Pipeline schedules as data: the simulated bubble against the papers' formulas, validation of every generated
// schedule, planted bugs reported by rank and action, peak micro-batches in flight, the block split.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "dist/pipeline.h"

using namespace minidl;
using namespace minidl::dist;

namespace {

std::string error_of(const Schedule& s) {
  try {
    validate_schedule(s);
  } catch (const Error& e) { return e.what(); }
  return "";
}

}  // namespace

TEST(PipelineSchedule, EveryGeneratedScheduleValidates) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 12, 16})
        for (int v : {1, 2, 3}) {
          PipelineSpec spec{kind, p, m, v};
          if (kind != ScheduleKind::kInterleaved && v > 1) continue;
          if (kind == ScheduleKind::kInterleaved && m % p) continue;
          SCOPED_TRACE(std::string(schedule_kind_name(kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                       " v=" + std::to_string(v));
          EXPECT_EQ(error_of(make_schedule(spec)), "");
        }
}

// GPipe and 1F1B: (p − 1)/(m + p − 1) of the step is idle, whatever the forward/backward cost ratio.
TEST(PipelineSchedule, BubbleOfGPipeAnd1F1BIsTheFormula) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B})
    for (int p : {1, 2, 4, 8})
      for (int m : {1, 2, 4, 7, 16}) {
        Schedule s = make_schedule({kind, p, m, 1});
        for (auto [f, b] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
          SimResult sim = simulate(s, f, b);
          EXPECT_NEAR(sim.bubble_fraction(), double(p - 1) / (m + p - 1), 1e-12)
              << schedule_kind_name(kind) << " p=" << p << " m=" << m << " F=" << f << " B=" << b;
          EXPECT_NEAR(sim.makespan, (m + p - 1) * (f + b), 1e-9);
        }
      }
}

// Narayanan et al. 2021, §2.2.2: with V chunks per rank the bubble time is (p − 1)(t_f + t_b)/V, i.e.
// t_bubble / t_ideal = (1/V)(p − 1)/m, which is (p − 1)/(V·m + p − 1) of the whole step.
TEST(PipelineSchedule, BubbleOfInterleavedIsTheFormula) {
  for (int p : {2, 4})
    for (int v : {1, 2, 3, 4})
      for (int m : {p, 2 * p, 4 * p}) {
        PipelineSpec spec{ScheduleKind::kInterleaved, p, m, v};
        SimResult sim = simulate(make_schedule(spec), 1.0, 1.0);
        const double ideal = m * 2.0, bubble = sim.makespan - ideal;
        EXPECT_NEAR(bubble / ideal, (p - 1.0) / (v * m), 1e-12) << "p=" << p << " m=" << m << " v=" << v;
        EXPECT_NEAR(sim.bubble_fraction(), bubble_formula(spec), 1e-12);
      }
}

// 1F1B keeps at most min(m, p − s) micro-batches in flight on stage s; GPipe all m.
TEST(PipelineSchedule, MicroBatchesInFlight) {
  const int p = 4;
  for (int m : {2, 4, 8}) {
    SimResult one = simulate(make_schedule({ScheduleKind::k1F1B, p, m, 1}));
    SimResult all = simulate(make_schedule({ScheduleKind::kGPipe, p, m, 1}));
    for (int s = 0; s < p; ++s) {
      EXPECT_EQ(one.peak_in_flight[size_t(s)], std::min(m, p - s)) << "m=" << m << " stage " << s;
      EXPECT_EQ(all.peak_in_flight[size_t(s)], m);
    }
  }
}

TEST(PipelineSchedule, PlantedSendWithoutReceiveIsReported) {
  Schedule s = make_schedule({ScheduleKind::k1F1B, 4, 8, 1});
  // Drop rank 2's receive of the activation of micro-batch 5 (from rank 1).
  auto& list = s.ranks[2];
  auto it = std::find(list.begin(), list.end(), Action{ActionKind::kRecvActivation, 5, 0, 1});
  ASSERT_NE(it, list.end());
  list.erase(it);
  std::string e = error_of(s);
  EXPECT_NE(e.find("rank 2"), std::string::npos) << e;
  EXPECT_NE(e.find("activation m=5"), std::string::npos) << e;
  EXPECT_NE(e.find("no matching receive on rank 2"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 action"), std::string::npos) << e;
}

TEST(PipelineSchedule, PlantedSwapIsReportedWithBothSides) {
  // p = 2 interleaved: both directions join the same two ranks (Megatron #750). Swap two receives on rank 1.
  Schedule s = make_schedule({ScheduleKind::kInterleaved, 2, 4, 2});
  auto& list = s.ranks[1];
  size_t first = list.size(), second = list.size();
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == ActionKind::kRecvActivation || list[i].kind == ActionKind::kRecvGrad) {
      if (first == list.size())
        first = i;
      else if (list[i].kind != list[first].kind || list[i].micro != list[first].micro) {
        second = i;
        break;
      }
    }
  ASSERT_LT(second, list.size());
  std::swap(list[first], list[second]);
  std::string e = error_of(s);
  EXPECT_NE(e.find("different order"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 action"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 action"), std::string::npos) << e;
}

TEST(PipelineSchedule, PlantedDeadlockIsReportedNotHung) {
  // Rank 0 runs the backward of micro-batch 0 before sending any activation: it waits for a gradient that needs
  // its own activation first. Posting order is untouched, so only the simulation can see it.
  Schedule s = make_schedule({ScheduleKind::kGPipe, 2, 2, 1});
  auto& list = s.ranks[0];
  // Move rank 0's sends behind everything but the optimizer step, keeping their order.
  std::vector<Action> sends;
  for (auto it = list.begin(); it != list.end();)
    if (it->kind == ActionKind::kSendActivation) {
      sends.push_back(*it);
      it = list.erase(it);
    } else {
      ++it;
    }
  list.insert(list.end() - 1, sends.begin(), sends.end());
  std::string e = error_of(s);
  EXPECT_NE(e.find("deadlocks"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 waits at"), std::string::npos) << e;
}

TEST(PipelineSchedule, SelfSendIsRefused) {
  Schedule s = make_schedule({ScheduleKind::kGPipe, 2, 2, 1});
  for (Action& a : s.ranks[0])
    if (a.kind == ActionKind::kSendActivation) {
      a.peer = 0;
      break;
    }
  EXPECT_NE(error_of(s).find("wait on itself"), std::string::npos) << error_of(s);
}

TEST(PipelineSchedule, SpecErrors) {
  EXPECT_THROW(make_schedule({ScheduleKind::kInterleaved, 4, 6, 2}), Error);  // m not a multiple of p
  EXPECT_THROW(make_schedule({ScheduleKind::k1F1B, 2, 4, 2}), Error);         // V without interleaving
  EXPECT_THROW(parse_schedule_kind("zb-h1"), Error);
}

TEST(PipelineSchedule, DrawShowsEveryRankAndTheBubble) {
  std::string d = draw_schedule(make_schedule({ScheduleKind::k1F1B, 4, 8, 1}));
  for (const char* want : {"rank 0 |F0 ", "rank 3 |", "B7 ", "bubble: 27.3% simulated, 27.3%"})
    EXPECT_NE(d.find(want), std::string::npos) << want << "\n" << d;
  std::string i = draw_schedule(make_schedule({ScheduleKind::kInterleaved, 2, 4, 2}));
  EXPECT_NE(i.find("F0a"), std::string::npos) << i;
  EXPECT_NE(i.find("B3b"), std::string::npos) << i;
}

TEST(PipelineSplit, ByParameterCountAndByList) {
  // Equal blocks, no extras: as even as possible.
  EXPECT_EQ(split_layers(8, 4, 10, 0, 0), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  // A heavy embedding pushes blocks off the first chunk.
  EXPECT_EQ(split_layers(6, 2, 10, 25, 0), (std::vector<int64_t>{0, 2, 6}));
  EXPECT_EQ(parse_layer_split("1,3", 4, 2), (std::vector<int64_t>{0, 1, 4}));
  EXPECT_THROW(split_layers(3, 4, 10, 0, 0), Error);  // more chunks than blocks
  EXPECT_THROW(parse_layer_split("2,1", 4, 2), Error);
  EXPECT_THROW(parse_layer_split("2,x", 4, 2), Error);
  EXPECT_THROW(parse_layer_split("4", 4, 2), Error);
}
