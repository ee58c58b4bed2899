"""fogo._C.muon_step_rows (fogo::muon_step_rows, FSDP2 owner-computes' step) in one process: a
world of one rank, whose gather hands back its own rows and whose scatter copies, is fogo.Muon's
step on the whole parameters, fused weights' blocks included; bad inputs are refused naming what
is wrong, before anything changes. The multi-rank truth is dist_worker.py's (owner_bits,
stack_gather)."""

import pytest
import torch

import fogo
from conftest import randn

_C = fogo._C


def step_rows(params, grads, bufs, seconds, group, first_rows=None):
    """One owner-computes step of a one-rank world over ``params`` (every rank its own owner)."""
    def scatter(k, whole, out):
        out.copy_(whole)

    _C.muon_step_rows(params, grads, bufs, seconds, [p.shape[0] for p in params],
                      [0] * len(params) if first_rows is None else first_rows, group, None,
                      lambda k, rows: rows, scatter)


def one_group(**options):
    """A fogo.Muon param group's options as the Python optimizer holds them (the layout
    options set afterwards: the stand-in parameter need not fit them)."""
    layout = {k: options.pop(k) for k in ("batch_dims", "heads", "blocks") if k in options}
    group = fogo.Muon([torch.zeros(2, 2, requires_grad=True)], **options).param_groups[0]
    return {**group, **layout}


@pytest.mark.parametrize("options", [
    {"blocks": [6, 3, 3], "adjust_lr_fn": "match_rms_adamw"},
    {"heads": 2, "normuon": True},
    {"blocks": [2, 10], "normuon": True, "nesterov": False},
])
def test_one_rank_is_the_unsharded_step_with_blocks(gen, options):
    options = {"lr": 0.02, "weight_decay": 0.1, "ns_dtype": torch.float32, **options}
    start = [randn(gen, 12, 2), randn(gen, 12, 3, 2)]
    grads = [[randn(gen, *p.shape) for p in start] for _ in range(3)]
    ref = [p.clone().requires_grad_(True) for p in start]
    opt = fogo.Muon(ref, strict_2d=False, **options)
    group = one_group(strict_2d=False, **options)
    mine = [p.clone() for p in start]
    bufs = [torch.zeros_like(p) for p in start]
    seconds = [torch.zeros(p.shape[0]) for p in start] if options.get("normuon") else []
    for gs in grads:
        for p, g in zip(ref, gs):
            p.grad = g.clone()
        opt.step()
        step_rows(mine, gs, bufs, seconds, group)
        for k, (p, q) in enumerate(zip(ref, mine)):
            assert torch.equal(p.detach(), q), f"parameter {k}"
            assert torch.equal(opt.state[p]["momentum_buffer"], bufs[k])
            if seconds:
                assert torch.equal(opt.state[p]["second_moment"], seconds[k])
    plain = [p.clone().requires_grad_(True) for p in start]  # the blocks change the step
    whole = fogo.Muon(plain, strict_2d=False,
                      **{k: v for k, v in options.items() if k not in ("heads", "blocks")})
    for gs in grads:
        for p, g in zip(plain, gs):
            p.grad = g.clone()
        whole.step()
    assert not torch.equal(plain[0].detach(), ref[0].detach()), "the test cannot fail"


@pytest.mark.parametrize("first_rows, group, message", [
    ([0, 0], {}, "first_rows differ in length"),
    ([5], {}, "first_row 5 with its 12 rows here lies outside its 12 rows"),
    ([-1], {}, "first_row -1"),
    ([0], {"blocks": [6, 3, 2]}, "'blocks' [6, 3, 2] sums to 11 rows"),
    ([0], {"heads": 5}, "option 'heads' 5 does not divide the 12 rows"),
    ([0], {"batch_dims": 1}, "option 'batch_dims' is not supported for row-sharded matrices"),
])
def test_bad_inputs_are_refused_before_anything_changes(gen, first_rows, group, message):
    p, g = randn(gen, 12, 2), randn(gen, 12, 2)
    buf = randn(gen, 12, 2)
    before = (p.clone(), buf.clone())
    calls = []

    def gather(k, rows):
        calls.append(k)
        return rows

    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        _C.muon_step_rows([p], [g], [buf], [], [12], first_rows, one_group(lr=0.02, **group),
                          None, gather, lambda k, whole, out: out.copy_(whole))
    assert not calls, "a collective ran before the refusal"
    assert torch.equal(p, before[0]) and torch.equal(buf, before[1]), "a refused step changed"
