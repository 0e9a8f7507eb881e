// The grader of exercise pipeline (dist/naive/gpipe.h, dist/naive/one_f_one_b.h; scripts/minidl-exercise check
// pipeline): a chain of S linear stages, one per rank, over M = 4 micro-batches, against one process that runs the
// whole chain and accumulates the micro-batches' gradients; the shared (tied) gradient sum; and 1F1B's schedule,
// read off the run itself: each stage's forward marks its weight with the micro-batch, so the backward that passes
// the mark says which micro-batch's backward ran when.
//
// A message that is sent and never received (or the reverse) hangs; the watchdog names which rank waits in which
// send or recv on which peer (scripts/exercise_grader.py).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/rng.h"
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

// What the stages saw: F m when a forward starts, B m when micro-batch m's backward leaves the stage's weight.
struct Log {
  std::vector<std::string> events;
  int forwards = 0, backwards = 0, peak = 0;
};

// w, marked so that the backward through it logs micro-batch m.
Tensor marked(const Tensor& w, int m, const std::shared_ptr<Log>& log) {
  return autograd::record("grader_mark", {w}, w.detach(), [m, log](const Tensor& gy) {
    log->events.push_back("B" + std::to_string(m));
    ++log->backwards;
    return std::vector<Tensor>{gy};
  });
}

// Stage s of S on micro-batch m: h (undefined on stage 0) -> the next activation, or on the last stage m's share
// of the batch's mean loss.
Tensor stage(int s, int S, const Tensor& w, const Tensor& h, int m, const std::shared_ptr<Log>& log) {
  if (log) {
    log->events.push_back("F" + std::to_string(m));
    log->peak = std::max(log->peak, ++log->forwards - log->backwards);
  }
  Tensor out = matmul(s == 0 ? input(m) : h, log ? marked(w, m, log) : w);
  if (s < S - 1) return gelu(out);
  return mul(mean(square(sub(out, target(m)))), 1.0 / kMicro);
}

// One process: the whole chain, micro-batch by micro-batch. Returns the loss; the weights' gradients accumulate.
double whole_chain(std::vector<Tensor>& weights) {
  const int S = int(weights.size());
  float loss = 0;
  for (int m = 0; m < kMicro; ++m) {
    Tensor h;
    for (int s = 0; s < S; ++s) h = stage(s, S, weights[size_t(s)], h, m, nullptr);
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

std::string events(const Log& log) {
  std::string out;
  for (const std::string& e : log.events) out += (out.empty() ? "" : " ") + e;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"gpipe",
           "two-stage GPipe: the loss and each stage's gradient equal one process's over 4 micro-batches",
           {2},
           5,
           [](Run& run) {
             const int s = run.rank();
             Tensor w = weight(s);
             const double loss = dist::naive::gpipe_step(
                 *run.exercise, kMicro, {kRows, kWidth}, [&](int m) { return stage(0, 2, w, Tensor(), m, nullptr); },
                 [&](const Tensor& h, int m) { return stage(1, 2, w, h, m, nullptr); });
             expect_oracle(run, w, loss, "GPipe");
           }},
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
          {"one_f_one_b",
           "1F1B over S stages: the loss and each stage's gradient equal one process's",
           {2, 3},
           5,
           [](Run& run) {
             const int s = run.rank(), S = run.size();
             Tensor w = weight(s);
             const double loss =
                 dist::naive::one_f_one_b_step(*run.exercise, kMicro, {kRows, kWidth},
                                               [&](const Tensor& h, int m) { return stage(s, S, w, h, m, nullptr); });
             expect_oracle(run, w, loss, "1F1B");
           }},
          {"one_f_one_b_schedule",
           "1F1B's order: S - s forwards before stage s's first backward, backwards oldest first, at most S - s "
           "micro-batches in flight",
           {2, 3},
           1,
           [](Run& run) {
             const int s = run.rank(), S = run.size();
             Tensor w = weight(s);
             auto log = std::make_shared<Log>();
             dist::naive::one_f_one_b_step(*run.exercise, kMicro, {kRows, kWidth},
                                           [&](const Tensor& h, int m) { return stage(s, S, w, h, m, log); });
             const int want_warm = std::min(S - s, kMicro);
             int warm = 0;
             while (warm < int(log->events.size()) && log->events[size_t(warm)][0] == 'F') ++warm;
             int next = 0;
             for (const std::string& e : log->events)
               if (e[0] == 'B' && std::stoi(e.substr(1)) != next++)
                 fail("stage ", s, " ran its backwards out of order (", events(*log),
                      "): 1F1B runs the oldest "
                      "micro-batch in flight first");
             if (warm != want_warm)
               fail("stage ", s, " of ", S, " ran ", warm, " forwards before its first backward (", events(*log),
                    "); 1F1B's warm-up is S - 1 - s = ", S - 1 - s,
                    " forwards, then one forward and one backward: ", want_warm,
                    warm > want_warm ? ". More only hold memory (GPipe's order holds all M)"
                                     : ". Fewer starve the later stages");
             if (log->peak > S - s)
               fail("stage ", s, " held ", log->peak,
                    " micro-batches between forward and backward; 1F1B holds at "
                    "most S - s = ",
                    S - s);
           }},
      });
}
