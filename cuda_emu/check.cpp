// initcheck, memcheck and racecheck for emulated kernels (design in check.h): the runtime that GCC's
// -fsanitize=kernel-address instrumentation calls, the shadow of device allocations, and the reports.
#include "cuda_emu/check.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <elf.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"

namespace minidl::emu {

bool checks_compiled() { return MINIDL_EMU_CHECKS_COMPILED != 0; }

namespace detail {
namespace {

// Shadow states of a byte of device memory.
enum : uint8_t { kNoAccess = 0, kFreed = 1, kUnwritten = 2, kWritten = 3 };
constexpr unsigned char kPoison = 0xFF;
constexpr size_t kRedzone = 256;
constexpr size_t kQuarantineBytes = size_t{64} << 20;

// One cudaMalloc: `size` bytes asked for, followed by a red zone.
struct Extent {
  uintptr_t base = 0;
  size_t size = 0;
  std::unique_ptr<uint8_t[]> state;  // size + kRedzone bytes
  bool freed = false;
  size_t block_bytes = 0;   // > 0: the caching allocator handed out this many of its bytes (for reports)
  bool graph_pool = false;  // joined a CUDA graph's pool (for good): its captured kernels use it after any free
  size_t span() const { return size + kRedzone; }
};

// The registry's structure changes only under the unique lock; a launch holds it shared from start to end, so
// the workers read extents without locking (their shadow bytes are plain bytes: two blocks marking one byte
// written store the same value).
struct Registry {
  std::shared_mutex mutex;
  std::map<uintptr_t, std::unique_ptr<Extent>> extents;  // by base
  std::deque<Extent*> quarantine;                        // freed, oldest first
  size_t quarantined = 0;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: device memory may be freed during static destruction
  return *r;
}

Extent* find_locked(Registry& r, uintptr_t a) {
  auto it = r.extents.upper_bound(a);
  if (it == r.extents.begin()) return nullptr;
  --it;
  Extent* e = it->second.get();
  return a < e->base + e->span() ? e : nullptr;
}

// Whether any allocation (or its red zone) has a byte in page `page`.
bool touches_page(Registry& r, uintptr_t page) {
  const uintptr_t lo = page << 12, hi = lo + 4096;
  auto it = r.extents.lower_bound(lo);
  if (it != r.extents.end() && it->first < hi) return true;
  return find_locked(r, lo) != nullptr;
}

std::atomic<uint64_t> next_epoch{1};

// The host frames of the launch running now (launches are serialised: grid.cpp), for reports.
void* launch_frame_buffer[24];
int launch_frame_count = 0;

// ---- per-block state ----

// One byte of shared memory: who wrote and read it in this barrier interval (epochs and block ids are kept to 32
// bits: they would have to wrap around within one block to be confused). The access sites sit in arrays of their
// own, and whether this block wrote the byte in another, so that the cells stay small.
struct SmemCell {
  uint32_t write_epoch = 0, read_epoch = 0;
  int16_t writer = -1, reader = -1;
  uint32_t writer_sync = 0, reader_sync = 0;  // the warp's collectives completed when the access happened
  int8_t readers_warp = -1;                   // the warp of every reader this interval, -2 when several
  bool many_readers = false;                  // unordered readers besides `reader`
};

struct SmemRange {
  uintptr_t lo = 0, hi = 0;
  std::string name;
  std::vector<uint32_t> written_block;  // per byte: the block that last wrote it
  std::vector<SmemCell> cells;
  std::vector<const void*> write_pc, read_pc;
};

// One 4-byte granule of global memory written in this interval, byte by byte (an open-addressing table whose
// slots from older intervals count as empty, so nothing is cleared at a barrier).
struct GlobalWrite {
  uint64_t epoch = 0;
  uintptr_t granule = 0;
  const void* pc[4] = {};
  int32_t writer[4] = {-1, -1, -1, -1};
  uint32_t sync[4] = {};
};

struct BlockCheck {
  unsigned checks = 0;
  const KernelLaunch* launch = nullptr;
  uint3 block = {};
  uint64_t block_id = 0, epoch = 0;
  int thread = 0;
  uint3 thread_index = {};
  uintptr_t stack_lo = 0, stack_hi = 0;
  std::vector<uint32_t> warp_syncs;
  SmemRange dynamic;
  std::map<const void*, SmemRange> statics;  // kept across blocks: the cells are reused
  std::vector<SmemRange*> smem;              // the ranges of the running block
  std::vector<GlobalWrite> writes;           // power-of-two slots
  size_t writes_now = 0;                     // used this interval
  Extent* last = nullptr;                    // the extent of the previous global access
  uintptr_t last_miss_page = 0;              // a page of host memory (thread-locals: threadIdx) seen last
};

thread_local BlockCheck* current = nullptr;  // non-null while this worker runs a block with checkers on
thread_local BlockCheck worker_check;

// ---- reports ----

std::string hex(uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, a);
  return buf;
}

// "function at file:line" for a code address, from addr2line on the module's line tables; the address alone when
// that fails. `return_address`: pc follows a call, so the call's line is that of pc - 1.
std::string symbolize(const void* pc, bool return_address) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(pc) - (return_address ? 1 : 0);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(p), &info) == 0 || info.dli_fname == nullptr) return hex(p);
  const auto* header = static_cast<const Elf64_Ehdr*>(info.dli_fbase);
  const uintptr_t address = header->e_type == ET_EXEC ? p : p - reinterpret_cast<uintptr_t>(info.dli_fbase);
  std::string module = info.dli_fname;
  if (module.empty() || module.find('\'') != std::string::npos) return hex(p);
  if (header->e_type == ET_EXEC || module.find('/') == std::string::npos) module = "/proc/self/exe";
  const std::string command = "addr2line -C -f -e '" + module + "' " + hex(address) + " 2>/dev/null";
  std::string out;
  if (FILE* f = popen(command.c_str(), "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, f) != nullptr) out += line;
    pclose(f);
  }
  const size_t newline = out.find('\n');
  if (newline == std::string::npos) return hex(p);
  std::string function = out.substr(0, newline), place = out.substr(newline + 1);
  while (!place.empty() && (place.back() == '\n' || place.back() == ' ')) place.pop_back();
  if (const size_t paren = place.find(" (discriminator"); paren != std::string::npos) place.resize(paren);
  place = std::filesystem::path(place).lexically_normal().string();
  if (function == "??") function = hex(p);
  return place.empty() || place.rfind("??", 0) == 0 ? function : function + " at " + place;
}

