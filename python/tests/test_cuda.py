"""CUDA: fogo.FOGO and fogo.Muon stepping CUDA tensors (the C++ CUDA kernels when compiled in)
agree with the CPU step. Skipped without a GPU."""

import pytest
import torch

import fogo
from conftest import randn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"
)


@pytest.mark.parametrize("cls, options", [
    (fogo.FOGO, {"lr": 0.01, "codebook_size": 8, "proj_dim": 8, "ns_dtype": torch.float32}),
    (fogo.Muon, {"lr": 0.02, "ns_dtype": torch.float32}),
])
def test_cuda_step_matches_cpu(gen, cls, options):
    shapes = [(32, 48), (32, 48), (48, 16)]
    init = [randn(gen, *s, scale=0.1) for s in shapes]
    grads = [[randn(gen, *s) for s in shapes] for _ in range(5)]
    cpu = [p.clone().requires_grad_(True) for p in init]
    gpu = [p.cuda().requires_grad_(True) for p in init]
    a, b = cls(cpu, **options), cls(gpu, **options)
    for gs in grads:
        for p, q, g in zip(cpu, gpu, gs):
            p.grad, q.grad = g.clone(), g.cuda()
        a.step()
        b.step()
    for p, q in zip(cpu, gpu):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-3, atol=1e-4)
    sd = b.state_dict()  # state round trip on the device
    c = cls([p.detach().clone().requires_grad_(True) for p in gpu], **options)
    c.load_state_dict(sd)
    assert all(t.is_cuda for s in c.state_dict()["state"].values() for t in s.values())


def test_cuda_kernels_compiled_in():
    assert fogo.CUDA_KERNELS, "fogo was built without its CUDA kernels on a CUDA machine"


def test_cuda_graph_replays_follow_the_eager_step_and_the_lr(gen):
    """cuda_graph=True: the steps after the first are replayed from a captured graph (telemetry
    counts them), the learning rate set in param_groups between steps reaches the replays, and
    the result follows the eager step (to the s_j atomics' run-to-run noise, docs/cuda.md)."""
    shapes = [(32, 48), (48, 16)]
    init = [randn(gen, *s, scale=0.1).cuda() for s in shapes]
    grads = [[randn(gen, *s).cuda() for s in shapes] for _ in range(6)]
    options = {"lr": 0.01, "codebook_size": 8, "proj_dim": 8, "reseed_every": 0}
    ps = {g: [p.clone().requires_grad_(True) for p in init] for g in (False, True)}
    opts = {g: fogo.FOGO(ps[g], cuda_graph=g, **options) for g in (False, True)}
    for step, gs in enumerate(grads):
        for g in (False, True):
            opts[g].param_groups[0]["lr"] = 0.01 * (1 + 0.1 * step)
            for p, grad in zip(ps[g], gs):
                p.grad = grad.clone()
            opts[g].step()
    tel = opts[True].telemetry()[0]
    assert tel["graph_captures"] == 1 and tel["graph_replays"] == 5
    assert opts[False].telemetry()[0]["graph_replays"] == 0
    for p, q in zip(ps[False], ps[True]):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_muon_cuda_graph_follows_the_eager_step_and_the_lr(gen):
    """fogo.Muon(cuda_graph=True): every step replayed from one captured graph, the lr read on the
    device; the update rounds differently from add_'s alpha (docs/cuda.md), hence rtol 1e-5."""
    shapes = [(32, 48), (48, 16)]
    init = [randn(gen, *s, scale=0.1).cuda() for s in shapes]
    grads = [[randn(gen, *s).cuda() for s in shapes] for _ in range(6)]
    ps = {g: [p.clone().requires_grad_(True) for p in init] for g in (False, True)}
    opts = {g: fogo.Muon(ps[g], lr=0.02, cuda_graph=g) for g in (False, True)}
    for step, gs in enumerate(grads):
        for g in (False, True):
            opts[g].param_groups[0]["lr"] = 0.02 * (1 + 0.1 * step)
            for p, grad in zip(ps[g], gs):
                p.grad = grad.clone()
            opts[g].step()
    for p, q in zip(ps[False], ps[True]):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
