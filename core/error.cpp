#include "core/error.h"

#include <atomic>
#include <cstdlib>

namespace minidl::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(msg + " (" + file + ":" + std::to_string(line) + ")");
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(std::string("internal error: ") + cond + " failed at " + file + ":" + std::to_string(line) +
              (msg.empty() ? "" : ": " + msg) + ". This is a bug in minidl; please report it.");
}

namespace {
std::atomic<int> g_rank{-2};  // -2: not set by dist::init()

int rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return -1;
}
}  // namespace

void set_process_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

int process_rank() {
  int r = g_rank.load(std::memory_order_relaxed);
  return r == -2 ? rank_from_environment() : r;
}

}  // namespace minidl::detail
