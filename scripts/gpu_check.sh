#!/usr/bin/env bash
# fogo's GPU checks in one command on a bare GPU machine, made to fit one call of the `device`
# tool (at most 600 s a command, at most 8 files of 16 MiB back from $OUT) and to report whatever
# happens: the checks, the tests (C++ then Python; the CUDA tests must run, not skip),
# compute-sanitizer over fogo's kernels, the step benchmarks the speed targets need, and a
# shortened training run per optimizer next to an eager PyTorch GPT-2.
#
#   scripts/gpu_check.sh pack        # here, after a build: binaries, libraries, the Python
#                                    # modules and what rebuilds them, data, into .device/
#   scripts/gpu_check.sh             # there (carry .device): check test sanitize bench train
#   scripts/gpu_check.sh rehearse    # here: the same control flow against stand-ins of the GPU
#                                    # commands (scripts/tests/test_gpu_check.py, a ctest entry)
#
# Building there would cost minutes of scarce GPU time, so the binaries are built here (same torch
# 2.11+cu130, nvcc 13.0) and shipped; they load the GPU machine's torch. The Python modules are the
# exception when the GPU machine's python3 is another CPython (an extension module imports only
# into the CPython whose ABI tag, cpython-3XY, it carries): the test step then builds fogo._C and
# fogo._testing there against the shipped libfogo.a (scripts/gpu_python/CMakeLists.txt; two
# files compiled, in the background of the C++ tests). Fallback, building everything there:
# `scripts/gpu_check.sh prepare` here, then `scripts/gpu_check.sh build all` there.
#
# Time: everything is counted against a deadline from this script's start (FOGO_GPU_DEADLINE_S,
# default 570: one 600 s command with room to spare), of which FOGO_GPU_RESERVE_S (20) is kept for
# writing the report. Steps run in order of value, each under a budget (FOGO_GPU_BUDGET_<STEP>,
# seconds) cut to what is left, and are skipped, saying so, when less than their minimum
# (FOGO_GPU_MIN_<STEP>) is left; every command inside runs under `timeout` of what is left of its
# step. A failing step does not stop the later ones; a failed `check` skips every GPU step.
#
# Report: $OUT/<date>-<gpu>-<sha>/ (without $OUT: build-gpu/results/...), exactly 8 files, meant
# to be committed as they are under docs/gpu-runs/: summary.txt, environment.txt, tests.md,
# sanitizer.md, bench.md, bench.json, train.md and logs.tgz (the text logs, each cut to 2 MiB,
# never a checkpoint). It is rewritten after every step and, by a trap on EXIT, TERM and INT,
# at the end whatever ends the script (a kill, a crash, a failed check); tests.md, sanitizer.md
# and summary.txt are also printed last. scripts/gpu_report.py writes the markdown.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }
carry=$(absolute "${FOGO_GPU_CARRY:-.device}")  # what `pack` fills here and the call carries
work=$(absolute "${FOGO_GPU_WORK:-build-gpu}")   # logs, run folders, a rebuilt module: not sent back
out=$(absolute "${OUT:-$work/results}")
bin=$carry/bin
logs=$work/logs
state=$work/state  # step statuses and notes, written by the steps' subshells
runs=$work/runs    # the trainers' run folders (checkpoints): never in what comes back
python=$(command -v "${FOGO_PYTHON:-python3}" || true)
jobs=$(nproc)
# The Python tests run there: only those that need a GPU (python/tests/test_cuda*.py, test_cuda.py
# first; the CPU ones are CI's, here), so that they fit what the C++ tests leave of the step.
py_dir=${FOGO_GPU_PYTHON_DIR:-python/tests}
py_tests=${FOGO_GPU_PYTHON_TESTS:-$(for f in "$py_dir"/test_cuda.py "$py_dir"/test_cuda*.py; do
  [ -f "$f" ] && printf '%s\n' "$f"; done | awk '!seen[$0]++' | tr '\n' ' ')}
SKIP=222  # a step's or command's "did not fit" (not a failure)

die() {
  echo "gpu_check: $*" >&2
  exit 1
}

# --------------------------------------------------------------------------------------------
# Here (CPU machine)

shipped_binaries=(tests/fogo_tests tests/fogo_dist_tests bench/fogo_bench examples/gpt2/gpt2
                  examples/gpt2/gpt2_tests
                  examples/resnet/resnet_train examples/resnet/resnet_tests
                  examples/common/trainer_common_tests)

