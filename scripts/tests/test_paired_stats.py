"""scripts/paired_stats.py against tabulated values (t and chi-square tables, the exact
Wilcoxon null distribution counted by hand) and a paired test docs/results.md printed."""
import importlib.util
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("paired_stats", os.path.join(HERE, "..", "paired_stats.py"))
ps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ps)


def test_t_and_chi_square_match_their_tables():
    # Student's t table: t_{0.975} for df 2, 4, 9, 12; t_{0.8} for df 4.
    for df, q in [(2, 4.303), (4, 2.776), (9, 2.262), (12, 2.179)]:
        assert abs(ps.t_quantile(0.975, df) - q) < 1e-3
    assert abs(ps.t_quantile(0.8, 4) - 0.941) < 1e-3
    # chi-square table: the 5% and 1% critical values of df 5 are 11.070 and 15.086.
    assert abs(ps.chi2_sf(11.070, 5) - 0.05) < 1e-4
    assert abs(ps.chi2_sf(15.086, 5) - 0.01) < 1e-4
    assert abs(ps.chi2_sf(3.841, 1) - 0.05) < 1e-4  # the small-x series branch


def test_paired_reproduces_a_printed_test():
    # docs/results.md, 3(b)'s primary test: per seed -4.44, +4.30, -0.20, -5.08, -3.04 gives
    # -1.69, 95% CI -6.46 to +3.08, p 0.38 (the trainer's paired_t_test).
    r = ps.paired([-4.44, 4.30, -0.20, -5.08, -3.04])
    assert round(r["mean"], 2) == -1.69 and r["df"] == 4
    assert round(r["ci"][0], 2) == -6.46 and round(r["ci"][1], 2) == 3.08
    assert round(r["p"], 2) == 0.38


def test_wilcoxon_exact_counts_sign_assignments():
    # n = 3, all positive: W+ = 6 is the most extreme of 8 assignments, so is W+ = 0: p = 2/8.
    assert ps.wilcoxon_exact([1.0, 2.0, 3.0]) == {"n": 3, "w_plus": 6.0, "p": 0.25}
    # n = 5 all negative: p = 2/32 = 0.0625 (the smallest two-sided p with five pairs).
    assert ps.wilcoxon_exact([-1, -2, -3, -4, -5])["p"] == 0.0625
    # zeros dropped, ties share a rank: |1|, |1| get rank 1.5 each.
    r = ps.wilcoxon_exact([0.0, 1.0, -1.0, 2.0])
    assert r["n"] == 3 and r["w_plus"] == 1.5 + 3


def test_cochran_q_of_equal_and_spread_estimates():
    same = ps.cochran_q([1.0, 1.0, 1.0], [0.5, 1.0, 2.0])
    assert same["q"] == 0 and same["p"] == 1.0 and same["pooled"] == 1.0
    # two estimates 0 and 2 with se 1: pooled 1, Q = 1 + 1 = 2 on 1 df.
    two = ps.cochran_q([0.0, 2.0], [1.0, 1.0])
    assert two["q"] == 2.0 and two["df"] == 1 and abs(two["p"] - 0.1573) < 1e-4
    assert abs(two["pooled_se"] - math.sqrt(0.5)) < 1e-12


def test_holm():
    assert ps.holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
