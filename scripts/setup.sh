#!/usr/bin/env bash
# Installs everything fogo needs: Debian packages and a virtual environment holding the PyPI torch
# wheel (LibTorch) of the version scripts/torch.sh chooses (FOGO_TORCH; .venv for the default,
# .venv-torch<version> for another), plus the Python package's build and test tools
# (python/requirements.txt: scikit-build-core, pytest, expecttest, Lightning). Idempotent; a
# second run returns in about a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/torch.sh
venv=$(fogo_venv "$FOGO_TORCH")

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

# Each requirements list has its own stamp in the environment: installed again only when it
# changed. torch comes from PyPI with its own CUDA libraries (nvidia-* wheels), which the build
# links and loads ahead of any system CUDA toolkit's (cmake/FogoTorch.cmake).
install() {  # stamp, requirements file, extra requirement...
  local stamp=$venv/$1 file=$2 want
  shift 2
  want=$(cat "$file"; printf '%s\n' "$@")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  echo "setup: installing into $venv: $(grep -v '^#' <<<"$want" | tr '\n' ' ')"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$file" "$@"
  printf '%s' "$want" >"$stamp"
}
install .fogo-requirements requirements.txt "torch==$FOGO_TORCH"
install .fogo-python-requirements python/requirements.txt