pack() {
  # Binaries of the build against the GPU machines' torch (scripts/torch.sh: FOGO_TORCH_GPU,
  # 2.11.0: build/), and every library they load that is neither torch's (the GPU machine has its
  # own, the same version) nor the system's.
  local build venv
  build=$root/$(source "$root/scripts/torch.sh" && fogo_build_dir "$FOGO_TORCH_GPU")
  venv=$root/$(source "$root/scripts/torch.sh" && fogo_venv "$FOGO_TORCH_GPU")
  grep -q "^Torch_DIR:PATH=$venv/" "$build/CMakeCache.txt" 2>/dev/null ||
    die "pack: $build is not built against $venv's torch (the GPU machines'; scripts/torch.sh)"
  command -v nvcc >/dev/null || die "pack: nvcc is missing here: fogo would build without its kernels"
  grep -q '^FOGO_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null ||
    die "pack: build/ is not configured with FOGO_WITH_CUDA=ON (run scripts/build.sh)"
  rm -rf "${carry:?}/bin" "${carry:?}/lib" "${carry:?}/data" "${carry:?}/pymodule"
  mkdir -p "$carry/bin" "$carry/lib" "$carry/data/fashion-mnist" "$carry/pymodule"
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
  # What building fogo's Python modules there takes (scripts/gpu_python): the library as built
  # here and the FOGO_* definitions the modules were compiled with; their sources travel in the tree.
  cp "$build/src/libfogo.a" "$carry/pymodule/" || die "pack: $build/src/libfogo.a is missing"
  awk '/^build python\/CMakeFiles\/fogo_python\.dir\/src\/module\.cpp\.o:/ {f = 1}
       f && /^  DEFINES = / {print; exit}' "$build/build.ninja" | grep -oE -- '-DFOGO_[A-Za-z0-9_]+(=[^ ]*)?' |
    sed 's/^-D//' | tr '\n' ';' | sed 's/;$//' >"$carry/pymodule/definitions"
  grep -q FOGO_WITH_CUDA "$carry/pymodule/definitions" ||
    die "pack: no FOGO_WITH_CUDA among the Python module's definitions in $build/build.ninja"
  # xz-compressed (about 7x): the uncompressed binaries alone come near the device tool's 64 MiB.
  # `environment` unpacks them there (with Python's lzma: nothing else is assumed).
  xz -T2 -6 -f "$carry"/bin/* "$carry/pymodule/libfogo.a" || die "pack: xz failed"
  # Native frames of a crash in the test runs (LD_PRELOAD there; scripts/segv_trace.c).
  cc -shared -fPIC -O1 -o "$carry/lib/libfogo_segv_trace.so" "$root/scripts/segv_trace.c" ||
    die "pack: building scripts/segv_trace.c failed"
  # The test data directory is compiled in as an absolute path of this checkout.
  echo "$root" >"$carry/bin/SOURCE_ROOT"
  # The commit the binaries were built from names the report (the GPU machine gets no .git).
  local sha
  sha=$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
  [ -z "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] || sha="$sha-dirty"
  echo "$sha" >"$carry/bin/SOURCE_SHA"
  # The Python package with its extension modules (used there as they are when its python3 is
  # this CPython), pytest and expecttest (pure Python; PyTorch's test modules, which
  # test_torch_optim_info.py imports, need expecttest): the GPU machine has torch but neither,
  # and no internet.
  rm -rf "$carry/python" "$carry/pylib"
  mkdir -p "$carry/python" "$carry/pylib"
  if [ -d "$build/python/fogo" ] && compgen -G "$build/python/fogo/_C*.so" >/dev/null; then
    cp -rL "$build/python/fogo" "$carry/python/"
    rm -rf "$carry/python/fogo/__pycache__"
    xz -T2 -6 -f "$carry"/python/fogo/*.so || die "pack: xz failed"
  else
    echo "pack: no Python module in $build/python/fogo: the GPU's test step will build it" >&2
  fi
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for pkg in pytest _pytest pluggy iniconfig packaging py.py expecttest; do
    [ -e "$site/$pkg" ] && cp -r "$site/$pkg" "$carry/pylib/"
  done
  find "$carry/pylib" -name __pycache__ -prune -exec rm -rf {} +
  # A Fashion-MNIST subset in the same IDX format (throughput needs images, not all 60,000).
  "$venv/bin/python" - "$carry/data/fashion-mnist" <<'EOF'
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

pack_claim_data() {
  # The whole of Fashion-MNIST for the `claim` step (30 MiB: the paper's data, not the tests'
  # 12,000-image subset), as long as the carry stays under the device tool's 64 MiB with the
  # tree; otherwise left out, saying so (the step then runs on the subset and says that).
  local src=/usr/share/datasets/fashion-mnist dst=$carry/data/fashion-mnist-full tree carried
  rm -rf "$dst"
  [ -f "$src/train-images-idx3-ubyte.gz" ] || {
    echo "pack: no $src: the claim step will run on the subset" >&2
    return 0
  }
  mkdir -p "$dst" && cp "$src"/*-ubyte.gz "$dst/"
  tree=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 du -cb 2>/dev/null) | tail -1 | cut -f1)
  carried=$(du -sb "$carry" | cut -f1)
  if ((carried + tree >= 63 * 1048576)); then
    rm -rf "$dst"
    echo "pack: the full Fashion-MNIST left out (the carry would be $(((carried + tree) / 1048576)) MiB): the claim step will run on the subset" >&2
  else
    echo "pack: the full Fashion-MNIST carried for the claim step ($((carried / 1048576)) MiB carried in all)"
  fi
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
# There (GPU machine): time, steps, statuses

deadline=${FOGO_GPU_DEADLINE_S:-570}
reserve=${FOGO_GPU_RESERVE_S:-20}
# Per step: the most it may take, and the least worth starting it with.
# Budgets from the 2026-11-27 H100 run (docs/cuda.md, "Running the checks": check 6 s, test 148,
# sanitize 48, bench 66, train 82 of 570) with room for what issue 44 added; claim: whatever the
# others leave (often less than its least: then it is skipped, saying so), and the whole call
# when it runs alone (`scripts/gpu_check.sh claim`: about 10 pairs).
declare -A budget=([build]=100000 [check]=30 [test]=200 [sanitize]=120 [bench]=100 [train]=180
                   [claim]=100000)
declare -A least=([build]=60 [check]=5 [test]=60 [sanitize]=45 [bench]=30 [train]=40 [claim]=100)
for s in "${!budget[@]}"; do
  v=FOGO_GPU_BUDGET_${s^^} && budget[$s]=${!v:-${budget[$s]}}
  v=FOGO_GPU_MIN_${s^^} && least[$s]=${!v:-${least[$s]}}
done

# The least time worth starting one command of a step with (a test binary, a sanitizer process,
# a benchmark, a training run).
least_run=${FOGO_GPU_MIN_RUN_S:-10}
((least_run >= 1)) || least_run=1

left() { echo $((deadline - reserve - SECONDS)); }  # seconds the steps may still use
note() { echo "$*" >>"$state/notes"; }
set_status() {
  echo "$2" >"$state/status-$1"
  report_fresh=''
}
report_fresh=''  # the report files hold every status and log so far
status_of() {
  if [ -f "$state/status-$1" ]; then
    cat "$state/status-$1"
  elif grep -qx "$1" "$state/plan" 2>/dev/null; then
    echo "not run: the script ended before it"
  else
    echo "not asked for (steps: $(tr '\n' ' ' <"$state/plan" 2>/dev/null))"
  fi
}

# bounded CAP MIN COMMAND...: COMMAND under `timeout` of CAP seconds, or of what is left of the
# step if that is less; not started (returns $SKIP, saying so) when less than MIN is left.
bounded() {
  local cap=$1 min=$2 t
  shift 2
  t=$((step_end - SECONDS))
  ((t < cap)) || t=$cap
  if ((t < min || t < 1)); then  # (never `timeout 0`: it means no limit)
    echo "gpu_check: not started, $t s left of the step (needs $min): $*"
    return $SKIP
  fi
  timeout -k 5 "$t" "$@"
}

# why RC: what an exit status says, for the report.
why() {
  case "$1" in
    0) echo ok ;; 124) echo "killed at its time budget" ;; 137) echo "killed (SIGKILL)" ;;
    "$SKIP") echo "not started: no time left" ;; 134) echo "aborted (SIGABRT)" ;;
    136) echo "SIGFPE" ;; 139) echo "segmentation fault" ;; *) echo "exit $1" ;;
  esac
}

# Every process below PID (read from /proc: the steps' `timeout`s put their commands in process
# groups of their own, so only the tree finds them all).
descendants() {
  local -A parent=()
  local f line pid ppid p queue=("$1")
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    pid=${line%% *}
    read -r _ ppid _ <<<"${line##*) }"
    parent[$pid]=$ppid
  done
  while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    for pid in "${!parent[@]}"; do
      [ "${parent[$pid]}" != "$p" ] || { echo "$pid"; queue+=("$pid"); }
    done
  done
}

alive() {  # PID runs (a zombie does not)
  local line
  read -r line 2>/dev/null <"/proc/$1/stat" || return 1
  line=${line##*) }
  [ "${line%% *}" != Z ]
}

# stop_tree PID: TERM to PID and everything below it (collected first: orphans are reparented),
# then KILL to whatever is left 3 s later.
stop_tree() {
  local pids p n
  mapfile -t pids < <(echo "$1"; descendants "$1")
  kill -TERM "${pids[@]}" 2>/dev/null
  for ((n = 0; n < 30; ++n)); do
    for p in "${pids[@]}"; do ! alive "$p" || break; done
    alive "$p" || break
    sleep 0.1
  done
  ((n < 30)) || kill -KILL "${pids[@]}" 2>/dev/null
  wait "$1" 2>/dev/null  # reaped when it is this shell's child
  return 0
}

step_pid=
watchdog_pid=
current_step=
step_t0=0
blocked=  # why the GPU steps cannot run (a failed check), or empty

# run_step NAME: step_NAME in a subshell (a crash there ends that step only), under its budget.
run_step() {
  local name=$1 t rc=0 took
  current_step=$name
  step_t0=$SECONDS
  if [ -n "$blocked" ] && [ "$name" != check ]; then
    set_status "$name" "skipped: $blocked"
    return
  fi
  t=$(left)
  if ((t < ${least[$name]})); then
    set_status "$name" "skipped: it needs at least ${least[$name]} s and $t s were left before the deadline"
    echo "=== gpu_check: $name skipped ($t s left, needs ${least[$name]})"
    return
  fi
  ((t < ${budget[$name]})) || t=${budget[$name]}
  step_end=$((SECONDS + t))
  echo "=== gpu_check: $name (budget $t s; $(left) s left of the deadline)"
  set_status "$name" "did not finish: the script was killed during it (budget $t s, started at $SECONDS s)"
  summary_txt >"$report/summary.txt" 2>/dev/null  # what a SIGKILL would leave
  ("step_$name") &
  step_pid=$!
  # A backstop: every command of a step is bounded, but a step must not outlive its budget.
  (sleep $((t + 10)) && echo "gpu_check: $name overran its budget; stopping it" && stop_tree "$step_pid") &
  watchdog_pid=$!
  wait "$step_pid" || rc=$?
  stop_tree "$watchdog_pid"
  step_pid='' watchdog_pid=''
  took=$((SECONDS - step_t0))
  local detail
  detail=$(paste -sd ';' "$state/detail-$name" 2>/dev/null | sed 's/;/; /g')
  case $rc in
    0) set_status "$name" "ok ($took s of $t)${detail:+: $detail}" ;;
    "$SKIP") set_status "$name" "skipped: ${detail:-(no reason given)}" ;;
    *) set_status "$name" "FAILED ($took s of $t; $(why $rc))${detail:+: $detail}" ;;
  esac
  write_report
  report_fresh=1
}

detail() { echo "$*" >>"$state/detail-$current_step"; }  # one line of a step's status

# --------------------------------------------------------------------------------------------
# There: environment and check

bin_built=  # the binaries were found and unpacked
environment() {
  # What every step needs; a problem found here is reported by `check` (nothing dies).
  local problems=()
  if [ -z "$python" ]; then
    problems+=("no python3 (set FOGO_PYTHON)")
  else
    torchlib=$(timeout 120 "$python" -c \
      'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>"$logs/torch-import.log") ||
      problems+=("$python cannot import torch: $(tail -1 "$logs/torch-import.log")")
    py_ext=$(timeout 60 "$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
  fi
  # torch's own CUDA runtime first: the binaries would otherwise take the toolkit's copy.
  cudalib=
  if [ -n "${torchlib:-}" ]; then
    cudalib=$(cd "$torchlib/../../nvidia/cu13/lib" 2>/dev/null && pwd) ||
      problems+=("no nvidia/cu13/lib beside $torchlib: not a CUDA 13 torch wheel")
    export LD_LIBRARY_PATH="$torchlib${cudalib:+:$cudalib}:$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  # Binaries, modules and the library carried xz-compressed (pack): unpacked once, in place.
  if compgen -G "$bin/*.xz" >/dev/null || compgen -G "$carry/python/fogo/*.xz" >/dev/null ||
    compgen -G "$carry/pymodule/*.xz" >/dev/null; then
    if [ -z "$python" ] || ! timeout 120 "$python" - "$bin" "$carry/python/fogo" "$carry/pymodule" <<'PY' >"$logs/unpack.log" 2>&1; then
import glob, lzma, os, sys
for packed in [p for folder in sys.argv[1:] for p in glob.glob(os.path.join(folder, "*.xz"))]:
    with lzma.open(packed) as src, open(packed[:-3], "wb") as dst:
        dst.write(src.read())
    os.chmod(packed[:-3], 0o755)
    os.remove(packed)
PY
      problems+=("cannot unpack the binaries in $bin: $(tail -1 "$logs/unpack.log" 2>/dev/null)")
    fi
  fi
  # The tests read data from the checkout they were built in; point that path here.
  local built_in
  if built_in=$(cat "$bin/SOURCE_ROOT" 2>/dev/null); then
    bin_built=1
    if [ "$built_in" != "$root" ] && [ ! -e "$built_in" ]; then
      mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in"
    fi
  else
    problems+=("no binaries in $bin: run 'scripts/gpu_check.sh pack' here first, or 'build'")
  fi
  # Where the tests look for what the project ships: the trainers beside the test binaries, the
  # Fashion-MNIST subset, torchrun (a wrapper when the image has none on PATH).
  export FOGO_FASHION_MNIST_DIR=$carry/data/fashion-mnist
  if ! command -v torchrun >/dev/null && [ -n "$python" ]; then
    mkdir -p "$work/bin"
    printf '#!/bin/sh\nexec "%s" -m torch.distributed.run "$@"\n' "$python" >"$work/bin/torchrun"
    chmod +x "$work/bin/torchrun"
    export FOGO_TORCHRUN=$work/bin/torchrun
  fi
  export PYTHONPATH=$carry/python:$carry/pylib${PYTHONPATH:+:$PYTHONPATH}
  # (Empty when there is none: printf of an empty list writes a blank line, which blocked every
  # step of a run without `check` for an empty reason.)
  : >"$state/environment-problems"
  ((${#problems[@]} == 0)) || printf '%s\n' "${problems[@]}" >"$state/environment-problems"
}

# The Python module's ABI tag (cpython-312) from a file name or an EXT_SUFFIX.
abi_tag() {
  local t=${1##*/}
  t=${t#*.}
  echo "${t%%-*}-$(t=${t#*-} && echo "${t%%-*}")"
}
carried_module() { compgen -G "$carry/python/fogo/_C.*.so" | head -1; }

