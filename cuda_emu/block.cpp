// One block on one worker OS thread: its threads are fibers that the scheduling loop in run_block resumes in
// the configured order until all have returned. A fiber gives control back only when it waits (a barrier or
// a warp collective) or returns; whoever completes a barrier or collective marks the waiting fibers runnable.
#include <algorithm>
#include <bit>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu/emulator.h"
#include "cuda_emu/fiber.h"
#include "cuda_emu/scheduler.h"

namespace minidl::emu::detail {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

enum class State : uint8_t { kRunnable, kAtBarrier, kInWarpOp, kExited };

// An emulated CUDA thread: its fiber, and what it waits for. Results are stored per thread because the one
// who completes a barrier or collective computes them for everyone before the others resume.
struct Thread {
  ctx::fcontext_t context = nullptr;
  uint3 index = {};  // its threadIdx
  SwitchState switches;
  State state = State::kRunnable;
  std::source_location site;  // of the barrier or collective it waits in
  BarrierOp barrier_op = BarrierOp::kSync;
  int predicate = 0, barrier_result = 0;
  WarpOp warp_op = WarpOp::kSync;
  unsigned mask = 0;
  int param = 0, width = 0;                // source lane / delta / xor mask, and segment width of a shuffle
  uint64_t value = 0, result = 0;          // the bits it deposited, and its result
  const WarpExchange* exchange = nullptr;  // of a kExchange collective; value holds the lane's data pointer
  AsyncCopies async_copies;                // its cp.async copies not yet waited for (warp_matrix.cpp)
};

struct FreeDeleter {
  void operator()(unsigned char* p) const { std::free(p); }
};

// Everything a worker needs to run blocks, kept between blocks and launches so stacks are mapped once.
struct Worker {
  std::vector<std::unique_ptr<FiberStack>> stacks;
  std::vector<Thread> threads;
  std::vector<int> order;
  std::vector<unsigned> warp_waiting;  // per warp: lanes waiting in a collective
  std::unique_ptr<unsigned char, FreeDeleter> smem;
  size_t smem_bytes = 0;
  uint64_t block_generation = 0;  // +1 per block: tells MINIDL_SHARED sites which block they were poisoned for
  size_t static_smem_bytes = 0;   // of the MINIDL_SHARED sites the running block has reached
  size_t stack_bytes = 0;

  ctx::fcontext_t scheduler = nullptr;
  const KernelLaunch* launch = nullptr;  // non-null while a block runs
  Options options;
  int current = -1;
  int size = 0, alive = 0, exited = 0;
  int barrier_arrived = 0, barrier_predicates = 0;
};

thread_local Worker worker;

Worker& running_worker(const char* what) {
  Worker& w = worker;
  if (w.launch == nullptr || w.current < 0) fatal("%s called outside a kernel", what);
  return w;
}

const char* barrier_name(BarrierOp op) {
  static const char* const names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};
  return names[static_cast<int>(op)];
}
const char* warp_name(WarpOp op) {
  static const char* const names[] = {"__syncwarp",       "__ballot_sync",   "__any_sync",
                                      "__all_sync",       "__shfl_sync",     "__shfl_up_sync",
                                      "__shfl_down_sync", "__shfl_xor_sync", "warp exchange"};
  return names[static_cast<int>(op)];
}

std::string where(const std::source_location& site) {
  return std::string(site.file_name()) + ":" + std::to_string(site.line());
}

// "__shfl_down_sync(mask 0xffffffff) at file:line"
std::string collective(const Thread& t) {
  char mask[32];
  std::snprintf(mask, sizeof mask, "(mask 0x%08x)", t.mask);
  const char* name = t.warp_op == WarpOp::kExchange ? t.exchange->name : warp_name(t.warp_op);
  return std::string(name) + mask + " at " + where(t.site);
}

std::string describe(const Thread& t) {
  switch (t.state) {
    case State::kRunnable: return "runnable";
    case State::kExited: return "returned";
    case State::kAtBarrier: return std::string("waiting in ") + barrier_name(t.barrier_op) + "() at " + where(t.site);
    case State::kInWarpOp: return "waiting in " + collective(t);
  }
  return "";
}

