#include "common/report.h"

#include <ATen/Version.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace fogo::trainer {
namespace {

// Display width: "±" is two bytes of UTF-8 but one column on screen.
size_t display_width(const std::string& s) {
  size_t w = 0;
  for (const unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

std::string pad(const std::string& s, size_t width, bool left) {
  const size_t w = display_width(s);
  const std::string fill(width > w ? width - w : 0, ' ');
  return left ? s + fill : fill + s;
}

}  // namespace

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string format_mean_sd(const MeanSd& m, int precision) {
  if (!std::isfinite(m.mean) || !std::isfinite(m.sd)) return "n/a";
  char buf[64];
  if (m.n > 1) {
    std::snprintf(buf, sizeof buf, "%.*f ± %.*f", precision, m.mean, precision, m.sd);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", precision, m.mean);
  }
  return buf;
}

namespace {

std::string fixed(double v, int precision) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

// p-values in sentences: two decimals, or one significant digit below 0.001.
std::string p_text(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 1e-3 ? "%.1e" : "%.2f", v);
  return buf;
}

// p-values in tables: three decimals, or one significant digit below 0.001.
std::string p_cell(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 1e-3 ? "%.1e" : "%.3f", v);
  return buf;
}

// "5%" for a family of one, "0.05/17" otherwise: the level a row's detectable difference is at.
std::string level_text(const TestRow& r) {
  if (r.family_size <= 1) return fixed(100 * kFamilyAlpha, 0) + "%";
  return fixed(kFamilyAlpha, 2) + "/" + std::to_string(r.family_size);
}

std::string test_text(const TTest& t) {
  if (t.paired) return "paired by seed over " + std::to_string(t.n_a) + " seeds";
  return "Welch's test over " + std::to_string(t.n_a) + " and " + std::to_string(t.n_b) + " seeds";
}

std::string family_text(const TestRow& r) {
  const std::string kind = r.primary ? "primary" : "secondary";
  if (r.family_size == 1) return "the one " + kind + " test";
  return "the " + std::to_string(r.family_size) + " " + kind + " tests";
}

// What the seeds detect at the level Holm applies first in the row's family.
std::string detect_text(const TestRow& r, int digits) {
  const std::string at =
      r.family_size <= 1
          ? "At the 5% level"
          : "At " + level_text(r) + ", the level Holm applies first among " + family_text(r) + ",";
  return at + " these seeds detect a difference of about " + fixed(r.detectable, digits) +
         " or more with " + fixed(100 * kPower, 0) +
         "% power: a smaller one is neither shown nor ruled out.";
}

struct Ranked {
  std::string name;
  const std::vector<double>* values;
  MeanSd m;
};

// The groups best first; NaN means (failed runs) last, keeping the given order among equals.
std::vector<Ranked> rank_groups(const std::vector<Group>& groups, bool higher_is_better) {
  std::vector<Ranked> ranked;
  for (const Group& g : groups) ranked.push_back({g.name, &g.values, mean_sd(g.values)});
  std::stable_sort(ranked.begin(), ranked.end(), [&](const Ranked& a, const Ranked& b) {
    const bool fa = std::isfinite(a.m.mean), fb = std::isfinite(b.m.mean);
    if (fa != fb) return fa;
    if (!fa) return false;
    return higher_is_better ? a.m.mean > b.m.mean : a.m.mean < b.m.mean;
  });
  return ranked;
}

// The row of `family` that tests `a` against `b` (either way round) on `metric`; null if none.
const TestRow* find_row(const std::vector<TestRow>* family, const std::string& metric,
                        const std::string& a, const std::string& b) {
  const TestRow* row = nullptr;
  if (family) {
    for (const TestRow& r : *family) {
      if (r.metric == metric && ((r.a == a && r.b == b) || (r.a == b && r.b == a))) row = &r;
    }
  }
  return row;
}

// The judgement of the leader's margin: by its row of the family when there is one (Holm's
// p), else by Welch's test `w` alone.
void judge_lead(std::ostringstream& out, const TestRow* row, const WelchT& w, int64_t min_n,
                int digits) {
  if (!row) {
    if (w.p < 0.05) {
      out << " is larger than the seed spread (Welch's t-test p = " << p_text(w.p) << ")";
      if (min_n < 5) out << ", though " << min_n << " seeds make this a screen, not a verdict";
      out << ".";
    } else {
      out << " is within the seed spread (Welch's t-test p = " << p_text(w.p)
          << "): these seeds do not separate them.";
    }
    return;
  }
  if (row->primary) {
    out << " is the primary test above.";
    return;
  }
  const std::string ps = (row->test.paired ? "paired t-test p = " : "Welch's t-test p = ") +
                         p_text(row->test.p) + "; Holm-adjusted over " + family_text(*row) +
                         " p = " + p_text(row->holm_p);
  if (row->holm_p < kFamilyAlpha) {
    out << " is larger than the seed spread (" << ps << ")";
    if (min_n < 5) out << ", though " << min_n << " seeds make this a screen, not a verdict";
    out << ".";
  } else {
    out << " is not separated by these seeds (" << ps << "). " << detect_text(*row, digits);
  }
}

// plain_verdict's text; with `family`, the leader-vs-runner-up test is judged by its row there.
std::string verdict(const std::string& metric, const std::vector<Group>& groups,
                    bool higher_is_better, int digits, const std::vector<TestRow>* family,
                    const std::string& family_metric) {
  if (groups.empty()) return "Nothing to compare: no runs.";
  int64_t min_n = std::numeric_limits<int64_t>::max(), max_n = 0;
  for (const Group& g : groups) {
    min_n = std::min<int64_t>(min_n, static_cast<int64_t>(g.values.size()));
    max_n = std::max<int64_t>(max_n, static_cast<int64_t>(g.values.size()));
  }
  const std::vector<Ranked> ranked = rank_groups(groups, higher_is_better);
  std::ostringstream out;
  out << "By " << metric << " (" << (higher_is_better ? "higher" : "lower")
      << " is better; mean ± sd over " << min_n;
  if (max_n != min_n) out << "-" << max_n;
  out << (max_n == 1 ? " seed" : " seeds") << "): ";
  for (size_t k = 0; k < ranked.size(); ++k) {
    out << (k ? ", " : "") << ranked[k].name << " " << format_mean_sd(ranked[k].m, digits);
  }
  out << ".";
  if (ranked.size() < 2) return out.str() + " One optimizer alone: nothing to compare.";
  const Ranked &a = ranked[0], &b = ranked[1];
  if (!std::isfinite(a.m.mean) || !std::isfinite(b.m.mean)) {
    return out.str() + " Runs failed (n/a): no comparison.";
  }
  const double margin = std::fabs(a.m.mean - b.m.mean);
  const WelchT w = welch_t_test(*a.values, *b.values);
  out << " " << a.name << "'s lead over " << b.name << " (" << fixed(margin, digits) << ")";
  if (!std::isfinite(w.p)) {
    out << " cannot be tested against the seed spread ("
        << (min_n < 2 ? "fewer than 2 seeds" : "no spread in either") << "): run more seeds.";
    return out.str();
  }
  judge_lead(out, find_row(family, family_metric, a.name, b.name), w, min_n, digits);
  return out.str();
}

}  // namespace

