#!/usr/bin/env bash
# The main job: a short CPU demo that trains a small model with Muon and with AdamW and prints
# a comparison. Extra arguments go to the demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
"$root/build/examples/fogo_demo" "$@"
