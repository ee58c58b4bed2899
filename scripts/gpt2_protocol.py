#!/usr/bin/env python3
"""The GPT-2 toy under the evidence protocol (docs/results.md "Protocol"), one run at a time.

For each configuration: a x2 learning-rate grid, every point trained on two tuning seeds and
scored by the mean final loss on the tuning split (the last --tune-fraction of every training
span, held out from training; never the validation split); while the best point is at an edge
of the grid, the grid is extended by one x2 step on that side (at most --extend times). The
chosen lr is then re-run on fresh seeds and scored on the validation split.

Every finished run is appended to <out>/runs.jsonl at once (configuration, lr, seed, split,
final loss, the validation curve against tokens and seconds, commit, date, machine, command),
so a stopped job resumes where it stopped (runs already in runs.jsonl are not run again) and a
reader can recompute every table from that file alone.

    scripts/gpt2_protocol.py --gpt2 build/examples/gpt2/gpt2 --data runs/kjv/kjv.txt \
        --out runs/gpt2-protocol --config muon --config fogo \
        --config fogo-fusion='--optimizer fogo --fogo fusion_only=true'
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

# The toy of docs/results.md: model mini, 204,800 tokens, batch 16, warmup-stable-decay.
BASE = ["train", "--model", "mini", "--tokens", "204800", "--batch-size", "16",
        "--eval-every", "25", "--device", "cpu", "--threads", "1"]
DEFAULT_GRIDS = {"adamw": [9e-4, 1.8e-3, 3.6e-3]}
MATRIX_GRID = [3e-3, 6e-3, 1.2e-2, 2.4e-2]


def machine():
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {'/'.join(isa) or 'no avx2'}, {platform.node()}"


def read_curve(folder):
    curve = []
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("val_loss") is not None:
                curve.append([r["tokens"], round(r["train_seconds"], 3), r["val_loss"]])
    return curve


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpt2", required=True, help="the gpt2 binary")
    ap.add_argument("--data", required=True, help="kjv.txt (gpt2 prepare-kjv)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None, help="the binary's commit (default: this checkout's)")
    ap.add_argument("--config", action="append", required=True,
                    help="NAME or NAME='gpt2 train flags' (NAME alone: --optimizer NAME)")
    ap.add_argument("--grid", action="append", default=[],
                    help="NAME=lr,lr,...: the starting grid (x2 apart) of a configuration")
    ap.add_argument("--tune-seeds", default="1337,1338")
    ap.add_argument("--seeds", default="2001,2002,2003,2004,2005")
    ap.add_argument("--tune-fraction", default="0.1")
    ap.add_argument("--extend", type=int, default=4)
    ap.add_argument("--tune-only", action="store_true", help="stop after choosing the lrs")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    ledger = os.path.join(args.out, "runs.jsonl")
    done = {}
    if os.path.exists(ledger):
        for line in open(ledger):
            r = json.loads(line)
            done[(r["config"], r["lr"], r["seed"], r["split"])] = r
    commit = args.commit or subprocess.run(
        ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True).stdout.strip()
    host = machine()
    grids = dict(DEFAULT_GRIDS)
    for g in args.grid:
        name, lrs = g.split("=", 1)
        grids[name] = [float(x) for x in lrs.split(",")]

    def run(name, flags, lr, seed, split):
        key = (name, lr, seed, split)
        if key in done:
            return done[key]
        folder = os.path.join(args.out, "runs", f"{name}-lr{lr:g}-{split}-seed{seed}")
        cmd = [args.gpt2, *BASE, *flags, "--data", args.data, "--lr", f"{lr:g}", "--seed",
               str(seed), "--data-seed", str(seed), "--out", folder, "--overwrite"]
        if split == "tune":
            cmd += ["--tune-fraction", args.tune_fraction]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"gpt2_protocol: run failed ({proc.returncode}): {shlex.join(cmd)}\n"
                     + proc.stdout[-2000:] + proc.stderr[-2000:])
        curve = read_curve(folder)
        rec = {"config": name, "lr": lr, "seed": seed, "split": split,
               "final_loss": curve[-1][2], "curve_tokens_seconds_loss": curve,
               "wall_seconds": round(time.time() - t0, 1), "commit": commit,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "machine": host, "command": shlex.join(["gpt2", *cmd[1:]])}
        with open(ledger, "a") as f:
            f.write(json.dumps(rec) + "\n")
        done[key] = rec
        print(f"{name} lr {lr:g} {split} seed {seed}: {rec['final_loss']:.4f} "
              f"({rec['wall_seconds']:.0f} s)", flush=True)
        return rec

    tune_seeds = [int(s) for s in args.tune_seeds.split(",")]
    chosen = {}
    for spec in args.config:
        name, _, flagtext = spec.partition("=")
        flags = shlex.split(flagtext) if flagtext else ["--optimizer", name]
        grid = list(grids.get(name, MATRIX_GRID))

        def score(lr):
            return sum(run(name, flags, lr, s, "tune")["final_loss"] for s in tune_seeds) / len(
                tune_seeds)

        extensions = 0
        while True:
            scores = {lr: score(lr) for lr in grid}
            best = min(grid, key=lambda lr: scores[lr])
            at_edge = best in (grid[0], grid[-1])
            if not at_edge or extensions == args.extend:
                break
            extensions += 1
            if best == grid[0]:
                grid.insert(0, grid[0] / 2)
            else:
                grid.append(grid[-1] * 2)
        if at_edge:
            print(f"{name}: the best lr is still at the grid's edge after {extensions} "
                  "extensions", flush=True)
        chosen[name] = (best, flags)
        print(f"{name}: chosen lr {best:g} (tuning loss {scores[best]:.4f}; grid "
              + ", ".join(f"{lr:g}: {scores[lr]:.4f}" for lr in sorted(scores)) + ")", flush=True)
    if args.tune_only:
        return
    for name, (lr, flags) in chosen.items():
        for seed in [int(s) for s in args.seeds.split(",")]:
            run(name, flags, lr, seed, "val")


if __name__ == "__main__":
    main()
