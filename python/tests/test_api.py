"""The torch.optim surface: options and their defaults, param groups, closures, schedulers,
errors as Python exceptions, telemetry, task boundaries, presets and the hybrid split."""

import inspect
import math

import pytest
import torch

import fogo
import fogo._testing  # the C++-only harness, built with the tests (python/CMakeLists.txt)
from conftest import ROOT, randn


def mat(gen, *shape):
    return randn(gen, *shape, scale=0.1).requires_grad_(True)


# -- options ---------------------------------------------------------------------------------

def test_fogo_defaults_are_the_documented_ones():
    # docs/algorithm.md's defaults (docs/algorithm.md's options table), written out independently.
    d = fogo._C.FOGO.default_options()
    expected = {
        "lr": 1e-3, "weight_decay": 0.0, "sigma": 0.2, "mu_s": 0.95, "mu_f": 0.35,
        "ns_steps_slow": 5, "ns_steps_fast": 5, "proj_dim": 128, "xi": 0.25, "codebook_size": 64,
        "beta_cb": 0.96, "eps_st": 0.15, "gamma_st_min": 0.10, "gamma_st_max": 0.30,
        "lt_candidates": 48, "freeze_per_task": 20, "lambda_prox": 1.0, "spectral_scaling": True,
        "ns_dtype": "auto", "projection_scale": "unit", "nonfinite": "raise",
    }
    for k, v in expected.items():
        assert d[k] == v, k
    assert d["ns_coefficients"] == pytest.approx((3.4445, -4.775, 2.0315))


def test_every_option_is_a_keyword_and_in_the_docs_table():
    table = (ROOT / "docs" / "algorithm.md").read_text()
    names = list(fogo._C.FOGO.default_options())
    assert len(names) >= 35
    sig = inspect.signature(fogo.FOGO.__init__).parameters
    for name in names:
        assert f"| `{name}` |" in table, name
        assert name in sig, name
    assert sig["codebook_size"].default == 64
    opt = fogo.FOGO([torch.zeros(4, 4, requires_grad=True)])
    assert set(names) <= set(opt.param_groups[0])


def test_muon_option_list_covers_the_cpp_options():
    # adjust_lr is a group's adjust_lr_fn, torch.optim.Muon's key.
    archive = ["adjust_lr_fn" if k == "adjust_lr" else k for k in fogo._C.Muon.archive_option_keys()]
    assert sorted(fogo._C.Muon.default_options()) == sorted(archive)
    assert sorted(fogo._C.FOGO.default_options()) == sorted(fogo._C.FOGO.archive_option_keys())


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"lr": -1.0}, RuntimeError, "FOGO: option 'lr' must be finite and in [0, inf], got -1"),
        ({"mu_s": 1.5}, RuntimeError, "FOGO: option 'mu_s' must be finite and in [0, 1], got 1.5"),
        ({"codebook_size": 0}, RuntimeError, "option 'codebook_size' must be finite and in [1,"),
        ({"codebook_size": 2.5}, TypeError, "FOGO: option 'codebook_size' must be an integer, got 2.5"),
        ({"lr": "fast"}, TypeError, "FOGO: option 'lr' must be a number, got 'fast'"),
        ({"nonfinite": "ignore"}, ValueError, "FOGO: option 'nonfinite' must be one of 'raise' 'skip' 'unchecked' 'mask', got 'ignore'"),
        ({"ns_dtype": "half"}, TypeError, "option 'ns_dtype' must be a torch.dtype"),
        ({"codebook": 3}, TypeError, "unexpected keyword argument(s) 'codebook'"),
    ],
)
def test_bad_options_raise_with_the_cpp_message(kwargs, error, message):
    with pytest.raises(error) as info:
        fogo.FOGO([torch.zeros(4, 4, requires_grad=True)], **kwargs)
    assert message in str(info.value)
    assert "Exception raised from" not in str(info.value)  # no C++ backtrace


