#!/usr/bin/env python3
"""The paper's main claim at GPU scale (issue 44, section 4): gpu_check.sh's `claim` step runs
ResNet-18 on class-imbalanced Fashion-MNIST with FOGO and Muon, seed by seed in pairs, and this
script declares the test, keeps each run's record and writes the result. Standard library only
(it runs on the GPU machine's bare python3).

    gpu_claim.py plan                              -> the declared test, before any run
    gpu_claim.py record RUN_DIR COMMIT EXIT WALL   -> one JSON line: the run's record
    gpu_claim.py report RECORDS.jsonl              -> markdown: the runs and the paired test

The primary test is fixed here, in code, before any run (PRIMARY): it is the one the report
judges the claim by, whatever the numbers show; nothing else is tested.
"""
import json
import math
import os
import sys

RARE = (4, 5, 6, 7, 8)  # the paper's rare classes (10% of their training images kept)
PAIR = ("fogo", "muon")  # a minus b
PRIMARY = ("FOGO - Muon on rare-class accuracy (classes 4-8, % of their test images correct at "
           "the end of training), paired by seed (the same initial weights, data selection and "
           "order on both sides); two-sided 95% t interval of the mean difference, and the "
           "difference the pairs detect at alpha 0.05 with 80% power")
ALPHA, POWER = 0.05, 0.8


def t_cdf(x, df):
    """Student's t distribution function: 1/2 + the density integrated from 0 to |x| (Simpson's
    rule over the substitution u = atan(x / sqrt(df)), where the integrand is smooth)."""
    if x < 0:
        return 1 - t_cdf(-x, df)
    # With t = sqrt(df) tan(u): the density times dt is c cos(u)^(df - 1) du.
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    top, n = math.atan(x / math.sqrt(df)), 2000
    h = top / n
    s = sum((1 if k in (0, n) else 4 if k % 2 else 2) * math.cos(k * h) ** (df - 1)
            for k in range(n + 1))
    return 0.5 + c * s * h / 3


def t_quantile(q, df):
    """The q-quantile of Student's t with df degrees of freedom (bisection on t_cdf)."""
    if not 0 < q < 1 or not df > 0:
        raise ValueError(f"t_quantile: q must be in (0, 1) and df > 0, got q {q}, df {df}")
    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def paired_test(a, b):
    """The paired t-test of a - b (lists of equal length): n, mean, sd, se, the 95% interval and
    the detectable difference; the spread's figures are NaN below 2 pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired_test: {len(a)} values against {len(b)}")
    n = len(a)
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / n if n else math.nan
    nan = dict(n=n, mean=mean, sd=math.nan, se=math.nan, low=math.nan, high=math.nan,
               detectable=math.nan)
    if n < 2:
        return nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    half = t_quantile(1 - ALPHA / 2, n - 1) * se
    return dict(n=n, mean=mean, sd=sd, se=se, low=mean - half, high=mean + half,
                detectable=(t_quantile(1 - ALPHA / 2, n - 1) + t_quantile(POWER, n - 1)) * se)


def last_record(path):
    try:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None
    return lines[-1] if lines else None


def record(run_dir, commit, exit_code, wall):
    """A run's record from its folder: optimizer, seed, lr, accuracy per class (the last
    evaluation), rare and overall accuracy, seconds, commit, and how the run ended."""
    result = last_record(os.path.join(run_dir, "result.jsonl")) or {}
    evaluation = last_record(os.path.join(run_dir, "eval.jsonl")) or {}
    name = os.path.basename(run_dir.rstrip("/"))
    optimizer, _, seed = name.partition("-seed")
    per_class = [evaluation.get(f"acc_class{k}") for k in range(10)]
    return {
        "run": name, "optimizer": result.get("optimizer", optimizer),
        "seed": result.get("seed", int(seed) if seed.isdigit() else seed),
        "lr": result.get("lr"), "steps": result.get("steps"),
        "completed": bool(result.get("completed")) and int(exit_code) == 0,
        "exit": int(exit_code), "rare_acc": result.get("rare_acc"), "acc": result.get("acc"),
        "nonrare_acc": result.get("nonrare_acc"),
        "acc_per_class": per_class if any(v is not None for v in per_class) else None,
        "train_seconds": result.get("train_seconds"), "wall_seconds": float(wall),
        "commit": commit, "command": result.get("command"), "machine": result.get("machine"),
        "date": result.get("date"),
    }


def pairs(records):
    """{seed: (a's rare acc, b's rare acc)} over the seeds where both runs completed."""
    done = {}
    for r in records:
        if r.get("completed") and r.get("rare_acc") is not None:
            done.setdefault(r["seed"], {})[r["optimizer"]] = r["rare_acc"]
    return {s: (v[PAIR[0]], v[PAIR[1]]) for s, v in sorted(done.items()) if set(PAIR) <= set(v)}


def fmt(x, digits=2):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def report(path):
    records = []
    if os.path.exists(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    out = ["## The paper's claim at GPU scale (issue 44)", "", f"Primary test, declared before "
           f"any run (scripts/gpu_claim.py): {PRIMARY}.", ""]
    if not records:
        return "\n".join(out + ["No run finished (the step did not run or ran out of time).", ""])
    both = pairs(records)
    test = paired_test([a for a, _ in both.values()], [b for _, b in both.values()])
    out.append(f"**{test['n']} complete pair(s): FOGO - Muon rare-class accuracy "
               f"{fmt(test['mean'])} points (95% CI {fmt(test['low'])} to {fmt(test['high'])}; "
               f"sd of the differences {fmt(test['sd'])}; the pairs detect "
               f"{fmt(test['detectable'])} points with 80% power).**")
    if test["n"] >= 2:
        verdict = ("FOGO above Muon" if test["low"] > 0 else "Muon above FOGO" if test["high"] < 0
                   else "not separated")
        out.append(f"Reading: {verdict} at the 95% level.")
    else:
        out.append("Reading: fewer than 2 complete pairs, no interval.")
    out += ["", "| run | seed | lr | rare acc | acc | per class 0-9 (%) | train s | wall s | "
            "steps | completed | commit |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        per_class = " ".join(fmt(v, 1) for v in r["acc_per_class"] or [])
        out.append(f"| {r['run']} | {r['seed']} | {r['lr']} | {fmt(r['rare_acc'])} | "
                   f"{fmt(r['acc'])} | {per_class or '-'} | {fmt(r['train_seconds'], 1)} | "
                   f"{fmt(r['wall_seconds'], 1)} | {r['steps']} | "
                   f"{'yes' if r['completed'] else 'no (exit %d)' % r['exit']} | {r['commit']} |")
    out += ["", "Every record (JSON lines, for docs/runs/): logs.tgz, logs/claim-runs.jsonl.", ""]
    return "\n".join(out)


def main(argv):
    if len(argv) == 2 and argv[1] == "plan":
        print(f"primary test: {PRIMARY}")
    elif len(argv) == 6 and argv[1] == "record":
        print(json.dumps(record(*argv[2:])))
    elif len(argv) == 3 and argv[1] == "report":
        print(report(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
