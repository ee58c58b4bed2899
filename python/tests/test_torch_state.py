"""fogo.FOGO / fogo.Muon as torch.optim citizens: opt.state holds the step's own tensors from
construction on, state_dict hooks fire, torch.distributed.checkpoint saves and loads without
stepping and round-trips bit for bit, copies and pickles work, loaded state is cast like torch's,
checkpoints cross with torch.optim.Muon both ways, and parameter errors are ValueErrors."""

import copy
import pickle

import pytest
import torch

import fogo
from conftest import randn
from test_state_dict import assert_state_equal

SHAPES = [(16, 24), (16, 24), (24, 8)]


def model(gen, dtype=torch.float32):
    return [randn(gen, *s, scale=0.1).to(dtype).requires_grad_(True) for s in SHAPES]


def clone(params):
    return [p.detach().clone().requires_grad_(True) for p in params]


def make_fogo(params):
    return fogo.FOGO(
        [{"params": params[:2]}, {"params": params[2:], "lr": 0.005, "seed": 3}],
        lr=0.01, codebook_size=6, proj_dim=8, reseed_every=3, freeze_per_task=2,
    )


def make_muon(params):
    return fogo.Muon(params, lr=0.02, adjust_lr_fn="match_rms_adamw")


def make_normuon(params):  # NorMuon: a second moment per parameter besides the momentum
    return fogo.Muon(params, lr=0.02, normuon=True)


def grads_for(gen, steps, dtype=torch.float32):
    return [[randn(gen, *s).to(dtype) for s in SHAPES] for _ in range(steps)]


def train(opt, params, grads, boundary_at=None):
    for t, gs in enumerate(grads):
        if boundary_at is not None and t == boundary_at:
            opt.task_boundary()
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()


BOUNDARY = {fogo.FOGO: 2, fogo.Muon: None}


# -- opt.state ---------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [make_fogo, make_muon, make_normuon])
def test_state_is_the_steps_own_from_construction(gen, make):
    params = model(gen)
    opt = make(params)
    keys = opt._fresh_keys_of(opt.param_groups[0])
    assert ("second_moment" in keys) == (make is make_normuon)
    # Present before the first step (zeros), so DCP and every rank see the same keys.
    for p in params:
        assert sorted(opt.state[p]) == sorted(keys)
        assert all(not opt.state[p][k].any() for k in keys)
    held = {(id(p), k): opt.state[p][k] for p in params for k in keys}
    train(opt, params, grads_for(gen, 3), BOUNDARY[type(opt)])
    sd = opt.state_dict()
    for i, p in enumerate(params):
        for k in keys:
            t = opt.state[p][k]
            assert t is held[(id(p), k)], "the step replaced a state tensor"
            assert t.any(), "the step did not write into opt.state"
            assert sd["state"][i][k] is t  # state_dict() returns the state, as torch's does


def test_assigned_state_is_adopted_by_the_step(gen):
    # opt.state written by hand (as ZeroRedundancyOptimizer's load does) is what the next step
    # uses: a fogo.Muon given torch.optim.Muon's buffers mid-run continues as torch does.
    params = model(gen)
    ours, theirs = clone(params), clone(params)
    a = fogo.Muon(ours, lr=0.02, ns_dtype=torch.bfloat16)  # torch.optim.Muon's arithmetic
    b = torch.optim.Muon(theirs, lr=0.02)
    grads = grads_for(gen, 5)
    train(b, theirs, grads[:3])
    with torch.no_grad():
        for p, q in zip(ours, theirs):
            p.copy_(q)
    for p, q in zip(ours, theirs):
        a.state[p] = {"momentum_buffer": b.state[q]["momentum_buffer"].clone()}
    train(a, ours, grads[3:])
    train(b, theirs, grads[3:])
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
    # A tensor that does not fit is refused before anything changes.
    a.state[ours[0]]["momentum_buffer"] = torch.zeros(3, 3)
    before = [p.detach().clone() for p in ours]
    with pytest.raises(ValueError, match=r"opt.state\[p\]\['momentum_buffer'\] of parameter 0 of "
                                         r"group 0 \(shape \[16, 24\]\) has shape \[3, 3\]"):
        train(a, ours, grads[:1])
    assert all(torch.equal(p, q) for p, q in zip(ours, before))


