"""A torch.compile'd model trained by fogo's optimizers stepping eagerly (docs/python.md says why
opt.step itself is not compiled): the same parameters as the eager model's run."""

import copy

import pytest
import torch

import fogo


@pytest.mark.parametrize("make", [
    lambda m: fogo.Hybrid(m, fogo.Muon, lr=0.02),
    lambda m: fogo.Hybrid(m, fogo.FOGO, lr=0.01, codebook_size=4, proj_dim=8),
])
def test_compiled_model_with_eager_step(make):
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 6))
    twin, init = copy.deepcopy(eager), copy.deepcopy(eager)
    # aot_eager: Dynamo's graph and AOTAutograd's joint graph, run with eager kernels, so the
    # two runs compute the same numbers (inductor's fused kernels may round differently) and
    # the test needs no C++ compiler.
    compiled = torch.compile(twin, backend="aot_eager", fullgraph=True)
    opts = [make(eager), make(twin)]
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        x, y = torch.randn(8, 12, generator=gen), torch.randn(8, 6, generator=gen)
        for net, opt in zip((eager, compiled), opts):
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(eager.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    assert not torch.equal(eager[0].weight, init[0].weight) and not torch.equal(eager[0].bias, init[0].bias)
