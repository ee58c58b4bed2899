#!/usr/bin/env bash
# Installs everything fogo needs: Debian packages and a virtual environment (.venv) holding the
# pinned PyPI torch wheel (LibTorch). Idempotent; a second run returns in about a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# libgloo-dev: gloo's headers, which c10d's ProcessGroupGloo.hpp includes (the torch wheel has
# gloo compiled in but ships none of its headers); nothing links Debian's libgloo.
debs=(cmake ninja-build g++ python3-venv libgtest-dev libgmock-dev libbenchmark-dev
      libgloo-dev dataset-fashion-mnist bible-kjv gnuplot-nox)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp=.venv/.fogo-requirements
if [ -f "$stamp" ] && cmp -s requirements.txt "$stamp"; then
  exit 0
fi
echo "setup: creating .venv with $(grep -v '^#' requirements.txt | tr '\n' ' ')"
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
cp requirements.txt "$stamp"
