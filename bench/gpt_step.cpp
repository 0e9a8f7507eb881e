// bench_gpt_step — times full GPT training steps (forward, backward, AdamW, zero_grad) for one model config on
// random tokens and prints ms/step, tokens/s, achieved GFLOP/s and memory; --json adds one JSON object as the
// last line (read by bench/compare_pytorch.py).
//
//   build/bin/bench_gpt_step --layers 6 --heads 6 --embd 384 --seq 256 --batch 8 --threads 2
//   build/bin/bench_gpt_step --model llama --kv-heads 2 --ffn 344                  # Llama (nn/llama.h), GQA
//   build/bin/bench_gpt_step ... --recompute block --amp bf16 --grad-accum 2   # memory-saving modes
//   mpirun -n 2 build/bin/bench_gpt_step ... --tp 2 --sequence-parallel         # tensor parallel (rank 0 prints)
//   mpirun -n 2 build/bin/bench_gpt_step --pp 2 --micro-batches 4 --schedule 1f1b   # pipeline (bench/pipeline_bench.h)
//
// act_MB is the activation peak from the memory ledger (what checkpointing and 16-bit activations reduce). On the
// CPU, ceiling is the sgemm ceiling at the step's own linear-layer shapes (ops/sgemm_ceiling.h), measured in
// rounds between groups of --ceiling-every steps (the median round; for --model llama still GPT-2's linear-layer
// shapes at the same width, which is all ops::GptShape describes), and %ceil the median over steps of each
// step's GFLOP/s against the rounds around it. The line after the table splits the timed steps' core time (ms
// times threads) into the BLAS calls of the linear layers (ops::blas_count: their thread time, and their rate per
// core beside the ceiling's) and the rest (attention, the elementwise ops, the optimizer, the threads' waits):
// the two ways a step falls short of the ceiling. With --device cuda it also prints the CUDA backend's counters
// per timed step (cuda::counters()): kernel launches, host synchronisations, bytes copied each way and cudaMalloc
// calls, the bench's own synchronize excluded.
//
// Data parallelism (weak scaling: --batch sequences on every rank), DDP or ZeRO over all ranks:
//   mpirun -n 2 --bind-to none build/bin/bench_gpt_step ... --threads 1 --zero 2   # --zero 0 is DDP
//   mpirun -n 4 --bind-to none build/bin/bench_gpt_step ... --threads 1 --tp 2 --zero 1   # dp 2 x tp 2
// Rank 0 prints its own ms/step, tokens/s and GFLOP/s (every step ends in collectives, so its times are the job's).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <vector>

#include <optional>
#include <string>

#include "bench/pipeline_bench.h"
#include "bench/provenance.h"
#include "ops/sgemm_ceiling.h"
#include "bench/timing.h"
#include "core/device_backend.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "dist/init.h"
#include "dist/tensor_parallel.h"
#include "dist/topology.h"
#include "train/cuda_graph.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/step.h"
#include "train/parallel_model.h"
#include "ops/cpu/simd/isa.h"
#include "ops/matmul.h"
#if defined(MINIDL_HAVE_CUDA_BACKEND)
#include "core/cuda/cuda.h"
#endif

using namespace minidl;

