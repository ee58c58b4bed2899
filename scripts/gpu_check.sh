#!/usr/bin/env bash
# fogo's GPU checks in one invocation on a bare GPU machine: every test (the CUDA parity tests must
# run, not skip), compute-sanitizer memcheck, racecheck and synccheck over the CUDA tests, the step
# benchmarks next to torch.optim.Muon, and training throughput of both trainers next to an eager
# PyTorch GPT-2. Made for the `device` tool's machines (GPU, nvcc, cmake, ninja, a python3 with
# torch 2.11; no GoogleTest, no Google Benchmark, no internet; nothing survives between calls).
#
# Building there costs minutes of scarce GPU time, so the usual way is to build here, on a CPU
# machine with the same torch 2.11+cu130 and nvcc 13.0, and ship the binaries:
#
#   scripts/gpu_check.sh pack        # here, after scripts/build.sh: binaries and the libraries
#                                    # they need that the GPU machine lacks, into .device/
#   scripts/gpu_check.sh             # there (carry .device): check, test, sanitize, bench, train
#
# The binaries then load the GPU machine's torch (LD_LIBRARY_PATH is pointed at its torch/lib).
# Fallback, building there: `scripts/gpu_check.sh prepare` here (GoogleTest sources and Debian's
# Google Benchmark into .device/), then `scripts/gpu_check.sh build all` there.
#
# Steps run in the order given (default: all = check test sanitize bench train). A failing step
# does not stop the later ones; the script exits non-zero if any failed. What comes back is a
# compact report meant to be committed as it is (docs/gpu-runs/<date>-<gpu>-<sha>/): tests.md,
# sanitizer.md, bench.md + bench.json, train.md, environment.txt, summary.txt, and logs.tgz (the
# text logs; never a checkpoint: the trainers' run folders live outside them), under
# $OUT/<date>-<gpu>-<sha>/ (the device tool brings back at most 8 files of 16 MiB); without $OUT,
# under build-gpu/results/. tests.md and sanitizer.md are also printed last, so they survive in
# the command's output if a file is lost. scripts/gpu_report.py writes the markdown.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
carry=.device
out=${OUT:-$root/build-gpu/results}
logs=$root/build-gpu/logs
python=$(command -v "${FOGO_PYTHON:-python3}" || true)
jobs=$(nproc)
failed=()
summary=()

die() {
  echo "gpu_check: $*" >&2
  exit 1
}
note() { summary+=("$1"); }

# --------------------------------------------------------------------------------------------
# Here (CPU machine)

shipped_binaries=(tests/fogo_tests tests/fogo_dist_tests bench/fogo_bench examples/gpt2/gpt2
                  examples/gpt2/gpt2_tests
                  examples/resnet/resnet_train examples/resnet/resnet_tests
                  examples/common/trainer_common_tests)

