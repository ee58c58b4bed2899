"""Newton-Schulz coefficient lists as data (the option ns_coefficient_schedule) and Muon's
extra_scale_factor, from Python: against torch.optim.Muon and an independent float64 chain,
refused before anything changes, carried by state_dict (docs/muon.md)."""

import copy

import pytest
import torch

import fogo

QUINTIC = (3.4445, -4.7750, 2.0315)
CLOSING = (2.0, -1.5, 0.5)  # DeepSeek-V4's last two iterations


def params(seed=0, shapes=((12, 20), (16, 8))):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen).requires_grad_(True) for s in shapes]


def grads(seed, shapes=((12, 20), (16, 8)), steps=4):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=gen) for s in shapes] for _ in range(steps)]


def run(opt, ps, gs):
    for step in gs:
        for p, g in zip(ps, step):
            p.grad = g.clone()
        opt.step()


def test_named_lists_are_the_cpp_ones():
    named = fogo.optim.ns_schedules()
    assert list(named) == ["keller_jordan", "polar_express", "tuned5", "deepseek_v4", "cans",
                           "cubic5"]
    assert named["deepseek_v4"]["rows"] == [QUINTIC] * 8 + [CLOSING] * 2
    assert named["keller_jordan"]["rows"] == [QUINTIC]
    assert all(s["source"] and len(s["rows"]) <= s["steps"] for s in named.values())


def test_a_constant_list_is_torch_muons_ns_coefficients_bit_for_bit():
    # torch.optim.Muon with other ns_coefficients is the truth for a one-row list (the row
    # repeats): the same bits with ns_dtype bf16 (fogo.Muon's torch arithmetic).
    a, b = params(), params()
    ref = torch.optim.Muon(a, lr=0.02, ns_coefficients=CLOSING)
    opt = fogo.Muon(b, lr=0.02, ns_dtype=torch.bfloat16, ns_coefficient_schedule=[CLOSING])
    run(ref, a, grads(1))
    run(opt, b, grads(1))
    for p, q in zip(a, b):
        assert torch.equal(p, q)


def reference_step(p, buf, g, schedule, steps, lr, wd, momentum=0.95, scale=1.0):
    """torch.optim.Muon's step written out in float64 with per-iteration coefficients (iteration
    k runs schedule[min(k, len - 1)]), independent of fogo's C++."""
    buf.mul_(momentum).add_(g, alpha=1 - momentum)
    u = g.lerp(buf, momentum)  # Nesterov
    x = u.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / max(x.norm().item(), 1e-7)
    for k in range(steps):
        a, b, c = schedule[min(k, len(schedule) - 1)]
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    x = x.T if tall else x
    ratio = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
    return p * (1 - lr * wd) - lr * ratio * scale * x


def test_a_two_phase_list_follows_an_independent_float64_chain():
    schedule = [QUINTIC] * 3 + [CLOSING] * 2
    ps = params(shapes=((12, 20), (20, 12)))
    start = [p.detach().double().clone() for p in ps]
    opt = fogo.Muon(ps, lr=0.02, weight_decay=0.1, ns_dtype=torch.float32, ns_steps=5,
                    ns_coefficient_schedule=schedule)
    plain = fogo.Muon(params(shapes=((12, 20), (20, 12))), lr=0.02, weight_decay=0.1,
                      ns_dtype=torch.float32)
    gs = grads(2, shapes=((12, 20), (20, 12)), steps=3)
    refs, bufs = start, [torch.zeros_like(p) for p in start]
    for step in gs:
        refs = [reference_step(p, b, g.double(), schedule, 5, 0.02, 0.1)
                for p, b, g in zip(refs, bufs, step)]
    run(opt, ps, gs)
    run(plain, plain.param_groups[0]["params"], gs)
    for p, r, q in zip(ps, refs, plain.param_groups[0]["params"]):
        torch.testing.assert_close(p.double(), r, rtol=0, atol=2e-6)
        assert (p - q).abs().max() > 1e-4  # the list matters: the constant quintic differs


