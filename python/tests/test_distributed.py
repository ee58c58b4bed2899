"""Multi-rank behaviour under torchrun (2 ranks, gloo, CPU): dist_worker.py runs each case and
asserts against a single-process truth; its exit status is the verdict."""

import os
import subprocess
import sys

import pytest
import torch

import fogo
from conftest import ROOT
from test_state_dict import assert_state_equal

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
    # One launch for the cases (dist_worker.py: zero, fsdp_muon, fsdp_fogo, fsdp_hybrid), and
    # fsdp_dcp's checkpoint, loaded here on one process, unsharded: bit for bit what the two
    # ranks held (the state does not depend on the sharding).
    torchrun("zero,fsdp_muon,fsdp_fogo,fsdp_hybrid,fsdp_dcp", tmp_path)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import dist_worker
    torch.manual_seed(1)  # other initial weights: the load must replace them
    model = dist_worker.Chain()
    opt = fogo.FOGO(model.parameters(), **dist_worker.FSDP_DCP_OPTIONS)
    msd, osd = get_state_dict(model, opt)
    target = {"model": msd, "optim": osd}
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp"))
    set_state_dict(model, opt, model_state_dict=target["model"], optim_state_dict=target["optim"])
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    for p, q in zip(model.parameters(), expected["params"]):
        assert torch.equal(p, q)
    assert_state_equal(opt.state_dict(), expected["optim"])
    assert opt.state_dict()["param_groups"][0]["memory"]["frozen"]  # the task boundary's bank
