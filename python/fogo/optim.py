"""fogo.FOGO and fogo.Muon: torch.optim.Optimizers stepping with fogo's C++ optimizers (the
machinery they share, and how options and state reach the C++ step: _cpp_optimizer.py).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Iterable, Optional

import torch

from . import _C, _memory
from ._cpp_optimizer import (DTensor, Shard, _CppOptimizer, fresh_second_moment, listed_once,
                             normuon_dtype, repr_without_memory)
from ._row_shards import _RowShards

__all__ = ["FOGO", "Muon", "ns_schedules"]


def _signature(cpp: Any) -> inspect.Signature:
    defaults = cpp.default_options()
    P = inspect.Parameter
    params = [
        P("self", P.POSITIONAL_OR_KEYWORD),
        P("params", P.POSITIONAL_OR_KEYWORD),
        P("lr", P.POSITIONAL_OR_KEYWORD, default=defaults.pop("lr")),
    ]
    params += [P(k, P.KEYWORD_ONLY, default=v) for k, v in defaults.items()]
    return inspect.Signature(params)


def _options_doc(cpp: Any) -> str:
    return "\n".join(f"        {k} = {v!r}" for k, v in cpp.default_options().items())


class FOGO(_CppOptimizer):
    """FOGO, the Forgetting-aware Orthogonalization Optimizer (fogo::FOGO).

    Each param group is one codebook group; matrices (>= 2-D) only: send biases and norms to
    AdamW (see :func:`fogo.hybrid_param_groups`). Options (keywords, per group), with the C++
    defaults:

{options}

    ``ns_dtype`` is "auto" (bf16 where the device computes it faster than fp32: GPUs with bf16
    tensor cores, CPUs with AVX512-BF16/AMX as measured; else fp32; see
    :func:`fogo.ns_dtype_choices`) or a torch.dtype; ``projection_scale`` is "unit" or "jl";
    ``nonfinite`` is "raise" (NaN/Inf gradients raise, nothing changes), "skip" (the step is
    skipped), "unchecked" (no check and no host synchronisation; NaN/Inf reach the parameters)
    or "mask" (the step is skipped on the device, without a host synchronisation; the step
    counter still advances; telemetry's ``skipped_steps`` counts such steps).
    The paper's configurations: ``fogo.presets``.
    """

    _Cpp = _C.FOGO
    _fresh_keys = ("slow_momentum", "fast_momentum")

    def __init__(self, params: Iterable[Any], lr: Optional[float] = None, **options: Any):
        super().__init__(params, lr, **options)

    def _fresh_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        # fp32 whatever the parameter's dtype, contiguous (FOGOParamState).
        return fresh_second_moment({k: torch.zeros(p.shape, dtype=torch.float32, device=p.device)
                                    for k in self._fresh_keys}, p, group)

    def _cast_state(self, p: torch.Tensor, key: str, value: torch.Tensor) -> torch.Tensor:
        if key == "second_moment":
            return value.to(dtype=normuon_dtype(p), device=p.device)
        return value.to(dtype=torch.float32, device=p.device, memory_format=torch.contiguous_format)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self.param_groups[-1]["memory"] = _memory.empty(self.param_groups[-1])

    def __repr__(self) -> str:
        return repr_without_memory(self)

    def _snapshot_memory(self) -> None:
        # The memory is the C++ groups': param_groups must still be them (a group appended by
        # hand has none; step() refuses it, and so does this). A group listed again is the same
        # dict: its memory is its first listing's, as torch's state_dict represents it.
        groups = listed_once(self.param_groups)
        self._cpp.sync(self._cpp_groups(groups))
        extra = self._cpp.extra_state()
        for g, group in enumerate(groups):
            group["memory"] = _memory.from_archive(extra.get(f"fogo/group/{g}"), group)

    def _group_memory(self, groups: list[dict[str, Any]], state_dict: dict[str, Any]) -> dict:
        if "memory" in state_dict and not any("memory" in g for g in groups):
            return state_dict["memory"]  # the layout of fogo 0.1's state_dict()
        return _memory.to_archive(groups)

    def telemetry(self) -> list[dict[str, Any]]:
        """One dict per param group, from the last step (rbar, gamma_st, codebook_entropy, ...)."""
        return self._cpp.telemetry()

    def consolidate(self) -> None:
        """End of a task: freeze ``freeze_per_task`` centroids of every group."""
        self._sync()
        self._cpp.consolidate()

    def begin_task(self) -> None:
        """Start of a task: momenta and the conflict EMA to zero, task-start codebook snapshot."""
        self._sync()
        self._cpp.begin_task()

    def task_boundary(self) -> None:
        """consolidate() then begin_task()."""
        self._sync()
        self._cpp.task_boundary()

    def memory(self, group: int = 0) -> dict[str, Optional[torch.Tensor]]:
        """A copy of a group's memory: centroids, S, N, frozen, frozen_nu (None before the first
        step)."""
        return self._cpp.memory(group)


class Muon(_CppOptimizer):
    """Muon (fogo::Muon): bit-identical to torch.optim.Muon on the CPU with
    ``ns_dtype=torch.bfloat16`` (the default "auto" is bf16 only where bf16 is the faster), plus
    N-D weights viewed as matrices and NaN/Inf checks. Options (keywords, per group), with the C++ defaults:

