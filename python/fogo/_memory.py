"""FOGO's group-level memory as a param-group entry of the state_dict (``group["memory"]``).

The C++ checkpoint (src/fogo/checkpoint.cpp) keeps each group's memory under "fogo/group/<g>". In
the Python state_dict it sits in its group, laid out so that torch.distributed.checkpoint can
load it into the state_dict of a fresh optimizer: DCP loads a tensor in place and refuses one of
another shape, so every tensor here has the same shape from construction on (zeros until the
memory exists; ``"undefined"`` names those that C++ does not hold yet), and what grows (the frozen
bank, one block per task) or may not exist (the last step's statistics) is a list of floats, which
DCP stores whole. fp32 values round-trip exactly through Python floats.

Keys: ``created`` (the group has stepped, or loaded memory; before that the C++ optimizer seeds
its generator afresh), ``initialized``, ``consolidated``, ``step``, ``generator`` (the CPU
generator's state), ``undefined``, and one per tensor the C++ checkpoint saves, from its one list
(``GroupMemory::visit``, src/fogo_private/fogo/state.h, through ``fogo._C.memory_fields()``): a tensor where its
shape comes from the group's options alone (``centroids`` [C, d], ``S`` [C, d], ``N`` [C],
``start`` [C, d], ``rbar`` []), else a list (``frozen`` [F][d], ``frozen_nu`` [F], ``stats`` [K];
None: undefined).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import _C

#: The tensors a checkpoint saves, (name, shape) in the archive's order: the shape a string of
#: dimensions (C codebook_size, d proj_dim, F the frozen bank's size, K the statistics').
_SAVED = [(name, shape) for name, uses, shape in _C.memory_fields() if "saved" in uses]
#: Tensors of fixed shape, by (codebook_size C, proj_dim d): those whose dimensions are all C or d.
_FIXED = {name: shape for name, shape in _SAVED if set(shape) <= {"C", "d"}}
#: The others: what grows or may not exist, as lists of floats.
_LISTS = tuple(name for name, _ in _SAVED if name not in _FIXED)
_FLAGS = ("initialized", "consolidated")
#: The memory's floating dtype (the projected space is fp32 whatever the parameters').
_DTYPE = torch.float32
_GENERATOR_STATE = torch.Generator().get_state().numel()


def _shape(shape: str, C: int, d: int) -> tuple[int, ...]:
    return tuple({"C": C, "d": d}[dim] for dim in shape)


def _device(group: dict[str, Any]) -> torch.device:
    return group["params"][0].device if group["params"] else torch.device("cpu")


def _undefined(t: torch.Tensor) -> bool:
    return t.dim() == 1 and t.numel() == 0  # the C++ checkpoint's mark for an undefined tensor


def empty(group: dict[str, Any]) -> dict[str, Any]:
    """A group's memory before it exists."""
    C, d, device = group["codebook_size"], group["proj_dim"], _device(group)
    mem: dict[str, Any] = {"created": False, "initialized": False, "consolidated": False, "step": 0}
    for k, shape in _FIXED.items():
        mem[k] = torch.zeros(_shape(shape, C, d), dtype=_DTYPE, device=device)
    mem["generator"] = torch.zeros(_GENERATOR_STATE, dtype=torch.uint8)
    for k in _LISTS:
        mem[k] = None
    mem["undefined"] = list(_FIXED)
    return mem


def from_archive(entry: Optional[dict[str, Any]], group: dict[str, Any]) -> dict[str, Any]:
    """The state_dict form of a "fogo/group/<g>" archive entry (None: no memory yet)."""
    mem = empty(group)
    if entry is None:
        return mem
    mem["created"] = True
    mem["step"] = int(entry["step"])
    for k in _FLAGS:
        mem[k] = bool(entry.get(k, False))
    mem["generator"] = entry["generator"]
    mem["undefined"] = []
    for k in _FIXED:
        if _undefined(entry[k]):
            mem["undefined"].append(k)
        else:
            mem[k] = entry[k]
    for k in _LISTS:
        mem[k] = None if _undefined(entry[k]) else entry[k].tolist()
    return mem


def to_archive(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The C++ archive's FOGO entries from the groups' ``"memory"`` (a checkpoint's groups)."""
    extra: dict[str, Any] = {"fogo/format": 1}
    count = 0
    for g, group in enumerate(groups):
        mem = group.get("memory")
        if mem is None:
            raise ValueError(
                f"FOGO.load_state_dict: param group {g} of the state_dict has no 'memory': not a "
                "FOGO checkpoint"
            )
        if not mem["created"]:
            continue
        if count != g:
            raise ValueError(
                f"FOGO.load_state_dict: param group {g} has memory but group {count} has none; "
                "groups create their memory in order"
            )
        count += 1
        entry: dict[str, Any] = {"step": int(mem["step"]), "generator": mem["generator"]}
        for k in _FLAGS:
            entry[k] = bool(mem[k])
        for k in _FIXED:
            entry[k] = torch.empty(0) if k in mem["undefined"] else mem[k]
        for k in _LISTS:
            entry[k] = torch.empty(0) if mem[k] is None else torch.tensor(mem[k], dtype=_DTYPE)
        extra[f"fogo/group/{g}"] = entry
    extra["fogo/groups"] = count
    return extra
