#!/usr/bin/env python3
"""Issue 47's runs: 3(b) extended to fresh seeds 25-34 with a memory-off FOGO arm, and NorMuon on
ResNet-18 (tuned on its own seeds, then on the same fresh seeds), with FOGO+NorMuon against FOGO.

    scripts/issue47_runs.py run [--out runs/issue47] [--bin PATH]   # resumable; two lanes
    scripts/issue47_runs.py status [--out runs/issue47]             # which runs have finished
    scripts/issue47_runs.py keep [--out runs/issue47]               # into docs/runs/
    scripts/issue47_runs.py tests                                   # the declared tests, from docs/runs

The tests (TESTS below) were named in this file, and committed, before any of these runs started.
`run` trains every run that has no finished result.jsonl under --out, each with --resume (a run
killed part-way continues from its last checkpoint), two processes at a time (two workers taking
the runs from one queue, WorkQueue below), one torch thread each; start it at nice 19 in the background:

    setsid nohup nice -n 19 scripts/issue47_runs.py run > runs/issue47.log 2>&1 &

The first `run` copies the binary to OUT/bin/ and every later `run` on that OUT uses the copy, so a
rebuild never changes the binary of one experiment (each run's record names its commit anyway).
`keep` writes docs/runs/DATE-ci16-fresh-ARM.jsonl per arm (scripts/keep_runs.py); `tests` reads
docs/runs only, so a reader recomputes each number from the kept files.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import paired_stats  # noqa: E402

# 3(b)'s settings (docs/results.md, "16 epochs with a cosine schedule"): 672 steps, cosine.
# Newton-Schulz in bf16, what `auto` chose for 3(b) (Xeon) and chooses here (AVX512-BF16), named
# so that no run's choice rests on a timing taken beside other work.
SETTINGS = ["--scenario", "class-imbalanced", "--width", "8", "--epochs", "16", "--lr-schedule",
            "cosine", "--batch-size", "64", "--train-per-class", "500", "--test-per-class", "0",
            "--eval-every", "84", "--threads", "1", "--device", "cpu", "--no-plots",
            "--ns-dtype", "bf16"]

# Seeds. Tuning seeds are never test seeds (issue 47, item 3).
TUNING_SEEDS_3B = [20, 21]        # 3(b)'s x2 grids of FOGO, Muon, Adam (kept, 2026-11-27)
TUNING_SEEDS_NORMUON = [40, 41]   # NorMuon's x2 grid: seeds no other run of this page used
KEPT_TEST_SEEDS_3B = [22, 23, 24]  # 3(b)'s test seeds that tuned nothing (kept runs, Xeon)
FRESH_SEEDS = list(range(25, 35))  # issue 47's ten fresh seeds
# A replication of NorMuon's primary test, named (and committed) after the first ten seeds had run
# (NorMuon - Muon +1.79 rare-class points, t p 0.037, Wilcoxon p 0.064) and before any of these:
# NorMuon at its chosen 3e-2 and Muon at 6e-2 on ten more seeds that nothing has used.
REPLICATION_SEEDS = list(range(45, 55))

# The arms: resnet_train flags beside SETTINGS. FOGO and Muon at 3(b)'s chosen lrs. "memory-off"
# is the issue's arm: fusion and both orthogonalized streams kept, codebook (projection,
# centroids) and filters off, i.e. --fogo fusion_only=true (--ablation memory-off would also
# drop the slerp). FOGO+NorMuon runs at FOGO's chosen lr, not re-tuned (NorMuon rescales its
# update to the orthogonalized update's Frobenius norm, so the step size is unchanged; on the
# GPT-2 toy FOGO+NorMuon's grid chose FOGO's lr).
ARMS = {
    "fogo": ["--optimizers", "fogo", "--lr", "1.2e-2"],
    "muon": ["--optimizers", "muon", "--lr", "6e-2"],
    "fogo-memory-off": ["--optimizers", "fogo", "--lr", "1.2e-2", "--fogo", "fusion_only=true"],
    "fogo-normuon": ["--optimizers", "fogo", "--lr", "1.2e-2", "--fogo", "normuon=true"],
    "normuon": ["--optimizers", "muon", "--muon-normuon"],  # lr: its own sweep's choice
}
# NorMuon's sweep: Muon's x2 grid around Muon's 3(b) choice, scored on the validation split over
# its tuning seeds, extended at an edge; the trainer re-runs the chosen lr on every --seeds (the
# re-runs on the tuning seeds are not test runs: TESTS never reads them).
NORMUON_SWEEP = ["--optimizer-lr", "muon=6e-2", "--lr-sweep", "0.25,0.5,1,2,4", "--sweep-seeds",
                 "2", "--sweep-extend", "4"]
OPTIMIZER = {arm: flags[1] for arm, flags in ARMS.items()}  # the name in run folders

# The declared tests, each paired by seed, A - B on the test split (rare_acc: rare-class
# accuracy, the paper's metric). One primary test per experiment; each experiment's secondary
# tests are a Holm family of their own. Seeds 22-24 of fogo and muon are 3(b)'s kept runs
# (binaries of 3e679c5 on an Intel Xeon with AMX); every other run is this script's.
TESTS = [
    # Experiment "3(b) extended".
    {"experiment": "3(b) extended", "family": "primary", "metric": "rare_acc", "a": "fogo",
     "b": "muon", "seeds": KEPT_TEST_SEEDS_3B + FRESH_SEEDS},
    {"experiment": "3(b) extended", "family": "secondary", "metric": "rare_acc", "a": "fogo",
     "b": "fogo-memory-off", "seeds": FRESH_SEEDS},  # the paper's mechanism claim
    {"experiment": "3(b) extended", "family": "secondary", "metric": "acc", "a": "fogo",
     "b": "fogo-memory-off", "seeds": FRESH_SEEDS},
    {"experiment": "3(b) extended", "family": "secondary", "metric": "acc", "a": "fogo",
     "b": "muon", "seeds": KEPT_TEST_SEEDS_3B + FRESH_SEEDS},
    # Experiment "NorMuon on ResNet-18".
    {"experiment": "NorMuon", "family": "primary", "metric": "rare_acc", "a": "normuon",
     "b": "muon", "seeds": FRESH_SEEDS},
    {"experiment": "NorMuon", "family": "secondary", "metric": "rare_acc", "a": "fogo-normuon",
     "b": "fogo", "seeds": FRESH_SEEDS},
    {"experiment": "NorMuon", "family": "secondary", "metric": "rare_acc", "a": "normuon",
     "b": "fogo", "seeds": FRESH_SEEDS},
    {"experiment": "NorMuon", "family": "secondary", "metric": "acc", "a": "normuon",
     "b": "muon", "seeds": FRESH_SEEDS},
    # Experiment "NorMuon replication" (REPLICATION_SEEDS above): its one test, on its own seeds.
    {"experiment": "NorMuon replication", "family": "primary", "metric": "rare_acc",
     "a": "normuon", "b": "muon", "seeds": REPLICATION_SEEDS},
]

# Where `tests` reads each arm's test runs: the kept files of 3(b) and of this script's `keep`.
KEPT = {
    "fogo": ["2026-11-27-ci16-cosine-fogo.jsonl", "*-ci16-fresh-fogo.jsonl"],
    "muon": ["2026-11-27-ci16-cosine-muon.jsonl", "*-ci16-fresh-muon.jsonl"],
    "fogo-memory-off": ["*-ci16-fresh-fogo-memory-off.jsonl"],
    "fogo-normuon": ["*-ci16-fresh-fogo-normuon.jsonl"],
    "normuon": ["*-ci16-fresh-normuon.jsonl"],
}


def run_dir(out, arm, seed):
    return os.path.join(out, arm, f"{OPTIMIZER[arm]}-seed{seed}")


def finished(out, arm, seed):
    path = os.path.join(run_dir(out, arm, seed), "result.jsonl")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return bool(lines) and bool(lines[-1].get("completed"))


def binary(out, given):
    """OUT/bin/resnet_train: the copy every run of OUT uses (made from `given` the first time)."""
    copy = os.path.join(out, "bin", "resnet_train")
    if not os.path.exists(copy):
        if not os.path.exists(given):
            raise SystemExit(f"--bin: {given} does not exist (scripts/build.sh resnet_train)")
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copy2(given, copy)
    return copy


def train(bin_path, out, arm, seeds, extra, log):
    """One resnet_train process for `arm` on `seeds` (--resume: continues or reloads)."""
    cmd = [bin_path] + SETTINGS + ARMS[arm] + extra + [
        "--seeds", ",".join(map(str, seeds)), "--resume", "--out", os.path.join(out, arm)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(log, "a") as f:
        f.write("\n$ " + " ".join(cmd) + "\n")
        f.flush()
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if code != 0:
        raise RuntimeError(f"{arm} seeds {seeds}: resnet_train exited {code} (log {log})")


def normuon_lr(out):
    """The lr NorMuon's sweep chose: its re-run on the first tuning seed records it."""
    path = os.path.join(run_dir(out, "normuon", TUNING_SEEDS_NORMUON[0]), "result.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()][-1]["lr"]


def work_items(out):
    """Every run still to do, in order: NorMuon's sweep (its tuning seeds, then its choice re-run
    on them and on seed 25) first, then per fresh seed FOGO and Muon (the primary pair),
    memory-off, NorMuon, FOGO+NorMuon. An item is (arm, seed), or ("normuon-sweep", None)."""
    items = []
    if not all(finished(out, "normuon", s) for s in TUNING_SEEDS_NORMUON + FRESH_SEEDS[:1]):
        items.append(("normuon-sweep", None))
    for seed in FRESH_SEEDS:
        for arm in ("fogo", "muon", "fogo-memory-off", "normuon", "fogo-normuon"):
            if not finished(out, arm, seed):
                items.append((arm, seed))
    for seed in REPLICATION_SEEDS:
        for arm in ("normuon", "muon"):
            if not finished(out, arm, seed):
                items.append((arm, seed))
    return items


class WorkQueue:
    """The items shared by the workers: each takes the first one it may start (NorMuon's runs
    wait for its sweep, which sets their lr), so both stay busy until the last runs and no run is
    ever started twice."""

    def __init__(self, items):
        self._pending = list(items)
        self._sweep_done = ("normuon-sweep", None) not in self._pending
        self._cond = threading.Condition()

    def take(self):
        """The next item, or None when every item has been taken."""
        with self._cond:
            while True:
                for k, (arm, seed) in enumerate(self._pending):
                    if arm != "normuon" or self._sweep_done:
                        return self._pending.pop(k)
                if not self._pending:
                    return None
                self._cond.wait()  # only NorMuon's runs are left: they wait for the sweep

    def done(self, item, ok=True):
        """`item` has finished (ok) or failed: a failed sweep leaves NorMuon's runs no lr, so
        they are dropped."""
        with self._cond:
            if item[0] == "normuon-sweep":
                self._sweep_done = True
                if not ok:
                    self._pending = [i for i in self._pending if i[0] != "normuon"]
            self._cond.notify_all()


def run_item(bin_path, out, item, log):
    arm, seed = item
    if arm == "normuon-sweep":
        train(bin_path, out, "normuon", TUNING_SEEDS_NORMUON + FRESH_SEEDS[:1], NORMUON_SWEEP, log)
    elif arm == "normuon":
        train(bin_path, out, arm, [seed], ["--lr", f"{normuon_lr(out):g}"], log)
    else:
        train(bin_path, out, arm, [seed], [], log)


def run(args):
    os.makedirs(args.out, exist_ok=True)
    bin_path = binary(args.out, args.bin)
    work = WorkQueue(work_items(args.out))
    errors = []

    def worker(log):
        while (item := work.take()) is not None:
            try:
                run_item(bin_path, args.out, item, log)
                work.done(item)
            except Exception as e:  # the other worker goes on; the error is reported at the end
                errors.append(str(e))
                work.done(item, ok=False)

    workers = [threading.Thread(target=worker, args=(os.path.join(args.out, name + ".log"),))
               for name in ("lane-a", "lane-b")]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise SystemExit("issue47_runs: " + "; ".join(errors))
    print("issue47_runs: every run finished")


def status(args):
    for arm in ARMS:
        seeds = FRESH_SEEDS + (TUNING_SEEDS_NORMUON if arm == "normuon" else []) + (
            REPLICATION_SEEDS if arm in ("normuon", "muon") else [])
        done = [s for s in seeds if finished(args.out, arm, s)]
        print(f"{arm}: {len(done)} of {len(seeds)} finished: {done}")


def keep(args):
    keep_runs = os.path.join(HERE, "keep_runs.py")
    for arm in ARMS:
        folder = os.path.join(args.out, arm)
        if not glob.glob(os.path.join(folder, "**", "result.jsonl"), recursive=True):
            continue
        dest = os.path.join(ROOT, "docs", "runs", f"{args.date}-ci16-fresh-{arm}.jsonl")
        note = (f"issue 47 ({'NorMuon' if 'normuon' in arm else '3(b) extended'}): arm {arm} "
                f"({' '.join(ARMS[arm])}), 3(b)'s settings; scripts/issue47_runs.py run at nice 19, "
                f"two runs at a time beside other engineers' builds; only finished runs are tests")
        subprocess.check_call([sys.executable, keep_runs, folder, dest, "--note", note])


def kept_runs(arm, runs_dir):
    """{seed: record} of the arm's finished test runs in docs/runs; a seed kept twice is refused."""
    by_seed = {}
    for pattern in KEPT[arm]:
        for path in sorted(glob.glob(os.path.join(runs_dir, pattern))):
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    if r.get("split") != "test" or not r.get("completed", True):
                        continue
                    if "/" in r["run"]:  # a sweep's grid point
                        continue
                    if r["seed"] in by_seed:
                        raise SystemExit(f"{arm}: seed {r['seed']} kept twice ({path})")
                    by_seed[r["seed"]] = r
    return by_seed


def family_size(test):
    return sum(t["experiment"] == test["experiment"] and t["family"] == test["family"]
               for t in TESTS)


def test_results(runs_dir):
    """Every declared test on the pairs kept so far (n of its declared seeds): the paired t-test
    (its detectable difference at the level Holm applies first in its family, 0.05/m), the exact
    Wilcoxon signed-rank test beside it, and Holm over the whole declared family (a test without
    enough pairs yet counts as p = 1)."""
    rows = []
    for test in TESTS:
        a, b = kept_runs(test["a"], runs_dir), kept_runs(test["b"], runs_dir)
        seeds = [s for s in test["seeds"] if s in a and s in b]
        diffs = [a[s][test["metric"]] - b[s][test["metric"]] for s in seeds]
        row = dict(test, pairs=seeds, diffs=diffs, declared=len(test["seeds"]))
        if len(diffs) >= 2:
            row["t"] = paired_stats.paired(diffs, alpha=0.05 / family_size(test))
            row["wilcoxon"] = paired_stats.wilcoxon_exact(diffs)
        rows.append(row)
    for experiment in {t["experiment"] for t in TESTS}:
        for family in ("primary", "secondary"):
            members = [r for r in rows if r["experiment"] == experiment and r["family"] == family]
            ps = [r["t"]["p"] if "t" in r else 1.0 for r in members]
            for r, h in zip(members, paired_stats.holm(ps)):
                r["holm"] = h
    return rows


def planned_detectable(runs_dir):
    """The difference each test detects at its level with 80% power if its differences spread as
    3(b)'s five FOGO - Muon rare-class differences (seeds 20-24) did: the plan before the runs."""
    fogo, muon = kept_runs("fogo", runs_dir), kept_runs("muon", runs_dir)
    sd = paired_stats.paired([fogo[s]["rare_acc"] - muon[s]["rare_acc"] for s in range(20, 25)])["sd"]
    print(f"plan: 3(b)'s FOGO - Muon rare-class differences have sd {sd:.2f}")
    for test in TESTS:
        n = len(test["seeds"])
        d = paired_stats.detectable(sd / n ** 0.5, n - 1, 0.05 / family_size(test))
        print(f"plan: [{test['experiment']}, {test['family']}] {test['a']} - {test['b']} on "
              f"{test['metric']}, {n} pairs: detects about {d:.1f} at 0.05/{family_size(test)}")


def tests(args):
    planned_detectable(args.runs)
    for r in test_results(args.runs):
        head = (f"[{r['experiment']}, {r['family']}] {r['a']} - {r['b']} on {r['metric']}: "
                f"{len(r['pairs'])} of {r['declared']} pairs")
        if "t" not in r:
            print(head + " (too few to test)")
            continue
        t, w = r["t"], r["wilcoxon"]
        state = "complete" if len(r["pairs"]) == r["declared"] else "INCOMPLETE: not the test"
        print(f"{head} ({state}): {t['mean']:+.2f} (95% CI {t['ci'][0]:+.2f} to {t['ci'][1]:+.2f};"
              f" t {t['t']:.2f}, df {t['df']}, p {t['p']:.3f}, Holm over {family_size(r)} "
              f"{r['holm']:.3f}); detectable at 0.05/{family_size(r)} {t['detectable']:.2f}; exact Wilcoxon W+ {w['w_plus']:g} of n {w['n']}, "
              f"p {w['p']:.3f}; per seed " + ", ".join(
                  f"{s}: {d:+.2f}" for s, d in zip(r["pairs"], r["diffs"])))


def arm_rows(runs_dir, seeds=FRESH_SEEDS):
    """Each arm's test runs on `seeds` (those kept), as mean and sd of each metric, and the
    rare-class accuracy per seed: the table docs/results.md prints."""
    metrics = ["acc", "rare_acc", "nonrare_acc", "mean_rare_forgetting", "rare_forget_rate"]
    rows = []
    for arm in ARMS:
        kept = kept_runs(arm, runs_dir)
        have = [s for s in seeds if s in kept]
        row = {"arm": arm, "seeds": have, "lr": sorted({kept[s]["lr"] for s in have}),
               "rare_per_seed": [kept[s]["rare_acc"] for s in have]}
        for m in metrics:
            values = [kept[s][m] for s in have]
            mean = sum(values) / len(values) if values else float("nan")
            var = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)
                   if len(values) > 1 else float("nan"))
            row[m] = (mean, var ** 0.5)
        rows.append(row)
    return rows


