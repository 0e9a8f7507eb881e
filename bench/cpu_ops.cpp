// Speed of the CPU ops' vector kernels, per op and per instruction set (ops/cpu/simd/isa.h), against the machine's
// own ceilings measured in the same run:
//   memory-bound ops: GB/s (bytes the op must read and write / median time) against the bandwidth of a parallel
//     copy that moves as many bytes (read + write), timed in turns with the op;
//   GEMM-shaped work (flash attention): GFLOP/s against single-threaded OpenBLAS sgemm at the tile's shape times
//     the number of threads.
//
//   build/bin/bench_cpu_ops [--numel N] [--rows R] [--reps 9] [--isa all|best|avx2|...] [--ops a,b] [--json]
//
// By default every array is 4x the last-level cache (STREAM's rule; 128 MB for a 32 MB L3: --numel 33554432,
// --rows 43712).
//
// With --isa all (the default) every ISA the CPU has is measured. OpenBLAS picks its kernels from the CPU (or
// OPENBLAS_CORETYPE) once per process, so the sgemm columns do not change with --isa.
#include <cblas.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "bench/provenance.h"
#include "bench/timing.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/cpu/simd/isa.h"
#include "ops/cpu/simd/simd.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/softmax.h"
#include "ops/unscale.h"

using namespace minidl;
namespace simd = minidl::ops::simd;

