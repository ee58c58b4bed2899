"""scripts/gpu_report.py on fixtures shaped like what a GPU check leaves: gtest XML with failures,
skips, typed and parameterised tests, a shard that crashed before writing its XML, a binary whose
children print FAILED lines (never counted), and compute-sanitizer logs in both location formats."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("gpu_report", os.path.join(HERE, "..", "gpu_report.py"))
gpu_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_report)

XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" failures="1" disabled="0" errors="0" time="1.2" name="AllTests">
  <testsuite name="MuonParity" tests="2" failures="1" skipped="0">
    <testcase name="MatchesTorch" status="run" result="completed" classname="MuonParity">
      <failure message="tests/test_muon.cpp:61&#x0A;Expected equality of these values:&#x0A;  diff&#x0A;    1.2e-08&#x0A;  0.0" type=""><![CDATA[ignored]]></failure>
    </testcase>
    <testcase name="Batched" status="run" result="completed" classname="MuonParity"/>
  </testsuite>
  <testsuite name="CudaParity" tests="1" skipped="1">
    <testcase name="Update" status="run" result="skipped" classname="CudaParity">
      <skipped message="tests/test_cuda_parity.cpp:37&#x0A;no CUDA device visible"><![CDATA[x]]></skipped>
    </testcase>
  </testsuite>
  <testsuite name="Typed/0" tests="1">
    <testcase name="Works" type_param="float" status="run" result="completed" classname="Typed/0"/>
  </testsuite>
  <testsuite name="Inst/Param" tests="2" failures="1">
    <testcase name="Case/0" value_param="3" status="run" result="completed" classname="Inst/Param"/>
    <testcase name="Case/1" value_param="4" status="run" result="completed" classname="Inst/Param">
      <failure message="a.cpp:9&#x0A;boom" type=""/>
    </testcase>
  </testsuite>
</testsuites>
"""

LIST = """MuonParity.
  MatchesTorch
  Batched
CudaParity.
  Update
Typed/0.  # TypeParam = float
  Works
Inst/Param.
  Case/0  # GetParam() = 3
  Case/1  # GetParam() = 4
"""

CRASHED_LIST = """Dist.
  First
  Second
  Third
"""
CRASHED_LOG = """[ RUN      ] Dist.First
[       OK ] Dist.First (3 ms)
[ RUN      ] Dist.Second
rank 1: [  FAILED  ] Child.Noise (1 ms)
Segmentation fault
"""


@pytest.fixture
def logs(tmp_path):
    (tmp_path / "fogo_tests-0.xml").write_text(XML)
    (tmp_path / "fogo_tests-0.list").write_text(LIST)
    (tmp_path / "fogo_tests-0.log").write_text("[  FAILED  ] Child.Printed (1 ms)\n")
    (tmp_path / "fogo_dist_tests.list").write_text(CRASHED_LIST)
    (tmp_path / "fogo_dist_tests.log").write_text(CRASHED_LOG)
    (tmp_path / "runs.tsv").write_text("fogo_tests-0\t1\t12\nfogo_dist_tests\t139\t4\n")
    return tmp_path


def test_counts_come_from_the_xml_and_name_every_failure_and_skip(logs):
    md = gpu_report.report_tests(str(logs))
    # 3 passed in the XML + Dist.First from the crashed shard's log; failures: 2 in the XML and the
    # test the crashed binary was running; Dist.Third never ran.
    assert "**4 passed, 3 failed, 1 skipped, 1 listed but never run.**" in md
    assert "`MuonParity.MatchesTorch` (fogo_tests-0): tests/test_muon.cpp:61" in md
    assert "> Expected equality of these values:" in md
    assert "`Inst/Param.Case/1` (fogo_tests-0): a.cpp:9" in md
    assert "`CudaParity.Update` (fogo_tests-0): tests/test_cuda_parity.cpp:37 no CUDA device" in md
    assert "no XML: segmentation fault while running Dist.Second" in md
    assert "`Dist.Second` (fogo_dist_tests): crashed or killed while running (segmentation fault)" in md
    assert "- fogo_dist_tests (1 run(s)): 1 listed test(s) never ran, first Dist.Third" in md
    assert "CUDA tests skipped: 1 " in md
    # A child's FAILED line in a log is not a test of this binary.
    assert "Child.Printed" not in md and "Child.Noise" not in md


