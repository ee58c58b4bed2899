"""fogo.FOGO / fogo.Muon (Python, param groups synced into C++ every step) against the same
optimizer driven by a loop in C++ alone (fogo._testing.cpp_trajectory): the same parameters after
every step, bit for bit, with several groups, per-group options, a changing lr and task
boundaries."""

import pytest
import torch

import fogo
import fogo._testing  # the C++-only harness, built with the tests (python/CMakeLists.txt)
from conftest import randn


def run_python(cls, groups, grads, boundaries=(), lr_factors=()):
    params = [[p.detach().clone().requires_grad_(True) for p in ps] for ps, _ in groups]
    opt = cls([{"params": ps, **opts} for ps, (_, opts) in zip(params, groups)])
    base = [g["lr"] for g in opt.param_groups]
    out = []
    for t, step_grads in enumerate(grads):
        if t in boundaries:
            opt.task_boundary()
        if t < len(lr_factors):
            for g, b in zip(opt.param_groups, base):
                g["lr"] = b * lr_factors[t]
        for ps, gs in zip(params, step_grads):
            for p, gr in zip(ps, gs):
                p.grad = gr.clone()
        opt.step()
        opt.zero_grad()
        out.append([p.detach().clone() for ps in params for p in ps])
    return out


def assert_same_trajectory(a, b):
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b)):
        for k, (p, q) in enumerate(zip(x, y)):
            assert torch.equal(p, q), f"step {t}, parameter {k}: max diff {(p - q).abs().max()}"


def make_grads(gen, shapes, steps):
    return [[[randn(gen, *s) for s in group] for group in shapes] for _ in range(steps)]


def test_fogo_python_equals_cpp(gen):
    shapes = [[(16, 24), (16, 24), (24, 8)], [(12, 20)]]
    groups = [
        ([randn(gen, *s, scale=0.1) for s in shapes[0]], {"lr": 0.02, "codebook_size": 8, "proj_dim": 8}),
        ([randn(gen, *s, scale=0.1) for s in shapes[1]],
         {"lr": 0.01, "codebook_size": 4, "proj_dim": 6, "weight_decay": 0.1, "ns_dtype": torch.float32,
          "seed": 7, "freeze_per_task": 2}),
    ]
    grads = make_grads(gen, shapes, 8)
    boundaries, factors = [4], [1.0, 1.0, 0.5, 0.5, 0.25, 1.0, 2.0, 1.0]
    py = run_python(fogo.FOGO, groups, grads, boundaries, factors)
    cpp = fogo._testing.cpp_trajectory("FOGO", groups, grads, boundaries, factors)
    assert_same_trajectory(py, cpp)
    # And the optimizer did move the parameters (by different amounts per lr).
    assert not torch.equal(py[-1][0], groups[0][0][0])


def test_muon_python_equals_cpp(gen):
    shapes = [[(16, 24), (8, 3, 3, 3)], [(12, 20)]]
    groups = [
        ([randn(gen, *s) for s in shapes[0]], {"lr": 0.02}),
        ([randn(gen, *s) for s in shapes[1]], {"lr": 0.05, "nesterov": False, "adjust_lr_fn": "match_rms_adamw"}),
    ]
    grads = make_grads(gen, shapes, 5)
    factors = [1.0, 0.5, 0.1, 1.0, 3.0]
    assert_same_trajectory(run_python(fogo.Muon, groups, grads, lr_factors=factors),
                           fogo._testing.cpp_trajectory("Muon", groups, grads, lr_factors=factors))


def test_steps_use_the_same_tensors(gen):
    # The C++ step writes into the Python parameters in place: no copies in between.
    w = randn(gen, 8, 8).requires_grad_(True)
    ptr = w.data_ptr()
    opt = fogo.FOGO([w], codebook_size=4, proj_dim=4)
    w.grad = randn(gen, 8, 8)
    before = w.detach().clone()
    opt.step()
    assert w.data_ptr() == ptr and not torch.equal(w.detach(), before)