namespace {

// Sums the CUDA backend's counters over the timed steps (nothing in a build without a CUDA backend).
struct StepCounters {
#if defined(MINIDL_HAVE_CUDA_BACKEND)
  cuda::Counters before, total;
  void begin() { before = cuda::counters(); }
  void end() {
    const cuda::Counters d = cuda::counters() - before;
    total = cuda::Counters{total.kernel_launches + d.kernel_launches,
                           total.memsets + d.memsets,
                           total.host_syncs + d.host_syncs,
                           total.h2d_copies + d.h2d_copies,
                           total.h2d_bytes + d.h2d_bytes,
                           total.d2h_copies + d.d2h_copies,
                           total.d2h_bytes + d.d2h_bytes,
                           total.d2d_copies + d.d2d_copies,
                           total.d2d_bytes + d.d2d_bytes,
                           total.device_mallocs + d.device_mallocs,
                           total.device_frees + d.device_frees,
                           total.graph_launches + d.graph_launches};
  }
  void print(int64_t steps) const {
    const double n = double(steps);
    const cuda::Counters& t = total;
    std::printf(
        "per step: launches %.1f memsets %.1f syncs %.1f h2d %.1f (%.0f B) d2h %.1f (%.0f B) "
        "d2d %.1f (%.0f B) cudaMalloc %.1f graph launches %.1f\n",
        t.kernel_launches / n, t.memsets / n, t.host_syncs / n, t.h2d_copies / n, t.h2d_bytes / n, t.d2h_copies / n,
        t.d2h_bytes / n, t.d2d_copies / n, t.d2d_bytes / n, t.device_mallocs / n, t.graph_launches / n);
  }
  // Fields for the --json object: ", \"launches_per_step\": ..." (empty without a CUDA backend).
  std::string json_fields(int64_t steps) const {
    const double n = double(steps);
    char text[256];
    std::snprintf(text, sizeof text,
                  ", \"launches_per_step\": %.1f, \"syncs_per_step\": %.1f, \"h2d_bytes_per_step\": %.0f, "
                  "\"d2h_bytes_per_step\": %.0f, \"mallocs_per_step\": %.1f",
                  total.kernel_launches / n, total.host_syncs / n, total.h2d_bytes / n, total.d2h_bytes / n,
                  total.device_mallocs / n);
    return text;
  }
#else
  void begin() {}
  void end() {}
  void print(int64_t) const {}
  std::string json_fields(int64_t) const { return {}; }
#endif
};

}  // namespace

