#!/usr/bin/env bash
# fogo's GPU checks: the CUDA parity tests, compute-sanitizer memcheck on them, and the step
# benchmarks, on a machine with a GPU, nvcc, cmake, ninja and a python3 holding torch, but no
# GoogleTest, no Google Benchmark and no internet (the `device` tool's machines). What it lacks is
# carried in .device/ (ignored by git), filled here first by `prepare`:
#
#   scripts/gpu_check.sh prepare                 # on the development machine (Debian)
#   scripts/gpu_check.sh build test memcheck bench   # on the GPU machine (docs/cuda.md)
#
# Steps run in the order given; results (logs, gtest XML, benchmark JSON, environment) go to
# $OUT when set (the device tool brings that folder back), else build-gpu/results.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
carry=.device
build=build-gpu
out=${OUT:-$build/results}
python=$(command -v "${FOGO_PYTHON:-python3}")
jobs=$(nproc)

prepare() {
  # GoogleTest from its sources; Google Benchmark as Debian's build (headers, shared library,
  # CMake package), since Debian ships no sources for it. Paths are kept as installed so the
  # package's relocatable CMake files find the library.
  rm -rf "$carry/googletest" "$carry/benchmark"
  mkdir -p "$carry"
  cp -r /usr/src/googletest "$carry/googletest"
  for pkg in libbenchmark-dev libbenchmark1debian; do
    dpkg -L "$pkg" | while read -r path; do
      [ -f "$path" ] || [ -L "$path" ] || continue
      case "$path" in /usr/share/*) continue ;; esac
      mkdir -p "$carry/benchmark$(dirname "$path")"
      cp -a "$path" "$carry/benchmark$path"
    done
  done
  du -sh "$carry"
}

build() {
  local deps=$root/$build/deps
  if [ ! -f "$deps/.done" ]; then
    cmake -S "$carry/googletest" -B "$build/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$deps" -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null
    ninja -C "$build/googletest" -j "$jobs" install >/dev/null
    touch "$deps/.done"
  fi
  mkdir -p "$build"
  if ! cmake -S . -B "$build" -G Ninja -Wno-dev -DFOGO_BUILD_EXAMPLES=OFF -DFOGO_CUDA_ARCHITECTURES=90 \
      -DFOGO_PYTHON="$python" -DCMAKE_PREFIX_PATH="$deps" \
      -Dbenchmark_DIR="$root/$carry/benchmark/usr/lib/x86_64-linux-gnu/cmake/benchmark" \
      >"$build/configure.log" 2>&1; then
    cat "$build/configure.log"
    return 1
  fi
  grep "fogo:" "$build/configure.log"
  ninja -C "$build" -j "$jobs" fogo_tests fogo_bench
}

environment() {
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    nvcc --version | tail -1
    "$python" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    git rev-parse HEAD 2>/dev/null || true
  } | tee "$out/environment.txt"
}

test_() {
  # Every test (the CPU ones too); the CUDA ones must run, not skip.
  "$build/tests/fogo_tests" --gtest_output="xml:$out/tests.xml" 2>&1 | tee "$out/tests.log"
  if grep -qE '^\[  SKIPPED \] (CudaParity|NewtonSchulzProjected)\.' "$out/tests.log"; then
    echo "gpu_check: CUDA parity tests were skipped on a GPU machine" >&2
    return 1
  fi
}

memcheck() {
  # The kernel-level parity tests (the end-to-end ones run the same kernels, much slower here).
  compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/fogo_tests" \
    --gtest_filter='CudaParity.ProjectedStep*:CudaParity.CodebookFlush*:CudaParity.RmsUpdate*' \
    2>&1 | tee "$out/memcheck.log"
}

bench() {
  # CUDA benchmarks (device argument 1), then torch.optim.Muon on the same sets.
  "$build/bench/fogo_bench" --benchmark_filter='^BM_(Step|Stage)_[A-Za-z]+/[01]/1/' \
    --benchmark_out="$out/bench.json" --benchmark_out_format=json 2>&1 | tee "$out/bench.log"
  for set in gpt2-small resnet18; do
    "$python" bench/torch_muon_step.py --set "$set" --device cuda --steps 50
  done 2>&1 | tee "$out/torch_muon.txt"
}

[ $# -gt 0 ] || set -- build test memcheck bench
for step in "$@"; do
  case "$step" in
    prepare) prepare ;;
    build) build ;;
    test) mkdir -p "$out"; environment; test_ ;;
    memcheck) mkdir -p "$out"; memcheck ;;
    bench) mkdir -p "$out"; environment; bench ;;
    *) echo "gpu_check: unknown step '$step' (prepare, build, test, memcheck, bench)" >&2; exit 2 ;;
  esac
done
