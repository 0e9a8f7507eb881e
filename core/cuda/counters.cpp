// The backend's counters (contract in core/cuda/cuda.h): relaxed atomics, since they are statistics read between
// steps, not a way to order work.
#include <atomic>

#include "core/cuda/cuda.h"
#include "cuda_emu/launch_count.h"

namespace minidl::cuda {

namespace {

struct AtomicCounters {
  std::atomic<int64_t> library_launches{0}, memsets{0}, host_syncs{0};
  std::atomic<int64_t> h2d_copies{0}, h2d_bytes{0}, d2h_copies{0}, d2h_bytes{0}, d2d_copies{0}, d2d_bytes{0};
  std::atomic<int64_t> device_mallocs{0}, device_frees{0}, graph_launches{0};
};

AtomicCounters& totals() {
  static AtomicCounters* t = new AtomicCounters;  // never destroyed: tensors may be freed during static destruction
  return *t;
}

void add(std::atomic<int64_t>& counter, int64_t n = 1) { counter.fetch_add(n, std::memory_order_relaxed); }
int64_t get(const std::atomic<int64_t>& counter) { return counter.load(std::memory_order_relaxed); }

}  // namespace

namespace detail {
void count_library_launch() { add(totals().library_launches); }
void count_memset() { add(totals().memsets); }
void count_host_sync() { add(totals().host_syncs); }
void count_device_malloc() { add(totals().device_mallocs); }
void count_device_free() { add(totals().device_frees); }
void count_graph_launch() { add(totals().graph_launches); }

void count_copy(cudaMemcpyKind kind, size_t bytes) {
  AtomicCounters& t = totals();
  if (kind == cudaMemcpyHostToDevice) {
    add(t.h2d_copies), add(t.h2d_bytes, int64_t(bytes));
  } else if (kind == cudaMemcpyDeviceToHost) {
    add(t.d2h_copies), add(t.d2h_bytes, int64_t(bytes));
  } else {
    add(t.d2d_copies), add(t.d2d_bytes, int64_t(bytes));
  }
}
}  // namespace detail

Counters counters() {
  const AtomicCounters& t = totals();
  Counters c;
  c.kernel_launches = minidl_kernel_launches().load(std::memory_order_relaxed) + get(t.library_launches);
  c.memsets = get(t.memsets);
  c.host_syncs = get(t.host_syncs);
  c.h2d_copies = get(t.h2d_copies), c.h2d_bytes = get(t.h2d_bytes);
  c.d2h_copies = get(t.d2h_copies), c.d2h_bytes = get(t.d2h_bytes);
  c.d2d_copies = get(t.d2d_copies), c.d2d_bytes = get(t.d2d_bytes);
  c.device_mallocs = get(t.device_mallocs), c.device_frees = get(t.device_frees);
  c.graph_launches = get(t.graph_launches);
  return c;
}

void reset_counters() {
  AtomicCounters& t = totals();
  minidl_kernel_launches().store(0, std::memory_order_relaxed);
  for (std::atomic<int64_t>* c :
       {&t.library_launches, &t.memsets, &t.host_syncs, &t.h2d_copies, &t.h2d_bytes, &t.d2h_copies, &t.d2h_bytes,
        &t.d2d_copies, &t.d2d_bytes, &t.device_mallocs, &t.device_frees, &t.graph_launches})
    c->store(0, std::memory_order_relaxed);
}

Counters operator-(const Counters& a, const Counters& b) {
  Counters d;
  d.kernel_launches = a.kernel_launches - b.kernel_launches;
  d.memsets = a.memsets - b.memsets;
  d.host_syncs = a.host_syncs - b.host_syncs;
  d.h2d_copies = a.h2d_copies - b.h2d_copies, d.h2d_bytes = a.h2d_bytes - b.h2d_bytes;
  d.d2h_copies = a.d2h_copies - b.d2h_copies, d.d2h_bytes = a.d2h_bytes - b.d2h_bytes;
  d.d2d_copies = a.d2d_copies - b.d2d_copies, d.d2d_bytes = a.d2d_bytes - b.d2d_bytes;
  d.device_mallocs = a.device_mallocs - b.device_mallocs, d.device_frees = a.device_frees - b.device_frees;
  d.graph_launches = a.graph_launches - b.graph_launches;
  return d;
}

}  // namespace minidl::cuda
