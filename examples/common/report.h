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
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "common/stats.h"

namespace fogo::trainer {

/// "87.31 ± 1.20" (or "87.31" when n == 1, "n/a" when NaN).
std::string format_mean_sd(const MeanSd& m, int precision = 2);

/// One or two plain sentences on a comparison by `metric` of `groups` (a name and one value per
/// seed each), for a reader of the table above it: the ranking by mean ± sd, then whether the
/// leader's margin over the runner-up exceeds the seed spread by Welch's t-test at the 5% level
/// (a screen with few seeds, and said so), or why it cannot be tested. Groups whose mean is NaN
/// (a failed run) rank last as "n/a".
///   "By acc (%) (higher is better; mean ± sd over 3 seeds): muon 71.10 ± 0.14, fogo 70.40 ±
///    0.99, adam 65.25 ± 4.88. muon's lead over fogo (0.70) is within the seed spread (Welch's
///    t-test p = 0.45): these seeds do not separate them."
std::string plain_verdict(const std::string& metric, const std::vector<Group>& groups,
                          bool higher_is_better = true, int digits = 2);
/// plain_verdict judged within the families of test_families(): the leader-vs-runner-up test is
/// looked up in `family` on `family_metric`; a primary one is referred to the primary verdict, a
/// secondary one is decided on its Holm-adjusted p and, not separated, given with the smallest
/// difference the seeds detect at the level Holm applies in its family.
std::string plain_verdict(const std::string& metric, const std::vector<Group>& groups,
                          const std::vector<TestRow>& family, const std::string& family_metric,
                          bool higher_is_better = true, int digits = 2);
/// One sentence per primary test of `rows`: the difference, how it was tested (paired by seed or
/// Welch), its 95% CI, t, df, p and Holm p over the primary family, then "Separated" or "Not
/// separated" with the difference the seeds detect at that family's level (80% power). `label`
/// names a metric for the reader ("rare_acc" -> "rare acc (%)"). Empty without primary rows.
std::string primary_verdict(const std::vector<TestRow>& rows,
                            const std::function<std::string(const std::string&)>& label,
                            int digits = 2);
class Table;

/// The table of a comparison's tests (test_families): family, metric, A, B, the test (paired
/// and the number of pairs, or Welch and both sizes), mean A - B, its 95% CI, t, df, p, the Holm
/// p within the family, the family's level (5%, or 0.05/m) and the smallest |A - B| the test
/// detects at that level with 80% power. test_table_note() says so in one paragraph.
Table test_table(const std::vector<TestRow>& rows, int digits = 2);
std::string test_table_note(const std::vector<TestRow>& rows);

/// The command line of this process, as a shell would take it back (arguments with spaces or
/// quotes single-quoted): a trainer's main() records it with set_command_line() so that each run
/// can say what made it. "" until then.
void set_command_line(int argc, const char* const* argv);
/// `s` in single quotes for /bin/sh: nothing inside them is special but the quote itself.
std::string shell_quote(const std::string& s);
const std::string& command_line();
/// The current time in UTC, "2026-11-26T02:15:00Z".
std::string utc_now();

/// The machine a number was measured on, for every table (issue 28: the runs are deterministic
/// per machine, not across machines): the CPU model and count and the widest vector ISA from
/// /proc/cpuinfo, and the kernels torch dispatches to (ATen's CPU capability), e.g.
/// "AMD EPYC 7B13 (2 CPUs), AVX2; torch CPU kernels: AVX2".
std::string machine_description();
/// The vector and matrix extensions of this CPU that change what torch's kernels compute (issue
/// 47; the runs are deterministic per ISA), those of {avx2, avx512f, avx512_bf16, amx_tile,
/// amx_bf16} that /proc/cpuinfo lists, space-separated in that order; "none" when it lists none.
std::string cpu_isa();
/// The commit of the source tree this binary was built from: `git describe --always --dirty`
/// taken at build time (examples/common/build_commit.cmake), "unknown" when it was not built
/// from a git checkout. Every run record names it beside machine_description() and the date.
const std::string& build_commit();

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