namespace {

Tensor random(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Philox rng(seed);
  std::vector<float> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * rng.normal(i);
  return Tensor::from_vector(v, shape);
}

// Median seconds of fn over reps runs, after one warm-up run.
double time_median(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(bench::seconds(fn));
  return bench::median(t);
}

// Median seconds of `fn` and of `reference` over reps runs of each, taken in turns after one warm-up run of each,
// so both medians come from the same stretch of time. The VM this is written on drifts between speeds over
// seconds (a copy of 64 MB read 28 GB/s in one run and 50 GB/s in the next, AMD EPYC family 25 model 17), and a
// ceiling measured once at the start compared each op with whichever speed the machine had then.
std::pair<double, double> time_median_beside(int reps, const std::function<void()>& fn,
                                             const std::function<void()>& reference) {
  fn();
  reference();
  std::vector<double> t, r;
  for (int i = 0; i < reps; ++i) {
    r.push_back(bench::seconds(reference));
    t.push_back(bench::seconds(fn));
  }
  return {bench::median(t), bench::median(r)};
}

// A memory-bound op: what it runs and how many bytes it must move.
struct MemoryOp {
  std::string name;
  double bytes;
  std::function<void()> run;
};

// Single-threaded sgemm GFLOP/s for C(M,N) = A(M,K) B(N,K)^T, the attention tiles' Q K^T shape.
double sgemm_gflops(int M, int N, int K, int reps) {
  std::vector<float> a(size_t(M) * K, 0.5f), b(size_t(N) * K, 0.25f), c(size_t(M) * N);
  double best = 0;
  openblas_set_num_threads(1);
  double s = time_median(reps, [&] {
    for (int i = 0; i < 32; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
  });
  best = 32 * 2.0 * M * N * K / s / 1e9;
  openblas_set_num_threads(num_threads());
  return best;
}

// The copy ceiling is STREAM's Copy kernel, a plain loop with ordinary stores (kept from being turned into a
// memmove call). glibc's memmove switches to non-temporal stores for copies this large, and those ran slower here:
// 29-36 GB/s against 33-37 for the loop (2 threads, 128 MB, AMD EPYC family 25 model 17), a ceiling some ops beat.
[[gnu::optimize("no-tree-loop-distribute-patterns")]] void plain_copy(const float* b, const float* e, float* d) {
  for (; b < e; ++b, ++d) *d = *b;
}

constexpr int64_t kWidth = 768, kVocab = 2048, kMlpWidth = 3072;  // the row ops' shapes

// Everything after the flags: the measurements and the table (or JSON).
int run(int64_t numel, int64_t rows, int reps, int threads, const std::string& isa_arg,
        const std::vector<std::string>& only, bool json, const nlohmann::json& provenance);

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minidl CPU op benchmark: GB/s against copy bandwidth, GFLOP/s against sgemm, per ISA"};
  const int64_t array_bytes = bench::stream_array_bytes();
  // Flat ops: arrays of array_bytes; row ops: rows of kWidth (the narrowest) that fill as much, in whole 64s.
  int64_t numel = array_bytes / 4, rows = (array_bytes / (4 * kWidth) + 63) / 64 * 64;
  int reps = 9, threads = default_num_threads();
  std::string isa_arg = "all";
  bool json = false;
  std::vector<std::string> only;
  app.add_option("--numel", numel,
                 "elements of the flat ops (AdamW, unscale, casts, gelu, dropout); default: 4x the last-level "
                 "cache in bytes, over 4 (STREAM's rule)")
      ->check(bench::kPositiveCount);
  app.add_option("--rows", rows,
                 "rows of the row ops (C = 768 layer norm, V = 2048 softmax/cross-entropy); default: as many "
                 "bytes of layer norm input as --numel's")
      ->check(bench::kPositiveCount);
  app.add_option("--reps", reps, "timed repetitions per op (median reported)")->check(bench::kPositiveCount);
  app.add_option("--threads", threads, "CPU threads")->check(bench::kPositiveCount);
  app.add_option("--isa", isa_arg, "all (every ISA this CPU has), best, avx512, avx2 or sse4");
  app.add_option("--ops", only,
                 "measure only these ops (comma-separated names as in the table's op column, e.g. "
                 "layernorm,cross_entropy,attention_fwd_bwd); default: all")
      ->delimiter(',');
  app.add_flag("--json", json, "print a JSON object (provenance, rows) instead of the table");
  if (std::optional<int> code = bench::parse_flags(app, argc, argv, "bench_cpu_ops")) return *code;
  set_num_threads(threads);
  try {
    return run(numel, rows, reps, threads, isa_arg, only, json, bench::provenance(argc, argv));
  } catch (const std::exception& e) {  // minidl's Error (out of CPU memory among them) and std::bad_alloc
    std::fprintf(stderr,
                 "bench_cpu_ops: %s (arrays of --numel %lld floats and --rows %lld; smaller ones need less "
                 "memory)\n",
                 e.what(), (long long)numel, (long long)rows);
    return 1;
  }
}

namespace {

int run(int64_t numel, int64_t rows, int reps, int threads, const std::string& isa_arg,
        const std::vector<std::string>& only, bool json, const nlohmann::json& provenance) {
  const int64_t C = kWidth, V = kVocab, F = kMlpWidth;
  std::vector<simd::CpuIsa> isas;
  if (isa_arg == "all") {
    isas = simd::supported_isas();
  } else {
    try {
      simd::set_isa(isa_arg);
    } catch (const Error& e) {  // an unknown name, or an ISA this CPU lacks: the message names the ones it has
      std::fprintf(stderr, "bench_cpu_ops: --isa %s: %s\n", isa_arg.c_str(), e.what());
      return 2;
    }
    isas = {simd::current_isa()};
  }

  // Copy bandwidth: a parallel copy, read + write bytes. Once here of the flat ops' size, for the header and the exp
  // bound; and beside every op a copy that moves as many bytes as the op, timed in turns with it, for its %copy. The
  // same footprint matters where the caches are large: the row ops' inputs (12-32 MB) and part of a 64 MB copy
  // stay in a 32 MB L3, and a fixed-size copy read 45-82 GB/s depending on which op it ran beside.
  const int64_t n = numel;
  const int64_t copy_max = 4 * n;  // floats: AdamW moves the most, 7 arrays of n = 3.5 n floats read + 3.5 n written
  Tensor src = random({copy_max}, 1), dst = Tensor::empty({copy_max});
  const float* ps = src.data<float>();
  float* pd = dst.data<float>();
  const auto copy_of = [&](double bytes) {  // a copy that reads bytes / 2 and writes bytes / 2
    const int64_t count = std::min(copy_max, int64_t(bytes / 8));
    return std::function<void()>(
        [=] { parallel_for(0, count, 1 << 16, [&](int64_t b, int64_t e) { plain_copy(ps + b, ps + e, pd + b); }); });
  };
  const double copy_gbs = 8.0 * n / time_median(reps, copy_of(8.0 * n)) / 1e9;
  // The exp's own rate: exp_sub_sum over one L1-resident row (no memory traffic), on every thread, summing only
  // (cross-entropy's forward, which skips the NaN lanes and the tiny results) or also storing each exp (softmax's).
  // A CPU whose vector units are narrow (Zen 1 splits 256-bit AVX2 into two 128-bit halves) can make the exp-heavy
  // ops compute-bound: cross-entropy's forward reads 4 bytes per exp, so it cannot beat 4 bytes x this rate.
  const auto exp_rate = [&](bool store) {  // exps per second, all threads
    const int64_t row = 2048, rounds = 512;
    std::vector<float> xs(size_t(row * num_threads())), ys(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = -float(i % 97) * 0.1f;
    const double s = time_median(reps, [&] {
      parallel_for(0, num_threads(), 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int r = 0; r < rounds; ++r)
            (void)simd::exp_sub_sum(xs.data() + t * row, 0.0f, store ? ys.data() + t * row : nullptr, row);
      });
    });
    return double(row * rounds * num_threads()) / s;
  };

