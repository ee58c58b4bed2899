"""The one non-finite decision for the steps Python assembles: fogo.Hybrid's two sides, and
fogo.Muon's owner-computed DTensor parameters beside its C++ step. The rule is the C++ one
(fogo::decide_nonfinite, include/fogo/nonfinite.h, through fogo._C), and so are the usability
test and the error; Python supplies only each gradient's policy and flag.

A step with only the C++ optimizer's own gradients (fogo.FOGO, fogo.Muon without owner-computed
parameters) is decided in C++ by the step itself."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from . import _C

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch without torch.distributed
    DTensor = None


class Item(NamedTuple):
    """One gradient of a step."""

    policy: str  #: its group's "nonfinite"
    usable: Optional[torch.Tensor]  #: its flag (a 0-d bool on the device); None for "unchecked"
    label: str  #: who steps it, for the error ("Muon", "fogo.Hybrid (rest side)")
    group: int  #: its group's index, and its own in the group, for the error
    index: int
    param: torch.Tensor
    name: Optional[str]  #: its name (a group's "param_names"), when known
    grad: Optional[torch.Tensor]  #: the whole gradient, for the error; None for a DTensor's


def usable(policies: Sequence[str], grads: Sequence[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Each gradient's flag (None where the policy is "unchecked", never tested): the C++ test
    (``_C.grad_usable``) of the whole gradient. A DTensor's whole gradient is no rank's: its norm
    comes from its shards' (the sum of their squares; one all-reduce per mesh for all of them,
    nothing read back), replicated ones from the local tensor; other layouts are gathered."""
    flags: list[Optional[torch.Tensor]] = [None] * len(grads)
    sharded: dict[object, list[tuple[int, torch.Tensor]]] = {}  # process group -> (k, |shard|^2)
    for k, (policy, grad) in enumerate(zip(policies, grads)):
        if policy == "unchecked":
            continue
        if DTensor is None or not isinstance(grad, DTensor):
            flags[k] = _C.grad_usable(grad)
        elif not any(pl.is_shard() or pl.is_partial() for pl in grad.placements):
            flags[k] = _C.grad_usable(grad.to_local())  # every rank holds it whole
        elif grad.device_mesh.ndim == 1 and all(pl.is_shard() for pl in grad.placements):
            square = _C.grad_norm(grad.to_local()).double().square()
            sharded.setdefault(grad.device_mesh.get_group(), []).append((k, square))
        else:
            flags[k] = _C.grad_usable(grad.full_tensor())
    for group, squares in sharded.items():  # in first-seen order: the same on every rank
        total = torch.stack([s for _, s in squares])
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=group)
        norms = total.sqrt()
        for j, (k, _) in enumerate(squares):
            flags[k] = _C.norm_usable(norms[j], grads[k].dtype)
    return flags


def whole(t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` unless it is a DTensor (no rank holds it whole): None then."""
    return None if DTensor is not None and isinstance(t, DTensor) else t


def decide(items: Sequence[Item], maskable: bool = True) -> Optional[_C.NonFiniteDecision]:
    """fogo::decide_nonfinite over ``items``: None to skip the step (nothing changes), else the
    decision to step with (kind "step", or "mask" with its flag ``ok``). Raises RuntimeError
    naming the parameter, as the C++ step does, for "raise"."""
    decision = _C.decide_nonfinite([it.policy for it in items], [it.usable for it in items],
                                   maskable)
    if decision.kind == "raise":
        it = items[decision.item]
        what = _C.describe_param(it.group, it.index, it.param)
        if it.name:
            what += f" '{it.name}'"
        _C.raise_unusable_grad(it.label, what, it.grad)
    return None if decision.kind == "skip" else decision


def mask_ok(decision: Optional[_C.NonFiniteDecision]) -> Optional[torch.Tensor]:
    """The flag a decision masks its step by, None when it does not mask."""
    return decision.ok if decision is not None and decision.kind == "mask" else None
