// Flash attention forward and backward on the CPU, for the GPT configs the examples train.
//
//   build/bin/bench_attention [--reps N] [--threads 1,2] [--cold] [--json]
//
// Prints one row per (config, threads): median milliseconds of forward, backward and both, the fastest
// forward + backward seen (on a shared machine the median carries other processes' noise; the minimum is the
// kernel), and GFLOP/s of the medians counting the causal half of the tile products (see flops()). --json prints the
// same rows as JSON ({"provenance": bench/provenance.h, "rows": [...]}). --cold writes an array of 4x the last-level
// cache before each timed forward and backward, so their operands come from memory as in a training step, where the
// backward's Q, K, V and O were written by the forward long before (baby config, 2 threads, AMD EPYC family 25 model
// 17: a layer's backward 250 us warm, 370-400 us with --cold, 386-400 us inside the step; 330-420 and 300-316 since the
// backward reads each sequence's qkv block in order first).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cli.h"
#include "bench/provenance.h"
#include "bench/timing.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "ops/cpu/simd/isa.h"

using namespace minidl;

namespace {

struct Config {
  int64_t B, T, C;
  int H;
};

Tensor random(const Shape& shape, uint64_t seed) {
  Philox rng(seed);
  std::vector<float> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = rng.normal(i);
  return Tensor::from_vector(v, shape);
}

// Multiply-adds x 2 of the causal tile products: forward Q K^T and P V (2 products), backward Q K^T, P^T dO,
// dO V^T, dS K and dS^T Q (5 products), each B * H * (T^2 / 2) * D.
double flops(const Config& c, int products) { return 2.0 * products * c.B * c.C * (c.T * c.T / 2.0); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minidl flash attention benchmark (CPU)"};
  int reps = 50;
  std::vector<int> threads{1, 2};
  bool json = false, cold = false;
  app.add_option("--reps", reps, "timed repetitions per row (median reported)")->check(bench::kPositiveCount);
  app.add_option("--threads", threads, "thread counts to run, comma-separated")
      ->delimiter(',')
      ->check(bench::kPositiveCount);
  app.add_flag("--cold", cold,
               "before each timed forward and backward, write an array of 4x the last-level cache (bytes read from "
               "/sys or sysconf), so the operands come from memory as in a training step");
  app.add_flag("--json", json, "print a JSON object (provenance, rows) instead of the table");
  if (std::optional<int> code = bench::parse_flags(app, argc, argv, "bench_attention")) return *code;

  const Config configs[] = {{12, 64, 128, 4}, {8, 256, 384, 6}};
  nlohmann::json rows = nlohmann::json::array();
  const std::string cpu = ops::simd::host_cpu_and_kernels();
  // --cold: one write pass over an array larger than the caches (each element changed, so no pass is skipped), on
  // every thread, as a step's previous op would run: after a single-threaded pass of some milliseconds the idle
  // OpenMP threads had fallen asleep, and waking them was about half of what --cold added at 2 threads (baby
  // backward 0.51-0.57 ms against 0.37-0.40 so).
  std::vector<float> flood(cold ? size_t(bench::stream_array_bytes()) / sizeof(float) : 0);
  const auto evict = [&] {
    parallel_for(0, int64_t(flood.size()), int64_t(1) << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) flood[size_t(i)] += 1.0f;
    });
  };
  const nlohmann::json provenance = bench::provenance(argc, argv);
  if (!json) std::fputs(bench::provenance_header(provenance).c_str(), stdout);
  if (!json)
    std::printf("# cpu: %s; operands %s\n%4s %5s %5s %3s %4s %7s | %9s %9s %9s %9s | %8s %8s\n", cpu.c_str(),
                cold ? "cold (--cold)" : "warm", "B", "T", "C", "H", "D", "threads", "fwd(ms)", "bwd(ms)", "total(ms)",
                "best(ms)", "fwd GF/s", "bwd GF/s");
  for (const Config& c : configs) {
    Tensor qkv = random({c.B, c.T, 3 * c.C}, 1), dout = random({c.B, c.T, c.C}, 2);
    for (int th : threads) {
      set_num_threads(th);
      std::vector<double> fwd, bwd, total;
      for (int r = 0; r < reps + 3; ++r) {  // 3 warm-up runs fill the allocator cache
        evict();
        auto t0 = std::chrono::steady_clock::now();
        ops::AttentionForward f = ops::causal_attention_forward(qkv, c.H);
        auto t1 = std::chrono::steady_clock::now();
        evict();
        auto t2 = std::chrono::steady_clock::now();
        Tensor dqkv = ops::causal_attention_backward(dout, qkv, f.out, f.lse, c.H);
        auto t3 = std::chrono::steady_clock::now();
        if (r < 3) continue;
        fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        bwd.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
        total.push_back(fwd.back() + bwd.back());
      }
      double f = bench::median(fwd), b = bench::median(bwd), best = *std::min_element(total.begin(), total.end());
      if (json) {
        rows.push_back({{"B", c.B},
                        {"T", c.T},
                        {"C", c.C},
                        {"H", c.H},
                        {"threads", th},
                        {"fwd_ms", f},
                        {"bwd_ms", b},
                        {"total_ms", f + b},
                        {"best_total_ms", best},
                        {"cold", cold},
                        {"cpu", cpu}});
        continue;
      }
      std::printf("%4lld %5lld %5lld %3d %4lld %7d | %9.3f %9.3f %9.3f %9.3f | %8.1f %8.1f\n", (long long)c.B,
                  (long long)c.T, (long long)c.C, c.H, (long long)(c.C / c.H), th, f, b, f + b, best,
                  flops(c, 2) / f * 1e-6, flops(c, 5) / b * 1e-6);
    }
  }
  if (json) std::printf("%s\n", nlohmann::json{{"provenance", provenance}, {"rows", rows}}.dump(2).c_str());
}
