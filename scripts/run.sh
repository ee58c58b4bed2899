#!/usr/bin/env bash
# The main job: a CPU-sized class-imbalanced comparison of FOGO, Muon and Adam on Fashion-MNIST
# (ResNet-18 at width 8; classes 4-8 rare, keeping 10% of their training images; 4 epochs =
# 168 steps; 3 seeds; a few minutes on 2 cores after the build). Each optimizer runs at the
# learning rate that issue 28's validation sweep chose for exactly these settings, not at the
# paper's rates, which at this width mostly measure step size. That sweep (docs/results.md,
# "Class-imbalanced, rare classes 4-8"; 2026-11-25, commit b6a7e9f) scored an x2 grid centred on
# the previous one-seed choices on two seeds per point, extending it at an edge, one optimizer
# per command (their grids and re-runs are exactly those of the one command):
#   resnet_train --scenario class-imbalanced --optimizers fogo,muon,adam --seeds 0,1,2 \
#     --optimizer-lr fogo=3e-3,muon=3e-2,adam=3e-3 --lr-sweep 0.25,0.5,1,2,4 --sweep-seeds 2 \
#     --sweep-extend 4 --width 8 --epochs 4 --batch-size 64 --train-per-class 500 \
#     --test-per-class 0 --eval-every 21 --threads 1 --device cpu --out runs/ci-rare48
# and chose FOGO 6e-3, Muon 3e-2, Adam 3e-3 (none at a grid edge). This script re-runs that
# sweep's test stage.
# Evaluates on the full Fashion-MNIST test set (10,000 images; --test-per-class 0 = all): 8
# evaluations of 10,000 images per run instead of 1,000, about 2.5x the forward passes of the
# 168 training steps; one run takes about a minute on one core. So that the job takes a few
# minutes, the three optimizers train as three processes at once (one torch thread each; on 2
# idle cores 4 min 25 s in all, 2026-11-26, against 8 min 34 s as one process), each into
# runs/main.parts/<optimizer>; their finished runs are then moved into runs/main and joined by
# the same command with --resume, which reloads them (the runs are deterministic on one
# machine, so the table is the one a single process prints: the same bits, checked in
# docs/results.md) and reports each run's own wall time (kept in its checkpoint). With extra
# arguments the job runs as one process (they may change which runs there are).
# While the three processes train, it shows one live line per optimizer (epoch, step, loss, ETA)
# read from their logs (scripts/live_progress.py). Then it prints the mean ± sd table (with the machine and the wall time per run) and the tests between
# every two optimizers on every metric, paired by seed, in two families each Holm-adjusted on its
# own: the primary test named in the code before the runs (FOGO - Muon on rare-class accuracy,
# the paper's claim) and the 17 others, each with its 95% CI and the smallest difference the
# seeds detect at the level Holm applies in its family (docs/trainers.md, "Output files"). It ends
# with the primary test in a sentence (difference, 95% CI, p; separated or not, and what these
# seeds could detect) and the ranking by rare-class accuracy; runs/main/ gets per-run metrics
# (runs.jsonl: each run's command, machine and date too), summary.md and the plots accuracy.png
# and forgetting.png. Extra arguments go to resnet_train and override these (see
# build/examples/resnet/resnet_train --help).
#
# --threads 1: on a 2-core machine shared with other work, one torch thread per process is several
# times faster than two (OpenMP threads spin-waiting for a busy core).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Only the trainer and what it links (the library, the trainers' common code): not the ~100
# targets of tests, benches and the Python module, which scripts/test.sh builds.
"$root/scripts/build.sh" resnet_train
cd "$root"
bin=$(source scripts/torch.sh && fogo_build_dir "$FOGO_TORCH")/examples/resnet/resnet_train
out=runs/main
settings=(--scenario class-imbalanced --seeds 0,1,2 --width 8 --epochs 4 --batch-size 64
  --train-per-class 500 --test-per-class 0 --eval-every 21 --threads 1 --device cpu)
lrs=(fogo=6e-3 muon=3e-2 adam=3e-3)
all=(--optimizers fogo,muon,adam --optimizer-lr "$(IFS=,; echo "${lrs[*]}")")

if [ $# -gt 0 ]; then
  exec "$bin" "${settings[@]}" "${all[@]}" --out "$out" "$@"
fi

# Never replace the runs of an earlier job silently (resnet_train itself refuses a run folder
# that holds a run unless told --resume or --overwrite).
if compgen -G "$out/*-seed*" > /dev/null; then
  echo "run.sh: $out holds runs of an earlier job; move it away (or pass --resume or" \
    "--overwrite: one process)" >&2
  exit 1
fi
start=$(date +%s)
parts=$out.parts
rm -rf "$parts"
mkdir -p "$parts"
pids=()
for lr in "${lrs[@]}"; do
  opt=${lr%%=*}
  "$bin" "${settings[@]}" --optimizers "$opt" --optimizer-lr "$lr" --out "$parts/$opt" \
    > "$parts/$opt.log" 2>&1 &
  pids+=($!)
done
echo "training fogo, muon and adam as three processes (logs: $parts/<optimizer>.log) ..."
# One live line per process (epoch, step, loss, ETA) read from its log until all three have ended:
# redrawn in place on a terminal, plain lines every 30 s otherwise (scripts/live_progress.py).
logs=()
for lr in "${lrs[@]}"; do logs+=("${lr%%=*}=$parts/${lr%%=*}.log"); done
python3 scripts/live_progress.py --pids "$(IFS=,; echo "${pids[*]}")" "${logs[@]}" ||
  echo "run.sh: the progress display failed; the training goes on" >&2
failed=0
for k in "${!pids[@]}"; do
  opt=${lrs[$k]%%=*}
  # The display's last lines give each process's time; a failure is said here.
  if ! wait "${pids[$k]}"; then
    echo "run.sh: the $opt process failed; the end of $parts/$opt.log:" >&2
    tail -n 20 "$parts/$opt.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
mkdir -p "$out"
for lr in "${lrs[@]}"; do
  opt=${lr%%=*}
  mv "$parts/$opt/$opt"-seed* "$out/"
done
"$bin" "${settings[@]}" "${all[@]}" --resume --out "$out"
rm -rf "$parts"
echo "main job: $(($(date +%s) - start)) s of wall time (three processes on $(nproc) core(s))"
