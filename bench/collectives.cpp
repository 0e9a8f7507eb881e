// bench_collectives: bus bandwidth of a collective over a range of message sizes, printed like nccl-tests so the
// numbers compare with NCCL's own (columns, busbw factors and the "Avg bus bandwidth" footer are theirs).
//
//   mpirun -n 4 build/bin/bench_collectives --op all_reduce --backend ring --min-bytes 1M --max-bytes 64M
//   mpirun -n 2 build/bin/bench_collectives --op reduce_scatter --backend mpi --check --json
//   mpirun -n 4 build/bin/bench_collectives --op all_to_all --backend ring --check   # size/n to every peer
//   mpirun -n 8 build/bin/bench_collectives --backend nccl                  # device tensors, cuda:<local rank>
//   mpirun -n 8 build/bin/bench_collectives --backend ring --device cuda    # minidl's ring over ncclSend/ncclRecv
//
// size is the full buffer in bytes (for reduce_scatter the input, for all_gather the output, for all_to_all each
// rank's input, size/n for every peer, as in nccl-tests' alltoall);
// time is the mean over --iters after --warmup, from a barrier to the end of the last iteration (on a device:
// until the device has finished it), max over ranks;
// algbw = size / time (GB = 1e9 B); busbw = algbw · 2(n-1)/n for all_reduce and (n-1)/n for the others.
// --check runs a second pass of --iters iterations that refills the inputs with rank-dependent integers before
// each one and counts the elements that differ from the expected result (#wrong, summed over ranks); without it
// #wrong is N/A, and the timed pass is never slowed by checking.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/provenance.h"
#include "dist/init.h"
#include "dist/process_group.h"
#ifdef MINIDL_HAVE_CUDA_BACKEND
#include "core/cuda/cuda.h"
#include "dist/cuda/backend.h"
#endif

namespace {

using namespace minidl;
using dist::ReduceOp;

struct Options {
  std::string op = "all_reduce", backend = "mpi", device, dtype = "float", redop = "sum";
  std::string min_bytes = "8", max_bytes = "64M";
  int64_t step_factor = 2;
  int iters = 20, warmup = 5;
  bool json = false, check = false;
};

// "64M" -> 64 · 2^20. Suffixes K, M, G are powers of 1024, as in nccl-tests.
int64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  int64_t value = std::stoll(s, &used);
  std::string suffix = s.substr(used);
  int64_t scale = suffix.empty() ? 1 : suffix == "K" ? 1 << 10 : suffix == "M" ? 1 << 20 : suffix == "G" ? 1 << 30 : 0;
  MINIDL_CHECK(scale != 0 && value >= 0, "bench_collectives: expected a byte count like 8, 512K, 64M or 1G, got '", s,
               "'");
  return value * scale;
}

// nccl-tests' type names (and minidl's).
DType parse_dtype(const std::string& s) {
  const std::vector<std::pair<std::vector<std::string>, DType>> names = {
      {{"float", "f32"}, DType::f32},      {{"double", "f64"}, DType::f64}, {{"half", "f16"}, DType::f16},
      {{"bfloat16", "bf16"}, DType::bf16}, {{"int32", "i32"}, DType::i32},  {{"int64", "i64"}, DType::i64},
      {{"uint8", "u8"}, DType::u8}};
  for (const auto& [aliases, dtype] : names)
    for (const auto& alias : aliases)
      if (s == alias) return dtype;
  throw Error("bench_collectives: unknown --dtype '" + s + "' (float, double, half, bfloat16, int32, int64, uint8)");
}
const char* nccl_type_name(DType dt) {
  static const char* names[] = {"float", "double", "half", "bfloat16", "int32", "int64", "uint8"};
  return names[int(dt)];
}

// Where the tensors live: --device cpu, or cuda (this rank's local rank modulo the devices it sees); without
// --device, the backend's default (the CPU, and for nccl that same CUDA device).
std::optional<Device> parse_device(const std::string& device, const dist::Context& ctx) {
  if (device.empty()) return std::nullopt;
  if (device == "cpu") return Device::cpu();
#ifdef MINIDL_HAVE_CUDA_BACKEND
  const int devices = cuda::device_count();
  MINIDL_CHECK(devices > 0, "bench_collectives: --device cuda, but this process sees no CUDA device");
  return Device::cuda(ctx.local_rank() % devices);
#else
  (void)ctx;
  throw Error(
      "bench_collectives: --device cuda: this build has no CUDA backend (build with CUDA, or configure "
      "with -DMINIDL_CUDA_EMULATION=ON for the emulated one)");
#endif
}