std::string kernel_name(const BlockCheck& c) {
  std::string s = symbolize(c.launch->kernel, false);
  if (const size_t at = s.find(" at "); at != std::string::npos) s.resize(at);
  return s;
}

std::string triple(uint3 v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", v.x, v.y, v.z);
  return buf;
}

// Prints a report in compute-sanitizer's words and ends the process.
[[noreturn]] void report(const BlockCheck& c, const std::string& title, const std::string& body) {
  std::fflush(stdout);
  std::string host;
  for (int i = 0; i < launch_frame_count; ++i) {
    const std::string frame = symbolize(launch_frame_buffer[i], true);
    if (frame.find("minidl::emu::") != std::string::npos) continue;  // the emulator's own launch frames
    host += "=========         " + frame + "\n";
    if (frame.find(" main ") != std::string::npos || frame.rfind("main", 0) == 0) break;
  }
  std::fprintf(stderr,
               "========= %s\n"
               "=========     in kernel %s\n"
               "%s"
               "=========     Host frames of the launch:\n%s"
               "=========     (cuda_emu checkers: MINIDL_EMU_CHECK=all; see cuda_emu/check.h)\n",
               title.c_str(), kernel_name(c).c_str(), body.c_str(), host.c_str());
  fatal("a checker found an error in a kernel (report above)");
}

std::string line(const std::string& text) { return "=========     " + text + "\n"; }

const char* access_word(bool write) { return write ? "write" : "read"; }

std::string by_thread(const BlockCheck& c, const void* pc) {
  return line("at " + symbolize(pc, true)) +
         line("by thread " + triple(c.thread_index) + " in block " + triple(c.block) + " of grid " +
              triple(c.launch->grid) + " x " + triple(c.launch->block));
}

