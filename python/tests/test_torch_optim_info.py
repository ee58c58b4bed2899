"""PyTorch's own optimizer tests for Muon, run against fogo.Muon and fogo.FOGO.

PyTorch tests torch.optim.Muon with test/test_optim.py (class TestOptimRenewed) driven by the
Muon entry of torch.testing._internal.common_optimizers.optim_db (its inputs: default, lr 0.01, a
Tensor lr, weight_decay 0.2, momentum 0.8, ns_steps 6, other ns_coefficients; its error inputs).
On the CPU 39 of those tests apply to Muon (those the OptimizerInfo does not filter out: no
foreach, fused, sparse, complex, closure-only or CUDA-only tests). test_optim.py is not in the
torch wheel: each of the 39 is written again here, one function per test with its name and its
parametrization, from the logic of torch 2.11's test_optim.py; the inputs and error inputs are
the installed torch's own (imported from common_optimizers, never copied).

Every test runs for three classes: torch.optim.Muon itself (the control: a test that fails there
is a mistake in this file, not a finding), fogo.Muon and fogo.FOGO. FOGO takes Muon's inputs with
its option names (momentum -> mu_s, ns_steps -> ns_steps_slow and ns_steps_fast). Where fogo is
meant to behave differently, the test asserts fogo's documented behaviour instead of torch's
(each place says why; docs/python.md, "PyTorch's optimizer tests", lists them).
"""

import functools
import tempfile
from copy import deepcopy

import pytest
import torch
from torch.nn import Parameter
from torch.optim import SGD
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

# PyTorch's test-suite modules (they need expecttest, pinned in python/requirements.txt).
from torch.testing._internal.common_optimizers import (
    OptimizerErrorEnum,
    _get_optim_inputs_including_global_cliquey_kwargs,
    optim_db,
)
from torch.testing._internal.common_utils import TestCase

import fogo

INFO = next(info for info in optim_db if info.optim_cls is torch.optim.Muon)
DEVICE, DTYPE = "cpu", torch.float32
CLASSES = {"torch.Muon": torch.optim.Muon, "fogo.Muon": fogo.Muon, "fogo.FOGO": fogo.FOGO}
FOGO_NAMES = {"momentum": ("mu_s",), "ns_steps": ("ns_steps_slow", "ns_steps_fast")}

tc = TestCase()  # torch's assertEqual (its tolerances), assertRaisesRegex, assertWarnsRegex

pytestmark = pytest.mark.parametrize("cls", list(CLASSES.values()), ids=list(CLASSES))


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def kwargs_for(cls, kwargs):
    """Muon's keyword arguments as `cls` names them."""
    if cls is not fogo.FOGO:
        return dict(kwargs)
    out = {}
    for k, v in kwargs.items():
        for name in FOGO_NAMES.get(k, (k,)):
            out[name] = v
    return out


def applies(cls, optim_input):
    """FOGO has no adjust_lr_fn: its update's size is its own RMS rule (docs/algorithm.md). torch
    2.15's inputs try "match_rms_adamw" and "spectral_unclamped" (2.11's none): not for FOGO."""
    return cls is not fogo.FOGO or "adjust_lr_fn" not in optim_input.kwargs


def optim_inputs(cls, skip=("differentiable",)):
    """The OptimizerInfo's inputs with every supported global flag (Muon has none), for `cls`;
    fresh each call (a Tensor lr is mutated by schedulers)."""
    inputs = _get_optim_inputs_including_global_cliquey_kwargs(DEVICE, DTYPE, INFO, skip=skip)
    inputs = [i for i in inputs if applies(cls, i)]
    for i in inputs:
        i.kwargs = kwargs_for(cls, i.kwargs)
    return inputs


def closure_then_step(optimizer, closure):
    """test_optim's `if optim_info.step_requires_closure: step(closure) else: closure(); step()`
    (Muon does not require one)."""
    loss = closure()
    optimizer.step()
    return loss


# -- construction and errors -----------------------------------------------------------------

def test_fogo_leaves_out_only_the_adjust_lr_fn_inputs(cls):
    """The inputs FOGO leaves out (above) are exactly those with an adjust_lr_fn: torch 2.15's
    optim_db has two, 2.11's none; the rest run for FOGO as for torch.optim.Muon."""
    every = _get_optim_inputs_including_global_cliquey_kwargs(DEVICE, DTYPE, INFO, skip=())
    with_fn = [i.desc for i in every if "adjust_lr_fn" in i.kwargs]
    if tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])) >= (2, 15):
        assert len(with_fn) >= 2, with_fn
    left = len(optim_inputs(cls, skip=()))
    assert left == len(every) - (len(with_fn) if cls is fogo.FOGO else 0)