def test_shards_of_one_binary_are_counted_together(tmp_path):
    # Each shard lists every test and runs a part: nothing is missing when the parts cover it.
    (tmp_path / "b-0.xml").write_text(XML)
    (tmp_path / "b-1.xml").write_text(XML)
    for k in (0, 1):
        (tmp_path / f"b-{k}.list").write_text(LIST + "Extra.\n  OnlyShard1\n")
    (tmp_path / "b-1.xml").write_text(XML.replace(
        '<testsuite name="Typed/0"', '<testsuite name="Extra"><testcase name="OnlyShard1" '
        'status="run" result="completed" classname="Extra"/></testsuite><testsuite name="Typed/0"'))
    (tmp_path / "runs.tsv").write_text("b-0\t1\t1\nb-1\t1\t1\n")
    md = gpu_report.report_tests(str(tmp_path))
    assert "0 listed but never run" in md and "never ran," not in md
    (tmp_path / "runs.tsv").write_text("b-0\t1\t1\n")
    md = gpu_report.report_tests(str(tmp_path))
    assert "- b (1 run(s)): 1 listed test(s) never ran, first Extra.OnlyShard1" in md


def test_listed_tests_reads_typed_and_parameterised_names():
    assert gpu_report.listed_tests(LIST) == [
        "MuonParity.MatchesTorch", "MuonParity.Batched", "CudaParity.Update", "Typed/0.Works",
        "Inst/Param.Case/0", "Inst/Param.Case/1"]


RACECHECK = """========= COMPUTE-SANITIZER
[ RUN      ] CudaParity.Update
========= Error: Race reported between Write access at void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)+0x1a40 in /pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1021
=========     and Read access at void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)+0x1b20 in /pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1030 [64 hazards]
=========
========= Error: Race reported between Write access at void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)+0x1a40 in /pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1021
=========     and Read access at void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)+0x1b20 in /pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1030 [32 hazards]
=========
========= Error: Race reported between Write access at fogo::cuda::rms_update_kernel(Table)+0x200 in /work/main/src/cuda/update.cu:120
=========     and Read access at fogo::cuda::rms_update_kernel(Table)+0x260 in /work/main/src/cuda/update.cu:131 [4 hazards]
[       OK ] CudaParity.Update (40 ms)
========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)
"""
MEMCHECK_OLD = """========= CUDA-MEMCHECK
========= Invalid __global__ read of size 4
=========     at 0x00000150 in /work/main/src/cuda/codebook.cu:119:flush_kernel(float*, int)
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f0000000000 is out of bounds
========= ERROR SUMMARY: 1 error
"""


def test_sanitizer_report_deduplicates_by_kernel_and_location_and_names_ours(tmp_path):
    (tmp_path / "sanitize-racecheck.log").write_text(RACECHECK)
    (tmp_path / "sanitize-memcheck.log").write_text(MEMCHECK_OLD)
    md = gpu_report.report_sanitizer(str(tmp_path))
    assert "RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)" in md
    assert "distinct reports: 2 (1 in fogo's kernels)" in md  # racecheck: two merged into one
    assert ("- ATen (PyTorch): **Error: Race reported between Write access** ×2 (96 hazard(s)/error(s)) "
            "in `void at::native::reduce_kernel<512, 1>") in md
    assert "at `/pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1021`" in md
    assert "in `fogo::cuda::rms_update_kernel(Table)` at `/work/main/src/cuda/update.cu:120`" in md
    assert "in `flush_kernel(float*, int)` at `/work/main/src/cuda/codebook.cu:119`" in md
    assert "Reports in fogo's kernels: 2." in md
    assert "Reports in library code: 1 (ATen (PyTorch) 1)." in md
    assert "1 ok, 0 failed under the tool" in md