[[noreturn]] void report_global(const BlockCheck& c, const Extent& e, uintptr_t a, size_t n, bool write, const void* pc,
                                uint8_t state) {
  const size_t asked = e.block_bytes > 0 ? e.block_bytes : e.size;
  const std::string allocation =
      "the allocation at " + hex(e.base) + " of " + std::to_string(asked) + " bytes" +
      (e.block_bytes > 0 ? " (a caching-allocator block of " + std::to_string(e.size) + ")" : "");
  const size_t offset = a - e.base;
  if (state == kUnwritten)
    report(c, "Uninitialized __global__ memory read of size " + std::to_string(n) + " bytes",
           by_thread(c, pc) + line("Address " + hex(a) + " is at offset " + std::to_string(offset) + " of " +
                                   allocation + ", which nothing has written"));
  const std::string where =
      state == kFreed ? "is in " + allocation + ", which was freed (offset " + std::to_string(offset) + ")"
      : offset < asked
          ? "is not addressable (offset " + std::to_string(offset) + " of " + allocation + ")"
          : "is out of bounds: " + std::to_string(offset - asked) + " bytes after the end of " + allocation;
  report(c, std::string("Invalid __global__ ") + access_word(write) + " of size " + std::to_string(n) + " bytes",
         by_thread(c, pc) + line("Address " + hex(a) + " " + where));
}

uint3 index_of(const BlockCheck& c, int thread) { return thread_index(thread, c.launch->block); }

[[noreturn]] void report_race(const BlockCheck& c, const char* space, uintptr_t a, const std::string& region,
                              bool first_write, int first, const void* first_pc, bool second_write,
                              const void* second_pc) {
  const std::string kind = first_write && second_write ? "Write-after-write"
                           : first_write               ? "Read-after-write"
                                                       : "Write-after-read";
  report(c,
         std::string("Error: Race reported between ") + (first_write ? "Write" : "Read") + " access at " +
             symbolize(first_pc, true) + " by thread " + triple(index_of(c, first)) + "\n=========     and " +
             (second_write ? "Write" : "Read") + " access at " + symbolize(second_pc, true) + " by thread " +
             triple(c.thread_index),
         line(kind + " hazard on " + space + " address " + hex(a) + region + " in block " + triple(c.block) +
              ", with no __syncthreads, warp collective or atomic between them"));
}

// ---- the checks ----

bool ordered(const BlockCheck& c, int earlier, uint32_t earlier_sync) {
  if (earlier == c.thread) return true;
  const int warp = c.thread / warpSize;
  return earlier / warpSize == warp && c.warp_syncs[static_cast<size_t>(warp)] > earlier_sync;
}

void shared_access(BlockCheck& c, SmemRange& r, uintptr_t a, size_t n, bool write, const void* pc) {
  const int warp = c.thread / warpSize;
  const uint32_t sync = c.warp_syncs[static_cast<size_t>(warp)];
  const auto block = static_cast<uint32_t>(c.block_id), epoch = static_cast<uint32_t>(c.epoch);
  const auto thread = static_cast<int16_t>(c.thread);
  const size_t first = a - r.lo, last = std::min<size_t>(first + n, r.cells.size());
  if (write) {
    std::fill(r.written_block.begin() + std::ptrdiff_t(first), r.written_block.begin() + std::ptrdiff_t(last), block);
  } else if (c.checks & kInitcheck) {
    for (size_t i = first; i < last; ++i)
      if (r.written_block[i] != block)
        report(c, "Uninitialized __shared__ memory read of size " + std::to_string(n) + " bytes",
               by_thread(c, pc) + line("Address " + hex(a) + " is at offset " + std::to_string(first) + " of " +
                                       r.name + ", which no thread of this block has written"));
  }
  if (!(c.checks & kRacecheck)) return;
  const auto region = [&] { return " (offset " + std::to_string(first) + " of " + r.name + ")"; };
  for (size_t i = first; i < last; ++i) {
    SmemCell& cell = r.cells[i];
    if (cell.write_epoch == epoch && cell.writer != thread && !ordered(c, cell.writer, cell.writer_sync))
      report_race(c, "__shared__", a, region(), true, cell.writer, r.write_pc[i], write, pc);
    if (write) {
      if (cell.read_epoch == epoch) {
        const bool readers_ordered = cell.many_readers ? cell.readers_warp == warp && sync > cell.reader_sync
                                                       : ordered(c, cell.reader, cell.reader_sync);
        if (!readers_ordered) report_race(c, "__shared__", a, region(), false, cell.reader, r.read_pc[i], true, pc);
      }
      cell.write_epoch = epoch;
      cell.writer = thread;
      cell.writer_sync = sync;
      r.write_pc[i] = pc;
    } else if (cell.read_epoch != epoch || ordered(c, cell.reader, cell.reader_sync)) {
      if (cell.read_epoch != epoch || cell.readers_warp != warp) cell.many_readers = false;
      cell.read_epoch = epoch;
      cell.reader = thread;
      cell.reader_sync = sync;
      cell.readers_warp = static_cast<int8_t>(warp);
      r.read_pc[i] = pc;
    } else {  // another reader not ordered after the last: keep the earliest stamp for the ordering test
      cell.many_readers = true;
      if (cell.readers_warp != warp) cell.readers_warp = -2;
      cell.reader_sync = std::min(cell.reader_sync, sync);
    }
  }
}

