#include "common/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace fogo::trainer {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

// t, p and the interval of a test whose estimate, se and df are set.
TTest finish(TTest r) {
  if (!(r.se > 0) || !std::isfinite(r.se) || !(r.df > 0) || !std::isfinite(r.estimate)) {
    r.se = r.t = r.df = r.p = r.ci_low = r.ci_high = kNaN;
    return r;
  }
  r.t = r.estimate / r.se;
  r.p = student_t_two_sided_p(r.t, r.df);
  const double half = student_t_quantile((1 + r.level) / 2, r.df) * r.se;
  r.ci_low = r.estimate - half;
  r.ci_high = r.estimate + half;
  return r;
}

}  // namespace

MeanSd mean_sd(const std::vector<double>& values) {
  MeanSd m;
  m.n = static_cast<int64_t>(values.size());
  if (values.empty()) return {kNaN, kNaN, 0};
  double sum = 0;
  for (const double v : values) sum += v;
  m.mean = sum / static_cast<double>(m.n);
  double ss = 0;
  for (const double v : values) ss += (v - m.mean) * (v - m.mean);
  m.sd = m.n > 1 ? std::sqrt(ss / static_cast<double>(m.n - 1)) : 0.0;
  if (!std::isfinite(m.mean)) m.sd = kNaN;
  return m;
}

double student_t_two_sided_p(double t, double df) {
  if (!std::isfinite(t) || !(df > 0)) return kNaN;
  return incomplete_beta(df / 2, 0.5, df / (df + t * t));
}

double student_t_quantile(double q, double df) {
  if (!(q > 0 && q < 1) || !(df > 0) || !std::isfinite(df)) return kNaN;
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

WelchT welch_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  const TTest w = welch_test(a, b);
  return {w.t, w.df, w.p};
}

TTest welch_test(const std::vector<double>& a, const std::vector<double>& b, double level) {
  const MeanSd x = mean_sd(a), y = mean_sd(b);
  TTest r;
  r.n_a = x.n;
  r.n_b = y.n;
  r.level = level;
  r.estimate = x.mean - y.mean;
  if (x.n < 2 || y.n < 2) return finish(r);  // se 0: every number but the estimate NaN
  const double va = x.sd * x.sd / static_cast<double>(x.n);
  const double vb = y.sd * y.sd / static_cast<double>(y.n);
  r.se = std::sqrt(va + vb);
  r.df = (va + vb) * (va + vb) /
         (va * va / static_cast<double>(x.n - 1) + vb * vb / static_cast<double>(y.n - 1));
  return finish(r);
}

TTest paired_t_test(const std::vector<double>& a, const std::vector<double>& b, double level) {
  if (a.size() != b.size()) {
    throw std::invalid_argument("paired_t_test: " + std::to_string(a.size()) + " values against " +
                                std::to_string(b.size()) + " (one pair per unit)");
  }
  std::vector<double> d(a.size());
  for (size_t k = 0; k < a.size(); ++k) d[k] = a[k] - b[k];
  const MeanSd m = mean_sd(d);
  TTest r;
  r.paired = true;
  r.n_a = r.n_b = m.n;
  r.level = level;
  r.estimate = m.mean;
  if (m.n >= 2) {
    r.se = m.sd / std::sqrt(static_cast<double>(m.n));
    r.df = static_cast<double>(m.n - 1);
  }
  return finish(r);
}

std::vector<double> holm_adjust(const std::vector<double>& p) {
  std::vector<size_t> order;
  for (size_t k = 0; k < p.size(); ++k) {
    if (std::isfinite(p[k])) order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
  std::vector<double> adjusted(p.size(), kNaN);
  const double m = static_cast<double>(order.size());
  double running = 0;  // step-down: an adjusted p never falls below an earlier one
  for (size_t j = 0; j < order.size(); ++j) {
    running = std::max(running, std::min(1.0, (m - static_cast<double>(j)) * p[order[j]]));
    adjusted[order[j]] = running;
  }
  return adjusted;
}

double detectable_difference(double se, double df, double alpha, double power) {
  if (!std::isfinite(se) || !std::isfinite(df)) return kNaN;
  return (student_t_quantile(1 - alpha / 2, df) + student_t_quantile(power, df)) * se;
}

double detectable_difference(const TTest& test, double alpha, double power) {
  return detectable_difference(test.se, test.df, alpha, power);
}

double detectable_difference(const std::vector<double>& a, const std::vector<double>& b,
                             double alpha, double power) {
  return detectable_difference(welch_test(a, b), alpha, power);
}

std::vector<TestRow> test_families(const std::vector<MetricGroups>& metrics,
                                   const std::vector<DeclaredTest>& primary) {
  std::vector<TestRow> first(primary.size()), rest;
  std::vector<bool> found(primary.size(), false);
  for (const MetricGroups& m : metrics) {
    for (size_t i = 0; i < m.groups.size(); ++i) {
      for (size_t j = i + 1; j < m.groups.size(); ++j) {
        const Group *a = &m.groups[i], *b = &m.groups[j];
        size_t declared = primary.size();
        for (size_t k = 0; k < primary.size(); ++k) {
          const DeclaredTest& d = primary[k];
          if (d.metric != m.metric) continue;
          if (d.a == b->name && d.b == a->name) std::swap(a, b);  // as declared: a - b
          if (d.a == a->name && d.b == b->name) declared = k;
        }
        TestRow r;
        r.metric = m.metric;
        r.a = a->name;
        r.b = b->name;
        const bool paired = !a->units.empty() && a->units == b->units;
        r.test = paired ? paired_t_test(a->values, b->values) : welch_test(a->values, b->values);
        if (declared < primary.size() && !found[declared]) {
          r.primary = found[declared] = true;
          first[declared] = r;
        } else {
          rest.push_back(r);
        }
      }
    }
  }
  std::vector<TestRow> rows;
  for (size_t k = 0; k < primary.size(); ++k) {
    if (found[k]) rows.push_back(first[k]);
  }
  const size_t n_primary = rows.size();
  rows.insert(rows.end(), rest.begin(), rest.end());
  // Holm, its strictest level and the detectable difference within each family.
  for (const auto& [begin, end] :
       {std::pair<size_t, size_t>{0, n_primary}, {n_primary, rows.size()}}) {
    std::vector<double> p;
    for (size_t k = begin; k < end; ++k) p.push_back(rows[k].test.p);
    const std::vector<double> holm = holm_adjust(p);
    int64_t m = 0;
    for (const double v : p) m += std::isfinite(v);
    for (size_t k = begin; k < end; ++k) {
      TestRow& r = rows[k];
      r.holm_p = holm[k - begin];
      r.family_size = m;
      r.alpha = m > 0 ? kFamilyAlpha / static_cast<double>(m) : kNaN;
      r.detectable = detectable_difference(r.test, r.alpha, kPower);
    }
  }
  return rows;
}

}  // namespace fogo::trainer
