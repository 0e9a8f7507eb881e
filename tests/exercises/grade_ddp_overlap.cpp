// The grader of exercise ddp_overlap (dist/naive/ddp_overlap.h; scripts/minidl-exercise check ddp_overlap): the
// bucketed DDP whose all-reduces start during the backward, at bucket caps giving 1, 2 and 3 buckets, each rank from
// its own seed, against one process on the whole batch; the overlap itself, read off the backward (a hook of the
// grader's on the gradient that is final last counts the all-reduces already launched); the traffic.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ddp_overlap.h"
#include "grader.h"
#include "grader_model.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;
using namespace exercises::model;

namespace {

// The trained tensors in reverse registration order: proj 16, wte 64, fc_bias 8, fc_weight 32 elements.
// Caps 120, 80 and 64 give 1, 2 and 3 buckets.
const std::vector<std::pair<int64_t, size_t>> kCaps = {{120, 1}, {80, 2}, {64, 3}};

int64_t all_reduces(size_t from) {
  int64_t n = 0;
  const auto entries = dist::flight_entries();
  for (size_t i = from; i < entries.size(); ++i)
    if (entries[i].group == "exercise" && entries[i].op == "all_reduce") ++n;
  return n;
}

void expect_one_process(const Run& run, const Net& model, const Net& oracle, int64_t cap, int step) {
  const auto mine = model.named_parameters(), want = oracle.named_parameters();
  for (size_t k = 0; k < mine.size(); ++k) {
    const std::vector<double> g = mine[k].second.grad().to_vector(), o = want[k].second.grad().to_vector();
    double worst = 0, dot = 0, oo = 0, scale = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      worst = std::max(worst, std::abs(g[j] - o[j]));
      dot += g[j] * o[j], oo += o[j] * o[j], scale = std::max(scale, std::abs(o[j]));
    }
    if (worst <= 1e-5 * std::max(1.0, scale)) continue;
    const double k_ratio = oo > 0 ? dot / oo : 0;
    if (std::abs(k_ratio - run.size()) < 1e-3 * run.size())
      fail("bucket cap ", cap, ", step ", step, ": ", mine[k].first, "'s gradient is N = ", run.size(),
           " times one process's: summed, not averaged");
    fail("bucket cap ", cap, ", step ", step, ": after finish() ", mine[k].first,
         "'s gradient differs from one "
         "process's by up to ",
         worst,
         " (a bucket launched before its last gradient was final, or its average not "
         "copied back?)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"gradients",
           "2 backwards at caps giving 1, 2 and 3 buckets: one process's gradients after finish()",
           {2, 3},
           5,
           [](Run& run) {
             for (const auto& [cap, buckets] : kCaps) {
               Net model(kRankZeroSeed + uint64_t(run.rank()), false);
               dist::naive::OverlappedDataParallel dp(model, *run.exercise, cap);
               if (dp.buckets() != buckets) fail("cap ", cap, " gave ", dp.buckets(), " buckets, expected ", buckets);
               for (int step = 0; step < 2; ++step) {
                 Net oracle(kRankZeroSeed, false);
                 oracle.load_state_dict(model.state_dict());
                 model.zero_grad();
                 auto [x, y] = batch(step);
                 model.loss(slice(x, run.rank(), run.size()), slice(y, run.rank(), run.size())).backward();
                 dp.finish();
                 oracle.loss(x, y).backward();
                 expect_one_process(run, model, oracle, cap, step);
               }
             }
           }},
          {"overlap",
           "the first bucket's all-reduce starts before the backward's last gradient is final",
           {2, 3},
           5,
           [](Run& run) {
             Net model(kRankZeroSeed + uint64_t(run.rank()), false);
             int64_t launched_before_last = -1;
             size_t at = 0;
             // fc_weight's gradient is final last (the first layer); this hook runs before the exercise's on it.
             model.fc_weight.register_grad_ready_hook([&](Tensor&) { launched_before_last = all_reduces(at); });
             dist::naive::OverlappedDataParallel dp(model, *run.exercise, 64);  // 3 buckets
             auto [x, y] = batch(0);
             at = dist::flight_entries().size();
             model.loss(slice(x, run.rank(), run.size()), slice(y, run.rank(), run.size())).backward();
             const int64_t during = all_reduces(at);
             dp.finish();
             if (launched_before_last < 1)
               fail(
                   "no all-reduce had started when the backward's last gradient (fc_weight) became final, with 3 "
                   "buckets: nothing overlaps the backward (",
                   during,
                   " launched by its end); launch a bucket's "
                   "all-reduce from the hook of its last gradient");
           },
           {"ddp_overlap.h:1"}},
          {"traffic",
           "one all-reduce per bucket per backward, every trained element once",
           {2, 3},
           1,
           [](Run& run) {
             for (const auto& [cap, buckets] : kCaps) {
               Net model(kRankZeroSeed + uint64_t(run.rank()), false);
               dist::naive::OverlappedDataParallel dp(model, *run.exercise, cap);
               for (int step = 0; step < 2; ++step) {
                 auto [x, y] = batch(step);
                 const size_t at = dist::flight_entries().size();
                 model.zero_grad();
                 model.loss(slice(x, run.rank(), run.size()), slice(y, run.rank(), run.size())).backward();
                 dp.finish();
                 int64_t calls = 0, elements = 0;
                 const auto entries = dist::flight_entries();
                 for (size_t i = at; i < entries.size(); ++i)
                   if (entries[i].group == "exercise") ++calls, elements += entries[i].count;
                 if (calls != int64_t(buckets) || elements != 120)
                   fail("cap ", cap, ", backward ", step + 1, ": ", calls, " calls moving ", elements, " elements; ",
                        buckets, " buckets need ", buckets,
                        " all-reduces of 120 elements in all (one per bucket, "
                        "not one per tensor",
                        step == 1 ? ", and a bucket's count of ready gradients reset for each "
                                    "backward)"
                                  : ")");
               }
             }
           }},
      });
}