def test_optim_infos_do_not_specify_global_cliquey_kwargs(cls):
    flags = ["foreach", "fused", "differentiable"]
    for optim_input in INFO.optim_inputs_func(device=DEVICE):
        assert not any(f in optim_input.kwargs for f in flags)
    # None of the three classes has those flags: each is refused by name.
    for flag in flags:
        with pytest.raises(TypeError, match=flag):
            cls([Parameter(torch.randn(2, 3))], **{flag: False})


# Error inputs where fogo answers differently from torch.optim.Muon, by design:
#   "only support 2D parameters": fogo steps an N-D weight as its [shape0, rest] matrix; fogo.Muon
#     refuses it as torch does with strict_2d=True, fogo.FOGO has no 2-D-only mode;
#   the adjust_lr_fn value: fogo.Muon's ValueError names the option and its values; FOGO has no
#     such option (TypeError, an unknown keyword).
NOT_2D = "only support 2D parameters"
# The bad adjust_lr_fn's description: torch 2.11's and torch 2.15's (renamed when 2.15 added
# "spectral_unclamped").
ADJUST = {"only support `original` and `match_rms_adamw`", "unsupported adjust_lr_fn"}


def test_errors(cls):
    for error_input in INFO.optim_error_inputs_func(device=DEVICE, dtype=DTYPE):
        optim_input = error_input.optimizer_error_input
        params, kwargs = optim_input.params, dict(optim_input.kwargs)
        error_type, regex = error_input.error_type, error_input.error_regex
        if cls is not torch.optim.Muon:
            if optim_input.desc == NOT_2D:
                cls(params, **kwargs)  # accepted: N-D weights are matrices to fogo
                if cls is fogo.FOGO:
                    continue
                kwargs["strict_2d"] = True  # torch.optim.Muon's rule, and its message
            elif optim_input.desc in ADJUST:
                if cls is fogo.FOGO:
                    error_type, regex = TypeError, "unexpected keyword argument.*'adjust_lr_fn'"
                else:
                    regex = "option 'adjust_lr_fn' must be one of 'original' 'match_rms_adamw' 'spectral'"
            elif "complex" in optim_input.desc and cls is fogo.FOGO:
                regex = "FOGO does not support complex parameters"  # torch's message, FOGO's name
        if error_input.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR:
            if issubclass(error_type, Warning):
                with tc.assertWarnsRegex(error_type, regex):
                    cls(params, **kwargs)
            else:
                with tc.assertRaisesRegex(error_type, regex):
                    cls(params, **kwargs)
        else:
            optimizer = cls(params, **kwargs)
            with tc.assertRaisesRegex(error_type, regex):
                optimizer.step()


# -- the update goes the right way -----------------------------------------------------------

@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("with_lrsched", [True, False])
def test_forloop_goes_right_direction(cls, contiguous, with_lrsched):
    schedulers_constructors = INFO.scheduler_inputs if with_lrsched else [None]
    for schedulers_constructor in schedulers_constructors:
        for optim_input in optim_inputs(cls):
            if contiguous:
                weight = Parameter(torch.randn((10, 5)))
            else:
                weight = Parameter(torch.randn((10, 5, 2))[..., 0])
            input = torch.randn(5)
            optimizer = cls([weight], **optim_input.kwargs)
            schedulers = [s(optimizer) for s in (schedulers_constructor or [])]

            def closure():
                optimizer.zero_grad()
                loss = weight.mv(input).pow(2).sum()
                loss.backward()
                return loss

            initial_value = closure().item()
            for _ in range(20):
                loss = closure_then_step(optimizer, closure)
                for scheduler in schedulers:
                    if isinstance(scheduler, ReduceLROnPlateau):
                        scheduler.step(loss)
                    else:
                        scheduler.step()
            assert closure().item() < initial_value, optim_input.desc