GlobalWrite* global_slot(BlockCheck& c, uintptr_t granule, bool insert) {
  if (insert && (c.writes_now + 1) * 2 > c.writes.size()) {  // grow, keeping this interval's entries
    std::vector<GlobalWrite> old(std::max<size_t>(c.writes.size() * 2, 4096));
    old.swap(c.writes);
    c.writes_now = 0;
    for (const GlobalWrite& w : old)
      if (w.epoch == c.epoch) *global_slot(c, w.granule, true) = w;
  }
  if (c.writes.empty()) return nullptr;
  const size_t mask = c.writes.size() - 1;
  for (size_t i = (granule * 0x9E3779B97F4A7C15ull >> 20) & mask;; i = (i + 1) & mask) {
    GlobalWrite& w = c.writes[i];
    if (w.epoch != c.epoch) {
      if (!insert) return nullptr;
      w = GlobalWrite{c.epoch, granule};
      ++c.writes_now;
      return &w;
    }
    if (w.granule == granule) return &w;
  }
}

void global_race(BlockCheck& c, uintptr_t a, size_t n, bool write, const void* pc) {
  const int warp = c.thread / warpSize;
  for (uintptr_t byte = a; byte < a + n;) {
    GlobalWrite* w = global_slot(c, byte >> 2, write);
    for (const uintptr_t end = std::min(a + n, (byte | 3) + 1); byte < end; ++byte) {
      if (w == nullptr) continue;
      const size_t i = byte & 3;
      if (w->writer[i] >= 0 && !ordered(c, w->writer[i], w->sync[i]))
        report_race(c, "__global__", byte, "", true, w->writer[i], w->pc[i], write, pc);
      if (write) {
        w->writer[i] = c.thread;
        w->sync[i] = c.warp_syncs[static_cast<size_t>(warp)];
        w->pc[i] = pc;
      }
    }
  }
}

void global_access(BlockCheck& c, uintptr_t a, size_t n, bool write, const void* pc) {
  Extent* e = c.last;
  if (e == nullptr || a < e->base || a >= e->base + e->span()) {
    if ((a >> 12) == c.last_miss_page) return;
    e = find_locked(registry(), a);
    if (e == nullptr) {  // host memory: kernel arguments, thread-locals (threadIdx), the emulator's own state
      if (!touches_page(registry(), a >> 12)) c.last_miss_page = a >> 12;
      return;
    }
    c.last = e;
  }
  const size_t first = a - e->base, last = std::min(first + n, e->span());
  uint8_t* state = e->state.get();
  if (c.checks & kMemcheck)
    for (size_t i = first; i < last; ++i)
      if (state[i] < kUnwritten) report_global(c, *e, a + (i - first), n, write, pc, state[i]);
  if (write) {
    for (size_t i = first; i < last; ++i)
      if (state[i] == kUnwritten) state[i] = kWritten;
  } else if (c.checks & kInitcheck) {
    // Host code standing in for a library writes without telling us: an access is unwritten only if its bytes
    // all still hold the poison (judged on the whole access, not byte by byte: another worker may have just
    // marked some of them, and a value's single byte may well be 0xFF).
    bool unwritten = false, poisoned = true;
    const auto* data = reinterpret_cast<const unsigned char*>(e->base);
    for (size_t i = first; i < last; ++i) {
      unwritten |= state[i] == kUnwritten;
      poisoned &= data[i] == kPoison;
    }
    if (unwritten && poisoned) report_global(c, *e, a, n, write, pc, kUnwritten);
    if (unwritten)
      for (size_t i = first; i < last; ++i)
        if (state[i] == kUnwritten) state[i] = kWritten;
  }
  if (c.checks & kRacecheck) global_race(c, a, n, write, pc);
}

