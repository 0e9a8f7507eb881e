// The predictor and the trainer agree on what runs: for every layout train_gpt's flags can name on 1, 2 and 4 ranks
// (each grid, ZeRO 0-3, sequence parallelism, each schedule, virtual stages, micro-batches, recompute) on the baby
// model, TrainConfig::validate accepts it exactly when predict::refusal has no reason, so no layout the trainer
// runs lacks a prediction and the predictor refuses none it runs. A mismatch names the layout and both answers.
#include <gtest/gtest.h>

#include <string>
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
  return l;
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

}  // namespace
}  // namespace minidl
