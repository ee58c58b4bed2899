"""Multi-rank checks, one per torchrun launch (test_distributed.py starts them): 2 ranks on the CPU
with gloo. Each case asserts against a single-process truth computed on every rank and raises on
a mismatch, so torchrun's exit status is the verdict.

    torchrun --standalone --nproc-per-node 2 dist_worker.py CASE[,CASE...] TMPDIR

Several cases run in one launch (one process group): starting two ranks costs more than a case.
"""

import contextlib
import copy
import os
import sys

from collections import defaultdict

import torch
import torch.distributed as dist

import fogo
import fogo.distributed

torch.set_num_threads(1)
# Divisible by 2 and 3: FSDP2 averages the ranks' mean losses, the mean over the batch only when
# every rank has as many rows.
BATCH = 12
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
    """ZeroRedundancyOptimizer(optimizer_class=fogo.Muon) steps as fogo.Muon alone, bit for bit
    (Newton-Schulz runs under the wrapper: no other update takes its place, as DeepSpeed's ZeRO
    stage 0 once took plain SGD's), and resumes exactly: the state each rank owns comes back
    through ZeRO's load_state_dict (which writes opt.state directly)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def make(params):
        return ZeroRedundancyOptimizer(params, optimizer_class=fogo.Muon, lr=0.02)

    full = leaves(init())
    opt = make(full)
    alone = leaves(init())
    unwrapped = fogo.Muon(alone, lr=0.02)
    sgd = leaves(init())
    plain = torch.optim.SGD(sgd, lr=0.02)
    for t in range(8):
        for params, o in ((full, opt), (alone, unwrapped), (sgd, plain)):
            set_grads(params, grads(t))
            o.step()
    for k, (p, q) in enumerate(zip(full, alone)):
        assert torch.equal(p, q), f"parameter {k}: ZeRO's fogo.Muon differs from fogo.Muon alone"
    assert not any(torch.allclose(p, q) for p, q in zip(full, sgd)), "the test cannot fail"

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


def agree(mine, ref, exact, what):
    """Bit for bit, or (``exact`` false: Newton-Schulz batched otherwise on a GPU) to fp32
    rounding."""
    if exact:
        assert torch.equal(mine, ref), what
    else:
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6, msg=str(what))


def step_both(ref, ref_opt, sharded, opt, gs, mesh, t, close=()):
    """One step of an unsharded optimizer and of its row-sharded twin on the same gradients;
    the parameters compared bit for bit (those listed in ``close``: see agree)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    set_grads(ref, gs)
    for q, g in zip(sharded, gs):
        q.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
    ref_opt.step()
    opt.step()
    for k, (p, q) in enumerate(zip(ref, sharded)):
        agree(q.full_tensor(), p.detach(), k not in close, f"step {t}, parameter {k}")