@pytest.mark.parametrize("make", [make_fogo, make_muon, make_normuon])
def test_state_dict_hooks_see_the_real_state(gen, make):
    params = model(gen)
    opt = make(params)
    train(opt, params, grads_for(gen, 2))
    seen = {}
    # Hooks return None: a returned value would replace the state_dict.
    opt.register_state_dict_pre_hook(lambda o: seen.update(pre=True))
    opt.register_state_dict_post_hook(lambda o, sd: seen.update(post=sd))
    opt.register_load_state_dict_pre_hook(lambda o, sd: seen.update(load_pre=len(sd["state"])))
    opt.register_load_state_dict_post_hook(lambda o: seen.update(load_post=True))
    sd = opt.state_dict()
    assert seen["pre"] and seen["post"] is sd
    assert sorted(sd["state"]) == [0, 1, 2]
    assert all(v.any() for st in sd["state"].values() for v in st.values())
    opt.load_state_dict(copy.deepcopy(sd))
    assert seen["load_pre"] == 3 and seen["load_post"]


# -- torch.distributed.checkpoint ---------------------------------------------------------------

class Net(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Parameter(p.detach().clone()) for p in params)


def net_train(opt, net, grads, boundary_at=None):
    train(opt, [net.a, net.b, net.c], grads, boundary_at)


@pytest.mark.parametrize("make", [make_fogo, make_muon, make_normuon])
@pytest.mark.parametrize("flatten", [False, True])
def test_dcp_saves_without_stepping_and_resumes_bitwise(gen, tmp_path, make, flatten):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict)

    options = StateDictOptions(flatten_optimizer_state_dict=flatten)
    init = model(gen)
    grads = grads_for(gen, 10)
    boundary = BOUNDARY[make(clone(init)).__class__]

    full = Net(init)
    opt = make(list(full.parameters()))
    net_train(opt, full, grads[:5], boundary)
    net_train(opt, full, grads[5:], boundary)

    first = Net(init)
    opt1 = make(list(first.parameters()))
    net_train(opt1, first, grads[:5], boundary)
    before = copy.deepcopy(opt1.state_dict())
    osd = get_optimizer_state_dict(first, opt1, options=options)
    # Saving changed nothing (DCP used to run a step with zero gradients to "initialise").
    assert_state_equal(before, opt1.state_dict())
    dcp.save({"optim": osd}, checkpoint_id=str(tmp_path))

    # A new process: fresh model and optimizer, DCP loads into their state_dict in place.
    second = Net(list(first.parameters()))
    opt2 = make(list(second.parameters()))
    fresh = copy.deepcopy(opt2.state_dict())
    target = {"optim": get_optimizer_state_dict(second, opt2, options=options)}
    assert_state_equal(fresh, opt2.state_dict())  # no step on the fresh optimizer either
    dcp.load(target, checkpoint_id=str(tmp_path))
    set_optimizer_state_dict(second, opt2, target["optim"], options=options)
    assert_state_equal(before, opt2.state_dict())
    net_train(opt2, second, grads[5:], boundary)
    for p, q in zip(full.parameters(), second.parameters()):
        assert torch.equal(p, q)
    assert_state_equal(opt.state_dict(), opt2.state_dict())


# -- copies ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [make_fogo, make_muon, make_normuon])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_step_like_the_original(gen, make, how):
    params = model(gen)
    opt = make(params)
    grads = grads_for(gen, 8)
    boundary = BOUNDARY[type(opt)]
    train(opt, params, grads[:4], boundary)
    if how == "deepcopy":
        params2, opt2 = copy.deepcopy((params, opt))
    else:
        params2, opt2 = pickle.loads(pickle.dumps((params, opt)))
    assert opt2.param_groups[0]["params"][0] is params2[0]
    train(opt, params, grads[4:], boundary)
    train(opt2, params2, grads[4:], boundary)
    for p, q in zip(params, params2):
        assert torch.equal(p, q)
    assert_state_equal(opt.state_dict(), opt2.state_dict())


