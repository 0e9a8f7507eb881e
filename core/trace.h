// Traces of a run in the Chrome Trace Event Format (chrome://tracing, https://ui.perfetto.dev): one JSON file per
// rank, the rank as the process id, one track per thread (the main thread, DDP's communication thread, ...).
//
//   trace::start("runs/trace/rank0.json", /*pid=*/rank);   // after a barrier: every rank's clock starts together
//   { trace::Span s("forward m=0 v=0"); ... }                // a complete event ("ph": "X") on this thread's track
//   trace::counter("memory MiB", {{"params", 3.1}, {"activations", 27.5}});   // a counter track ("ph": "C")
//   trace::finish();                                         // writes the file
//
// Off (no start), a Span costs one relaxed atomic load. Events are kept in memory until finish(): a long run at a
// fine granularity grows (about 100 bytes an event).
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

// Names this thread's track ("main", "comm", ...); a thread without a name is "thread N".
void name_thread(const std::string& name);

class Span {
 public:
  explicit Span(std::string name);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  double start_us_ = -1;  // -1: not recording
};

void counter(const std::string& name, std::initializer_list<std::pair<const char*, double>> values);

}  // namespace minidl::trace
