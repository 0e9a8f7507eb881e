// The flight recorder and the watchdog: no silent hangs.
//
// Every collective and point-to-point call of every process group (the one dispatch point: ProcessGroup's public
// methods) gets a per-group sequence number and an entry in this process's flight recorder, a ring of the last
// N calls (default 2,000): group, sequence, op, dtype, count, peer or root, reduce op, enqueue and completion
// times, state. A watchdog thread polls it:
//
//   dist::start_watchdog({.timeout_s = 600, .debug_dir = "/tmp/minidl-debug"});   // dist::init does it from the
//                                                                                   // environment (below)
//
// When a call has not completed within the timeout, the watchdog writes this rank's recorder as JSON
// (DEBUG_DIR/flight-rank<R>.json), names the group, the sequence number, the op and the ranks of the group that
// have not joined it — read from the progress files every rank's watchdog rewrites each second
// (DEBUG_DIR/progress-rank<R>.json: per group, the last sequence number called and completed; a stopped rank's
// file stops changing) — waits a moment for the other ranks' dumps, and ends the job with MPI_Abort and exit code
// kCollectiveTimeoutExit. scripts/flight_recorder.py reads the dumps and says the same from all of them.
//
// Environment (every program, read by dist::init): MINIDL_COLLECTIVE_TIMEOUT (seconds; 0 turns the watchdog off;
// default 600), MINIDL_DEBUG_DIR (default: $TMPDIR or /tmp, then minidl-<job id>: a directory every rank of the job
// can read, so on several hosts point it at a shared file system), MINIDL_FLIGHT_RECORDER_SIZE (default 2000; 0
// records nothing, and the watchdog then has nothing to watch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace minidl::dist {

class ProcessGroup;

// The exit code of a job the watchdog ended.
constexpr int kCollectiveTimeoutExit = 3;

struct FlightEntry {
  std::string group;  // the group's label ("dp", "tp", "pp", "world", ...)
  int64_t seq = 0;    // per group, from 1: collectives and point-to-point calls (send, recv) count apart
  std::string op;     // "all_reduce", "send", ...
  DType dtype = DType::f32;
  int64_t count = 0;                        // elements
  int peer = -1;                            // root (broadcast) or peer (send/recv), in the group's ranks; -1: none
  std::string reduce_op;                    // "sum", "avg", "max" or empty
  double enqueued_s = 0, completed_s = -1;  // seconds since the recorder started; -1: not completed
  enum class State { kEnqueued, kCompleted, kFailed, kDropped } state = State::kEnqueued;
  std::string site;  // the call site's label (CallSite), or empty
};

// Labels the calls this thread makes while it lives ("ddp bucket 3", "pipeline send m=2 v=0", ...): what a flight
// record says about where a call came from. Nested sites replace the outer one until they end.
class CallSite {
 public:
  explicit CallSite(std::string label);
  ~CallSite();
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

 private:
  std::string previous_;
};
const char* state_name(FlightEntry::State s);

struct WatchdogOptions {
  double timeout_s = 600;  // 0: no watchdog
  std::string debug_dir;   // empty: the default above
  int64_t entries = 2000;  // the ring's size; 0: no recording
};

// Records a call of `group` (its label and world ranks come from the group) and returns its entry's id. Called by
// ProcessGroup's public methods before the backend runs, so a call that blocks is already on record.
int64_t record_call(ProcessGroup& group, const char* op, DType dtype, int64_t count, int peer, const char* reduce_op);
// An asynchronous error source the watchdog polls once a tick (NCCL's ncclCommGetAsyncError), registered while this
// lives. `poll` returns the error as text, or empty. The destructor waits for a poll in progress, so a group
// destroys its watch first, before tearing down what `poll` reads (ProcessGroup::watch_async_errors).
class AsyncErrorWatch {
 public:
  AsyncErrorWatch(std::string group_label, std::function<std::string()> poll);
  ~AsyncErrorWatch();
  AsyncErrorWatch(const AsyncErrorWatch&) = delete;
  AsyncErrorWatch& operator=(const AsyncErrorWatch&) = delete;

  const std::string label;
  const std::function<std::string()> poll;
};

// The call `id` completed (or failed, or its Work was dropped without a wait).
void record_done(int64_t id, FlightEntry::State state = FlightEntry::State::kCompleted);
// The recorder's entries, oldest first.
std::vector<FlightEntry> flight_entries();
// Writes this rank's recorder as JSON to `path` (atomically); returns the path.
std::string dump_flight_recorder(const std::string& path);

// Starts (or reconfigures) the watchdog thread; timeout_s 0 stops it. Every rank of the job should use the same
// options. `world_rank` is this process's rank in MPI_COMM_WORLD.
void start_watchdog(const WatchdogOptions& options, int world_rank);
void stop_watchdog();
// The options in force (the default debug directory resolved).
WatchdogOptions watchdog_options();
// The options the environment asks for (MINIDL_COLLECTIVE_TIMEOUT, MINIDL_DEBUG_DIR, MINIDL_FLIGHT_RECORDER_SIZE);
// `job` names the default debug directory (minidl-<job>). Throws naming the variable for a bad value.
WatchdogOptions watchdog_options_from_environment(const std::string& job);

}  // namespace minidl::dist