pack() {
  # Binaries of build/ (scripts/build.sh), and every library they load that is neither torch's
  # (the GPU machine has its own, the same version) nor the system's.
  local build=$root/build
  command -v nvcc >/dev/null || die "pack: nvcc is missing here: fogo would build without its kernels"
  grep -q '^FOGO_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null ||
    die "pack: build/ is not configured with FOGO_WITH_CUDA=ON (run scripts/build.sh)"
  rm -rf "$carry/bin" "$carry/lib" "$carry/data"
  mkdir -p "$carry/bin" "$carry/lib" "$carry/data/fashion-mnist"
  for b in "${shipped_binaries[@]}"; do
    [ -x "$build/$b" ] || die "pack: $build/$b is missing (run scripts/build.sh)"
    cp "$build/$b" "$carry/bin/"
    ldd "$build/$b" | awk '/=> \// {print $1, $3}' | while read -r soname lib; do
      case "$soname" in
        libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | librt.so* | \
          libdl.so* | libutil.so* | libz.so* | libgomp.so* | libcudart.so*) ;;  # the system's; torch's
        *) case "$lib" in */site-packages/*) ;; *) cp -L "$lib" "$carry/lib/$soname" ;; esac ;;
      esac
    done
  done
  # (No cuobjdump here: the architectures are read from the configuration; `check` looks at the
  # machine code itself on the GPU machine.) Never `cmd | grep -q` under pipefail: grep leaving
  # at the first match can kill cmd with SIGPIPE and fail the pipeline (it failed this check once).
  grep -qE '^FOGO_CUDA_ARCHITECTURES:STRING=.*\b90' "$build/CMakeCache.txt" &&
    [[ $(readelf -S "$carry/bin/fogo_tests") == *.nv_fatbin* ]] ||
    die "pack: fogo_tests holds no sm_90 kernels (FOGO_CUDA_ARCHITECTURES)"
  # xz-compressed (about 7x): the uncompressed binaries alone come near the device tool's 64 MiB.
  # `environment` unpacks them there (with Python's lzma: nothing else is assumed).
  xz -T2 -6 -f "$carry"/bin/* || die "pack: xz failed"
  # The test data directory is compiled in as an absolute path of this checkout.
  echo "$root" >"$carry/bin/SOURCE_ROOT"
  # The commit the binaries were built from names the report (the GPU machine gets no .git).
  local sha
  sha=$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
  [ -z "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] || sha="$sha-dirty"
  echo "$sha" >"$carry/bin/SOURCE_SHA"
  # The Python package with its extension module, and pytest (pure Python) to run its tests:
  # the GPU machine has torch but no pytest and no internet.
  rm -rf "$carry/python" "$carry/pylib"
  mkdir -p "$carry/python" "$carry/pylib"
  if [ -d "$build/python/fogo" ] && compgen -G "$build/python/fogo/_C*.so" >/dev/null; then
    cp -rL "$build/python/fogo" "$carry/python/"
    rm -rf "$carry/python/fogo/__pycache__"
    # fogo._C and the tests' fogo._testing (built with the tests), xz-compressed as the binaries.
    xz -T2 -6 -f "$carry"/python/fogo/*.so || die "pack: xz failed"
  else
    echo "pack: no Python module in $build/python/fogo: the GPU's pytest step will say so" >&2
  fi
  local site
  site=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for pkg in pytest _pytest pluggy iniconfig packaging py.py; do
    [ -e "$site/$pkg" ] && cp -r "$site/$pkg" "$carry/pylib/"
  done
  find "$carry/pylib" -name __pycache__ -prune -exec rm -rf {} +
  # A Fashion-MNIST subset in the same IDX format (throughput needs images, not all 60,000).
  "$root/.venv/bin/python" - "$carry/data/fashion-mnist" <<'EOF'
import gzip, struct, sys
src, dst = "/usr/share/datasets/fashion-mnist", sys.argv[1]
for stem, keep in (("train", 12000), ("t10k", 2000)):
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        data = gzip.open(f"{src}/{stem}-{kind}.gz").read()
        dims = data[3]
        header = list(struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims]))
        item = 1
        for d in header[1:]:
            item *= d
        header[0] = keep
        body = data[4 + 4 * dims: 4 + 4 * dims + keep * item]
        with gzip.open(f"{dst}/{stem}-{kind}.gz", "wb") as f:
            f.write(data[:4] + struct.pack(">" + "I" * dims, *header) + body)
EOF
  # The KJV text for the GPT-2 runs (Debian's bible-kjv is not there).
  "$build/examples/gpt2/gpt2" prepare-kjv --out "$carry/data/kjv.txt" >/dev/null ||
    die "pack: gpt2 prepare-kjv failed"
  du -sh "$carry"
  # The device tool moves the working tree and the carried folder together, at most 64 MiB.
  local tree carried
  tree=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 du -cb 2>/dev/null) | tail -1 | cut -f1)
  carried=$(du -sb "$carry" | cut -f1)
  echo "pack: $((carried / 1048576)) MiB carried + $((tree / 1048576)) MiB tracked tree (limit 64 MiB)"
  ((carried + tree < 64 * 1048576)) ||
    die "pack: $carry and the tree exceed the device tool's 64 MiB; ship fewer binaries or less data"
}

prepare() {
  # Fallback, building on the GPU machine: GoogleTest from its sources; Google Benchmark as
  # Debian's build (headers, shared library, CMake package), since Debian ships no sources for it.
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

# --------------------------------------------------------------------------------------------
# There (GPU machine)

build() {
  # Fallback: builds into build-gpu/ and makes it the source of binaries.
  local build=$root/build-gpu/tree deps=$root/build-gpu/deps
  command -v nvcc >/dev/null || die "build: nvcc is missing: the CUDA kernels cannot be compiled"
  [ -d "$carry/googletest" ] || die "build: $carry/googletest missing (scripts/gpu_check.sh prepare)"
  if [ ! -f "$deps/.done" ]; then
    cmake -S "$carry/googletest" -B "$root/build-gpu/googletest" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$deps" \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null || die "build: GoogleTest"
    ninja -C "$root/build-gpu/googletest" -j "$jobs" install >/dev/null || die "build: GoogleTest"
    touch "$deps/.done"
  fi
  cmake -S . -B "$build" -G Ninja -Wno-dev -DFOGO_CUDA_ARCHITECTURES=90 \
    -DFOGO_PYTHON="$python" -DCMAKE_PREFIX_PATH="$deps" \
    -Dbenchmark_DIR="$root/$carry/benchmark/usr/lib/x86_64-linux-gnu/cmake/benchmark" \
    >"$root/build-gpu/configure.log" 2>&1 || {
    cat "$root/build-gpu/configure.log"
    die "build: configure failed"
  }
  grep -q '^FOGO_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" && grep -q "CUDA kernels ON" \
    "$root/build-gpu/configure.log" || die "build: configured without the CUDA kernels"
  ninja -C "$build" -j "$jobs" || die "build: compilation failed"
  rm -rf "$carry/bin"
  mkdir -p "$carry/bin" "$carry/lib"
  for b in "${shipped_binaries[@]}"; do cp "$build/$b" "$carry/bin/"; done
  cp -a "$carry"/benchmark/usr/lib/x86_64-linux-gnu/libbenchmark.so* "$carry/lib/" 2>/dev/null
  echo "$root" >"$carry/bin/SOURCE_ROOT"
}

bin=$root/$carry/bin

environment() {
  [ -n "$python" ] || die "no python3 with torch (set FOGO_PYTHON)"
  torchlib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') ||
    die "$python cannot import torch"
  # torch's own CUDA runtime first: the binaries would otherwise take the toolkit's copy.
  cudalib=$(cd "$torchlib/../../nvidia/cu13/lib" 2>/dev/null && pwd) ||
    die "no nvidia/cu13/lib beside $torchlib: not a CUDA 13 torch wheel"
  export LD_LIBRARY_PATH="$torchlib:$cudalib:$root/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Binaries and the Python modules carried xz-compressed (pack): unpacked once, in place.
  "$python" - "$bin" "$root/$carry/python/fogo" <<'PY' || die "cannot unpack the binaries in $bin"
import glob, lzma, os, sys
for packed in [p for folder in sys.argv[1:] for p in glob.glob(os.path.join(folder, "*.xz"))]:
    with lzma.open(packed) as src, open(packed[:-3], "wb") as dst:
        dst.write(src.read())
    os.chmod(packed[:-3], 0o755)
    os.remove(packed)
PY
  # The tests read data from the checkout they were built in; point that path here.
  local built_in
  built_in=$(cat "$bin/SOURCE_ROOT" 2>/dev/null) || die "no binaries in $bin: run 'pack' here first, or 'build'"
  if [ "$built_in" != "$root" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in"
  fi
  # The report's folder: <date>-<gpu>-<sha>, e.g. 2026-11-25-h100-da0f8fb.
  local gpu sha
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
    grep -oiE '[a-z][0-9]{2,4}[a-z]?' | head -1 | tr 'A-Z' 'a-z')
  sha=$(cat "$bin/SOURCE_SHA" 2>/dev/null || echo unknown)
  report=$out/$(date -u +%F)-${gpu:-gpu}-$sha
  runs=$root/build-gpu/runs  # trainers' run folders (checkpoints): never in what comes back
  rm -rf "$logs" "$runs"
  mkdir -p "$out" "$logs" "$report" "$runs"
  # Where the tests look for what the project ships: the trainers beside the test binaries
  # (.device/bin), the Fashion-MNIST subset, torchrun (a wrapper when the image has none on PATH).
  export FOGO_FASHION_MNIST_DIR=$root/$carry/data/fashion-mnist
  if ! command -v torchrun >/dev/null; then
    mkdir -p "$root/build-gpu/bin"
    printf '#!/bin/sh\nexec "%s" -m torch.distributed.run "$@"\n' "$python" >"$root/build-gpu/bin/torchrun"
    chmod +x "$root/build-gpu/bin/torchrun"
    export FOGO_TORCHRUN=$root/build-gpu/bin/torchrun
  fi
  export PYTHONPATH=$root/$carry/python:$root/$carry/pylib${PYTHONPATH:+:$PYTHONPATH}
}

environment_txt() {
  # What the numbers depend on and what the tests could find.
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat "$bin/SOURCE_SHA" 2>/dev/null || echo unknown) (the binaries' build)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -4 | tr '\n' ';')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
  echo "cpu isa: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|fma)$' | sort | tr '\n' ' ')"
  "$python" - <<'PY' 2>&1
import platform, torch
print("python:", platform.python_version())
print("torch:", torch.__version__, "cuda", torch.version.cuda, "cpu capability",
      torch.backends.cpu.get_cpu_capability())
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
try:
    import fogo
    print("fogo python module: imports (" + fogo.__file__ + ")")
except Exception as e:
    print("fogo python module: does not import:", type(e).__name__, e)
try:
    import pytest
    print("pytest:", pytest.__version__)
except Exception as e:
    print("pytest: missing:", e)
PY
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo 'missing (not needed for shipped binaries)')"
  echo "compute-sanitizer: $(compute-sanitizer --version 2>/dev/null | grep -i version | head -1 || echo missing)"
  echo "torchrun: $(command -v torchrun || echo "${FOGO_TORCHRUN:-missing}")"
  echo "fashion-mnist: $FOGO_FASHION_MNIST_DIR ($(ls "$FOGO_FASHION_MNIST_DIR" 2>/dev/null | wc -l) files)"
  echo "kjv: $(ls -s "$root/$carry/data/kjv.txt" 2>/dev/null || echo missing)"
}

check() {
  # Refuses to go on with a setup whose results would mean nothing.
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader ||
    die "check: no GPU (nvidia-smi failed)"
  environment_txt | tee "$logs/environment.txt"
  [[ $(cuobjdump --list-elf "$bin/fogo_tests") == *sm_90* ]] ||
    die "check: fogo_tests holds no sm_90 kernels: fogo was built without its CUDA kernels"
  local b missing runtimes
  for b in "$bin"/*; do
    [ -x "$b" ] && [ -f "$b" ] || continue
    ldd "$b" >"$logs/ldd-$(basename "$b").txt"
    missing=$(grep 'not found' "$logs/ldd-$(basename "$b").txt")
    [ -z "$missing" ] || die "check: $(basename "$b") cannot load: $missing"
    # One CUDA runtime: the shared one torch loads. A second copy (another libcudart soname, or
    # one linked in statically) would keep its own state and kernels could fail to launch.
    runtimes=$(grep -o 'libcudart[^ ]* => [^ ]*' "$logs/ldd-$(basename "$b").txt" | sort -u)
    [ "$(printf '%s' "$runtimes" | grep -c libcudart)" -le 1 ] ||
      die "check: $(basename "$b") loads two CUDA runtimes: $runtimes"
    [ -z "$runtimes" ] || [[ "$runtimes" == *"=> $cudalib/"* ]] ||
      die "check: $(basename "$b") loads a CUDA runtime other than torch's ($cudalib): $runtimes"
    [ -z "$(readelf -Ws "$b" | awk '$7 != "UND" && $8 == "cudaLaunchKernel"')" ] ||
      die "check: $(basename "$b") has a static CUDA runtime besides torch's shared one"
  done
  echo "check: binaries load, one CUDA runtime ($(grep -ho 'libcudart[^ ]* => [^ ]*' "$logs"/ldd-*.txt | sort -u | tr '\n' ' '))"
}

run_gtest() {
  # One gtest binary run: its test list, its XML, its log, and a line of runs.tsv (name, exit
  # code, seconds): what gpu_report.py counts from. Extra environment in the arguments before
  # the binary (VAR=value ...), then the binary, then its flags.
  local name=$1 t0=$SECONDS rc=0
  shift
  env "$@" --gtest_list_tests >"$logs/$name.list" 2>/dev/null
  env "$@" --gtest_output="xml:$logs/$name.xml" >"$logs/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$logs/runs.tsv"
  return $rc
}

test_() {
  # Every test (the CPU ones too), sharded over processes; then the other binaries; then the
  # Python tests (python/tests, the CUDA ones included). The CUDA tests must run, not skip.
  local shards=4 s rc=0
  : >"$logs/runs.tsv"
  for ((s = 0; s < shards; ++s)); do
    run_gtest "fogo_tests-$s" GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s \
      OMP_NUM_THREADS=$((jobs / shards)) timeout 450 "$bin/fogo_tests" &
  done
  for ((s = 0; s < shards; ++s)); do wait -n || rc=1; done
  # fogo_dist_tests: NCCL on the GPU (DistributedCuda) and the CPU ranks' tests.
  for t in fogo_dist_tests gpt2_tests resnet_tests trainer_common_tests; do
    run_gtest "$t" OMP_NUM_THREADS=4 timeout 300 "$bin/$t" || rc=1
  done
  local t0=$SECONDS prc=0
  (cd "$root" && OMP_NUM_THREADS=4 timeout 300 "$python" -m pytest -q -p no:cacheprovider \
    python/tests --junitxml="$logs/python_tests.xml" >"$logs/python_tests.log" 2>&1) || prc=$?
  printf '%s\t%s\t%s\n' python_tests "$prc" "$((SECONDS - t0))" >>"$logs/runs.tsv"
  [ "$prc" -eq 0 ] || rc=1
  "$python" "$root/scripts/gpu_report.py" tests "$logs" >"$report/tests.md"
  note "tests: $(grep -m1 -oE '[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped, [0-9]+ listed but never run' "$report/tests.md")"
  local cuda_skips
  cuda_skips=$(grep -m1 -oE 'CUDA tests skipped: [0-9]+' "$report/tests.md" | grep -oE '[0-9]+$')
  if [ "${cuda_skips:-0}" -gt 0 ]; then
    echo "gpu_check: $cuda_skips CUDA test(s) were skipped on a GPU machine (tests.md)" >&2
    rc=1
  fi
  return $rc
}

sanitize() {
  # The CUDA tests under compute-sanitizer, in two passes of memcheck, racecheck and synccheck.
  # 1. The kernels' parity tests with PyTorch's caching allocator off: it hands out pieces of
  #    large blocks, so an out-of-bounds access inside a block is invisible unless it is off.
  # 2. CudaSync and CudaGraph with caching on: a CUDA graph's memory comes from the caching
  #    allocator's pools and cannot be captured without it.
  # Every report is named by kernel and source line (fogo's kernels carry -lineinfo) in
  # sanitizer.md; fogo's own kernels must have none.
  local rc=0 tool pass
  local -A pid
  local -A filter=([uncached]='CudaParity.*:NewtonSchulzProjected.OnCuda*:Muon.LoadMovesStateToTheParametersDevice'
                   [cached]='CudaSync.*:CudaGraph.*')
  for pass in uncached cached; do
    for tool in memcheck racecheck synccheck; do
      local caching=(env)
      [ "$pass" = cached ] || caching=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1)
      "${caching[@]}" OMP_NUM_THREADS=2 timeout 400 \
        compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 200 \
        "$bin/fogo_tests" --gtest_filter="${filter[$pass]}" >"$logs/sanitize-$tool-$pass.log" 2>&1 &
      pid[$tool-$pass]=$!
    done
    for tool in memcheck racecheck synccheck; do
      local r=0
      wait "${pid[$tool-$pass]}" || r=$?
      local summary_line
      summary_line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitize-$tool-$pass.log" | tail -1)
      note "$tool ($pass): exit $r; ${summary_line:-no summary}; $(grep -cE '^\[       OK \]' "$logs/sanitize-$tool-$pass.log") tests ok"
      [ "$r" -eq 0 ] || rc=1
    done
  done
  "$python" "$root/scripts/gpu_report.py" sanitizer "$logs" >"$report/sanitizer.md"
  local ours
  ours=$(grep -oE "Reports in fogo's kernels: [0-9]+" "$report/sanitizer.md" | grep -oE '[0-9]+$')
  note "sanitizer: ${ours:-?} report(s) in fogo's kernels (sanitizer.md)"
  [ "${ours:-1}" -eq 0 ] || rc=1
  return $rc
}

bench() {
  # The step benchmarks alone on the GPU (nothing else running), then torch.optim.Muon.
  "$bin/fogo_bench" --benchmark_filter='^BM_(Step|Stage)_[A-Za-z0-9]+/[01]/1/' \
    --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$logs/bench.json" --benchmark_out_format=json 2>&1 | tee "$logs/bench.log" ||
    return 1
  for set in gpt2-small resnet18; do
    "$python" bench/torch_muon_step.py --set "$set" --device cuda --steps 100 || return 1
  done 2>&1 | tee "$logs/torch_muon.txt"
  cp "$logs/bench.json" "$report/bench.json"
  "$python" "$root/scripts/gpu_report.py" bench "$logs" >"$report/bench.md"
  targets | tee -a "$report/bench.md"
}

targets() {
  # Issue 26's targets table (bench/targets.py) from whatever this run has measured so far: every
  # row printed with its H100 baseline and target, "not measured" where an input is missing.
  local args=(--bench "$logs/bench.json" --torch-muon "$logs/torch_muon.txt"
              --gpt2-eager "$logs/gpt2-eager.log") opt
  for opt in adamw muon fogo; do args+=(--gpt2 "$opt=$logs/gpt2-$opt.log"); done
  echo
  "$python" "$root/bench/targets.py" "${args[@]}"
}

train() {
  # Training throughput: GPT-2 124M (paper architecture, context 1024, bf16 autocast) per
  # optimizer, the same model in eager PyTorch, and ResNet-18 at width 64 per optimizer.
  local rc=0 opt
  local kjv=$root/$carry/data/kjv.txt
  [ -f "$kjv" ] || "$bin/gpt2" prepare-kjv --out "$kjv" >/dev/null || return 1
  # Throughput without deterministic kernels, as the eager reference runs; then one short run in
  # the trainer's default (deterministic) mode, which must work too.
  for opt in adamw muon fogo; do
    "$bin/gpt2" train --model 124m --device cuda --optimizer "$opt" --data "$kjv" \
      --no-deterministic --steps 40 --eval-every 1000000 --eval-sequences 8 --out "$runs/gpt2-$opt" \
      >"$logs/gpt2-$opt.log" 2>&1 || rc=1
  done
  # FOGO's steady-state steps replayed from a CUDA graph, sync-free (Mask).
  "$bin/gpt2" train --model 124m --device cuda --optimizer fogo --data "$kjv" \
    --fogo cuda_graph=true --fogo nonfinite=mask --no-deterministic --steps 40 \
    --eval-every 1000000 --eval-sequences 8 --out "$runs/gpt2-fogo-graph" \
    >"$logs/gpt2-fogo-graph.log" 2>&1 || rc=1
  # Both streams through the Gram form with restarts where cheaper (the default-form decision).
  "$bin/gpt2" train --model 124m --device cuda --optimizer fogo --data "$kjv" \
    --fogo ns_form=auto --no-deterministic --steps 40 --eval-every 1000000 --eval-sequences 8 \
    --out "$runs/gpt2-fogo-auto" >"$logs/gpt2-fogo-auto.log" 2>&1 || rc=1
  "$bin/gpt2" train --model 124m --device cuda --optimizer fogo --data "$kjv" \
    --steps 8 --eval-every 1000000 --eval-sequences 8 --out "$runs/gpt2-fogo-deterministic" \
    >"$logs/gpt2-fogo-deterministic.log" 2>&1 || rc=1
  "$python" bench/gpt2_eager.py --device cuda --steps 40 --warmup 5 >"$logs/gpt2-eager.log" 2>&1 ||
    rc=1
  for opt in adam muon fogo; do
    "$bin/resnet_train" --data-dir "$root/$carry/data/fashion-mnist" --device cuda --width 64 \
      --optimizers "$opt" --seeds 0 --epochs 2 --no-plots --out "$runs/resnet-$opt" \
      >"$logs/resnet-$opt.log" 2>&1 || rc=1
    # Steady-state images/s from the training records (time_s excludes nothing but evaluation
    # at the epoch's end): from step 20 to the last record.
    "$python" - "$runs/resnet-$opt/$opt-seed0/train.jsonl" "$opt" <<'PY' >>"$logs/resnet-$opt.log" || rc=1
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
first = next(r for r in recs if r["step"] >= 20)
last = recs[-1]
batch = 128
print(f"resnet18 width 64 {sys.argv[2]}: {batch * (last['step'] - first['step']) / (last['time_s'] - first['time_s']):.0f} images/s (steps {first['step']}-{last['step']})")
PY
  done
  "$python" "$root/scripts/gpu_report.py" train "$logs" >"$report/train.md"
  targets >>"$report/train.md"
  cat "$report/train.md"
  return $rc
}

finish() {
  {
    echo "gpu_check summary ($(date -u +%FT%TZ)):"
    printf '  %s\n' "${summary[@]}"
    [ ${#failed[@]} -eq 0 ] && echo "  all steps passed" || echo "  FAILED steps: ${failed[*]}"
  } | tee "$report/summary.txt"
  [ -f "$logs/environment.txt" ] || environment_txt >"$logs/environment.txt"
  cp "$logs/environment.txt" "$report/"
  # The text logs (no run folders, no checkpoints), if they fit what the device tool brings back.
  tar -C "$root/build-gpu" -czf "$report/logs.tgz" logs 2>/dev/null
  if [ "$(stat -c %s "$report/logs.tgz" 2>/dev/null || echo 0)" -gt $((15 * 1048576)) ]; then
    echo "gpu_check: logs.tgz over 15 MiB: left out (the markdown report holds the findings)" >&2
    rm -f "$report/logs.tgz"
  fi
  echo "=== gpu_check report: $report ($(ls "$report" | tr '\n' ' '))"
  for f in tests.md sanitizer.md; do
    [ -f "$report/$f" ] && { echo "--- $f"; cat "$report/$f"; }
  done
}

run_step() {
  local step=$1 t0=$SECONDS rc=0
  echo "=== gpu_check: $step"
  "$2" || rc=$?
  note "$step: $([ $rc -eq 0 ] && echo ok || echo FAILED) ($((SECONDS - t0)) s)"
  [ $rc -eq 0 ] || failed+=("$step")
}

[ $# -gt 0 ] || set -- all
case "$1" in
  pack) pack; exit ;;
  prepare) prepare; exit ;;
esac
steps=()
for step in "$@"; do
  case "$step" in
    all) steps+=(check test sanitize bench train) ;;
    build | check | test | sanitize | bench | train) steps+=("$step") ;;
    *) die "unknown step '$step' (pack, prepare, build, check, test, sanitize, bench, train, all)" ;;
  esac
done
[ "${steps[0]}" != build ] || { build; steps=("${steps[@]:1}"); }
environment
for step in "${steps[@]}"; do
  case "$step" in
    check) check ;;  # dies: nothing after it would mean anything
    test) run_step test test_ ;;
    *) run_step "$step" "$step" ;;
  esac
done
finish
[ ${#failed[@]} -eq 0 ]
