"""A rehearsal of scripts/gpu_check.sh on a CPU machine: the script itself, unchanged, against
stand-ins of what only a GPU machine has (nvidia-smi, cuobjdump, compute-sanitizer, the shipped
test binaries, the benchmark, the trainers, torch's CUDA scripts, cmake for the Python module), so
that its control flow is tried here and not on a scarce GPU loan: the deadline and the steps'
budgets, skipping, the trap on TERM in the middle of a step, a crash and a hang in a step, a failed
check, the ABI-mismatch and module-build paths, the report and its 8-file limit. Needs neither a
GPU nor a build of fogo (`scripts/gpu_check.sh rehearse` runs it; ctest: gpu_check_rehearsal)."""
import os
import pathlib
import signal
import stat
import subprocess
import sys
import sysconfig
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
REPORT_FILES = {"summary.txt", "environment.txt", "tests.md", "sanitizer.md", "bench.md",
                "bench.json", "train.md", "logs.tgz"}
EXT = sysconfig.get_config_var("EXT_SUFFIX")  # this interpreter's, e.g. .cpython-311-x86_64-linux-gnu.so

# A gtest binary: three tests (sharded as gtest shards them), XML and console output; what it does
# comes from REHEARSE_<NAME>_<SHARD> or REHEARSE_<NAME>: pass, fail, crash, hang, big.
GTEST = r"""#!/usr/bin/env bash
name=$(basename "$0" | tr 'a-z-' 'A-Z_')
shard=${GTEST_SHARD_INDEX:-0} total=${GTEST_TOTAL_SHARDS:-1}
v=REHEARSE_${name}_$shard w=REHEARSE_$name
mode=${!v:-${!w:-pass}}
xml=
for a in "$@"; do
  case $a in
    --gtest_list_tests) printf 'Fake.\n  Passes\n  CudaRuns\n  Third\n'; exit 0 ;;
    --gtest_output=xml:*) xml=${a#--gtest_output=xml:} ;;
  esac
done
echo $$ >>"$REHEARSE_PIDS"
tests=(Passes CudaRuns Third) mine=()
for i in 0 1 2; do ((i % total != shard)) || mine+=("${tests[$i]}"); done
((${#mine[@]})) && echo "[ RUN      ] Fake.${mine[0]}"
case $mode in
  hang) exec sleep 300 ;;
  crash) kill -SEGV $$ ;;
  big) head -c 6000000 /dev/urandom | base64 ;;
esac
{
  echo '<?xml version="1.0" encoding="UTF-8"?><testsuites><testsuite name="Fake">'
  for t in "${mine[@]}"; do
    if [ "$mode" = fail ] && [ "$t" = Third ]; then
      echo "<testcase name=\"$t\" classname=\"Fake\"><failure message=\"fake.cpp:1&#x0A;boom\"/></testcase>"
    else
      echo "<testcase name=\"$t\" classname=\"Fake\" status=\"run\" result=\"completed\"/>"
    fi
  done
  echo '</testsuite></testsuites>'
} >"${xml:-/dev/null}"
((${#mine[@]})) && echo "[       OK ] Fake.${mine[0]} (1 ms)"
[ "$mode" != fail ]
"""

# compute-sanitizer: runs the binary after its options; REHEARSE_SANITIZER_<TOOL> adds a report
# in ATen's kernels (aten), in fogo's (ours), or hangs (hang).
SANITIZER = r"""#!/usr/bin/env bash
case "${1:-}" in
  --help) echo "  --kernel-name arg   filter the kernels checked"; exit 0 ;;
  --version) echo "Version 2025.3.0 (stand-in)"; exit 0 ;;
esac
args="$*" tool=memcheck
while [ $# -gt 0 ]; do
  case $1 in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode | --print-limit | --kernel-name) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
v=REHEARSE_SANITIZER_${tool^^}
echo "========= COMPUTE-SANITIZER"
echo "stand-in args: $args"
"$@"
case ${!v:-clean} in
  hang) echo $$ >>"$REHEARSE_PIDS"; exec sleep 300 ;;
  aten)
    echo "========= Error: Race reported between Write access at void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)+0x1a40 in /pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1021"
    echo "=========     and Read access at void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)+0x1b20 in /pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1030 [64 hazards]"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 3 ;;
  ours)
    echo "========= Error: Race reported between Write access at fogo::cuda::(anonymous namespace)::momenta_kernel<float>(Table)+0x200 in /x/cuda/momenta.cu:62"
    echo "=========     and Read access at fogo::cuda::(anonymous namespace)::momenta_kernel<float>(Table)+0x260 in /x/cuda/momenta.cu:69 [4 hazards]"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 3 ;;
esac
echo "========= ERROR SUMMARY: 0 errors"
"""

