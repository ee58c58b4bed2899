#!/usr/bin/env bash
# The main job: a CPU-sized class-imbalanced comparison of FOGO, Muon and Adam on Fashion-MNIST
# (ResNet-18 at width 8; classes 4-8 rare, keeping 10% of their training images; 4 epochs =
# 168 steps; 3 seeds; a few minutes on 2 cores after the build). Each optimizer runs at the
# learning rate that a validation-split sweep chose for exactly these settings (docs/results.md,
# "Class-imbalanced, rare classes 4-8": the same command with --lr-sweep 0.3,1,3,10 instead of
# --optimizer-lr), not at the paper's rates, which at this width mostly measure step size.
# Prints the mean ± sd table and ends with a plain sentence on what it shows and how sure it is
# (ranking, seed spread, Welch's t-test); runs/main/ gets per-run metrics, summary.md and the
# plots accuracy.png and forgetting.png. Extra arguments go to resnet_train and override these
# (see build/examples/resnet/resnet_train --help).
#
# --threads 1: on a 2-core machine shared with other work, one torch thread per process is several
# times faster than two (OpenMP threads spin-waiting for a busy core).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root"
build/examples/resnet/resnet_train \
  --scenario class-imbalanced --optimizers fogo,muon,adam --seeds 0,1,2 \
  --optimizer-lr fogo=3e-3,muon=3e-2,adam=1e-2 \
  --width 8 --epochs 4 --batch-size 64 --train-per-class 500 --test-per-class 100 \
  --eval-every 21 --threads 1 --device cpu --out runs/main "$@"
