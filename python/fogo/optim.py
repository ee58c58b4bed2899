"""fogo.FOGO and fogo.Muon: torch.optim.Optimizers stepping with fogo's C++ optimizers.

``param_groups`` (Python) hold the parameters and every option; the C++ optimizer holds the
state. Before each C++ call the groups are handed over (the same tensors, checked by identity,
and every option), so learning-rate schedulers and hand-edited options take effect at the next
step, as with torch's own optimizers.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Optional

import torch

from . import _C

__all__ = ["FOGO", "Muon"]


class _CppOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step, state and checkpoints are a C++ optimizer's."""

    _Cpp: Any = None  # the fogo._C class

    def __init__(self, params: Iterable[Any], lr: Optional[float] = None, **options: Any):
        defaults = self._Cpp.default_options()
        unknown = sorted(set(options) - set(defaults))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.__init__() got unexpected keyword argument(s) "
                f"{', '.join(map(repr, unknown))}; options: {', '.join(defaults)}"
            )
        if lr is not None:
            options["lr"] = lr
        defaults.update(options)
        # The C++ constructor validates the defaults (ranges, types) and raises its message.
        self._cpp = self._Cpp(defaults)
        super().__init__(params, defaults)

    # -- param groups -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        # A misspelt option would otherwise sit in the group, unused, while the default applies.
        # Besides the options a group may carry its parameters' names and its own name (as
        # hybrid_param_groups' groups do).
        known = {"params", "param_names", "name"} | set(self.defaults)
        unknown = sorted(set(param_group) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.add_param_group: unknown option(s) "
                f"{', '.join(map(repr, unknown))}; options: {', '.join(self.defaults)}"
            )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._cpp.add_param_group(group["params"], group)
        except BaseException:
            self.param_groups.pop()
            raise

    def _sync(self) -> None:
        self._cpp.sync(self.param_groups)

    # -- stepping -----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every param group; ``closure`` (re-evaluating the loss) runs first."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync()
        self._cpp.step()
        return loss

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: tensor}}, "param_groups": [...]}`` as torch.optim lays it
        out (parameters numbered across groups), plus ``"memory"`` for state that belongs to no
        parameter (FOGO's per-group codebooks, frozen banks, generators and counters) as dicts of
        tensors and numbers. Tensors are copies of the optimizer's state."""
        self._sync()
        state, extra = self._cpp.state_dict()
        groups, index = [], 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(saved)
        out: dict[str, Any] = {"state": state, "param_groups": groups}
        if extra:
            out["memory"] = extra
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state_dict() of an optimizer over the same parameter layout. Checked first
        (group count and sizes here, shapes and memory layout in C++); a rejected state_dict
        leaves the optimizer as it was. Options come from the state_dict, as with torch.optim."""
        name = type(self).__name__
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"{name}.load_state_dict: the state_dict has {len(saved_groups)} param groups, "
                f"this optimizer {len(self.param_groups)}"
            )
        where = {}
        for g, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"{name}.load_state_dict: param group {g} of the state_dict has "
                    f"{len(saved['params'])} parameters, this optimizer's {len(group['params'])}"
                )
            for i, key in enumerate(saved["params"]):
                where[key] = (g, i)
        state = {}
        for key, value in state_dict["state"].items():
            if key not in where:
                raise ValueError(f"{name}.load_state_dict: state for unknown parameter {key!r}")
            state[where[key]] = value
        self._sync()
        self._cpp.load_state_dict(saved_groups, state, state_dict.get("memory", {}))
        super().load_state_dict({"state": {}, "param_groups": saved_groups})

    # Python's own view of the state stays empty (the state lives in C++): state_dict() has it.


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

    ``ns_dtype`` is a torch.dtype; ``projection_scale`` is "unit" or "jl"; ``nonfinite`` is
    "raise" (NaN/Inf gradients raise, nothing changes), "skip" (the step is skipped),
    "unchecked" (no check and no host synchronisation; NaN/Inf reach the parameters) or "mask"
    (the step is skipped on the device, without a host synchronisation; the step counter still
    advances; telemetry's ``skipped_steps`` counts such steps).
    The paper's configurations: ``fogo.presets``.
    """

    _Cpp = _C.FOGO

    def __init__(self, params: Iterable[Any], lr: Optional[float] = None, **options: Any):
        super().__init__(params, lr, **options)

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
    """Muon (fogo::Muon): bit-identical to torch.optim.Muon on the CPU, plus N-D weights viewed as
    matrices and NaN/Inf checks. Options (keywords, per group), with the C++ defaults:

{options}

    ``adjust_lr`` is "original" (torch.optim.Muon's default, also given as None) or
    "match_rms_adamw"; torch.optim.Muon's ``adjust_lr_fn`` keyword is accepted for it.
    ``nonfinite`` is "raise", "skip", "unchecked" (torch.optim.Muon's behaviour) or "mask", as
    for :class:`FOGO`.
    """

    _Cpp = _C.Muon

    def __init__(self, params: Iterable[Any], lr: Optional[float] = None, **options: Any):
        if "adjust_lr_fn" in options:  # torch.optim.Muon's name
            options["adjust_lr"] = options.pop("adjust_lr_fn")
        super().__init__(params, lr, **options)

    def graph_stats(self, group: int = 0) -> dict[str, int]:
        """With ``cuda_graph=True``: how often group ``group``'s step was captured in a CUDA graph
        and run from one (``captures``, ``replays``)."""
        self._sync()
        return self._cpp.graph_stats(group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "adjust_lr_fn" in param_group:  # torch.optim.Muon's name
            param_group = dict(param_group)
            param_group["adjust_lr"] = param_group.pop("adjust_lr_fn")
        super().add_param_group(param_group)


for _cls in (FOGO, Muon):
    _cls.__init__.__signature__ = _signature(_cls._Cpp)  # type: ignore[attr-defined]
    _cls.__doc__ = _cls.__doc__.format(options=_options_doc(_cls._Cpp))
