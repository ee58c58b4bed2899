#pragma once
// Statistics of comparisons over seeds, for the trainers' reports (docs/results.md, "The
// protocol"): mean ± sd, Student's t distribution, Welch's and the paired t-test with their
// confidence intervals, Holm's adjustment, the smallest difference a test detects, and the two
// families of tests of a comparison (issue 34): the primary tests, named before the runs, and
// every other pair of groups on every metric, each family Holm-adjusted on its own.
//
//   // fogo[k] and muon[k] are seed k's runs: the same initial weights and data order
//   const TTest t = paired_t_test(fogo_rare, muon_rare);  // t.estimate, t.ci_low, t.ci_high, t.p
//   const auto rows = test_families(metrics, {{"rare_acc", "fogo", "muon"}});

#include <cstdint>
#include <string>
#include <vector>

namespace fogo::trainer {

struct MeanSd {
  double mean = 0, sd = 0;  ///< sd is the sample standard deviation (n - 1); 0 when n == 1
  int64_t n = 0;
};

/// NaN mean and sd when `values` is empty or holds a NaN (a failed run must not look good).
MeanSd mean_sd(const std::vector<double>& values);

/// P(|T| >= |t|) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom:
/// the regularized incomplete beta I_{df/(df+t^2)}(df/2, 1/2).
double student_t_two_sided_p(double t, double df);
/// The q-quantile of Student's t with `df` (> 0) degrees of freedom, 0 < q < 1 (NaN otherwise).
double student_t_quantile(double q, double df);

/// Welch's unequal-variances t-test of mean(a) against mean(b): t, the Welch–Satterthwaite
/// degrees of freedom and the two-sided p-value. All NaN when a sample has fewer than 2 values,
/// holds a NaN, or both have zero variance.
struct WelchT {
  double t = 0, df = 0, p = 0;
};
WelchT welch_t_test(const std::vector<double>& a, const std::vector<double>& b);

/// A t-test of the difference A - B, with its two-sided p and confidence interval
/// estimate ± t_{(1 + level)/2, df} · se.
struct TTest {
  bool paired = false;
  int64_t n_a = 0, n_b = 0;  ///< paired: both the number of pairs
  double estimate = 0;       ///< paired: mean(a - b); Welch: mean(a) - mean(b)
  double se = 0, t = 0, df = 0, p = 0;
  double level = 0.95, ci_low = 0, ci_high = 0;
};
/// The paired t-test: a[k] and b[k] belong to one unit (a seed: the same initial weights and data
/// order on both sides), and the test is the one-sample t-test of the differences d = a - b:
/// se = sd(d) / sqrt(n), df = n - 1. Throws std::invalid_argument when the sizes differ. The
/// estimate is NaN when a value is; se, t, df, p and the interval are NaN also when n < 2 or the
/// differences have no spread.
TTest paired_t_test(const std::vector<double>& a, const std::vector<double>& b,
                    double level = 0.95);
/// Welch's test of mean(a) - mean(b) with its interval (se^2 = s_a^2/n_a + s_b^2/n_b, the
/// Welch–Satterthwaite df); NaN where welch_t_test is.
TTest welch_test(const std::vector<double>& a, const std::vector<double>& b, double level = 0.95);

/// Holm's step-down adjustment of a family of p-values, in the order given: with the m finite p
/// sorted, p_(k) becomes max_{j <= k} min(1, (m - j + 1) p_(j)). A NaN p (an undefined test)
/// stays NaN and does not count in m. Rejecting where the adjusted p < alpha keeps the chance of
/// any false "separated" in the family at <= alpha.
std::vector<double> holm_adjust(const std::vector<double>& p);

/// The smallest true |difference| that a two-sided t-test with standard error `se` and `df`
/// degrees of freedom declares at level `alpha` with probability `power`:
/// (t_{1 - alpha/2, df} + t_{power, df}) · se (the usual central-t approximation of the power).
/// NaN where se or df is.
double detectable_difference(double se, double df, double alpha = 0.05, double power = 0.8);
double detectable_difference(const TTest& test, double alpha = 0.05, double power = 0.8);
/// Welch's, for two samples: with 3 seeds a side at the 5% level about 3-4.5 sample sds.
double detectable_difference(const std::vector<double>& a, const std::vector<double>& b,
                             double alpha = 0.05, double power = 0.8);

// --- The families of tests of a comparison (issue 34).

/// The level of every family and the power the detectable differences are given at.
constexpr double kFamilyAlpha = 0.05;
constexpr double kPower = 0.8;

/// One group of a comparison (an optimizer): one value per unit (seed), and those units in the
/// same order. Two groups whose units are equal and not empty are compared paired by unit; any
/// other two by Welch's test.
struct Group {
  std::string name;
  std::vector<double> values;
  std::vector<int64_t> units;
};
/// A metric and its groups, in display order.
struct MetricGroups {
  std::string metric;
  std::vector<Group> groups;
};
/// A test named before the runs: `a` - `b` on `metric`.
struct DeclaredTest {
  std::string metric, a, b;
};
/// One test of a comparison.
struct TestRow {
  bool primary = false;  ///< of the primary family (else the secondary)
  std::string metric, a, b;
  TTest test;         ///< of a - b, paired by unit where the groups share their units
  double holm_p = 0;  ///< Holm-adjusted over the row's family
  /// The family's strictest Holm level, kFamilyAlpha / m (m: its defined tests): a test whose p
  /// is below it is separated whatever the family's other p are; the verdict uses this level.
  double alpha = 0;
  int64_t family_size = 0;  ///< m
  double detectable = 0;    ///< detectable_difference(test, alpha, kPower)
};
/// Every pair of groups (in the order given) on every metric. The pairs `primary` names (either
/// way round; oriented as declared) form the primary family, in the declared order; all the
/// others the secondary family, after them. Holm and the detectable difference are computed
/// within each family.
std::vector<TestRow> test_families(const std::vector<MetricGroups>& metrics,
                                   const std::vector<DeclaredTest>& primary = {});

}  // namespace fogo::trainer