std::string plain_verdict(const std::string& metric, const std::vector<Group>& groups,
                          bool higher_is_better, int digits) {
  return verdict(metric, groups, higher_is_better, digits, nullptr, "");
}

std::string plain_verdict(const std::string& metric, const std::vector<Group>& groups,
                          const std::vector<TestRow>& family, const std::string& family_metric,
                          bool higher_is_better, int digits) {
  return verdict(metric, groups, higher_is_better, digits, &family, family_metric);
}

std::string primary_verdict(const std::vector<TestRow>& rows,
                            const std::function<std::string(const std::string&)>& label,
                            int digits) {
  std::ostringstream out;
  for (const TestRow& r : rows) {
    if (!r.primary) continue;
    const TTest& t = r.test;
    out << (out.tellp() > 0 ? "\n" : "") << "Primary test: " << r.a << " - " << r.b << " on "
        << label(r.metric) << ", " << test_text(t) << ": " << fixed(t.estimate, digits);
    if (!std::isfinite(t.p)) {
      out << "; it cannot be tested ("
          << (std::min(t.n_a, t.n_b) < 2 ? "fewer than 2 seeds" : "no spread") << ").";
      continue;
    }
    out << " (" << fixed(100 * t.level, 0) << "% CI " << fixed(t.ci_low, digits) << " to "
        << fixed(t.ci_high, digits) << "; t = " << fixed(t.t, 2) << ", df " << fixed(t.df, 1)
        << ", p = " << p_text(t.p) << "; Holm over " << family_text(r)
        << " p = " << p_text(r.holm_p) << "). ";
    if (r.holm_p < kFamilyAlpha) {
      out << "Separated";
      const int64_t n = std::min(t.n_a, t.n_b);
      if (n < 5) out << ", though " << n << " seeds make this a screen, not a verdict";
      out << ".";
    } else {
      out << "Not separated. " << detect_text(r, digits);
    }
  }
  return out.str();
}

Table test_table(const std::vector<TestRow>& rows, int digits) {
  Table t({"family", "metric", "A", "B", "test", "mean A - B", "95% CI", "t", "df", "p", "Holm p",
           "level", "detectable (80% power)"});
  for (const TestRow& r : rows) {
    const TTest& x = r.test;
    const std::string test = x.paired
                                 ? "paired, " + std::to_string(x.n_a)
                                 : "Welch, " + std::to_string(x.n_a) + "+" + std::to_string(x.n_b);
    const std::string ci = std::isfinite(x.ci_low)
                               ? fixed(x.ci_low, digits) + " to " + fixed(x.ci_high, digits)
                               : "n/a";
    t.add_row({r.primary ? "primary" : "secondary", r.metric, r.a, r.b, test,
               fixed(x.estimate, digits), ci, fixed(x.t, 2), fixed(x.df, 1), p_cell(x.p),
               p_cell(r.holm_p), level_text(r), fixed(r.detectable, digits)});
  }
  return t;
}