def owner_bits(tmp, normuon=False, device="cpu"):
    """Owner-computes (fogo::muon_step_rows) is fogo.Muon's step on the whole matrices, bit for
    bit: row-sharded DTensor parameters given the gradients of an unsharded fogo.Muon (the same
    tensors, sharded), two groups of different options (Nesterov on and off, both adjust_lr_fn
    rules, ns_dtype fp32 and bf16, a Tensor lr), uneven and empty shards and an N-D weight;
    parameters and momenta compared after every step, a masked NaN step included. ``normuon``:
    NorMuon on in both groups (their own beta2), its second moments (sharded as the momenta)
    compared too. ``device`` "cuda": every rank on the one GPU, gloo moving CUDA tensors (the
    shapes are distinct, so the unsharded step runs one Newton-Schulz per matrix there too: bit
    for bit)."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    world = dist.get_world_size()
    mesh = fogo.distributed.device_mesh(device, (world,))  # every rank on a GPU it sees
    shapes = [(16, 24), (33, 16), (8, 3, 2, 2), (1, 7)]  # 33 rows: uneven; 1 row: empty shards
    options = [{"lr": 0.02, "weight_decay": 0.1, "ns_dtype": torch.float32},
               {"lr": torch.tensor(0.03), "momentum": 0.9, "nesterov": False,
                "weight_decay": 0.05, "ns_dtype": torch.bfloat16,
                "adjust_lr_fn": "match_rms_adamw"}]
    if normuon:
        options[0].update(normuon=True, normuon_beta2=0.9)
        options[1].update(normuon=True)
    full = [t.to(device) for t in init(shapes)]
    ref = leaves(full)
    sharded = [distribute_tensor(t.clone(), mesh, [Shard(0)]).requires_grad_(True) for t in full]

    def make(params):
        return fogo.Muon([{"params": params[:2], **options[0]},
                          {"params": params[2:], **copy.deepcopy(options[1])}], nonfinite="mask")

    ref_opt, opt = make(ref), make(sharded)
    assert len(opt._locals) == len(shapes), "owner-computes is not in use"
    for t in range(5):
        gs = [g.to(device) for g in grads(t, shapes)]
        if t == 3:  # a masked step: every bit kept, on both
            gs[2][1, 0] = float("nan")
        before = [p.detach().clone() for p in ref]
        step_both(ref, ref_opt, sharded, opt, gs, mesh, t)
        for k, (p, q) in enumerate(zip(ref, sharded)):
            buf = opt.state[q]["momentum_buffer"].full_tensor()
            assert torch.equal(buf, ref_opt.state[p]["momentum_buffer"]), f"step {t}, buffer {k}"
            if normuon:
                v = opt.state[q]["second_moment"]
                assert isinstance(v, DTensor) and v.placements == q.placements
                assert torch.equal(v.full_tensor(), ref_opt.state[p]["second_moment"]), \
                    f"step {t}, second moment {k}"
                assert t == 0 or v.full_tensor().any(), "the test cannot fail"
        if normuon and t == 0:  # NorMuon changed the step (the comparison has teeth)
            plain = make(leaves(full))
            set_grads(plain.param_groups[0]["params"] + plain.param_groups[1]["params"], gs)
            for group in plain.param_groups:
                group["normuon"] = False
            plain.step()
            assert not torch.equal(plain.param_groups[0]["params"][0], ref[0])
        changed = [not torch.equal(b, p.detach()) for b, p in zip(before, ref)]
        assert changed == [t != 3] * len(ref), f"step {t}: parameters changed {changed}"


def stack_gather(tmp, device="cpu"):
    """Stacks of experts [E, out, in] (batch_dims 1, in 2 heads; batch_dims 2) and fused weights
    in blocks and heads, row-sharded DTensors (experts and blocks split over the ranks, blocks
    across the ranks' boundaries): owner-computes steps the stack's experts where they are and each fused weight's
    blocks on its owner, bit for bit as unsharded fogo.Muon (NorMuon on; parameters, momenta,
    second moments; a state_dict round trip midway and a masked NaN step); the all-gather scheme
    too. ``device`` "cuda": every rank on the one GPU, gloo moving CUDA tensors; there the
    unsharded step batches a stack's same-shape experts in one Newton-Schulz chain, which
    owner-computes runs one by one, so the stacks agree to fp32 rounding (agree), the rest bit
    for bit."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = fogo.distributed.device_mesh(device, (dist.get_world_size(),))
    # 7 experts on 3 ranks: 3/3/1; batch_dims 2; 12 rows on 3 ranks: 4/4/4 across the blocks
    # 6/3/3 (rank 1 holds rows of two blocks, rank 2 of two; 2 columns: each block's own
    # adjusted lr, 0.2 sqrt(6) or 0.2 sqrt(3), set by where its rows start); 10 rows in 2 heads:
    # 4/4/2, an N-D fused weight whose heads meet on rank 1.
    shapes = [(7, 8, 5), (2, 3, 6, 4), (12, 2), (10, 3, 2)]
    full = [t.to(device) for t in init(shapes)]

    def make(params, **scheme):
        return fogo.Muon([{"params": params[:1], "batch_dims": 1, "heads": 2},
                          {"params": params[1:2], "batch_dims": 2},
                          {"params": params[2:3], "blocks": [6, 3, 3],
                           "adjust_lr_fn": "match_rms_adamw"},
                          {"params": params[3:], "heads": 2}],
                         lr=0.02, normuon=True, ns_dtype=torch.float32, strict_2d=False,
                         nonfinite="mask", **scheme)

    def sharded_of(ts):
        return [distribute_tensor(t.clone(), mesh, [Shard(0)]).requires_grad_(True) for t in ts]

    try:  # the layout is checked against the whole parameter, not this rank's rows
        fogo.Muon([{"params": sharded_of(full[2:3]), "blocks": [6, 3, 2]}], lr=0.02)
        raise AssertionError("blocks summing to 11 of 12 rows were taken")
    except ValueError as e:
        assert "'blocks' [6, 3, 2] sums to 11 rows" in str(e) and "[12, 2]" in str(e), str(e)
    for scheme in ("owner", "gather"):
        ref, sharded = leaves(full), sharded_of(full)
        ref_opt, opt = make(ref), make(sharded, dtensor=scheme)
        assert len(opt._locals) == (4 if scheme == "owner" else 0), "not the scheme asked for"
        close = (0, 1) if device != "cpu" and scheme == "owner" else ()
        for t in range(5):
            if t == 2:  # a state_dict round trip into a fresh optimizer continues bit for bit
                sd = opt.state_dict()
                opt = make(sharded, dtensor=scheme)
                opt.load_state_dict(sd)
            gs = [g.to(device) for g in grads(t, shapes)]
            if t == 3:  # a masked step: every bit kept, on both
                gs[2][7, 1] = float("nan")
            before = [p.detach().clone() for p in ref]
            step_both(ref, ref_opt, sharded, opt, gs, mesh, t, close)
            changed = [not torch.equal(b, p.detach()) for b, p in zip(before, ref)]
            assert changed == [t != 3] * len(ref), f"step {t}: parameters changed {changed}"
            for k, (p, q) in enumerate(zip(ref, sharded)):
                for key in ("momentum_buffer", "second_moment"):
                    mine = opt.state[q][key]
                    assert mine.shape == ref_opt.state[p][key].shape, (t, k, key)
                    assert not (scheme == "owner") or isinstance(mine, DTensor), (t, k, key)
                    whole = mine.full_tensor() if isinstance(mine, DTensor) else mine
                    agree(whole, ref_opt.state[p][key], k not in close, (scheme, t, k, key))
    # The blocks' own shapes set their steps (the comparison has teeth): the same weights
    # stepped as one matrix differ.
    one = leaves(full[2:3])
    plain = fogo.Muon(one, lr=0.02, normuon=True, ns_dtype=torch.float32, nonfinite="mask",
                      adjust_lr_fn="match_rms_adamw")
    set_grads(one, [grads(0, shapes)[2].to(device)])
    plain.step()
    blocked = leaves(full[2:3])
    opt = fogo.Muon(blocked, lr=0.02, normuon=True, ns_dtype=torch.float32, nonfinite="mask",
                    adjust_lr_fn="match_rms_adamw", blocks=[6, 3, 3])
    set_grads(blocked, [grads(0, shapes)[2].to(device)])
    opt.step()
    assert not torch.equal(one[0], blocked[0]), "the test cannot fail"


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

    cls = {"fsdp_muon": fogo.Muon, "fsdp_muon_gather": fogo.Muon, "fsdp_fogo": fogo.FOGO,
           "fsdp_hybrid": fogo.FOGO, "fsdp_hybrid_muon": fogo.Muon,
           "fsdp_muon_blocks": fogo.Muon}[kind]
    options = {"lr": 0.02, "ns_dtype": torch.float32}
    if kind == "fsdp_muon":  # owner-computes (the default); weight decay and Nesterov on
        options.update(weight_decay=0.1)
    if kind == "fsdp_muon_gather":
        options.update(dtensor="gather")
    if cls is fogo.FOGO:
        options.update(codebook_size=6, proj_dim=8, reseed_every=3)
    if kind.startswith("fsdp_hybrid"):  # biases to AdamW, sharded too
        make = lambda model: fogo.Hybrid(model, cls, options, {"lr": 1e-2})  # noqa: E731
    elif kind == "fsdp_muon_blocks":
        # Fused weights under owner-computes: [33, 24] in blocks 20/13 (2 ranks: rows 17/16, so
        # rank 1 holds rows of both; "spectral" scales each block by sqrt(rows / 24), its own)
        # and [24, 33] in 4 heads; NorMuon on.
        options.update(adjust_lr_fn="spectral", normuon=True)

        def make(model):
            ps = list(model.parameters())
            return cls([{"params": ps[:1], "blocks": [20, 13]}, {"params": ps[1:2], "heads": 4},
                        {"params": ps[2:]}], **options)
    else:
        make = lambda model: cls(model.parameters(), **options)  # noqa: E731
    torch.manual_seed(0)
    reference = Chain(bias=kind.startswith("fsdp_hybrid"))
    sharded = copy.deepcopy(reference)
    for layer in sharded.layers:
        fully_shard(layer)
    fully_shard(sharded)
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    ref_opt, opt = make(reference), make(sharded)
    if cls is fogo.Muon:
        # Owner-computes keeps each momentum sharded as its parameter (a DTensor); the
        # all-gather scheme full-size and replicated.
        muon = opt.matrix if kind == "fsdp_hybrid_muon" else opt
        for p in (p for g in muon.param_groups for p in g["params"]):
            buf = muon.state[p]["momentum_buffer"]
            if kind != "fsdp_muon_gather":
                assert isinstance(buf, DTensor) and buf.placements == p.placements, type(buf)
                assert buf.to_local().shape == p.to_local().shape
            else:
                assert not isinstance(buf, DTensor) and buf.shape == p.shape

    rank, world = dist.get_rank(), dist.get_world_size()
    counter = CommCounter() if kind == "fsdp_muon" else contextlib.nullcontext()
    for t in range(6):
        if t == 3:  # parameters changed between steps by other code: the step must see it
            with torch.no_grad():
                for p, q in zip(reference.parameters(), sharded.parameters()):
                    p.mul_(0.5)
                    q.mul_(0.5)
        gen = torch.Generator().manual_seed(200 + t)
        x, y = torch.randn(BATCH, 24, generator=gen), torch.randn(BATCH, 16, generator=gen)
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)  # this rank's share
        torch.nn.functional.mse_loss(sharded(x[rows]), y[rows]).backward()
        with counter:
            opt.step()
        opt.zero_grad()
        for k, (p, q) in enumerate(zip(reference.parameters(), sharded.parameters())):
            torch.testing.assert_close(q.full_tensor(), p.detach(), rtol=2e-5, atol=2e-6,
                                       msg=lambda m: f"step {t}, parameter {k}: {m}")
    if kind == "fsdp_muon":
        check_owner_traffic(counter, sharded, steps=6)
    if cls is fogo.FOGO:
        mem = (opt.matrix if kind == "fsdp_hybrid" else opt).memory(0)["centroids"]
        everyone = [torch.empty_like(mem) for _ in range(world)]
        dist.all_gather(everyone, mem)
        assert all(torch.equal(m, mem) for m in everyone), "codebooks differ across ranks"