environment_txt() {
  # What the numbers depend on and what the tests could find.
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat "$bin/SOURCE_SHA" 2>/dev/null || echo unknown) (the binaries' build)"
  echo "gpu: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -4 | tr '\n' ';')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
  echo "cpu isa: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|fma)$' | sort | tr '\n' ' ')"
  [ -z "$python" ] || timeout 120 "$python" - <<'PY' 2>&1
import platform, sysconfig, torch
print("python:", platform.python_version(), sysconfig.get_config_var("EXT_SUFFIX"))
print("torch:", torch.__version__, "cuda", torch.version.cuda, "cpu capability",
      torch.backends.cpu.get_cpu_capability())
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
try:
    import pytest
    print("pytest:", pytest.__version__)
except Exception as e:
    print("pytest: missing:", e)
PY
  local carried
  carried=$(carried_module)
  if [ -z "$carried" ]; then
    echo "fogo python module: none carried (the test step builds it here)"
  elif [ "${carried##*/_C}" = "${py_ext:-?}" ]; then
    echo "fogo python module: carried $(basename "$carried") matches $python ($(abi_tag "$py_ext"))"
  else
    echo "fogo python module: ABI MISMATCH: carried $(basename "$carried") ($(abi_tag "$carried")), $python is $(abi_tag "${py_ext:-?}"): the test step builds it here against the carried libfogo.a"
  fi
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo 'missing (not needed for shipped binaries)')"
  echo "cmake: $(cmake --version 2>/dev/null | head -1 || echo missing), ninja: $(ninja --version 2>/dev/null || echo missing)"
  echo "compute-sanitizer: $(timeout 20 compute-sanitizer --version 2>/dev/null | grep -i version | head -1 || echo missing)"
  echo "torchrun: $(command -v torchrun || echo "${FOGO_TORCHRUN:-missing}")"
  echo "fashion-mnist: $FOGO_FASHION_MNIST_DIR ($(ls "$FOGO_FASHION_MNIST_DIR" 2>/dev/null | wc -l) files)"
  echo "kjv: $(ls -s "$carry/data/kjv.txt" 2>/dev/null || echo missing)"
  echo "deadline: $deadline s from the script's start (FOGO_GPU_DEADLINE_S), $reserve s kept for the report"
  local s
  for s in check test sanitize bench train claim; do printf '%s ' "$s: budget ${budget[$s]} s, min ${least[$s]} s;"; done
  echo
}

