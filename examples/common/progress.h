#pragma once
// A live progress line for training loops:
//
//   [fogo s0] epoch 3/10  step 1200/4000  loss 0.4321  acc 87.50%  2310 samples/s  ETA 1m12s
//
// On a terminal the line is redrawn in place (carriage return); otherwise (logs, CI) a full line
// is printed at most every `interval_s` seconds, so log files stay short. Rates and the ETA count
// only the steps taken since this object was made, which keeps them right after a resume.

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>

namespace fogo::trainer {

struct ProgressOptions {
  std::string label;             ///< shown in brackets at the start of the line
  std::string unit = "samples";  ///< what the throughput counts ("tokens", ...)
  double interval_s = -1;        ///< min seconds between redraws; < 0: 0.2 on a tty, 10 otherwise
  int tty = -1;                  ///< 1/0 force redraw-in-place on/off; -1: detect on stderr
};

struct ProgressFields {
  int64_t epoch = -1, epochs = -1;  ///< 1-based; shown when epoch >= 0
  double loss = std::numeric_limits<double>::quiet_NaN();
  double acc = std::numeric_limits<double>::quiet_NaN();  ///< fraction in [0, 1]
  std::string extra;  ///< appended verbatim ("task 2/5", "lr 3e-4", ...)
};

class Progress {
 public:
  /// `total_steps` is the step count at which the run ends (0 if unknown: no ETA);
  /// `first_step` is where this process starts (nonzero after a resume).
  Progress(int64_t total_steps, int64_t first_step, ProgressOptions options, std::ostream& out);
  Progress(int64_t total_steps, int64_t first_step, ProgressOptions options = {});

  /// Reports that `step` steps are done in all and `units` samples (or tokens) were processed
  /// since the last call. Redraws when the interval has passed or `force` is set.
  void update(int64_t step, int64_t units, const ProgressFields& fields, bool force = false);
  /// Prints a line of its own (an evaluation result, say) without garbling the progress line.
  void note(const std::string& line);
  /// Ends the in-place line, if one is showing.
  void finish();

  double units_per_second() const;
  double elapsed_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& out_;
  ProgressOptions options_;
  int64_t total_, first_step_, step_ = 0, units_ = 0;
  Clock::time_point start_, last_draw_;
  bool drawn_ = false, line_open_ = false;
  size_t last_width_ = 0;
};

/// "1h02m", "3m07s", "12s".
std::string format_duration(double seconds);

}  // namespace fogo::trainer
