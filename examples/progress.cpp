#include "examples/progress.h"

#include <unistd.h>

#include <cstdio>

namespace minidl::train {

ProgressLine::ProgressLine(int64_t log_every, bool enabled)
    : enabled_(enabled), tty_(isatty(STDOUT_FILENO)), log_every_(log_every) {}

void ProgressLine::update(int64_t step, int64_t total, const std::string& text) {
  if (!enabled_) return;
  if (tty_) {
    std::printf("\r\033[K%s", text.c_str());
    std::fflush(stdout);
    drawn_ = true;
    last_ = text;
  } else if (step % log_every_ == 0 || step == total || step == 1) {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
}

void ProgressLine::print(const std::string& text) {
  if (!enabled_) return;
  if (tty_ && drawn_) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  if (tty_ && drawn_) std::printf("%s", last_.c_str());
  std::fflush(stdout);
}

void ProgressLine::finish() {
  if (!enabled_) return;
  if (tty_ && drawn_) std::printf("\n");
  drawn_ = false;
  std::fflush(stdout);
}

}  // namespace minidl::train