void access(uintptr_t a, size_t n, bool write, const void* pc) {
  BlockCheck* c = current;
  if (c == nullptr || n == 0) return;
  if (a >= c->stack_lo && a < c->stack_hi) return;  // the thread's own stack
  for (SmemRange* r : c->smem)
    if (a >= r->lo && a < r->hi) return shared_access(*c, *r, a, n, write, pc);
  global_access(*c, a, n, write, pc);
}

// An atomic: bounds and initialisation as a read (a load) or a read and a write, never a race.
[[maybe_unused]] void check_atomic(const volatile void* address, size_t bytes, bool write, const void* pc) {
  BlockCheck* c = current;
  if (c == nullptr) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  const unsigned saved = c->checks;
  c->checks &= ~kRacecheck;
  access(a, bytes, false, pc);
  if (write) access(a, bytes, true, pc);
  c->checks = saved;
}

void new_interval(BlockCheck& c) {
  c.epoch = next_epoch.fetch_add(1, std::memory_order_relaxed);
  c.writes_now = 0;
}

SmemRange& prepare_range(SmemRange& r, const void* data, size_t bytes, std::string name) {
  r.lo = reinterpret_cast<uintptr_t>(data);
  r.hi = r.lo + bytes;
  r.name = std::move(name);
  if (r.cells.size() != bytes) {
    r.cells.assign(bytes, SmemCell{});
    r.written_block.assign(bytes, 0);
    r.write_pc.assign(bytes, nullptr);
    r.read_pc.assign(bytes, nullptr);
  }
  return r;
}

}  // namespace

// ---- the scheduler's hooks (scheduler.h) ----

void check_block_begin(const KernelLaunch& launch, const Options& options, uint3 block, int threads,
                       unsigned char* dynamic_smem, size_t dynamic_bytes) {
  current = nullptr;
  if (!checks_compiled() || options.checks == 0) return;
  BlockCheck& c = worker_check;
  c.checks = options.checks;
  c.launch = &launch;
  c.block = block;
  c.block_id = next_epoch.fetch_add(1, std::memory_order_relaxed);
  new_interval(c);
  c.warp_syncs.assign(static_cast<size_t>((threads + warpSize - 1) / warpSize), 0);
  c.smem.clear();
  if (dynamic_bytes > 0)
    c.smem.push_back(&prepare_range(c.dynamic, dynamic_smem, dynamic_bytes, "dynamic shared memory"));
  c.last = nullptr;
  c.last_miss_page = 0;
  current = &c;
}

void check_thread(int thread, const void* stack_bottom, size_t stack_bytes) {
  BlockCheck* c = current;
  if (c == nullptr) return;
  c->thread = thread;
  c->thread_index = thread_index(thread, c->launch->block);
  c->stack_lo = reinterpret_cast<uintptr_t>(stack_bottom);
  c->stack_hi = c->stack_lo + stack_bytes;
}

void check_static_smem(const void* data, size_t bytes, const char* name) {
  BlockCheck* c = current;
  if (c == nullptr) return;
  SmemRange& r = c->statics[data];
  if (r.cells.size() != bytes || r.lo != reinterpret_cast<uintptr_t>(data))
    prepare_range(r, data, bytes, std::string("MINIDL_SHARED ") + name);
  c->smem.push_back(&r);
}

void check_barrier() {
  if (current != nullptr) new_interval(*current);
}

void check_warp_synced(int warp) {
  if (current != nullptr) ++current->warp_syncs[static_cast<size_t>(warp)];
}

void check_block_end() { current = nullptr; }

void check_access(const void* address, size_t bytes, bool write, const void* pc) {
  access(reinterpret_cast<uintptr_t>(address), bytes, write, pc);
}

std::shared_mutex& check_launch_mutex() { return registry().mutex; }

void note_launch_frames(const Options& options, const std::vector<void*>* queued) {
  if (queued != nullptr) {
    launch_frame_count = static_cast<int>(std::min<size_t>(queued->size(), 24));
    std::copy_n(queued->begin(), launch_frame_count, launch_frame_buffer);
    return;
  }
  launch_frame_count = checks_compiled() && options.checks != 0 ? backtrace(launch_frame_buffer, 24) : 0;
}

std::shared_ptr<const std::vector<void*>> launch_frames() {
  if (!checks_compiled() || options().checks == 0) return nullptr;
  std::vector<void*> frames(24);
  frames.resize(static_cast<size_t>(backtrace(frames.data(), 24)));
  return std::make_shared<const std::vector<void*>>(std::move(frames));
}