int main(int argc, char** argv) {
  dist::Context ctx = dist::init(argc, argv);  // a plain process is a world of one
  const bool speaks = ctx.rank() == 0;
  int64_t layers = 4, heads = 4, embd = 128, seq = 64, batch = 12, vocab = 65, steps = 20, warmup = 3;
  int64_t ceiling_every = 5;
  std::string model_name = "gpt2";
  int64_t kv_heads = 0, ffn = 0;  // Llama only; 0: --heads, 4 x --embd
  int threads = 0;
  int64_t grad_accum = 1;
  std::string recompute = "none", amp = "off";
  bool json = false, tf32 = false, cuda_graph = false, same_batch = false;
  std::string json_out;
  std::string device_flag = "cpu";
  double peak_tflops = 0;
  int tp = 1;
  bool sequence_parallel = false;
  int pp = 1, micro_batches = 0, virtual_stages = 1;
  std::string schedule = "1f1b";
  int zero = 0;
  std::string backend = "mpi";
  std::string cpu_gemm = "auto";
  CLI::App app{"Time GPT training steps with minidl (median over --steps after --warmup steps)."};
  app.add_option("--model", model_name,
                 "Architecture: gpt2 or llama (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases; "
                 "nn/llama.h)")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "Llama: key/value heads, a divisor of --heads [default: --heads]");
  app.add_option("--ffn", ffn, "Llama: the SwiGLU MLP's hidden width [default: 4 x --embd]");
  app.add_option("--layers", layers, "Transformer blocks")->capture_default_str();
  app.add_option("--heads", heads, "Attention heads")->capture_default_str();
  app.add_option("--embd", embd, "Embedding width")->capture_default_str();
  app.add_option("--seq", seq, "Sequence length")->capture_default_str();
  app.add_option("--batch", batch, "Sequences per step (per rank under mpirun)")->capture_default_str();
  app.add_option("--vocab", vocab, "Vocabulary size")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads; default: all cores");
  app.add_option("--steps", steps, "Timed steps")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed steps first")->capture_default_str();
  app.add_option("--ceiling-every", ceiling_every,
                 "On the CPU (f32, one process): time a round of the sgemm "
                 "ceiling's products before the first timed step and after every this many, and compare each step "
                 "with the rounds around it (ops/sgemm_ceiling.h)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->capture_default_str();
  app.add_option("--recompute", recompute, "Activation checkpointing: none, attn, mlp or block")->capture_default_str();
  app.add_option("--amp", amp, "Mixed precision: off, bf16 or fp16 (fp16 with dynamic loss scaling)")
      ->capture_default_str();
  app.add_option("--grad-accum", grad_accum, "Micro-batches per step")->capture_default_str();
  app.add_option("--device", device_flag, "cpu, cuda or cuda:N (the emulated CUDA in a MINIDL_CUDA_EMULATION build)")
      ->capture_default_str();
  app.add_option("--cpu-gemm", cpu_gemm,
                 "f32 matrix products on the CPU: auto (minidl's own kernel under AVX2 and "
                 "AVX-512, OpenBLAS under SSE4), openblas or minidl (ops/matmul.h)")
      ->check(CLI::IsMember({"auto", "openblas", "minidl"}))
      ->capture_default_str();
  app.add_flag("--tf32", tf32, "f32 matrix products on TF32 tensor cores (GPU)");
  app.add_flag("--cuda-graph", cuda_graph,
               "With --device cuda, one process: capture a step as a CUDA graph and "
               "replay it (train/cuda_graph.h; the capture is the 3rd step, so keep --warmup >= 3)");
  app.add_option("--peak-tflops", peak_tflops,
                 "The GPU's dense peak TFLOP/s for MFU; default: from a table of NVIDIA GPUs by name");
  app.add_option("--tp", tp,
                 "Tensor-parallel ranks; must divide --heads and the number of ranks (mpirun -n N: "
                 "N / tp data-parallel groups, with --zero)")
      ->capture_default_str();
  app.add_flag("--sequence-parallel", sequence_parallel, "With --tp: sequence parallelism");
  app.add_option("--zero", zero,
                 "Under mpirun: 0 (DDP), or ZeRO stage 1, 2 or 3 over the data-parallel ranks (all "
                 "ranks / --tp); at one rank, 1-3 run the stage's code path with one shard")
      ->capture_default_str();
  app.add_option("--backend", backend,
                 "Under mpirun: the collectives' backend, mpi or ring (CPU); with --device "
                 "cuda, mpi means nccl (ring: the device ring)")
      ->capture_default_str();
  app.add_flag("--json", json, "Also print one JSON object as the last line");
  app.add_option("--json-out", json_out,
                 "Also write that JSON object to this file (whole, then renamed into place: a script reads it "
                 "without parsing the program's output)");
  app.add_flag("--same-batch", same_batch,
               "Train on one batch, repeated every step: the loss must fall (the "
               "loss line gives the first and the last timed step's)");
  app.add_option("--pp", pp, "Pipeline stages (run under mpirun -n PP; CPU, f32/bf16)")->capture_default_str();
  app.add_option("--micro-batches", micro_batches, "With --pp: micro-batches per step (default: --pp)");
  app.add_option("--schedule", schedule, "With --pp: gpipe, 1f1b or interleaved")->capture_default_str();
  app.add_option("--virtual-stages", virtual_stages, "With --schedule interleaved: chunks per rank")
      ->capture_default_str();
  // Flag errors are the same on every rank: each returns 2 and MPI finalises normally.
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) { return speaks ? app.exit(e) : 0; } catch (const CLI::ParseError& e) {
    if (speaks) std::fprintf(stderr, "bench_gpt_step: error: %s (see --help)\n", e.what());
    return 2;
  }
  // train_gpt's model for the same flags (train/config.cpp, model_config): GPT-2 with biases, or Llama without.
  nn::GPTConfig model_cfg{vocab, seq, layers, heads, embd, 0.0, true};
  if (model_name == "llama") {
    model_cfg.arch = nn::GPTConfig::Arch::kLlama;
    model_cfg.bias = false;
    model_cfg.n_kv_head = kv_heads;
    model_cfg.intermediate_size = ffn;
  }
  try {
    MINIDL_CHECK(model_name == "llama" || (kv_heads == 0 && ffn == 0), "--kv-heads and --ffn need --model llama");
    if (pp > 1) {
      MINIDL_CHECK(device_flag == "cpu" && amp != "fp16", "--pp: the pipeline bench runs on the CPU in f32 or bf16");
      MINIDL_CHECK(ctx.world_size() == pp, "--pp ", pp, " needs mpirun -n ", pp, ", got ", ctx.world_size(),
                   " rank(s)");
      set_num_threads(threads > 0 ? threads : ctx.threads_per_rank());
      bench::PipelineBench b;
      b.model = model_cfg;
      b.batch = batch;
      b.steps = steps;
      b.warmup = warmup;
      b.spec = {dist::parse_schedule_kind(schedule), pp, micro_batches > 0 ? micro_batches : pp, virtual_stages};
      b.options.amp = amp == "bf16" ? DType::bf16 : DType::f32;
      b.recompute = nn::parse_recompute(recompute);
      b.json = json;
      b.provenance = bench::provenance(argc, argv);
      return bench::run_pipeline_bench(ctx, b);
    }
    MINIDL_CHECK(tp >= 1 && ctx.world_size() % tp == 0, "--tp ", tp,
                 " must divide the number of ranks (mpirun -n), "
                 "got ",
                 ctx.world_size());
    MINIDL_CHECK(heads % tp == 0, "--tp ", tp, " must divide --heads ", heads);
    MINIDL_CHECK(zero >= 0 && zero <= 3, "--zero: expected 0, 1, 2 or 3, got ", zero);
    MINIDL_CHECK(steps >= 1 && warmup >= 0, "--steps must be >= 1 and --warmup >= 0, got ", steps, " and ", warmup);
    set_num_threads(threads > 0 ? threads : default_num_threads());
    MINIDL_CHECK(amp == "off" || amp == "bf16" || amp == "fp16", "--amp: expected off, bf16 or fp16, got '", amp, "'");
    const Device device = train::select_device(device_flag);
    ops::set_allow_tf32(tf32);
    ops::set_cpu_gemm(cpu_gemm == "openblas" ? ops::CpuGemm::kOpenBlas
                      : cpu_gemm == "minidl" ? ops::CpuGemm::kMinidl
                                             : ops::CpuGemm::kAuto);
    // The ranks form dp = N / tp groups of tp ranks: every rank of a tp group runs the same batch, and each dp rank
    // trains its own `batch` sequences (weak scaling) under DDP or ZeRO (train/parallel_model.h picks the model and
    // composes the gradient synchronisation, as train_gpt does).
    const int world = ctx.world_size() / tp;
    train::TrainConfig tc;
    tc.model = model_name;
    tc.layers = layers;
    tc.heads = heads;
    tc.embd = embd;
    tc.seq = seq;
    tc.batch = batch * world;
    tc.dp = world;
    tc.tp = tp;
    tc.zero = zero;
    tc.sequence_parallel = sequence_parallel;
    tc.micro_batches = grad_accum;
    tc.recompute = recompute;
    tc.seed = 1337;
    // "mpi" serves CPU tensors only: a device run (one process included) takes "nccl" unless --backend ring.
    const dist::Topology topo(ctx.world(), dist::Grid{world, tp, 1},
                              !device.is_cpu() && (tp > 1 || backend == "mpi") ? std::string("nccl") : backend, device);
    const int data_rank = topo.coord().dp;
    train::ParallelModel built = train::build_model_and_sync(tc, model_cfg, topo, device, data_rank * batch, {});
    train::Stage& stage = *built.stage;
    nn::GPT& model = stage.chunk(0);
    std::unique_ptr<train::GradSync> sync = std::move(built.sync);
    std::optional<optim::GradScaler> scaler;
    train::StepOptions options;
    options.amp = amp == "bf16" ? DType::bf16 : amp == "fp16" ? DType::f16 : DType::f32;
    if (amp == "fp16") options.scaler = &scaler.emplace();
    options.grad_sync = sync.get();
    options.read_back = false;  // a timed step reads nothing back (the loop synchronises the device itself)
    optim::AdamW opt(sync->optimizer_groups(optim::decay_groups(model.named_parameters(), 0.1)), {1e-3});
    std::vector<int32_t> tokens(size_t(batch * world * seq + 1) * 64);
    Philox rng(7);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(rng.draw(i).x % uint32_t(vocab));
    data::BatchSampler sampler(tokens, seq, batch * world, 1);
    // On a device the batch is drawn there (no upload); it must outlive the graph that replays its kernel.
    std::optional<data::DeviceBatchSampler> device_batches;
    if (device.is_cuda()) device_batches.emplace(train::device_sampler(model, tokens, seq, batch * world, 1));
    std::unique_ptr<train::CudaGraphStep> graph;  // --cuda-graph
    if (cuda_graph) {
      MINIDL_CHECK(ctx.world_size() == 1 && tp == 1 && zero == 0,
                   "--cuda-graph: expected one process without "
                   "--tp or --zero");
      train::StepOptions captured = options;
      captured.grad_sync = &train::GradSync::one_process();  // nothing to synchronise
      graph = std::make_unique<train::CudaGraphStep>(model, opt, captured);
    }

    // The sgemm ceiling, measured between groups of --ceiling-every steps (ops/sgemm_ceiling.h). Not under
    // mpirun: the other ranks would share the cores with the measurement.
    std::optional<ops::SgemmCeiling> ceiling_products;
    if (device.is_cpu() && options.amp == DType::f32 && ctx.world_size() == 1)
      ceiling_products.emplace(ops::GptShape{layers, embd, vocab, batch * seq});
    std::vector<double> rounds;  // GFLOP/s; round g comes before timed step g * ceiling_every

    std::vector<double> ms;
    double loss_first = 0, loss_last = 0;  // of the first and the last timed step, read after their timing
    StepCounters counted;
    ledger(device).reset_peaks();
    for (int64_t s = 0; s < warmup + steps; ++s) {
      if (ceiling_products && s >= warmup && (s - warmup) % ceiling_every == 0)
        rounds.push_back(ceiling_products->measure(num_threads()));  // its own cblas calls: not counted
      if (ceiling_products && s == warmup) ops::count_blas(true);
      const int64_t batch_step = same_batch ? 0 : s;
      data::Batch b;  // this rank's slice of the global batch
      if (!device_batches) b = sampler.batch(batch_step, data_rank * batch, batch);
      auto t0 = std::chrono::steady_clock::now();
      if (s >= warmup) counted.begin();
      dist::reset_tensor_parallel_traffic();
      train::StepResult r;
      if (device_batches && graph)
        r = graph->step(*device_batches, batch_step, data_rank * batch, batch, 1e-3);
      else if (device_batches) {
        train::StepOptions o = options;
        r = train::train_step(stage, opt, train::draw_checked(*device_batches, batch_step, data_rank * batch, batch, o),
                              o);
      } else if (graph)
        r = graph->step(b, 1e-3);
      else
        r = train::train_step(stage, opt, b, options);
      if (s >= warmup) counted.end();
      if (device.is_cuda()) device_backend(device, "synchronize").synchronize(device.index);  // the step's GPU work
      double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) ms.push_back(dt);
      if (s == warmup || s == warmup + steps - 1) {
        r.read();
        if (s == warmup) loss_first = r.loss;
        if (s == warmup + steps - 1) loss_last = r.loss;
      }
    }
    const ops::BlasCount blas = ops::blas_count();
    ops::count_blas(false);
    if (ceiling_products) rounds.push_back(ceiling_products->measure(num_threads()));  // after the last group
    if (!speaks) return 0;
    double tokens_per_step = double(batch * seq);
    const double mflop_per_step = stage.flops_per_token(seq) * tokens_per_step / 1e6;
    // %ceil: each step's GFLOP/s over the mean of the two rounds around its group, then the median over steps.
    std::vector<double> pct;
    for (size_t i = 0; i < ms.size() && !rounds.empty(); ++i) {
      const size_t g = i / size_t(ceiling_every);
      const double around = (rounds[g] + rounds[std::min(g + 1, rounds.size() - 1)]) / 2;
      pct.push_back(100 * mflop_per_step / ms[i] / around);
    }
    const double median = bench::median(ms), ceiling = bench::median(rounds), pct_ceiling = bench::median(pct);
    double gflops = mflop_per_step / median;
    const MemoryLedger& l = ledger(device);
    auto mb = [](int64_t b) { return double(b) / (1 << 20); };
    // On the CPU the device line names the host's CPU and the kernels' instruction set, so a pasted table says
    // which machine it came from.
    const std::string name = device.is_cpu()
                                 ? "cpu (" + ops::simd::host_cpu_and_kernels() + ", gemm " +
                                       (ops::cpu_gemm() == ops::CpuGemm::kMinidl ? "minidl" : "openblas") + ")"
                                 : train::device_name(device);
    // MFU: the model's FLOPs per second over the GPU's dense peak for the dtype its products run in.
    if (device.is_cuda() && peak_tflops <= 0) peak_tflops = train::gpu_peak_tflops(name, options.amp, tf32);
    const double mfu = peak_tflops > 0 ? gflops / (peak_tflops * 1e3) : 0.0;
    if (ctx.world_size() > 1 || zero > 0)
      std::printf("ranks: %d (dp %d x tp %d), %s over %s\n", ctx.world_size(), world, tp, sync->name().c_str(),
                  topo.backend().c_str());
    const nlohmann::json provenance = bench::provenance(argc, argv);
    std::fputs(bench::provenance_header(provenance).c_str(), stdout);
    std::printf(
        "device: %s%s\n", name.c_str(),
        device.is_cuda() && peak_tflops > 0 ? (" (peak " + std::to_string(peak_tflops) + " TFLOP/s)").c_str() : "");
    const double peak_rss = train::peak_rss_mb();
    std::printf("%-40s %8s %10s %9s %9s %10s %10s %7s %9s %6s\n", "config", "threads", "ms/step", "tokens/s", "GFLOP/s",
                "peak_MB", "act_MB", "MFU", "ceiling", "%ceil");
    char cfg[128];
    // A Llama row says so, with its key/value heads and MLP width (GPT-2's row is as it always was).
    const std::string llama_cfg = model_cfg.llama() ? "llama KV" + std::to_string(model_cfg.kv_heads()) + " I" +
                                                          std::to_string(model_cfg.mlp_width()) + " "
                                                    : "";
    std::snprintf(cfg, sizeof cfg, "%sL%lld H%lld C%lld T%lld B%lld %s %s%s%s", llama_cfg.c_str(), (long long)layers,
                  (long long)heads, (long long)embd, (long long)seq, (long long)batch, amp.c_str(), recompute.c_str(),
                  tp > 1 ? (" tp" + std::to_string(tp)).c_str() : "", sequence_parallel ? " sp" : "");
    std::string mfu_text = mfu > 0 ? std::to_string(mfu * 100).substr(0, 5) + "%" : "-";
    std::printf("%-40s %8d %10.2f %9.0f %9.1f %10.1f %10.1f %7s %9.1f %5.0f%%\n", cfg, num_threads(), median,
                tokens_per_step / median * 1e3, gflops, peak_rss, mb(l.peak(MemTag::kActivations)), mfu_text.c_str(),
                ceiling, pct_ceiling);
    std::printf("ledger peaks (MiB): params %.1f grads %.1f optimizer %.1f activations %.1f total %.1f\n",
                mb(l.peak(MemTag::kParams)), mb(l.peak(MemTag::kGrads)), mb(l.peak(MemTag::kOptimizer)),
                mb(l.peak(MemTag::kActivations)), mb(l.peak_total()));
    // Core time per step: in BLAS (thread time summed over threads) and outside it.
    double blas_ms = 0, blas_gflops = 0, rest_ms = 0;
    if (ceiling_products) {
      const double core_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / double(ms.size()) * num_threads();
      blas_ms = blas.seconds * 1e3 / double(ms.size());
      blas_gflops = blas.seconds > 0 ? blas.flops / blas.seconds / 1e9 : 0.0;
      rest_ms = core_ms - blas_ms;
      std::printf(
          "core time per step: %.2f ms in BLAS at %.1f GFLOP/s per core (%.0f%% of the ceiling's %.1f), "
          "%.2f ms outside it (%.0f%%)\n",
          blas_ms, blas_gflops, 100 * blas_gflops * num_threads() / ceiling, ceiling / num_threads(), rest_ms,
          100 * rest_ms / (blas_ms + rest_ms));
    }
    if (tp > 1) {
      const dist::TensorParallelTraffic t = dist::tensor_parallel_traffic();  // the last step's
      std::printf(
          "tp traffic per step (MiB of payload, per rank): all-reduce %.2f all-gather %.2f "
          "reduce-scatter %.2f\n",
          mb(t.all_reduce_bytes), mb(t.all_gather_bytes), mb(t.reduce_scatter_bytes));
    }
    if (device.is_cuda()) counted.print(steps);
    std::printf("loss: first timed step %.4f, last %.4f%s\n", loss_first, loss_last,
                same_batch ? " (one batch repeated)" : "");
    if (json || !json_out.empty()) {
      char blas_fields[160] = "";
      if (ceiling_products)
        std::snprintf(blas_fields, sizeof blas_fields,
                      ", \"blas_ms_per_step\": %.3f, \"blas_gflops_per_core\": %.2f, "
                      "\"rest_ms_per_step\": %.3f",
                      blas_ms, blas_gflops, rest_ms);
      char head[1536];
      std::snprintf(head, sizeof head,
                    "{\"model\": \"%s\", \"kv_heads\": %lld, \"ffn\": %lld, \"ms_per_step\": %.3f, \"ms_min\": %.3f, "
                    "\"ms_max\": %.3f, \"tokens_per_s\": %.1f, "
                    "\"gflops\": %.2f, \"peak_mem_mb\": %.1f, \"threads\": %d, \"act_peak_mb\": %.1f, "
                    "\"device\": \"%s\", \"mfu\": %.4f, \"peak_tflops\": %.1f, \"sgemm_ceiling_gflops\": %.2f, "
                    "\"pct_ceiling\": %.2f, \"ranks\": %d, \"zero\": %d, \"steps\": %lld, \"loss_first\": %.6g, "
                    "\"loss_last\": %.6g, \"same_batch\": %s",
                    model_name.c_str(), (long long)model_cfg.kv_heads(), (long long)model_cfg.mlp_width(), median,
                    *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()),
                    tokens_per_step / median * 1e3, gflops, peak_rss, num_threads(), mb(l.peak(MemTag::kActivations)),
                    name.c_str(), mfu, peak_tflops, ceiling, pct_ceiling, world, zero, (long long)steps, loss_first,
                    loss_last, same_batch ? "true" : "false");
      std::string steps_ms = ", \"ms_steps\": [";  // every timed step, for a driver that pools runs
      for (size_t i = 0; i < ms.size(); ++i) steps_ms += (i ? ", " : "") + std::to_string(ms[i]);
      steps_ms += "]";
      const std::string object = std::string(head) + blas_fields + steps_ms +
                                 (device.is_cuda() ? counted.json_fields(steps) : std::string()) +
                                 ", \"provenance\": " + provenance.dump() + "}\n";
      if (json) std::fputs(object.c_str(), stdout);
      if (!json_out.empty()) {
        const std::string part = json_out + ".part";
        MINIDL_CHECK(bool(std::ofstream(part) << object), "--json-out: cannot write ", part);
        MINIDL_CHECK(std::rename(part.c_str(), json_out.c_str()) == 0, "--json-out: cannot rename ", part, " to ",
                     json_out);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpt_step: error (rank %d): %s\n", ctx.rank(), e.what());
    if (ctx.world_size() > 1) ctx.abort(2);  // the other ranks may wait in a collective
    return 2;
  }
  return 0;
}
