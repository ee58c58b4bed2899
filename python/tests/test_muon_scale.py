"""fogo.Muon's keywords from issue 36: adjust_lr_fn="spectral" (lr sqrt(rows / cols), unclamped)
against torch.optim.Muon's "original" step in float64, and NorMuon's options (their defaults and
ranges; the step itself: test_normuon.py)."""

import math

import pytest
import torch

import fogo
from conftest import randn


@pytest.mark.parametrize("shape", [(6, 24), (24, 6), (12, 12)])
def test_spectral_step_against_torch_original(gen, shape):
    # torch.optim.Muon has no spectral rule: against its "original" step (ratio max(1, A/B)), the
    # update is the same for tall and square matrices (bit for bit) and sqrt(A / B) of it for
    # wide ones (the decay unchanged).
    p0 = randn(gen, *shape).double()
    rows, cols = shape
    ours, theirs = p0.clone().requires_grad_(True), p0.clone().requires_grad_(True)
    a = fogo.Muon([ours], lr=0.02, ns_dtype=torch.bfloat16, adjust_lr_fn="spectral")
    b = torch.optim.Muon([theirs], lr=0.02, adjust_lr_fn="original")
    assert a.param_groups[0]["adjust_lr_fn"] == "spectral"
    g = randn(gen, *shape).double()
    ours.grad, theirs.grad = g.clone(), g.clone()
    a.step()
    b.step()
    if rows >= cols:
        assert torch.equal(ours, theirs)
    else:
        decayed = p0 * (1 - 0.02 * 0.1)
        want = decayed + math.sqrt(rows / cols) * (theirs.detach() - decayed)
        assert torch.allclose(ours.detach(), want, rtol=0, atol=1e-14)
        assert not torch.allclose(ours.detach(), theirs.detach(), rtol=0, atol=1e-6)


def test_normuon_options_are_checked():
    p = torch.nn.Parameter(torch.randn(4, 6))
    opt = fogo.Muon([p], lr=0.02)
    assert opt.param_groups[0]["normuon"] is False
    assert opt.param_groups[0]["normuon_beta2"] == 0.95
    assert opt.param_groups[0]["normuon_eps"] == 1e-10
    with pytest.raises(Exception, match="normuon_beta2"):
        fogo.Muon([torch.nn.Parameter(torch.randn(4, 6))], normuon_beta2=1.5)
    with pytest.raises(Exception, match="normuon_eps"):
        fogo.Muon([torch.nn.Parameter(torch.randn(4, 6))], normuon_eps=0.0)
    opt.param_groups[0]["normuon_beta2"] = -0.5  # edited by hand: refused at the step
    p.grad = torch.randn(4, 6)
    before = p.detach().clone()
    with pytest.raises(Exception, match="normuon_beta2"):
        opt.step()
    assert torch.equal(p.detach(), before)
