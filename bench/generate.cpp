// bench_generate — the cost of one generated token as the context grows, with the KV cache (nn::KVCache: one new
// position through every block; the mean of 8 tokens generated in a row up to each context length) and without it
// (the whole window recomputed, what generation did before): ms per token at several context lengths, one process,
// on the CPU or --device cuda. With the cache the time should stay
// about flat (the attention's share grows with the context, the rest does not); without it it grows with the window.
//
//   build/bin/bench_generate                                  # nanoGPT's Shakespeare shape: 6 layers, 384, T 256
//   build/bin/bench_generate --layers 12 --heads 12 --embd 768 --block 1024 --vocab 50257   # GPT-2 124M
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "autograd/node.h"
#include "bench/cli.h"
#include "bench/provenance.h"
#include "bench/timing.h"
#include "core/device_backend.h"
#include "core/error.h"
#include "core/parallel.h"
#include "nn/gpt.h"
#include "ops/cpu/simd/isa.h"
#include "train/device.h"

using namespace minidl;

int main(int argc, char** argv) {
  constexpr int64_t kRun = 8;  // cached tokens timed in a row at each context length
  int64_t layers = 6, heads = 6, embd = 384, block = 256, vocab = 65, reps = 5;
  int threads = 0;
  std::string device_flag = "cpu";
  CLI::App app{"Milliseconds per generated token at growing context lengths, with and without the KV cache"};
  app.add_option("--layers", layers, "Transformer blocks")->check(bench::kPositiveCount)->capture_default_str();
  app.add_option("--heads", heads, "Attention heads")->check(bench::kPositiveCount)->capture_default_str();
  app.add_option("--embd", embd, "Embedding width")->check(bench::kPositiveCount)->capture_default_str();
  app.add_option("--block", block, "Context length (block_size)")->check(bench::kPositiveCount)->capture_default_str();
  app.add_option("--vocab", vocab, "Vocabulary size")->check(bench::kPositiveCount)->capture_default_str();
  app.add_option("--reps", reps, "Timings per point (the median counts)")
      ->check(bench::kPositiveCount)
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads; default: all cores");
  app.add_option("--device", device_flag, "cpu, cuda or cuda:N")->capture_default_str();
  if (std::optional<int> code = bench::parse_flags(app, argc, argv, "bench_generate")) return *code;
  try {
    set_num_threads(threads > 0 ? threads : default_num_threads());
    const Device device = train::select_device(device_flag);
    nn::GPT model(nn::GPTConfig{vocab, block, layers, heads, embd, 0.0, true}, 1);
    model.to(device);
    model.eval();
    autograd::NoGradGuard no_grad;
    auto sync = [&] {
      if (device.is_cuda()) device_backend(device, "synchronize").synchronize(device.index);
    };
    std::fputs(bench::provenance_header(bench::provenance(argc, argv)).c_str(), stdout);
    std::printf("# device: %s; %d threads; L%lld H%lld C%lld block %lld vocab %lld\n",
                device.is_cpu() ? ops::simd::host_cpu_and_kernels().c_str() : train::device_name(device).c_str(),
                num_threads(), (long long)layers, (long long)heads, (long long)embd, (long long)block,
                (long long)vocab);
    std::printf("%10s %16s %16s %8s\n", "context", "cached ms/tok", "window ms/tok", "ratio");
    std::vector<int64_t> points;
    for (int64_t L = 16; L < block; L *= 2) points.push_back(L);
    points.push_back(block - 1);
    std::vector<int32_t> ids(static_cast<size_t>(block));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + 3) % size_t(vocab));
    for (int64_t L : points) {
      std::vector<double> cached, window;
      for (int64_t r = 0; r < reps; ++r) {
        // L - kRun positions in the cache, then kRun tokens one at a time, timed together: a generation's steady
        // state (the weights as the previous token left them in the caches, not as the prompt pass did).
        const int64_t first = std::max<int64_t>(1, L - kRun), run = L + 1 - first;
        nn::KVCache cache;
        model.forward_cached(
            Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.begin() + first), Shape{1, first}).to(device),
            cache);
        std::vector<Tensor> next;
        for (int64_t p = first; p <= L; ++p)
          next.push_back(Tensor::from_vector(std::vector<int32_t>{ids[size_t(p)]}, Shape{1, 1}).to(device));
        sync();
        auto t0 = std::chrono::steady_clock::now();
        for (const Tensor& id : next) model.forward_cached(id, cache);
        sync();
        cached.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                         double(run));
        const Tensor all =
            Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.begin() + L + 1), Shape{1, L + 1}).to(device);
        sync();
        t0 = std::chrono::steady_clock::now();
        model.forward(all);
        sync();
        window.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      const double c = bench::median(cached), w = bench::median(window);
      std::printf("%10lld %16.3f %16.3f %8.1f\n", (long long)(L + 1), c, w, w / c);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_generate: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
