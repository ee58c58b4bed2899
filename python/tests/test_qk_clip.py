"""fogo.qk_clip.qk_clip (fogo::qk_clip) from Python, against the definition in float64: logits
recomputed from the clipped projections (docs/muon.md, "QK-Clip"). Row shards under FSDP2:
test_distributed.py's test_qk_clip_on_row_shards."""

import math

import pytest
import torch

from fogo.qk_clip import qk_clip


def attention(q_heads, kv_heads, d, seed, scale=1.5):
    gen = torch.Generator().manual_seed(seed)
    rows = (q_heads + 2 * kv_heads) * d
    lin = torch.nn.Linear(10, rows, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(rows, 10, generator=gen, dtype=torch.float64) * scale)
        lin.bias.copy_(torch.randn(rows, generator=gen, dtype=torch.float64) * 0.1)
    return lin, torch.randn(2, 7, 10, generator=gen, dtype=torch.float64)


def logits(lin, x, q_heads, kv_heads, d):
    """[q_heads, batch, T, T]: q . k / sqrt(d) of each query head with its key head (causal mask
    not needed: every pair counts here)."""
    y = lin(x)
    q = y[..., : q_heads * d].unflatten(-1, (q_heads, d)).transpose(-3, -2)
    k = y[..., q_heads * d:(q_heads + kv_heads) * d].unflatten(-1, (kv_heads, d)).transpose(-3, -2)
    k = k.repeat_interleave(q_heads // kv_heads, dim=-3)
    return (q @ k.transpose(-1, -2) / math.sqrt(d)).transpose(0, 1)


@pytest.mark.parametrize("q_heads, kv_heads", [(4, 4), (6, 2), (4, 1)])
def test_clipped_logits_follow_the_definition(q_heads, kv_heads):
    d = 3
    lin, x = attention(q_heads, kv_heads, d, seed=q_heads + kv_heads)
    with torch.no_grad():
        before = logits(lin, x, q_heads, kv_heads, d)
    m = before.flatten(1).amax(1)
    tau = m.median().item()
    v_rows = lin.weight[(q_heads + kv_heads) * d:].detach().clone()
    gamma = qk_clip(lin.weight, m, q_heads=q_heads, kv_heads=kv_heads, threshold=tau,
                    bias=lin.bias)
    group = q_heads // kv_heads
    group_max = m.view(kv_heads, group).amax(1)
    want = torch.where(group_max > tau, tau / group_max, torch.ones_like(group_max))
    torch.testing.assert_close(gamma, want, rtol=1e-15, atol=0)
    with torch.no_grad():
        after = logits(lin, x, q_heads, kv_heads, d)
    per_head = gamma.repeat_interleave(group)
    torch.testing.assert_close(after, before * per_head.view(-1, 1, 1, 1), rtol=1e-12, atol=1e-12)
    assert after.max().item() <= tau * (1 + 1e-12)
    assert torch.equal(lin.weight[(q_heads + kv_heads) * d:], v_rows)  # values untouched
    assert lin.weight.requires_grad and lin.weight.grad is None  # still a leaf parameter


def test_separate_projections_and_refusals_change_nothing():
    q = torch.nn.Linear(8, 12, dtype=torch.float64)
    k = torch.nn.Linear(8, 6, dtype=torch.float64)
    fused = torch.cat([q.weight, k.weight, torch.zeros(6, 8, dtype=torch.float64)]).detach()
    fused_bias = torch.cat([q.bias, k.bias, torch.zeros(6, dtype=torch.float64)]).detach()
    m = torch.tensor([9.0, 1.0, 3.0, 0.5], dtype=torch.float64)
    before = [t.detach().clone() for t in (q.weight, q.bias, k.weight, k.bias)]
    bad = [
        (dict(max_logits=torch.tensor([9.0, float("nan"), 1.0, 1.0], dtype=torch.float64)),
         "max_logits of query head 1 is nan"),
        (dict(max_logits=m[:3]), "max_logits must be a 1-D floating-point tensor of the 4"),
        (dict(max_logits=m, kv_heads=3), "q_heads \\(4\\) must be a multiple of kv_heads \\(3\\)"),
        (dict(max_logits=m, threshold=-1.0), "threshold must be finite and > 0"),
        (dict(max_logits=m, alpha=2.0), "alpha must be in \\[0, 1\\]"),
    ]
    for change, message in bad:
        args = dict(max_logits=m, q_heads=4, kv_heads=2, threshold=2.0, bias=q.bias,
                    k_weight=k.weight, k_bias=k.bias, **{})
        args.update(change)
        with pytest.raises(ValueError, match=message):
            qk_clip(q.weight, **args)
        for t, b in zip((q.weight, q.bias, k.weight, k.bias), before):
            assert torch.equal(t, b)
    with pytest.raises(ValueError, match="weight has 18 rows, the heads' layout 24"):
        qk_clip(fused[:18], m, q_heads=4, kv_heads=2, head_dim=3, threshold=2.0)
    gamma = qk_clip(q.weight, m, q_heads=4, kv_heads=2, threshold=2.0, bias=q.bias,
                    k_weight=k.weight, k_bias=k.bias)
    qk_clip(fused, m, q_heads=4, kv_heads=2, threshold=2.0, bias=fused_bias)
    assert torch.equal(fused[:12], q.weight) and torch.equal(fused[12:18], k.weight)
    assert torch.equal(fused_bias[:12], q.bias) and torch.equal(fused_bias[12:18], k.bias)
    assert gamma.tolist() == [2.0 / 9.0, 2.0 / 3.0]  # each group by its largest logit