def test_param_group_with_lrscheduler_goes_right_direction(cls):
    for schedulers_c in INFO.scheduler_inputs:
        weight = Parameter(torch.randn((10, 5)))
        weight2 = Parameter(torch.randn((10, 5)))
        inpt = torch.randn(5)
        optimizer = cls([{"params": [weight]}, {"params": [weight2], "lr": 0.01}])
        schedulers = [scheduler_c(optimizer) for scheduler_c in schedulers_c]

        def closure():
            optimizer.zero_grad()
            loss = (weight.mv(inpt) + weight2.mv(inpt)).pow(2).sum()
            loss.backward()
            return loss

        initial_value = closure().item()
        for _ in range(20):
            loss = optimizer.step(closure)
            for scheduler in schedulers:
                if isinstance(scheduler, ReduceLROnPlateau):
                    scheduler.step(loss)
                else:
                    scheduler.step()
        assert closure().item() < initial_value


@pytest.mark.parametrize("num_dim", [0, 1, 2])
def test_tensor_lr(cls, num_dim):
    for optim_input in optim_inputs(cls):
        weight = Parameter(torch.randn((10, 5)))
        weight_c = weight.detach().clone().requires_grad_(True)
        inpt = torch.randn(5)
        kwargs = optim_input.kwargs
        kwargs.pop("lr", None)
        kwargs["lr"] = 1e-3
        optimizer_r = cls([weight], **kwargs)
        kwargs["lr"] = torch.tensor(kwargs["lr"]).reshape([1] * num_dim)
        optimizer = cls([weight_c], **kwargs)

        def closure(optim, w, i):
            optim.zero_grad()
            loss = w.mv(i).pow(2).sum()
            loss.backward()
            return loss

        for _ in range(5):
            closure(optimizer_r, weight, inpt)
            optimizer_r.step()
            closure(optimizer, weight_c, inpt)
            optimizer.step()
            tc.assertEqual(weight, weight_c)


def test_param_groups_weight_decay(cls):
    for optim_input in optim_inputs(cls):
        weight_kwargs = optim_input.kwargs
        weight2_kwargs = deepcopy(optim_input.kwargs)
        weight2_kwargs["weight_decay"] = 0.0
        weight = Parameter(torch.randn((10, 5)))
        weight2 = Parameter(torch.randn((10, 5)))
        input = torch.randn(5)
        optimizer = cls([dict(params=[weight], **weight_kwargs),
                         dict(params=[weight2], **weight2_kwargs)])
        loss = (weight.mv(input) + weight2.mv(input)).pow(2).sum()
        initial_value = loss.item()
        for _ in range(20):
            optimizer.zero_grad()
            loss = (weight.mv(input) + weight2.mv(input)).pow(2).sum()
            loss.backward()
            optimizer.step()
        assert loss.item() < initial_value, optim_input.desc


def test_param_groups_lr(cls):
    for optim_input in optim_inputs(cls):
        if "lr" not in optim_input.kwargs or optim_input.kwargs["lr"] == 0:
            optim_input.kwargs["lr"] = 1e-3
        weight = Parameter(torch.randn((10, 5)))
        irrelevant = Parameter(torch.randn((2, 2)))
        irrelevant_clone = irrelevant.clone()
        input = torch.randn(5)
        optimizer = cls([dict(params=[weight], **optim_input.kwargs),
                         dict(params=[irrelevant])], lr=1e-28)
        loss = weight.mv(input).pow(2).sum()
        initial_value = loss.item()
        for _ in range(20):
            optimizer.zero_grad()
            loss = weight.mv(input).pow(2).sum()
            loss.backward()
            irrelevant.grad = torch.rand_like(irrelevant)
            optimizer.step()
        assert loss.item() < initial_value, optim_input.desc
        tc.assertEqual(irrelevant, irrelevant_clone)


def test_step_is_noop_when_params_have_no_grad(cls):
    params = [torch.randn(2, 3, requires_grad=False) for _ in range(2)]

    def closure():
        return torch.tensor([1.0])

    for optim_input in optim_inputs(cls, skip=()):
        optimizer = cls(params, **optim_input.kwargs)
        before = [p.clone() for p in params]
        optimizer.step(closure)
        tc.assertEqual(params, before)


def test_step_is_noop_for_zero_grads(cls):
    param = torch.randn((5, 1), requires_grad=True)

    def closure():
        return torch.tensor([1.0])

    for optim_input in optim_inputs(cls, skip=()):
        kwargs = optim_input.kwargs
        if kwargs.get("weight_decay", 0) != 0:
            continue
        # Muon's parameters decay whatever the gradient (weight_decay 0.1 by default): a small lr.
        kwargs["lr"] = torch.tensor(1e-5) if isinstance(kwargs.get("lr"), torch.Tensor) else 1e-5
        # Compared with the parameter before this step (torch's test compares with the first
        # value after all of them: the decays add up to more than its tolerance for |p| > 2,
        # which torch's random draw happens to avoid and this one does not).
        old_param = param.detach().clone()
        optimizer = cls([param], **kwargs)
        param.grad = torch.zeros_like(param)
        optimizer.step(closure)
        tc.assertEqual(old_param, param)


