"""The one non-finite decision from Python (fogo._C.decide_nonfinite; fogo/_nonfinite.py): every
policy gives the outcome of the C++ paths (tests/test_nonfinite.cpp) on fogo.FOGO, fogo.Muon and
fogo.Hybrid over either, for a NaN in a matrix gradient and in an AdamW gradient. The FSDP2
owner-computes path (fogo.Muon and fogo.Hybrid over fully_shard, 2 ranks): dist_worker.py's
fsdp_muon_nonfinite, run by test_distributed.py."""

import pytest
import torch

import fogo
from dist_worker import no_host_reads

POLICIES = ("raise", "skip", "mask", "unchecked")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 4)


FOGO_OPTIONS = {"lr": 0.02, "proj_dim": 4, "codebook_size": 4}


def make(path, policy, net):
    weights = [net.fc1.weight, net.fc2.weight]
    if path == "FOGO":
        return fogo.FOGO(weights, nonfinite=policy, **FOGO_OPTIONS)
    if path == "Muon":
        return fogo.Muon(weights, lr=0.02, nonfinite=policy)
    cls, options = (fogo.FOGO, FOGO_OPTIONS) if path == "HybridFOGO" else (fogo.Muon, {"lr": 0.02})
    return fogo.Hybrid(net, cls, {**options, "nonfinite": policy}, {"lr": 3e-3})


def feed(net, k):
    gen = torch.Generator().manual_seed(100 + k)
    for p in net.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def fogo_side(opt):
    side = opt.matrix if isinstance(opt, fogo.Hybrid) else opt
    return side if isinstance(side, fogo.FOGO) else None


def bits(opt, net):
    """Every tensor a step may change, copied: parameters, their state (momenta, AdamW's
    moments), FOGO's memory."""
    out = []
    for p in net.parameters():
        out.append(p.detach().clone())
        st = opt.state[p] if p in opt.state else {}
        out += [t.clone() for k, t in sorted(st.items()) if k != "step"]
    f = fogo_side(opt)
    if f is not None:
        out += [t.clone() for t in f.memory(0).values() if t is not None]
    return out


def counters(opt, net):
    """FOGO's step and skipped_steps, each AdamW parameter's step."""
    f = fogo_side(opt)
    out = [f.telemetry()[0]["step"], f.telemetry()[0]["skipped_steps"]] if f is not None else []
    return out + [int(opt.state[p]["step"]) for p in net.parameters()
                  if p in opt.state and "step" in opt.state[p]]


def same_bits(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.view(torch.int32), y.view(torch.int32))
        for x, y in zip(a, b))


CASES = [(path, victim) for path in ("FOGO", "Muon", "HybridFOGO", "HybridMuon")
         for victim in (("matrix", "rest") if path.startswith("Hybrid") else ("matrix",))]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path,victim", CASES)
def test_every_policy_has_one_outcome(path, victim, policy):
    torch.manual_seed(5)
    net = Net()
    opt = make(path, policy, net)
    for k in range(2):  # past FOGO's first step (its codebook is built from it)
        feed(net, k)
        opt.step()
    feed(net, 2)
    poisoned = net.fc2.weight if victim == "matrix" else net.fc2.bias
    poisoned.grad[0] = float("nan")
    before, counted = bits(opt, net), counters(opt, net)
    reads = fogo._C.unusable_grad_reads()
    if policy == "raise":
        if path.startswith("Hybrid"):
            expected = ("fogo.Hybrid (matrix side): gradient of parameter 1 of group 0 "
                        "(shape [4, 8]) 'fc2.weight'" if victim == "matrix" else
                        "fogo.Hybrid (rest side): gradient of parameter 1 of group 1 "
                        "(shape [4]) 'fc2.bias'")
        else:
            expected = f"{path}: gradient of parameter 1 of group 0 (shape [4, 8])"
        with pytest.raises(RuntimeError) as info:
            opt.step()
        assert str(info.value) == (f"{expected} contains NaN or Inf; the step was not applied "
                                   "(the parameters are unchanged)")
    elif policy == "mask" and not path.startswith("Hybrid"):
        with no_host_reads():  # the whole step is the C++ one
            opt.step()
    else:
        opt.step()
    read = fogo._C.unusable_grad_reads() - reads
    if policy == "unchecked":  # no check, nothing read back: the NaN reaches the parameter
        assert read == 0
        assert poisoned.isnan().any()
        return
    assert same_bits(bits(opt, net), before)
    if policy == "mask":  # on the device, nothing read back; counted as a step
        assert read == 0
        assert counters(opt, net) == [c + 1 for c in counted]
    else:  # on the host, in one read; not counted
        assert read == 1
        assert counters(opt, net) == counted
    feed(net, 3)  # training goes on
    opt.step()
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert not same_bits(bits(opt, net), before)


def test_the_hybrids_adamw_side_follows_the_matrix_options_not_group_0():
    # Two matrix groups (two shapes); group 0 unchecked, the options (and so the AdamW side)
    # "raise": a NaN in an AdamW gradient raises, whatever group 0 says.
    torch.manual_seed(5)
    net = Net()
    opt = fogo.Hybrid(net, fogo.Muon, {"lr": 0.02, "nonfinite": "raise"}, group_by="shape")
    assert [g["side"] for g in opt.param_groups] == ["matrix", "matrix", "rest"]
    opt.param_groups[0]["nonfinite"] = "unchecked"
    feed(net, 0)
    net.fc1.bias.grad[1] = float("inf")
    bias = net.fc1.bias.detach().clone()
    with pytest.raises(RuntimeError, match="fogo.Hybrid \\(rest side\\): gradient of parameter 0 "
                       "of group 2 \\(shape \\[8\\]\\) 'fc1.bias' contains NaN or Inf"):
        opt.step()
    assert torch.equal(net.fc1.bias, bias)
    # Group 0 unchecked: its own NaN reaches its parameter; group 1 and AdamW step.
    feed(net, 1)
    net.fc1.weight.grad[0, 0] = float("nan")
    opt.step()
    assert net.fc1.weight.isnan().all() and torch.isfinite(net.fc2.weight).all()


def test_decide_nonfinite_is_the_cpp_rule():
    t, f = torch.tensor(True), torch.tensor(False)
    d = fogo._C.decide_nonfinite(["skip", "raise", "skip", "raise"], [f, t, f, f])
    assert (d.kind, d.item, d.ok) == ("raise", 3, None)
    d = fogo._C.decide_nonfinite(["raise", "skip"], [t, f])
    assert (d.kind, d.item) == ("skip", 1)
    reads = fogo._C.unusable_grad_reads()
    d = fogo._C.decide_nonfinite(["mask", "mask", "unchecked"], [t, f, None])
    assert d.kind == "mask" and d.ok.dim() == 0 and not d.ok
    assert fogo._C.unusable_grad_reads() == reads
    d = fogo._C.decide_nonfinite(["mask"], [f], maskable=False)
    assert (d.kind, d.item) == ("skip", 0)
    assert fogo._C.decide_nonfinite(["unchecked"], [None]).kind == "step"
    with pytest.raises(ValueError, match="must be one of 'raise' 'skip' 'unchecked' 'mask'"):
        fogo._C.decide_nonfinite(["ignore"], [t])
    with pytest.raises(RuntimeError, match="item 0 needs its usable flag"):
        fogo._C.decide_nonfinite(["raise"], [None])
    assert not fogo._C.grad_usable(torch.tensor([1e18]))  # past the overflow limit
    a = torch.ones(3)
    keep = fogo._C.MaskScope(f, [a])
    a.add_(1)
    keep.restore()
    assert torch.equal(a, torch.ones(3))