  Tensor x = random({n}, 2), dy = random({n}, 3), g = random({n}, 4), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  Tensor x16 = ops::cast(x, DType::bf16), xh = ops::cast(x, DType::f16);
  Tensor hx = random({n / F, F}, 5), hdy = random({n / F, F}, 6), hb = random({F}, 7);
  Tensor lx = random({rows, C}, 8), lw = random({C}, 9), lb = random({C}, 10), ldy = random({rows, C}, 11);
  ops::LayerNormForward lf = ops::layernorm_forward(lx, lw, lb, 1e-5);
  Tensor sx = random({rows, V}, 12, 3.0f), sdy = random({rows, V}, 13);
  Tensor sy = ops::softmax_forward(sx);
  std::vector<int64_t> tv(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) tv[size_t(r)] = (r * 7919) % V;
  Tensor targets = Tensor::from_vector(tv, {rows});
  ops::CrossEntropyForward cf = ops::cross_entropy_forward(sx, targets, -1);
  ops::AdamWHyper hyper{3e-4, 0.9, 0.95, 1e-8, 0.1, 1};
  const double f4 = 4.0, hn = double(hx.numel()), ln = double(rows * C), sn = double(rows * V);
  std::vector<MemoryOp> mem_ops = {
      {"gelu", 8.0 * n, [&] { ops::gelu_forward(x); }},
      {"gelu_backward", 12.0 * n, [&] { ops::gelu_backward(dy, x); }},
      {"bias_gelu", 2 * f4 * hn, [&] { ops::bias_gelu_forward(hx, hb); }},
      {"bias_gelu_backward", 3 * f4 * hn, [&] { ops::bias_gelu_backward(hdy, hx, hb); }},
      {"layernorm", 2 * f4 * ln, [&] { ops::layernorm_forward(lx, lw, lb, 1e-5); }},
      {"layernorm_backward", 3 * f4 * ln, [&] { ops::layernorm_backward(ldy, lx, lw, lf.mean, lf.rstd); }},
      {"softmax", 2 * f4 * sn, [&] { ops::softmax_forward(sx); }},
      {"softmax_backward", 3 * f4 * sn, [&] { ops::softmax_backward(sdy, sy); }},
      {"cross_entropy", f4 * sn, [&] { ops::cross_entropy_forward(sx, targets, -1); }},
      {"cross_entropy_backward", 2 * f4 * sn,
       [&] { ops::cross_entropy_backward(Tensor::scalar(1.0), sx, targets, cf.lse, rows, -1); }},
      {"adamw", 7 * f4 * n, [&] { ops::fused_adamw_(x, g, m, v, hyper); }},
      {"unscale", 2 * f4 * n, [&] { ops::unscale_and_check_(g, 1.0f); }},
      {"dropout", 8.0 * n, [&] { ops::dropout(x, 0.1, 1337, 3, 0); }},
      {"cast_f32_bf16", 6.0 * n, [&] { ops::cast(x, DType::bf16); }},
      {"cast_bf16_f32", 6.0 * n, [&] { ops::cast(x16, DType::f32); }},
      {"cast_f32_f16", 6.0 * n, [&] { ops::cast(x, DType::f16); }},
      {"cast_f16_f32", 6.0 * n, [&] { ops::cast(xh, DType::f32); }},
  };

  const auto wanted = [&](const std::string& name) {
    return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
  };
  for (const std::string& name : only) {
    const bool known = name == "attention_fwd_bwd" ||
                       std::any_of(mem_ops.begin(), mem_ops.end(), [&](const MemoryOp& op) { return op.name == name; });
    if (!known) {
      std::string names;
      for (const MemoryOp& op : mem_ops) names += op.name + ", ";
      std::fprintf(stderr, "bench_cpu_ops: --ops: unknown op '%s'; expected some of: %sattention_fwd_bwd\n",
                   name.c_str(), names.c_str());
      return 2;
    }
  }