// "threads 0-31<key>, threads 32-63<key>" over [first, last), grouping consecutive threads with equal
// `key(i)`; an empty key leaves the thread out.
template <class Key>
std::string ranges(int first, int last, const char* noun, const char* separator, Key key) {
  std::string out;
  for (int i = first; i < last;) {
    const std::string k = key(i);
    int j = i + 1;
    while (j < last && key(j) == k) ++j;
    if (k.empty()) {
      i = j;
      continue;
    }
    char span[32];
    if (j - 1 > i)
      std::snprintf(span, sizeof span, " %d-%d", i - first, j - 1 - first);
    else
      std::snprintf(span, sizeof span, " %d", i - first);
    if (!out.empty()) out.append(separator);
    out.append(noun).append(span).append(k);
    i = j;
  }
  return out;
}

std::string block_name(const Worker& w) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "block (%u,%u,%u) of grid (%u,%u,%u) x (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z,
                w.launch->grid.x, w.launch->grid.y, w.launch->grid.z, w.launch->block.x, w.launch->block.y,
                w.launch->block.z);
  return buf;
}

[[noreturn]] void report_deadlock(const Worker& w) {
  bool someone_returned = false, someone_waits = false;
  for (const Thread& t : w.threads) {
    someone_returned |= t.state == State::kExited;
    someone_waits |= t.state == State::kAtBarrier || t.state == State::kInWarpOp;
  }
  const std::string list = ranges(0, w.size, "  threads", "\n", [&w](int i) { return ": " + describe(w.threads[i]); });
  fatal("deadlock in %s: no thread can proceed\n%s%s", block_name(w).c_str(), list.c_str(),
        someone_returned && someone_waits
            ? "\n  (a thread that returned never arrives: every thread of a block must reach each __syncthreads "
              "and every lane of a mask each collective; guard the work instead of returning early)"
            : "");
}

void wait_until_released(Worker& w, Thread& self) {
  while (self.state != State::kRunnable) yield_to_scheduler(&w.scheduler, self.switches);
}

bool try_complete_barrier(Worker& w) {
  const int needed = w.options.strict ? w.size : w.size - w.exited;
  if (w.barrier_arrived == 0 || w.barrier_arrived < needed) return false;
  if (w.options.strict) {  // then every thread has arrived: all must wait at the same line
    const std::source_location& site = w.threads[0].site;
    for (const Thread& t : w.threads) {
      if (t.site.line() == site.line() && std::strcmp(t.site.file_name(), site.file_name()) == 0) continue;
      const std::string list =
          ranges(0, w.size, "threads", ", ", [&w](int i) { return " at " + where(w.threads[i].site); });
      fatal("divergent barrier in %s: %s", block_name(w).c_str(), list.c_str());
    }
  }
  const int count = w.barrier_predicates, arrived = w.barrier_arrived;
  for (Thread& t : w.threads) {
    if (t.state != State::kAtBarrier) continue;
    switch (t.barrier_op) {
      case BarrierOp::kSync: t.barrier_result = 0; break;
      case BarrierOp::kCount: t.barrier_result = count; break;
      case BarrierOp::kAnd: t.barrier_result = count == arrived; break;
      case BarrierOp::kOr: t.barrier_result = count != 0; break;
    }
    t.state = State::kRunnable;
  }
  w.barrier_arrived = w.barrier_predicates = 0;
  check_barrier();
  return true;
}

// Source lane of `lane` for a shuffle, as PTX shfl.sync computes it from the CUDA intrinsic's width; the own
// lane when the source falls outside the segment.
int shuffle_source(WarpOp op, int lane, int b, int width) {
  const int segment_mask = ~(width - 1) & 31, first = lane & segment_mask, last = first | (width - 1);
  b &= 31;
  switch (op) {
    case WarpOp::kShflIdx: return first | (b & (width - 1));
    case WarpOp::kShflUp: return lane - b >= first ? lane - b : lane;
    case WarpOp::kShflDown: return lane + b <= last ? lane + b : lane;
    case WarpOp::kShflXor: return (lane ^ b) <= last ? lane ^ b : lane;
    default: return lane;
  }
}

