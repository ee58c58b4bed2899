"""Multi-rank checks, one per torchrun launch (test_distributed.py starts them): 2 ranks on the CPU
with gloo. Each case asserts against a single-process truth computed on every rank and raises on
a mismatch, so torchrun's exit status is the verdict.

    torchrun --standalone --nproc-per-node 2 dist_worker.py CASE[,CASE...] TMPDIR

Several cases run in one launch (one process group): starting two ranks costs more than a case.
"""

import copy
import os
import sys

import torch
import torch.distributed as dist

import fogo

torch.set_num_threads(1)
SHAPES = [(16, 24), (24, 24), (33, 16), (8, 24)]  # 33 rows: an uneven FSDP2 shard


def grads(step, shapes=SHAPES):
    gen = torch.Generator().manual_seed(100 + step)  # the same on every rank
    return [torch.randn(*s, generator=gen) for s in shapes]


def init(shapes=SHAPES):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(*s, generator=gen) * 0.1 for s in shapes]


def leaves(tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


def set_grads(params, gs):
    for p, g in zip(params, gs):
        p.grad = g.clone()


def zero(tmp):
    """ZeroRedundancyOptimizer(optimizer_class=fogo.Muon) resumes exactly: the state each rank
    owns comes back through ZeRO's load_state_dict (which writes opt.state directly)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def make(params):
        return ZeroRedundancyOptimizer(params, optimizer_class=fogo.Muon, lr=0.02)

    full = leaves(init())
    opt = make(full)
    for t in range(8):
        set_grads(full, grads(t))
        opt.step()

    first = leaves(init())
    opt1 = make(first)
    for t in range(4):
        set_grads(first, grads(t))
        opt1.step()
    opt1.consolidate_state_dict(to=0)
    path = os.path.join(tmp, "zero.pt")
    if dist.get_rank() == 0:
        torch.save(opt1.state_dict(), path)
    dist.barrier()
    sd = torch.load(path, weights_only=True)

    second = leaves([p.detach() for p in first])
    opt2 = make(second)
    opt2.load_state_dict(sd)
    restart = leaves([p.detach() for p in first])  # what a lost state would give
    opt3 = make(restart)
    for t in range(4, 8):
        for params, o in ((second, opt2), (restart, opt3)):
            set_grads(params, grads(t))
            o.step()
    for k, (p, q) in enumerate(zip(full, second)):
        assert torch.equal(p, q), f"parameter {k} differs from the uninterrupted run"
    assert not all(torch.equal(p, q) for p, q in zip(full, restart)), "the test cannot fail"


class Chain(torch.nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(i, o, bias=bias) for i, o in [(24, 33), (33, 24), (24, 16)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def fsdp(tmp, kind):
    """fully_shard parameters (DTensors, rows split over the ranks): each matrix is orthogonalized
    whole, and the trajectory equals the unsharded run's to fp32 tolerance; FOGO's memory is the
    same on every rank."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    cls = {"fsdp_muon": fogo.Muon, "fsdp_fogo": fogo.FOGO, "fsdp_hybrid": fogo.FOGO}[kind]
    options = {"lr": 0.02, "ns_dtype": torch.float32}
    if cls is fogo.FOGO:
        options.update(codebook_size=6, proj_dim=8, reseed_every=3)
    if kind == "fsdp_hybrid":  # biases to AdamW, sharded too
        make = lambda model: fogo.Hybrid(model, cls, options, {"lr": 1e-2})  # noqa: E731
    else:
        make = lambda model: cls(model.parameters(), **options)  # noqa: E731
    torch.manual_seed(0)
    reference = Chain(bias=kind == "fsdp_hybrid")
    sharded = copy.deepcopy(reference)
    for layer in sharded.layers:
        fully_shard(layer)
    fully_shard(sharded)
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    ref_opt, opt = make(reference), make(sharded)

    rank, world = dist.get_rank(), dist.get_world_size()
    for t in range(6):
        if t == 3:  # parameters changed between steps by other code: the step must see it
            with torch.no_grad():
                for p, q in zip(reference.parameters(), sharded.parameters()):
                    p.mul_(0.5)
                    q.mul_(0.5)
        gen = torch.Generator().manual_seed(200 + t)
        x, y = torch.randn(8, 24, generator=gen), torch.randn(8, 16, generator=gen)
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        rows = slice(rank * 8 // world, (rank + 1) * 8 // world)  # this rank's half of the batch
        torch.nn.functional.mse_loss(sharded(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()
        for k, (p, q) in enumerate(zip(reference.parameters(), sharded.parameters())):
            torch.testing.assert_close(q.full_tensor(), p.detach(), rtol=2e-5, atol=2e-6,
                                       msg=lambda m: f"step {t}, parameter {k}: {m}")
    if cls is fogo.FOGO:
        mem = (opt.matrix if kind == "fsdp_hybrid" else opt).memory(0)["centroids"]
        everyone = [torch.empty_like(mem) for _ in range(world)]
        dist.all_gather(everyone, mem)
        assert all(torch.equal(m, mem) for m in everyone), "codebooks differ across ranks"


FSDP_DCP_OPTIONS = {"lr": 0.02, "codebook_size": 6, "proj_dim": 8, "freeze_per_task": 2}


def fsdp_batch(t):
    gen = torch.Generator().manual_seed(300 + t)
    return torch.randn(8, 24, generator=gen), torch.randn(8, 16, generator=gen)


def fsdp_dcp(tmp):
    """An FSDP2 run of fogo.FOGO (a task boundary included) saved with DCP, for
    test_distributed.py to load on one process, unsharded: the saved state is world-size
    independent. Rank 0 also writes what the load must reproduce."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Chain()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = fogo.FOGO(model.parameters(), **FSDP_DCP_OPTIONS)
    rank, world = dist.get_rank(), dist.get_world_size()
    for t in range(4):
        if t == 2:
            opt.task_boundary()
        x, y = fsdp_batch(t)
        rows = slice(rank * 8 // world, (rank + 1) * 8 // world)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(tmp, "dcp"))
    expected = {"params": [p.full_tensor() for p in model.parameters()],
                "optim": copy.deepcopy(opt.state_dict())}
    if rank == 0:
        torch.save(expected, os.path.join(tmp, "expected.pt"))


def main():
    cases, tmp = sys.argv[1].split(","), sys.argv[2]
    dist.init_process_group("gloo")
    try:
        for case in cases:
            try:
                if case == "zero":
                    zero(tmp)
                elif case == "fsdp_dcp":
                    fsdp_dcp(tmp)
                else:
                    fsdp(tmp, case)
            except Exception as e:
                raise AssertionError(f"case {case} on rank {dist.get_rank()}: {e}") from e
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