def test_bad_group_option_is_rejected_and_not_added(gen):
    opt = fogo.FOGO([mat(gen, 4, 4)])
    with pytest.raises(RuntimeError, match="option 'xi' must be finite and in"):
        opt.add_param_group({"params": [mat(gen, 4, 4)], "xi": 2.0})
    with pytest.raises(TypeError, match="add_param_group: unknown option\\(s\\) 'codebok_size'"):
        opt.add_param_group({"params": [mat(gen, 4, 4)], "codebok_size": 8})
    with pytest.raises(TypeError, match="unknown option\\(s\\) 'codebook_size'"):
        fogo.Muon([{"params": [mat(gen, 4, 4)], "codebook_size": 8}])
    assert len(opt.param_groups) == 1
    muon = fogo.Muon([mat(gen, 4, 4)])
    muon.add_param_group({"params": [mat(gen, 4, 4)], "adjust_lr_fn": "match_rms_adamw"})
    assert muon.param_groups[1]["adjust_lr_fn"] == "match_rms_adamw"
    muon.add_param_group({"params": [mat(gen, 4, 4)], "adjust_lr": "match_rms_adamw"})  # fogo 0.1
    assert muon.param_groups[2]["adjust_lr_fn"] == "match_rms_adamw"
    assert "adjust_lr" not in muon.param_groups[2]
    # An option made invalid later (by hand) is caught at the next step, before anything changes.
    opt.param_groups[0]["sigma"] = -0.5
    opt.param_groups[0]["params"][0].grad = torch.ones(4, 4)
    with pytest.raises(RuntimeError, match="option 'sigma'"):
        opt.step()


@pytest.mark.parametrize("cls", [fogo.FOGO, fogo.Muon])
def test_tensor_lr_must_have_one_element(gen, cls):
    # ValueError with torch.optim's message (every torch optimizer's constructor), where the C++
    # option's conversion used to raise TypeError; add_param_group refuses it likewise.
    two = torch.tensor([1e-3, 1e-3])
    with pytest.raises(ValueError, match=r"^Tensor lr must be 1-element, got shape \[2\]$"):
        cls([mat(gen, 4, 4)], lr=two)
    opt = cls([mat(gen, 4, 4)], lr=torch.tensor([[0.01]]))  # one element, any shape, as torch
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        opt.add_param_group({"params": [mat(gen, 4, 4)], "lr": two})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [mat(gen, 4, 4)], "lr": torch.tensor(0.02)})


def test_vectors_are_rejected_with_a_pointer_to_adamw():
    # ValueError, as torch.optim.Muon raises for a parameter it cannot take.
    with pytest.raises(ValueError, match="fewer than 2 dimensions; optimize it with AdamW"):
        fogo.Muon([torch.zeros(3, 3, requires_grad=True), torch.zeros(5, requires_grad=True)])
    opt = fogo.FOGO([torch.zeros(3, 3, requires_grad=True)])
    with pytest.raises(ValueError, match="parameter 0 of group 1 \\(shape \\[5\\]\\)"):
        opt.add_param_group({"params": [torch.zeros(5, requires_grad=True)]})


# -- non-finite gradients --------------------------------------------------------------------

@pytest.mark.parametrize("cls", [fogo.FOGO, fogo.Muon])
def test_nonfinite_gradient_raises_and_changes_nothing(gen, cls):
    a, b = mat(gen, 6, 6), mat(gen, 6, 6)
    opt = cls([a, b])
    a.grad, b.grad = randn(gen, 6, 6), randn(gen, 6, 6)
    opt.step()
    before = [a.detach().clone(), b.detach().clone()]
    state = opt.state_dict()
    a.grad = randn(gen, 6, 6)
    b.grad = randn(gen, 6, 6)
    b.grad[2, 3] = float("nan")
    with pytest.raises(RuntimeError) as info:
        opt.step()
    assert str(info.value) == (
        f"{cls.__name__}: gradient of parameter 1 of group 0 (shape [6, 6]) contains NaN or Inf; "
        "the step was not applied (the parameters are unchanged)"
    )
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])
    for k in state["state"]:
        for name, t in state["state"][k].items():
            assert torch.equal(t, opt.state_dict()["state"][k][name])