unsigned existing_lanes(const Worker& w, int warp) {
  const int n = w.size - warp * warpSize;
  return n >= warpSize ? kFullMask : (1u << n) - 1;
}

unsigned exited_lanes(const Worker& w, int warp) {
  unsigned bits = 0;
  for (int lane = 0; lane < warpSize && warp * warpSize + lane < w.size; ++lane)
    if (w.threads[warp * warpSize + lane].state == State::kExited) bits |= 1u << lane;
  return bits;
}

// Completes the collective of the lanes in `mask` if all of them are waiting; returns whether it did.
bool try_complete_warp(Worker& w, int warp, unsigned mask) {
  unsigned lanes = mask & existing_lanes(w, warp);
  if (!w.options.strict) lanes &= ~exited_lanes(w, warp);
  if (lanes == 0 || (w.warp_waiting[warp] & lanes) != lanes) return false;
  Thread* t = &w.threads[warp * warpSize];
  const Thread& first = t[std::countr_zero(lanes)];
  unsigned ballot = 0;
  for (int lane = 0; lane < warpSize; ++lane) {
    if (!(lanes >> lane & 1)) continue;
    if (t[lane].warp_op != first.warp_op || t[lane].mask != first.mask || t[lane].exchange != first.exchange) {
      const std::string list = ranges(warp * warpSize, warp * warpSize + warpSize, "lanes", ", ", [&](int i) {
        return (lanes >> (i % warpSize) & 1) ? " in " + collective(w.threads[i]) : std::string();
      });
      fatal("mismatched warp collective in %s, warp %d: %s", block_name(w).c_str(), warp, list.c_str());
    }
    if (t[lane].value != 0) ballot |= 1u << lane;
  }
  if (first.warp_op == WarpOp::kExchange) {
    void* data[warpSize] = {};
    for (int lane = 0; lane < warpSize; ++lane)
      if (lanes >> lane & 1) data[lane] = reinterpret_cast<void*>(static_cast<uintptr_t>(t[lane].value));
    first.exchange->compute(data, lanes);
  }
  for (int lane = 0; lane < warpSize; ++lane) {
    if (!(lanes >> lane & 1)) continue;
    Thread& me = t[lane];
    switch (me.warp_op) {
      case WarpOp::kSync: me.result = 0; break;
      case WarpOp::kBallot: me.result = ballot; break;
      case WarpOp::kAny: me.result = ballot != 0; break;
      case WarpOp::kAll: me.result = ballot == lanes; break;
      case WarpOp::kExchange: me.result = 0; break;
      default: {
        const int src = shuffle_source(me.warp_op, lane, me.param, me.width);
        me.result = (lanes >> src & 1) ? t[src].value : ~uint64_t{0};  // a lane not taking part: all ones
      }
    }
    me.state = State::kRunnable;
  }
  w.warp_waiting[warp] &= ~lanes;
  check_warp_synced(warp);
  return true;
}

void thread_main(ctx::transfer_t from) {
  Worker& w = worker;
  w.scheduler = from.fctx;
  Thread& self = w.threads[w.current];
  fiber_started(self.switches);
  w.launch->body(w.launch->closure);
  self.state = State::kExited;
  --w.alive;
  ++w.exited;
  if (!w.options.strict) {  // returned threads count as arrived: what they were awaited for may be complete
    try_complete_barrier(w);
    const int warp = w.current / warpSize;
    for (int lane = 0; lane < warpSize && w.warp_waiting[warp] != 0; ++lane)
      if (w.warp_waiting[warp] >> lane & 1) try_complete_warp(w, warp, w.threads[warp * warpSize + lane].mask);
  }
  exit_to_scheduler(w.scheduler, self.switches);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void shuffle(std::vector<int>& order, uint64_t& rng) {  // Fisher-Yates
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix64(rng) % i]);
}

