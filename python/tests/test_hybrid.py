"""fogo.Hybrid, one optimizer for a whole model, against its two sides run separately (fogo.FOGO
or fogo.Muon on the matrix groups, torch.optim.AdamW, fused, on the rest): the same parameters after
every step, bit for bit, with a scheduler driving both, and a resumed run equal to the
uninterrupted one."""

import copy

import pytest
import torch

import fogo
from test_state_dict import assert_state_equal


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.emb(x).mean(1)
        return self.head(self.norm(torch.relu(self.fc2(torch.relu(self.fc1(h))))))


MATRIX = {fogo.FOGO: {"lr": 0.01, "codebook_size": 6, "proj_dim": 8, "freeze_per_task": 2},
          fogo.Muon: {"lr": 0.02, "weight_decay": 0.01}}
ADAMW = {"lr": 3e-3, "weight_decay": 0.05}


def data(steps):
    gen = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 10, (12, 5), generator=gen), torch.randint(0, 4, (12,), generator=gen))
            for _ in range(steps)]


def schedule(step):
    return 1.0 / (1 + step)


def run(net, opts, scheds, batches):
    # The first optimizer evaluates the closure (fogo.Hybrid: once for both of its sides); the
    # others step on the gradients it left.
    for x, y in batches:
        for o in opts:
            o.zero_grad()

        def closure():
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            return loss

        assert opts[0].step(closure) is not None
        for o in opts[1:]:
            o.step()
        for s in scheds:
            s.step()


@pytest.mark.parametrize("matrix", [fogo.FOGO, fogo.Muon])
def test_hybrid_equals_its_sides_run_separately(matrix):
    torch.manual_seed(0)
    net = Net()
    twin = copy.deepcopy(net)
    batches = data(6)

    opt = fogo.Hybrid(net, matrix, adamw_options=ADAMW, group_by="shape", **MATRIX[matrix])
    assert [g["side"] for g in opt.param_groups] == ["matrix", "matrix", "rest"]
    assert opt.param_groups[2]["param_names"][0] == "emb.weight"
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)

    matrix_groups, rest_groups = fogo.hybrid_param_groups(twin, group_by="shape")
    # The AdamW side is torch's fused AdamW (CPU parameters, fp32): the twin's too.
    assert opt.rest.param_groups[0]["fused"] is True
    sides = [matrix(matrix_groups, **MATRIX[matrix]),
             torch.optim.AdamW(rest_groups, **ADAMW, fused=True)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in sides]

    run(net, [opt], [sched], batches)
    run(twin, sides, scheds, batches)
    for (name, p), q in zip(net.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name
    assert opt.param_groups[0]["lr"] == MATRIX[matrix]["lr"] * schedule(6)
    assert opt.param_groups[2]["lr"] == ADAMW["lr"] * schedule(6)
    # Every parameter has state, its side's own.
    for p in net.parameters():
        assert opt.state[p] is opt._sides[opt._owner[id(p)]].state[p]
    assert len(opt.state) == len(list(net.parameters()))


@pytest.mark.parametrize("matrix", [fogo.FOGO, fogo.Muon])
def test_hybrid_resumes_bitwise(matrix):
    torch.manual_seed(1)
    net = Net()
    init = copy.deepcopy(net.state_dict())
    batches = data(8)

    opt = fogo.Hybrid(net, matrix, adamw_options=ADAMW, **MATRIX[matrix])
    run(net, [opt], [], batches)

    first = Net()
    first.load_state_dict(init)
    opt1 = fogo.Hybrid(first, matrix, adamw_options=ADAMW, **MATRIX[matrix])
    run(first, [opt1], [], batches[:4])
    sd = copy.deepcopy(opt1.state_dict())
    assert sorted(sd["state"]) == list(range(len(list(first.parameters()))))
    assert "exp_avg" in sd["state"][len(sd["state"]) - 1]  # AdamW's state in the same dict
    second = copy.deepcopy(first)
    opt2 = fogo.Hybrid(second, matrix, adamw_options=ADAMW, **MATRIX[matrix])
    opt2.load_state_dict(sd)
    run(second, [opt2], [], batches[4:])
    for p, q in zip(net.parameters(), second.parameters()):
        assert torch.equal(p, q)
    assert_state_equal(opt.state_dict(), opt2.state_dict())


def test_hybrid_of_tensors_and_its_errors():
    w, b = torch.zeros(4, 3, requires_grad=True), torch.zeros(4, requires_grad=True)
    opt = fogo.Hybrid([w, b], fogo.Muon, lr=0.02)
    assert [g["side"] for g in opt.param_groups] == ["matrix", "rest"]
    assert isinstance(opt.matrix, fogo.Muon) and isinstance(opt.rest, torch.optim.AdamW)
    with pytest.raises(ValueError, match="holds matrices and vectors"):
        fogo.Hybrid([{"params": [w, b]}])
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [w]})
    # A NaN in an AdamW gradient stops the whole step under nonfinite="raise".
    w.grad = torch.ones(4, 3)
    b.grad = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    with pytest.raises(RuntimeError, match="fogo.Hybrid \\(rest side\\): gradient of parameter 0 "
                       "of group 1 \\(shape \\[4\\]\\) contains NaN or Inf"):
        opt.step()
    assert not w.any() and not b.any() and not opt.matrix.state[w]["momentum_buffer"].any()
    skip = fogo.Hybrid([w, b], fogo.Muon, lr=0.02, nonfinite="skip")
    skip.step()
    assert not w.any() and not b.any()


