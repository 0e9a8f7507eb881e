// The grader of exercise pipeline (dist/naive/gpipe.h, dist/naive/one_f_one_b.h; scripts/minidl-exercise check
// pipeline). The action lists, as data: every rank's list of S stages through production's dist::validate_schedule
// (a send without its receive, a receive after the compute that needs it, ... named by rank and action) and
// dist::simulate (the bubble against (S - 1)/(M + S - 1)), and 1F1B's order read off the list. The execution: a
// chain of S linear stages, one per rank, over M = 4 micro-batches, against one process that runs the whole chain
// and accumulates the micro-batches' gradients; the shared (tied) gradient sum.
//
// A message that is sent and never received (or the reverse) at run time hangs; the watchdog names which rank
// waits in which send or recv on which peer, and the sends no receive took (scripts/exercise_grader.py).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/pipeline.h"
#include "gpipe.h"
#include "grader.h"
#include "one_f_one_b.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;

namespace {

constexpr int kMicro = 4;
constexpr int64_t kRows = 2, kWidth = 6;

Tensor random(const Shape& shape, uint64_t seed, uint64_t stream, double scale) {
  return mul(Tensor::randn(shape, Philox(seed, stream)), scale).detach();
}
Tensor weight(int stage) { return random({kWidth, kWidth}, 50 + uint64_t(stage), 0, 0.5).set_requires_grad(true); }
Tensor input(int m) { return random({kRows, kWidth}, 60, uint64_t(m), 1.0); }
Tensor target(int m) { return random({kRows, kWidth}, 61, uint64_t(m), 1.0); }

// Stage s of S on micro-batch m: h (undefined on stage 0) -> the next activation, or on the last stage m's share
// of the batch's mean loss.
Tensor stage(int s, int S, const Tensor& w, const Tensor& h, int m) {
  Tensor out = matmul(s == 0 ? input(m) : h, w);
  if (s < S - 1) return gelu(out);
  return mul(mean(square(sub(out, target(m)))), 1.0 / kMicro);
}

// One process: the whole chain, micro-batch by micro-batch. Returns the loss; the weights' gradients accumulate.
double whole_chain(std::vector<Tensor>& weights) {
  const int S = int(weights.size());
  float loss = 0;
  for (int m = 0; m < kMicro; ++m) {
    Tensor h;
    for (int s = 0; s < S; ++s) h = stage(s, S, weights[size_t(s)], h, m);
    h.backward();
    loss += float(h.item());
  }
  return loss;
}

void expect_oracle(const Run& run, const Tensor& w, double loss, const char* schedule) {
  std::vector<Tensor> all;
  for (int s = 0; s < run.size(); ++s) all.push_back(weight(s));
  const double want_loss = whole_chain(all);
  const int s = run.rank();
  if (!w.grad().defined()) fail(schedule, ": stage ", s, "'s weight has no gradient: its backward never ran");
  const std::vector<double> got = w.grad().to_vector(), want = all[size_t(s)].grad().to_vector();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i])), scale = std::max(scale, std::abs(want[i]));
  if (worst > 1e-6 * std::max(1.0, scale)) {
    // The gradient of the M micro-batches accumulated: a missing or doubled backward shows as a partial sum.
    fail(schedule, ": stage ", s, "'s weight gradient differs from one process accumulating the ", kMicro,
         " micro-batches by up to ", worst,
         " (a micro-batch's backward skipped, doubled, or run from the wrong "
         "activation's gradient?)");
  }
  if (s == run.size() - 1 && std::abs(loss - want_loss) > 1e-6 * std::max(1.0, std::abs(want_loss)))
    fail(schedule, ": the last stage returned the loss ", loss, ", one process's is ", want_loss,
         " (the M shares summed)");
  if (s != run.size() - 1 && loss != 0.0)
    fail(schedule, ": stage ", s, " returned ", loss,
         "; only the last stage "
         "has the loss (the others return 0)");
}

// Every rank's list, from the learner's actions(S, s, M), as dist::validate_schedule and dist::simulate take it.
dist::Schedule lists(dist::ScheduleKind kind, int S, int M, std::vector<dist::Action> (*actions)(int, int, int)) {
  dist::Schedule schedule{{kind, S, M, 1}, {}};
  for (int s = 0; s < S; ++s) schedule.ranks.push_back(actions(S, s, M));
  return schedule;
}

void expect_valid(const dist::Schedule& schedule, const char* name) {
  try {
    dist::validate_schedule(schedule);
  } catch (const Error& e) {
    fail("the validator rejects ", name, "'s lists at S = ", schedule.spec.stages,
         ", M = ", schedule.spec.micro_batches, ": ", e.what());
  }
}

// Stage s's computes in list order, "F0 F1 B0 ...".
std::string computes(const std::vector<dist::Action>& list) {
  std::string out;
  for (const dist::Action& a : list)
    if (a.kind == dist::ActionKind::kForward || a.kind == dist::ActionKind::kBackward)
      out += (out.empty() ? "" : " ") + std::string(a.kind == dist::ActionKind::kForward ? "F" : "B") +
             std::to_string(a.micro);
  return out;
}

