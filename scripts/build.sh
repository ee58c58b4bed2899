#!/usr/bin/env bash
# Configures and builds fogo (Release, Ninja, 2 jobs: the machine has 2 cores) against the torch
# scripts/torch.sh chooses (FOGO_TORCH): into build/ for the default version, build-torch<version>/
# for another.
#   scripts/build.sh            every target (library, tests, benches, trainers, Python module)
#   scripts/build.sh T [T ...]  only targets T and what they need (scripts/run.sh: resnet_train)
# FOGO_CMAKE_ARGS: more configure arguments (scripts/test.sh's second leg: no trainers, benches).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
source "$root/scripts/torch.sh"
venv=$root/$(fogo_venv "$FOGO_TORCH")
build=$root/$(fogo_build_dir "$FOGO_TORCH")
# shellcheck disable=SC2086  # FOGO_CMAKE_ARGS is a list of words
cmake -S "$root" -B "$build" -G Ninja -Wno-dev -DFOGO_PYTHON="$venv/bin/python" \
  ${FOGO_CMAKE_ARGS:-} >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "${FOGO_JOBS:-2}" "${targets[@]}"
