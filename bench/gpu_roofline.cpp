// bench_gpu_roofline — the lower bound of one GPT training step on a named GPU, from arithmetic alone (no GPU
// needed): per kernel the FLOPs and the bytes it must move, its ideal time max(FLOPs / peak, bytes / bandwidth),
// then the step's lower bound (their sum) and the MFU ceiling (model FLOPs over lower bound x peak). The kernel
// list and the cost model are in bench/roofline.h.
//
//   build/bin/bench_gpu_roofline                                   # GPT-2 124M, B 16, T 1024, bf16, on H100
//   build/bin/bench_gpu_roofline --kernels before                  # the kernels before issue #15 (or target)
//   build/bin/bench_gpu_roofline --layers 6 --heads 6 --embd 384 --seq 256 --batch 8 --vocab 65 --gpu A100 --json
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/provenance.h"
#include "bench/roofline.h"

using namespace minidl;
using namespace minidl::bench;

int main(int argc, char** argv) {
  RooflineConfig cfg;
  std::string amp = "bf16", gpu_name = "H100";
  bool json = false;
  CLI::App app{
      "Ideal time of each kernel of a GPT training step on a named GPU, the step's lower bound and the "
      "MFU ceiling (peaks: NVIDIA datasheets, dense)."};
  app.add_option("--layers", cfg.layers, "Transformer blocks")->capture_default_str();
  app.add_option("--heads", cfg.heads, "Attention heads")->capture_default_str();
  app.add_option("--embd", cfg.embd, "Embedding width")->capture_default_str();
  app.add_option("--seq", cfg.seq, "Sequence length")->capture_default_str();
  app.add_option("--batch", cfg.batch, "Sequences per step")->capture_default_str();
  app.add_option("--vocab", cfg.vocab, "Vocabulary size")->capture_default_str();
  app.add_option("--amp", amp, "Precision of products and attention: off (f32), bf16 or fp16")->capture_default_str();
  app.add_option("--gpu", gpu_name, "H200 (SXM), H100 (SXM5) or A100 (SXM4 80GB)")->capture_default_str();
  std::string kernel_set = "now";
  app.add_option("--kernels", kernel_set,
                 "Which kernels: now (today's: tensor-core flash attention; 16-bit-native "
                 "layernorm and bias+GELU, the residual add fused into ln_2, f32 weight gradients from the GEMMs; f32 "
                 "copies around cross-entropy), before (issue #15's starting point: also f32 attention on the CUDA "
                 "cores, one sequence per launch, f32 copies around layernorm and bias+GELU, an unfused residual "
                 "add, 16-bit weight gradients cast to f32) or target (the 16-bit-native path: no casts)")
      ->capture_default_str();
  app.add_flag("--json", json, "Print one JSON object instead of the table");
  CLI11_PARSE(app, argc, argv);
  if (amp != "off" && amp != "bf16" && amp != "fp16") {
    std::fprintf(stderr, "bench_gpu_roofline: error: --amp: expected off, bf16 or fp16, got '%s'\n", amp.c_str());
    return 2;
  }
  if (kernel_set != "now" && kernel_set != "before" && kernel_set != "target") {
    std::fprintf(stderr, "bench_gpu_roofline: error: --kernels: expected now, before or target, got '%s'\n",
                 kernel_set.c_str());
    return 2;
  }
  cfg.kernels = kernel_set == "before"   ? KernelSet::kBefore
                : kernel_set == "target" ? KernelSet::kTarget
                                         : KernelSet::kNow;
  const GpuPeak* gpu = find_gpu(gpu_name);
  if (gpu == nullptr) {
    std::fprintf(stderr, "bench_gpu_roofline: error: --gpu: expected H200, H100 or A100, got '%s'\n", gpu_name.c_str());
    return 2;
  }
  if (cfg.layers < 1 || cfg.heads < 1 || cfg.embd < 1 || cfg.embd % cfg.heads != 0 || cfg.seq < 1 || cfg.batch < 1 ||
      cfg.vocab < 1) {
    std::fprintf(stderr, "bench_gpu_roofline: error: expected positive sizes with --embd a multiple of --heads\n");
    return 2;
  }
  cfg.amp = amp == "bf16" ? DType::bf16 : amp == "fp16" ? DType::f16 : DType::f32;

  const std::vector<KernelCost> kernels = step_kernels(cfg);
  double seconds = 0, bytes = 0, padding_flops = 0;
  int64_t launches = 0;
  for (const KernelCost& k : kernels) {
    seconds += ideal_seconds(k, *gpu, cfg.amp);
    bytes += double(k.launches) * k.bytes;
    padding_flops += double(k.launches) * k.padding_flops;
    launches += k.launches;
  }
  const double flops = step_flops(kernels), peak = peak_flops(*gpu, cfg.amp);
  const double mfu_ceiling = flops / (seconds * peak);
  const double tokens = double(cfg.batch * cfg.seq);

  const nlohmann::json provenance = bench::provenance(argc, argv);
  if (json) {
    nlohmann::json out = {{"provenance", provenance},
                          {"gpu", gpu->name},
                          {"amp", amp},
                          {"kernel_set", kernel_set},
                          {"peak_tflops", peak / 1e12},
                          {"hbm_gbps", gpu->hbm_gbps},
                          {"step_gflop", flops / 1e9},
                          {"step_gb", bytes / 1e9},
                          {"padding_gflop", padding_flops / 1e9},
                          {"launches", launches},
                          {"lower_bound_ms", seconds * 1e3},
                          {"tokens_per_s_ceiling", tokens / seconds},
                          {"mfu_ceiling", mfu_ceiling}};
    for (const KernelCost& k : kernels)
      out["kernels"].push_back({{"name", k.name},
                                {"launches", k.launches},
                                {"gflop", double(k.launches) * k.flops / 1e9},
                                {"mb", double(k.launches) * k.bytes / 1e6},
                                {"ideal_us", ideal_seconds(k, *gpu, cfg.amp) * 1e6},
                                {"bound", compute_bound(k, *gpu, cfg.amp) ? "compute" : "memory"}});
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::fputs(bench::provenance_header(provenance).c_str(), stdout);
  std::printf("GPT L%lld H%lld C%lld T%lld B%lld V%lld %s on %s (%.0f TFLOP/s, %.0f GB/s)%s\n", (long long)cfg.layers,
              (long long)cfg.heads, (long long)cfg.embd, (long long)cfg.seq, (long long)cfg.batch, (long long)cfg.vocab,
              amp.c_str(), gpu->name, peak / 1e12, gpu->hbm_gbps, (", kernels " + kernel_set).c_str());
  std::printf("%-30s %8s %12s %12s %12s %8s\n", "kernel", "launches", "GFLOP", "MB", "ideal_us", "bound");
  for (const KernelCost& k : kernels)
    std::printf("%-30s %8lld %12.1f %12.1f %12.1f %8s\n", k.name.c_str(), (long long)k.launches,
                double(k.launches) * k.flops / 1e9, double(k.launches) * k.bytes / 1e6,
                ideal_seconds(k, *gpu, cfg.amp) * 1e6, compute_bound(k, *gpu, cfg.amp) ? "compute" : "memory");
  std::printf("%-30s %8lld %12.1f %12.1f %12.1f\n", "step", (long long)launches, flops / 1e9, bytes / 1e6,
              seconds * 1e6);
  if (padding_flops > 0)
    std::printf(
        "GFLOP are the model's; the head's GEMMs also multiply the vocabulary's padding rows: %.1f GFLOP more, "
        "in ideal_us\n",
        padding_flops / 1e9);
  std::printf("lower bound %.2f ms/step, %.0f tokens/s; MFU ceiling %.1f%%\n", seconds * 1e3, tokens / seconds,
              mfu_ceiling * 100);
  return 0;
}