class Experts(torch.nn.Module):
    """A layer, a stack of 3 experts [3, 24, 24] (batch_dims 1; fully_shard splits its experts
    over the ranks) averaged, and a head."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(24, 24, bias=False)
        self.experts = torch.nn.Parameter(torch.randn(3, 24, 24) * 0.2)
        self.out = torch.nn.Linear(24, 16, bias=False)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(sum(torch.tanh(h @ e.T) for e in self.experts) / len(self.experts))


def fsdp_stack(tmp, device="cpu"):
    """fully_shard with a stack of experts (issue 44; ``device`` "cuda": every rank on the one
    GPU through fogo.distributed's mesh, gloo moving CUDA tensors): owner-computes with NorMuon, weight decay and a stack of experts
    follows unsharded fogo.Muon on the GPU to fp32 rounding (the unsharded step batches the
    stack's experts in one Newton-Schulz chain, owner-computes runs each where it lies), the
    second moments sharded as their parameters."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = fogo.distributed.device_mesh(device, (dist.get_world_size(),))
    torch.manual_seed(0)
    reference = Experts().to(device)
    start = [p.detach().clone() for p in reference.parameters()]
    sharded = copy.deepcopy(reference)
    fully_shard(sharded, mesh=mesh)
    assert all(isinstance(p, DTensor) and p.device.type == device for p in sharded.parameters())

    def make(model):
        return fogo.Muon([{"params": [model.inp.weight, model.out.weight]},
                          {"params": [model.experts], "batch_dims": 1}],
                         lr=0.02, weight_decay=0.1, normuon=True, ns_dtype=torch.float32)

    ref_opt, opt = make(reference), make(sharded)
    assert len(opt._locals) == 3, "owner-computes is not in use"
    rank, world = dist.get_rank(), dist.get_world_size()
    for t in range(5):
        gen = torch.Generator().manual_seed(400 + t)
        x = torch.randn(BATCH, 24, generator=gen).to(device)
        y = torch.randn(BATCH, 16, generator=gen).to(device)
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)  # this rank's share
        torch.nn.functional.mse_loss(sharded(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()
        for k, (p, q) in enumerate(zip(reference.parameters(), sharded.parameters())):
            torch.testing.assert_close(q.full_tensor(), p.detach(), rtol=2e-5, atol=2e-6,
                                       msg=lambda m: f"step {t}, parameter {k}: {m}")
            v = opt.state[q]["second_moment"]
            assert isinstance(v, DTensor) and v.placements == q.placements, type(v)
            torch.testing.assert_close(v.full_tensor(), ref_opt.state[p]["second_moment"],
                                       rtol=2e-5, atol=1e-8,
                                       msg=lambda m: f"step {t}, second moment {k}: {m}")
    assert all(not torch.equal(a, p.detach()) for a, p in zip(start, reference.parameters())), \
        "the test cannot fail"


class CommCounter:
    """Counts the bytes this rank sends and receives in the collectives an optimizer step calls
    (torch.distributed.gather / scatter / all_reduce, wrapped while inside ``with``)."""

    def __init__(self):
        self.sent = self.received = 0
        self.calls = defaultdict(int)

    def __enter__(self):
        self.saved = {name: getattr(dist, name) for name in ("gather", "scatter", "all_reduce")}
        me = dist.get_rank()

        def gather(tensor, gather_list=None, dst=0, group=None, **kw):
            self.calls["gather"] += 1
            if me == dst:
                self.received += sum(t.nbytes for t in gather_list) - tensor.nbytes
            else:
                self.sent += tensor.nbytes
            return self.saved["gather"](tensor, gather_list, dst=dst, group=group, **kw)

        def scatter(tensor, scatter_list=None, src=0, group=None, **kw):
            self.calls["scatter"] += 1
            if me == src:
                self.sent += sum(t.nbytes for t in scatter_list) - tensor.nbytes
            else:
                self.received += tensor.nbytes
            return self.saved["scatter"](tensor, scatter_list, src=src, group=group, **kw)

        def all_reduce(tensor, *args, **kw):
            self.calls["all_reduce"] += 1
            self.sent += tensor.nbytes  # a payload's size: what a ring moves each way, ~2x
            self.received += tensor.nbytes
            return self.saved["all_reduce"](tensor, *args, **kw)

        dist.gather, dist.scatter, dist.all_reduce = gather, scatter, all_reduce
        return self

    def __exit__(self, *exc):
        for name, f in self.saved.items():
            setattr(dist, name, f)


def check_owner_traffic(counter, model, steps):
    """Owner-computes' traffic, measured, against its count: per matrix and step, each rank not
    owning it sends its (padded) shard and receives its orthogonalized shard, the owner the
    reverse; plus one all-reduce of an 8-byte squared gradient norm per matrix (the NaN/Inf
    check). Rank 0 prints it."""
    world = dist.get_world_size()
    shard_bytes = [-(-p.shape[0] // world) * (p.numel() // p.shape[0]) * 4
                   for p in model.parameters()]
    every = torch.tensor([counter.sent, counter.received], dtype=torch.int64)
    totals = [torch.empty_like(every) for _ in range(world)]
    dist.all_gather(totals, every)
    sent = sum(int(t[0]) for t in totals)
    flags = 8 * len(shard_bytes) * steps * world
    expected = steps * sum(2 * (world - 1) * b for b in shard_bytes) + flags
    assert sent == expected, (sent, expected)
    assert counter.calls["gather"] == counter.calls["scatter"] == steps * len(shard_bytes)
    assert counter.calls["all_reduce"] == steps, counter.calls
    if dist.get_rank() == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"owner-computes traffic: world {world}, {n} matrix elements (fp32), per step "
              f"all ranks sent {sent // steps} bytes (per rank "
              f"{[int(t[0]) // steps for t in totals]} sent, "
              f"{[int(t[1]) // steps for t in totals]} received)", flush=True)


FSDP_DCP_OPTIONS = {"lr": 0.02, "codebook_size": 6, "proj_dim": 8, "freeze_per_task": 2}


def fsdp_batch(t):
    gen = torch.Generator().manual_seed(300 + t)
    return torch.randn(BATCH, 24, generator=gen), torch.randn(BATCH, 16, generator=gen)


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
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(tmp, "dcp"))
    expected = {"params": [p.full_tensor() for p in model.parameters()],
                "optim": copy.deepcopy(opt.state_dict())}
    if rank == 0:
        torch.save(expected, os.path.join(tmp, "expected.pt"))


MUON_DCP_OPTIONS = {"lr": 0.02, "ns_dtype": torch.float32, "weight_decay": 0.1}


def sharded_chain(bias=False):
    from torch.distributed.fsdp import fully_shard

    model = Chain(bias)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


NORMUON_DCP_OPTIONS = {**MUON_DCP_OPTIONS, "normuon": True, "normuon_beta2": 0.9}


def fsdp_muon_dcp(tmp, options=MUON_DCP_OPTIONS, name="muon"):
    """An FSDP2 run of fogo.Muon (owner-computes, sharded momenta; with NorMuon in ``options``
    sharded second moments too) saved with DCP: loaded here into a fresh sharded model and
    optimizer (the same state, and the next step equal to the uninterrupted run's), and by
    test_distributed.py on one process, unsharded. ``name``: the files' (dcp_NAME,
    expected_NAME.pt)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import DTensor

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)

    def train(model, opt, t):
        x, y = fsdp_batch(t)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()

    torch.manual_seed(0)
    model = sharded_chain()
    opt = fogo.Muon(model.parameters(), **options)
    for t in range(3):
        train(model, opt, t)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(tmp, f"dcp_{name}"))
    full = {k: {n: v.full_tensor() for n, v in st.items()}
            for k, st in opt.state_dict()["state"].items()}
    params = [p.full_tensor() for p in model.parameters()]  # collectives: on every rank
    if rank == 0:
        torch.save({"params": params, "state": full}, os.path.join(tmp, f"expected_{name}.pt"))

    torch.manual_seed(1)  # other weights: the load must replace them
    model2 = sharded_chain()
    opt2 = fogo.Muon(model2.parameters(), **options)
    msd2, osd2 = get_state_dict(model2, opt2)
    target = {"model": msd2, "optim": osd2}
    dcp.load(target, checkpoint_id=os.path.join(tmp, f"dcp_{name}"))
    set_state_dict(model2, opt2, model_state_dict=target["model"],
                   optim_state_dict=target["optim"])
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor())
        assert sorted(opt.state[p]) == sorted(opt2.state[q])
        for key, a in opt.state[p].items():
            b = opt2.state[q][key]
            assert isinstance(b, DTensor) and b.placements == q.placements, key
            assert torch.equal(a.full_tensor(), b.full_tensor()), key
    train(model, opt, 3)
    train(model2, opt2, 3)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor()), "the resumed step differs"


@contextlib.contextmanager
def no_host_reads():
    """Inside, reading a tensor's value into Python (item, tolist, bool, int, float: each a host
    synchronisation on a GPU) fails, and the C++ decision reads nothing back."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__")
    saved = {n: torch.Tensor.__dict__.get(n) for n in names}

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read back to the host inside a masked step")

    reads = fogo._C.unusable_grad_reads()
    for n in names:
        setattr(torch.Tensor, n, refuse)
    try:
        yield
    finally:
        for n, f in saved.items():
            if f is None:
                delattr(torch.Tensor, n)
            else:
                setattr(torch.Tensor, n, f)
    assert fogo._C.unusable_grad_reads() == reads, "the decision read flags back"