  // Attention (B=8, T=256, H=6, D=64), forward + backward: GEMM-shaped tiles of 64 x 64 x D.
  const int64_t B = 8, T = 256, H = 6, D = 64;
  Tensor qkv = random({B, T, 3 * H * D}, 14, 0.5f), dout = random({B, T, H * D}, 15);
  const double attn_flops = 2.0 * 7 * B * H * D * (T * T / 2.0);  // 7 causal tile products (bench/attention.cpp)
  const double sgemm_ceiling = sgemm_gflops(64, 64, int(D), reps) * threads;

  nlohmann::json out = nlohmann::json::array();
  const std::string cpu = simd::host_cpu_name();
  if (!json) std::fputs(bench::provenance_header(provenance).c_str(), stdout);
  if (!json)
    std::printf(
        "# copy bandwidth %.1f GB/s at the start (%lld floats, %d threads; each op's %%copy is "
        "against a copy of its own bytes timed in turns with it, copy_GB/s); attention ceiling: sgemm "
        "64x64x%lld x %d threads = %.1f GFLOP/s\n%-8s %-24s %10s %10s %11s %8s\n",
        copy_gbs, (long long)n, threads, (long long)D, threads, sgemm_ceiling, "isa", "op", "time_ms", "GB/s",
        "copy_GB/s", "%copy");
  for (simd::CpuIsa isa : isas) {
    simd::IsaGuard guard(isa);
    const double exps = exp_rate(false), stored = exp_rate(true);
    out.push_back({{"isa", simd::isa_name(isa)},
                   {"op", "exp_rate"},
                   {"cpu", cpu},
                   {"exps_per_s", exps},
                   {"stored_exps_per_s", stored},
                   {"cross_entropy_bound_GB/s", 4.0 * exps / 1e9},
                   {"softmax_bound_GB/s", 8.0 * stored / 1e9}});
    if (!json)
      std::printf(
          "# %s exp: %.2f G/s summed, %.2f G/s stored, on %d threads from L1, so cross_entropy (4 bytes per "
          "summed exp) <= %.1f GB/s = %.0f%% of the copy at the start, softmax (8 per stored) <= %.1f GB/s "
          "= %.0f%%\n",
          simd::isa_name(isa), exps / 1e9, stored / 1e9, threads, 4.0 * exps / 1e9, 100 * 4.0 * exps / 1e9 / copy_gbs,
          8.0 * stored / 1e9, 100 * 8.0 * stored / 1e9 / copy_gbs);
    for (const MemoryOp& op : mem_ops) {
      if (!wanted(op.name)) continue;
      const auto [s, copy_s] = time_median_beside(reps, op.run, copy_of(op.bytes));
      const double gbs = op.bytes / s / 1e9, beside_gbs = op.bytes / copy_s / 1e9;
      out.push_back({{"isa", simd::isa_name(isa)},
                     {"op", op.name},
                     {"time_ms", s * 1e3},
                     {"GB/s", gbs},
                     {"copy_GB/s", beside_gbs},
                     {"fraction_of_copy", gbs / beside_gbs}});
      if (!json)
        std::printf("%-8s %-24s %10.3f %10.1f %11.1f %7.0f%%\n", simd::isa_name(isa), op.name.c_str(), s * 1e3, gbs,
                    beside_gbs, 100 * gbs / beside_gbs);
    }
    if (!wanted("attention_fwd_bwd")) continue;
    double s = time_median(reps, [&] {
      ops::AttentionForward f = ops::causal_attention_forward(qkv, int(H));
      ops::causal_attention_backward(dout, qkv, f.out, f.lse, int(H));
    });
    double gflops = attn_flops / s / 1e9;
    out.push_back({{"isa", simd::isa_name(isa)},
                   {"op", "attention_fwd_bwd"},
                   {"time_ms", s * 1e3},
                   {"GFLOP/s", gflops},
                   {"sgemm_GFLOP/s", sgemm_ceiling},
                   {"fraction_of_sgemm", gflops / sgemm_ceiling}});
    if (!json)
      std::printf("%-8s %-24s %10.3f %10.1f %7.0f%%  (GFLOP/s, %% of sgemm)\n", simd::isa_name(isa),
                  "attention_fwd_bwd", s * 1e3, gflops, 100 * gflops / sgemm_ceiling);
  }
  if (json) std::printf("%s\n", nlohmann::json{{"provenance", provenance}, {"rows", out}}.dump(2).c_str());
  return 0;
}

}  // namespace
