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


MAKERS = {
    "Muon": lambda m: fogo.Muon(m.parameters(), lr=0.02),
    "FOGO": lambda m: fogo.FOGO(m.parameters(), lr=0.01, codebook_size=4, proj_dim=8),
    "Hybrid": lambda m: fogo.Hybrid(m, fogo.Muon, lr=0.02),
}


def matrices():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(16, 6, bias=False))


@pytest.mark.parametrize("name", list(MAKERS))
def test_compiled_function_calling_step_gives_the_eager_steps_parameters(name):
    # torch.compile (default backend, fullgraph=False) of a function that calls opt.step():
    # Dynamo breaks the graph at the step (fogo's step is the C++ optimizer's, run eagerly:
    # docs/python.md), so the compiled function steps exactly as the eager one.
    torch._dynamo.reset()
    make = MAKERS[name]
    model = matrices() if name != "Hybrid" else torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 6))
    twin, init = copy.deepcopy(model), copy.deepcopy(model)
    eager_opt, compiled_opt = make(model), make(twin)

    def step(opt):
        opt.step()
        opt.zero_grad()

    compiled_step = torch.compile(step, fullgraph=False)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, y = torch.randn(8, 12, generator=gen), torch.randn(8, 6, generator=gen)
        for net, opt, run in ((model, eager_opt, step), (twin, compiled_opt, compiled_step)):
            torch.nn.functional.mse_loss(net(x), y).backward()
            run(opt)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    assert all(p.grad is None for p in twin.parameters())  # zero_grad ran after the step
    assert not torch.equal(model[0].weight, init[0].weight)


@pytest.mark.parametrize("name", list(MAKERS))
def test_compiled_training_step_with_forward_backward_and_step(name):
    # The whole training step compiled (forward, backward, opt.step, zero_grad; default backend
    # inductor, fullgraph=False): it runs, graph-breaks at the step, and its parameters are the
    # eager run's up to inductor's rounding of the forward and backward (fused kernels).
    torch._dynamo.reset()
    make = MAKERS[name]
    model = torch.nn.Sequential(torch.nn.Linear(12, 16, bias=name == "Hybrid"), torch.nn.Tanh(),
                                torch.nn.Linear(16, 6, bias=name == "Hybrid"))
    twin, init = copy.deepcopy(model), copy.deepcopy(model)
    eager_opt, compiled_opt = make(model), make(twin)

    def train_step(net, opt, x, y):
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    compiled = torch.compile(train_step, fullgraph=False)
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        x, y = torch.randn(8, 12, generator=gen), torch.randn(8, 6, generator=gen)
        torch.testing.assert_close(compiled(twin, compiled_opt, x, y),
                                   train_step(model, eager_opt, x, y), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    assert not torch.equal(model[0].weight, init[0].weight)
