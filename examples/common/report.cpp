#include "common/report.h"

#include <ATen/Version.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

std::string gp_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Single quotes for /bin/sh: nothing inside them is special but the quote itself.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

MeanSd mean_sd(const std::vector<double>& values) {
  MeanSd m;
  m.n = static_cast<int64_t>(values.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (values.empty()) return {nan, nan, 0};
  double sum = 0;
  for (const double v : values) sum += v;
  m.mean = sum / static_cast<double>(m.n);
  double ss = 0;
  for (const double v : values) ss += (v - m.mean) * (v - m.mean);
  m.sd = m.n > 1 ? std::sqrt(ss / static_cast<double>(m.n - 1)) : 0.0;
  if (!std::isfinite(m.mean)) m.sd = nan;
  return m;
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

// Continued fraction of the incomplete beta function (modified Lentz).
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const int m2 = 2 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

// The regularized incomplete beta function I_x(a, b).
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, 1 - x) / b;
}

}  // namespace

double student_t_two_sided_p(double t, double df) {
  if (!std::isfinite(t) || !(df > 0)) return std::numeric_limits<double>::quiet_NaN();
  return incomplete_beta(df / 2, 0.5, df / (df + t * t));
}

std::vector<std::string> welch_cells(const std::vector<double>& a, const std::vector<double>& b,
                                     int digits) {
  const auto fixed = [](double v, int precision) -> std::string {
    if (!std::isfinite(v)) return "n/a";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", precision, v);
    return buf;
  };
  const WelchT w = welch_t_test(a, b);
  char p[64] = "n/a";
  if (std::isfinite(w.p)) std::snprintf(p, sizeof p, w.p < 1e-3 ? "%.1e" : "%.3f", w.p);
  return {fixed(mean_sd(a).mean - mean_sd(b).mean, digits), fixed(w.t, 2), fixed(w.df, 1), p};
}

WelchT welch_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const MeanSd x = mean_sd(a), y = mean_sd(b);
  if (x.n < 2 || y.n < 2 || !std::isfinite(x.mean) || !std::isfinite(y.mean)) {
    return {nan, nan, nan};
  }
  const double va = x.sd * x.sd / static_cast<double>(x.n);
  const double vb = y.sd * y.sd / static_cast<double>(y.n);
  if (!(va + vb > 0)) return {nan, nan, nan};
  WelchT w;
  w.t = (x.mean - y.mean) / std::sqrt(va + vb);
  w.df = (va + vb) * (va + vb) /
         (va * va / static_cast<double>(x.n - 1) + vb * vb / static_cast<double>(y.n - 1));
  w.p = student_t_two_sided_p(w.t, w.df);
  return w;
}

namespace {

// plain_verdict's text; with `family`, the leader-vs-runner-up test is judged by its row there.
std::string verdict(const std::string& metric,
                    const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                    bool higher_is_better, int digits, const std::vector<WelchRow>* family,
                    const std::string& family_metric) {
  if (groups.empty()) return "Nothing to compare: no runs.";
  struct Ranked {
    std::string name;
    const std::vector<double>* values;
    MeanSd m;
  };
  std::vector<Ranked> ranked;
  int64_t min_n = std::numeric_limits<int64_t>::max(), max_n = 0;
  for (const auto& [name, values] : groups) {
    ranked.push_back({name, &values, mean_sd(values)});
    min_n = std::min<int64_t>(min_n, static_cast<int64_t>(values.size()));
    max_n = std::max<int64_t>(max_n, static_cast<int64_t>(values.size()));
  }
  // Best first; NaN means (failed runs) last, keeping the given order among equals.
  std::stable_sort(ranked.begin(), ranked.end(), [&](const Ranked& a, const Ranked& b) {
    const bool fa = std::isfinite(a.m.mean), fb = std::isfinite(b.m.mean);
    if (fa != fb) return fa;
    if (!fa) return false;
    return higher_is_better ? a.m.mean > b.m.mean : a.m.mean < b.m.mean;
  });
  const auto fixed = [digits](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return std::string(buf);
  };
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
  out << " " << a.name << "'s lead over " << b.name << " (" << fixed(margin) << ")";
  if (!std::isfinite(w.p)) {
    out << " cannot be tested against the seed spread ("
        << (min_n < 2 ? "fewer than 2 seeds" : "no spread in either") << "): run more seeds.";
    return out.str();
  }
  const auto p_text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, v < 1e-3 ? "%.1e" : "%.2f", v);
    return std::string(buf);
  };
  const WelchRow* row = nullptr;
  if (family) {
    for (const WelchRow& r : *family) {
      if (r.metric == family_metric &&
          ((r.a == a.name && r.b == b.name) || (r.a == b.name && r.b == a.name))) {
        row = &r;
      }
    }
  }
  if (!row) {
    if (w.p < 0.05) {
      out << " is larger than the seed spread (Welch's t-test p = " << p_text(w.p) << ")";
      if (min_n < 5) out << ", though " << min_n << " seeds make this a screen, not a verdict";
      out << ".";
    } else {
      out << " is within the seed spread (Welch's t-test p = " << p_text(w.p)
          << "): these seeds do not separate them.";
    }
    return out.str();
  }
  const std::string ps = "Welch's t-test p = " + p_text(w.p) + "; Holm-adjusted over the " +
                         std::to_string(family->size()) +
                         " tests of the table p = " + p_text(row->holm_p);
  if (row->holm_p < 0.05) {
    out << " is larger than the seed spread (" << ps << ")";
    if (min_n < 5) out << ", though " << min_n << " seeds make this a screen, not a verdict";
    out << ".";
  } else {
    out << " is not separated by these seeds (" << ps << "). They detect a difference of about "
        << fixed(row->detectable)
        << " or more (5% level, 80% power): a smaller one is neither shown nor ruled out.";
  }
  return out.str();
}

}  // namespace