def test_grads_are_never_inplaced_into(cls):
    param = torch.randn((5, 1), requires_grad=True)

    def closure():
        return torch.tensor([1.0])

    for optim_input in optim_inputs(cls, skip=()):
        optimizer = cls([param], **optim_input.kwargs)
        param.grad = torch.rand_like(param)
        old_version = param.grad._version
        for _ in range(5):
            optimizer.step(closure)
            assert param.grad._version == old_version


def test_optimizer_can_be_printed(cls):
    params = [Parameter(torch.randn(2, 3, requires_grad=True)) for _ in range(2)]
    for optim_input in optim_inputs(cls, skip=()):
        optimizer = cls(params, **optim_input.kwargs)
        text = repr(optimizer)
        assert text.startswith(cls.__name__) and "Parameter Group 0" in text


def test_non_empty_state(cls):
    model = torch.nn.Linear(5, 5, bias=False)
    inpt = torch.rand(2, 5)
    for optim_input in filter(functools.partial(applies, cls), INFO.optim_inputs_func(device=DEVICE)):
        optim = cls(model.parameters(), **kwargs_for(cls, optim_input.kwargs))
        optim.zero_grad()
        model(inpt).sum().backward()
        optim.step()
        assert len(optim.state) > 0
        for state in optim.state.values():
            assert len(state) > 0


# -- state_dict -----------------------------------------------------------------------------

def named(params, is_named):
    return [(f"name{i}", p) for i, p in enumerate(params)] if is_named else params


def without_param_names(state_dict):
    state_dict = deepcopy(state_dict)
    for group in state_dict["param_groups"]:
        group.pop("param_names", None)
    return state_dict


@pytest.mark.parametrize("is_named_optim0", [True, False])
@pytest.mark.parametrize("is_named_optim1", [True, False])
def test_state_dict_deterministic(cls, is_named_optim0, is_named_optim1):
    weight = Parameter(torch.randn(2, 3, requires_grad=True))
    input = torch.randn(3, requires_grad=True)

    def fwd_bwd(optim, w, i):
        optim.zero_grad()
        loss = w.mv(i).pow(2).sum()
        loss.backward()
        return loss

    for optim_input in optim_inputs(cls):
        optimizer = cls(named([weight], is_named_optim0), **optim_input.kwargs)
        closure = functools.partial(fwd_bwd, optimizer, weight, input)
        for _ in range(10):
            closure_then_step(optimizer, closure)
        with torch.no_grad():
            weight_c = Parameter(weight.clone())
        optimizer_c = cls(named([weight_c], is_named_optim1), **optim_input.kwargs)
        closure_c = functools.partial(fwd_bwd, optimizer_c, weight_c, input)
        optimizer_c.load_state_dict(deepcopy(optimizer.state_dict()))
        for _ in range(10):
            closure()
            closure_c()
            optimizer.step()
            optimizer_c.step()
            tc.assertEqual(weight, weight_c)
        tc.assertEqual(without_param_names(optimizer.state_dict()),
                       without_param_names(optimizer_c.state_dict()))
        # A group listed twice (PyTorch #36831: it must be represented as the first listing).
        optimizer_c.param_groups.extend(optimizer_c.param_groups)
        tc.assertEqual(without_param_names(optimizer.state_dict())["param_groups"][-1],
                       without_param_names(optimizer_c.state_dict())["param_groups"][-1])


def linear_model():
    torch.manual_seed(1)
    return torch.nn.Linear(10, 4, bias=False), torch.rand(10)


def fwd_bwd_model(optim, mod, i):
    optim.zero_grad()
    loss = mod(i).sum()
    loss.backward()
    return loss


def test_can_load_older_state_dict(cls):
    for optim_input in optim_inputs(cls):
        model, input = linear_model()
        optimizer = cls(model.parameters(), **optim_input.kwargs)
        for _ in range(3):
            fwd_bwd_model(optimizer, model, input)
            optimizer.step()
        old_state_dict = deepcopy(optimizer.state_dict())
        for group in old_state_dict["param_groups"]:
            for flag in INFO.not_og_supported_flags:
                group.pop(flag, None)
        optimizer.load_state_dict(old_state_dict)
        fwd_bwd_model(optimizer, model, input)
        optimizer.step()


