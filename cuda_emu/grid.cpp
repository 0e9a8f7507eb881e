// A grid: validate the launch like CUDA, then let a pool of worker OS threads (the launching thread among
// them) take block indices from an atomic counter until none are left.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"
#include "cuda_emu/stream_state.h"

namespace minidl::emu {
namespace {

// MINIDL_EMU_CHECK: all (the default), none, or a comma list of checker names (check.h).
unsigned checks_from_environment() {
  if (!checks_compiled()) return 0;
  const char* value = std::getenv("MINIDL_EMU_CHECK");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "all") == 0) return kAllChecks;
  if (std::strcmp(value, "none") == 0 || std::strcmp(value, "0") == 0) return 0;
  unsigned checks = 0;
  const std::string list = value;
  for (size_t start = 0; start <= list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    if (name == "initcheck")
      checks |= kInitcheck;
    else if (name == "memcheck")
      checks |= kMemcheck;
    else if (name == "racecheck")
      checks |= kRacecheck;
    else
      detail::fatal("MINIDL_EMU_CHECK=%s: expected all, none or a comma list of initcheck, memcheck, racecheck", value);
    start = comma + 1;
  }
  return checks;
}

Options options_from_environment() {
  Options o;
  if (const char* order = std::getenv("MINIDL_EMU_ORDER"); order != nullptr && *order != '\0') {
    if (std::strcmp(order, "forward") == 0)
      o.order = Order::kForward;
    else if (std::strcmp(order, "reverse") == 0)
      o.order = Order::kReverse;
    else if (std::strcmp(order, "random") == 0)
      o.order = Order::kRandom;
    else
      detail::fatal("MINIDL_EMU_ORDER=%s: expected forward, reverse or random", order);
  }
  if (const char* seed = std::getenv("MINIDL_EMU_SEED")) o.seed = std::strtoull(seed, nullptr, 10);
  if (const char* strict = std::getenv("MINIDL_EMU_STRICT")) o.strict = std::strcmp(strict, "0") != 0;
  o.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (const char* workers = std::getenv("MINIDL_EMU_WORKERS")) o.workers = std::max(1, std::atoi(workers));
#if defined(__SANITIZE_ADDRESS__)
  o.stack_bytes = 256 * 1024;  // ASan's redzones make frames several times larger
#endif
  if (const char* streams = std::getenv("MINIDL_EMU_STREAMS"); streams != nullptr && *streams != '\0') {
    if (std::strcmp(streams, "sync") == 0)
      o.streams = StreamMode::kSync;
    else if (std::strcmp(streams, "async") == 0)
      o.streams = StreamMode::kAsync;
    else
      detail::fatal("MINIDL_EMU_STREAMS=%s: expected sync or async", streams);
  }
  if (const char* kb = std::getenv("MINIDL_EMU_STACK_KB")) o.stack_bytes = std::max(16, std::atoi(kb)) * size_t{1024};
  o.checks = checks_from_environment();
  return o;
}

std::mutex options_mutex;
std::unique_ptr<Options> current_options;

// Workers - 1 threads that sleep between launches; the launching thread is the last worker.
class WorkerPool {
 public:
  explicit WorkerPool(int workers) {
    for (int i = 1; i < workers; ++i) threads_.emplace_back([this] { serve(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()) + 1; }

  void run(const detail::KernelLaunch& launch, const Options& options, uint64_t blocks) {
    launch_ = &launch;
    options_ = options;
    blocks_ = blocks;
    next_.store(0);
    const bool helpers = blocks > 1 && !threads_.empty();
    if (helpers) {
      std::lock_guard lock(mutex_);
      busy_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    if (helpers) wake_.notify_all();
    run_blocks();
    if (helpers) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [this] { return busy_ == 0; });
    }
  }

 private:
  void run_blocks() {
    for (uint64_t b = next_.fetch_add(1); b < blocks_; b = next_.fetch_add(1)) detail::run_block(*launch_, b, options_);
  }
  void serve() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_blocks();
      std::lock_guard lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  const detail::KernelLaunch* launch_ = nullptr;
  Options options_;
  uint64_t blocks_ = 0;
  std::atomic<uint64_t> next_{0};
};

std::mutex launch_mutex;  // one grid at a time: the pool serves one launch
std::unique_ptr<WorkerPool> pool;

cudaError_t validate(const detail::KernelLaunch& l) {
  const dim3 b = l.block, g = l.grid;
  if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) return cudaErrorInvalidConfiguration;
  if (b.x > 1024 || b.y > 1024 || b.z > 64 || uint64_t{b.x} * b.y * b.z > detail::kMaxThreadsPerBlock)
    return cudaErrorInvalidConfiguration;
  if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
  if (l.smem_bytes > detail::max_dynamic_smem(l.kernel)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

Options options() {
  std::lock_guard lock(options_mutex);
  if (!current_options) current_options = std::make_unique<Options>(options_from_environment());
  return *current_options;
}

void set_options(const Options& o) {
  detail::synchronize_device();  // deferred work runs under the options it was queued with
  std::lock_guard lock(options_mutex);
  current_options = std::make_unique<Options>(o);
}

namespace detail {

cudaError_t check_launch(const KernelLaunch& launch) {
  const cudaError_t error = validate(launch);
  if (error != cudaSuccess) set_last_error(error);
  return error;
}

cudaError_t run_kernel(const KernelLaunch& launch) {
  if (inside_kernel()) fatal("a kernel launched a kernel: dynamic parallelism is not emulated");
  if (const cudaError_t error = check_launch(launch); error != cudaSuccess) return error;
  const Options o = options();
  std::lock_guard lock(launch_mutex);
  if (!pool || pool->workers() != o.workers) {
    pool.reset();
    pool = std::make_unique<WorkerPool>(o.workers);
  }
  std::shared_lock allocations(check_launch_mutex());  // device allocations stay put while the checkers look
  note_launch_frames(o, launch.frames);
  pool->run(launch, o, uint64_t{launch.grid.x} * launch.grid.y * launch.grid.z);
  return cudaSuccess;
}

}  // namespace detail
}  // namespace minidl::emu