def test_nonfinite_skip_policy(gen):
    a = mat(gen, 6, 6)
    opt = fogo.FOGO([a], nonfinite="skip")
    a.grad = torch.full((6, 6), float("inf"))
    before = a.detach().clone()
    opt.step()
    assert torch.equal(a, before)


def test_nonfinite_mask_policy_skips_on_the_device_and_counts(gen):
    a = mat(gen, 6, 6)
    opt = fogo.FOGO([a], nonfinite="mask")
    a.grad = randn(gen, 6, 6)
    opt.step()  # a group's first step is checked on the host; this one is usable
    before = a.detach().clone()
    momenta = {k: t.clone() for k, t in opt.state_dict()["state"][0].items()}
    a.grad = torch.full((6, 6), float("nan"))
    opt.step()
    assert torch.equal(a, before)
    for k, t in opt.state_dict()["state"][0].items():
        assert torch.equal(t, momenta[k])
    tel = opt.telemetry()[0]
    assert tel["skipped_steps"] == 1 and tel["step"] == 2  # counted as taken


def test_muon_nonfinite_policies(gen):
    a = mat(gen, 6, 8)
    opt = fogo.Muon([a], nonfinite="mask")
    assert opt.param_groups[0]["nonfinite"] == "mask"
    a.grad = randn(gen, 6, 8)
    opt.step()
    before = a.detach().clone()
    buf = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    a.grad = torch.full((6, 8), float("inf"))
    opt.step()  # masked on the device: nothing changes
    assert torch.equal(a, before)
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], buf)
    unchecked = fogo.Muon([mat(gen, 6, 8)], nonfinite="unchecked")
    unchecked.param_groups[0]["params"][0].grad = torch.full((6, 8), float("nan"))
    unchecked.step()  # as torch.optim.Muon: the NaN goes through
    assert unchecked.param_groups[0]["params"][0].isnan().all()


# -- torch.optim behaviour -------------------------------------------------------------------

def test_lr_scheduler_drives_the_cpp_step(gen):
    # StepLR halves lr every 2 steps; the trajectory equals a C++ run given those factors.
    w0 = randn(gen, 10, 12, scale=0.1)
    grads = [randn(gen, 10, 12) for _ in range(6)]
    w = w0.clone().requires_grad_(True)
    opt = fogo.FOGO([w], lr=0.02, codebook_size=4, proj_dim=4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for g in grads:
        lrs.append(opt.param_groups[0]["lr"])
        w.grad = g.clone()
        opt.step()
        sched.step()
    assert lrs == [0.02, 0.02, 0.01, 0.01, 0.005, 0.005]
    cpp = fogo._testing.cpp_trajectory(
        "FOGO", [([w0], {"lr": 0.02, "codebook_size": 4, "proj_dim": 4})],
        [[[g]] for g in grads], lr_factors=[x / 0.02 for x in lrs])
    assert torch.equal(w.detach(), cpp[-1][0])
    # A constant lr gives another trajectory: the scheduler's values did reach C++.
    const = fogo._testing.cpp_trajectory(
        "FOGO", [([w0], {"lr": 0.02, "codebook_size": 4, "proj_dim": 4})], [[[g]] for g in grads])
    assert not torch.equal(w.detach(), const[-1][0])


def test_closure_add_param_group_zero_grad(gen):
    x, y = randn(gen, 32, 8), randn(gen, 32, 4)
    w1 = mat(gen, 8, 8)
    opt = fogo.Muon([w1], lr=0.05)
    w2 = mat(gen, 4, 8)
    opt.add_param_group({"params": [w2], "lr": 0.02})
    assert opt.param_groups[1]["lr"] == 0.02 and opt.param_groups[1]["momentum"] == 0.95

    def closure():
        opt.zero_grad()
        loss = ((x @ w1.T @ w2.T - y) ** 2).mean()
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(30)]
    assert losses[-1] < 0.8 * losses[0]
    opt.zero_grad()
    assert w1.grad is None and w2.grad is None
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group({"params": [w1]})


