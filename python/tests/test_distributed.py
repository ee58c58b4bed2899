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


def torchrun(case, tmp_path, nproc=2):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
         str(WORKER), case, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return result.stdout


def test_zero_resumes_and_fsdp2_equals_the_unsharded_run(tmp_path):
    # One launch for the cases (dist_worker.py: zero, fsdp_muon (owner-computes), owner_bits
    # (owner-computes bit for bit against the unsharded step; _normuon: with NorMuon),
    # fsdp_muon_gather, fsdp_fogo, fsdp_hybrid, fsdp_hybrid_muon, fsdp_muon_blocks (fused
    # weights' blocks and heads under owner-computes), fsdp_muon_dcp,
    # fsdp_normuon_dcp, fsdp_muon_nonfinite, fsdp_stack: fully_shard with a stack of experts
    # and NorMuon, test_cuda.py's fsdp_cuda on the CPU), and fsdp_dcp's, fsdp_muon_dcp's and
    # fsdp_normuon_dcp's checkpoints, loaded here on one process, unsharded: bit for bit what the
    # two ranks held (the state does not depend on the sharding).
    out = torchrun("zero,fsdp_muon,owner_bits,owner_bits_normuon,fsdp_muon_gather,fsdp_fogo,"
                   "fsdp_hybrid,fsdp_hybrid_muon,fsdp_muon_blocks,fsdp_dcp,fsdp_muon_dcp,"
                   "fsdp_normuon_dcp,fsdp_muon_nonfinite,fsdp_stack", tmp_path)
    print(out)
    load_muon_checkpoint_unsharded(tmp_path)
    load_muon_checkpoint_unsharded(tmp_path, "NORMUON_DCP_OPTIONS", "normuon")
    model, opt, expected = load_unsharded(tmp_path, fogo.FOGO, "FSDP_DCP_OPTIONS", "dcp",
                                          "expected.pt")
    assert_state_equal(opt.state_dict(), expected["optim"])
    assert opt.state_dict()["param_groups"][0]["memory"]["frozen"]  # the task boundary's bank


def load_unsharded(tmp_path, cls, options, checkpoint, expected):
    """A DCP checkpoint of dist_worker.py loaded into an unsharded model and optimizer ``cls``
    (dist_worker's ``options``); the parameters checked against rank 0's ``expected`` file,
    which is returned."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import dist_worker
    torch.manual_seed(1)  # other initial weights: the load must replace them
    model = dist_worker.Chain()
    opt = cls(model.parameters(), **getattr(dist_worker, options))
    msd, osd = get_state_dict(model, opt)
    target = {"model": msd, "optim": osd}
    dcp.load(target, checkpoint_id=str(tmp_path / checkpoint))
    set_state_dict(model, opt, model_state_dict=target["model"], optim_state_dict=target["optim"])
    expected = torch.load(tmp_path / expected, weights_only=True)
    for p, q in zip(model.parameters(), expected["params"]):
        assert torch.equal(p, q)
    return model, opt, expected


def load_muon_checkpoint_unsharded(tmp_path, options="MUON_DCP_OPTIONS", name="muon"):
    """fsdp_muon_dcp's checkpoint (sharded momenta; NorMuon's second moments with
    NORMUON_DCP_OPTIONS) into an unsharded fogo.Muon."""
    _, opt, expected = load_unsharded(tmp_path, fogo.Muon, options, f"dcp_{name}",
                                      f"expected_{name}.pt")
    state = opt.state_dict()["state"]
    assert sorted(state) == sorted(expected["state"])
    for k, st in expected["state"].items():
        assert sorted(state[k]) == sorted(st)
        for key, value in st.items():
            assert torch.equal(state[k][key], value), key
            assert value.abs().sum() > 0  # the test cannot pass on zeros


def test_muon_owner_computes_on_three_ranks(tmp_path):
    # Three ranks: each matrix has its own owner, and a 16-row matrix shards 6/6/4.
    print(torchrun("fsdp_muon,owner_bits,owner_bits_normuon,fsdp_muon_dcp,fsdp_normuon_dcp,"
                   "stack_gather", tmp_path, nproc=3))
    load_muon_checkpoint_unsharded(tmp_path)
    load_muon_checkpoint_unsharded(tmp_path, "NORMUON_DCP_OPTIONS", "normuon")


def test_qk_clip_on_row_shards(tmp_path):
    # dist_worker.py's qk_clip_rows: a fused weight row-sharded over 2 and then 3 ranks (uneven,
    # heads split between ranks) clipped rank by rank equals the unsharded clip, bit for bit.
    torchrun("qk_clip_rows", tmp_path)
    torchrun("qk_clip_rows", tmp_path, nproc=3)
