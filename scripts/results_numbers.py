#!/usr/bin/env python3
"""Recomputes the numbers of docs/results.md's one-screen answer (and the sentences issue 47
corrected) from the kept runs in docs/runs/*.jsonl, and prints them:

    scripts/results_numbers.py [--runs docs/runs]

- class-imbalanced 3(a) (seeds 10-19) and 3(b) (test seeds 20-24; 22-24 without its tuning
  seeds): FOGO - Muon paired by seed, the t-test beside the exact Wilcoxon signed-rank test, and
  3(a) without its collapsed Muon seed 12;
- Cochran's Q of the six class-imbalanced FOGO - Muon estimates (the four tables of 2026-11-26,
  whose runs were not kept: their per-seed differences are the ones docs/results.md prints, in
  OLD_TABLES below; 3(a) and 3(b) from their kept files) and of the four tables alone (the pool
  the page once led with);
- class-IL with every classifier on AdamW (experiment 2): the 12 tests of every pair on AP, AF,
  AF_clip and BWT, the primary two (FOGO - Muon on AP and BWT) Holm over 2, the other ten Holm
  over 10;
- the GPT-2 toy (seeds 2001-2005): FOGO - Muon, NorMuon - Muon, FOGO+NorMuon - FOGO, and the
  wall-clock ratios of the idle-machine runs;
- the H100 costs of docs/gpu-runs/2026-11-27-h100-86c2a25/train.md.
Standard library only (scripts/paired_stats.py).
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import paired_stats as st  # noqa: E402

# FOGO - Muon rare-class accuracy per seed (0 / 1 / 2) of the four tables of 2026-11-25/26, as
# docs/results.md prints them ("Class-imbalanced across the four tables"); their run folders were
# not committed, so these printed differences are all that is left of them.
OLD_TABLES = {
    "rare 4-8, 4 epochs": [-9.44, -0.92, -4.78],
    "rare 0-4": [-7.42, -12.94, -22.20],
    "rare 0, 2, 4, 6, 8": [-2.98, -14.14, -8.46],
    "rare 4-8, 8 epochs": [-16.54, 3.20, -6.08],
}


def load(runs, name):
    with open(os.path.join(runs, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def by_seed(records, optimizer=None, split="test"):
    """{seed: record} of the table runs (not grid points) of one optimizer."""
    out = {}
    for r in records:
        if r.get("split") != split or "/" in r.get("run", "") or "seed" not in r:
            continue
        if optimizer and r.get("optimizer") != optimizer:
            continue
        out[r["seed"]] = r
    return out


def diffs(a, b, metric, seeds):
    return [a[s][metric] - b[s][metric] for s in seeds]


def fmt_t(r):
    return (f"{r['mean']:+.2f} (95% CI {r['ci'][0]:+.2f} to {r['ci'][1]:+.2f}; t {r['t']:.2f}, "
            f"df {r['df']}, p {r['p']:.3f}; detectable at 5% {r['detectable']:.1f})")


def fmt_w(w):
    return f"exact Wilcoxon W+ {w['w_plus']:g} of n {w['n']}, p {w['p']:.4f}"


def line(label, d):
    t, w = st.paired(d), st.wilcoxon_exact(d)
    print(f"{label}: {fmt_t(t)}; {fmt_w(w)}; per seed " + ", ".join(f"{x:+.2f}" for x in d))
    return t


CI_METRICS = ("acc", "rare_acc", "nonrare_acc", "rare_forgetting", "mean_rare_forgetting",
              "rare_forget_rate")


def secondary_family(label, arms, seeds):
    """The trainer's secondary family of a class-imbalanced table: every pair on every metric but
    the primary FOGO - Muon on rare_acc, paired, Holm over the 17; the rows on acc and rare_acc."""
    rows = []
    for metric in CI_METRICS:
        for a, b in (("fogo", "muon"), ("fogo", "adam"), ("muon", "adam")):
            if (metric, a, b) != ("rare_acc", "fogo", "muon"):
                rows.append((metric, a, b, st.paired(diffs(arms[a], arms[b], metric, seeds))))
    holm = st.holm([r[3]["p"] for r in rows])
    for (metric, a, b, t), h in zip(rows, holm):
        if metric in ("acc", "rare_acc"):
            print(f"{label} secondary (Holm over {len(rows)}) {metric} {a} - {b}: {fmt_t(t)}, Holm {h:.3f}")


def class_imbalanced(runs):
    print("== class-imbalanced, FOGO - Muon")
    fresh = load(runs, "2026-11-27-ci48-fresh.jsonl")
    fogo, muon = by_seed(fresh, "fogo"), by_seed(fresh, "muon")
    seeds_a = list(range(10, 20))
    t_a = line("3(a) rare_acc, seeds 10-19", diffs(fogo, muon, "rare_acc", seeds_a))
    line("3(a) acc, seeds 10-19", diffs(fogo, muon, "acc", seeds_a))
    no12 = [s for s in seeds_a if s != 12]
    line("3(a) rare_acc without seed 12", diffs(fogo, muon, "rare_acc", no12))
    print(f"   Muon seed 12 rare_acc {muon[12]['rare_acc']}, acc {muon[12]['acc']}; "
          f"FOGO seed 12 rare_acc {fogo[12]['rare_acc']}")
    adam = by_seed(fresh, "adam")
    secondary_family("3(a)", {"fogo": fogo, "muon": muon, "adam": adam}, seeds_a)
    f16 = by_seed(load(runs, "2026-11-27-ci16-cosine-fogo.jsonl"))
    m16 = by_seed(load(runs, "2026-11-27-ci16-cosine-muon.jsonl"))
    t_b = line("3(b) rare_acc, seeds 20-24", diffs(f16, m16, "rare_acc", range(20, 25)))
    line("3(b) rare_acc, seeds 22-24 (no tuning seed)", diffs(f16, m16, "rare_acc", range(22, 25)))
    line("3(b) acc, seeds 20-24", diffs(f16, m16, "acc", range(20, 25)))
    a16 = by_seed(load(runs, "2026-11-27-ci16-cosine-adam.jsonl"))
    secondary_family("3(b)", {"fogo": f16, "muon": m16, "adam": a16}, range(20, 25))

    print("== heterogeneity of the FOGO - Muon rare-class estimates (Cochran's Q)")
    old = {name: st.paired(d) for name, d in OLD_TABLES.items()}
    for name, t in old.items():
        print(f"{name}: {t['mean']:+.2f}, se {t['se']:.2f}")
    six = list(old.values()) + [t_a, t_b]
    for label, ests in (("four tables of 2026-11-26", list(old.values())),
                        ("six estimates (four tables, 3(a), 3(b))", six)):
        q = st.cochran_q([t["mean"] for t in ests], [t["se"] for t in ests])
        print(f"{label}: Q {q['q']:.1f} on {q['df']} df, p {q['p']:.4f}, I^2 {100 * q['i2']:.0f}%; "
              f"inverse-variance pooled {q['pooled']:+.2f} (se {q['pooled_se']:.2f})")
    table_means = [t["mean"] for t in old.values()]
    pooled = st.paired(table_means)
    print(f"four tables, table as the unit: {fmt_t(pooled)}")


def class_il(runs):
    print("== class-IL, every classifier on AdamW (experiment 2), seeds 0-4")
    arms = {o: by_seed(load(runs, f"2026-11-27-cil-heads-{o}.jsonl")) for o in ("fogo", "muon", "adam")}
    seeds = range(5)
    rows = []
    for metric in ("AP", "AF", "AF_clip", "BWT"):
        for a, b in (("fogo", "muon"), ("fogo", "adam"), ("muon", "adam")):
            d = diffs(arms[a], arms[b], metric, seeds)
            rows.append((metric, a, b, d, st.paired(d), st.wilcoxon_exact(d)))
    primary = [r for r in rows if (r[1], r[2]) == ("fogo", "muon") and r[0] in ("AP", "BWT")]
    secondary = [r for r in rows if r not in primary]
    for family, members in (("primary, Holm over 2", primary), ("secondary, Holm over 10", secondary)):
        holm = st.holm([r[4]["p"] for r in members])
        for (metric, a, b, d, t, w), h in zip(members, holm):
            first = st.detectable(t["se"], t["df"], 0.05 / len(members))
            print(f"[{family}] {metric} {a} - {b}: {fmt_t(t)}, Holm {h:.3f}, detectable at "
                  f"0.05/{len(members)} {first:.1f}; {fmt_w(w)}; per seed "
                  + ", ".join(f"{x:+.2f}" for x in d))


def gpt2(runs):
    print("== GPT-2 toy, final validation loss, seeds 2001-2005")
    val = {}
    for name in ("2026-11-27-gpt2-toy-protocol.jsonl", "2026-11-27-gpt2-toy-normuon.jsonl",
                 "2026-11-27-gpt2-toy-fogo-normuon.jsonl"):
        for r in load(runs, name):
            if r["split"] == "val":
                val.setdefault(r["config"], {})[r["seed"]] = r["final_loss"]
    seeds = range(2001, 2006)
    for a, b in (("fogo", "muon"), ("normuon", "muon"), ("normuon", "fogo"),
                 ("fogo-normuon", "fogo"), ("fogo-normuon", "normuon"), ("fogo-fusion", "fogo")):
        d = [val[a][s] - val[b][s] for s in seeds]
        t, w = st.paired(d), st.wilcoxon_exact(d)
        print(f"{a} - {b}: {t['mean']:+.4f} (95% CI {t['ci'][0]:+.4f} to {t['ci'][1]:+.4f}, p "
              f"{t['p']:.4f}; detectable at 5% {t['detectable']:.3f}); {fmt_w(w)}")
    print("== GPT-2 toy, idle machine: training seconds at step 100 (mean of seeds 2001, 2002)")
    clock = {}
    for r in load(runs, "2026-11-27-gpt2-toy-wallclock.jsonl"):
        clock.setdefault(r["run"].rsplit("-seed", 1)[0], []).append(r["curve"][-1][1])
    muon = sum(clock["muon"]) / len(clock["muon"])
    for config, secs in clock.items():
        mean = sum(secs) / len(secs)
        print(f"{config}: {mean:.1f} s, {mean / muon:.2f}x Muon's")


def h100():
    path = os.path.join(ROOT, "docs", "gpu-runs", "2026-11-27-h100-86c2a25", "train.md")
    print(f"== H100 ({os.path.relpath(path, ROOT)})")
    with open(path) as f:
        text = f.read()
    step = {m[0]: float(m[1]) for m in re.findall(r"\| gpt2-(\w+) \| steady state .*?median step ([\d.]+) ms", text)}
    images = {m[0]: int(m[1]) for m in re.findall(r"\| resnet-(\w+) \| resnet18 width 64 \w+: (\d+) images/s", text)}
    print("GPT-2 (paper architecture, 85M parameters with the byte vocabulary), median step ms: "
          + ", ".join(f"{k} {v}" for k, v in step.items())
          + f"; FOGO / Muon {step['fogo'] / step['muon']:.3f}")
    print("ResNet-18 width 64, images/s: " + ", ".join(f"{k} {v}" for k, v in images.items())
          + f"; FOGO / Muon {images['fogo'] / images['muon']:.3f}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=os.path.join(ROOT, "docs", "runs"))
    args = parser.parse_args(argv)
    class_imbalanced(args.runs)
    class_il(args.runs)
    gpt2(args.runs)
    h100()


if __name__ == "__main__":
    main(sys.argv[1:])