BENCH = r"""#!/usr/bin/env bash
out=
for a in "$@"; do case $a in --benchmark_out=*) out=${a#*=} ;; esac; done
echo "$*" >"$REHEARSE_DIR/bench-args"
[ "${REHEARSE_FOGO_BENCH:-pass}" != hang ] || { echo $$ >>"$REHEARSE_PIDS"; exec sleep 300; }
cat >"$out" <<'JSON'
{"context": {"host_name": "stand-in", "date": "today"}, "benchmarks": [
 {"name": "BM_Step_FOGO/0/1/0/real_time", "run_name": "BM_Step_FOGO/0/1/0/real_time",
  "run_type": "iteration", "real_time": 12.0, "time_unit": "ms"},
 {"name": "BM_Step_Muon/0/1/0/real_time", "run_name": "BM_Step_Muon/0/1/0/real_time",
  "run_type": "iteration", "real_time": 8.0, "time_unit": "ms"}]}
JSON
"""

GPT2 = r"""#!/usr/bin/env bash
case $1 in
  prepare-kjv) echo "In the beginning" >"$3" ;;
  train) echo "steady state (steps 6-20): median step 100.00 ms, optimizer 12.00 ms (12.0% of the step), 40960 tokens/s, MFU 30.1%" ;;
esac
"""

# resnet_train: the throughput run's train.jsonl; a class-imbalanced run (the claim step) sleeps
# REHEARSE_RESNET_SLEEP seconds and writes eval.jsonl and result.jsonl, its rare-class accuracy
# made from the optimizer and the seed.
RESNET = r"""#!/usr/bin/env bash
out= opt= seed=0 scenario= args="$*"
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;; --optimizers) opt=$2; shift 2 ;; --seeds) seed=$2; shift 2 ;;
    --scenario) scenario=$2; shift 2 ;; *) shift ;;
  esac
done
run=$out/$opt-seed$seed
mkdir -p "$run"
if [ "$scenario" != class-imbalanced ]; then
  for s in 0 20 40 60; do echo "{\"step\": $s, \"time_s\": $s.0}"; done >"$run/train.jsonl"
  exit 0
fi
echo "$args" >>"$REHEARSE_DIR/claim-args"
echo "stand-in run $opt seed $seed"
sleep "${REHEARSE_RESNET_SLEEP:-0}"
[ "$opt" = fogo ] && rare=$((60 + seed % 3)) || rare=$((58 + (seed * 7) % 5))
echo "{\"step\": 10, \"acc_class0\": 90.5, \"acc_class1\": 91, \"acc_class2\": 92, \"acc_class3\": 93, \"acc_class4\": $rare, \"acc_class5\": $rare, \"acc_class6\": $rare, \"acc_class7\": $rare, \"acc_class8\": $rare, \"acc_class9\": 94}" >"$run/eval.jsonl"
lr=0.001
[ "$opt" = fogo ] || lr=0.01
echo "{\"optimizer\": \"$opt\", \"seed\": $seed, \"steps\": 10, \"lr\": $lr, \"completed\": true, \"train_seconds\": 1.5, \"rare_acc\": $rare, \"acc\": 80.0, \"nonrare_acc\": 92.0}" >"$run/result.jsonl"
"""

NVIDIA_SMI = r"""#!/usr/bin/env bash
if [ -n "${REHEARSE_NO_GPU:-}" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
  exit 9
fi
case "$*" in
  *name,driver_version*) echo "NVIDIA H100 80GB HBM3, 580.65, 81559 MiB, 1980 MHz" ;;
  *) echo "NVIDIA H100 80GB HBM3" ;;
esac
"""

CUOBJDUMP = """#!/usr/bin/env bash
echo "ELF file    1: fogo_tests.1.sm_90.cubin"
"""

# cmake for the Python modules' build: fails when REHEARSE_CMAKE=fail, else makes a package whose
# extension modules carry the interpreter's tag (from -DFOGO_PYTHON) and says where it was made.
CMAKE = r"""#!/usr/bin/env bash
[ "${1:-}" != --version ] || { echo "cmake version 3.31 (stand-in)"; exit 0; }
if [ "${REHEARSE_CMAKE:-ok}" = fail ]; then
  echo "CMake Error: Could NOT find Python3 (missing: Development.Module) (stand-in)" >&2
  exit 1
fi
if [ "$1" = --build ]; then
  ext=$(cat "$2/ext")
  mkdir -p "$2/python/fogo"
  echo 'WHERE = "built here"' >"$2/python/fogo/__init__.py"
  touch "$2/python/fogo/_C$ext" "$2/python/fogo/_testing$ext"
  exit 0
fi
dir= py=
while [ $# -gt 0 ]; do
  case $1 in -B) dir=$2; shift 2 ;; -DFOGO_PYTHON=*) py=${1#*=}; shift ;; *) shift ;; esac
done
mkdir -p "$dir"
"$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' >"$dir/ext"
"""