def fsdp_muon_nonfinite(tmp):
    """Every policy on the FSDP2 owner-computes path: fogo.Muon over a fully_shard model, and
    fogo.Hybrid over the same model with biases (an AdamW side, sharded too); a NaN in one rank's
    rows of an owner-computed matrix's gradient, and (hybrid) in one rank's AdamW gradient. The
    outcome is the C++ paths' (tests/test_nonfinite.cpp): "raise" raises on every rank naming the
    parameter; "skip" and "mask" change nothing (parameters, momenta, AdamW moments), "skip"
    counting no step, "mask" counting AdamW's and reading nothing back to the host (fogo.Muon: no
    tensor read into Python at all; the hybrid: the C++ decision reads nothing, AdamW reads its
    own CPU step count); "unchecked" lets the NaN reach the parameter."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    cases = [(False, "matrix"), (True, "matrix"), (True, "rest")]
    for (hybrid, victim), policy in ((c, p) for c in cases
                                     for p in ("raise", "skip", "mask", "unchecked")):
        where = f"{'Hybrid' if hybrid else 'Muon'}, {policy}, NaN in the {victim} gradient"
        torch.manual_seed(0)
        model = sharded_chain(bias=hybrid)
        opt = (fogo.Hybrid(model, fogo.Muon, {"lr": 0.02, "nonfinite": policy}, {"lr": 1e-2})
               if hybrid else fogo.Muon(model.parameters(), lr=0.02, nonfinite=policy))
        muon = opt.matrix if hybrid else opt
        assert muon._locals, "owner-computes is not in use"
        for t in (0, 1):  # a usable step first: momenta and moments not zero
            x, y = fsdp_batch(t)
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            if t == 0:
                opt.step()
                opt.zero_grad()
        layer = model.layers[1]
        poisoned = layer.weight if victim == "matrix" else layer.bias
        if rank == world - 1:
            poisoned.grad.to_local()[0] = float("nan")
        params = list(model.parameters())
        states = [t.to_local().clone() for p in params for t in opt.state[p].values()
                  if isinstance(t, torch.Tensor) and t.dim() > 0]
        before = [p.to_local().clone() for p in params]
        steps = [int(opt.state[p]["step"]) for p in params if "step" in opt.state[p]]
        if policy == "raise":
            try:
                opt.step()
            except RuntimeError as e:
                side = f"fogo.Hybrid ({victim} side)" if hybrid else "Muon"
                name = (f"parameter 1 of group 0 (shape [24, 33])" if victim == "matrix"
                        else "parameter 1 of group 1 (shape [24])")
                assert f"{side}: gradient of {name}" in str(e) and "on some rank" in str(e), \
                    f"{where}: {e}"
            else:
                raise AssertionError(f"{where}: a NaN gradient did not raise")
        elif policy == "mask" and not hybrid:
            with no_host_reads():
                opt.step()
        else:
            reads = fogo._C.unusable_grad_reads()
            opt.step()
            if policy in ("mask", "unchecked"):
                assert fogo._C.unusable_grad_reads() == reads, f"{where}: a flag was read back"
        if policy == "unchecked":
            assert poisoned.full_tensor().isnan().any(), f"{where}: the NaN did not propagate"
        else:
            assert all(torch.equal(p.to_local(), b) for p, b in zip(params, before)), \
                f"{where}: a parameter changed"
            now = [t.to_local() for p in params for t in opt.state[p].values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0]
            assert all(torch.equal(a, b) for a, b in zip(now, states)), f"{where}: a state changed"
            counted = [int(opt.state[p]["step"]) for p in params if "step" in opt.state[p]]
            expected = [k + 1 for k in steps] if policy == "mask" else steps
            assert counted == expected, f"{where}: AdamW's step counts {steps} -> {counted}"
        opt.zero_grad()


def qk_clip_rows(tmp):
    """fogo.qk_clip.qk_clip on a fused [q | k | v] weight row-sharded over the ranks (a DTensor,
    FSDP2's Shard(0): 3 query heads, 1 key head of 5 rows, 25 rows: uneven over 2 and 3 ranks,
    heads split between ranks) is the unsharded clip's rows, bit for bit, biases included; the
    max logits all-reduced (MAX) first, each rank having seen other data."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from fogo.qk_clip import all_reduce_max_logits, qk_clip

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(25, 6, generator=gen)
    bias = torch.randn(25, generator=gen)
    mine = torch.rand(3, generator=torch.Generator().manual_seed(dist.get_rank())) * 40
    every = torch.stack([torch.rand(3, generator=torch.Generator().manual_seed(r)) * 40
                         for r in range(dist.get_world_size())]).amax(0)
    m = all_reduce_max_logits(mine.clone())
    assert torch.equal(m, every), "the all-reduced max logits"
    want_w, want_b = weight.clone(), bias.clone()
    gamma = qk_clip(want_w, m, q_heads=3, kv_heads=1, threshold=10.0, bias=want_b)
    assert gamma.item() < 1.0, "the test cannot fail: nothing clipped"
    w = distribute_tensor(weight.clone(), mesh, [Shard(0)])
    b = distribute_tensor(bias.clone(), mesh, [Shard(0)])
    assert torch.equal(qk_clip(w, m, q_heads=3, kv_heads=1, threshold=10.0, bias=b), gamma)
    assert torch.equal(w.full_tensor(), want_w) and torch.equal(b.full_tensor(), want_b)


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
                elif case == "fsdp_muon_dcp":
                    fsdp_muon_dcp(tmp)
                elif case == "fsdp_normuon_dcp":
                    fsdp_muon_dcp(tmp, NORMUON_DCP_OPTIONS, "normuon")
                elif case == "fsdp_muon_nonfinite":
                    fsdp_muon_nonfinite(tmp)
                elif case == "owner_bits":
                    owner_bits(tmp)
                elif case == "owner_bits_normuon":
                    owner_bits(tmp, normuon=True)
                elif case == "stack_gather":
                    stack_gather(tmp)
                elif case == "qk_clip_rows":
                    qk_clip_rows(tmp)
                elif case == "owner_bits_normuon_cuda":
                    owner_bits(tmp, normuon=True, device="cuda")
                elif case == "stack_gather_cuda":
                    stack_gather(tmp, device="cuda")
                elif case == "fsdp_stack":
                    fsdp_stack(tmp)
                elif case == "fsdp_cuda":
                    fsdp_stack(tmp, device="cuda")
                else:
                    fsdp(tmp, case)
            except Exception as e:
                raise AssertionError(f"case {case} on rank {dist.get_rank()}: {e}") from e
            dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Every case passed on every rank (the barriers). Leave without tearing gloo down: its
    # teardown at exit aborted a rank now and then ("terminate called without an active
    # exception", SIGABRT, seen in about 1 of 10 launches on a loaded machine) after every check
    # had passed, failing the test for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
