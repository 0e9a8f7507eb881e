// The C++ side of an exercise's grader (scripts/minidl-exercise check, scripts/exercise_grader.py): a program of
// criteria, one run per process, under mpiexec.
//
//   int main(int argc, char** argv) {
//     return minidl::exercises::run_grader(argc, argv, {
//         {"reduce_scatter", "rank r's chunk r is the sum of every rank's", {2, 3, 4}, 5, [](Run& run) { ... }},
//     });
//   }
//   grade_ring --list                         # one line per criterion: id, ranks, repeats, given, what
//   mpiexec -n 3 grade_ring --criterion reduce_scatter
//
// A criterion throws Failure with its diagnosis (the broken invariant and its likely cause) or returns. Each rank
// prints one line "[rank R] RESULT passed" or "[rank R] RESULT failed: <why>"; a rank that fails ends the job at
// once (MPI_Abort), so no rank waits in a collective that the failed one never joins. A NotImplementedError (an
// untouched MINIDL_TODO) is reported as "not written yet", naming the exercise's function. The learner's code runs on
// groups labelled "exercise"; the grader's own checks use a group of their own ("grader"), so they never shift the
// learner's call sequence that the flight recorder and a hang report name.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/exercise.h"
#include "dist/flight_recorder.h"
#include "dist/init.h"
#include "dist/process_group.h"

namespace minidl::exercises {

// A broken invariant: the message is the diagnosis the grader shows.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Failure(detail::concat(args...));
}

// What a criterion gets: the world, a fresh group for the learner's code and one for the grader's checks.
struct Run {
  const dist::Context& ctx;
  std::unique_ptr<dist::ProcessGroup> exercise, grader;
  int rank() const { return ctx.rank(); }
  int size() const { return ctx.world_size(); }
  int64_t p2p_before = 0;  // the recorder's "exercise" send/recv entries from earlier runs (earlier groups)
  // The learner's point-to-point calls on this run's group so far: the flight recorder's sequence number of its
  // last one (the runner sets MINIDL_FLIGHT_RECORDER_SIZE large enough to keep every entry).
  int64_t p2p_calls() const { return all_p2p_calls() - p2p_before; }
  static int64_t all_p2p_calls() {
    int64_t n = 0;
    for (const dist::FlightEntry& e : dist::flight_entries())
      if (e.group == "exercise" && (e.op == "send" || e.op == "recv")) ++n;
    return n;
  }
  // Announces a call into the learner's code, so that a hang inside it can be placed (scripts/exercise_grader.py
  // reads these lines with the watchdog's).
  void calling(const std::string& what, int64_t numel) const {
    std::printf("[rank %d] CALL %s numel=%lld p2p_base=%lld\n", rank(), what.c_str(), (long long)numel,
                (long long)p2p_calls());
    std::fflush(stdout);
  }
  // True on every rank when it is on any (the grader group's all-reduce of a flag).
  bool any(bool flag) const {
    int mine = flag, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MAX, ctx.world());
    return all != 0;
  }
};

// The learner's calls (group "exercise") among entries [from, end) of the flight recorder, each a ring's: a send to
// the right neighbour or a receive from the left one, nothing of the library's collectives. Fails naming the first
// that is not.
inline std::vector<dist::FlightEntry> ring_calls_since(size_t from, int rank, int n) {
  std::vector<dist::FlightEntry> out;
  const std::vector<dist::FlightEntry> all = dist::flight_entries();
  for (size_t i = from; i < all.size(); ++i) {
    const dist::FlightEntry& e = all[i];
    if (e.group != "exercise") continue;
    if (e.op != "send" && e.op != "recv")
      fail("rank ", rank, " called the library's ", e.op, ": write the ring over send and recv only");
    if (e.op == "send" && e.peer != (rank + 1) % n)
      fail("rank ", rank, " sent to rank ", e.peer, ": a ring sends only to its right neighbour ", (rank + 1) % n);
    if (e.op == "recv" && e.peer != (rank + n - 1) % n)
      fail("rank ", rank, " received from rank ", e.peer, ": a ring receives only from its left neighbour ",
           (rank + n - 1) % n);
    out.push_back(e);
  }
  return out;
}

struct Criterion {
  std::string id, what;
  std::vector<int> ranks;  // the world sizes it runs at
  int repeats;             // in one process, fresh groups each time: 5 for correctness, against races
  std::function<void(Run&)> run;
  // Regions this criterion does not grade, taken from the reference ("ddp.h:1": the first region of ddp.h), so that
  // a bug (or a gap) there does not fail it too. The grader builds one variant of the learner's files per set.
  std::vector<std::string> given = {};
};

inline void report(int rank, const std::string& why) {
  std::string line = why;
  for (char& c : line)
    if (c == '\n') c = ' ';
  std::printf("[rank %d] RESULT failed: %s\n", rank, line.c_str());
  std::fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

inline int run_grader(int argc, char** argv, const std::vector<Criterion>& criteria) {
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const Criterion& c : criteria) {
      std::string ranks;
      for (int n : c.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(n);
      std::string given;
      for (const std::string& g : c.given) given += (given.empty() ? "" : ",") + g;
      std::printf("%s\t%s\t%d\t%s\t%s\n", c.id.c_str(), ranks.c_str(), c.repeats, given.c_str(), c.what.c_str());
    }
    return 0;
  }
  if (argc != 3 || std::strcmp(argv[1], "--criterion") != 0) {
    std::fprintf(stderr, "%s: expected --list or --criterion ID\n", argv[0]);
    return 2;
  }
  const Criterion* chosen = nullptr;
  for (const Criterion& c : criteria)
    if (c.id == argv[2]) chosen = &c;
  if (!chosen) {
    std::fprintf(stderr, "%s: no criterion '%s'\n", argv[0], argv[2]);
    return 2;
  }
  auto ctx = dist::init(argc, argv);
  const int rank = ctx.rank();
  for (int i = 0; i < chosen->repeats; ++i) {
    try {
      Run run{ctx, dist::make_process_group("mpi", ctx.world()), dist::make_process_group("mpi", ctx.world())};
      run.exercise->set_label("exercise");
      run.grader->set_label("grader");
      run.p2p_before = Run::all_p2p_calls();
      chosen->run(run);
    } catch (const NotImplementedError& e) {
      report(rank, "not written yet: " + e.function + " (MINIDL_TODO: " + e.hint + ")");
    } catch (const Failure& e) {
      report(rank, std::string(e.what()) + (i > 0 ? " (in run " + std::to_string(i + 1) + " of " +
                                                        std::to_string(chosen->repeats) + ": a race?)"
                                                  : ""));
    } catch (const std::exception& e) { report(rank, std::string("an error: ") + e.what()); }
  }
  MPI_Barrier(ctx.world());
  std::printf("[rank %d] RESULT passed\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace minidl::exercises
