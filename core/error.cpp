#include "core/error.h"

namespace minidl::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(msg + " (" + file + ":" + std::to_string(line) + ")");
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(std::string("internal error: ") + cond + " failed at " + file + ":" + std::to_string(line) +
              (msg.empty() ? "" : ": " + msg) + ". This is a bug in minidl; please report it.");
}

}  // namespace minidl::detail