def test_changed_params_list_is_an_error(gen):
    opt = fogo.FOGO([mat(gen, 4, 4)])
    opt.param_groups[0]["params"].append(mat(gen, 4, 4))
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['params'\] changed"):
        opt.step()


# -- FOGO's own API --------------------------------------------------------------------------

def test_telemetry_and_task_boundary(gen):
    ws = [mat(gen, 12, 16), mat(gen, 12, 16)]
    opt = fogo.FOGO([{"params": ws[:1]}, {"params": ws[1:], "freeze_per_task": 3}],
                    codebook_size=8, proj_dim=8, lr=0.01)
    for _ in range(3):
        for w in ws:
            w.grad = randn(gen, 12, 16)
        opt.step()
    tel = opt.telemetry()
    assert len(tel) == 2 and tel[0]["step"] == 3 and tel[0]["frozen"] == 0
    assert set(tel[0]) >= {"rbar", "gamma_st", "codebook_entropy", "live_centroids", "delta_ratio"}
    assert 0 <= tel[0]["codebook_entropy"] <= math.log(8) + 1e-6
    assert opt.memory(0)["centroids"].shape == (8, 8)

    opt.task_boundary()
    sd = opt.state_dict()
    assert opt.memory(0)["frozen"].shape[0] == 8  # freeze_per_task 20, but only 8 centroids
    assert opt.memory(1)["frozen"].shape[0] == 3
    for k in sd["state"]:  # begin_task: momenta reset
        assert not sd["state"][k]["slow_momentum"].any()
    # consolidate() twice before the next step freezes nothing more.
    opt.consolidate()
    assert opt.memory(1)["frozen"].shape[0] == 3
    opt.begin_task()


def test_cuda_graph_on_cpu_parameters_is_refused(gen):
    w = mat(gen, 4, 6)
    with pytest.raises(ValueError, match="option 'cuda_graph'"):
        fogo.FOGO([w], cuda_graph=True)
    opt = fogo.FOGO([w], lr=0.01)
    w.grad = randn(gen, 4, 6)
    opt.step()
    tel = opt.telemetry()[0]
    assert tel["graph_captures"] == 0 and tel["graph_replays"] == 0
    with pytest.raises(ValueError, match="Muon: option 'cuda_graph'"):
        fogo.Muon([mat(gen, 4, 6)], cuda_graph=True)
    assert fogo.Muon([mat(gen, 4, 6)]).graph_stats() == {"captures": 0, "replays": 0}


def test_presets():
    gpt2 = fogo.presets.gpt2()
    assert gpt2["lr"] == 6e-4 and gpt2["codebook_size"] == 256 and gpt2["proj_dim"] == 512
    assert gpt2["weight_decay"] == 0.1 and gpt2["reseed_every"] == 200
    cil = fogo.presets.class_il_backbone()
    assert cil["proj_dim"] == 256 and cil["ns_steps_slow"] == 4 and cil["eps_lt"] == 0.001
    assert set(fogo.presets.__all__) == {
        "class_imbalanced_backbone", "class_imbalanced_head", "domain_il_backbone",
        "domain_il_head", "class_il_backbone", "class_il_head_fc", "class_il_classifier", "gpt2",
        "lora"}
    opt = fogo.FOGO([torch.zeros(4, 4, requires_grad=True)], **fogo.presets.lora())
    assert opt.param_groups[0]["lambda_prox"] == 0.8
    # The module's names are those of the C++ table (FOGO_PRESETS), each a fresh dict.
    assert fogo.presets.__all__ == sorted(name for name, _ in fogo._C.preset_table())
    assert fogo.presets.gpt2() is not fogo.presets.gpt2()
    assert "LoRA" in fogo.presets.lora.__doc__
    with pytest.raises(ValueError, match="no preset named 'gpt3'"):
        fogo._C.preset("gpt3")


