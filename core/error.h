// Error handling: two macros with distinct contracts.
//
//   MINIDL_CHECK(cond, ...)   a user mistake (bad shape, bad flag, bad file). Throws minidl::Error whose
//                             message names the place, what was expected and what was given:
//                               MINIDL_CHECK(a.dim() == 2, "matmul: expected a 2-D input, got ", a.shape());
//   MINIDL_ASSERT(cond, ...)  an internal invariant. Failing means a bug in minidl; the message says so.
//
// Library status checks (MINIDL_MPI_CHECK in dist/init.h, MINIDL_CUDA_CHECK in core/cuda/check.h) come from one
// generator, MINIDL_STATUS_CHECK(call, #call, success, thrower): it runs `call` once and hands a status other
// than `success` to a [[noreturn]] thrower(status, "call text", __FILE__, __LINE__) that formats the library's
// error text, the rank (detail::process_rank()) and file:line.
//
// Both are single statements (do { } while (0)) so they compose with if/else.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace minidl {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);

// This process's rank for error messages: set by dist::init(), else read from the launcher's environment
// (OMPI_COMM_WORLD_RANK, PMI_RANK); -1 when the process is not part of a job.
void set_process_rank(int rank);
int process_rank();
}  // namespace detail

}  // namespace minidl

#define MINIDL_CHECK(cond, ...)                                                                 \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::minidl::detail::throw_error(__FILE__, __LINE__, ::minidl::detail::concat(__VA_ARGS__)); \
  } while (0)

#define MINIDL_ASSERT(cond, ...)                                                                 \
  do {                                                                                           \
    if (!(cond)) [[unlikely]]                                                                    \
      ::minidl::detail::throw_internal(__FILE__, __LINE__, #cond,                                \
                                       ::minidl::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// `call_text` is #call taken by the library's own macro, before the call's macros (MPI_COMM_WORLD) expand.
#define MINIDL_STATUS_CHECK(call, call_text, success, thrower) \
  do {                                                         \
    auto minidl_status_ = (call);                              \
    if (minidl_status_ != (success)) [[unlikely]]              \
      thrower(minidl_status_, call_text, __FILE__, __LINE__);  \
  } while (0)