void prepare(Worker& w, const KernelLaunch& launch, const Options& options) {
  w.launch = &launch;
  w.options = options;
  w.size = static_cast<int>(launch.block.x * launch.block.y * launch.block.z);
  w.alive = w.size;
  w.exited = w.barrier_arrived = w.barrier_predicates = 0;
  if (w.stack_bytes != options.stack_bytes) w.stacks.clear();
  w.stack_bytes = options.stack_bytes;
  while (static_cast<int>(w.stacks.size()) < w.size) w.stacks.push_back(std::make_unique<FiberStack>(w.stack_bytes));
  w.threads.assign(w.size, Thread{});
  for (int i = 0; i < w.size; ++i) {
    w.threads[i].context = w.stacks[i]->make_context(thread_main);
    w.threads[i].index = thread_index(i, launch.block);
  }
  w.warp_waiting.assign((w.size + warpSize - 1) / warpSize, 0u);
  w.order.resize(w.size);
  for (int i = 0; i < w.size; ++i) w.order[i] = options.order == Order::kReverse ? w.size - 1 - i : i;
  // Exact size so AddressSanitizer sees overruns; 0xFF bytes are NaN in f32, f16 and bf16.
  if (w.smem == nullptr || w.smem_bytes != launch.smem_bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 128, launch.smem_bytes) != 0)
      fatal("cannot allocate %zu bytes of dynamic shared memory", launch.smem_bytes);
    w.smem.reset(static_cast<unsigned char*>(p));
    w.smem_bytes = launch.smem_bytes;
  }
  std::memset(w.smem.get(), 0xFF, w.smem_bytes);
  // Static shared memory (MINIDL_SHARED) is poisoned when the block first reaches each declaration, which no
  // thread can read before: the same as filling it here, without knowing the sites in advance.
  ++w.block_generation;
  w.static_smem_bytes = 0;
}

// Aborts if the static shared memory reached so far, `name` (`bytes` more) included, cannot be given to a
// block: more than 48 KiB of it, or more than the kernel's limit together with the dynamic shared memory
// (48 KiB, or the opt-in maximum once cudaFuncSetAttribute raised the kernel's dynamic limit).
void check_static_smem(const Worker& w, const char* name, size_t bytes, const char* file, int line) {
  const size_t total = w.static_smem_bytes, dynamic = w.launch->smem_bytes;
  if (total > kMaxStaticSmem)
    fatal("static shared memory over %zu bytes in %s: %s (%zu bytes) at %s:%d brings it to %zu bytes", kMaxStaticSmem,
          block_name(w).c_str(), name, bytes, file, line, total);
  if (total + dynamic <= kDefaultDynamicSmem) return;
  const size_t limit =
      max_dynamic_smem(w.launch->kernel) > kDefaultDynamicSmem ? kMaxDynamicSmemOptin : kDefaultDynamicSmem;
  if (total + dynamic > limit)
    fatal(
        "shared memory over %zu bytes in %s: %s (%zu bytes) at %s:%d brings the static part to %zu bytes, "
        "plus %zu dynamic",
        limit, block_name(w).c_str(), name, bytes, file, line, total, dynamic);
}

}  // namespace

void run_block(const KernelLaunch& launch, uint64_t block_index, const Options& options) {
  Worker& w = worker;
  prepare(w, launch, options);
  const uint64_t gx = launch.grid.x, gy = launch.grid.y;
  blockIdx = {static_cast<unsigned>(block_index % gx), static_cast<unsigned>(block_index / gx % gy),
              static_cast<unsigned>(block_index / (gx * gy))};
  blockDim = launch.block;
  gridDim = launch.grid;
  check_block_begin(launch, options, blockIdx, w.size, w.smem.get(), w.smem_bytes);
  uint64_t rng = options.seed * 0x9E3779B97F4A7C15ull + block_index;  // the same for a block on any worker
  while (w.alive > 0) {
    if (options.order == Order::kRandom) shuffle(w.order, rng);
    bool progressed = false;
    for (const int i : w.order) {
      if (w.threads[i].state != State::kRunnable) continue;
      w.current = i;
      threadIdx = w.threads[i].index;
      check_thread(i, w.stacks[i]->bottom(), w.stacks[i]->size());
      w.threads[i].context = resume_fiber(w.threads[i].context, *w.stacks[i], w.threads[i].switches, nullptr);
      progressed = true;
    }
    if (!progressed) report_deadlock(w);
  }
  check_block_end();
  w.current = -1;
  w.launch = nullptr;
}