def test_bench_and_train_reports(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({
        "context": {"host_name": "gpu", "date": "2026-11-25"},
        "benchmarks": [
            {"name": "BM_Step_FOGO/0/1_median", "run_name": "BM_Step_FOGO/0/1",
             "run_type": "aggregate", "aggregate_name": "median", "real_time": 12.0,
             "time_unit": "ms", "GB/s": 812.5},
            {"name": "BM_Step_FOGO/0/1_mean", "run_name": "BM_Step_FOGO/0/1",
             "run_type": "aggregate", "aggregate_name": "mean", "real_time": 13.0,
             "time_unit": "ms"}]}))
    md = gpu_report.report_bench(str(tmp_path))
    assert "| BM_Step_FOGO/0/1 | 12.000 ms | GB/s 812.5 |" in md and "13.000" not in md
    (tmp_path / "gpt2-fogo.log").write_text(
        "step 40\nsteady state (steps 6-40): median step 100.00 ms, optimizer 12.00 ms (12.0% of "
        "the step), 40960 tokens/s, MFU 30.1%\n")
    (tmp_path / "gpt2-muon.log").write_text("gpt2: error: CUDA out of memory\n")
    (tmp_path / "gpt2-eager.log").write_text("gpt2_eager tokens_per_s=41000 mfu=0.31\n")
    md = gpu_report.report_train(str(tmp_path))
    assert "| gpt2-fogo | steady state (steps 6-40)" in md
    assert "| gpt2-muon | FAILED: gpt2: error: CUDA out of memory |" in md
    assert "gpt2_eager tokens_per_s=41000" in md


MEMCHECK_CUBLAS = """========= COMPUTE-SANITIZER
[ RUN      ] CudaParity.Update
========= Invalid __global__ read of size 16 bytes
=========     at sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1+0x5f0
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f00 is out of bounds
[       OK ] CudaParity.Update (40 ms)
========= ERROR SUMMARY: 1 error
"""


def test_sanitizer_shards_merge_and_unfinished_or_unstarted_runs_show(tmp_path):
    # Two shards of one tool and pass are one section; a shard killed at its budget (no summary,
    # exit 124) and one never started (exit 222, no log) are named; a cuBLAS kernel is cuBLAS's.
    (tmp_path / "sanitize-memcheck-uncached-0.log").write_text(MEMCHECK_CUBLAS)
    (tmp_path / "sanitize-memcheck-uncached-0.exit").write_text("3\n")
    (tmp_path / "sanitize-memcheck-uncached-1.log").write_text(
        "========= COMPUTE-SANITIZER\n[ RUN      ] CudaParity.Slow\n")
    (tmp_path / "sanitize-memcheck-uncached-1.exit").write_text("124\n")
    (tmp_path / "sanitize-racecheck-fogo-kernels-0.exit").write_text("222\n")
    md = gpu_report.report_sanitizer(str(tmp_path))
    assert "## memcheck-uncached (2 process(es))" in md
    assert "- sanitize-memcheck-uncached-1: did not finish (killed at its time budget)" in md
    assert "## racecheck-fogo-kernels (1 process(es))" in md
    assert "- sanitize-racecheck-fogo-kernels-0: not started (no time left)" in md
    assert "- cuBLAS/cuBLASLt: **Invalid __global__ read of size 16 bytes** ×1" in md
    assert "Reports in fogo's kernels: 0." in md
    assert "Reports in library code: 1 (cuBLAS/cuBLASLt 1)." in md
    assert "sanitize-memcheck-uncached-0: did not finish" not in md  # it printed its summary


