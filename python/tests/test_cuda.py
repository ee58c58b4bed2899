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
    (fogo.Muon, {"lr": 0.02, "ns_dtype": torch.float32, "normuon": True}),  # second moments too
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


@pytest.mark.parametrize("cls, options, rtol, atol", [
    # FOGO: to the s_j atomics' run-to-run noise (docs/cuda.md)
    (fogo.FOGO, {"lr": 0.01, "codebook_size": 8, "proj_dim": 8, "reseed_every": 0}, 1e-4, 1e-5),
    # Muon: its graph's update rounds differently from add_'s alpha (docs/cuda.md)
    (fogo.Muon, {"lr": 0.02}, 1e-5, 1e-6),
])
def test_cuda_graph_replays_follow_the_eager_step_and_the_lr(gen, cls, options, rtol, atol):
    """cuda_graph=True: the steps are replayed from a captured graph (FOGO's telemetry counts
    them; FOGO's first step runs eagerly), the learning rate set in param_groups between steps
    reaches the replays, and the result follows the eager step."""
    shapes = [(32, 48), (48, 16)]
    init = [randn(gen, *s, scale=0.1).cuda() for s in shapes]
    grads = [[randn(gen, *s).cuda() for s in shapes] for _ in range(6)]
    ps = {g: [p.clone().requires_grad_(True) for p in init] for g in (False, True)}
    opts = {g: cls(ps[g], cuda_graph=g, **options) for g in (False, True)}
    for step, gs in enumerate(grads):
        for g in (False, True):
            opts[g].param_groups[0]["lr"] = options["lr"] * (1 + 0.1 * step)
            for p, grad in zip(ps[g], gs):
                p.grad = grad.clone()
            opts[g].step()
    if cls is fogo.FOGO:
        tel = opts[True].telemetry()[0]
        assert tel["graph_captures"] == 1 and tel["graph_replays"] == 5
        assert opts[False].telemetry()[0]["graph_replays"] == 0
    else:
        assert opts[True].graph_stats() == {"captures": 1, "replays": 6}
        assert opts[False].graph_stats() == {"captures": 0, "replays": 0}
    for p, q in zip(ps[False], ps[True]):
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol)


@pytest.mark.parametrize("lr_device", ["cpu", "cuda"])
def test_muon_tensor_lr_on_cuda_follows_torch(gen, lr_device):
    """A float32 Tensor lr (on the CPU, or on the GPU): fogo.Muon's update takes ATen's ops with
    the scalars rounded to float32 (the CUDA kernel computes in double), as torch.optim.Muon's
    Python does; one parameter per shape, so Newton-Schulz is not batched either."""
    shapes = [(32, 48), (48, 16)]
    init = [randn(gen, *s, scale=0.1).cuda() for s in shapes]
    ours = [p.clone().requires_grad_(True) for p in init]
    theirs = [p.clone().requires_grad_(True) for p in init]
    lr = torch.tensor(0.0123, device=lr_device)
    a = fogo.Muon(ours, lr=lr.clone(), weight_decay=0.13)
    b = torch.optim.Muon(theirs, lr=lr.clone(), weight_decay=0.13)
    for _ in range(5):
        for p, q, s in zip(ours, theirs, shapes):
            g = randn(gen, *s).cuda()
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_muon_owner_computes_on_cuda(tmp_path):
    # FSDP2's owner-computes (fogo::muon_step_rows) on CUDA tensors: three ranks on one GPU, gloo
    # moving CUDA tensors (NCCL refuses two ranks on one device; each rank settles on the GPU
    # before its mesh: fogo.distributed). NorMuon, and stacks, blocks and heads, against
    # unsharded fogo.Muon on the GPU (dist_worker.py: owner_bits, stack_gather with device
    # "cuda"), and fully_shard itself on CUDA with a stack of experts (fsdp_cuda).
    from test_distributed import torchrun

    print(torchrun("owner_bits_normuon_cuda,stack_gather_cuda,fsdp_cuda", tmp_path, nproc=3))