// The simulated bubble against the formula (S - 1)/(M + S - 1): the schedule idles no more than it must.
void expect_bubble(const dist::Schedule& schedule, const char* name) {
  const double got = dist::simulate(schedule).bubble_fraction(), want = dist::bubble_formula(schedule.spec);
  if (got > want + 1e-9)
    fail(name, " at S = ", schedule.spec.stages, ", M = ", schedule.spec.micro_batches,
         ": the simulator finds a bubble of ", got, ", the formula (S - 1)/(M + S - 1) says ", want,
         " (stages wait on each other: a compute placed after one it does not need to follow)");
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"gpipe_schedule",
           "GPipe's lists: the validator accepts them (every send meets its receive), every forward then every "
           "backward in micro-batch order, the simulated bubble (S - 1)/(M + S - 1)",
           {2, 3},
           1,
           [](Run& run) {
             const int S = run.size();
             for (int M : {1, kMicro}) {
               const dist::Schedule schedule = lists(dist::ScheduleKind::kGPipe, S, M, dist::naive::gpipe_actions);
               expect_valid(schedule, "GPipe");
               std::string want;
               for (int k = 0; k < 2 * M; ++k)
                 want += (k ? " " : "") + std::string(k < M ? "F" : "B") + std::to_string(k % M);
               for (int s = 0; s < S; ++s)  // every rank checks every stage: the same first defect on each
                 if (computes(schedule.ranks[size_t(s)]) != want)
                   fail("GPipe's stage ", s, " computes ", computes(schedule.ranks[size_t(s)]), "; GPipe runs ", want,
                        " (every forward, then every backward, each in micro-batch order)");
               expect_bubble(schedule, "GPipe");
             }
           }},
          {"gpipe",
           "GPipe run by your executor over S stages: the loss and each stage's gradient equal one process's over 4 "
           "micro-batches",
           {2, 3},
           5,
           [](Run& run) {
             const int s = run.rank(), S = run.size();
             Tensor w = weight(s);
             const double loss = dist::naive::gpipe_step(*run.exercise, kMicro, {kRows, kWidth},
                                                         [&](const Tensor& h, int m) { return stage(s, S, w, h, m); });
             expect_oracle(run, w, loss, "GPipe");
           },
           {"gpipe.h:1", "gpipe.h:2"}},
          {"shared_gradients",
           "a parameter on two stages gets the sum of both halves of its gradient",
           {2, 3},
           5,
           [](Run& run) {
             Tensor t = random({5}, 70, 0, 1.0).set_requires_grad(true);
             const Tensor mine = random({5}, 71, uint64_t(run.rank()), 1.0);
             t.set_grad(mine.clone());
             Tensor want = mine.clone();
             run.grader->all_reduce(want, dist::ReduceOp::kSum)->wait();
             dist::naive::sum_shared_gradients(*run.exercise, {t});
             const std::vector<double> got = t.grad().to_vector(), w = want.to_vector();
             for (size_t i = 0; i < got.size(); ++i) {
               if (std::abs(got[i] - w[i]) <= 1e-6 * std::max(1.0, std::abs(w[i]))) continue;
               if (std::abs(got[i] * run.size() - w[i]) <= 1e-5 * std::max(1.0, std::abs(w[i])))
                 fail(
                     "the shared gradient is the average of the stages' halves, 1/N of their sum: both copies must "
                     "take the step of the whole gradient (sum, not average)");
               fail("the shared gradient is not the sum of the stages' halves");
             }
           }},
          {"one_f_one_b_schedule",
           "1F1B's lists: S - 1 - s forwards before stage s's first backward, backwards oldest first, at most S - s "
           "micro-batches in flight, accepted by the validator, the simulated bubble (S - 1)/(M + S - 1)",
           {2, 3},
           1,
           [](Run& run) {
             const int S = run.size();
             const dist::Schedule schedule =
                 lists(dist::ScheduleKind::k1F1B, S, kMicro, dist::naive::one_f_one_b_actions);
             // Every rank checks every stage's list, first stage first, so every rank reports the same first
             // defect (one rank checking its own stage alone raced another's validator report: CI saw both).
             for (int s = 0; s < S; ++s) {
               const std::vector<dist::Action>& list = schedule.ranks[size_t(s)];
               int warm = 0, next = 0, in_flight = 0, peak = 0;
               bool backward_seen = false;
               for (const dist::Action& a : list) {
                 if (a.kind == dist::ActionKind::kForward) {
                   warm += !backward_seen;
                   peak = std::max(peak, ++in_flight);
                 } else if (a.kind == dist::ActionKind::kBackward) {
                   backward_seen = true;
                   --in_flight;
                   if (a.micro != next++)
                     fail("stage ", s, " runs its backwards out of order (", computes(list),
                          "): 1F1B runs the oldest micro-batch in flight first");
                 }
               }
               const int want_warm = std::min(S - s, kMicro);  // the warm-up's S - 1 - s, and the first steady one
               if (warm != want_warm)
                 fail("stage ", s, " of ", S, " runs ", warm, " forwards before its first backward (", computes(list),
                      "); 1F1B's warm-up is S - 1 - s = ", S - 1 - s,
                      " forwards, then one forward and one backward: ", want_warm,
                      warm > want_warm ? ". More only hold memory (GPipe's order holds all M)"
                                       : ". Fewer starve the later stages");
               if (peak > S - s)
                 fail("stage ", s, " holds ", peak,
                      " micro-batches between forward and backward; 1F1B holds at most "
                      "S - s = ",
                      S - s);
             }
             expect_valid(schedule, "1F1B");
             expect_bubble(schedule, "1F1B");
           },
           {"gpipe.h:1"}},
          {"one_f_one_b",
           "1F1B over S stages: the loss and each stage's gradient equal one process's",
           {2, 3},
           5,
           [](Run& run) {
             const int s = run.rank(), S = run.size();
             Tensor w = weight(s);
             const double loss = dist::naive::one_f_one_b_step(
                 *run.exercise, kMicro, {kRows, kWidth}, [&](const Tensor& h, int m) { return stage(s, S, w, h, m); });
             expect_oracle(run, w, loss, "1F1B");
           },
           {"gpipe.h:1", "gpipe.h:3"}},
      });
}
