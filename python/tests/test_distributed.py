"""Multi-rank behaviour under torchrun (2 ranks, gloo, CPU): dist_worker.py runs each case and
asserts against a single-process truth; its exit status is the verdict."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

WORKER = ROOT / "python" / "tests" / "dist_worker.py"


def torchrun(case, tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(WORKER), case, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]


def test_zero_resumes_and_fsdp2_equals_the_unsharded_run(tmp_path):
    # One launch for the cases (dist_worker.py: zero, fsdp_muon, fsdp_fogo, fsdp_hybrid).
    torchrun("zero,fsdp_muon,fsdp_fogo,fsdp_hybrid", tmp_path)