def test_hybrid_adamw_is_fused_and_equals_unfused_adamw_to_rounding():
    """The AdamW side runs torch's fused kernel where every parameter allows it (issue 44) and
    steps as torch.optim.AdamW's per-parameter loop does, to rounding: the kernel evaluates the
    same formulas in another order (exp_avg by a lerp; step_size * m / denom), a few ulp per
    step, so fp32 parameters agree to a relative 2e-6 after 6 steps where a wrong lr, beta or
    decay moves them by orders of magnitude more. What the caller chose is kept."""
    torch.manual_seed(4)
    w = torch.randn(6, 5, requires_grad=True)
    vecs = [torch.randn(n, requires_grad=True) for n in (5, 33, 7)]
    twins = [v.detach().clone().requires_grad_(True) for v in vecs]
    opt = fogo.Hybrid([w, *vecs], fogo.Muon, lr=0.02, adamw_options=ADAMW)
    assert opt.rest.param_groups[0]["fused"] is True
    ref = torch.optim.AdamW(twins, **ADAMW, foreach=False)
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        w.grad = torch.randn(6, 5, generator=gen)
        for v, t in zip(vecs, twins):
            v.grad = torch.randn(v.shape, generator=gen)
            t.grad = v.grad.clone()
        opt.step()
        ref.step()
    for v, t in zip(vecs, twins):
        torch.testing.assert_close(v, t, rtol=2e-6, atol=1e-7)
        torch.testing.assert_close(opt.rest.state[v]["exp_avg_sq"], ref.state[t]["exp_avg_sq"],
                                   rtol=2e-6, atol=1e-9)
    # adamw_options' (or a group's) own choice wins; a parameter without a fused kernel (the
    # meta device) gets neither.
    kept = fogo.Hybrid([w, *vecs], fogo.Muon, lr=0.02, adamw_options={"fused": False})
    assert not kept.rest.param_groups[0]["fused"]
    meta = fogo.Hybrid([torch.zeros(4, device="meta", requires_grad=True)], fogo.Muon)
    assert not meta.rest.param_groups[0]["fused"]


