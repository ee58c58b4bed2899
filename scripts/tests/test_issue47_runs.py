"""scripts/issue47_runs.py: the declared tests read kept files, pair by seed over the declared
seeds only (tuning seeds and grid points never enter), and refuse a seed kept twice."""
import importlib.util
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("issue47_runs", os.path.join(HERE, "..", "issue47_runs.py"))
runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runs)


def write(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def record(opt, seed, rare, run=None, split="test"):
    return {"run": run or f"{opt}-seed{seed}", "split": split, "optimizer": opt, "seed": seed,
            "completed": True, "rare_acc": rare, "acc": rare + 30}


def test_primary_pairs_declared_seeds_only(tmp_path):
    d = str(tmp_path)
    # 3(b)'s kept files hold tuning seeds 20, 21 too; they must not be paired.
    write(os.path.join(d, "2026-11-27-ci16-cosine-fogo.jsonl"),
          [record("fogo", s, 60 + s) for s in range(20, 25)])
    write(os.path.join(d, "2026-11-27-ci16-cosine-muon.jsonl"),
          [record("muon", s, 50.0) for s in range(20, 25)])
    write(os.path.join(d, "2026-11-29-ci16-fresh-fogo.jsonl"),
          [record("fogo", 25, 70.0), record("fogo", 26, 71.0, run="sweep/lr0.01/fogo-seed26", split="val")])
    write(os.path.join(d, "2026-11-29-ci16-fresh-muon.jsonl"), [record("muon", 25, 69.0), record("muon", 26, 1.0)])
    rows = runs.test_results(d)
    primary = rows[0]
    assert primary["family"] == "primary" and (primary["a"], primary["b"]) == ("fogo", "muon")
    assert primary["pairs"] == [22, 23, 24, 25]  # 26: fogo's only record is a grid point
    assert primary["diffs"] == [32.0, 33.0, 34.0, 1.0]
    assert primary["declared"] == 13
    assert abs(primary["t"]["mean"] - 25.0) < 1e-12
    assert primary["wilcoxon"]["p"] == 0.125  # four positive differences: 2 / 16
    # The memory-off test has no runs yet: counted as p = 1 in its Holm family of three.
    memory = rows[1]
    assert memory["pairs"] == [] and "t" not in memory and memory["holm"] == 1.0


def test_a_seed_kept_twice_is_refused(tmp_path):
    d = str(tmp_path)
    write(os.path.join(d, "2026-11-29-ci16-fresh-normuon.jsonl"), [record("muon", 25, 1.0)])
    write(os.path.join(d, "2026-11-30-ci16-fresh-normuon.jsonl"), [record("muon", 25, 2.0)])
    try:
        runs.kept_runs("normuon", d)
    except SystemExit as e:
        assert "seed 25 kept twice" in str(e)
    else:
        raise AssertionError("a seed kept twice was paired silently")


def test_arm_table_reads_fresh_test_seeds_only(tmp_path):
    d = str(tmp_path)
    recs = [dict(record("muon", s, r), lr=0.03, nonrare_acc=95.0, mean_rare_forgetting=1.0,
                 rare_forget_rate=9.0) for s, r in ((25, 60.0), (26, 64.0), (40, 10.0))]
    recs.append(dict(record("muon", 40, 77.0, run="sweep/lr0.03/muon-seed40", split="val"), lr=0.03))
    recs.append(dict(record("muon", 41, 79.0, run="sweep/lr0.03/muon-seed41", split="val"), lr=0.03))
    write(os.path.join(d, "2026-11-29-ci16-fresh-normuon.jsonl"), recs)
    row = next(r for r in runs.arm_rows(d) if r["arm"] == "normuon")
    assert row["seeds"] == [25, 26]  # tuning seed 40's re-run is not a test run
    assert row["rare_acc"][0] == 62.0 and abs(row["rare_acc"][1] - 8 ** 0.5) < 1e-12
    assert row["rare_per_seed"] == [60.0, 64.0] and row["lr"] == [0.03]
    assert runs.normuon_grid(d) == {0.03: {40: 107.0, 41: 109.0}}  # acc = rare + 30 here


def test_work_queue_keeps_both_workers_busy_and_normuon_after_its_sweep():
    items = [("normuon-sweep", None), ("fogo", 25), ("normuon", 25), ("muon", 25)]
    q = runs.WorkQueue(items)
    assert q.take() == ("normuon-sweep", None)
    assert q.take() == ("fogo", 25)  # the sweep runs: NorMuon's seed waits, the rest goes on
    assert q.take() == ("muon", 25)
    q.done(("normuon-sweep", None))
    assert q.take() == ("normuon", 25)
    assert q.take() is None
    # A failed sweep drops NorMuon's runs (they have no lr) and wakes whoever waits for them.
    q = runs.WorkQueue([("normuon-sweep", None), ("normuon", 26), ("fogo", 26)])
    assert q.take() == ("normuon-sweep", None) and q.take() == ("fogo", 26)
    q.done(("normuon-sweep", None), ok=False)
    assert q.take() is None
    # With nothing to wait for, every item once, in order.
    q = runs.WorkQueue([("fogo", 30), ("normuon", 30)])
    assert [q.take(), q.take(), q.take()] == [("fogo", 30), ("normuon", 30), None]


def test_work_items_are_the_unfinished_runs(tmp_path):
    out = str(tmp_path)
    done = runs.run_dir(out, "fogo", 25)
    os.makedirs(done)
    write(os.path.join(done, "result.jsonl"), [{"completed": True}])
    items = runs.work_items(out)
    assert items[0] == ("normuon-sweep", None)  # nothing of the sweep has finished
    assert ("fogo", 25) not in items and ("muon", 25) in items
    assert len(items) == 1 + 5 * 10 - 1 + 2 * 10  # and the replication's NorMuon and Muon
    assert items[-2:] == [("normuon", 54), ("muon", 54)]
