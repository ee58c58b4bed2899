#!/usr/bin/env bash
# The main job: a CPU-sized class-imbalanced comparison of FOGO, Muon and Adam on Fashion-MNIST
# (ResNet-18 at width 8, five rare classes keeping 10% of their images, 2 seeds; a few minutes on
# 2 cores). Prints the mean ± sd table; runs/main/ gets per-run metrics, summary.md and the plots
# accuracy.png and forgetting.png. Extra arguments go to resnet_train and override these
# (see build/examples/resnet/resnet_train --help).
#
# --threads 1: on a 2-core machine shared with other work, one torch thread per process is several
# times faster than two (OpenMP threads spin-waiting for a busy core).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root"
build/examples/resnet/resnet_train \
  --scenario class-imbalanced --optimizers fogo,muon,adam --seeds 0,1 \
  --width 8 --epochs 4 --batch-size 64 --train-per-class 500 --test-per-class 100 \
  --eval-every 21 --threads 1 --device cpu --out runs/main "$@"
