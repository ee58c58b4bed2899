"""fogo.Muon against PyTorch's own torch.optim.Muon: the same parameters after every step, bit
for bit on the CPU (the C++ optimizer reproduces PyTorch's op sequence), with fogo's Newton-Schulz
in bf16 as torch.optim.Muon's always is (fogo's default, "auto", is fp32 on CPUs where bf16 is
slower)."""

import pytest
import torch

import fogo
from conftest import randn


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"lr": 0.05, "weight_decay": 0.0, "nesterov": False},
        {"lr": 0.01, "momentum": 0.9, "ns_steps": 3, "adjust_lr_fn": "match_rms_adamw"},
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_muon_matches_torch(gen, options, dtype):
    # bf16 parameters too: fogo's decay used to be one _foreach_mul_, which on the CPU rounds a
    # bf16 product differently from torch's per-parameter mul_.
    shapes = [(32, 16), (16, 48), (32, 16), (7, 5)]
    if dtype == torch.bfloat16 and options.get("nesterov") is False and TORCH_BF16_BUFFER_BUG:
        torch_bf16_momentum_bug(gen, options)
        return
    init = [randn(gen, *s).to(dtype) for s in shapes]
    ours = [p.clone().requires_grad_(True) for p in init]
    theirs = [p.clone().requires_grad_(True) for p in init]
    a = fogo.Muon(ours, ns_dtype=torch.bfloat16, **options)
    b = torch.optim.Muon(theirs, **options)
    for step in range(6):
        for p, q, s in zip(ours, theirs, shapes):
            g = randn(gen, *s).to(dtype)
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
        for k, (p, q) in enumerate(zip(ours, theirs)):
            assert torch.equal(p, q), f"step {step}, parameter {k}"
    assert not torch.equal(ours[0], init[0])
    # The momentum buffers too, under torch.optim.Muon's state_dict key.
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"])


@pytest.mark.parametrize("lr_dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_tensor_lr_matches_torch(gen, lr_dtype, dtype, adjust_lr_fn):
    # torch.optim.Muon computes 1 - lr * weight_decay and lr * ratio with 0-d tensor ops in a
    # Tensor lr's dtype (a float32 lr: both rounded to float32). fogo's step computed them in
    # double from the tensor's value: float64 parameters off by up to 3.6e-8 with
    # lr=torch.tensor(1e-3), float32 ones by an ulp now and then, bf16 lrs far off. The lr tensor
    # is changed in place between steps (as a scheduler does) and has shape [1] in one group.
    shapes = [(24, 8), (8, 24), (12, 12), (40, 3)]
    init = [randn(gen, *s).to(dtype) for s in shapes]
    ours = [p.clone().requires_grad_(True) for p in init]
    theirs = [p.clone().requires_grad_(True) for p in init]

    def groups(params):
        return [{"params": params[:3], "lr": torch.tensor(1e-3, dtype=lr_dtype)},
                {"params": params[3:], "lr": torch.tensor([0.02], dtype=lr_dtype)}]

    options = {"adjust_lr_fn": adjust_lr_fn, "weight_decay": 0.13}
    a, b = fogo.Muon(groups(ours), **options), torch.optim.Muon(groups(theirs), **options)
    for step in range(12):
        lr = torch.rand((), generator=gen).item() * 0.05
        for opt in (a, b):
            opt.param_groups[0]["lr"].fill_(lr)
        for p, q, s in zip(ours, theirs, shapes):
            g = randn(gen, *s).to(dtype)
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
        for k, (p, q) in enumerate(zip(ours, theirs)):
            assert torch.equal(p, q), f"step {step}, parameter {k}"
    assert a.param_groups[0]["lr"].dtype == lr_dtype  # the group keeps the user's tensor


# torch.optim.Muon's bf16 momentum bug (below): in torch 2.11; fixed in 2.15, whose Newton-Schulz
# rounds a copy (`grad.to(dtype=torch.bfloat16, copy=True)`), where fogo matches it bit for bit.
# The versions between were not tested.
TORCH_BF16_BUFFER_BUG = tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])) < (2, 15)


def torch_bf16_momentum_bug(gen, options):
    """torch.optim.Muon (2.11) with bf16 parameters and nesterov=False divides its own momentum
    buffer by its norm in place: `grad.bfloat16()` returns the buffer itself and Newton-Schulz's
    `div_` normalises it. fogo does not copy that: its buffer stays the momentum recursion."""
    p = randn(gen, 16, 24).to(torch.bfloat16)
    ours, theirs = p.clone().requires_grad_(True), p.clone().requires_grad_(True)
    a = fogo.Muon([ours], ns_dtype=torch.bfloat16, **options)
    b = torch.optim.Muon([theirs], **options)
    g = randn(gen, 16, 24).to(torch.bfloat16)
    ours.grad, theirs.grad = g.clone(), g.clone()
    a.step()
    b.step()
    expected = torch.zeros_like(g).lerp_(g, 1 - options.get("momentum", 0.95))
    assert torch.equal(a.state[ours]["momentum_buffer"], expected)
    assert not torch.equal(b.state[theirs]["momentum_buffer"], expected)  # the bug, as of 2.11
    assert abs(b.state[theirs]["momentum_buffer"].float().norm().item() - 1) < 0.01


def test_muon_defaults_match_torch():
    import inspect

    theirs = inspect.signature(torch.optim.Muon.__init__).parameters
    ours = fogo._C.Muon.default_options()
    for name in ("lr", "weight_decay", "momentum", "nesterov", "eps", "ns_steps"):
        assert ours[name] == theirs[name].default, name
    assert ours["ns_coefficients"] == pytest.approx(theirs["ns_coefficients"].default)
