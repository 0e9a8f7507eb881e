#include "train/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "dist/init.h"

namespace minidl::train {

ProgressMode parse_progress_mode(const std::string& name) {
  if (name == "auto") return ProgressMode::kAuto;
  if (name == "redraw") return ProgressMode::kRedraw;
  MINIDL_CHECK(name == "lines", "--progress: expected auto, redraw or lines, got '", name, "'");
  return ProgressMode::kLines;
}

ProgressLine::ProgressLine(ProgressMode mode, int64_t log_every, bool enabled)
    : enabled_(enabled),
      redraw_(mode == ProgressMode::kRedraw ||
              (mode == ProgressMode::kAuto && isatty(STDOUT_FILENO) && !dist::under_mpi_launcher())),
      log_every_(log_every) {}

bool ProgressLine::shows(int64_t step, int64_t total) const {
  return redraw_ || step % log_every_ == 0 || step == total || step == 1;
}

void ProgressLine::update(int64_t step, int64_t total, const std::string& text) {
  if (!enabled_) return;
  if (redraw_) {
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
  if (redraw_ && drawn_) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  if (redraw_ && drawn_) std::printf("%s", last_.c_str());
  std::fflush(stdout);
}

void ProgressLine::finish() {
  if (!enabled_) return;
  if (redraw_ && drawn_) std::printf("\n");
  drawn_ = false;
  std::fflush(stdout);
}

}  // namespace minidl::train
