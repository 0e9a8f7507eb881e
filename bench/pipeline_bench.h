// bench_gpt_step --pp N (under mpirun -n N): times pipeline-parallel training steps of one model config on random
// tokens, with the schedule's simulated and measured bubble and the memory ledger's activation peak of every stage.
// Rank 0 prints; every rank takes part.
//
//   mpirun -n 2 build/bin/bench_gpt_step --pp 2 --micro-batches 4 --schedule 1f1b --threads 1
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/memory.h"
#include "core/rng.h"
#include "dist/init.h"
#include "dist/pipeline.h"
#include "dist/topology.h"
#include "bench/provenance.h"
#include "train/stage.h"
#include "train/step.h"

namespace minidl::bench {

struct PipelineBench {
  nn::GPTConfig model;
  int64_t batch = 12, steps = 20, warmup = 3;
  dist::PipelineSpec spec;
  train::StepOptions options;
  nn::Recompute recompute = nn::Recompute::kNone;
  bool json = false;
  nlohmann::json provenance;  // bench/provenance.h
};

inline int run_pipeline_bench(const dist::Context& ctx, const PipelineBench& b) {
  dist::Topology topo(ctx.world(), {1, 1, b.spec.stages}, "mpi");
  const int chunks = b.spec.chunks();
  MINIDL_CHECK(b.model.n_layer >= chunks, "--pp x --virtual-stages = ", chunks, " stages but --layers ",
               b.model.n_layer);
  MINIDL_CHECK(b.batch % b.spec.micro_batches == 0, "--batch ", b.batch, " does not split into --micro-batches ",
               b.spec.micro_batches);
  const int64_t C = b.model.n_embd, V = b.model.vocab_size;
  std::vector<int64_t> starts =
      dist::split_layers(b.model.n_layer, chunks, 12 * C * C + 13 * C, V * C + b.model.block_size * C, 2 * C + V * C);
  train::Stage pipe(b.model, 1337, b.spec, starts, topo);
  pipe.train();
  pipe.set_recompute(b.recompute);
  train::GradSync sync(pipe, topo);
  train::StepOptions o = b.options;
  o.grad_sync = &sync;
  optim::AdamW opt(optim::decay_groups(pipe.named_parameters(), 0.1), {1e-3});
  std::vector<int32_t> tokens(size_t(b.batch * b.model.block_size + 1) * 64);
  Philox rng(7);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(rng.draw(i).x % uint32_t(V));
  data::BatchSampler sampler(tokens, b.model.block_size, b.batch, 1);
  std::vector<double> ms;
  ledger(Device::cpu()).reset_peaks();
  for (int64_t s = 0; s < b.warmup + b.steps; ++s) {
    data::Batch batch = sampler.batch(s);
    topo.pp_group().barrier()->wait();  // every stage starts the step together
    auto t0 = std::chrono::steady_clock::now();
    train::train_step(pipe, opt, batch, o);
    double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= b.warmup) ms.push_back(train::max_over(topo.pp_group(), dt));  // the slowest stage's step
    if (s + 1 == b.warmup) pipe.reset_timing();
  }
  const double median = bench::median(ms), tokens_per_step = double(b.batch * b.model.block_size);
  const double flops = pipe.flops_per_token(b.model.block_size) * tokens_per_step / median / 1e6;
  std::vector<double> act(size_t(b.spec.stages), 0.0);
  act[size_t(pipe.rank())] = double(ledger(Device::cpu()).peak(MemTag::kActivations)) / double(1 << 20);
  for (double& a : act) a = train::sum_over(topo.pp_group(), a);
  const double bubble = dist::simulate(pipe.schedule()).bubble_fraction();
  // Measured: the stages' mean time blocked on a peer over their schedule time (train/stage.h).
  const train::Stage::Timing& t = pipe.timing();
  const double measured =
      train::sum_over(topo.pp_group(), t.schedule_ms > 0 ? t.wait_ms / t.schedule_ms : 0.0) / b.spec.stages;
  if (ctx.rank() != 0) return 0;
  std::fputs(provenance_header(b.provenance).c_str(), stdout);
  std::printf("%-40s %6s %10s %9s %9s %8s %8s  %s\n", "config", "ranks", "ms/step", "tokens/s", "GFLOP/s", "bubble",
              "measured", "act_MB per stage");
  char cfg[128];
  std::snprintf(cfg, sizeof cfg, "L%lld C%lld T%lld B%lld pp%d %s M%d V%d", (long long)b.model.n_layer, (long long)C,
                (long long)b.model.block_size, (long long)b.batch, b.spec.stages, dist::schedule_kind_name(b.spec.kind),
                b.spec.micro_batches, b.spec.virtual_stages);
  std::string acts;
  char num[32];
  for (double a : act) {
    std::snprintf(num, sizeof num, acts.empty() ? "%.2f" : " %.2f", a);
    acts += num;
  }
  std::printf("%-40s %6d %10.2f %9.0f %9.1f %7.1f%% %7.1f%%  %s\n", cfg, b.spec.stages, median,
              tokens_per_step / median * 1e3, flops, 100 * bubble, 100 * measured, acts.c_str());
  if (b.json) {
    std::string list;
    for (double a : act) {
      std::snprintf(num, sizeof num, list.empty() ? "%.4f" : ", %.4f", a);
      list += num;
    }
    std::printf(
        "{\"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, \"gflops\": %.2f, \"pp\": %d, \"schedule\": \"%s\", "
        "\"micro_batches\": %d, \"virtual_stages\": %d, \"bubble_simulated\": %.4f, \"bubble_measured\": %.4f, "
        "\"act_peak_mb_per_stage\": [%s], \"provenance\": %s}\n",
        median, tokens_per_step / median * 1e3, flops, b.spec.stages, dist::schedule_kind_name(b.spec.kind),
        b.spec.micro_batches, b.spec.virtual_stages, bubble, measured, list.c_str(), b.provenance.dump().c_str());
  }
  return 0;
}

}  // namespace minidl::bench
