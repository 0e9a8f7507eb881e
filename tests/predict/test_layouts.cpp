// The predictor and the trainer agree on what runs: for every layout train_gpt's flags can name on 1, 2 and 4 ranks
// (each grid, ZeRO 0-3, sequence parallelism, each schedule, virtual stages, micro-batches, recompute) on the baby
// model, TrainConfig::validate accepts it exactly when predict::refusal has no reason, so no layout the trainer
// runs lacks a prediction and the predictor refuses none it runs. A mismatch names the layout and both answers.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "predict/predict.h"
#include "train/config.h"

namespace minidl {
namespace {

// The predictor's layout for a configuration the trainer is given (the flags' meaning: train/config.h).
predict::Layout layout_of(const train::TrainConfig& c, int world) {
  predict::Layout l;
  l.dp = train::dp_size(c, world);
  l.tp = c.tp;
  l.pp = c.pp;
  l.virtual_stages = c.virtual_stages;
  l.micro_batches = int(c.micro_batches_or_default());
  l.zero = c.zero;
  l.recompute = nn::parse_recompute(c.recompute);
  l.sequence_parallel = c.sequence_parallel;
  l.schedule = dist::parse_schedule_kind(c.schedule);
  l.sync = predict::parse_outer_sync(c.sync);
  l.replicas = c.replica_groups;
  l.sync_every = c.sync_every;
  l.ps_servers = c.ps;
  l.ps_mode = predict::parse_ps_mode(c.ps_mode);
  l.amp = c.amp == "bf16" ? DType::bf16 : c.amp == "fp16" ? DType::f16 : DType::f32;
  l.cp = c.cp;
  l.ep = c.ep;
  return l;
}

// Both answers for one configuration on `world` ranks: the trainer's refusal and the predictor's (empty: runs).
struct Answers {
  std::string trainer, predictor;
};
Answers answers(const train::TrainConfig& c, int world) {
  Answers a;
  try {
    c.validate(world);
  } catch (const Error& e) { a.trainer = e.what(); }
  const predict::Workload w{train::model_config(c, 65, nullptr, ""), c.batch};
  const int workers = c.ps > 0 ? world - c.ps : world;
  a.predictor = workers >= 1 ? predict::refusal(w, layout_of(c, workers)) : "no worker";
  return a;
}

TEST(PredictLayouts, EveryLayoutTheTrainerRunsHasAPredictionAndNoOther) {
  int compared = 0, runnable = 0;
  std::vector<std::string> mismatches;
  for (int world : {1, 2, 4})
    for (int tp = 1; tp <= world; tp *= 2)
      for (int pp = 1; tp * pp <= world; pp *= 2)
        for (int zero = 0; zero <= 3; ++zero)
          for (bool sp : {false, true})
            for (const char* schedule : {"gpipe", "1f1b", "interleaved"})
              for (int v : {1, 2})
                for (int m : {1, 2, 3, 4})
                  for (const char* recompute : {"none", "block"}) {
                    train::TrainConfig c;
                    c.dp = world / (tp * pp);
                    c.tp = tp, c.pp = pp, c.zero = zero, c.sequence_parallel = sp;
                    c.schedule = schedule, c.virtual_stages = v, c.micro_batches = m, c.recompute = recompute;
                    std::string trainer;
                    try {
                      c.validate(world);
                    } catch (const Error& e) { trainer = e.what(); }
                    const predict::Workload w{nn::GPTConfig{65, c.seq_or_default(), c.layers_or_default(),
                                                            c.heads_or_default(), c.embd_or_default(), 0.0, true},
                                              c.batch};
                    const std::string predictor = predict::refusal(w, layout_of(c, world));
                    ++compared;
                    runnable += trainer.empty();
                    if (trainer.empty() != predictor.empty())
                      mismatches.push_back("world " + std::to_string(world) + ", " +
                                           predict::describe(layout_of(c, world)) + " schedule " + schedule +
                                           ": trainer " + (trainer.empty() ? "runs it" : "refuses (" + trainer + ")") +
                                           ", predictor " +
                                           (predictor.empty() ? "predicts it" : "refuses (" + predictor + ")"));
                  }
  std::string all;
  for (const std::string& m : mismatches) all += m + "\n";
  EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " of " << compared << " layouts disagree:\n" << all;
  EXPECT_GT(runnable, 100);  // the grid reaches layouts that run, not only refusals
}

// The same agreement beyond one synchronous group: local SGD and DiLoCo over R replicas of each grid (ZeRO 0-3,
// H 1 and 8, and --sync ddp with R > 1, which the trainer refuses), and a parameter server's S servers beside the
// workers in each mode and precision (tp, pp and ZeRO with it refused by both). Clipping is off on the parameter
// server's rows: the trainer refuses it over more than one server, and it is no part of a layout.
TEST(PredictLayouts, LocalSgdDiLoCoAndTheParameterServerToo) {
  int compared = 0, runnable = 0;
  std::vector<std::string> mismatches;
  auto compare = [&](const train::TrainConfig& c, int world) {
    const Answers a = answers(c, world);
    ++compared;
    runnable += a.trainer.empty();
    if (a.trainer.empty() != a.predictor.empty())
      mismatches.push_back("world " + std::to_string(world) + ", --sync " + c.sync + " R " +
                           std::to_string(c.replica_groups) + " --ps " + std::to_string(c.ps) + " " + c.ps_mode +
                           " tp " + std::to_string(c.tp) + " pp " + std::to_string(c.pp) + " zero " +
                           std::to_string(c.zero) + ": trainer " +
                           (a.trainer.empty() ? "runs it" : "refuses (" + a.trainer + ")") + ", predictor " +
                           (a.predictor.empty() ? "predicts it" : "refuses (" + a.predictor + ")"));
  };
  for (int world : {2, 4})
    for (const char* sync : {"ddp", "local-sgd", "diloco"})
      for (int r : {1, 2, 4})
        for (int h : {1, 8})
          for (int tp = 1; tp <= 2; ++tp)
            for (int pp = 1; pp <= 2; ++pp)
              for (int zero = 0; zero <= 3; ++zero) {
                if (world % (tp * pp * r) != 0) continue;  // no grid of this world: not a layout either could run
                train::TrainConfig c;
                c.sync = sync, c.replica_groups = r, c.sync_every = h;
                c.tp = tp, c.pp = pp, c.zero = zero;
                compare(c, world);
              }
  for (int world : {2, 3, 4})
    for (int servers : {1, 2})
      for (const char* mode : {"sync", "async", "ssp:1"})
        for (const char* amp : {"off", "bf16", "fp16"})
          for (int tp : {1, 2})
            for (int zero : {0, 1}) {
              train::TrainConfig c;
              c.ps = servers, c.ps_mode = mode, c.amp = amp, c.tp = tp, c.zero = zero, c.grad_clip = 0;
              compare(c, world);
            }
  std::string all;
  for (const std::string& m : mismatches) all += m + "\n";
  EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " of " << compared << " layouts disagree:\n" << all;
  EXPECT_GT(runnable, 40);
}

// And for a mixture of experts (a Llama's, every block or every other, with and without a capacity): each ep of
// each dp, with ZeRO 0-3, tp, pp and cp, which the trainer refuses with ep or with any MoE where not built.
TEST(PredictLayouts, MixtureOfExpertsAndExpertParallelismToo) {
  int compared = 0, runnable = 0;
  std::vector<std::string> mismatches;
  for (int world : {1, 2, 4})
    for (int experts : {0, 2, 4})
      for (int every : {1, 2})
        for (int ep : {1, 2, 4})
          for (int zero = 0; zero <= 3; ++zero)
            for (const auto& [tp, pp, cp] : {std::tuple{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}}) {
              if (world % (tp * pp * cp) != 0) continue;
              train::TrainConfig c;
              c.model = "llama";
              c.moe_experts = experts, c.moe_every = experts > 0 ? every : 1;
              c.ep = ep, c.zero = zero, c.tp = tp, c.pp = pp, c.cp = cp;
              if (experts > 0 && every == 2) c.moe_capacity = 1.25;
              const Answers a = answers(c, world);
              ++compared;
              runnable += a.trainer.empty();
              if (a.trainer.empty() != a.predictor.empty())
                mismatches.push_back("world " + std::to_string(world) + ", E " + std::to_string(experts) + " every " +
                                     std::to_string(every) + " ep " + std::to_string(ep) + " zero " +
                                     std::to_string(zero) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp) +
                                     " cp " + std::to_string(cp) + ": trainer " +
                                     (a.trainer.empty() ? "runs it" : "refuses (" + a.trainer + ")") + ", predictor " +
                                     (a.predictor.empty() ? "predicts it" : "refuses (" + a.predictor + ")"));
            }
  std::string all;
  for (const std::string& m : mismatches) all += m + "\n";
  EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " of " << compared << " layouts disagree:\n" << all;
  EXPECT_GT(runnable, 40);
}

}  // namespace
}  // namespace minidl