// Waits until the device has finished what the collectives queued (nothing to wait for on the CPU).
void synchronize(Device device) {
  if (!device.is_cpu()) device_backend(device, "bench_collectives").synchronize(device.index);
}

ReduceOp parse_redop(const std::string& s) {
  if (s == "sum") return ReduceOp::kSum;
  if (s == "avg") return ReduceOp::kAvg;
  if (s == "max") return ReduceOp::kMax;
  throw Error("bench_collectives: unknown --redop '" + s + "' (sum, avg, max)");
}

// The check pattern: small integers, exact in every dtype and in sums over up to 15 ranks of a u8.
double value(int rank, int64_t i, int iter) { return double((i * 7 + rank * 5 + iter * 3) % 17); }

// Fills t (on any device) with the check pattern, through a host copy.
void fill(Tensor& t, int rank, int iter) {
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = from_double<T>(value(rank, i, iter));
  });
  t.copy_(host);
}

// Elements of t (on any device) that differ from expected(i) once expected is rounded to t's dtype.
template <class Fn>
int64_t count_wrong(const Tensor& t, Fn&& expected) {
  const Tensor host = t.to(Device::cpu());
  return dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.raw_data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < t.numel(); ++i) wrong += to_double(p[i]) != to_double(from_double<T>(expected(i)));
    return wrong;
  });
}

struct Row {
  int64_t bytes, count;
  double time_us, algbw, busbw;
  int64_t wrong;  // -1: not checked
};