@pytest.mark.parametrize("is_named_optim0", [True, False])
@pytest.mark.parametrize("is_named_optim1", [True, False])
def test_can_load_from_to_named_state_dict(cls, is_named_optim0, is_named_optim1):
    for optim_input in optim_inputs(cls):
        model, input = linear_model()
        params = model.named_parameters() if is_named_optim0 else model.parameters()
        optimizer = cls(params, **optim_input.kwargs)
        for _ in range(3):
            fwd_bwd_model(optimizer, model, input)
            optimizer.step()
        old_state_dict = deepcopy(optimizer.state_dict())
        params2 = model.named_parameters() if is_named_optim1 else model.parameters()
        optimizer2 = cls(params2, **optim_input.kwargs)
        optimizer2.load_state_dict(old_state_dict)
        fwd_bwd_model(optimizer2, model, input)
        optimizer2.step()
        if is_named_optim0 or is_named_optim1:
            tc.assertEqual(optimizer2.state_dict()["param_groups"][0]["param_names"],
                           [name for name, _ in model.named_parameters()])


@pytest.mark.parametrize("is_named_optim", [True, False])
def test_save_load_equality_with_weights_only(cls, is_named_optim):
    weight = Parameter(torch.randn(2, 3, requires_grad=True))
    input = torch.randn(3, requires_grad=True)

    def fwd_bwd(optim, w, i):
        optim.zero_grad()
        loss = w.mv(i).pow(2).sum()
        loss.backward()
        return loss

    for optim_input in optim_inputs(cls):
        optimizer = cls(named([weight], is_named_optim), **optim_input.kwargs)
        closure = functools.partial(fwd_bwd, optimizer, weight, input)
        for _ in range(3):
            optimizer.step(closure)
        sd = optimizer.state_dict()
        with tempfile.TemporaryFile() as f:
            torch.save(sd, f)
            f.seek(0)
            tc.assertEqual(torch.load(f), sd)
            f.seek(0)
            tc.assertEqual(torch.load(f, weights_only=True), sd)


def test_load_nontensor_step(cls):
    params = [Parameter(torch.randn(2, 3)) for _ in range(2)]
    for p in params:
        p.grad = torch.rand_like(p)
    for optim_input in optim_inputs(cls):
        optimizer = cls(params, **optim_input.kwargs)
        for _ in range(3):
            optimizer.step()
        state_dict = deepcopy(optimizer.state_dict())
        for p_state in state_dict["state"].values():
            if "step" in p_state and torch.is_tensor(p_state["step"]):
                p_state["step"] = p_state["step"].item()
        optimizer.load_state_dict(state_dict)
        optimizer.step()


def test_deepcopy_copies_all_public_attrs(cls):
    params = [Parameter(torch.randn(2, 3)) for _ in range(2)]
    for p in params:
        p.grad = torch.rand_like(p)

    def public(obj):
        return {k for k in obj.__dict__ if not k.startswith("_")}

    for optim_input in optim_inputs(cls):
        optimizer = cls(params, **optim_input.kwargs)
        for _ in range(3):
            optimizer.step()
        assert public(optimizer) == public(deepcopy(optimizer))


# -- hooks ----------------------------------------------------------------------------------

def _state_dict_pre_hook(optimizer):
    optimizer.state["test"] = 1


def _state_dict_post_hook(optimizer, state_dict):
    if "test" in state_dict["state"]:
        state_dict["state"].pop("test")
        state_dict["ran_state_dict_pre_hook"] = True
    else:
        state_dict["ran_state_dict_pre_hook"] = False
    return state_dict


def fresh(cls, optim_input):
    return cls([torch.rand(2, 3, requires_grad=True)], **optim_input.kwargs)


def test_state_dict_pre_hook(cls):
    for optim_input in optim_inputs(cls, skip=()):
        optim = fresh(cls, optim_input)
        optim.register_state_dict_pre_hook(_state_dict_pre_hook)
        assert optim.state_dict()["state"]["test"] == 1


def test_state_dict_post_hook(cls):
    for optim_input in optim_inputs(cls, skip=()):
        optim = fresh(cls, optim_input)
        optim.register_state_dict_post_hook(_state_dict_post_hook)
        assert optim.state_dict()["ran_state_dict_pre_hook"] is False