# readelf and nm over the modules built there: linked to the libstdc++.so.6 libtorch loads, or
# (REHEARSE_MODULE_LIBSTDCXX=static) carrying a copy of their own, as the GPU image's compiler
# made them on 2026-11-27.
READELF = r"""#!/usr/bin/env bash
[ "${REHEARSE_MODULE_LIBSTDCXX:-shared}" = static ] ||
  echo " 0x0000000000000001 (NEEDED)             Shared library: [libstdc++.so.6]"
echo " 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]"
"""
NM = r"""#!/usr/bin/env bash
[ "${REHEARSE_MODULE_LIBSTDCXX:-shared}" != static ] ||
  echo "00000000001f2e30 T std::locale::classic()"
echo "0000000000012340 T PyInit__C"
"""

# python3: the real interpreter with a stand-in torch, except torch's CUDA scripts.
PYTHON = r"""#!/usr/bin/env bash
case "${1:-}" in
  */bench/torch_muon_step.py) echo "torch.optim.Muon $3 cuda: median 20.00 ms, mean 21.00 ms"; exit 0 ;;
  */bench/gpt2_eager.py) echo "gpt2_eager tokens_per_s=41000 mfu=0.31"; exit 0 ;;
esac
PYTHONPATH=@SITE@${PYTHONPATH:+:$PYTHONPATH} exec @PYTHON@ "$@"
"""

TORCH = '''"""Stand-in torch: what gpu_check.sh asks of it."""
import types
__version__ = "2.11.0+cu130 (stand-in)"
version = types.SimpleNamespace(cuda="13.0")
cuda = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda: "stand-in H100")
backends = types.SimpleNamespace(cpu=types.SimpleNamespace(get_cpu_capability=lambda: "AVX512"))
'''

# The Python tests there: test_cuda*.py only (what needs a GPU); REHEARSE_PY_FAIL fails one,
# REHEARSE_PY_HANG makes the last one outlive the step's budget.
PYTESTS = '''import os
import time

import fogo


def test_imports_the_module_the_script_chose():
    assert fogo.WHERE == os.environ["REHEARSE_EXPECT_FOGO"]


def test_another():
    assert not os.environ.get("REHEARSE_PY_FAIL"), "failed as asked"


def test_last():
    if os.environ.get("REHEARSE_PY_HANG"):
        with open(os.environ["REHEARSE_PIDS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(300)
'''
# A CPU test beside them: CI runs it here, never the GPU machine.
PYTESTS_CPU = '''def test_never_run_on_the_gpu_machine():
    raise AssertionError("a CPU-only Python test ran in the GPU check")
'''