bool inside_kernel() { return worker.launch != nullptr; }

uint3 thread_index(int i, const dim3& block) {
  const unsigned u = static_cast<unsigned>(i);
  return {u % block.x, u / block.x % block.y, u / (block.x * block.y)};
}

unsigned char* dynamic_smem_base() { return running_worker("dynamic_smem").smem.get(); }

StaticSmemSite::~StaticSmemSite() { std::free(data); }

unsigned char* static_smem(StaticSmemSite& site, size_t bytes, size_t alignment, const char* name, const char* file,
                           int line) {
  Worker& w = running_worker("MINIDL_SHARED");
  if (site.block == w.block_generation) return site.data;  // another thread of this block got here first
  w.static_smem_bytes += bytes;
  check_static_smem(w, name, bytes, file, line);
  if (site.data == nullptr) {
    void* p = nullptr;
    if (posix_memalign(&p, std::max<size_t>(alignment, 16), bytes) != 0)
      fatal("cannot allocate %zu bytes of static shared memory for %s at %s:%d", bytes, name, file, line);
    site.data = static_cast<unsigned char*>(p);
  }
  std::memset(site.data, 0xFF, bytes);  // NaN in f32, f16 and bf16
  site.block = w.block_generation;
  check_static_smem(site.data, bytes, name);
  return site.data;
}

int block_barrier(BarrierOp op, int predicate, const std::source_location& site) {
  Worker& w = running_worker(barrier_name(op));
  Thread& self = w.threads[w.current];
  self.state = State::kAtBarrier;
  self.site = site;
  self.barrier_op = op;
  self.predicate = predicate != 0;
  ++w.barrier_arrived;
  w.barrier_predicates += self.predicate;
  if (!try_complete_barrier(w)) wait_until_released(w, self);
  return self.barrier_result;
}

namespace {

uint64_t arrive_at_collective(WarpOp op, const WarpExchange* exchange, unsigned mask, uint64_t value, int param,
                              int width, const std::source_location& site) {
  const char* name = exchange != nullptr ? exchange->name : warp_name(op);
  Worker& w = running_worker(name);
  const int lane = w.current % warpSize, warp = w.current / warpSize;
  Thread& self = w.threads[w.current];
  if (!(mask >> lane & 1))
    fatal("%s at %s: thread %d calls it with mask 0x%08x, which leaves out its own lane %d", name, where(site).c_str(),
          w.current, mask, lane);
  if (width < 1 || width > warpSize || (width & (width - 1)) != 0)
    fatal("%s at %s: width %d is not a power of two in [1, 32]", name, where(site).c_str(), width);
  self.state = State::kInWarpOp;
  self.site = site;
  self.warp_op = op;
  self.exchange = exchange;
  self.mask = mask;
  self.value = value;
  self.param = param;
  self.width = width;
  w.warp_waiting[warp] |= 1u << lane;
  if (!try_complete_warp(w, warp, mask)) wait_until_released(w, self);
  return self.result;
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width,
                         const std::source_location& site) {
  return arrive_at_collective(op, nullptr, mask, value, param, width, site);
}

void warp_exchange(const WarpExchange& exchange, unsigned mask, void* lane_data, const std::source_location& site) {
  arrive_at_collective(WarpOp::kExchange, &exchange, mask,
                       static_cast<uint64_t>(reinterpret_cast<uintptr_t>(lane_data)), 0, warpSize, site);
}

AsyncCopies& async_copies_of_current_thread() {
  Worker& w = running_worker("cp.async");
  return w.threads[w.current].async_copies;
}

unsigned live_lanes_of_current_warp() {
  const Worker& w = running_worker("__activemask");
  const int warp = w.current / warpSize;
  return existing_lanes(w, warp) & ~exited_lanes(w, warp);
}

void fatal(const char* format, ...) {
  std::fflush(stdout);
  std::fputs("cuda_emu: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::abort();
}

}  // namespace minidl::emu::detail
