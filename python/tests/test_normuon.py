"""fogo.Muon(normuon=True), NorMuon from Python (docs/muon.md, "NorMuon"): the C++ fogo::Muon's
step bit for bit (fogo._testing.cpp_trajectory), its equations against a float64 reference over
torch.optim.Muon's Newton-Schulz, the second moment in opt.state and state_dict (a resumed run
equal to the uninterrupted one, torch.optim.Muon's checkpoints, switching normuon between save and
load), and the refusals of a second moment that does not fit."""

import copy
import math

import pytest
import torch

import fogo
import fogo._testing  # the C++-only harness, built with the tests (python/CMakeLists.txt)
from conftest import randn
from test_parity import assert_same_trajectory, make_grads, run_python
from test_state_dict import assert_state_equal, save_load

SHAPES = [(12, 20), (20, 6), (8, 3, 2, 2)]  # wide, tall, a conv weight as its [8, 12] view


def rows_scaled(gen, shape, dtype=torch.float32):
    """A gradient whose rows differ in scale (what NorMuon evens out)."""
    scale = torch.linspace(0.1, 3.0, shape[0], dtype=dtype).reshape(-1, *[1] * (len(shape) - 1))
    return randn(gen, *shape).to(dtype) * scale


def clone(params):
    return [p.detach().clone().requires_grad_(True) for p in params]


def train(opt, params, grads):
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()


# -- the step ----------------------------------------------------------------------------------

def test_python_equals_cpp(gen):
    # Three groups: NorMuon with fp32 Newton-Schulz and its own beta2 and eps, NorMuon with bf16
    # and without Nesterov under another lr rule, and plain Muon beside them.
    shapes = [[(16, 24), (8, 3, 3, 3)], [(24, 12)], [(12, 20)]]
    groups = [
        ([randn(gen, *s) for s in shapes[0]],
         {"lr": 0.02, "normuon": True, "normuon_beta2": 0.9, "normuon_eps": 1e-8,
          "ns_dtype": torch.float32}),
        ([randn(gen, *s) for s in shapes[1]],
         {"lr": 0.05, "normuon": True, "nesterov": False, "adjust_lr_fn": "match_rms_adamw",
          "ns_dtype": torch.bfloat16}),
        ([randn(gen, *s) for s in shapes[2]], {"lr": 0.02}),
    ]
    grads = make_grads(gen, shapes, 5)
    factors = [1.0, 0.5, 0.1, 1.0, 3.0]
    py = run_python(fogo.Muon, groups, grads, lr_factors=factors)
    assert_same_trajectory(py, fogo._testing.cpp_trajectory("Muon", groups, grads,
                                                            lr_factors=factors))
    # And NorMuon changed the step (the comparison has teeth).
    plain = [(ps, {k: v for k, v in o.items() if not k.startswith("normuon")}) for ps, o in groups]
    plain_py = run_python(fogo.Muon, plain, grads, lr_factors=factors)
    assert not torch.equal(plain_py[-1][0], py[-1][0])


def lr_factor(rule, A, B):
    return {"original": math.sqrt(max(1.0, A / B)), "match_rms_adamw": 0.2 * math.sqrt(max(A, B)),
            "spectral": math.sqrt(A / B)}[rule]