step_check() {
  # Refuses to go on with a setup whose results would mean nothing; says why in the report.
  local problems=() p
  while read -r p; do [ -z "$p" ] || problems+=("$p"); done <"$state/environment-problems"
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader ||
    problems+=("no GPU (nvidia-smi failed)")
  environment_txt >"$logs/environment.txt" 2>&1
  cat "$logs/environment.txt"
  if [ -n "$bin_built" ]; then
    [[ $(timeout 60 cuobjdump --list-elf "$bin/fogo_tests" 2>&1) == *sm_90* ]] ||
      problems+=("fogo_tests holds no sm_90 kernels (cuobjdump): fogo was built without its CUDA kernels")
    local b missing runtimes l
    for b in "$bin"/*; do
      [ -x "$b" ] && [ -f "$b" ] || continue
      l=$logs/ldd-$(basename "$b").txt
      ldd "$b" >"$l" 2>&1
      missing=$(grep 'not found' "$l")
      [ -z "$missing" ] || problems+=("$(basename "$b") cannot load: $missing")
      # One CUDA runtime: the shared one torch loads. A second copy (another libcudart soname, or
      # one linked in statically) would keep its own state and kernels could fail to launch.
      runtimes=$(grep -o 'libcudart[^ ]* => [^ ]*' "$l" | sort -u)
      [ "$(printf '%s' "$runtimes" | grep -c libcudart)" -le 1 ] ||
        problems+=("$(basename "$b") loads two CUDA runtimes: $runtimes")
      [ -z "$runtimes" ] || [[ "$runtimes" == *"=> ${cudalib:-?}/"* ]] ||
        problems+=("$(basename "$b") loads a CUDA runtime other than torch's (${cudalib:-?}): $runtimes")
      [ -z "$(readelf -Ws "$b" 2>/dev/null | awk '$7 != "UND" && $8 == "cudaLaunchKernel"')" ] ||
        problems+=("$(basename "$b") has a static CUDA runtime besides torch's shared one")
    done
  fi
  if ((${#problems[@]})); then
    printf '%s\n' "${problems[@]}" >"$state/check-problems"
    detail "${problems[0]}$( ((${#problems[@]} == 1)) || echo " (and $((${#problems[@]} - 1)) more: summary.txt)")"
    for p in "${problems[@]}"; do note "check: $p"; done
    return 1
  fi
  detail "binaries load, one CUDA runtime ($(grep -ho 'libcudart[^ ]* => [^ ]*' "$logs"/ldd-*.txt 2>/dev/null | sort -u | tr '\n' ' '))"
}

# --------------------------------------------------------------------------------------------
# There: tests

# The test runs preload scripts/segv_trace.c's library (when packed): a crash prints its native
# frames, which symbolize() then names with addr2line (the binaries and modules are there).
segv_trace=$carry/lib/libfogo_segv_trace.so
preload=()
[ ! -f "$segv_trace" ] || preload=(LD_PRELOAD="$segv_trace")

symbolize() {
  # symbolize LOG: appends function and line of each "module(+0xOFFSET)" frame that
  # segv_trace printed into LOG, for the modules fogo built (binaries, fogo._C, fogo._testing).
  local log=$1 module offset
  grep -q '^=== segv_trace' "$log" 2>/dev/null && command -v addr2line >/dev/null || return 0
  {
    echo "=== segv_trace: fogo's frames, symbolized (addr2line)"
    grep -oE '^/[^ (]+\(\+0x[0-9a-f]+\)' "$log" | sort -u | while IFS='(' read -r module offset; do
      case "$module" in "$bin"/* | */fogo/_C.* | */fogo/_testing.*) ;; *) continue ;; esac
      offset=${offset#+}
      offset=${offset%)}
      echo "${module##*/} $offset: $(timeout 10 addr2line -f -C -i -e "$module" "$offset" | tr '\n' ' ')"
    done
  } >>"$log"
}

run_gtest() {
  # run_gtest NAME END VAR=value... BINARY [FLAGS]: one gtest binary run until END (seconds of
  # the script), with its test list, XML, log and a line of runs.tsv (name, exit status, seconds):
  # what gpu_report.py counts from.
  local name=$1 end=$2 t0=$SECONDS rc=0 t
  shift 2
  t=$((end - SECONDS))
  if ((t < least_run)); then
    printf '%s\tnot run\t0\tnot run: %s s left in the step\n' "$name" "$t" >>"$logs/runs.tsv"
    return 0
  fi
  timeout 30 env "$@" --gtest_list_tests >"$logs/$name.list" 2>/dev/null
  timeout -k 5 "$t" env "${preload[@]}" "$@" --gtest_output="xml:$logs/$name.xml" >"$logs/$name.log" 2>&1 || rc=$?
  symbolize "$logs/$name.log"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$logs/runs.tsv"
  return $rc
}

module_path=  # where the tests import fogo from, once decided
module_why=   # why the Python tests cannot run, if they cannot
pybuild_pid=

python_module_prepare() {
  # The carried fogo._C if its ABI tag is the interpreter's; otherwise a build here, started in
  # the background (the C++ tests leave most cores idle), until BUILD_END.
  local build_end=$1 carried
  [ -n "$python" ] && [ -n "${py_ext:-}" ] || {
    module_why="no python3 with torch"
    return
  }
  carried=$(carried_module)
  if [ -n "$carried" ] && [ "${carried##*/_C}" = "$py_ext" ]; then
    module_path=$carry/python
    note "python: the carried fogo._C matches $python ($(abi_tag "$py_ext"))"
    return
  fi
  if [ -n "$carried" ]; then
    module_why="ABI mismatch: the carried fogo._C is for $(abi_tag "$carried"), $python is $(abi_tag "$py_ext")"
  else
    module_why="no fogo._C carried"
  fi
  note "python: $module_why; building it here (scripts/gpu_python)"
  build_python_module "$build_end" >"$logs/python-module-build.log" 2>&1 &
  pybuild_pid=$!
}

build_python_module() {
  # fogo._C and fogo._testing for this python3, against the carried libfogo.a.
  local end=$1 dir=$work/pymodule kit=$carry/pymodule gen=()
  [ -f "$kit/libfogo.a" ] && [ -f "$kit/definitions" ] || {
    echo "no libfogo.a or definitions in $kit (pack ships them)"
    return 2
  }
  command -v cmake >/dev/null || { echo "no cmake"; return 2; }
  ! command -v ninja >/dev/null || gen=(-G Ninja)
  rm -rf "$dir"
  # (Never `timeout 0`: it means no limit.)
  ((end - SECONDS >= least_run)) || { echo "no time left to configure"; return 124; }
  timeout -k 5 $((end - SECONDS)) nice -n 10 cmake -S "$root/scripts/gpu_python" -B "$dir" "${gen[@]}" \
    -Wno-dev -DCMAKE_BUILD_TYPE=Release -DFOGO_SOURCE_DIR="$root" -DFOGO_PYTHON="$python" \
    -DFOGO_LIBRARY="$kit/libfogo.a" "-DFOGO_DEFINITIONS=$(cat "$kit/definitions")" || return
  ((end - SECONDS >= least_run)) || { echo "no time left to compile"; return 124; }
  timeout -k 5 $((end - SECONDS)) nice -n 10 cmake --build "$dir" -j "$((jobs / 2 > 1 ? jobs / 2 : 1))" \
    --target fogo_python fogo_python_testing || return
  [ -f "$dir/python/fogo/_C$py_ext" ] || { echo "no $dir/python/fogo/_C$py_ext after the build"; return 3; }
  # A second libstdc++ inside the module (a compiler whose libstdc++ is static only) crashes it
  # at its first ostream (2026-11-27); scripts/gpu_python links libtorch's: check it did.
  local m
  for m in "$dir"/python/fogo/_C"$py_ext" "$dir"/python/fogo/_testing"$py_ext"; do
    [[ $(readelf -d "$m" 2>&1) == *"NEEDED"*"[libstdc++.so.6]"* ]] &&
      [[ $(nm -C "$m" 2>&1) != *" T std::locale::classic()"* ]] || {
      echo "${m##*/} carries its own libstdc++ (not the libstdc++.so.6 libtorch loads)"
      return 4
    }
  done
}