// ---- the runtime's hooks (runtime.cpp) ----

bool check_allocate(void** ptr, size_t size, unsigned checks) {
  if (!checks_compiled() || checks == 0) return false;
  void* p = nullptr;
  if (posix_memalign(&p, 256, size + kRedzone) != 0) return true;  // *ptr stays null: out of memory
  auto e = std::make_unique<Extent>();
  e->base = reinterpret_cast<uintptr_t>(p);
  e->size = size;
  e->state = std::make_unique<uint8_t[]>(e->span());
  std::memset(e->state.get(), kUnwritten, size);
  std::memset(e->state.get() + size, kNoAccess, kRedzone);
  std::memset(p, kPoison, size);  // a GPU's new allocation holds garbage, not zeros
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  r.extents[e->base] = std::move(e);
  *ptr = p;
  return true;
}

int check_release(void* ptr) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  auto it = r.extents.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.extents.end()) return 0;  // not ours
  Extent& e = *it->second;
  if (e.freed) return -1;  // a double free
  e.freed = true;
  std::memset(e.state.get(), kFreed, e.size);
  r.quarantine.push_back(&e);
  r.quarantined += e.size;
  while (r.quarantined > kQuarantineBytes && !r.quarantine.empty()) {
    Extent* old = r.quarantine.front();
    r.quarantine.pop_front();
    r.quarantined -= old->size;
    std::free(reinterpret_cast<void*>(old->base));
    r.extents.erase(old->base);
  }
  return 1;
}

void check_host_write(const void* dst, size_t bytes) {
  if (!checks_compiled() || bytes == 0) return;
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  Extent* e = find_locked(r, a);
  if (e == nullptr) return;
  const size_t first = a - e->base, last = std::min(first + bytes, e->span());
  for (size_t i = first; i < last; ++i)
    if (e->state[i] == kUnwritten) e->state[i] = kWritten;
}

}  // namespace detail

namespace {

void apply_block_allocated(uintptr_t ptr, size_t bytes, size_t capacity, bool exact, unsigned checks) {
  detail::Registry& r = detail::registry();
  std::unique_lock lock(r.mutex);
  detail::Extent* e = detail::find_locked(r, ptr);
  if (e == nullptr || e->base != ptr || e->size != capacity) return;
  e->graph_pool |= !exact;
  exact &= !e->graph_pool;  // a queued hand-out from before a capture took the block: the graph's now
  if (!exact) {             // the whole capacity is addressable for good, with what it holds
    e->block_bytes = capacity;
    for (size_t i = 0; i < capacity; ++i) e->state[i] = std::max<uint8_t>(e->state[i], detail::kUnwritten);
    return;
  }
  const size_t usable = std::min(bytes, capacity);  // a fresh hand-out: nothing in it was written for this tensor
  e->block_bytes = usable;
  std::memset(e->state.get(), detail::kUnwritten, usable);
  if (checks & kInitcheck) std::memset(reinterpret_cast<void*>(ptr), detail::kPoison, usable);
  std::memset(e->state.get() + usable, detail::kNoAccess, capacity - usable);
}

void apply_block_released(uintptr_t ptr, size_t capacity) {
  detail::Registry& r = detail::registry();
  std::unique_lock lock(r.mutex);
  detail::Extent* e = detail::find_locked(r, ptr);
  if (e == nullptr || e->base != ptr || e->size != capacity || e->graph_pool) return;
  std::memset(e->state.get(), detail::kFreed, capacity);
}

}  // namespace

void note_block_allocated(const void* ptr, size_t bytes, size_t capacity, bool exact, cudaStream_t stream) {
  const unsigned checks = options().checks;
  if (!checks_compiled() || checks == 0) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (!exact || is_capturing(stream)) return apply_block_allocated(p, bytes, capacity, false, checks);
  (void)enqueue(stream, [=] {
    apply_block_allocated(p, bytes, capacity, true, checks);
    return cudaSuccess;
  });
}

void note_block_released(const void* ptr, size_t capacity, bool exact, cudaStream_t stream) {
  if (!checks_compiled() || options().checks == 0 || !exact || is_capturing(stream)) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  (void)enqueue(stream, [=] {
    apply_block_released(p, capacity);
    return cudaSuccess;
  });
}

}  // namespace minidl::emu

