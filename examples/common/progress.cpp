#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace fogo::trainer {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  }
  return buf;
}

Progress::Progress(int64_t total_steps, int64_t first_step, ProgressOptions options,
                   std::ostream& out)
    : out_(out),
      options_(std::move(options)),
      total_(total_steps),
      first_step_(first_step),
      step_(first_step),
      start_(Clock::now()),
      last_draw_(start_) {
  if (options_.tty < 0) options_.tty = (&out == &std::cerr && isatty(STDERR_FILENO)) ? 1 : 0;
  if (options_.interval_s < 0) options_.interval_s = options_.tty ? 0.2 : 10.0;
}

Progress::Progress(int64_t total_steps, int64_t first_step, ProgressOptions options)
    : Progress(total_steps, first_step, std::move(options), std::cerr) {}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

double Progress::units_per_second() const {
  const double t = elapsed_seconds();
  return t > 0 ? static_cast<double>(units_) / t : 0.0;
}

void Progress::update(int64_t step, int64_t units, const ProgressFields& f, bool force) {
  step_ = step;
  units_ += units;
  const auto now = Clock::now();
  if (!force && drawn_ &&
      std::chrono::duration<double>(now - last_draw_).count() < options_.interval_s) {
    return;
  }
  last_draw_ = now;
  drawn_ = true;

  std::string line;
  char buf[96];
  if (!options_.label.empty()) line += "[" + options_.label + "] ";
  if (f.epoch >= 0) {
    line += "epoch " + std::to_string(f.epoch);
    if (f.epochs > 0) line += "/" + std::to_string(f.epochs);
    line += "  ";
  }
  line += "step " + std::to_string(step);
  if (total_ > 0) line += "/" + std::to_string(total_);
  if (std::isfinite(f.loss)) {
    std::snprintf(buf, sizeof buf, "  loss %.4f", f.loss);
    line += buf;
  }
  if (std::isfinite(f.acc)) {
    std::snprintf(buf, sizeof buf, "  acc %.2f%%", 100.0 * f.acc);
    line += buf;
  }
  std::snprintf(buf, sizeof buf, "  %.0f %s/s", units_per_second(), options_.unit.c_str());
  line += buf;
  const int64_t done = step - first_step_;
  if (total_ > 0 && done > 0) {
    const double eta = elapsed_seconds() / static_cast<double>(done) *
                       static_cast<double>(std::max<int64_t>(0, total_ - step));
    line += "  ETA " + format_duration(eta);
  }
  if (!f.extra.empty()) line += "  " + f.extra;

  if (options_.tty) {
    const size_t width = line.size();
    if (width < last_width_) line += std::string(last_width_ - width, ' ');
    last_width_ = width;
    out_ << '\r' << line << std::flush;
    line_open_ = true;
  } else {
    out_ << line << std::endl;
  }
}

void Progress::note(const std::string& line) {
  finish();
  out_ << line << std::endl;
}

void Progress::finish() {
  if (line_open_) out_ << '\n' << std::flush;
  line_open_ = false;
  last_width_ = 0;
}

}  // namespace fogo::trainer