# -- dtypes and torch.optim.Muon -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_muon_casts_loaded_state_to_the_parameters_dtype(gen, dtype):
    # A checkpoint of an fp32 run resumed on a bf16 / float64 model: torch.optim.Muon casts the
    # momentum to the parameter's dtype at load, and fogo.Muon loads the same buffers.
    params = model(gen)
    source = fogo.Muon(params, lr=0.02, ns_dtype=torch.bfloat16)  # the state_dict carries it
    train(source, params, grads_for(gen, 2))
    sd = source.state_dict()
    ours, theirs = clone([p.to(dtype) for p in params]), clone([p.to(dtype) for p in params])
    a = fogo.Muon(ours, lr=0.02, ns_dtype=torch.bfloat16)  # torch.optim.Muon's arithmetic
    b = torch.optim.Muon(theirs, lr=0.02)
    a.load_state_dict(copy.deepcopy(sd))
    b.load_state_dict(copy.deepcopy(sd))
    for p, q in zip(ours, theirs):
        mine, torchs = a.state[p]["momentum_buffer"], b.state[q]["momentum_buffer"]
        assert mine.dtype == torchs.dtype == dtype and torch.equal(mine, torchs)
    grads = grads_for(gen, 3, dtype)
    train(a, ours, grads)
    train(b, theirs, grads)
    for p, q in zip(ours, theirs):
        assert p.dtype == dtype and torch.isfinite(p).all()
        assert torch.equal(p, q)  # bit for bit with torch.optim.Muon, as in fp32


def test_torch_muon_checkpoint_continues_in_fogo_and_back(gen):
    init = model(gen)
    grads = grads_for(gen, 9)
    options = {"lr": 0.02, "weight_decay": 0.05, "adjust_lr_fn": "match_rms_adamw"}

    reference = clone(init)
    ref = torch.optim.Muon(reference, **options)
    train(ref, reference, grads)

    # torch -> fogo: adjust_lr_fn comes with the checkpoint (the fogo optimizer is built with
    # the default, so a loader that ignored it would take another step size).
    first = clone(init)
    t1 = torch.optim.Muon(first, **options)
    train(t1, first, grads[:3])
    second = clone(first)
    # ns_dtype: torch's checkpoint has none, so fogo's own continues (bf16: torch's arithmetic).
    f2 = fogo.Muon(second, lr=0.02, ns_dtype=torch.bfloat16)
    f2.load_state_dict(copy.deepcopy(t1.state_dict()))
    assert f2.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert f2.param_groups[0]["weight_decay"] == 0.05
    train(f2, second, grads[3:6])

    # fogo -> torch: every key torch.optim.Muon's step reads is in fogo's groups.
    third = clone(second)
    t3 = torch.optim.Muon(third, lr=0.02)
    t3.load_state_dict(copy.deepcopy(f2.state_dict()))
    train(t3, third, grads[6:])
    for p, q in zip(reference, third):
        assert torch.equal(p, q)


def test_parameter_errors_are_value_errors():
    with pytest.raises(ValueError, match="parameter 0 of group 0 \\(shape \\[5\\]\\)"):
        fogo.Muon([torch.zeros(5, requires_grad=True)])
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        fogo.FOGO([torch.zeros(5, requires_grad=True)])
    with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
        fogo.Muon([torch.zeros(4, 3, 3, 3, requires_grad=True)], strict_2d=True)
    opt = fogo.Muon([torch.zeros(3, 3, requires_grad=True)])
    with pytest.raises(ValueError):
        opt.add_param_group({"params": [torch.zeros(3, requires_grad=True)]})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("cls", [fogo.Muon, fogo.FOGO])
def test_state_dicts_carry_no_file_checksum_and_load_without_warning(gen, cls, capfd):
    # A file's checksum describes bytes on a disk; a state dict is live objects. Loading one
    # taken before more steps (its tensors are the optimizer's own, as torch's) must neither be
    # refused as corrupted nor warn about a missing checksum.
    import warnings

    params = model(gen)
    opt = cls(params, lr=0.02)
    train(opt, params, grads_for(gen, 2))
    sd = copy.deepcopy(opt.state_dict())
    flat = repr(sd)
    assert "checksum" not in flat and "in_memory" not in flat
    train(opt, params, grads_for(gen, 1))
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.load_state_dict(sd)
    assert "checksum" not in capfd.readouterr().err  # the C++ side warns on stderr
    train(opt, params, grads_for(gen, 1))
