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
class Table;

/// Holm's step-down adjustment of a family of p-values (issue 28: every table is one family), in
/// the order given: with the m finite p sorted, p_(k) becomes max_{j <= k} min(1, (m - j + 1)
/// p_(j)). A NaN p (an undefined test) stays NaN and does not count in m. Rejecting where the
/// adjusted p < alpha keeps the chance of any false "separated" in the family at <= alpha.
std::vector<double> holm_adjust(const std::vector<double>& p);
/// The q-quantile of Student's t with `df` (> 0) degrees of freedom, 0 < q < 1 (NaN otherwise).
double student_t_quantile(double q, double df);
/// The smallest |mean(a) - mean(b)| a two-sided Welch test at level `alpha` detects with
/// probability `power`, for samples of these sizes and sample sds: (t_{1-alpha/2} + t_{power})
/// sqrt(s_a^2/n_a + s_b^2/n_b), t quantiles at the Welch–Satterthwaite df. With 3 seeds a side
/// that is about 3-4.5 sample sds. NaN where Welch's test is undefined.
double detectable_difference(const std::vector<double>& a, const std::vector<double>& b,
                             double alpha = 0.05, double power = 0.8);

/// One test of a family: groups `a` and `b` compared on `metric` (the label), Welch's t, the
/// Holm-adjusted p over the family and the detectable difference (5%, 80% power).
struct WelchRow {
  std::string metric, a, b;
  double difference = 0;  ///< mean(a) - mean(b)
  WelchT welch;
  double holm_p = 0, detectable = 0;
};
/// A metric and one (name, values per seed) group per optimizer, in display order.
struct MetricGroups {
  std::string metric;
  std::vector<std::pair<std::string, std::vector<double>>> groups;
};
/// Every pair of groups (in the order given) on every metric, as one family: Holm over all of it.
std::vector<WelchRow> welch_family(const std::vector<MetricGroups>& metrics);
/// The family's table: metric, A, B, mean A - B, t, df, p, Holm p (over its rows), and the
/// smallest |A - B| the seeds detect at 5% with 80% power, so that a null is not read as "equal".
Table welch_family_table(const std::vector<WelchRow>& rows, int digits = 2);

/// The machine a number was measured on, for every table (issue 28: the runs are deterministic
/// per machine, not across machines): the CPU model and count and the widest vector ISA from
/// /proc/cpuinfo, and the kernels torch dispatches to (ATen's CPU capability), e.g.
/// "AMD EPYC 7B13 (2 CPUs), AVX2; torch CPU kernels: AVX2".
std::string machine_description();

/// plain_verdict judged within a family (a table of tests): the leader-vs-runner-up test is
/// looked up in `family` on `family_metric`, the decision is made on its Holm-adjusted p, and a
/// lead that is not separated is given with the smallest difference the seeds could detect.
std::string plain_verdict(const std::string& metric,
                          const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                          const std::vector<WelchRow>& family, const std::string& family_metric,
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
