#!/usr/bin/env bash
# The whole test suite: set-up, build, then every test through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root/build"
# ctest runs two test processes at once on 2 cores: one intra-op thread each, or OpenMP's
# spinning threads oversubscribe the machine and every test slows down several-fold.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --output-on-failure -j "${FOGO_JOBS:-2}" "$@"
