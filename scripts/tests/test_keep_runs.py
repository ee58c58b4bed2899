"""scripts/keep_runs.py on folders shaped like what resnet_train and gpt2 leave."""
import importlib.util
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("keep_runs", os.path.join(HERE, "..", "keep_runs.py"))
keep_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(keep_runs)


def write(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_resnet_runs_and_grid_points_keep_their_provenance(tmp_path):
    root = tmp_path / "ci"
    run = {"optimizer": "fogo", "seed": 1, "lr": 0.006, "rare_acc": 40.66, "command": "resnet_train --x",
           "machine": "AMD EPYC (2 CPUs)", "date": "2026-11-27T10:00:00Z"}
    write(str(root / "fogo-seed1" / "result.jsonl"), [run])
    write(str(root / "sweep" / "lr0.003" / "fogo-seed0" / "result.jsonl"), [dict(run, seed=0)])
    out = tmp_path / "docs" / "runs" / "t.jsonl"
    keep_runs.keep(str(root), str(out), note="loaded machine")
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["run"] for l in lines] == ["fogo-seed1", os.path.join("sweep", "lr0.003", "fogo-seed0")]
    assert [l["split"] for l in lines] == ["test", "val"]
    assert lines[0]["rare_acc"] == 40.66 and lines[0]["command"] == "resnet_train --x"
    assert lines[0]["machine"] == "AMD EPYC (2 CPUs)" and lines[0]["date"] == "2026-11-27T10:00:00Z"
    assert lines[0]["commit"] and lines[0]["note"] == "loaded machine"
    assert lines[0]["kept_commit"] == lines[0]["commit"]  # a record that names no binary


def test_a_record_naming_its_binary_keeps_that_commit(tmp_path):
    # issue 47: resnet_train records the commit of its binary and the CPU's ISA; keeping the runs
    # from a later checkout must not replace them.
    root = tmp_path / "ci"
    run = {"optimizer": "muon", "seed": 25, "lr": 0.06, "rare_acc": 61.0, "commit": "0123456789ab",
           "isa": "avx2 avx512f", "machine": "AMD EPYC (2 CPUs)", "date": "2026-11-29T02:00:00Z"}
    write(str(root / "muon-seed25" / "result.jsonl"), [run])
    out = tmp_path / "k.jsonl"
    keep_runs.keep(str(root), str(out))
    (line,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert line["commit"] == "0123456789ab" and line["isa"] == "avx2 avx512f"
    assert line["kept_commit"] == keep_runs.commit_of(HERE)


def test_gpt2_runs_keep_loss_against_tokens_and_seconds(tmp_path):
    root = tmp_path / "gpt2"
    records = [{"step": 25, "tokens": 51200, "optimizer": "fogo", "lr": 0.006, "train_loss": 2.5,
                "val_loss": None, "train_seconds": 14.0},
               {"step": 25, "tokens": 51200, "optimizer": "fogo", "lr": 0.006, "val_loss": 2.41,
                "train_seconds": 15.0},
               {"step": 100, "tokens": 204800, "optimizer": "fogo", "lr": 0.006, "val_loss": 1.90,
                "train_seconds": 61.0}]
    write(str(root / "fogo-seed1337" / "metrics.jsonl"), records)
    out = tmp_path / "g.jsonl"
    keep_runs.keep(str(root), str(out), command="gpt2 compare ...")
    (line,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert line["run"] == "fogo-seed1337" and line["final_val_loss"] == 1.90
    assert line["curve"] == [[51200, 15.0, 2.41], [204800, 61.0, 1.90]]
    assert line["command"] == "gpt2 compare ..."


def test_gpt2_runs_keep_their_last_sessions_provenance(tmp_path):
    root = tmp_path / "gpt2"
    write(str(root / "muon-seed1" / "metrics.jsonl"),
          [{"step": 100, "tokens": 204800, "optimizer": "muon", "lr": 0.024, "val_loss": 1.85,
            "train_seconds": 17.7}])
    write(str(root / "muon-seed1" / "provenance.jsonl"),
          [{"step": 0, "command": "gpt2 train --a", "commit": "aaaaaaaaaaaa", "isa": "avx2",
            "machine": "m1", "date": "2026-11-29T01:00:00Z"},
           {"step": 50, "command": "gpt2 train --a --resume", "commit": "bbbbbbbbbbbb",
            "isa": "avx2 avx512f", "machine": "m2", "date": "2026-11-29T02:00:00Z"}])
    out = tmp_path / "p.jsonl"
    keep_runs.keep(str(root), str(out), command="ignored: the run names its own")
    (line,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert line["commit"] == "bbbbbbbbbbbb" and line["machine"] == "m2"
    assert line["isa"] == "avx2 avx512f" and line["date"] == "2026-11-29T02:00:00Z"
    assert line["command"] == "gpt2 train --a --resume"


def test_an_empty_folder_is_refused(tmp_path):
    try:
        keep_runs.keep(str(tmp_path), str(tmp_path / "x.jsonl"))
    except SystemExit as e:
        assert "no result.jsonl" in str(e)
    else:
        raise AssertionError("kept nothing without saying so")