@pytest.mark.parametrize("cls", [fogo.Muon, fogo.FOGO])
def test_bad_lists_are_refused_naming_the_option_before_anything_changes(cls):
    name = "ns_coefficient_schedule"
    with pytest.raises(TypeError, match=f"option '{name}' must be a list of \\(a, b, c\\) rows"):
        cls(params(), **{name: [(2.0, -1.5)]})
    with pytest.raises(TypeError, match=f"option '{name}'"):
        cls(params(), **{name: (2.0, -1.5, 0.5)})  # one row, not a list of rows
    with pytest.raises(RuntimeError, match=f"option '{name}' must hold finite numbers"):
        cls(params(), **{name: [QUINTIC, (2.0, float("nan"), 0.5)]})
    with pytest.raises(RuntimeError, match=f"option '{name}' lists 10 iterations, more than"):
        cls(params(), **{name: fogo.optim.ns_schedules()["deepseek_v4"]["rows"]})
    # Set by hand into a group: the step refuses it, and nothing changes.
    ps = params()
    opt = cls(ps, lr=0.02)
    run(opt, ps, grads(3, steps=1))
    before = copy.deepcopy(opt.state_dict())
    values = [p.detach().clone() for p in ps]
    for bad, error in (([(1.0, float("inf"), 0.0)], RuntimeError), ([[1.0, 2.0]], TypeError)):
        opt.param_groups[0][name] = bad
        for p, g in zip(ps, grads(4, steps=1)[0]):
            p.grad = g
        with pytest.raises(error, match=name):
            opt.step()
        assert all(torch.equal(p, v) for p, v in zip(ps, values))
    opt.param_groups[0][name] = []
    after = opt.state_dict()
    for k, st in before["state"].items():
        for key, v in st.items():
            assert torch.equal(after["state"][k][key], v), key


@pytest.mark.parametrize("cls", [fogo.Muon, fogo.FOGO])
def test_the_list_travels_in_state_dict_and_resumes_bit_for_bit(cls):
    options = dict(lr=0.02, ns_steps=5) if cls is fogo.Muon else dict(lr=0.01, proj_dim=8,
                                                                       codebook_size=4)
    schedule = fogo.optim.ns_schedules()["cans"]["rows"]
    gs = grads(5, steps=6)
    full = params()
    opt = cls(full, ns_coefficient_schedule=schedule, **options)
    run(opt, full, gs)
    first = params()
    opt1 = cls(first, ns_coefficient_schedule=schedule, **options)
    run(opt1, first, gs[:3])
    sd = copy.deepcopy(opt1.state_dict())
    assert sd["param_groups"][0]["ns_coefficient_schedule"] == schedule
    second = [p.detach().clone().requires_grad_(True) for p in first]
    opt2 = cls(second, **options)  # the list comes from the state_dict
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["ns_coefficient_schedule"] == schedule
    run(opt2, second, gs[3:])
    for p, q in zip(full, second):
        assert torch.equal(p, q)


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_extra_scale_factor_multiplies_the_adjusted_lr_and_leaves_the_decay(adjust):
    # torch.optim.Muon's pending extra_scale_factor (and Megatron-LM's): lr * adjusted_ratio *
    # extra_scale_factor. Without decay it is torch.optim.Muon at lr * s (the momentum does not
    # read lr); the decay keeps lr: p (1 - lr wd), as the float64 reference writes it.
    s = 0.37
    a, b = params(), params()
    ref = torch.optim.Muon(a, lr=0.02 * s, weight_decay=0.0, adjust_lr_fn=adjust)
    opt = fogo.Muon(b, lr=0.02, weight_decay=0.0, adjust_lr_fn=adjust, extra_scale_factor=s,
                    ns_dtype=torch.bfloat16)
    run(ref, a, grads(6))
    run(opt, b, grads(6))
    for p, q in zip(a, b):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
    # With decay, one step against the float64 reference (ns_dtype fp32).
    ps = params(shapes=((12, 20),))
    start = ps[0].detach().double().clone()
    g = grads(7, shapes=((12, 20),), steps=1)
    opt = fogo.Muon(ps, lr=0.02, weight_decay=0.1, extra_scale_factor=s, ns_dtype=torch.float32)
    run(opt, ps, g)
    want = reference_step(start, torch.zeros_like(start), g[0][0].double(), [QUINTIC], 5, 0.02,
                          0.1, scale=s)
    torch.testing.assert_close(ps[0].double(), want, rtol=0, atol=2e-6)
    unscaled = reference_step(start, torch.zeros_like(start), g[0][0].double(), [QUINTIC], 5,
                              0.02, 0.1)
    assert (want - unscaled).abs().max() > 1e-3  # the factor shows
    with pytest.raises(RuntimeError, match="option 'extra_scale_factor'"):
        fogo.Muon(params(), extra_scale_factor=-1.0)
