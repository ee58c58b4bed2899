#!/usr/bin/env bash
# Installs everything fogo needs: Debian packages and a virtual environment (.venv) holding the
# pinned PyPI torch wheel (LibTorch), plus the Python package's build and test tools
# (python/requirements.txt: scikit-build-core, pytest, expecttest, Lightning). Idempotent; a
# second run returns in about a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# libgloo-dev: gloo's headers, which c10d's ProcessGroupGloo.hpp includes (the torch wheel has
# gloo compiled in but ships none of its headers); nothing links Debian's libgloo.
# ccache: the Python wheel's build (pip install ., python/tests/test_packaging.py) reuses the
# objects scripts/build.sh compiled instead of compiling the library again.
# iproute2: `ip netns`, for the distributed test that puts two ranks on two "hosts" (network
# namespaces joined by a veth pair; it skips where namespaces are not permitted).
debs=(cmake ninja-build g++ python3-venv python3-dev ccache libgtest-dev libgmock-dev
      libbenchmark-dev libgloo-dev dataset-fashion-mnist bible-kjv gnuplot-nox iproute2)
missing=()
for p in "${debs[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == *"install ok installed"* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Each requirements file has its own stamp in .venv: installed again only when it changed.
install() {  # requirements file, stamp
  if [ -f "$2" ] && cmp -s "$1" "$2"; then return 0; fi
  echo "setup: installing into .venv: $(grep -v '^#' "$1" | tr '\n' ' ')"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r "$1"
  cp "$1" "$2"
}
install requirements.txt .venv/.fogo-requirements
install python/requirements.txt .venv/.fogo-python-requirements