def test_hybrid_param_groups():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.fc1 = torch.nn.Linear(8, 16)
            self.fc2 = torch.nn.Linear(16, 16)
            self.norm = torch.nn.LayerNorm(16)
            self.head = torch.nn.Linear(16, 4)

    net = Net()
    matrix, rest = fogo.hybrid_param_groups(net)
    assert [g["name"] for g in matrix] == ["matrix"] and [g["name"] for g in rest] == ["rest"]
    assert matrix[0]["param_names"] == ["conv.weight", "fc1.weight", "fc2.weight"]
    assert rest[0]["param_names"] == [
        "emb.weight", "conv.bias", "fc1.bias", "fc2.bias", "norm.weight", "norm.bias",
        "head.weight", "head.bias"]
    by_shape, _ = fogo.hybrid_param_groups(net, group_by="shape")
    assert [g["name"] for g in by_shape] == ["8x27", "16x8", "16x16"]
    opts = [fogo.FOGO(by_shape, lr=1e-3), torch.optim.AdamW(rest, lr=1e-3)]
    assert opts[0].param_groups[1]["param_names"] == ["fc1.weight"]
    forced, _ = fogo.hybrid_param_groups(net, matrix_patterns=[r"^head\.weight$"])
    assert "head.weight" in forced[0]["param_names"]
    with pytest.raises(ValueError, match="matrix_patterns matched 'norm.weight'"):
        fogo.hybrid_param_groups(net, matrix_patterns=["norm"])
    # The rule is fogo::split_routes' (C++), its patterns ECMAScript regexes: an invalid one is
    # a ValueError naming it; embeddings stay on the matrix side when asked.
    with pytest.raises(ValueError, match=r"rest_patterns: invalid regex '\(unclosed'"):
        fogo.split_parameters(net, rest_patterns=["(unclosed"])
    kept, _ = fogo.split_parameters(net, embeddings_to_rest=False)
    assert [name for name, _ in kept] == ["emb.weight", "conv.weight", "fc1.weight", "fc2.weight"]
    frozen = Net()
    frozen.fc1.weight.requires_grad_(False)
    matrix, rest = fogo.split_parameters(frozen)
    assert "fc1.weight" not in [n for n, _ in matrix + rest]


def test_routing_names_each_parameters_side_and_rule():
    # The visible routing (issue 36, item 5): every trainable parameter with its side and the rule
    # that sent it there (fogo::split_routes), agreeing with split_parameters; the table is C++'s.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.fc1 = torch.nn.Linear(8, 16)
            self.head = torch.nn.Linear(16, 4)

    net = Net()
    routes = fogo.route_parameters(net)
    assert [(r["name"], r["shape"], r["side"], r["rule"]) for r in routes] == [
        ("emb.weight", (10, 8), "adamw", "embedding weight (embeddings_to_rest)"),
        ("conv.weight", (8, 3, 3, 3), "matrix", "4-D weight"),
        ("conv.bias", (8,), "adamw", "1-D (biases, norms, scalars)"),
        ("fc1.weight", (16, 8), "matrix", "2-D weight"),
        ("fc1.bias", (16,), "adamw", "1-D (biases, norms, scalars)"),
        ("head.weight", (4, 16), "adamw", f"rest_patterns '{fogo._C.default_rest_patterns[0]}'"),
        ("head.bias", (4,), "adamw", "1-D (biases, norms, scalars)")]
    matrix, rest = fogo.split_parameters(net)
    assert [n for n, _ in matrix] == [r["name"] for r in routes if r["side"] == "matrix"]
    assert [n for n, _ in rest] == [r["name"] for r in routes if r["side"] == "adamw"]
    forced = fogo.route_parameters(net, matrix_patterns=[r"^head\.weight$"])
    assert forced[5]["side"] == "matrix" and forced[5]["rule"] == r"matrix_patterns '^head\.weight$'"
    table = fogo.routing_table(routes)
    assert "| conv.weight | [8, 3, 3, 3] | matrix | 4-D weight | one 8x27 matrix (its trailing " \
        "dimensions flattened) |" in table