def test_state_dict_pre_post_hook(cls):
    for optim_input in optim_inputs(cls, skip=()):
        optim = fresh(cls, optim_input)
        optim.register_state_dict_pre_hook(_state_dict_pre_hook)
        optim.register_state_dict_post_hook(_state_dict_post_hook)
        state_dict = optim.state_dict()
        assert "test" not in state_dict["state"]
        assert state_dict["ran_state_dict_pre_hook"] is True


def _load_state_dict_pre_hook1(optimizer, state_dict):
    state_dict["param_groups"][0]["lr"] = 0.002


def _load_state_dict_pre_hook2(optimizer, state_dict):
    # Returns a new state dict (a deep copy), which must be the one loaded.
    my_state_dict = deepcopy(state_dict)
    my_state_dict["param_groups"][0]["lr"] = 0.003
    return my_state_dict


def _load_state_dict_post_hook(optimizer):
    optimizer.state["ran_load_state_dict_pre_hook2"] = optimizer.param_groups[0]["lr"] == 0.003
    optimizer.state["ran_load_state_dict_post_hook"] = True


def test_load_state_dict_pre_hook_and_prepend(cls):
    for optim_input in optim_inputs(cls, skip=()):
        optim = fresh(cls, optim_input)
        state_dict = optim.state_dict()
        optim.register_load_state_dict_pre_hook(_load_state_dict_pre_hook1)
        optim.load_state_dict(state_dict)
        tc.assertEqual(optim.param_groups[0]["lr"], 0.002)
        optim.register_load_state_dict_pre_hook(_load_state_dict_pre_hook2, prepend=True)
        optim.load_state_dict(state_dict)
        # prepended: hook2 runs first, hook1 then sets 0.002 in the dict hook2 returned
        tc.assertEqual(optim.param_groups[0]["lr"], 0.002)


def test_load_state_dict_post_hook(cls):
    for optim_input in optim_inputs(cls, skip=()):
        optim = fresh(cls, optim_input)
        optim.register_load_state_dict_post_hook(_load_state_dict_post_hook)
        optim.load_state_dict(optim.state_dict())
        assert not optim.state["ran_load_state_dict_pre_hook2"]
        assert optim.state["ran_load_state_dict_post_hook"]


def test_load_state_dict_pre_post_hook(cls):
    for optim_input in optim_inputs(cls, skip=()):
        optim = fresh(cls, optim_input)
        optim.register_load_state_dict_pre_hook(_load_state_dict_pre_hook2)
        optim.register_load_state_dict_post_hook(_load_state_dict_post_hook)
        optim.load_state_dict(optim.state_dict())
        assert optim.state["ran_load_state_dict_pre_hook2"]
        assert optim.state["ran_load_state_dict_post_hook"]


@pytest.mark.parametrize("register, start, end", [("register_step_post_hook", 2, 6),
                                                    ("register_step_pre_hook", 5, 9)])
def test_step_hook(cls, register, start, end):
    # torch's test_step_post_hook and test_step_pre_hook: each step runs the hook (+2) until its
    # handle is removed.
    data = 0

    def hook(opt, args, kwargs):
        nonlocal data
        data += 2

    params = [torch.tensor([[1.0, 1.0]])]
    for optim_input in optim_inputs(cls, skip=()):
        optim = cls(params, **optim_input.kwargs)
        data = start
        handle = getattr(optim, register)(hook)
        optim.step()
        optim.step()
        assert data == end
        handle.remove()
        optim.step()
        assert data == end


def test_step_all_hooks(cls):
    data = []
    params = [torch.tensor([[1.0, 1.0]])]
    for optim_input in optim_inputs(cls, skip=()):
        optim = cls(params, **optim_input.kwargs)
        optim2 = SGD(params)
        data = []
        handles = [
            register_optimizer_step_pre_hook(lambda *_: data.append(0)),
            register_optimizer_step_post_hook(lambda *_: data.append(5)),
            optim.register_step_pre_hook(lambda *_: data.append(1)),
            optim.register_step_post_hook(lambda *_: data.append(2)),
            optim2.register_step_pre_hook(lambda *_: data.append(1)),
            optim2.register_step_post_hook(lambda *_: data.append(2)),
        ]
        try:
            optim.step()
            assert data == [0, 1, 2, 5]
            optim2.step()
            assert data == [0, 1, 2, 5] * 2
            optim.step()
            assert data == [0, 1, 2, 5] * 3
        finally:
            for handle in handles:
                handle.remove()
        optim.step()
        optim2.step()
        assert data == [0, 1, 2, 5] * 3