std::string test_table_note(const std::vector<TestRow>& rows) {
  int64_t primary = 0;
  for (const TestRow& r : rows) primary += r.primary;
  const int64_t secondary = static_cast<int64_t>(rows.size()) - primary;
  std::ostringstream out;
  out << "Tests of A - B: paired by seed where both sides ran the same seeds (the same initial "
         "weights and data order), Welch's otherwise; 95% CI of the difference. Two families, "
         "each Holm-adjusted on its own: "
      << primary << " primary (named before the runs) and " << secondary
      << " secondary (every other pair on every metric). \"detectable\" is the smallest "
         "difference the test finds with "
      << fixed(100 * kPower, 0)
      << "% power at the level Holm applies first in its family (\"level\": 0.05/m for m "
         "tests), so a test not separated is not shown equal.";
  return out.str();
}

namespace {
std::string& stored_command_line() {
  static std::string command;
  return command;
}
}  // namespace

void set_command_line(int argc, const char* const* argv) {
  std::string text;
  for (int k = 0; k < argc; ++k) {
    const std::string arg = argv[k];
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_=.,/:+@%") == std::string::npos;
    text += (k ? " " : "") + (plain ? arg : shell_quote(arg));
  }
  stored_command_line() = text;
}

const std::string& command_line() { return stored_command_line(); }

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

namespace {

// What machine_description() and cpu_isa() read of /proc/cpuinfo: the first CPU's model name and
// flags (" flag flag ... ", spaced so that " avx2 " finds a whole flag) and the number of CPUs.
struct CpuInfo {
  std::string model, flags;
  int cpus = 0;
  bool has(const std::string& flag) const {
    return flags.find(" " + flag + " ") != std::string::npos;
  }
};

CpuInfo read_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  CpuInfo info;
  const auto value = [](const std::string& l) {
    const size_t colon = l.find(':');
    if (colon == std::string::npos) return std::string();
    const size_t start = l.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : l.substr(start);
  };
  while (std::getline(in, line)) {
    if (line.rfind("processor", 0) == 0) ++info.cpus;
    if (info.model.empty() && line.rfind("model name", 0) == 0) info.model = value(line);
    if (info.flags.empty() && line.rfind("flags", 0) == 0) info.flags = " " + value(line) + " ";
  }
  return info;
}

}  // namespace

std::string machine_description() {
  const CpuInfo info = read_cpuinfo();
  std::ostringstream out;
  out << (info.model.empty() ? "unknown CPU" : info.model);
  if (info.cpus > 0) out << " (" << info.cpus << " CPUs)";
  // The widest x86 vector extension the kernel reports (other architectures: none named).
  for (const char* isa : {"avx512f", "avx2", "avx", "sse4_2"}) {
    if (info.has(isa)) {
      std::string name = isa;
      for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      out << ", " << name;
      break;
    }
  }
  out << "; torch CPU kernels: " << at::get_cpu_capability();
  return out.str();
}

std::string cpu_isa() {
  const CpuInfo info = read_cpuinfo();
  std::string out;
  for (const char* flag : {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}) {
    if (info.has(flag)) out += (out.empty() ? "" : " ") + std::string(flag);
  }
  return out.empty() ? "none" : out;
}

Table::Table(std::vector<std::string> header) : header_(std::move(header)) {}

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != header_.size()) {
    throw std::invalid_argument("Table::add_row: " + std::to_string(cells.size()) + " cells for " +
                                std::to_string(header_.size()) + " columns");
  }
  rows_.push_back(std::move(cells));
}

std::string Table::to_text() const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = display_width(header_[c]);
    for (const auto& r : rows_) width[c] = std::max(width[c], display_width(r[c]));
  }
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      out << (c ? "  " : "") << pad(cells[c], width[c], c == 0);
    }
    out << '\n';
  };
  line(header_);
  size_t total = 0;
  for (size_t c = 0; c < width.size(); ++c) total += width[c] + (c ? 2 : 0);
  out << std::string(total, '-') << '\n';
  for (const auto& r : rows_) line(r);
  return out.str();
}

std::string Table::to_markdown() const {
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    out << '|';
    for (const auto& c : cells) out << ' ' << c << " |";
    out << '\n';
  };
  line(header_);
  out << '|';
  for (size_t c = 0; c < header_.size(); ++c) out << (c ? "---:|" : "---|");
  out << '\n';
  for (const auto& r : rows_) line(r);
  return out.str();
}

}  // namespace fogo::trainer