def test_owner_assignment_is_the_cpp_one():
    # fogo::assign_owners by fogo::newton_schulz_cost, as fogo::dist's sharded steps and FSDP2
    # owner-computes (fogo.Muon) use it: costliest first to the least-loaded rank, ties to the
    # earlier matrix and the lower rank. Costs: 24x24 13824 (twice), 24x12 3456, 5x24 600; on two
    # ranks the 24x12 goes to rank 0 (tied loads), the 5x24 to rank 1.
    shapes = [[24, 12], [24, 24], [24, 24], [5, 24]]
    assert fogo._C.assign_owners(shapes, 2) == [0, 0, 1, 1]
    assert fogo._C.assign_owners(shapes, 3) == [2, 0, 1, 2]
    assert fogo._C.assign_owners(shapes, 1) == [0, 0, 0, 0]


# -- ns_dtype "auto" (docs/muon.md, "The Newton-Schulz dtype") -------------------------------

def test_ns_dtype_auto_is_the_default_and_steps_as_the_dtype_it_resolves_to(gen):
    init = [randn(gen, 8, 24, scale=0.1), randn(gen, 24, 6, scale=0.1)]
    grads = [[randn(gen, *p.shape) for p in init] for _ in range(3)]

    def run(cls, **options):
        params = [p.clone().requires_grad_(True) for p in init]
        opt = cls(params, lr=0.02, **options)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        return opt, params

    for cls, extra in ((fogo.Muon, {}), (fogo.FOGO, {"codebook_size": 4, "proj_dim": 6})):
        opt, default = run(cls, **extra)
        assert opt.param_groups[0]["ns_dtype"] == "auto"
        assert opt.state_dict()["param_groups"][0]["ns_dtype"] == "auto"
        cpu = [c for c in fogo.ns_dtype_choices() if c["device"] == "cpu"]
        assert len(cpu) == 1 and cpu[0]["dtype"] in (torch.bfloat16, torch.float32), cpu
        assert cpu[0]["reason"] and cpu[0]["isa"]
        # ns_form "default": timed ("auto") where auto resolved to fp32, else the plain chain.
        assert opt.param_groups[0]["ns_form"] == "default"
        form = "auto" if cpu[0]["dtype"] == torch.float32 else "plain"
        _, explicit = run(cls, ns_dtype=cpu[0]["dtype"], ns_form=form, **extra)
        assert all(torch.equal(a, b) for a, b in zip(default, explicit)), cls.__name__
        # "auto" is a value like the dtypes: a param group may set it.
        mixed = cls([{"params": [init[0].clone().requires_grad_(True)], "ns_dtype": "auto"}],
                    ns_dtype=torch.float32, **extra)
        assert mixed.param_groups[0]["ns_dtype"] == "auto" and mixed.defaults["ns_dtype"] == \
            torch.float32


def test_fogo_ns_dtype_in_the_environment_fixes_auto():
    import os
    import subprocess
    import sys

    code = (
        "import torch, fogo\n"
        "p = torch.ones(8, 24, requires_grad=True); p.grad = torch.ones(8, 24)\n"
        "fogo.Muon([p], lr=0.02).step()\n"
        "c = fogo.ns_dtype_choices()[0]\n"
        "print(c['device'], c['dtype'], c['reason'])\n"
        "fogo.set_ns_auto_dtype(torch.bfloat16)\n"
        "q = torch.ones(8, 24, requires_grad=True); q.grad = torch.ones(8, 24)\n"
        "fogo.Muon([q], lr=0.02).step()\n"
        "c = fogo.ns_dtype_choices()[0]\n"
        "print(c['device'], c['dtype'], c['reason'])\n"
    )
    env = {**os.environ, "FOGO_NS_DTYPE": "fp32", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["cpu torch.float32 FOGO_NS_DTYPE=fp32",
                                       "cpu torch.bfloat16 set_ns_auto_dtype"]
    env["FOGO_NS_DTYPE"] = "fp16"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "FOGO_NS_DTYPE (ns_dtype auto's answer) must be bf16, fp32 or auto, got 'fp16'" in \
        out.stderr
