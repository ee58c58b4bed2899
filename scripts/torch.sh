# Sourced by the scripts (setup, build, test, run, gpu_check): which torch fogo is built and
# tested against, and where each version's virtual environment and build folder are.
#
#   FOGO_TORCH=2.15.0 scripts/test.sh     one version (its own .venv-torch2.15.0, build-torch2.15.0)
#   scripts/test.sh                       CI: the whole suite on the default, a leg on the others
#
# The default is the first of FOGO_TORCH_VERSIONS: 2.11.0, the GPU machines' torch (2.11.0+cu130)
# and so the one version on which fogo's CUDA kernels have run on a GPU (docs/gpu-runs/); a
# newcomer's build is the one that evidence covers. 2.15.0 (cu132) is PyPI's current torch: built
# and tested in CI on every change (docs/build.md, "Supported torch versions").
FOGO_TORCH_VERSIONS=(2.11.0 2.15.0)
FOGO_TORCH_GPU=2.11.0
FOGO_TORCH=${FOGO_TORCH:-${FOGO_TORCH_VERSIONS[0]}}

fogo_torch_supported() {  # version
  local v
  for v in "${FOGO_TORCH_VERSIONS[@]}"; do [ "$v" = "$1" ] && return 0; done
  return 1
}
if ! fogo_torch_supported "$FOGO_TORCH"; then
  echo "FOGO_TORCH=$FOGO_TORCH: fogo is built and tested against torch ${FOGO_TORCH_VERSIONS[*]}" \
    "(scripts/torch.sh)" >&2
  exit 2
fi

# The default version keeps the plain names (.venv, build), which the docs' commands use.
fogo_venv() { [ "$1" = "${FOGO_TORCH_VERSIONS[0]}" ] && echo .venv || echo ".venv-torch$1"; }
fogo_build_dir() { [ "$1" = "${FOGO_TORCH_VERSIONS[0]}" ] && echo build || echo "build-torch$1"; }

# ccache keys on the compile command: with paths relative to the checkout, a build in another
# clone of the same tree (CI's) reuses this one's objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
