"""fogo.Muon against PyTorch's own torch.optim.Muon: the same parameters after every step, bit
for bit on the CPU (the C++ optimizer reproduces PyTorch's op sequence)."""

import pytest
import torch

import fogo
from conftest import randn


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"lr": 0.05, "weight_decay": 0.0, "nesterov": False},
        {"lr": 0.01, "momentum": 0.9, "ns_steps": 3, "adjust_lr_fn": "match_rms_adamw"},
    ],
)
def test_muon_matches_torch(gen, options):
    shapes = [(32, 16), (16, 48), (32, 16), (7, 5)]
    init = [randn(gen, *s) for s in shapes]
    ours = [p.clone().requires_grad_(True) for p in init]
    theirs = [p.clone().requires_grad_(True) for p in init]
    a = fogo.Muon(ours, **options)
    b = torch.optim.Muon(theirs, **options)
    for step in range(6):
        for p, q, s in zip(ours, theirs, shapes):
            g = randn(gen, *s)
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
        for k, (p, q) in enumerate(zip(ours, theirs)):
            assert torch.equal(p, q), f"step {step}, parameter {k}"
    assert not torch.equal(ours[0], init[0])
    # The momentum buffers too, under torch.optim.Muon's state_dict key.
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"])


def test_muon_defaults_match_torch():
    import inspect

    theirs = inspect.signature(torch.optim.Muon.__init__).parameters
    ours = fogo._C.Muon.default_options()
    for name in ("lr", "weight_decay", "momentum", "nesterov", "eps", "ns_steps"):
        assert ours[name] == theirs[name].default, name
    assert ours["ns_coefficients"] == pytest.approx(theirs["ns_coefficients"].default)