def test_hybrid_copies_step_like_the_original():
    torch.manual_seed(2)
    net = Net()
    opt = fogo.Hybrid(net, fogo.FOGO, adamw_options=ADAMW, **MATRIX[fogo.FOGO])
    batches = data(6)
    run(net, [opt], [], batches[:3])
    net2, opt2 = copy.deepcopy((net, opt))
    assert opt2.param_groups[0]["params"][0] is net2.fc1.weight
    run(net, [opt], [], batches[3:])
    run(net2, [opt2], [], batches[3:])
    for p, q in zip(net.parameters(), net2.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("matrix", [fogo.FOGO, fogo.Muon])
def test_hybrid_through_dcp_resumes_bitwise(tmp_path, matrix):
    # Every parameter has its state from construction on, AdamW's included: DCP loads into a
    # fresh Hybrid's state_dict in place, and never steps it to "initialise".
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    torch.manual_seed(3)
    net = Net()
    first = copy.deepcopy(net)
    batches = data(6)
    make = lambda m: fogo.Hybrid(m, matrix, adamw_options=ADAMW, **MATRIX[matrix])  # noqa: E731
    opt = make(net)
    fresh = copy.deepcopy(opt.state_dict())
    assert len(fresh["state"]) == len(list(net.parameters()))
    run(net, [opt], [], batches)

    opt1 = make(first)
    run(first, [opt1], [], batches[:3])
    dcp.save({"optim": get_optimizer_state_dict(first, opt1)}, checkpoint_id=str(tmp_path))
    second = copy.deepcopy(first)
    opt2 = make(second)
    target = {"optim": get_optimizer_state_dict(second, opt2)}
    assert_state_equal(fresh, opt2.state_dict())  # nothing stepped
    dcp.load(target, checkpoint_id=str(tmp_path))
    set_optimizer_state_dict(second, opt2, target["optim"])
    run(second, [opt2], [], batches[3:])
    for p, q in zip(net.parameters(), second.parameters()):
        assert torch.equal(p, q)


def test_repr_leaves_out_fogo_memory():
    opt = fogo.Hybrid(Net(), fogo.FOGO, **MATRIX[fogo.FOGO])
    text = repr(opt)
    assert text.startswith("Hybrid (") and "codebook_size: 6" in text and "memory" not in text
    assert "memory" in opt.param_groups[0]  # the groups themselves keep it


def test_routes_give_each_parameters_group_and_update_scale():
    """fogo.Hybrid.routes (issue 36, item 5): every parameter with its side, rule, group and
    update scale from the group that holds it (fogo::update_scale: the C++ code), against the
    formulas in float64; a scheduler's lr shows; a copy needs its model passed."""
    net = Net()
    opt = fogo.Hybrid(net, fogo.Muon, lr=0.02, adamw_options=ADAMW, group_by="shape")
    routes = {r["name"]: r for r in opt.routes()}
    assert set(routes) == {n for n, _ in net.named_parameters()}
    fc1 = routes["fc1.weight"]  # [16, 8]: original scale sqrt(max(1, 16/8)), RMS over sqrt(16)
    assert (fc1["side"], fc1["group"], fc1["lr"]) == ("matrix", "16x8", 0.02)
    assert fc1["rms_per_lr"] == pytest.approx(2 ** 0.5 / 4, rel=1e-15)
    assert "(original)" in fc1["update_scale"]
    assert routes["emb.weight"]["side"] == "adamw" and routes["emb.weight"]["rms_per_lr"] is None
    assert routes["head.bias"]["lr"] == ADAMW["lr"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    assert {r["name"]: r for r in opt.routes()}["fc2.weight"]["lr"] == pytest.approx(0.01)
    del sched
    table = fogo.routing_table(opt.routes())
    assert "| group | update scale |" in table
    assert "| fc2.weight | [16, 16] | matrix | 2-D weight | one 16x16 matrix | 16x16 |" in table
    # FOGO: RMS sigma lr. By hand: fc1's weight on the AdamW side, head's weight held by nobody.
    others = [p for n, p in net.named_parameters() if n not in ("fc2.weight", "head.weight")]
    by_hand = fogo.Hybrid([{"params": [net.fc2.weight], "side": "matrix", "sigma": 0.15},
                           {"params": others, "side": "rest"}], fogo.FOGO, lr=1e-3)
    with pytest.raises(ValueError, match="pass the model"):
        by_hand.routes()
    held = {r["name"]: r for r in by_hand.routes(net)}
    assert held["fc2.weight"]["rms_per_lr"] == 0.15 and held["fc2.weight"]["group"] == "0"
    assert held["fc1.weight"]["rule"] == "placed by hand (the split's rule: 2-D weight)"
    assert held["fc1.weight"]["side"] == "adamw"
    assert held["head.weight"]["group"] is None
    assert "| - | not in this optimizer |" in fogo.routing_table(by_hand.routes(net))
    copy_net, copy_opt = copy.deepcopy((net, opt))
    with pytest.raises(ValueError, match="pass the model"):
        copy_opt.routes()
    assert [r["lr"] for r in copy_opt.routes(copy_net)] == [r["lr"] for r in opt.routes()]


def test_routes_show_blocks_and_their_scales():
    """A fused weight in its own group with blocks: Hybrid.routes says which matrices it is and
    the Muon scale of each block shape (fogo::treated_as, fogo::update_scale)."""
    net = Net()
    others = [p for n, p in net.named_parameters() if n != "fc2.weight"]
    opt = fogo.Hybrid([{"params": [net.fc2.weight], "side": "matrix", "blocks": [8, 4, 4]},
                       {"params": others, "side": "rest"}], fogo.Muon, lr=0.02)
    fc2 = {r["name"]: r for r in opt.routes(net)}["fc2.weight"]
    assert fc2["treated_as"] == "[8, 16] + 2 x [4, 16] matrices"
    assert fc2["rms_per_lr"] == pytest.approx(1 / 16 ** 0.5, rel=1e-15)  # original on [8, 16]
    assert "[4, 16]: lr 0.02 x 1 (original)" in fc2["update_scale"]
    assert "| [8, 16] + 2 x [4, 16] matrices |" in fogo.routing_table(opt.routes(net))