{options}

    ``ns_dtype`` is "auto" (as for :class:`FOGO`) or a torch.dtype: ``torch.bfloat16`` is
    torch.optim.Muon's arithmetic bit for bit on every host.
    ``adjust_lr_fn`` (torch.optim.Muon's name; fogo 0.1's ``adjust_lr`` is accepted for it) is
    "original" (also given as None, torch.optim.Muon's default), "match_rms_adamw" or
    "spectral" (fogo's: lr sqrt(rows / cols), unclamped; torch.optim.Muon has no such rule).
    Param groups and checkpoints cross with torch.optim.Muon both ways (``load_state_dict``).
    ``normuon`` (NorMuon, docs/muon.md): each row of the orthogonalized update divided by the
    root of its second moment, ``opt.state[p]["second_moment"]`` ([rows], fp32; fp64 for an fp64
    parameter; zeros from construction, or from the next step where normuon is switched on;
    kept, unused, where it is switched off). A checkpoint without it (torch.optim.Muon's) starts
    it afresh; docs/python.md says how it travels.
    ``nonfinite`` is "raise", "skip", "unchecked" (torch.optim.Muon's behaviour) or "mask", as
    for :class:`FOGO`.

    ``dtensor`` (not a group option) chooses the scheme for DTensor parameters sharded by rows
    over a 1-D mesh of more than one rank (FSDP2's ``fully_shard``): "owner" (the default:
    owner-computes, sharded momenta) or "gather" (every rank computes, as fogo.FOGO);
    docs/python.md, "FSDP2 and DTensor parameters".
    """

    _Cpp = _C.Muon
    _aliases = {"adjust_lr": "adjust_lr_fn"}  # fogo 0.1's name
    _fresh_keys = ("momentum_buffer",)
    _schemes = ("owner", "gather")

    def __init__(self, params: Iterable[Any], lr: Optional[float] = None, *,
                 dtensor: str = "owner", **options: Any):
        if dtensor not in self._schemes:
            raise ValueError(f"Muon: option 'dtensor' must be one of {self._schemes}, "
                             f"got {dtensor!r}")
        self._dtensor = dtensor  # read by add_param_group, in super().__init__
        super().__init__(params, lr, **options)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_dtensor": self._dtensor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dtensor = state.pop("_dtensor", "owner")
        super().__setstate__(state)

    # -- owner-computes for DTensor parameters ------------------------------------------------
    #
    # Each row-sharded matrix has one owner rank (fogo::assign_owners: greedy by Newton-Schulz
    # cost, costliest first to the least-loaded rank; the same on every rank). The step is the
    # C++ one (fogo::muon_step_rows: momentum, Nesterov, Newton-Schulz, decay and update, the
    # bits of fogo.Muon's step on the whole matrices); Python supplies only where the rows live:
    # the owner gathers each momentum-updated (Nesterov) matrix and scatters its orthogonalized
    # rows back (_RowShards). The momentum is a DTensor laid out as its parameter, and so is
    # NorMuon's second moment (its rows with the parameter's): the owner gathers it with the
    # update, normalizes, and scatters it back with the rows.

    def _owner_computes(self, p: torch.Tensor) -> bool:
        return (self._dtensor == "owner" and p.device_mesh.ndim == 1
                and p.device_mesh.size() > 1 and tuple(p.placements) == (Shard(0),))

    def _owned(self) -> list[tuple[dict[str, Any], int, torch.Tensor, int]]:
        """(group, index, parameter, owner's rank in the mesh) of every owner-computed
        parameter, in group order (every rank issues the collectives in this order)."""
        items = [(group, i, p) for group in self.param_groups
                 for i, p in enumerate(group["params"])
                 if id(p) in self._locals and not group["batch_dims"]]
        owners = [0] * len(items)
        meshes: dict[Any, list[int]] = {}  # each mesh's ranks balanced on their own
        for k, (_, _, p) in enumerate(items):
            meshes.setdefault(p.device_mesh, []).append(k)
        for mesh, ks in meshes.items():
            assigned = _C.assign_owners([list(items[k][2].shape) for k in ks], mesh.size())
            for k, owner in zip(ks, assigned):
                owners[k] = owner
        return [(g, i, p, r) for (g, i, p), r in zip(items, owners)]

    def _owner_step(self, ok: Optional[torch.Tensor]) -> None:
        owned = [(group, p, owner) for group, _, p, owner in self._owned() if p.grad is not None]
        for group in self.param_groups:  # each group with its options, in order
            if group["batch_dims"]:
                self._local_experts_step(group, ok)
                continue
            mine = [(p, owner) for g, p, owner in owned if g is group]
            if not mine:
                continue
            shards = [_RowShards(p, owner) for p, owner in mine]  # where each one's rows live
            _C.muon_step_rows(
                [p.to_local() for p, _ in mine], [p.grad.to_local() for p, _ in mine],
                [self.state[p]["momentum_buffer"].to_local() for p, _ in mine],
                [self.state[p]["second_moment"].to_local() for p, _ in mine]
                if group["normuon"] else [],
                [s.rows for s in shards], [s.first_row for s in shards], group, ok,
                lambda k, rows: shards[k].gather(rows),
                lambda k, whole, out: shards[k].scatter(whole, out))

    def _local_experts_step(self, group: dict[str, Any], ok: Optional[torch.Tensor]) -> None:
        """A group of stacks (batch_dims) sharded along their experts: each rank holds whole
        experts (FSDP2's Shard(0) over the leading batch dimension) and steps its own, each as a
        matrix of its own (fogo::muon_step_rows with the whole matrix here: nothing travels),
        the bits of the unsharded step."""
        b = group["batch_dims"]
        params = [p for p in group["params"] if id(p) in self._locals and p.grad is not None]
        if not params:
            return

        def experts(t: torch.Tensor, dims: int) -> list[torch.Tensor]:
            local = t.to_local() if isinstance(t, DTensor) else t
            # a view (never a copy: the step writes through it); a rank may hold no expert
            count = math.prod(local.shape[:b])
            return list(local.view((count,) + tuple(local.shape[b:dims])).unbind(0))

        mats = [e for p in params for e in experts(p, p.dim())]
        if not mats:
            return
        grads = [e for p in params for e in experts(p.grad, p.dim())]
        bufs = [e for p in params for e in experts(self.state[p]["momentum_buffer"], p.dim())]
        second = ([e for p in params for e in experts(self.state[p]["second_moment"], b + 1)]
                  if group["normuon"] else [])

        def scatter(k: int, whole: torch.Tensor, out: torch.Tensor) -> None:
            out.copy_(whole)

        _C.muon_step_rows(mats, grads, bufs, second, [m.shape[0] for m in mats], [0] * len(mats),
                          {**group, "batch_dims": 0}, ok, lambda k, rows: rows, scatter)

    def _fresh_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        return fresh_second_moment(
            {"momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format)}, p, group)

    def _cast_state(self, p: torch.Tensor, key: str, value: torch.Tensor) -> torch.Tensor:
        if key == "second_moment":
            return value.to(dtype=normuon_dtype(p), device=p.device)
        # torch.optim.Optimizer.load_state_dict's rule: floating state takes the parameter's dtype.
        if p.is_floating_point():
            return value.to(dtype=p.dtype, device=p.device)
        return value.to(device=p.device)

    def graph_stats(self, group: int = 0) -> dict[str, int]:
        """With ``cuda_graph=True``: how often group ``group``'s step was captured in a CUDA graph
        and run from one (``captures``, ``replays``)."""
        self._sync()
        return self._cpp.graph_stats(group)


for _cls in (FOGO, Muon):
    _cls.__init__.__signature__ = _signature(_cls._Cpp)  # type: ignore[attr-defined]
    _cls.__doc__ = _cls.__doc__.format(options=_options_doc(_cls._Cpp))
_sig = Muon.__init__.__signature__  # type: ignore[attr-defined]
Muon.__init__.__signature__ = _sig.replace(parameters=[  # type: ignore[attr-defined]
    *_sig.parameters.values(),
    inspect.Parameter("dtensor", inspect.Parameter.KEYWORD_ONLY, default="owner")])


def ns_schedules() -> dict[str, dict[str, Any]]:
    """The published Newton-Schulz coefficient lists (fogo::ns_named_schedules), by name:
    ``rows`` (one (a, b, c) per iteration, the value of the option ``ns_coefficient_schedule``:
    iteration k runs row min(k, len - 1)), ``source``, and the range its tests check (``steps``
    iterations take normalised singular values in [``l``, 1] into [``lo``, ``hi``]); docs/muon.md
    cites them. ``fogo.Muon(params, ns_steps=10,
    ns_coefficient_schedule=fogo.optim.ns_schedules()["deepseek_v4"]["rows"])``."""
    return {s["name"]: s for s in _C.ns_named_schedules()}
