#!/usr/bin/env bash
# Configures and builds fogo into build/ (Release, Ninja, 2 jobs: the machine has 2 cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -G Ninja -Wno-dev >/dev/null
cmake --build "$root/build" -j "${FOGO_JOBS:-2}"
