"""state_dict() / load_state_dict(): plain tensors and numbers, and a resumed run equal to the
uninterrupted one bit for bit (FOGO's codebooks, frozen banks and generators included)."""

import copy
import io
import re

import pytest
import torch

import fogo
from conftest import randn

SHAPES = [(16, 24), (16, 24), (24, 8)]


def model(gen):
    return [randn(gen, *s, scale=0.1).requires_grad_(True) for s in SHAPES]


def fogo_opt(params):
    return fogo.FOGO(
        [{"params": params[:2]}, {"params": params[2:], "lr": 0.005, "seed": 3}],
        lr=0.01, codebook_size=6, proj_dim=8, reseed_every=3, freeze_per_task=2,
    )


def muon_opt(params):
    return fogo.Muon(params, lr=0.02)


def normuon_opt(params):
    return fogo.Muon(params, lr=0.02, normuon=True)


def train(opt, params, grads, boundary_at=None):
    for t, gs in enumerate(grads):
        if boundary_at is not None and t == boundary_at and isinstance(opt, fogo.FOGO):
            opt.task_boundary()
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()


def save_load(sd):
    buffer = io.BytesIO()
    torch.save(sd, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # plain tensors, numbers, strings, dtypes only


@pytest.mark.parametrize("make", [fogo_opt, muon_opt, normuon_opt])
def test_resume_equals_uninterrupted(gen, make):
    grads = [[randn(gen, *s) for s in SHAPES] for _ in range(12)]
    init = model(gen)

    full = [p.detach().clone().requires_grad_(True) for p in init]
    opt = make(full)
    train(opt, full, grads[:5], boundary_at=3)
    train(opt, full, grads[5:], boundary_at=2)

    first = [p.detach().clone().requires_grad_(True) for p in init]
    opt1 = make(first)
    train(opt1, first, grads[:5], boundary_at=3)
    sd = save_load(opt1.state_dict())
    # A new process would rebuild parameters and optimizer from scratch.
    second = [p.detach().clone().requires_grad_(True) for p in first]
    opt2 = make(second)
    opt2.load_state_dict(sd)
    train(opt2, second, grads[5:], boundary_at=2)

    for k, (p, q) in enumerate(zip(full, second)):
        assert torch.equal(p, q), f"parameter {k}"
    assert_state_equal(opt.state_dict(), opt2.state_dict())


def assert_state_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_state_equal(x, y)
    else:
        assert a == b


def test_fogo_state_dict_layout(gen):
    params = model(gen)
    opt = fogo_opt(params)
    train(opt, params, [[randn(gen, *s) for s in SHAPES] for _ in range(4)], boundary_at=2)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2]
    assert sorted(sd["state"][0]) == ["fast_momentum", "slow_momentum"]
    assert sd["state"][0]["slow_momentum"].shape == SHAPES[0]
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2]]
    assert sd["param_groups"][1]["lr"] == 0.005 and sd["param_groups"][1]["seed"] == 3
    # FOGO's memory: per group, fixed-shape tensors (DCP loads them in place) and lists for
    # what grows (the frozen bank: one block per task).
    group0 = sd["param_groups"][0]["memory"]
    assert group0["step"] == 4 and group0["initialized"] is True and group0["created"] is True
    assert group0["centroids"].shape == (6, 8) and group0["undefined"] == []
    assert torch.equal(group0["centroids"], opt.memory(0)["centroids"])
    assert torch.tensor(group0["frozen"]).shape == (2, 8)  # freeze_per_task frozen at the boundary
    assert torch.equal(torch.tensor(group0["frozen"]), opt.memory(0)["frozen"])

    def plain(x):
        if isinstance(x, dict):
            return all(plain(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return all(plain(v) for v in x)
        return isinstance(x, (torch.Tensor, int, float, bool, str, torch.dtype)) or x is None

    assert plain(sd)


def memory_mismatches(opt):
    """Where the state_dict's memory, turned back into the C++ archive's entries
    (fogo._memory.to_archive), differs from the archive the C++ optimizer writes: a key one has
    and the other lacks, or a value that differs."""
    from fogo import _memory

    groups = opt.state_dict()["param_groups"]
    ours, theirs = _memory.to_archive(groups), opt._cpp.extra_state()
    out = []
    for g in range(len(groups)):
        a, b = ours.get(f"fogo/group/{g}", {}), theirs.get(f"fogo/group/{g}", {})
        out += [f"group {g}: {k} only in C++'s" for k in sorted(set(b) - set(a))]
        out += [f"group {g}: {k} only in Python's" for k in sorted(set(a) - set(b))]
        for k in sorted(set(a) & set(b)):
            x, y = a[k], b[k]
            same = (torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                    else x == y)
            if not same:
                out.append(f"group {g}: {k} differs")
    return out


def test_memory_layout_is_the_cpp_list(gen, monkeypatch):
    # The state_dict's memory holds every tensor the C++ checkpoint saves, laid out from the C++
    # list (GroupMemory::visit through fogo._C.memory_fields), and gives back the C++ archive's
    # entries exactly: a field added in C++ reaches load_state_dict with no change in Python.
    from fogo import _memory

    params = model(gen)
    opt = fogo_opt(params)
    train(opt, params, [[randn(gen, *s) for s in SHAPES] for _ in range(4)], boundary_at=2)
    saved = [name for name, uses, _ in fogo._C.memory_fields() if "saved" in uses]
    assert saved == ["centroids", "S", "N", "start", "frozen", "frozen_nu", "rbar", "stats"]
    assert set(saved) <= set(opt.state_dict()["param_groups"][0]["memory"])
    assert memory_mismatches(opt) == []
    # A Python list that lacked a field C++ saves (as the hand-kept one would once C++ added
    # one) is caught here, and its checkpoint would not load.
    monkeypatch.setattr(_memory, "_LISTS", tuple(k for k in _memory._LISTS if k != "frozen_nu"))
    assert memory_mismatches(opt) == ["group 0: frozen_nu only in C++'s",
                                      "group 1: frozen_nu only in C++'s"]
    with pytest.raises(RuntimeError, match="frozen_nu"):
        fogo_opt(model(gen)).load_state_dict(opt.state_dict())


def test_rejected_load_changes_nothing(gen):
    params = model(gen)
    opt = fogo_opt(params)
    train(opt, params, [[randn(gen, *s) for s in SHAPES] for _ in range(2)])
    before = copy.deepcopy(opt.state_dict())  # state_dict() returns the live state, as torch's

    other_params = model(gen)
    other = fogo.FOGO(
        [{"params": other_params[:2]}, {"params": other_params[2:], "seed": 3}],
        codebook_size=12, proj_dim=8,
    )
    train(other, other_params, [[randn(gen, *s) for s in SHAPES]])
    with pytest.raises(RuntimeError, match="codebook_size"):
        opt.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="2 param groups, this optimizer 1"):
        fogo.FOGO(model(gen), codebook_size=6, proj_dim=8).load_state_dict(before)
    assert_state_equal(before, opt.state_dict())


def test_fogo_state_dict_of_a_group_listed_twice(gen):
    # A group listed twice (param_groups.extend(param_groups), as PyTorch's
    # test_state_dict_deterministic does) is one C++ group: state_dict() gives its options and
    # memory at both listings, as torch.optim gives a repeated group; copies take the list too.
    # A step refuses it (it would step the parameters twice), before anything changes.
    params = model(gen)
    opt = fogo_opt(params)
    train(opt, params, [[randn(gen, *s) for s in SHAPES] for _ in range(2)])
    expected = copy.deepcopy(opt.state_dict())
    opt.param_groups.extend(opt.param_groups)
    doubled = opt.state_dict()
    assert len(doubled["param_groups"]) == 4
    assert_state_equal(expected, {"state": doubled["state"],
                                  "param_groups": doubled["param_groups"][:2]})
    assert_state_equal(expected, {"state": doubled["state"],
                                  "param_groups": doubled["param_groups"][2:]})
    assert doubled["param_groups"][0]["memory"]["step"] > 0  # the trained memory, not a blank one
    copied = copy.deepcopy(opt)
    assert copied.param_groups[2] is copied.param_groups[0]
    assert_state_equal(doubled, copied.state_dict())
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match=r"param_groups\[2\] is param_groups\[0\] listed again"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert_state_equal(doubled, opt.state_dict())
    del opt.param_groups[2:]
    assert_state_equal(expected, opt.state_dict())
    opt.step()  # listed once again, it steps


def test_fogo_state_dict_refuses_groups_the_cpp_optimizer_lacks(gen):
    # A group appended by hand (not through add_param_group) has no C++ group, so no memory:
    # state_dict() used to write a blank one (step 0, zero codebook) for it. It refuses as
    # step() does; so do copies, which snapshot the memory the same way.
    params = model(gen)
    opt = fogo_opt(params)
    train(opt, params, [[randn(gen, *s) for s in SHAPES] for _ in range(2)])
    expected = copy.deepcopy(opt.state_dict())
    opt.param_groups.append({**opt.param_groups[0], "params": [params[0]]})
    message = "3 param groups, but 2 were added through add_param_group"
    for call in (opt.state_dict, lambda: copy.deepcopy(opt), opt.step):
        with pytest.raises(RuntimeError, match=message):
            call()
    del opt.param_groups[2:]
    assert_state_equal(expected, opt.state_dict())


def test_fogo_01_layout_still_loads(gen):
    # fogo 0.1's state_dict: the C++ archive's memory entries at the top level ("memory"), no
    # per-group memory; Muon's option under "adjust_lr".
    grads = [[randn(gen, *s) for s in SHAPES] for _ in range(6)]
    params = model(gen)
    opt = fogo_opt(params)
    train(opt, params, grads[:3], boundary_at=2)
    sd = copy.deepcopy(opt.state_dict())
    old = {"state": sd["state"], "param_groups": [dict(g) for g in sd["param_groups"]],
           "memory": fogo._memory.to_archive(sd["param_groups"])}
    for g in old["param_groups"]:
        del g["memory"]
    again = [p.detach().clone().requires_grad_(True) for p in params]
    opt2 = fogo_opt(again)
    opt2.load_state_dict(old)
    train(opt, params, grads[3:])
    train(opt2, again, grads[3:])
    assert all(torch.equal(p, q) for p, q in zip(params, again))

    muon = fogo.Muon(model(gen), lr=0.02)
    msd = copy.deepcopy(muon.state_dict())
    msd["param_groups"][0]["adjust_lr"] = msd["param_groups"][0].pop("adjust_lr_fn")
    msd["param_groups"][0]["adjust_lr"] = "match_rms_adamw"
    muon.load_state_dict(msd)
    assert muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert "adjust_lr" not in muon.param_groups[0]


@pytest.mark.parametrize("key, bad, what", [
    ("centroids", (5, 8), "codebook has shape [5, 8], expected [6, 8]"),
    ("N", (7,), "codebook counts N has shape [7], expected [6]"),
    ("rbar", (2,), "conflict EMA has shape [2], expected []"),
])
def test_fogo_memory_of_another_shape_is_refused_and_changes_nothing(key, bad, what):
    """FOGO's group memory in a state_dict (no checksum travels in memory) is checked by
    FOGO::load's shapes: a tensor of another shape is refused naming it, and the optimizer keeps
    its state."""
    p = torch.randn(6, 20, requires_grad=True)
    opt = fogo.FOGO([p], lr=0.01, codebook_size=6, proj_dim=8)
    p.grad = torch.randn(6, 20)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["memory"][key] = torch.zeros(bad)
    target = fogo.FOGO([p.detach().clone().requires_grad_(True)], lr=0.02, codebook_size=6,
                       proj_dim=8)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(RuntimeError, match=re.escape(what)):
        target.load_state_dict(sd)
    assert_state_equal(target.state_dict(), before)