// ---- the instrumentation's runtime: GCC's -fsanitize=thread calls these for every load, store and atomic of an
// instrumented translation unit (minidl_emu_instrument); the program links no ThreadSanitizer runtime. Compiled
// out under AddressSanitizer and ThreadSanitizer builds, whose kernels are not instrumented this way.
#if MINIDL_EMU_CHECKS_COMPILED
namespace {
using minidl::emu::detail::access;
using minidl::emu::detail::check_atomic;
}  // namespace

extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(uintptr_t a, size_t n) { access(a, n, false, __builtin_return_address(0)); }
void __tsan_write_range(uintptr_t a, size_t n) { access(a, n, true, __builtin_return_address(0)); }

#define MINIDL_EMU_ACCESS(size)                                                                          \
  void __tsan_read##size(uintptr_t a) { access(a, size, false, __builtin_return_address(0)); }           \
  void __tsan_write##size(uintptr_t a) { access(a, size, true, __builtin_return_address(0)); }           \
  void __tsan_unaligned_read##size(uintptr_t a) { access(a, size, false, __builtin_return_address(0)); } \
  void __tsan_unaligned_write##size(uintptr_t a) { access(a, size, true, __builtin_return_address(0)); } \
  void __tsan_volatile_read##size(uintptr_t a) { access(a, size, false, __builtin_return_address(0)); }  \
  void __tsan_volatile_write##size(uintptr_t a) { access(a, size, true, __builtin_return_address(0)); }
MINIDL_EMU_ACCESS(1)
MINIDL_EMU_ACCESS(2)
MINIDL_EMU_ACCESS(4)
MINIDL_EMU_ACCESS(8)
MINIDL_EMU_ACCESS(16)
#undef MINIDL_EMU_ACCESS

// Atomics: done here (sequentially consistent, at least as strong as any order asked for), checked for bounds and
// initialisation, never a race.
#define MINIDL_EMU_ATOMIC(bits, T)                                                                 \
  T __tsan_atomic##bits##_load(const volatile T* a, int) {                                         \
    check_atomic(a, sizeof(T), false, __builtin_return_address(0));                                \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                   \
  }                                                                                                \
  void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                                      \
    check_atomic(a, sizeof(T), true, __builtin_return_address(0));                                 \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                \
  MINIDL_EMU_RMW(bits, T, exchange, __atomic_exchange_n)                                           \
  MINIDL_EMU_RMW(bits, T, fetch_add, __atomic_fetch_add)                                           \
  MINIDL_EMU_RMW(bits, T, fetch_sub, __atomic_fetch_sub)                                           \
  MINIDL_EMU_RMW(bits, T, fetch_and, __atomic_fetch_and)                                           \
  MINIDL_EMU_RMW(bits, T, fetch_or, __atomic_fetch_or)                                             \
  MINIDL_EMU_RMW(bits, T, fetch_xor, __atomic_fetch_xor)                                           \
  MINIDL_EMU_RMW(bits, T, fetch_nand, __atomic_fetch_nand)                                         \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* expected, T v, int, int) {   \
    check_atomic(a, sizeof(T), true, __builtin_return_address(0));                                 \
    return __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  }                                                                                                \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* expected, T v, int, int) {     \
    check_atomic(a, sizeof(T), true, __builtin_return_address(0));                                 \
    return __atomic_compare_exchange_n(a, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }                                                                                                \
  T __tsan_atomic##bits##_compare_exchange_val(volatile T* a, T expected, T v, int, int) {         \
    check_atomic(a, sizeof(T), true, __builtin_return_address(0));                                 \
    __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
    return expected;                                                                               \
  }
#define MINIDL_EMU_RMW(bits, T, op, builtin)                       \
  T __tsan_atomic##bits##_##op(volatile T* a, T v, int) {          \
    check_atomic(a, sizeof(T), true, __builtin_return_address(0)); \
    return builtin(a, v, __ATOMIC_SEQ_CST);                        \
  }
MINIDL_EMU_ATOMIC(8, int8_t)
MINIDL_EMU_ATOMIC(16, int16_t)
MINIDL_EMU_ATOMIC(32, int32_t)
MINIDL_EMU_ATOMIC(64, int64_t)
#undef MINIDL_EMU_RMW
#undef MINIDL_EMU_ATOMIC
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}  // extern "C"
#endif
