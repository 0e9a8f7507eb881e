// The live progress line of a training run: redrawn in place on a terminal, one plain line every
// `log_every` steps when the output is a file or a pipe.
#pragma once

#include <cstdint>
#include <string>

namespace minidl::train {

class ProgressLine {
 public:
  // enabled = false prints nothing (ranks other than 0).
  explicit ProgressLine(int64_t log_every, bool enabled = true);
  // Shows `text` as the progress of `step` (1-based).
  void update(int64_t step, int64_t total, const std::string& text);
  // Prints a line that stays (evaluations, messages), keeping the progress line below it on a terminal.
  void print(const std::string& text);
  // Ends the progress line (before the summary).
  void finish();

 private:
  bool enabled_;
  bool tty_;
  int64_t log_every_;
  bool drawn_ = false;
  std::string last_;
};

}  // namespace minidl::train
