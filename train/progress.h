// The live progress line of a training run: redrawn in place (`\r` + erase line) on an interactive terminal, one
// plain line every `log_every` steps otherwise.
//
//   train::ProgressLine progress(train::parse_progress_mode("auto"), /*log_every=*/10, /*enabled=*/is_logger);
//   progress.update(step, total, "step 5/100 | loss 2.31 | ...");
//   progress.print("step 250: val_loss 1.95");   // a line that stays
//   progress.finish();
//
// kAuto redraws only when stdout is a terminal *and* the process was not started by an MPI launcher: Open MPI
// gives every rank a pseudo-terminal, so under `mpirun ... > log` isatty() says yes and a redrawing log would be
// one long line of `\r` and escape codes.
#pragma once

#include <cstdint>
#include <string>

namespace minidl::train {

enum class ProgressMode { kAuto, kRedraw, kLines };
// "auto", "redraw", "lines"; anything else is an error listing them.
ProgressMode parse_progress_mode(const std::string& name);

class ProgressLine {
 public:
  // enabled = false prints nothing (every rank but the one that logs).
  ProgressLine(ProgressMode mode, int64_t log_every, bool enabled = true);
  // Shows `text` as the progress of `step` (1-based).
  void update(int64_t step, int64_t total, const std::string& text);
  // Prints a line that stays (evaluations, messages), keeping the progress line below it when redrawing.
  void print(const std::string& text);
  // Ends the progress line (before the summary).
  void finish();
  bool redraws() const { return redraw_; }
  // Whether update(step, total, ...) shows a line, on any rank (the same answer on every rank of a run).
  bool shows(int64_t step, int64_t total) const;

 private:
  bool enabled_;
  bool redraw_;
  int64_t log_every_;
  bool drawn_ = false;
  std::string last_;
};

}  // namespace minidl::train
