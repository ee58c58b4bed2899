#!/usr/bin/env python3
"""The statistics docs/results.md prints, in the standard library (the lead's .venv has no scipy).

- paired(diffs): the paired t-test of per-seed differences (mean, sd, se, t, df, two-sided p,
  95% CI) and the difference it detects at a level with 80% power, as the trainers compute it
  (examples/common/stats.h: (t_{1-alpha/2, df} + t_{power, df}) se);
- wilcoxon_exact(diffs): the exact two-sided Wilcoxon signed-rank test (every sign assignment
  enumerated; zero differences dropped, ties given their mean rank);
- cochran_q(estimates, ses): Cochran's Q heterogeneity of estimates pooled by inverse variance,
  its df and p (chi-square), and I^2;
- holm(ps): Holm-adjusted p-values.

The distribution functions are the regularized incomplete beta and gamma functions (continued
fractions and series, Numerical Recipes' textbook forms), checked in scripts/tests against
tabulated quantiles.
"""
import itertools
import math


def _betacf(a, b, x):
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                     + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf2(t, df):
    """Two-sided p of a t statistic: P(|T| >= |t|)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t, df):
    half = 0.5 * t_sf2(t, df)
    return 1.0 - half if t >= 0 else half


def t_quantile(q, df):
    """The q quantile of Student's t with df degrees of freedom (bisection on t_cdf)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def chi2_sf(x, df):
    """P(X >= x) for a chi-square with df degrees of freedom (regularized upper gamma)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    if x < a + 1:  # series for the lower function
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-16 * abs(total):
            n += 1
            term *= x / n
            total += term
        return 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a))
    tiny = 1e-300  # continued fraction for the upper function
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 400):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def mean_sd(values):
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return m, sd


def detectable(se, df, alpha=0.05, power=0.8):
    """The difference a t-test with this se and df declares at level alpha with probability power."""
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se


def paired(diffs, alpha=0.05):
    """The paired t-test of per-seed differences A - B (two-sided), its 95% CI and detectable."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"paired: needs >= 2 differences, got {n}")
    m, sd = mean_sd(diffs)
    se = sd / math.sqrt(n)
    df = n - 1
    t = m / se if se > 0 else math.copysign(math.inf, m) if m else 0.0
    half = t_quantile(0.975, df) * se
    return {"n": n, "mean": m, "sd": sd, "se": se, "t": t, "df": df, "p": t_sf2(t, df),
            "ci": (m - half, m + half), "detectable": detectable(se, df, alpha)}


def wilcoxon_exact(diffs):
    """Exact two-sided Wilcoxon signed-rank test: W+ (sum of the positive differences' ranks),
    the number of non-zero differences and p = P(|W+ - n(n+1)/4| >= observed) over every sign
    assignment."""
    d = [x for x in diffs if x != 0]
    n = len(d)
    order = sorted(range(n), key=lambda k: abs(d[k]))
    ranks = [0.0] * n
    k = 0
    while k < n:  # ties share their mean rank
        j = k
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[k]]):
            j += 1
        for i in range(k, j + 1):
            ranks[order[i]] = (k + j) / 2.0 + 1
        k = j + 1
    w_plus = sum(r for r, x in zip(ranks, d) if x > 0)
    centre = sum(ranks) / 2.0
    observed = abs(w_plus - centre)
    hits = 0
    for signs in itertools.product((0, 1), repeat=n):
        w = sum(r for r, s in zip(ranks, signs) if s)
        hits += abs(w - centre) >= observed - 1e-9
    return {"n": n, "w_plus": w_plus, "p": hits / 2 ** n}


def cochran_q(estimates, ses):
    """Cochran's Q of estimates with standard errors ses, pooled by inverse variance."""
    w = [1.0 / s ** 2 for s in ses]
    pooled = sum(wi * e for wi, e in zip(w, estimates)) / sum(w)
    q = sum(wi * (e - pooled) ** 2 for wi, e in zip(w, estimates))
    df = len(estimates) - 1
    return {"q": q, "df": df, "p": chi2_sf(q, df), "pooled": pooled,
            "pooled_se": math.sqrt(1.0 / sum(w)), "i2": max(0.0, (q - df) / q) if q > 0 else 0.0}


def holm(ps):
    """Holm's step-down adjusted p-values, in the order given."""
    m = len(ps)
    order = sorted(range(m), key=lambda k: ps[k])
    adjusted = [0.0] * m
    running = 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[k]))
        adjusted[k] = running
    return adjusted