python_tests() {
  # After the C++ tests: the modules' build done (or given up), pytest until the step's end.
  local t0 rc=0 t
  if [ -n "$pybuild_pid" ]; then
    local brc=0
    wait "$pybuild_pid" || brc=$?
    if [ "$brc" -eq 0 ]; then
      module_path=$work/pymodule/python
      module_why=
      note "python: fogo._C and fogo._testing built here for $(abi_tag "$py_ext"), ready $((SECONDS - step_t0)) s into the test step (log: python-module-build.log)"
    else
      module_why+="; building it here failed ($(why $brc)): $(grep -v '^\s*$' "$logs/python-module-build.log" | tail -1 | cut -c1-200)"
    fi
  fi
  if [ -z "$module_path" ]; then
    printf 'python_tests\tnot run\t0\t%s\n' "not run: $module_why" >>"$logs/runs.tsv"
    detail "Python tests not run: $module_why"
    return 0
  fi
  t=$((step_end - SECONDS))
  if ((t < least_run)); then
    printf 'python_tests\tnot run\t0\tnot run: %s s left in the step\n' "$t" >>"$logs/runs.tsv"
    detail "Python tests not run: $t s left"
    return 0
  fi
  t0=$SECONDS
  # pytest -v: a run killed at its budget still shows each test that ended (gpu_report reads it).
  # No wheel build here (test_packaging: minutes of compiling).
  ([ ${#preload[@]} -eq 0 ] || export "${preload[@]}"
    PYTHONPATH="$module_path:$carry/pylib" FOGO_SKIP_WHEEL=1 OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 \
    timeout -k 5 "$t" "$python" -m pytest -v -p no:cacheprovider $py_tests \
    --junitxml="$logs/python_tests.xml" >"$logs/python_tests.log" 2>&1) || rc=$?
  symbolize "$logs/python_tests.log"
  printf '%s\t%s\t%s\n' python_tests "$rc" "$((SECONDS - t0))" >>"$logs/runs.tsv"
  if [ "$rc" -eq 124 ]; then
    # Killed at the step's end: the test it was running and those after it did not run (out of
    # budget, not a failure; gpu_report names them). Only a test that ended failed fails it.
    detail "Python tests: out of budget after $((SECONDS - t0)) s (the rest not run)"
    ! grep -qE '^[^ ]+::[^ ]+ (FAILED|ERROR)\b' "$logs/python_tests.log"
    return
  fi
  return $rc
}

step_test() {
  # Every gtest binary (the CPU tests too; fogo_tests in four shards, the others one after another
  # beside them), then the Python tests. The CUDA tests must run, not skip.
  local shards=4 s rc=0 pids=() t
  local cpp_end=$((SECONDS + (step_end - SECONDS) * 65 / 100))
  : >"$logs/runs.tsv"
  python_module_prepare $((cpp_end + (step_end - cpp_end) / 4))
  for ((s = 0; s < shards; ++s)); do
    run_gtest "fogo_tests-$s" "$cpp_end" GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s \
      OMP_NUM_THREADS=2 "$bin/fogo_tests" &
    pids+=($!)
  done
  # fogo_dist_tests: NCCL on the GPU (DistributedCuda) and the CPU ranks' tests.
  (
    r=0
    for t in fogo_dist_tests gpt2_tests resnet_tests trainer_common_tests; do
      run_gtest "$t" "$cpp_end" OMP_NUM_THREADS=4 "$bin/$t" || r=1
    done
    exit $r
  ) &
  pids+=($!)
  for s in "${pids[@]}"; do wait "$s" || rc=1; done
  python_tests || rc=1
  report_md tests >"$state/tests.md"
  detail "$(grep -m1 -oE '[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped, [0-9]+ listed but never run' "$state/tests.md")"
  local cuda_skips
  cuda_skips=$(grep -m1 -oE 'CUDA tests skipped: [0-9]+' "$state/tests.md" | grep -oE '[0-9]+$')
  if [ "${cuda_skips:-0}" -gt 0 ]; then
    detail "$cuda_skips CUDA test(s) skipped on a GPU machine"
    rc=1
  fi
  return $rc
}

# --------------------------------------------------------------------------------------------
# There: compute-sanitizer

fogo_kernels() {
  # The names of fogo's kernels, from its sources (cuda/*.cu travel with the tree).
  cat "$root"/cuda/*.cu | tr '\n' ' ' |
    grep -oE '__global__ +void +(__launch_bounds__\([^)]*\) +)?[A-Za-z_][A-Za-z_0-9]* *\(' |
    sed -E 's/ *\($//; s/.* //' | sort -u
}

sanitize_run() {
  # sanitize_run TOOL PASS SHARD SHARDS FILTER END [OPTIONS...]: one compute-sanitizer process over
  # a shard of the gtest FILTER; its log, and its exit status beside it (gpu_report reads both).
  local tool=$1 pass=$2 shard=$3 shards=$4 filter=$5 end=$6 rc=0 t
  shift 6
  local log=$logs/sanitize-$tool-$pass-$shard
  local caching=()
  [ "$pass" != uncached ] || caching=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  t=$((end - SECONDS))
  if ((t < least_run)); then
    echo "$SKIP" >"$log.exit"
    return 0
  fi
  env "${caching[@]}" GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$shard" OMP_NUM_THREADS=2 \
    timeout -k 5 "$t" compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 200 "$@" \
    "$bin/fogo_tests" --gtest_filter="$filter" >"$log.log" 2>&1 || rc=$?
  echo "$rc" >"$log.exit"
}

step_sanitize() {
  # memcheck first, over every kernel (an out-of-bounds access in cuBLAS or ATen can be fogo
  # passing wrong sizes): the kernels' parity tests with PyTorch's caching allocator off (it hands
  # out pieces of large blocks, so an access past a tensor inside a block is invisible unless it
  # is off) in three shards, and CudaSync and CudaGraph with caching on (a CUDA graph's memory
  # comes from the caching allocator's pools). Then racecheck and synccheck on fogo's kernels
  # only (each shares memory or shuffles within warps, so each can race; ATen's and cuBLAS's
  # kernels are not checked: they are slow to check and not ours), over all of those tests.
  # Only a report in fogo's kernels fails the step; library ones are listed apart (sanitizer.md).
  command -v compute-sanitizer >/dev/null || {
    detail "compute-sanitizer is not on PATH"
    return $SKIP
  }
  local parity='CudaParity.*:NewtonSchulzProjected.OnCuda*:Muon.LoadMovesStateToTheParametersDevice'
  local graphs='CudaSync.*:CudaGraph.*'
  local mem_end=$((SECONDS + (step_end - SECONDS) * 55 / 100)) k tool pids=() filter=() n
  for k in 0 1 2; do
    sanitize_run memcheck uncached "$k" 3 "$parity" "$mem_end" &
    pids+=($!)
  done
  sanitize_run memcheck cached 0 1 "$graphs" "$mem_end" &
  pids+=($!)
  wait "${pids[@]}"
  if [[ $(timeout 20 compute-sanitizer --help 2>&1) == *--kernel-name* ]]; then
    for n in $(fogo_kernels); do filter+=(--kernel-name "kns=$n"); done
  fi
  if ((${#filter[@]} == 0)); then
    note "sanitize: no kernel filter (no --kernel-name, or no kernels found in cuda/): racecheck and synccheck check every kernel"
  fi
  pids=()
  for tool in racecheck synccheck; do
    for k in 0 1; do
      sanitize_run "$tool" fogo-kernels "$k" 2 "$parity:$graphs" "$step_end" "${filter[@]}" &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  report_md sanitizer >"$state/sanitizer.md"
  local ours
  ours=$(grep -oE "Reports in fogo's kernels: [0-9]+" "$state/sanitizer.md" | grep -oE '[0-9]+$')
  detail "${ours:-?} report(s) in fogo's kernels; $(grep -oE "Reports in library code: .*" "$state/sanitizer.md" | head -1)"
  local unfinished
  unfinished=$(grep -c 'did not finish' "$state/sanitizer.md")
  [ "$unfinished" -eq 0 ] || detail "$unfinished sanitizer run(s) did not finish (sanitizer.md)"
  [ "${ours:-1}" -eq 0 ]
}

# --------------------------------------------------------------------------------------------
# There: benchmarks and training

step_bench() {
  # Only the rows bench/targets.py reads (issue 26's targets), one repetition each: FOGO and
  # fogo::Muon in every form on both sets (bf16 NS), FOGO's NS stage; then torch.optim.Muon.
  local rc=0 set r
  # (Mask and GraphRaise: every graph/eager ratio compares one non-finite policy; issue 44.)
  local rows='^BM_(Step_(FOGO|Muon)(Graph|GraphRaise|Mask|Auto|Gram)?/[01]/1/0|Stage_FOGO/0/1/0/1)(/|$)'
  bounded 75 "$least_run" "$bin/fogo_bench" --benchmark_filter="$rows" --benchmark_min_time=0.5 \
    --benchmark_repetitions=1 --benchmark_out="$logs/bench.json" --benchmark_out_format=json \
    >"$logs/bench.log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || detail "fogo_bench: $(why $rc)"
  : >"$logs/torch_muon.txt"
  for set in gpt2-small resnet18; do
    r=0
    bounded 40 "$least_run" "$python" "$root/bench/torch_muon_step.py" --set "$set" --device cuda --steps 50 \
      >>"$logs/torch_muon.txt" 2>&1 || r=$?
    [ $r -eq 0 ] || { detail "torch_muon_step $set: $(why $r)"; rc=1; }
  done
  return $rc
}

train_run() {
  # train_run NAME CAP MIN COMMAND...: one training run with its log; says what became of it.
  local name=$1 cap=$2 min=$3 r=0
  shift 3
  bounded "$cap" "$min" "$@" >"$logs/$name.log" 2>&1 || r=$?
  [ $r -eq 0 ] || detail "$name: $(why $r)"
  [ $r -eq 0 ] || [ $r -eq $SKIP ]
}

step_train() {
  # Shortened: GPT-2 124M (paper architecture, context 1024, bf16 autocast) per optimizer, 20
  # steps (the steady state is read from step 6 on), and the same model in eager PyTorch: what
  # the training-step targets need. Then, while time is left: FOGO from a CUDA graph with Mask,
  # with ns_form=auto, in the trainer's default deterministic mode, and ResNet-18 images/s.
  local rc=0 opt kjv=$carry/data/kjv.txt
  local common=(--model 124m --device cuda --data "$kjv" --eval-every 1000000 --eval-sequences 8)
  [ -f "$kjv" ] || bounded 30 5 "$bin/gpt2" prepare-kjv --out "$kjv" >/dev/null || return 1
  for opt in adamw muon fogo; do
    train_run "gpt2-$opt" 60 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer "$opt" \
      --no-deterministic --steps 20 --out "$runs/gpt2-$opt" || rc=1
  done
  train_run gpt2-eager 60 "$least_run" "$python" "$root/bench/gpt2_eager.py" --device cuda --steps 20 \
    --warmup 5 || rc=1
  # The training-step targets as defined, at 0.5M tokens per optimizer step (30 micro-batches of
  # 16 x 1024 = 491,520 tokens; issue 44): 8 steps, steady state 6-8 (about 1.4 s a step).
  for opt in adamw muon fogo; do
    train_run "gpt2-$opt-accum" 60 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer "$opt" \
      --no-deterministic --grad-accum 30 --steps 8 --out "$runs/gpt2-$opt-accum" || rc=1
  done
  train_run gpt2-fogo-graph 60 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer fogo \
    --fogo cuda_graph=true --fogo nonfinite=mask --no-deterministic --steps 20 \
    --out "$runs/gpt2-fogo-graph" || rc=1
  train_run gpt2-fogo-auto 60 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer fogo \
    --fogo ns_form=auto --no-deterministic --steps 20 --out "$runs/gpt2-fogo-auto" || rc=1
  train_run gpt2-fogo-deterministic 60 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer fogo \
    --steps 8 --out "$runs/gpt2-fogo-deterministic" || rc=1
  # NorMuon on both optimizers, and FOGO's matrices cut into 4 row blocks (heads=4: the rows of
  # every GPT-2 matrix FOGO takes, 768, 2304 and 3072, divide by 4; the embedding is AdamW's;
  # `blocks=` would have to fit every matrix at once) through the trainer on CUDA (issue 44).
  train_run gpt2-fogo-normuon 45 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer fogo \
    --fogo normuon=true --no-deterministic --steps 8 --out "$runs/gpt2-fogo-normuon" || rc=1
  train_run gpt2-muon-normuon 45 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer muon \
    --muon-normuon --no-deterministic --steps 8 --out "$runs/gpt2-muon-normuon" || rc=1
  train_run gpt2-fogo-heads 45 "$least_run" "$bin/gpt2" train "${common[@]}" --optimizer fogo \
    --fogo heads=4 --no-deterministic --steps 8 --out "$runs/gpt2-fogo-heads" || rc=1
  for opt in adam muon fogo; do
    train_run "resnet-$opt" 60 "$least_run" "$bin/resnet_train" --data-dir "$carry/data/fashion-mnist" \
      --device cuda --width 64 --optimizers "$opt" --seeds 0 --epochs 1 --no-plots \
      --out "$runs/resnet-$opt" || { rc=1; continue; }
    [ -f "$runs/resnet-$opt/$opt-seed0/train.jsonl" ] || continue
    # Steady-state images/s from the training records (time_s excludes nothing but evaluation
    # at the epoch's end): from step 20 to the last record.
    timeout 30 "$python" - "$runs/resnet-$opt/$opt-seed0/train.jsonl" "$opt" <<'PY' >>"$logs/resnet-$opt.log" 2>&1 || rc=1
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
first = next(r for r in recs if r["step"] >= 20)
last = recs[-1]
batch = 128
print(f"resnet18 width 64 {sys.argv[2]}: {batch * (last['step'] - first['step']) / (last['time_s'] - first['time_s']):.0f} images/s (steps {first['step']}-{last['step']})")
PY
  done
  return $rc
}

step_claim() {
  # The paper's main claim at GPU scale (issue 44, section 4), last in order of value: ResNet-18
  # (width 64) on class-imbalanced Fashion-MNIST (rare classes 4-8 at 10%), 2 epochs with a
  # cosine schedule, FOGO and Muon at the trainer's defaults (the paper's lrs and presets), one
  # seed of each in a pair, back to back (the order alternating), pairs until the step's time
  # ends. The primary test is declared in scripts/gpu_claim.py before the first run and written
  # to the log first; each run's record (seed, lr, accuracy per class, seconds, commit) goes to
  # claim-runs.jsonl as it ends, and the paired test to train.md.
  # FOGO_GPU_CLAIM_{DEVICE,WIDTH,EPOCHS,SEED,ARGS}: the rehearsal's tiny CPU version;
  # FOGO_GPU_CLAIM_PAIRS: at most that many pairs (20: a whole call holds about 10 on an H100).
  local device=${FOGO_GPU_CLAIM_DEVICE:-cuda} width=${FOGO_GPU_CLAIM_WIDTH:-64}
  local epochs=${FOGO_GPU_CLAIM_EPOCHS:-2} seed=${FOGO_GPU_CLAIM_SEED:-100}
  local most=${FOGO_GPU_CLAIM_PAIRS:-20} args=(${FOGO_GPU_CLAIM_ARGS:---test-per-class 0})
  local data=$carry/data/fashion-mnist-full out=$runs/claim records=$logs/claim-runs.jsonl
  local pair=0 t0 took=0 opt order r
  [ -n "$python" ] || { detail "no python3 for scripts/gpu_claim.py"; return 1; }
  "$python" "$root/scripts/gpu_claim.py" plan >"$logs/claim.log" 2>&1 || return 1
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    data=$carry/data/fashion-mnist
    note "claim: no full Fashion-MNIST carried ($carry/data/fashion-mnist-full): the 12,000-image subset, 120 training images per rare class"
  fi
  : >"$records"
  # A pair is started only when the last one's time (x 1.2) is left: none is cut half-way.
  while ((pair < most && step_end - SECONDS >= (took > 0 ? took * 12 / 10 : least_run))); do
    t0=$SECONDS
    order=(fogo muon)
    ((pair % 2 == 0)) || order=(muon fogo)
    for opt in "${order[@]}"; do
      r=0
      local started=$SECONDS
      bounded 400 "$least_run" "$bin/resnet_train" --scenario class-imbalanced --data-dir "$data" \
        --device "$device" --width "$width" --epochs "$epochs" --lr-schedule cosine \
        --optimizers "$opt" --seeds "$seed" --no-plots --overwrite "${args[@]}" --out "$out" \
        >>"$logs/claim.log" 2>&1 || r=$?
      [ $r -ne $SKIP ] || break 2
      "$python" "$root/scripts/gpu_claim.py" record "$out/$opt-seed$seed" "$sha" "$r" \
        $((SECONDS - started)) >>"$records" 2>>"$logs/claim.log"
    done
    took=$((SECONDS - t0))
    pair=$((pair + 1)) seed=$((seed + 1))
  done
  "$python" "$root/scripts/gpu_claim.py" report "$records" >"$logs/claim.md" 2>>"$logs/claim.log"
  # (';' would split the status line: the interval's parts are joined by commas there.)
  detail "$pair pair(s) started, $(grep -m1 -oE '[0-9]+ complete pair\(s\): .*\)\.' "$logs/claim.md" | tr -d '*' | tr ';' ',')"
  grep -q '"completed": true' "$records"
}

step_build() {
  # Fallback: builds into build-gpu/tree and makes it the source of binaries.
  local build=$work/tree deps=$work/deps
  command -v nvcc >/dev/null || die "build: nvcc is missing: the CUDA kernels cannot be compiled"
  [ -d "$carry/googletest" ] || die "build: $carry/googletest missing (scripts/gpu_check.sh prepare)"
  if [ ! -f "$deps/.done" ]; then
    cmake -S "$carry/googletest" -B "$work/googletest" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$deps" \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null || die "build: GoogleTest"
    ninja -C "$work/googletest" -j "$jobs" install >/dev/null || die "build: GoogleTest"
    touch "$deps/.done"
  fi
  cmake -S . -B "$build" -G Ninja -Wno-dev -DFOGO_CUDA_ARCHITECTURES=90 \
    -DFOGO_PYTHON="$python" -DCMAKE_PREFIX_PATH="$deps" \
    -Dbenchmark_DIR="$carry/benchmark/usr/lib/x86_64-linux-gnu/cmake/benchmark" \
    >"$logs/configure.log" 2>&1 || {
    cat "$logs/configure.log"
    die "build: configure failed"
  }
  grep -q '^FOGO_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" && grep -q "CUDA kernels ON" \
    "$logs/configure.log" || die "build: configured without the CUDA kernels"
  ninja -C "$build" -j "$jobs" || die "build: compilation failed"
  rm -rf "$bin"
  mkdir -p "$bin" "$carry/lib" "$carry/python"
  for b in "${shipped_binaries[@]}"; do cp "$build/$b" "$bin/"; done
  cp -a "$carry"/benchmark/usr/lib/x86_64-linux-gnu/libbenchmark.so* "$carry/lib/" 2>/dev/null
  rm -rf "$carry/python/fogo" && cp -rL "$build/python/fogo" "$carry/python/"
  echo "$root" >"$bin/SOURCE_ROOT"
  echo unknown >"$bin/SOURCE_SHA"
}

# --------------------------------------------------------------------------------------------
# There: the report

report_python=  # any python3 runs gpu_report.py (standard library only)

report_md() {
  # KIND: gpu_report.py's markdown from the logs so far, or why there is none.
  if [ -n "$report_python" ]; then
    timeout 60 "$report_python" "$root/scripts/gpu_report.py" "$1" "$logs" 2>&1 ||
      echo "(gpu_report.py $1 failed: the logs are in logs.tgz)"
  else
    echo "(no python3 to write this part: the logs are in logs.tgz)"
  fi
}

step_header() {  # the step's status, on top of its part of the report
  echo "Step \`$1\`: $(status_of "$1")"
  echo
}

summary_txt() {
  echo "gpu_check report, $(date -u +%FT%TZ): commit $sha, ${gpu_name:-no GPU found}"
  echo "deadline $deadline s from the start (FOGO_GPU_DEADLINE_S; $reserve s kept for the report); now at $SECONDS s${ended:+; $ended}"
  echo
  echo "steps:"
  local s
  while read -r s; do printf '  %-9s %s\n' "$s" "$(status_of "$s")"; done <"$state/plan"
  if [ -s "$state/notes" ]; then
    echo
    echo "notes:"
    sed 's/^/  /' "$state/notes"
  fi
  echo
  local failed
  failed=$(while read -r s; do [[ $(status_of "$s") != FAILED* ]] || echo "$s"; done <"$state/plan")
  if [ -n "$failed" ]; then echo "FAILED steps:" $failed; else echo "no step failed"; fi
}

write_report() {
  # All 8 files of the report from what the logs hold now; called after every step and at the end.
  mkdir -p "$report"
  summary_txt >"$report/summary.txt"
  if [ -s "$logs/environment.txt" ]; then
    cp "$logs/environment.txt" "$report/environment.txt"
  else
    {
      echo "(check did not run: only what needs no tool)"
      echo "date: $(date -u +%FT%TZ)"
      echo "commit: $sha"
      echo "gpu: ${gpu_name:-none found}"
      echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
      echo "python: ${python:-none}"
    } >"$report/environment.txt"
  fi
  # The markdown parts, all from one gpu_report.py run, each under its step's status.
  local parts=$work/parts kind
  rm -rf "$parts" && mkdir -p "$parts"
  [ -z "$report_python" ] ||
    timeout 60 "$report_python" "$root/scripts/gpu_report.py" all "$logs" "$parts" >/dev/null 2>&1
  for kind in tests sanitizer bench train; do
    [ -s "$parts/$kind.md" ] ||
      echo "(no gpu_report.py output for $kind: the logs are in logs.tgz)" >"$parts/$kind.md"
  done
  { step_header test; cat "$parts/tests.md"; } >"$report/tests.md"
  { step_header sanitize; cat "$parts/sanitizer.md"; } >"$report/sanitizer.md"
  {
    step_header bench
    cat "$parts/bench.md"
    echo
    echo "## Issue 26's targets (bench/targets.py, from this run's bench and train logs)"
    echo
    if [ -n "$report_python" ]; then
      local args=(--bench "$logs/bench.json" --torch-muon "$logs/torch_muon.txt"
                  --gpt2-eager "$logs/gpt2-eager.log") opt
      for opt in adamw muon fogo; do
        args+=(--gpt2 "$opt=$logs/gpt2-$opt.log")
        [ ! -s "$logs/gpt2-$opt-accum.log" ] || args+=(--gpt2-accum "$opt=$logs/gpt2-$opt-accum.log")
      done
      timeout 60 "$report_python" "$root/bench/targets.py" "${args[@]}" 2>/dev/null
    fi
  } >"$report/bench.md"
  if [ -s "$logs/bench.json" ]; then
    cp "$logs/bench.json" "$report/bench.json"
  else
    printf '{"benchmarks": [], "note": "no benchmark results: %s"}\n' "$(status_of bench | tr -d '"\\')" \
      >"$report/bench.json"
  fi
  {
    step_header train
    cat "$parts/train.md"
    echo
    step_header claim
    # From the records so far: a step killed half-way still reports the runs that ended.
    if [ -n "$report_python" ] && [ -f "$logs/claim-runs.jsonl" ]; then
      timeout 30 "$report_python" "$root/scripts/gpu_claim.py" report "$logs/claim-runs.jsonl" ||
        echo "(gpu_claim.py report failed: the records are in logs.tgz, logs/claim-runs.jsonl)"
    else
      echo "(no claim results)"
    fi
  } >"$report/train.md"
  pack_logs
}

pack_logs() {
  # logs.tgz: every text log, each cut to its first and last MiB when longer than 2 MiB, the
  # whole at most 15 MiB (the biggest left out until it fits). Built outside $OUT, then moved.
  local stage=$work/logs-stage f size
  rm -rf "$stage" && mkdir -p "$stage" && cp -r "$logs" "$stage/logs"
  find "$stage/logs" -type f -size +2M | while read -r f; do
    size=$(stat -c %s "$f")
    {
      head -c 1048576 "$f"
      printf '\n[... gpu_check: %s bytes cut ...]\n' "$((size - 2 * 1048576))"
      tail -c 1048576 "$f"
    } >"$f.cut" && mv "$f.cut" "$f"
  done
  while :; do
    tar -C "$stage" -czf "$work/logs.tgz" logs 2>/dev/null
    (($(stat -c %s "$work/logs.tgz") > 15 * 1048576)) || break
    f=$(find "$stage/logs" -type f -printf '%s %p\n' | sort -rn | head -1 | cut -d' ' -f2-)
    [ -n "$f" ] && [ "${f##*/}" != LEFT-OUT.txt ] || break
    echo "left out of logs.tgz (too big): ${f##*/} ($(stat -c %s "$f") bytes)" >>"$stage/logs/LEFT-OUT.txt"
    rm -f "$f"
  done
  mv -f "$work/logs.tgz" "$report/logs.tgz"
  rm -rf "$stage"
}

finished=
finish() {
  # The report, whatever ended the script; printed last so that it survives in the output.
  [ -z "$finished" ] || return 0
  finished=1
  [ -z "$step_pid" ] || stop_tree "$step_pid"
  [ -z "$watchdog_pid" ] || stop_tree "$watchdog_pid"
  # After the last step's own write only the summary has changed (its time, how it ended).
  if [ -n "$report_fresh" ]; then summary_txt >"$report/summary.txt"; else write_report; fi
  local files
  files=$(find "$out" -type f | wc -l)
  ((files <= 8)) ||
    echo "gpu_check: $files files under $out: the device tool brings back 8 ($(find "$out" -type f | tr '\n' ' '))" >&2
  echo
  echo "=== gpu_check report: $report ($(ls "$report" | tr '\n' ' '))"
  local f
  for f in tests.md sanitizer.md summary.txt; do
    echo "--- $f"
    cat "$report/$f"
  done
}

on_signal() {
  trap '' TERM INT
  ended="interrupted by SIG$1${current_step:+ during $current_step}"
  echo "gpu_check: $ended at $SECONDS s; writing the report" >&2
  if [ -n "$step_pid" ]; then
    set_status "$current_step" "interrupted by SIG$1 after $((SECONDS - step_t0)) s (what it had done is in the report)"
  fi
  exit "$2"
}

on_exit() {
  local rc=$?
  set +u
  trap '' TERM INT
  [ -n "$ended" ] || [ "$rc" -eq 0 ] || [ -n "$normal_end" ] ||
    ended="the script ended early (exit $rc)${current_step:+ in $current_step}"
  finish
  exit "$rc"
}

# --------------------------------------------------------------------------------------------

[ $# -gt 0 ] || set -- all
case "$1" in
  pack) pack && pack_claim_data; exit ;;
  prepare) prepare; exit ;;
  rehearse)
    shift
    py=${FOGO_PYTHON:-python3}
    [ -n "${FOGO_PYTHON:-}" ] || [ ! -x "$root/.venv/bin/python" ] || py=$root/.venv/bin/python
    exec "$py" -m pytest -q -p no:cacheprovider "$root/scripts/tests/test_gpu_check.py" "$@"
    ;;
