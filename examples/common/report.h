#pragma once
// Summaries of several runs: mean ± standard deviation, aligned text / Markdown tables, and PNG
// line plots drawn by gnuplot (the Debian package gnuplot-nox).
//
//   Table t({"optimizer", "rare acc (%)", "forgetting (%)"});
//   t.add_row({"fogo", format_mean_sd(mean_sd(rare), 2), format_mean_sd(mean_sd(forget), 2)});
//   std::cout << t.to_text();
//
//   plot_png("runs/acc.png", {{"Rare-class accuracy", "epoch", "accuracy (%)",
//                              {Series{"fogo", x, mean, sd}, Series{"adam", x, mean2, sd2}}}});

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace fogo::trainer {

struct MeanSd {
  double mean = 0, sd = 0;  ///< sd is the sample standard deviation (n - 1); 0 when n == 1
  int64_t n = 0;
};

/// NaN mean and sd when `values` is empty or holds a NaN (a failed run must not look good).
MeanSd mean_sd(const std::vector<double>& values);
/// "87.31 ± 1.20" (or "87.31" when n == 1, "n/a" when NaN).
std::string format_mean_sd(const MeanSd& m, int precision = 2);

/// Welch's unequal-variances t-test of mean(a) against mean(b): t, the Welch–Satterthwaite
/// degrees of freedom and the two-sided p-value. All NaN when a sample has fewer than 2 values,
/// holds a NaN, or both have zero variance.
struct WelchT {
  double t = 0, df = 0, p = 0;
};
WelchT welch_t_test(const std::vector<double>& a, const std::vector<double>& b);
/// The cells of one comparison row of a Welch table: mean(a) - mean(b) with `digits` decimals, t,
/// df and the two-sided p ("n/a" where undefined); the header is welch_header().
std::vector<std::string> welch_cells(const std::vector<double>& a, const std::vector<double>& b,
                                     int digits);
inline const std::vector<std::string>& welch_header() {
  static const std::vector<std::string> header{"mean A - B", "t", "df", "p (two-sided)"};
  return header;
}
/// One or two plain sentences on a comparison by `metric` of `groups` (a name and one value per
/// seed each), for a reader of the table above it: the ranking by mean ± sd, then whether the
/// leader's margin over the runner-up exceeds the seed spread by Welch's t-test at the 5% level
/// (a screen with few seeds, and said so), or why it cannot be tested. Groups whose mean is NaN
/// (a failed run) rank last as "n/a".
///   "By acc (%) (higher is better; mean ± sd over 3 seeds): muon 71.10 ± 0.14, fogo 70.40 ±
///    0.99, adam 65.25 ± 4.88. muon's lead over fogo (0.70) is within the seed spread (Welch's
///    t-test p = 0.45): these seeds do not separate them."
std::string plain_verdict(const std::string& metric,
                          const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                          bool higher_is_better = true, int digits = 2);
/// P(|T| >= |t|) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom:
/// the regularized incomplete beta I_{df/(df+t^2)}(df/2, 1/2).
double student_t_two_sided_p(double t, double df);

class Table {
 public:
  explicit Table(std::vector<std::string> header);
  /// Throws std::invalid_argument when the row has a different number of cells than the header.
  void add_row(std::vector<std::string> cells);
  /// Columns padded to their widest cell, a rule under the header; first column left-aligned,
  /// the others right-aligned.
  std::string to_text() const;
  std::string to_markdown() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> sd;  ///< optional: a shaded band y ± sd (same length as y)
};

struct Panel {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
};

/// True when a `gnuplot` executable is on PATH.
bool gnuplot_available();

/// Draws `panels` side by side (`columns` per row, 0: all in one row) into `png_path`; the data
/// and the gnuplot script are kept next to it (png_path + ".dat" / ".gp") so the figure can be
/// restyled by hand. Returns false, after saying why on `log`, when gnuplot is missing or fails;
/// throws on malformed series (x and y of different lengths) or when files cannot be written.
bool plot_png(const std::string& png_path, const std::vector<Panel>& panels, int columns,
              std::ostream& log);
bool plot_png(const std::string& png_path, const std::vector<Panel>& panels, int columns = 0);

}  // namespace fogo::trainer
