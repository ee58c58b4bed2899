#!/usr/bin/env bash
# The whole test suite: set-up, build, then every test through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "${FOGO_JOBS:-2}" "$@"