esac
steps=()
for step in "$@"; do
  case "$step" in
    all) steps+=(check test sanitize bench train claim) ;;
    build | check | test | sanitize | bench | train | claim) steps+=("$step") ;;
    *) die "unknown step '$step' (pack, prepare, rehearse, build, check, test, sanitize, bench, train, claim, all)" ;;
  esac
done

ended=
normal_end=
rm -rf "$logs" "$runs" "$state"
mkdir -p "$logs" "$runs" "$state"
printf '%s\n' "${steps[@]}" >"$state/plan"
report_python=$(command -v "${FOGO_PYTHON:-python3}" || command -v python3 || true)
# The report's folder: <date>-<gpu>-<sha>, e.g. 2026-11-25-h100-da0f8fb.
gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu=$(echo "$gpu_name" | grep -oiE '[a-z][0-9]{2,4}[a-z]?' | head -1 | tr 'A-Z' 'a-z')
sha=$(cat "$bin/SOURCE_SHA" 2>/dev/null || echo unknown)
report=$out/$(date -u +%F)-${gpu:-gpu}-$sha
mkdir -p "$report"
trap on_exit EXIT
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT

for step in "${steps[@]}"; do
  if [ "$step" = build ]; then
    run_step build
    sha=$(cat "$bin/SOURCE_SHA" 2>/dev/null || echo unknown)
    continue
  fi
  if [ -z "${environment_done:-}" ]; then
    environment
    environment_done=1
    # Without check, a broken environment still stops the steps that need it.
    if [[ " ${steps[*]} " != *" check "* ]] && [ -s "$state/environment-problems" ]; then
      blocked="environment: $(head -1 "$state/environment-problems")"
      note "environment: $(tr '\n' ';' <"$state/environment-problems")"
    fi
  fi
  run_step "$step"
  if [ "$step" = check ] && [[ $(status_of check) == FAILED* ]]; then
    blocked="check failed: $(head -1 "$state/check-problems" 2>/dev/null || echo "see summary.txt")"
  fi
done
normal_end=1
failed=$(while read -r s; do [[ $(status_of "$s") != FAILED* ]] || echo "$s"; done <"$state/plan")
[ -z "$failed" ] && [ -z "$blocked" ]
