"""Options reach the C++ optimizer when they change (a scheduler's lr, a user's edit), not at
every step: the hand-over converts and checks every option of every group, which a training loop
with fixed options would otherwise pay at each step."""
import pytest
import torch

import fogo


class CountingSyncs:
    """Wraps an optimizer's C++ object, counting its sync calls (everything else passes)."""

    def __init__(self, cpp):
        self.cpp, self.syncs = cpp, 0

    def sync(self, groups):
        self.syncs += 1
        return self.cpp.sync(groups)

    def __getattr__(self, name):
        return getattr(self.cpp, name)


def make(cls, **options):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8, 6)), torch.nn.Parameter(torch.randn(6, 6))]
    opt = cls([{"params": params[:1]}, {"params": params[1:], "lr": 1e-3}], lr=2e-2, **options)
    opt._cpp = CountingSyncs(opt._cpp)
    return params, opt


def step(params, opt):
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()


@pytest.mark.parametrize("cls", [fogo.Muon, fogo.FOGO])
def test_a_step_with_unchanged_options_hands_none_over(cls):
    params, opt = make(cls)
    step(params, opt)
    assert opt._cpp.syncs == 1  # the first step hands every group over
    for _ in range(3):
        step(params, opt)
    assert opt._cpp.syncs == 1


@pytest.mark.filterwarnings("ignore:Detected call of")  # the scheduler made after a step
@pytest.mark.parametrize("cls", [fogo.Muon, fogo.FOGO])
def test_every_change_is_handed_over_once(cls):
    params, opt = make(cls)
    step(params, opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()  # a scheduler's lr (after the optimizer's first step, as torch expects)
    step(params, opt)
    assert opt._cpp.syncs == 2
    step(params, opt)
    assert opt._cpp.syncs == 2
    opt.param_groups[1]["weight_decay"] += 0.05  # a user's edit
    step(params, opt)
    assert opt._cpp.syncs == 3
    # A list option edited in place is a change too.
    opt.param_groups[0]["ns_coefficients"] = list(opt.param_groups[0]["ns_coefficients"])
    step(params, opt)  # a tuple made a list: handed over (the C++ conversion sees another type)
    step(params, opt)
    assert opt._cpp.syncs == 4
    opt.param_groups[0]["ns_coefficients"][0] *= 1.01
    step(params, opt)
    assert opt._cpp.syncs == 5


def test_the_changed_lr_is_the_one_stepped():
    """Against a fresh optimizer built with the new lr from the same state: the same bits."""
    params, opt = make(fogo.Muon)
    step(params, opt)
    for g in opt.param_groups:
        g["lr"] *= 0.25
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = fogo.Muon([{"params": twin_params[:1], "lr": opt.param_groups[0]["lr"]},
                      {"params": twin_params[1:], "lr": opt.param_groups[1]["lr"]}])
    twin.load_state_dict(opt.state_dict())
    grads = [torch.randn_like(p) for p in params]
    for p, q, g in zip(params, twin_params, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    twin.step()
    for p, q in zip(params, twin_params):
        assert torch.equal(p, q)


def test_a_tensor_lr_is_handed_over_at_every_step():
    """A Tensor lr may be changed in place (lr.fill_), which no comparison of the group sees."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8, 6))
    opt = fogo.Muon([p], lr=torch.tensor(0.02))
    opt._cpp = CountingSyncs(opt._cpp)
    before = p.detach().clone()
    p.grad = torch.randn_like(p)
    opt.step()
    opt.param_groups[0]["lr"].fill_(0.0)  # in place: the next step must not move p
    after_first = p.detach().clone()
    p.grad = torch.randn_like(p)
    opt.step()
    assert opt._cpp.syncs == 2
    assert not torch.equal(before, after_first)
    assert torch.equal(p.detach(), after_first)


def test_a_loaded_state_dict_steps_with_its_options():
    """After load_state_dict the step uses the loaded options, as a fresh optimizer built with
    them and loaded from the same state does."""
    params, opt = make(fogo.Muon)
    step(params, opt)
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 0.5
    opt.load_state_dict(sd)
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = fogo.Muon([{"params": twin_params[:1], "lr": 0.5},
                      {"params": twin_params[1:], "lr": 1e-3}])
    twin.load_state_dict(sd)
    for p, q in zip(params, twin_params):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    opt.step()
    twin.step()
    for p, q in zip(params, twin_params):
        assert torch.equal(p, q)
