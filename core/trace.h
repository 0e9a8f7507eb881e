// Traces of a run in the Chrome Trace Event Format (chrome://tracing, https://ui.perfetto.dev): one JSON file per
// rank, the rank as the process id, one track per thread (the main thread, DDP's communication thread, ...).
//
//   trace::start("runs/trace/rank0.json", /*pid=*/rank);   // after a barrier: every rank's clock starts together
//   { trace::Span s("forward m=0 v=0"); ... }                // a complete event ("ph": "X") on this thread's track
//   trace::counter("memory MiB", {{"params", 3.1}, {"activations", 27.5}});   // a counter track ("ph": "C")
//   trace::finish();                                         // writes the file
//
// Off (no start), a Span costs one relaxed atomic load and allocates nothing: name it with a literal, or build a
// computed name only when enabled() (trace::Span s(trace::enabled() ? describe(a) : std::string())). Events are
// kept in memory until finish(): a long run at a fine granularity grows (about 100 bytes an event).
//
// On a device, each span also gets the device's time: what the device's stream did between the span's start and
// end (CUDA events; a backend installs set_device_timer), on a track of its own per stream ("device 0: compute
// stream"), so a reader sees the kernels a forward launched run after the host has moved on. The device's
// intervals are read once the device has passed them: at finish(), and whenever 256 more spans wait to be read than
// the last reading left.
//
// The ranks' clocks are started after a barrier, but a rank may leave it later than another (descheduled on a
// loaded host, or simply later in the barrier's tree): each rank's offset from rank 0's clock is measured where
// MPI is (dist/clock_sync.h) and handed to set_clock_offset(); scripts/merge_traces.py adds it to the rank's
// timestamps.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

namespace minidl::trace {

bool enabled();
// Starts recording for this process; timestamps count from now (microseconds).
void start(const std::string& path, int pid);
// Writes the events recorded so far to the path given to start() and stops recording; returns the path ("" when
// nothing was recorded).
std::string finish();

// The trace's clock: microseconds since start() (what the events' "ts" count).
double now_us();
// Records that this process's clock reads `offset_us` behind rank 0's (rank 0's time = ts + offset_us), measured
// to within +-`uncertainty_us`; written in the file's "otherData" as clock_offset_us and clock_uncertainty_us.
void set_clock_offset(double offset_us, double uncertainty_us);

// Names this thread's track ("main", "comm", ...); a thread without a name is "thread N".
void name_thread(const std::string& name);

class Span {
 public:
  explicit Span(const char* name);  // copied only while tracing
  explicit Span(std::string name);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin();
  std::string name_;
  double start_us_ = -1;  // -1: not recording
  bool pushed_ = false;   // a range hook's push ran
  void* mark_ = nullptr;  // the device timer's mark of its start
};

void counter(const std::string& name, std::initializer_list<std::pair<const char*, double>> values);

// What a device backend installs so that every span recorded is also a range of the device profiler's timeline
// (NVTX on CUDA: core/cuda/trace_hooks.cpp). push runs where a span starts, pop where it ends, on its thread;
// spans are not recorded, and nothing is pushed, while tracing is off. Null hooks (the default) push nothing.
struct RangeHooks {
  void (*push)(const char* name) = nullptr;
  void (*pop)() = nullptr;
};
void set_range_hooks(RangeHooks hooks);

// What a device backend installs so that each span recorded also gets the device's time
// (CUDA events on CUDA: core/cuda/trace_hooks.cpp). All four are called only while tracing is on.
struct DeviceTimer {
  // Marks where a span starts on the device stream this thread queues its work on; null when it has none (a thread
  // that set_device_timing(false), a stream being captured into a graph). `thread_timed`: this thread's setting.
  void* (*begin)(bool thread_timed) = nullptr;
  // Marks where the span ends, on the same stream.
  void (*end)(void* mark) = nullptr;
  // The span's interval on the device, on the trace's clock (microseconds since start()), and the name of its
  // stream's track: true, and the mark released, once the device has passed its end (waiting for that if `wait`);
  // false while it has not.
  bool (*read)(void* mark, bool wait, double* start_us, double* end_us, const char** track) = nullptr;
  // A trace starts: the device clock is referred to the new start at the next mark.
  void (*restart)() = nullptr;
};
void set_device_timer(DeviceTimer timer);

// Whether this thread's spans are timed on the device (on by default). A thread that only waits and launches on
// another stream turns it off: DDP's communication thread, whose collectives the backend times on their own stream.
void set_device_timing(bool on);

// Reads the device intervals of the spans the device has finished, waiting for the rest if `wait` (finish() does).
void collect_device_spans(bool wait);

}  // namespace minidl::trace
