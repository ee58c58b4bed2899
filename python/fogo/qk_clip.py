"""QK-Clip (MuonClip, as Kimi K2 trained with it): fogo::qk_clip (include/fogo/qk_clip.h) for
torch tensors and DTensors. After the optimizer step, each key head's group of query heads whose
largest pre-softmax logit of the step exceeded ``threshold`` has its query rows scaled by
gamma^alpha and its key rows by gamma^(1 - alpha), gamma = threshold / that logit, so the logit
would be at the threshold; groups at or under it are untouched. docs/muon.md, "QK-Clip".

    from fogo.qk_clip import qk_clip
    opt.step()
    qk_clip(attn.c_attn.weight, max_logits, q_heads=12, threshold=100.0, bias=attn.c_attn.bias)
"""

from typing import Optional

import torch

from . import _C

try:  # DTensor parameters (FSDP2's fully_shard)
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # torch without torch.distributed
    DTensor = Shard = None

__all__ = ["qk_clip", "all_reduce_max_logits"]


def _rows(t: Optional[torch.Tensor], what: str) -> tuple[Optional[torch.Tensor], int]:
    """A weight's (or bias's) tensor to scale in place and its first row of the whole: a DTensor
    row-sharded over a 1-D mesh (FSDP2's Shard(0)) as its local rows, laid out as torch.chunk
    (ceil(rows / world) a rank; fogo/_row_shards.py); a plain tensor whole (-1)."""
    if t is None or DTensor is None or not isinstance(t, DTensor):
        return t, -1
    mesh = t.device_mesh
    if mesh.ndim != 1 or t.placements != (Shard(0),):
        raise ValueError(f"qk_clip: {what} is a DTensor laid out as {t.placements} over a "
                         f"{mesh.ndim}-D mesh; only rows sharded over a 1-D mesh (Shard(0)) "
                         "are taken")
    chunk = -(-t.shape[0] // mesh.size())
    return t.to_local(), min(mesh.get_local_rank() * chunk, t.shape[0])


@torch.no_grad()
def qk_clip(weight: torch.Tensor, max_logits: torch.Tensor, *, q_heads: int,
            threshold: float, kv_heads: Optional[int] = None, head_dim: Optional[int] = None,
            alpha: float = 0.5, bias: Optional[torch.Tensor] = None,
            k_weight: Optional[torch.Tensor] = None,
            k_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """QK-Clip in place; returns gamma of each key head's group (float64, CPU, [kv_heads]).

    ``weight``: a fused [q | k | v] projection's weight [rows, in] (rows q_heads * head_dim, then
    kv_heads * head_dim twice: Muon's and FOGO's ``blocks`` for it), or, with ``k_weight``, the
    query projection alone (and ``k_weight`` the key projection). ``bias``/``k_bias``: their
    biases (scaled with their rows). ``max_logits``: [q_heads], each query head's largest logit
    (softmax input, 1/sqrt(d) included) of the step, the same on every rank: all-reduce it (MAX,
    :func:`all_reduce_max_logits`) over the ranks that saw other data first. ``kv_heads``
    defaults to ``q_heads`` (multi-head), ``head_dim`` to what the rows give. DTensor weights
    row-sharded over a 1-D mesh (FSDP2) are clipped rank by rank, each its own rows. Every check
    (layout, shapes, non-finite logits: ValueError naming it) runs before anything changes.
    """
    kv_heads = q_heads if kv_heads is None else kv_heads
    if head_dim is None:  # the rows' (a layout they do not divide into is refused in C++)
        heads = q_heads if k_weight is not None else q_heads + 2 * kv_heads
        head_dim = max(weight.shape[0] // max(heads, 1), 1)
    if k_weight is not None and any(DTensor is not None and isinstance(t, DTensor)
                                    for t in (weight, bias, k_weight, k_bias)):
        raise ValueError("qk_clip: separate query and key weights are taken whole (plain "
                         "tensors); a sharded attention passes its fused weight")
    local, first_row = _rows(weight, "the weight")
    local_bias, bias_first = _rows(bias, "the bias")
    if bias is not None and bias_first != first_row:
        raise ValueError("qk_clip: the bias is not sharded as the weight")
    if DTensor is not None and isinstance(max_logits, DTensor):
        max_logits = max_logits.full_tensor()
    return _C.qk_clip(local, local_bias, max_logits, q_heads, kv_heads, head_dim, threshold,
                      alpha, first_row, k_weight, k_bias)


def all_reduce_max_logits(max_logits: torch.Tensor, group=None) -> torch.Tensor:
    """``max_logits`` (in place) the largest over the ranks of ``group`` (the default: every
    rank), for ranks that saw other data: what :func:`qk_clip` must be given on each."""
    torch.distributed.all_reduce(max_logits, op=torch.distributed.ReduceOp.MAX, group=group)
    return max_logits