Row measure(dist::ProcessGroup& pg, const Options& o, DType dtype, ReduceOp redop, int64_t bytes) {
  const int n = pg.size(), rank = pg.rank();
  const bool reduces = o.op == "all_reduce" || o.op == "reduce_scatter";
  const bool exchanges = o.op == "all_to_all";
  const int64_t elem = int64_t(dtype_size(dtype));
  int64_t count = bytes / elem;
  if (o.op != "all_reduce") count -= count % n;  // the full buffer must split evenly among ranks
  Row row{count * elem, count, 0, 0, 0, -1};

  Tensor full = Tensor::zeros({count}, dtype, pg.device()), part = Tensor::zeros({count / n}, dtype, pg.device());
  Tensor received = exchanges ? Tensor::zeros({count}, dtype, pg.device()) : Tensor();
  const std::vector<int64_t> per_peer(size_t(n), count / n);
  auto run_once = [&] {
    if (o.op == "all_reduce")
      pg.all_reduce(full, redop)->wait();
    else if (o.op == "reduce_scatter")
      pg.reduce_scatter(part, full, redop)->wait();
    else if (exchanges)
      pg.all_to_all(received, full, per_peer, per_peer)->wait();
    else
      pg.all_gather(full, part)->wait();
  };
  for (int i = 0; i < o.warmup; ++i) run_once();
  pg.barrier()->wait();
  double start = MPI_Wtime();
  for (int i = 0; i < o.iters; ++i) run_once();
  synchronize(pg.device());
  double seconds = (MPI_Wtime() - start) / std::max(1, o.iters);
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  row.time_us = seconds * 1e6;
  row.algbw = seconds > 0 ? double(row.bytes) / 1e9 / seconds : 0;
  row.busbw = row.algbw * (o.op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n);

  if (o.check) {
    row.wrong = 0;
    for (int iter = 0; iter < o.iters; ++iter) {
      Tensor& input = reduces || exchanges ? full : part;
      fill(input, rank, iter);
      run_once();
      auto reduced = [&](int64_t i) {
        double sum = 0, max = 0;
        for (int r = 0; r < n; ++r) sum += value(r, i, iter), max = std::max(max, value(r, i, iter));
        if (redop == ReduceOp::kMax) return max;
        if (redop == ReduceOp::kSum) return sum;
        return is_floating(dtype) ? double(float(sum) / float(n)) : double(int64_t(sum) / n);
      };
      if (o.op == "all_reduce")
        row.wrong += count_wrong(full, reduced);
      else if (o.op == "reduce_scatter")
        row.wrong += count_wrong(part, [&](int64_t i) { return reduced(rank * part.numel() + i); });
      else if (exchanges)  // element i came from rank i / (count/n), which sent it from its part for this rank
        row.wrong += count_wrong(received, [&](int64_t i) {
          return value(int(i / part.numel()), rank * part.numel() + i % part.numel(), iter);
        });
      else
        row.wrong += count_wrong(full, [&](int64_t i) { return value(int(i / part.numel()), i % part.numel(), iter); });
    }
    MPI_Allreduce(MPI_IN_PLACE, &row.wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  auto ctx = dist::init(argc, argv);
  Options o;
  CLI::App app{"Bus bandwidth of minidl's collectives, nccl-tests style"};
  app.add_option("--op", o.op, "collective")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}));
  app.add_option("--backend", o.backend, "process group backend")->check(CLI::IsMember({"mpi", "ring", "nccl"}));
  app.add_option("--device", o.device, "where the tensors live: cpu or cuda (default: the backend's, cuda for nccl)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--min-bytes", o.min_bytes, "smallest size (suffixes K, M, G)")->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest size (suffixes K, M, G)")->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "multiply the size by this between rows")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--iters", o.iters, "timed iterations per size")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed iterations before them")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "float, double, half, bfloat16, int32, int64, uint8")->capture_default_str();
  app.add_option("--redop", o.redop, "sum, avg, max")->capture_default_str();
  app.add_flag("--json", o.json, "print a JSON object (provenance, rows) instead of the table");
  app.add_flag("--check", o.check, "verify every iteration of a second pass and count wrong elements");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return ctx.rank() == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 2 : 0); }

  try {
#ifdef MINIDL_HAVE_CUDA_BACKEND
    cuda::register_backend();
#endif
    const DType dtype = parse_dtype(o.dtype);
    const ReduceOp redop = parse_redop(o.redop);
    const int64_t min_bytes = parse_bytes(o.min_bytes), max_bytes = parse_bytes(o.max_bytes);
    auto pg = dist::make_process_group(o.backend, ctx.world(), parse_device(o.device, ctx));
    const char* redop_name = o.op == "all_gather" || o.op == "all_to_all" ? "none" : o.redop.c_str();

    std::vector<Row> rows;
    for (int64_t bytes = std::max<int64_t>(min_bytes, 1); bytes <= max_bytes; bytes *= o.step_factor)
      rows.push_back(measure(*pg, o, dtype, redop, bytes));
    if (ctx.rank() != 0) return 0;
    const nlohmann::json provenance = bench::provenance(argc, argv);

    double avg_busbw = 0;
    for (const Row& r : rows) avg_busbw += r.busbw / rows.size();
    if (o.json) {
      nlohmann::json out = nlohmann::json::array();
      for (const Row& r : rows)
        out.push_back({{"op", o.op},
                       {"backend", o.backend},
                       {"device", pg->device().is_cpu() ? "cpu" : "cuda"},
                       {"nranks", ctx.world_size()},
                       {"size", r.bytes},
                       {"count", r.count},
                       {"type", nccl_type_name(dtype)},
                       {"redop", redop_name},
                       {"root", -1},
                       {"time", r.time_us},
                       {"alg_bw", r.algbw},
                       {"bus_bw", r.busbw},
                       {"nwrong", r.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.wrong)}});
      std::printf("%s\n", nlohmann::json{{"provenance", provenance}, {"rows", out}}.dump(1).c_str());
      return 0;
    }
    std::printf("# minidl bench_collectives: %s, backend %s on %s, %d ranks (%d on this host), %d thread(s) per rank\n",
                o.op.c_str(), o.backend.c_str(), pg->device().is_cpu() ? "cpu" : "cuda", ctx.world_size(),
                ctx.ranks_on_host(), ctx.threads_per_rank());
    std::fputs(bench::provenance_header(provenance).c_str(), stdout);
    std::printf("# minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %d iters: %d validation: %d\n#\n",
                (long long)min_bytes, (long long)max_bytes, (long long)o.step_factor, o.warmup, o.iters, int(o.check));
    std::printf("# %10s  %12s  %8s  %6s  %10s  %7s  %7s  %6s\n", "size", "count", "type", "redop", "time", "algbw",
                "busbw", "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %10s  %7s  %7s  %6s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
                "(GB/s)", "");
    for (const Row& r : rows) {
      std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
      std::printf("  %10lld  %12lld  %8s  %6s  %10.2f  %7.2f  %7.2f  %6s\n", (long long)r.bytes, (long long)r.count,
                  nccl_type_name(dtype), redop_name, r.time_us, r.algbw, r.busbw, wrong.c_str());
    }
    std::printf("# Avg bus bandwidth    : %g\n#\n", avg_busbw);
    return 0;
  } catch (const Error& e) {
    if (ctx.rank() == 0) std::fprintf(stderr, "bench_collectives: error: %s\n", e.what());
    return 2;
  }
}
