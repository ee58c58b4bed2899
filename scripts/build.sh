#!/usr/bin/env bash
# Configures and builds fogo into build/ (Release, Ninja, 2 jobs: the machine has 2 cores).
#   scripts/build.sh            every target (library, tests, benches, trainers, Python module)
#   scripts/build.sh T [T ...]  only targets T and what they need (scripts/run.sh: resnet_train)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -G Ninja -Wno-dev >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$root/build" -j "${FOGO_JOBS:-2}" "${targets[@]}"