def normuon_grid(runs_dir):
    """{lr: {seed: validation accuracy}} of NorMuon's grid points on its tuning seeds."""
    grid = {}
    for pattern in KEPT["normuon"]:
        for path in sorted(glob.glob(os.path.join(runs_dir, pattern))):
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    if r.get("split") == "val" and r["seed"] in TUNING_SEEDS_NORMUON:
                        grid.setdefault(r["lr"], {})[r["seed"]] = r["acc"]
    return grid


def tables(args):
    """Markdown: NorMuon's grid, every arm on the fresh seeds, and the declared tests."""
    print("| lr | validation acc, mean (seed " +
          " / seed ".join(str(s) for s in TUNING_SEEDS_NORMUON) + ") |\n|---:|---|")
    for lr, by_seed in sorted(normuon_grid(args.runs).items()):
        accs = [by_seed.get(s) for s in TUNING_SEEDS_NORMUON]
        mean = (sum(accs) / len(accs)) if None not in accs else float("nan")
        print(f"| {lr:g} | {mean:.2f} (" + " / ".join(
            "-" if a is None else f"{a:.2f}" for a in accs) + ") |")
    print("\n| arm | lr | seeds | acc (%) | rare acc (%) | non-rare acc (%) | mean rare forgetting "
          "(%) | rare forget rate (%) | rare acc per seed |\n|---|---:|---|---:|---:|---:|---:|---:|---|")
    for r in arm_rows(args.runs):
        cells = [f"{r[m][0]:.2f} ± {r[m][1]:.2f}" for m in
                 ("acc", "rare_acc", "nonrare_acc", "mean_rare_forgetting", "rare_forget_rate")]
        seeds = f"{r['seeds'][0]}-{r['seeds'][-1]} ({len(r['seeds'])})" if r["seeds"] else "none"
        print(f"| {r['arm']} | {', '.join(f'{x:g}' for x in r['lr'])} | {seeds} | " +
              " | ".join(cells) + " | " + " / ".join(f"{v:.2f}" for v in r["rare_per_seed"]) + " |")
    print("\nThe replication (seeds " + f"{REPLICATION_SEEDS[0]}-{REPLICATION_SEEDS[-1]}):\n")
    print("| arm | seeds | acc (%) | rare acc (%) | rare acc per seed |\n|---|---|---:|---:|---|")
    for r in arm_rows(args.runs, REPLICATION_SEEDS):
        if r["arm"] not in ("normuon", "muon") or not r["seeds"]:
            continue
        print(f"| {r['arm']} | {len(r['seeds'])} | {r['acc'][0]:.2f} ± {r['acc'][1]:.2f} | "
              f"{r['rare_acc'][0]:.2f} ± {r['rare_acc'][1]:.2f} | " +
              " / ".join(f"{v:.2f}" for v in r["rare_per_seed"]) + " |")
    print("\n| experiment, family | test (metric) | pairs | A - B (95% CI) | p: t / Wilcoxon | Holm "
          "| detects |\n|---|---|---:|---:|---|---:|---:|")
    for r in test_results(args.runs):
        pairs = f"{len(r['pairs'])} of {r['declared']}"
        if "t" not in r:
            print(f"| {r['experiment']}, {r['family']} | {r['a']} - {r['b']} ({r['metric']}) | "
                  f"{pairs} | too few | | | |")
            continue
        t, w = r["t"], r["wilcoxon"]
        mark = "" if len(r["pairs"]) == r["declared"] else " INCOMPLETE"
        print(f"| {r['experiment']}, {r['family']}{mark} | {r['a']} - {r['b']} ({r['metric']}) | "
              f"{pairs} | {t['mean']:+.2f} ({t['ci'][0]:+.2f} to {t['ci'][1]:+.2f}) | "
              f"{t['p']:.3f} / {w['p']:.3f} | {r['holm']:.3f} | {t['detectable']:.1f} |")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("run", "status", "keep"):
        p = sub.add_parser(name)
        p.add_argument("--out", default=os.path.join(ROOT, "runs", "issue47"))
        if name == "run":
            p.add_argument("--bin", default=os.path.join(ROOT, "build", "examples", "resnet",
                                                         "resnet_train"))
        if name == "keep":
            p.add_argument("--date", default="2026-11-29", help="the kept files' date prefix")
    for name in ("tests", "tables"):
        p = sub.add_parser(name)
        p.add_argument("--runs", default=os.path.join(ROOT, "docs", "runs"))
    args = parser.parse_args(argv)
    {"run": run, "status": status, "keep": keep, "tests": tests, "tables": tables}[args.what](args)


if __name__ == "__main__":
    main(sys.argv[1:])