def write(path, text, executable=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class Sandbox:
    def __init__(self, tmp):
        self.tmp, self.carry, self.out = tmp, tmp / "carry", tmp / "out"
        fake = tmp / "fakebin"
        for name, text in (("nvidia-smi", NVIDIA_SMI), ("cuobjdump", CUOBJDUMP),
                           ("compute-sanitizer", SANITIZER), ("cmake", CMAKE),
                           ("readelf", READELF), ("nm", NM)):
            write(fake / name, text, executable=True)
        write(fake / "python3", PYTHON.replace("@SITE@", str(tmp / "site"))
              .replace("@PYTHON@", sys.executable), executable=True)
        write(tmp / "site" / "torch" / "__init__.py", TORCH)
        (tmp / "site" / "torch" / "lib").mkdir()
        (tmp / "site" / "nvidia" / "cu13" / "lib").mkdir(parents=True)
        bin_ = self.carry / "bin"
        for name in ("fogo_tests", "fogo_dist_tests", "gpt2_tests", "resnet_tests",
                     "trainer_common_tests"):
            write(bin_ / name, GTEST, executable=True)
        write(bin_ / "fogo_bench", BENCH, executable=True)
        write(bin_ / "gpt2", GPT2, executable=True)
        write(bin_ / "resnet_train", RESNET, executable=True)
        subprocess.run(["xz", "-f", str(bin_ / "fogo_bench")], check=True)  # as `pack` ships them
        write(bin_ / "SOURCE_ROOT", f"{ROOT}\n")
        write(bin_ / "SOURCE_SHA", "abc1234\n")
        (self.carry / "lib").mkdir()
        write(self.carry / "pymodule" / "libfogo.a", "!<arch>\n")
        write(self.carry / "pymodule" / "definitions", "FOGO_WITH_CUDA=1;FOGO_WITH_DISTRIBUTED=1\n")
        write(self.carry / "data" / "fashion-mnist" / "train-images-idx3-ubyte.gz", "")
        write(self.carry / "data" / "kjv.txt", "In the beginning\n")
        write(tmp / "pytests" / "test_cuda_fake.py", PYTESTS)
        write(tmp / "pytests" / "test_api.py", PYTESTS_CPU)
        self.pids = tmp / "pids"
        self.pids.write_text("")
        self.env = dict(os.environ)
        for key in list(self.env):
            if key.startswith(("FOGO_", "REHEARSE_", "GTEST_")) or key in ("OUT", "PYTHONPATH"):
                del self.env[key]
        self.env.update(
            PATH=f"{fake}:{os.environ['PATH']}", FOGO_PYTHON=str(fake / "python3"),
            FOGO_GPU_CARRY=str(self.carry), FOGO_GPU_WORK=str(tmp / "work"), OUT=str(self.out),
            FOGO_GPU_PYTHON_DIR=str(tmp / "pytests"), REHEARSE_PIDS=str(self.pids),
            REHEARSE_DIR=str(tmp), FOGO_GPU_DEADLINE_S="120", FOGO_GPU_RESERVE_S="5",
            # Seconds, not minutes: the least a step or one command is started with.
            FOGO_GPU_MIN_TEST="2", FOGO_GPU_MIN_SANITIZE="2", FOGO_GPU_MIN_BENCH="1",
            FOGO_GPU_MIN_TRAIN="1", FOGO_GPU_MIN_CLAIM="1", FOGO_GPU_MIN_RUN_S="1",
            FOGO_GPU_CLAIM_PAIRS="2")

    def module(self, ext):
        """The carried fogo._C, for the interpreter whose tag `ext` is."""
        write(self.carry / "python" / "fogo" / "__init__.py", 'WHERE = "carried"\n')
        write(self.carry / "python" / "fogo" / f"_C{ext}", "not a module")

    def start(self, *steps, **env):
        # A session of its own: whatever the script leaves behind can be found by its group.
        return subprocess.Popen(["bash", str(SCRIPT), *steps], env={**self.env, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    def run(self, *steps, **env):
        proc = self.start(*steps, **env)
        output, _ = proc.communicate(timeout=90)
        return proc.returncode, output

    def report(self):
        """The report's files, after checking that they are all that came under $OUT (at most 8,
        each well under the device tool's 16 MiB)."""
        files = [p for p in self.out.rglob("*") if p.is_file()]
        assert len(files) <= 8, files
        (folder,) = self.out.iterdir()
        assert folder.name.endswith("-h100-abc1234") or folder.name.endswith("-gpu-abc1234")
        assert {p.name for p in files} == REPORT_FILES
        assert all(p.parent == folder and p.stat().st_size < 15 * 2**20 for p in files)
        return {p.name: (p.read_text() if p.suffix != ".tgz" else p) for p in files}

    def step_line(self, report, step):
        line = [l for l in report["summary.txt"].splitlines() if l.strip().startswith(step + " ")]
        assert len(line) == 1, report["summary.txt"]
        return line[0].split(None, 1)[1]

    def leftovers(self):
        """Stand-in processes still alive (a hang the script should have stopped)."""
        alive = []
        for pid in self.pids.read_text().split():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        return alive


@pytest.fixture
def box(tmp_path):
    b = Sandbox(tmp_path)
    yield b
    for pid in b.leftovers():  # never leave a stand-in behind, whatever the test's outcome
        os.kill(int(pid), signal.SIGKILL)


def test_a_passing_run_builds_the_module_for_another_cpython_and_reports_in_8_files(box):
    box.module(".cpython-399-x86_64-linux-gnu.so")  # what `pack` shipped: not this interpreter's
    rc, output = box.run(REHEARSE_EXPECT_FOGO="built here", REHEARSE_SANITIZER_RACECHECK="aten")
    assert rc == 0, output
    report = box.report()
    for step in ("check", "test", "sanitize", "bench", "train", "claim"):
        assert box.step_line(report, step).startswith("ok ("), report["summary.txt"]
    assert "no step failed" in report["summary.txt"]
    tag = "-".join(EXT.lstrip(".").split("-")[:2])
    assert (f"python: ABI mismatch: the carried fogo._C is for cpython-399, {box.env['FOGO_PYTHON']} "
            f"is {tag}; building it here") in report["summary.txt"]
    assert f"python: fogo._C and fogo._testing built here for {tag}" in report["summary.txt"]
    # 15 gtest tests (3 over fogo_tests' 4 shards, 3 in each of 4 others) + the 3 Python tests
    # of test_cuda_fake.py (test_api.py, a CPU test, not run there).
    assert "**18 passed, 0 failed, 0 skipped, 0 listed but never run.**" in report["tests.md"]
    assert "| python_tests | 0 |" in report["tests.md"]
    assert "ABI MISMATCH: carried _C.cpython-399" in report["environment.txt"]
    # The sanitizer: ATen's hazard named apart, not a failure; racecheck on fogo's kernels only.
    assert "Reports in fogo's kernels: 0." in report["sanitizer.md"]
    assert "- ATen (PyTorch): **Error: Race reported between Write access**" in report["sanitizer.md"]
    logs = box.tmp / "work" / "logs"
    race = (logs / "sanitize-racecheck-fogo-kernels-0.log").read_text()
    assert "--kernel-name kns=momenta_kernel" in race and "kns=muon_update_kernel" in race
    assert "--kernel-name" not in (logs / "sanitize-memcheck-uncached-0.log").read_text()
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in race
    # The bench: only the targets' rows, one repetition; bench.json as fogo_bench wrote it.
    args = (box.tmp / "bench-args").read_text()
    assert "--benchmark_repetitions=1" in args and "Stage_FOGO/0/1/0/1" in args
    assert '"BM_Step_FOGO/0/1/0/real_time"' in report["bench.json"]
    assert "| gpt2-fogo | steady state (steps 6-20)" in report["train.md"]
    assert "resnet18 width 64 fogo: 128 images/s" in report["train.md"]
    # Printed last: the summary survives in the output's tail.
    assert output.rstrip().endswith("no step failed")


def test_a_module_that_carries_its_own_libstdcxx_is_not_tested(box):
    """A module built there with a second libstdc++ (the 2026-11-27 crash) is refused, named."""
    box.module(".cpython-399-x86_64-linux-gnu.so")
    rc, output = box.run("check", "test", REHEARSE_MODULE_LIBSTDCXX="static")
    assert rc == 0, output  # a module that cannot be used is "not run", as a failed build is
    tests = box.report()["tests.md"]
    assert ("**Python tests: not run: ABI mismatch: the carried fogo._C is for cpython-399") in tests
    assert "building it here failed (exit 4): _C." in tests, tests
    assert "carries its own libstdc++ (not the libstdc++.so.6 libtorch loads)" in tests, tests


def test_crash_hang_failed_build_fogo_hazard_and_skips_are_reported_not_fatal(box):
    box.module(".cpython-399-x86_64-linux-gnu.so")
    rc, output = box.run(
        REHEARSE_CMAKE="fail", REHEARSE_FOGO_TESTS_1="crash", REHEARSE_FOGO_TESTS_2="hang",
        REHEARSE_GPT2_TESTS="big", REHEARSE_SANITIZER_MEMCHECK="hang",
        REHEARSE_SANITIZER_RACECHECK="ours", FOGO_GPU_BUDGET_TEST="5",
        FOGO_GPU_BUDGET_SANITIZE="4", FOGO_GPU_MIN_TRAIN="1000")
    assert rc == 1, output
    report = box.report()
    tests = report["tests.md"]
    assert "no XML: segmentation fault while running Fake.CudaRuns" in tests
    assert "no XML: killed at its time budget while running Fake.Third" in tests
    assert ("**Python tests: not run: ABI mismatch: the carried fogo._C is for cpython-399") in tests
    assert "building it here failed (exit 1): CMake Error: Could NOT find Python3" in tests
    assert box.step_line(report, "test").startswith("FAILED (")
    sanitize = box.step_line(report, "sanitize")
    assert sanitize.startswith("FAILED (") and "1 report(s) in fogo's kernels" in sanitize
    assert "sanitize-memcheck-uncached-0: did not finish (killed at its time budget)" in report["sanitizer.md"]
    assert "momenta_kernel" in report["sanitizer.md"]
    assert box.step_line(report, "bench").startswith("ok (")
    assert box.step_line(report, "train").startswith("skipped: it needs at least 1000 s and ")
    assert "FAILED steps: test sanitize" in report["summary.txt"]
    # The 8 MiB log went into logs.tgz cut to its first and last MiB.
    listing = subprocess.run(["tar", "-tvzf", str(report["logs.tgz"])], capture_output=True,
                             text=True, check=True).stdout
    big = [l for l in listing.splitlines() if l.endswith("logs/gpt2_tests.log")]
    assert big and int(big[0].split()[2]) < 2.1 * 2**20, listing
    assert not box.leftovers()


def test_term_in_the_middle_of_a_step_stops_it_and_still_reports(box):
    box.module(EXT)
    proc = box.start("check", "test", "sanitize", REHEARSE_FOGO_TESTS="hang")
    seen, t0 = "", time.time()
    while "=== gpu_check: test" not in seen and time.time() - t0 < 30:
        seen += proc.stdout.readline()
    time.sleep(1.0)  # the shards are hanging now
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert time.time() - t0 < 25, "the trap should end the run at once"
    assert proc.returncode == 143, seen + output
    report = box.report()
    assert "interrupted by SIGTERM during test" in report["summary.txt"]
    assert box.step_line(report, "test").startswith("interrupted by SIGTERM after")
    assert box.step_line(report, "sanitize") == "not run: the script ended before it"
    assert box.step_line(report, "check").startswith("ok (")
    assert not box.leftovers()


def test_sigkill_leaves_the_report_of_the_steps_before_and_names_the_one_it_killed(box):
    # No trap runs on SIGKILL (what the device tool does after TERM): the report written after
    # every step, and the summary written when a step starts, are what comes back.
    box.module(EXT)
    proc = box.start("check", "bench", REHEARSE_FOGO_BENCH="hang")
    seen, t0 = "", time.time()
    while "=== gpu_check: bench" not in seen and time.time() - t0 < 30:
        seen += proc.stdout.readline()
    time.sleep(0.5)
    proc.kill()
    proc.wait(timeout=10)
    try:  # what the killed script left running (its watchdog, the hanging benchmark's timeout)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.stdout.close()
    report = box.report()
    assert box.step_line(report, "check").startswith("ok (")
    assert box.step_line(report, "bench").startswith("did not finish: the script was killed during it")
    assert "fogo_tests holds" not in report["summary.txt"] and "FAILED" not in report["summary.txt"]


def test_a_failed_check_writes_the_report_saying_why_and_skips_the_gpu_steps(box):
    box.module(EXT)
    rc, output = box.run(REHEARSE_NO_GPU="1")
    assert rc == 1, output
    report = box.report()
    assert box.step_line(report, "check").startswith("FAILED (") and "no GPU (nvidia-smi failed)" in report["summary.txt"]
    for step in ("test", "sanitize", "bench", "train"):
        assert box.step_line(report, step) == "skipped: check failed: no GPU (nvidia-smi failed)"
    assert "No test runs recorded" in report["tests.md"]
    assert '"benchmarks": []' in report["bench.json"]


def test_missing_binaries_are_an_environment_problem_reported_not_a_death(box):
    (box.carry / "bin" / "SOURCE_ROOT").unlink()
    rc, output = box.run("test")
    assert rc == 1, output
    report = box.report()
    assert box.step_line(report, "test").startswith("skipped: environment: no binaries in ")
    assert "run 'scripts/gpu_check.sh pack' here first" in report["summary.txt"]


def test_a_matching_module_is_used_as_carried_and_the_deadline_cuts_budgets(box):
    box.module(EXT)
    rc, output = box.run("check", "test", REHEARSE_EXPECT_FOGO="carried", FOGO_GPU_DEADLINE_S="40")
    assert rc == 0, output
    budget = int(output.split("=== gpu_check: test (budget ", 1)[1].split(" ", 1)[0])
    assert budget <= 35  # 40 s deadline - 5 s reserve - what check took, not the 200 s budget
    report = box.report()
    assert "python: the carried fogo._C matches" in report["summary.txt"]
    assert "| python_tests | 0 |" in report["tests.md"]


def test_the_python_tests_there_are_the_cuda_ones_and_a_budget_kill_is_not_a_failure(box):
    """Issue 44: only test_cuda*.py runs there (a CPU test beside it would fail if it ran); pytest
    killed at the step's end reports the test it was running as "not run: out of budget", and the
    step stays ok; a test that failed before the kill still fails it."""
    box.module(EXT)
    rc, output = box.run("check", "test", REHEARSE_EXPECT_FOGO="carried", REHEARSE_PY_HANG="1",
                         FOGO_GPU_BUDGET_TEST="12")
    assert rc == 0, output
    report = box.report()
    log = (box.tmp / "work" / "logs" / "python_tests.log").read_text()
    assert "test_cuda_fake.py::test_another PASSED" in log and "test_api.py" not in log
    line = box.step_line(report, "test")
    assert line.startswith("ok (") and "Python tests: out of budget after" in line, line
    tests = report["tests.md"]
    assert "not run: out of budget while running " in tests and "test_cuda_fake.py::test_last" in tests
    assert "**17 passed, 0 failed, 0 skipped" in tests, tests
    assert not box.leftovers()
    rc, output = box.run("check", "test", REHEARSE_EXPECT_FOGO="carried", REHEARSE_PY_HANG="1",
                         REHEARSE_PY_FAIL="1", FOGO_GPU_BUDGET_TEST="12")
    assert rc == 1, output
    report = box.report()
    assert box.step_line(report, "test").startswith("FAILED (")
    assert "test_cuda_fake.py::test_another" in report["tests.md"].split("## Failed (1)")[1]
    assert not box.leftovers()


def gtest_filter_matches(pattern, name):
    """Whether gtest's --gtest_filter PATTERN (positives ':'-separated, then '-' and negatives)
    selects the test NAME (Suite.Name)."""
    import fnmatch
    positive, _, negative = pattern.partition("-")
    selected = any(fnmatch.fnmatchcase(name, p) for p in (positive or "*").split(":") if p)
    return selected and not any(fnmatch.fnmatchcase(name, n) for n in negative.split(":") if n)


def graph_tests():
    """{Suite.Name: captures a CUDA graph} for every TEST in tests/*.cpp: a body that sets
    cuda_graph to anything but false, or passes /*cuda_graph=*/true to a helper."""
    import re
    found = {}
    for source in sorted((ROOT / "tests").glob("*.cpp")):
        text = source.read_text()
        for head in re.finditer(r"^TEST\((\w+), (\w+)\) \{$", text, re.M):
            depth, end = 1, head.end()  # to the brace that closes the test's body
            while depth:
                end += 1
                depth += {"{": 1, "}": -1}.get(text[end - 1], 0)
            body = text[head.end():end]
            found[f"{head[1]}.{head[2]}"] = bool(
                re.search(r"cuda_graph\((?!false\))|/\*cuda_graph=\*/true", body))
    return found


def test_graph_tests_run_in_the_cached_memcheck_pass_never_the_uncached_one(box):
    """A capture cannot allocate without PyTorch's caching allocator, so a graph test in the
    uncached memcheck pass checks nothing of its graph (issue 44: the graph arm of
    MuonStacksAndBlocksOnCudaMatchCpu did): the filters gpu_check.sh passes, read from the
    stand-in sanitizer's logs, against the tests' sources."""
    box.module(EXT)
    rc, output = box.run("check", "sanitize")
    assert rc == 0, output
    logs = box.tmp / "work" / "logs"

    def filter_of(log):
        return (logs / log).read_text().split("--gtest_filter=", 1)[1].split()[0]

    uncached, cached = filter_of("sanitize-memcheck-uncached-0.log"), filter_of(
        "sanitize-memcheck-cached-0.log")
    tests = graph_tests()
    graphs = [t for t, g in tests.items() if g]
    assert "CudaGraph.MuonStacksAndBlocksReplayedMatchCpu" in graphs and len(graphs) >= 5, graphs
    assert not tests["CudaParity.MuonStacksAndBlocksOnCudaMatchCpu"]
    assert gtest_filter_matches(uncached, "CudaParity.MuonStacksAndBlocksOnCudaMatchCpu")
    in_uncached = [t for t in graphs if gtest_filter_matches(uncached, t)]
    assert not in_uncached, f"graph tests in the uncached memcheck pass: {in_uncached}"
    cuda_graphs = [t for t in graphs if t.startswith(("Cuda", "NewtonSchulzProjected.OnCuda"))]
    missed = [t for t in cuda_graphs if not gtest_filter_matches(cached, t)]
    assert not missed, f"CUDA graph tests in no memcheck pass: {missed}"


# Student's t 0.975-quantiles by degrees of freedom (printed tables): the interval's truth.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def test_claim_runs_declared_pairs_until_its_budget_and_reports_every_record(box):
    """The claim step alone (issue 44, section 4): the primary test written before the first
    run, FOGO and Muon seed by seed with the order alternating, pairs started only while a whole
    one fits (none cut half-way), every run's record (seed, lr, 10 per-class accuracies,
    seconds, commit) in claim-runs.jsonl, and the paired test in train.md against the records
    recomputed here."""
    import json
    import statistics
    box.module(EXT)
    rc, output = box.run("claim", REHEARSE_RESNET_SLEEP="1", FOGO_GPU_DEADLINE_S="19",
                         FOGO_GPU_CLAIM_PAIRS="20", FOGO_GPU_CLAIM_SEED="7")
    assert rc == 0, output
    report = box.report()
    logs = box.tmp / "work" / "logs"
    log = (logs / "claim.log").read_text()
    assert log.startswith("primary test: FOGO - Muon on rare-class accuracy"), log
    assert log.index("primary test:") < log.index("stand-in run")
    records = [json.loads(line) for line in (logs / "claim-runs.jsonl").read_text().splitlines()]
    # Budget-bound; only the last pair may be cut (a loaded machine slowing its runs past the
    # last pair's time), and it is left out of the test.
    complete = [r for r in records if r["completed"]]
    assert all(r["seed"] == records[-1]["seed"] for r in records if not r["completed"]), records
    if len(complete) % 2:
        complete = complete[:-1]
    pairs = len(complete) // 2
    assert 2 <= pairs < 20, records
    for k, r in enumerate(complete):
        assert r["seed"] == 7 + k // 2 and r["commit"] == "abc1234"
        assert len(r["acc_per_class"]) == 10 and r["lr"] == (0.001 if r["optimizer"] == "fogo" else 0.01)
        assert r["wall_seconds"] >= 1
    assert [r["optimizer"] for r in records[:4]] == ["fogo", "muon", "muon", "fogo"]
    args = (box.tmp / "claim-args").read_text().splitlines()
    assert all("--width 64 --epochs 2 --lr-schedule cosine" in a and "--device cuda" in a and
               "fashion-mnist --" in a for a in args), args  # the subset: none full carried
    assert "claim: no full Fashion-MNIST carried" in report["summary.txt"]
    # The paired test, recomputed: FOGO's rare accuracy 60 + s % 3, Muon's 58 + 7 s % 5.
    d = [(60 + s % 3) - (58 + (7 * s) % 5) for s in range(7, 7 + pairs)]
    mean, half = statistics.mean(d), T975[pairs - 1] * statistics.stdev(d) / pairs ** 0.5
    train = report["train.md"]
    assert "Primary test, declared before any run" in train
    assert (f"**{pairs} complete pair(s): FOGO - Muon rare-class accuracy {mean:.2f} points "
            f"(95% CI {mean - half:.2f} to {mean + half:.2f}") in train, train
    line = box.step_line(report, "claim")
    assert line.startswith("ok (") and f"{pairs} complete pair(s)" in line, line
    assert f"| fogo-seed7 | 7 | 0.001 | {60 + 7 % 3:.2f} |" in train


def test_claim_is_skipped_when_the_deadline_leaves_less_than_its_least(box):
    box.module(EXT)
    rc, output = box.run("check", "claim", FOGO_GPU_MIN_CLAIM="1000")
    assert rc == 0, output
    report = box.report()
    assert box.step_line(report, "claim").startswith("skipped: it needs at least 1000 s")
    assert "(no claim results)" in report["train.md"]


@pytest.mark.skipif(not (ROOT / "build" / "examples" / "resnet" / "resnet_train").exists() or
                    not pathlib.Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="needs build/examples/resnet/resnet_train and Fashion-MNIST")
def test_claim_with_the_real_trainer_at_a_tiny_width_on_the_cpu(box):
    """The claim step's commands as they run there, on the CPU at width 4 over a few images: the
    trainer takes every flag, and the records hold what its run folders say."""
    import json
    box.module(EXT)
    (box.carry / "bin" / "resnet_train").unlink()
    (box.carry / "bin" / "resnet_train").symlink_to(ROOT / "build" / "examples" / "resnet" / "resnet_train")
    full = box.carry / "data" / "fashion-mnist-full"
    full.mkdir(parents=True)
    for f in pathlib.Path("/usr/share/datasets/fashion-mnist").glob("*-ubyte.gz"):
        (full / f.name).symlink_to(f)
    rc, output = box.run("claim", FOGO_GPU_DEADLINE_S="100", FOGO_GPU_CLAIM_PAIRS="1",
                         FOGO_GPU_CLAIM_DEVICE="cpu", FOGO_GPU_CLAIM_WIDTH="4",
                         FOGO_GPU_CLAIM_EPOCHS="1", FOGO_GPU_CLAIM_ARGS=(
                             "--train-per-class 40 --test-per-class 10 --batch-size 32 --threads 1"))
    logs = box.tmp / "work" / "logs"
    assert rc == 0, output + (logs / "claim.log").read_text()[-3000:]
    records = [json.loads(line) for line in (logs / "claim-runs.jsonl").read_text().splitlines()]
    assert [r["optimizer"] for r in records] == ["fogo", "muon"], records
    for r in records:
        assert r["completed"] and r["seed"] == 100 and r["lr"] == (1e-3 if r["optimizer"] == "fogo" else 1e-2)
        assert len(r["acc_per_class"]) == 10 and all(0 <= a <= 100 for a in r["acc_per_class"])
        # 10 test images per class: the rare accuracy is the mean of classes 4-8's
        assert abs(r["rare_acc"] - sum(r["acc_per_class"][4:9]) / 5) < 1e-6
        assert "--width 4" in r["command"] and "--lr-schedule cosine" in r["command"]
    report = box.report()
    assert "1 complete pair(s)" in report["train.md"] and "fewer than 2 complete pairs" in report["train.md"]
    assert "claim: no full Fashion-MNIST" not in report["summary.txt"]
