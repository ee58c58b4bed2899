#!/usr/bin/env python3
"""Keeps the per-run outputs a table of docs/results.md is computed from, in the repository.

    scripts/keep_runs.py RUN_FOLDER docs/runs/NAME.jsonl [--command TEXT] [--note TEXT]

writes one JSON line per run of RUN_FOLDER (issue 34: "small JSONL with commit, date, machine,
command per run, so a reader can recompute each number"):

- resnet_train: every <optimizer>-seed<seed>/result.jsonl under RUN_FOLDER (the runs of the
  table; "split": "test") and under RUN_FOLDER/sweep/lr<lr>/ (the grid points of --lr-sweep, on
  the validation split: "split": "val"), as the trainer wrote them: optimizer, seed, lr, every
  summary metric, the wall time, and the command, machine and date of the session that trained
  the run (kept in its checkpoint).
- gpt2: every run folder holding metrics.jsonl (<optimizer>-seed<seed>, sweep/<optimizer>-x<f>,
  or RUN_FOLDER itself): the validation records as "curve" ([tokens, train seconds, val loss]
  each: loss against tokens and against seconds) and the final validation loss, with the command,
  commit, machine, isa and date of the session that trained it last (provenance.jsonl, since
  issue 47); for runs made before that --command gives the command (one for the folder).

Every line gets "run" (its folder under RUN_FOLDER), "kept_commit" (git describe --always
--dirty of this checkout) and, when given, --command and --note. "commit" is the commit of the
binary that trained the run where its record names it (resnet_train since issue 47, with "isa"),
else this checkout's, as before issue 47 (then keep runs from the checkout whose build made them).
Standard library only. Prints what it kept.
"""
import argparse
import json
import os
import subprocess
import sys


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def commit_of(folder):
    """git describe --always --dirty of the checkout holding `folder`, or "unknown"."""
    try:
        out = subprocess.run(["git", "-C", folder, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def resnet_runs(root):
    """result.jsonl of every run under root: the table's runs, then the sweep's grid points."""
    runs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if "result.jsonl" not in filenames:
            continue
        records = read_jsonl(os.path.join(dirpath, "result.jsonl"))
        if not records:
            continue
        record = dict(records[-1])
        rel = os.path.relpath(dirpath, root)
        split = record.pop("eval_split", "val" if rel.startswith("sweep" + os.sep) else "test")
        record = {"run": rel, "split": split, **record}
        runs.append(record)
    return runs


def gpt2_runs(root):
    """The validation curve and final loss of every folder holding a gpt2 metrics.jsonl."""
    runs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if "metrics.jsonl" not in filenames:
            continue
        records = read_jsonl(os.path.join(dirpath, "metrics.jsonl"))
        curve = [[r["tokens"], r.get("train_seconds"), r["val_loss"]] for r in records
                 if r.get("val_loss") is not None]
        if not curve:
            continue
        first = records[0]
        run = {"run": os.path.relpath(dirpath, root), "optimizer": first.get("optimizer"),
               "lr": first.get("lr"), "steps": records[-1].get("step"),
               "final_val_loss": curve[-1][2], "curve": curve}
        # Since issue 47 the trainer records each session's command, binary commit, machine,
        # ISA and date (provenance.jsonl): the last session's is the run's.
        if "provenance.jsonl" in filenames:
            sessions = read_jsonl(os.path.join(dirpath, "provenance.jsonl"))
            if sessions:
                run.update({k: v for k, v in sessions[-1].items() if k != "step" and v})
        runs.append(run)
    return runs


def keep(root, out, command=None, note=None):
    runs = resnet_runs(root) or gpt2_runs(root)
    if not runs:
        raise SystemExit(f"keep_runs: no result.jsonl or metrics.jsonl under {root}")
    commit = commit_of(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        for run in runs:
            # The binary's own commit when its record names it (issue 47), else the checkout's.
            line = {**run, "commit": run.get("commit") or commit, "kept_commit": commit}
            if command and not run.get("command"):
                line["command"] = command
            if note:
                line["note"] = note
            f.write(json.dumps(line, sort_keys=False) + "\n")
    return runs


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_folder")
    parser.add_argument("out", help="docs/runs/<date>-<table>.jsonl")
    parser.add_argument("--command", help="the command that made the runs (gpt2: required)")
    parser.add_argument("--note", help="anything a reader needs (load, what was tuned)")
    args = parser.parse_args(argv)
    runs = keep(args.run_folder, args.out, args.command, args.note)
    print(f"kept {len(runs)} runs of {args.run_folder} in {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