def test_ours_is_fogo_by_name_or_by_a_project_source_never_atens():
    assert gpu_report.is_ours("fogo::cuda::(anonymous namespace)::momenta_kernel<float>(Table)",
                              "(unknown location)")
    assert gpu_report.is_ours("flush_kernel(float*, int)", "/work/wt-x/src/cuda/reduce.cuh:33")
    assert not gpu_report.is_ours("void at::native::reduce_kernel<512, 1>(...)",
                                  "/pytorch/aten/src/ATen/native/cuda/Reduce.cuh:1021")
    assert not gpu_report.is_ours("kernel", "/usr/local/cuda-13.0/include/cuda/std/x.cuh:4")


def test_runs_not_started_are_named_and_never_counted_as_failures(tmp_path):
    (tmp_path / "b.xml").write_text(XML)
    (tmp_path / "b.list").write_text(LIST)
    (tmp_path / "runs.tsv").write_text(
        "b\t1\t3\npython_tests\tnot run\t0\tnot run: ABI mismatch: the carried fogo._C is for "
        "cpython-311, python3 is cpython-312\n")
    md = gpu_report.report_tests(str(tmp_path))
    assert "**3 passed, 2 failed, 1 skipped, 0 listed but never run.**" in md
    assert ("**Python tests: not run: ABI mismatch: the carried fogo._C is for cpython-311, "
            "python3 is cpython-312** (not counted above, not a failure)") in md
    assert "| python_tests |" not in md


PYTEST_KILLED = """============================= test session starts ==============================
python/tests/test_cuda.py::test_cuda_step_matches_cpu[cls0-options0] PASSED [ 10%]
python/tests/test_cuda.py::test_cuda_step_matches_cpu[cls1-options1] SKIPPED (no CUDA) [ 20%]
python/tests/test_api.py::test_slow """


def test_pytest_run_killed_before_its_xml_keeps_its_outcomes(tmp_path):
    """Killed at the test step's end (124): what ended keeps its outcome, the test it was
    running is out of budget, never a failure (issue 44); a crash (139) is the test's failure."""
    (tmp_path / "python_tests.log").write_text(PYTEST_KILLED)
    (tmp_path / "runs.tsv").write_text("python_tests\t124\t60\n")
    md = gpu_report.report_tests(str(tmp_path))
    assert "**1 passed, 0 failed, 1 skipped, 0 listed but never run.**" in md
    assert "not run: out of budget while running python/tests/test_api.py::test_slow" in md
    assert ("**Python tests: python/tests/test_api.py::test_slow and the tests after it: not run: "
            "out of budget (pytest killed at the test step's end)** (not counted above, not a "
            "failure)") in md
    assert "with no failed test" not in md and "## Failed (0)" in md
    assert "CUDA tests skipped: 1 " in md
    (tmp_path / "runs.tsv").write_text("python_tests\t139\t60\n")
    md = gpu_report.report_tests(str(tmp_path))
    assert "**1 passed, 1 failed, 1 skipped, 0 listed but never run.**" in md
    assert "no XML: segmentation fault while running python/tests/test_api.py::test_slow" in md
    assert "out of budget" not in md


def test_all_writes_the_four_parts_and_a_failing_part_says_so(tmp_path, monkeypatch):
    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    out.mkdir()
    (logs / "runs.tsv").write_text("python_tests\tnot run\t0\tnot run: no python3 with torch\n")

    def broken(_):
        raise ValueError("bad log")

    monkeypatch.setitem(gpu_report.KINDS, "bench", broken)
    gpu_report.main(["gpu_report.py", "all", str(logs), str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["bench.md", "sanitizer.md", "tests.md",
                                                     "train.md"]
    assert "**Python tests: not run: no python3 with torch**" in (out / "tests.md").read_text()
    assert (out / "bench.md").read_text() == "(gpu_report.py bench failed: ValueError: bad log)\n"