def reference_step(p, buf, v, g, group):
    """One NorMuon step of float64 ``p`` (its momentum ``buf``, second moment ``v``) in place:
    torch.optim.Muon's momentum and Newton-Schulz (bf16, bit for bit fogo's with
    ns_dtype=torch.bfloat16), then NorMuon's equations written out in float64. Returns the
    normalized update."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    A, B = p.shape[0], p.numel() // p.shape[0]
    buf.lerp_(g, 1 - group["momentum"])
    U = g.lerp(buf, group["momentum"]) if group["nesterov"] else buf
    O = _zeropower_via_newtonschulz(U.reshape(A, B), group["ns_coefficients"], group["ns_steps"],
                                    group["eps"]).double()
    b2, eps = group["normuon_beta2"], group["normuon_eps"]
    v.copy_(b2 * v + (1 - b2) * (O * O).sum(1) / B)
    hat = O / (v.sqrt() + eps).reshape(A, 1)
    update = hat * (O.norm() / (hat.norm() + eps))
    lr = group["lr"]
    p.mul_(1 - lr * group["weight_decay"])
    p.sub_(lr * lr_factor(group["adjust_lr_fn"], A, B) * update.reshape(p.shape))
    return O, update


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("rule", ["original", "match_rms_adamw", "spectral"])
def test_steps_follow_the_equations_in_float64(gen, rule):
    init = [randn(gen, *s).double() for s in SHAPES]
    params = clone(init)
    opt = fogo.Muon(params, lr=0.02, weight_decay=0.1, momentum=0.9, ns_dtype=torch.bfloat16,
                    adjust_lr_fn=rule, normuon=True, normuon_beta2=0.9)
    group = opt.param_groups[0]
    ref = [p.clone() for p in init]
    bufs = [torch.zeros_like(p) for p in init]
    vs = [torch.zeros(p.shape[0], dtype=torch.float64) for p in init]
    for step in range(5):
        gs = [rows_scaled(gen, s, torch.float64) for s in SHAPES]
        for k, g in enumerate(gs):
            O, update = reference_step(ref[k], bufs[k], vs[k], g, group)
            assert rel(update, O) > 0.05, f"step {step}, parameter {k}: NorMuon changed nothing"
            params[k].grad = g.clone()
        opt.step()
        for k, p in enumerate(params):
            v = opt.state[p]["second_moment"]
            assert v.dtype == torch.float64 and v.shape == (p.shape[0],)  # fp64 for fp64
            assert rel(v, vs[k]) < 1e-12, f"step {step}, second moment {k}"
            assert rel(p.detach(), ref[k]) < 1e-12, f"step {step}, parameter {k}"


def test_second_moment_is_state_from_construction(gen):
    params = [randn(gen, *s).requires_grad_(True) for s in SHAPES]
    params.append(randn(gen, 6, 10).to(torch.bfloat16).requires_grad_(True))
    opt = fogo.Muon(params, lr=0.02, normuon=True)
    held = []
    for p in params:  # zeros before the first step, one per row, fp32 (a bf16 parameter too)
        v = opt.state[p]["second_moment"]
        assert v.shape == (p.shape[0],) and v.dtype == torch.float32 and not v.any()
        held.append(v)
    train(opt, params, [[rows_scaled(gen, p.shape).to(p.dtype) for p in params]])
    for p, v in zip(params, held):
        assert opt.state[p]["second_moment"] is v and (v > 0).all()  # written in place
    assert sorted(opt.state_dict()["state"][0]) == ["momentum_buffer", "second_moment"]
    # normuon off: no second moment at all, as in C++.
    plain = fogo.Muon(clone(params[:1]), lr=0.02)
    assert list(plain.state[plain.param_groups[0]["params"][0]]) == ["momentum_buffer"]


# -- checkpoints -------------------------------------------------------------------------------

def normuon_opt(params, **options):
    return fogo.Muon([{"params": params[:2], "normuon_beta2": 0.8}, {"params": params[2:]}],
                     lr=0.02, normuon=True, **options)


def test_state_dict_resumes_bitwise(gen):
    init = [randn(gen, *s, scale=0.1) for s in SHAPES]
    grads = [[rows_scaled(gen, s) for s in SHAPES] for _ in range(8)]
    full = clone(init)
    opt = normuon_opt(full)
    train(opt, full, grads)

    first = clone(init)
    opt1 = normuon_opt(first)
    train(opt1, first, grads[:4])
    sd = save_load(opt1.state_dict())
    assert all(st["second_moment"].any() for st in sd["state"].values())
    second = clone(first)
    # Made without NorMuon: normuon and beta2 come with the checkpoint's options.
    opt2 = fogo.Muon([{"params": second[:2]}, {"params": second[2:]}], lr=0.02)
    opt2.load_state_dict(sd)
    assert [g["normuon"] for g in opt2.param_groups] == [True, True]
    assert [g["normuon_beta2"] for g in opt2.param_groups] == [0.8, 0.95]
    train(opt2, second, grads[4:])
    for k, (p, q) in enumerate(zip(full, second)):
        assert torch.equal(p, q), f"parameter {k}"
    assert_state_equal(opt.state_dict(), opt2.state_dict())


def test_torch_muon_checkpoint_starts_the_second_moment_afresh(gen):
    # torch.optim.Muon's checkpoint (momenta, no second moment, no normuon option) into
    # fogo.Muon(normuon=True): the momenta load, the second moments start at zeros, and the run
    # goes on as fogo.Muon switching NorMuon on at that step.
    init = [randn(gen, *s, scale=0.1) for s in SHAPES[:2]]
    grads = [[rows_scaled(gen, s) for s in SHAPES[:2]] for _ in range(6)]
    theirs = clone(init)
    t = torch.optim.Muon(theirs, lr=0.02)
    train(t, theirs, grads[:3])
    ours = clone(theirs)
    opt = fogo.Muon(ours, lr=0.02, ns_dtype=torch.bfloat16, normuon=True)
    opt.load_state_dict(copy.deepcopy(t.state_dict()))
    for p, q in zip(ours, theirs):
        assert torch.equal(opt.state[p]["momentum_buffer"], t.state[q]["momentum_buffer"])
        assert not opt.state[p]["second_moment"].any()
    assert opt.param_groups[0]["normuon"] is True
    train(opt, ours, grads[3:])

    switched = clone(init)
    s = fogo.Muon(switched, lr=0.02, ns_dtype=torch.bfloat16)
    train(s, switched, grads[:3])
    assert "second_moment" not in s.state[switched[0]]
    s.param_groups[0]["normuon"] = True  # made (zeros) at the next step, as C++ does
    train(s, switched, grads[3:])
    for p, q in zip(ours, switched):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["second_moment"], s.state[q]["second_moment"])


def test_switching_off_keeps_the_second_moment_and_saves_it(gen):
    params = [randn(gen, *s, scale=0.1).requires_grad_(True) for s in SHAPES]
    grads = [[rows_scaled(gen, s) for s in SHAPES] for _ in range(6)]
    opt = normuon_opt(params, ns_dtype=torch.float32)
    train(opt, params, grads[:2])
    kept = [opt.state[p]["second_moment"].clone() for p in params]
    for g in opt.param_groups:
        g["normuon"] = False
    plain = fogo.Muon(clone(params), lr=0.02, ns_dtype=torch.float32)
    plain.load_state_dict({"state": {i: {"momentum_buffer": opt.state[p]["momentum_buffer"].clone()}
                                     for i, p in enumerate(params)},
                           "param_groups": plain.state_dict()["param_groups"]})
    train(opt, params, grads[2:4])
    train(plain, plain.param_groups[0]["params"], grads[2:4])
    for p, q, v in zip(params, plain.param_groups[0]["params"], kept):
        assert torch.equal(p, q)  # Muon's step
        assert torch.equal(opt.state[p]["second_moment"], v)  # untouched
    # Saved with normuon off: loads with it off and the second moments kept; switched back on,
    # the run continues from them.
    sd = save_load(opt.state_dict())
    other = clone(params)
    opt2 = normuon_opt(other, ns_dtype=torch.float32)
    opt2.load_state_dict(sd)
    assert [g["normuon"] for g in opt2.param_groups] == [False, False]
    for o in (opt, opt2):
        for g in o.param_groups:
            g["normuon"] = True
    train(opt, params, grads[4:])
    train(opt2, other, grads[4:])
    for p, q, v in zip(params, other, kept):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["second_moment"], opt2.state[q]["second_moment"])
        assert not torch.equal(opt.state[p]["second_moment"], v)


@pytest.mark.parametrize("source", ["torch", "fogo"])
def test_dcp_checkpoint_without_second_moments_loads_partially(gen, tmp_path, source):
    # DCP refuses a key the checkpoint lacks; with allow_partial_load the fresh zeros stay, and
    # the checkpoint's options apply as in load_state_dict (torch's has no normuon: it stays on).
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    net = torch.nn.Linear(10, 6, bias=False)
    opt = (torch.optim.Muon if source == "torch" else fogo.Muon)(net.parameters(), lr=0.02)
    train(opt, [net.weight], [[rows_scaled(gen, (6, 10))] for _ in range(2)])
    dcp.save({"optim": get_optimizer_state_dict(net, opt)}, checkpoint_id=str(tmp_path))
    net2 = torch.nn.Linear(10, 6, bias=False)
    opt2 = fogo.Muon(net2.parameters(), lr=0.02, normuon=True)
    target = {"optim": get_optimizer_state_dict(net2, opt2)}
    with pytest.raises(BaseException) as refused:  # DCP's CheckpointException
        dcp.load(target, checkpoint_id=str(tmp_path))
    assert "second_moment" in repr(refused.value.failures)  # each rank's error
    target = {"optim": get_optimizer_state_dict(net2, opt2)}
    dcp.load(target, checkpoint_id=str(tmp_path),
             planner=DefaultLoadPlanner(allow_partial_load=True))
    set_optimizer_state_dict(net2, opt2, target["optim"])
    st = opt2.state[net2.weight]
    assert torch.equal(st["momentum_buffer"], opt.state[net.weight]["momentum_buffer"])
    assert not st["second_moment"].any()
    assert opt2.param_groups[0]["normuon"] is (source == "torch")


# -- refusals ----------------------------------------------------------------------------------

NAMED = r"second_moment for parameter 1 of group 0 \(shape \[12, 4\]\)"


@pytest.mark.parametrize("bad, match", [
    (lambda v: torch.zeros(v.shape[0] + 1), NAMED + r" has shape \[13\]"),
    (lambda v: torch.zeros(v.shape[0], 2), NAMED + r" has shape \[12, 2\]"),
    (lambda v: torch.full_like(v, float("nan")), NAMED),
    (lambda v: torch.full_like(v, float("inf")), NAMED),
])
def test_a_second_moment_that_does_not_fit_is_refused(gen, bad, match):
    params = [randn(gen, *s, scale=0.1).requires_grad_(True) for s in [(6, 10), (12, 4)]]
    opt = fogo.Muon(params, lr=0.02, normuon=True)
    train(opt, params, [[rows_scaled(gen, p.shape) for p in params] for _ in range(2)])
    before = copy.deepcopy(opt.state_dict())
    sd = copy.deepcopy(before)
    sd["state"][1]["second_moment"] = bad(sd["state"][1]["second_moment"])
    sd["param_groups"][0]["lr"] = 0.5  # nothing of a refused checkpoint applies
    with pytest.raises(RuntimeError, match=match):
        opt.load_state_dict(sd)
    assert_state_equal(before, opt.state_dict())
    # Put into opt.state by hand: refused at the step, naming it, before anything changes.
    opt.state[params[1]]["second_moment"] = torch.zeros(5)
    weights = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=r"opt.state\[p\]\['second_moment'\] of parameter 1 of "
                                         r"group 0 \(shape \[12, 4\]\) has shape \[5\], expected "
                                         r"\[12\]"):
        opt.step()
    assert all(torch.equal(p, w) for p, w in zip(params, weights))
    opt.state[params[1]]["second_moment"] = torch.zeros(12, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'second_moment'.* has dtype Double, expected Float"):
        opt.step()
    assert all(torch.equal(p, w) for p, w in zip(params, weights))


# -- FOGO ---------------------------------------------------------------------------------------

def test_fogo_normuon_state_travels_and_resumes_bitwise(gen):
    """fogo.FOGO(normuon=True) (NorMuon on FOGO's final update, docs/algorithm.md): the second
    moment is opt.state's from construction ([rows], fp32), a state_dict resumes bit for bit
    (loaded into a FOGO made without NorMuon: the option comes with the checkpoint), the
    normalization moves the parameters, and one that does not fit is refused."""
    opts = {"lr": 0.01, "codebook_size": 6, "proj_dim": 8}
    init = [randn(gen, *s, scale=0.1) for s in SHAPES]
    grads = [[rows_scaled(gen, s) for s in SHAPES] for _ in range(6)]
    full, plain = clone(init), clone(init)
    opt = fogo.FOGO(full, normuon=True, **opts)
    assert [tuple(opt.state[p]["second_moment"].shape) for p in full] == [(12,), (20,), (8,)]
    assert all(opt.state[p]["second_moment"].dtype == torch.float32 for p in full)
    train(opt, full, grads)
    train(fogo.FOGO(plain, **opts), plain, grads)
    assert all((p - q).abs().max() > 1e-6 for p, q in zip(full, plain))

    first = clone(init)
    opt1 = fogo.FOGO(first, normuon=True, **opts)
    train(opt1, first, grads[:3])
    sd = save_load(opt1.state_dict())
    assert all(st["second_moment"].any() for st in sd["state"].values())
    second = clone(first)
    opt2 = fogo.FOGO(second, **opts)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["normuon"]
    train(opt2, second, grads[3:])
    for k, (p, q) in enumerate(zip(full, second)):
        assert torch.equal(p, q), f"parameter {k}"
    bad = copy.deepcopy(sd)
    bad["state"][0]["second_moment"] = torch.zeros(5)
    with pytest.raises((RuntimeError, ValueError), match="second_moment"):
        fogo.FOGO(clone(first), **opts).load_state_dict(bad)
