// What one trace span costs, with tracing off and on: a loop of spans with nothing inside, best of 5 rounds.
//
//   build/bin/bench_trace_spans [--spans 200000] [--device cuda]
//
// With --device cuda each span also records its two device events (core/cuda/trace_hooks.cpp) on the device's
// compute stream, and they are read in batches as in a run; on the emulated device the events are the emulator's.
//
// Multiplied by the spans a step records (count them in a trace), this bounds what --trace adds to a step more
// tightly than timing whole runs on a noisy machine can (bench/trace_overhead.py does that).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "bench/cli.h"
#include "bench/provenance.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "train/device.h"

namespace {

double ns_per_span(int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    const minidl::trace::Span span("wait for all-gather");  // longer than std::string's small buffer
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(n);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace minidl;
  int64_t spans = 200000;
  std::string device_flag = "cpu";
  CLI::App app{"Nanoseconds per trace span, tracing off and on"};
  app.add_option("--spans", spans, "spans per round")->check(bench::kPositiveCount)->capture_default_str();
  app.add_option("--device", device_flag, "cpu, or cuda / cuda:N: each span also times itself on that device")
      ->capture_default_str();
  if (std::optional<int> code = bench::parse_flags(app, argc, argv, "bench_trace_spans")) return *code;
  const Device device = train::select_device(device_flag);
  if (device.is_cuda()) (void)Tensor::zeros({1}, DType::f32, device).to(Device::cpu());  // the device is in use
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "minidl_bench_trace_spans";
  const std::string path = (dir / "rank0.json").string();
  double off = 1e300, on = 1e300;
  for (int round = 0; round < 5; ++round) {
    off = std::min(off, ns_per_span(spans));
    trace::start(path, 0);
    on = std::min(on, ns_per_span(spans));
    trace::finish();
  }
  std::filesystem::remove_all(dir);
  std::fputs(bench::provenance_header(bench::provenance(argc, argv)).c_str(), stdout);
  std::printf("device %s\n%-6s %12s\n%-6s %12.1f\n%-6s %12.1f\n", device_flag.c_str(), "trace", "ns/span", "off", off,
              "on", on);
  return 0;
}