std::string plain_verdict(const std::string& metric,
                          const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                          bool higher_is_better, int digits) {
  return verdict(metric, groups, higher_is_better, digits, nullptr, "");
}

std::string plain_verdict(const std::string& metric,
                          const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                          const std::vector<WelchRow>& family, const std::string& family_metric,
                          bool higher_is_better, int digits) {
  return verdict(metric, groups, higher_is_better, digits, &family, family_metric);
}

std::vector<double> holm_adjust(const std::vector<double>& p) {
  std::vector<size_t> order;
  for (size_t k = 0; k < p.size(); ++k) {
    if (std::isfinite(p[k])) order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
  std::vector<double> adjusted(p.size(), std::numeric_limits<double>::quiet_NaN());
  const double m = static_cast<double>(order.size());
  double running = 0;  // step-down: an adjusted p never falls below an earlier one
  for (size_t j = 0; j < order.size(); ++j) {
    running = std::max(running, std::min(1.0, (m - static_cast<double>(j)) * p[order[j]]));
    adjusted[order[j]] = running;
  }
  return adjusted;
}

double student_t_quantile(double q, double df) {
  if (!(q > 0 && q < 1) || !(df > 0) || !std::isfinite(df)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (q == 0.5) return 0;
  if (q < 0.5) return -student_t_quantile(1 - q, df);
  // P(T > t) = p2(t) / 2 falls monotonically in t > 0: bisect for p2(t) = 2 (1 - q).
  const double target = 2 * (1 - q);
  double lo = 0, hi = 1;
  while (student_t_two_sided_p(hi, df) > target && hi < 1e12) hi *= 2;
  for (int k = 0; k < 200 && hi - lo > 1e-13 * hi; ++k) {
    const double mid = (lo + hi) / 2;
    (student_t_two_sided_p(mid, df) > target ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

double detectable_difference(const std::vector<double>& a, const std::vector<double>& b,
                             double alpha, double power) {
  const WelchT w = welch_t_test(a, b);
  if (!std::isfinite(w.df)) return std::numeric_limits<double>::quiet_NaN();
  const MeanSd x = mean_sd(a), y = mean_sd(b);
  const double se =
      std::sqrt(x.sd * x.sd / static_cast<double>(x.n) + y.sd * y.sd / static_cast<double>(y.n));
  return (student_t_quantile(1 - alpha / 2, w.df) + student_t_quantile(power, w.df)) * se;
}

std::vector<WelchRow> welch_family(const std::vector<MetricGroups>& metrics) {
  std::vector<WelchRow> rows;
  for (const MetricGroups& m : metrics) {
    for (size_t i = 0; i < m.groups.size(); ++i) {
      for (size_t j = i + 1; j < m.groups.size(); ++j) {
        const auto &a = m.groups[i], &b = m.groups[j];
        WelchRow r;
        r.metric = m.metric;
        r.a = a.first;
        r.b = b.first;
        r.difference = mean_sd(a.second).mean - mean_sd(b.second).mean;
        r.welch = welch_t_test(a.second, b.second);
        r.detectable = detectable_difference(a.second, b.second);
        rows.push_back(r);
      }
    }
  }
  std::vector<double> p;
  for (const WelchRow& r : rows) p.push_back(r.welch.p);
  const std::vector<double> holm = holm_adjust(p);
  for (size_t k = 0; k < rows.size(); ++k) rows[k].holm_p = holm[k];
  return rows;
}

Table welch_family_table(const std::vector<WelchRow>& rows, int digits) {
  const auto fixed = [](double v, int precision) -> std::string {
    if (!std::isfinite(v)) return "n/a";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", precision, v);
    return buf;
  };
  const auto p_cell = [](double v) -> std::string {
    if (!std::isfinite(v)) return "n/a";
    char buf[64];
    std::snprintf(buf, sizeof buf, v < 1e-3 ? "%.1e" : "%.3f", v);
    return buf;
  };
  Table t({"metric", "A", "B", "mean A - B", "t", "df", "p", "Holm p",
           "detectable |A - B| (5%, 80% power)"});
  for (const WelchRow& r : rows) {
    t.add_row({r.metric, r.a, r.b, fixed(r.difference, digits), fixed(r.welch.t, 2),
               fixed(r.welch.df, 1), p_cell(r.welch.p), p_cell(r.holm_p),
               fixed(r.detectable, digits)});
  }
  return t;
}

std::string machine_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  int cpus = 0;
  const auto value = [](const std::string& l) {
    const size_t colon = l.find(':');
    if (colon == std::string::npos) return std::string();
    const size_t start = l.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : l.substr(start);
  };
  while (std::getline(in, line)) {
    if (line.rfind("processor", 0) == 0) ++cpus;
    if (model.empty() && line.rfind("model name", 0) == 0) model = value(line);
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + value(line) + " ";
  }
  std::ostringstream out;
  out << (model.empty() ? "unknown CPU" : model);
  if (cpus > 0) out << " (" << cpus << " CPUs)";
  // The widest x86 vector extension the kernel reports (other architectures: none named).
  for (const char* isa : {"avx512f", "avx2", "avx", "sse4_2"}) {
    if (flags.find(std::string(" ") + isa + " ") != std::string::npos) {
      std::string name = isa;
      for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      out << ", " << name;
      break;
    }
  }
  out << "; torch CPU kernels: " << at::get_cpu_capability();
  return out.str();
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

bool gnuplot_available() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

bool plot_png(const std::string& png_path, const std::vector<Panel>& panels, int columns) {
  return plot_png(png_path, panels, columns, std::cerr);
}

bool plot_png(const std::string& png_path, const std::vector<Panel>& panels, int columns,
              std::ostream& log) {
  if (panels.empty()) throw std::invalid_argument("plot_png: no panels for " + png_path);
  const int cols = columns > 0 ? columns : static_cast<int>(panels.size());
  const int rows = (static_cast<int>(panels.size()) + cols - 1) / cols;
  const auto parent = std::filesystem::path(png_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);

  // One gnuplot data block per series, addressed by index: columns x, y, y - sd, y + sd.
  const std::string dat = png_path + ".dat", gp = png_path + ".gp";
  std::ofstream data(dat);
  int index = 0;
  for (const auto& panel : panels) {
    for (const auto& s : panel.series) {
      if (s.x.size() != s.y.size() || (!s.sd.empty() && s.sd.size() != s.y.size())) {
        throw std::invalid_argument("plot_png: series '" + s.name + "' of panel '" + panel.title +
                                    "' has x, y and sd of different lengths");
      }
      data << "# " << s.name << '\n';
      for (size_t k = 0; k < s.x.size(); ++k) {
        const double sd = s.sd.empty() ? 0.0 : s.sd[k];
        data << s.x[k] << ' ' << s.y[k] << ' ' << s.y[k] - sd << ' ' << s.y[k] + sd << '\n';
      }
      // An empty series still needs its block so the indices of the later ones stay right.
      if (s.x.empty()) data << "nan nan nan nan\n";
      data << "\n\n";
    }
  }
  if (!data) throw std::runtime_error("plot_png: cannot write " + dat);
  data.close();

  std::ofstream script(gp);
  script << "set terminal pngcairo size " << 560 * cols << "," << 420 * rows << " font 'sans,10'\n"
         << "set output " << gp_quote(png_path) << "\n"
         << "set style fill transparent solid 0.18 noborder\n"
         << "set key below reverse Left\nset grid\n";
  if (panels.size() > 1) script << "set multiplot layout " << rows << "," << cols << "\n";
  index = 0;
  for (const auto& panel : panels) {
    script << "set title " << gp_quote(panel.title) << "\nset xlabel " << gp_quote(panel.xlabel)
           << "\nset ylabel " << gp_quote(panel.ylabel) << "\nplot ";
    for (size_t k = 0; k < panel.series.size(); ++k) {
      const auto& s = panel.series[k];
      const std::string src = gp_quote(dat) + " index " + std::to_string(index++);
      if (k) script << ", \\\n     ";
      if (!s.sd.empty()) {
        script << src << " using 1:3:4 with filledcurves lc " << k + 1 << " notitle, \\\n     ";
      }
      script << src << " using 1:2 with linespoints lc " << k + 1 << " lw 2 pt 7 ps 0.5 title "
             << gp_quote(s.name);
    }
    if (panel.series.empty()) script << "NaN notitle";
    script << "\n";
  }
  if (panels.size() > 1) script << "unset multiplot\n";
  if (!script) throw std::runtime_error("plot_png: cannot write " + gp);
  script.close();

  if (!gnuplot_available()) {
    log << "plot: gnuplot not found (Debian: gnuplot-nox); skipped " << png_path
        << " (data and script are in " << dat << ", " << gp << ")\n";
    return false;
  }
  const std::string cmd = "gnuplot " + shell_quote(gp) + " 2>" + shell_quote(gp + ".log");
  if (std::system(cmd.c_str()) != 0) {
    log << "plot: gnuplot failed on " << gp << " (see " << gp << ".log)\n";
    return false;
  }
  return true;
}

}  // namespace fogo::trainer
