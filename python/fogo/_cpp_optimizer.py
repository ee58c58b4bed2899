"""The machinery fogo.FOGO and fogo.Muon share (optim.py): a torch.optim.Optimizer whose step is a
C++ optimizer's, with the hand-over of options and state before each C++ call, state_dict and
load_state_dict, the non-finite decision, DTensor (FSDP2) parameters as full shadows or (fogo.Muon)
their local shards with state laid out as the parameter (the owner-computes step: optim.py).

``param_groups`` (Python) hold the parameters and every option, ``opt.state`` every parameter's
state tensors, which the C++ optimizer steps in place (the same storage). Before each C++ call
both are handed over (the same tensors, checked by identity; tensors that changed are checked and
adopted; the options when they changed since the last hand-over: a scheduler's lr, a user's
edit), so learning-rate schedulers, hand-edited options and state written by other code take
effect at the next step, as with torch's own optimizers.
"""


import copy
import inspect
from collections import defaultdict
from typing import Any, Callable, Iterable, Optional

import torch

from . import _C, _memory, _nonfinite
from ._torch_optim import (check_tensor_lr, evaluate_closure, listed_once,  # noqa: F401
                           repr_without_memory, run_load_post_hooks, run_load_pre_hooks)

try:  # DTensor parameters (FSDP2's fully_shard, tensor parallelism)
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
except ImportError:  # torch without torch.distributed
    DTensor = Shard = distribute_tensor = None


class _CppOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step is a C++ optimizer's.

    ``opt.state[p]`` holds every parameter's state tensors from construction on, and they are the
    C++ step's own (the same storage, updated in place by each step): code that reads or writes
    ``opt.state`` the torch way (``state_dict()``, DCP, ZeroRedundancyOptimizer, hooks) sees and
    changes the truth. Tensors put into ``opt.state`` by hand or by a library are adopted by the
    C++ optimizer at the next step, after checks (shape, device, dtype).
    """

    _Cpp: Any = None  # the fogo._C class
    #: Other names accepted for an option (renamed to its group key).
    _aliases: dict[str, str] = {}
    #: Group keys besides the options: the parameters' names, the group's own name and side (as
    #: hybrid_param_groups' and fogo.Hybrid's groups carry).
    _group_extras = frozenset({"params", "param_names", "name", "side"})

    def __init__(self, params: Iterable[Any], lr: Optional[float] = None, **options: Any):
        options = self._renamed(options)
        defaults = self._Cpp.default_options()
        unknown = sorted(set(options) - set(defaults))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.__init__() got unexpected keyword argument(s) "
                f"{', '.join(map(repr, unknown))}; options: {', '.join(defaults)}"
            )
        check_tensor_lr(lr)
        if lr is not None:
            options["lr"] = lr
        defaults.update(options)
        # The C++ constructor validates the defaults (ranges, types) and raises its message.
        self._cpp = self._Cpp(defaults)
        self._shadows: dict[int, torch.Tensor] = {}  # id(DTensor parameter) -> full shadow
        self._written: dict[int, torch.Tensor] = {}  # ... -> the local shard the shadow holds
        self._locals: dict[int, torch.Tensor] = {}  # id(owner-computed parameter) -> its shard
        self._synced: Optional[tuple] = None  # the options last handed over (_options_key)
        super().__init__(params, defaults)

    @classmethod
    def _renamed(cls, options: dict[str, Any]) -> dict[str, Any]:
        for old, new in cls._aliases.items():
            if old in options:
                options = dict(options)
                options[new] = options.pop(old)
        return options

    # -- to override --------------------------------------------------------------------------

    #: The state keys every parameter has (its fresh state's, whatever the options).
    _fresh_keys: tuple[str, ...] = ()

    def _fresh_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        """A parameter's state before its first step under ``group``'s options (what the C++
        step would create)."""
        raise NotImplementedError

    def _fresh_keys_of(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The keys _fresh_state makes under ``group``'s options (NorMuon's second moment where
        ``normuon`` is on, for both optimizers): a parameter's state lacking one gets it at the
        next step."""
        return self._fresh_keys + (("second_moment",) if group.get("normuon") else ())

    def _state_shape(self, p: torch.Tensor, key: str) -> tuple[int, ...]:
        """The (global) shape of parameter ``p``'s state tensor ``key``: NorMuon's second moment
        one per row of each matrix under its group's batch_dims (fogo::row_state_sizes); the
        others the parameter's."""
        if key != "second_moment":
            return tuple(p.shape)
        group = next((g for g in self.param_groups if any(q is p for q in g["params"])), {})
        return tuple(_C.row_state_sizes(list(p.shape), group.get("batch_dims", 0)))

    def _cast_state(self, p: torch.Tensor, key: str, value: torch.Tensor) -> torch.Tensor:
        """A loaded state tensor ``key`` of parameter ``p`` as the step needs it."""
        raise NotImplementedError

    def _group_memory(self, groups: list[dict[str, Any]], state_dict: dict[str, Any]) -> dict:
        """The C++ archive's entries beyond LibTorch's for ``groups`` (a checkpoint's)."""
        return {}

    def _snapshot_memory(self) -> None:
        """Group-level state into the param groups (FOGO's memory), before they are saved."""

    def _owner_computes(self, p: torch.Tensor) -> bool:
        """Whether DTensor parameter ``p`` is stepped by owner-computes (fogo.Muon) instead of
        the all-gather scheme."""
        return False

    def _owner_step(self, ok: Optional[torch.Tensor]) -> None:
        """The owner-computed parameters' step, after the C++ step; masked by ``ok`` (the step's
        flag under "mask": where it is false, their shards and momenta keep their bits)."""

    # -- param groups -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        param_group = self._renamed(param_group)
        # A misspelt option would otherwise sit in the group, unused, while the default applies.
        known = self._group_extras | set(self.defaults)
        unknown = sorted(set(param_group) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.add_param_group: unknown option(s) "
                f"{', '.join(map(repr, unknown))}; options: {', '.join(self.defaults)}"
            )
        check_tensor_lr(param_group.get("lr"))
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._cpp.add_param_group(self._bind(group["params"]), group,
                                      self._shape_probes(group["params"]))
        except BaseException:
            self.param_groups.pop()
            raise
        # Every parameter's state exists from the start: every rank of a distributed run holds
        # the same keys before the first step, and DCP never steps to "initialise" it.
        for p in group["params"]:
            self.state[p] = self._new_state(p, group)
        self._adopt()

    # -- sharded (DTensor) parameters ---------------------------------------------------------
    #
    # The C++ step needs each matrix whole (Newton-Schulz orthogonalizes the full matrix; FOGO's
    # codebook reads all of its rows), which no rank holds of a DTensor. Each DTensor parameter
    # gets a full-size shadow: before a step every rank all-gathers the gradient into it (and the
    # parameter, when some rank's shard is not what the last step wrote), steps the full matrices
    # (the same inputs and CPU/GPU arithmetic on every rank: the same result, FOGO's codebook
    # included), and writes its own shard back. The state (momenta) is full-size and the same on
    # every rank. docs/python.md counts the communication.

    def _bind(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors the C++ optimizer holds for ``params``: a full shadow for a DTensor; for
        an owner-computed one its local shard, which never has a gradient (the C++ step skips
        it; it stands in the groups and the checkpoint layout)."""
        for p in params:
            if DTensor is None or not isinstance(p, DTensor):
                continue
            if self._owner_computes(p):
                self._locals[id(p)] = p.to_local().detach()
            elif id(p) not in self._shadows:
                with torch.no_grad():
                    self._shadows[id(p)] = p.full_tensor().detach().clone()
                    self._written[id(p)] = p.to_local().detach().clone()
        return [self._cpp_param(p) for p in params]

    def _shape_probes(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """What the C++ optimizer's checks of ``params`` (bound) see: the whole shape of an
        owner-computed parameter (its local rows stand in for it, but a fused weight's blocks
        span the ranks), as a stride-0 view of one element on its device; the bound tensor
        otherwise."""
        return [self._locals[id(p)].new_empty(()).expand(p.shape) if id(p) in self._locals
                else self._cpp_param(p) for p in params]

    def _cpp_param(self, p: torch.Tensor) -> torch.Tensor:
        return self._shadows.get(id(p), self._locals.get(id(p), p))

    def _new_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        if id(p) in self._locals:  # sharded like the parameter
            return {k: self._as_dtensor(p, k, v)
                    for k, v in self._fresh_state(self._locals[id(p)], group).items()}
        return self._fresh_state(self._cpp_param(p), group)

    def _as_dtensor(self, p: torch.Tensor, key: str, local: torch.Tensor) -> torch.Tensor:
        """This rank's rows of owner-computed parameter ``p``'s state tensor ``key`` as a DTensor
        laid out as ``p`` (rows sharded alike: a [rows] second moment as a [rows, ...] matrix)."""
        shape = self._state_shape(p, key)
        stride = (p.stride() if shape == tuple(p.shape)
                  else torch.empty(shape, device="meta").stride())
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                  shape=shape, stride=stride)

    def _cpp_state(self, p: torch.Tensor, st: dict[str, Any]) -> dict[str, Any]:
        """A parameter's opt.state as the C++ optimizer holds it: owner-computed ones' local
        shards."""
        if id(p) not in self._locals:
            return st
        return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in st.items()}

    def _from_cpp_state(self, p: torch.Tensor, st: dict[str, Any]) -> dict[str, Any]:
        if id(p) not in self._locals:
            return st
        return {k: self._as_dtensor(p, k, v) if isinstance(v, torch.Tensor) else v
                for k, v in st.items()}

    def _local_value(self, p: torch.Tensor, key: str, value: torch.Tensor,
                     where: str) -> torch.Tensor:
        """A loaded state tensor ``key`` of owner-computed parameter ``p`` (``where``: which one,
        for the message) as its local shard: a DTensor laid out as the parameter, or a full
        tensor (an unsharded checkpoint) sliced."""
        if id(p) not in self._locals:
            return value
        shape = self._state_shape(p, key)
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: state '{key}' of {where} has shape "
                f"{tuple(value.shape)}, expected {shape} (the parameter's {tuple(p.shape)})")
        if isinstance(value, DTensor):
            value = value.full_tensor() if value.placements != p.placements else value
            if isinstance(value, DTensor):
                return value.to_local()
        return distribute_tensor(value.to(p.device), p.device_mesh, p.placements,
                                 src_data_rank=None).to_local()

    def _cpp_groups(self, groups: Optional[list[dict[str, Any]]] = None) -> list[dict[str, Any]]:
        """``groups`` (param_groups by default) as the C++ optimizer holds them (shadows and local
        shards for DTensor parameters)."""
        groups = self.param_groups if groups is None else groups
        if not self._shadows and not self._locals:
            return groups
        return [{**g, "params": [self._cpp_param(p) for p in g["params"]]} for g in groups]

    def _sharded(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # In group order: every rank issues the collectives in the same order.
        return [(p, self._shadows[id(p)]) for g in self.param_groups for p in g["params"]
                if id(p) in self._shadows]

    def _gather(self) -> None:
        sharded = self._sharded()
        if self._shards_changed(sharded):
            for p, shadow in sharded:
                shadow.copy_(p.full_tensor())
                self._written[id(p)] = p.to_local().detach().clone()
        for p, shadow in sharded:
            shadow.grad = None if p.grad is None else p.grad.full_tensor()

    def _shards_changed(self, sharded: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Whether, on some rank, some parameter's shard is not what the last step wrote (other
        code changed it: model.load_state_dict, an EMA swap): one all-reduce of a flag, where
        gathering every parameter at every step would cost an all-gather each."""
        changed = torch.stack([torch.ne(p.to_local(), self._written[id(p)]).any()
                               for p, _ in sharded]).any()
        flag = changed.to(torch.int32).reshape(1)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _scatter(self) -> None:
        for p, shadow in self._sharded():
            if shadow.grad is None:
                continue
            mine = distribute_tensor(shadow, p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(mine.to_local())
            self._written[id(p)] = mine.to_local().clone()
            shadow.grad = None

    def _sync(self) -> None:
        """The param groups' options (when they changed) and opt.state into the C++ optimizer."""
        self._check_listed_once()
        groups = self._cpp_groups()
        key = _options_key(groups, self.defaults)
        if key is None or key != self._synced:
            self._cpp.sync(groups)  # converts and checks every option of every group
        self._synced = key
        self._adopt()

    def _check_listed_once(self) -> None:
        """A step refuses a group listed twice: torch.optim would step its parameters twice in one
        step(), never what a training loop means; the C++ optimizer holds the group once (and
        FOGO's codebook memory is one per group). state_dict() and copies take such a list."""
        for j, group in enumerate(self.param_groups):
            i = next(i for i, g in enumerate(self.param_groups) if g is group)
            if i != j:
                raise RuntimeError(
                    f"fogo.{self._Cpp.__name__}: param_groups[{j}] is param_groups[{i}] listed "
                    f"again; a step would step its parameters twice: list each group once")

    def _adopt(self) -> None:
        # A parameter whose state was removed (or never made) starts afresh, as torch's
        # optimizers create missing state at the step.
        rows = []
        for group in listed_once(self.param_groups):
            row = []
            for p in group["params"]:
                st = self.state.get(p)
                if not isinstance(st, dict) or any(k not in st for k in self._fresh_keys_of(group)):
                    st = self.state[p] = {**self._new_state(p, group), **(st or {})}
                row.append(self._cpp_state(p, st))
            rows.append(row)
        self._cpp.adopt_states(rows)

    def _expose(self) -> None:
        """opt.state from the C++ optimizer's state (after a load made new tensors)."""
        self.state = defaultdict(dict)
        for group, row in zip(listed_once(self.param_groups), self._cpp.param_states()):
            for p, st in zip(group["params"], row):
                if st is not None:
                    self.state[p] = self._from_cpp_state(p, st)
        self._adopt()

    # -- stepping -----------------------------------------------------------------------------

    @torch.compiler.disable  # the C++ step: Dynamo would only break the graph at each call into it
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every param group; ``closure`` (re-evaluating the loss) runs first. Never
        traced by torch.compile (a graph break, the eager step: docs/python.md)."""
        loss = evaluate_closure(closure)
        self._prepare()
        decision = None  # the C++ step decides over its own gradients
        if self._locals:  # the owner-computed gradients join them in one decision, taken here
            items = self._nonfinite_items()
            decision = _nonfinite.decide(items, self._maskable(items))
            if decision is None:
                return loss
        self._step_decided(decision)
        return loss

    # -- the step in parts, for fogo.Hybrid (fogo/_nonfinite.py decides between them) ---------

    def _prepare(self) -> None:
        """Before a step: the groups and state into the C++ optimizer, sharded gradients (and
        parameters where changed) into the full shadows."""
        self._sync()
        if self._shadows:
            self._gather()

    def _nonfinite_items(self) -> list[_nonfinite.Item]:
        """Every gradient the step takes (after _prepare), in group order, each by its group's
        policy: the C++ step's (shadows' for DTensor parameters) and the owner-computed ones."""
        taken = []
        for g, group in enumerate(self.param_groups):
            names = group.get("param_names") or [None] * len(group["params"])
            for i, (p, name) in enumerate(zip(group["params"], names)):
                grad = p.grad if id(p) in self._locals else self._cpp_param(p).grad
                if grad is not None:
                    taken.append((group["nonfinite"], g, i, p, name, grad))
        flags = _nonfinite.usable([t[0] for t in taken], [t[5] for t in taken])
        return [_nonfinite.Item(policy, flag, self._Cpp.__name__, g, i, p, name,
                                _nonfinite.whole(grad))
                for (policy, g, i, p, name, grad), flag in zip(taken, flags)]

    def _maskable(self, items: list[_nonfinite.Item]) -> bool:
        """Whether the step of ``items`` (this optimizer's) can be masked now: FOGO's first step
        of a group cannot."""
        return all(self._cpp.maskable(g) for g in {it.group for it in items})

    def _step_decided(self, decision: Optional[_C.NonFiniteDecision]) -> None:
        """The step with the decision taken for it (None: the C++ step decides)."""
        self._cpp.step(decision)
        if self._shadows:
            self._scatter()
        if self._locals:
            self._owner_step(_nonfinite.mask_ok(decision))

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's ``{"state": {index: {name: tensor}}, "param_groups": [...]}``
        (parameters numbered across groups; the state tensors are opt.state's, as torch's
        optimizers return them), FOGO's group-level memory under each group's ``"memory"``.
        Hooks registered with ``register_state_dict_pre_hook`` / ``_post_hook`` run."""
        self._snapshot_memory()
        return super().state_dict()

    @torch._disable_dynamo
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state_dict() of an optimizer over the same parameter layout (this class's,
        or for fogo.Muon torch.optim.Muon's). Checked first (group count and sizes here, shapes
        and memory layout in C++); a rejected state_dict leaves the optimizer as it was. Options
        come from the state_dict, as with torch.optim; options it lacks keep their values. State
        tensors are cast to what the step needs (fogo.Muon: the parameter's dtype, as torch;
        FOGO: fp32) and moved to the parameter's device. Load hooks run as torch's."""
        state_dict = run_load_pre_hooks(self, state_dict)
        name = type(self).__name__
        saved_groups = [self._renamed(g) for g in copy.deepcopy(state_dict["param_groups"])]
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
            g, i = where[key]
            param = self.param_groups[g]["params"][i]
            p, at = self._cpp_param(param), f"parameter {i} of group {g}"
            state[(g, i)] = {
                k: self._cast_state(p, k, self._local_value(param, k, v, at))
                if isinstance(v, torch.Tensor) else v
                for k, v in value.items()
            }
        memory = self._group_memory(saved_groups, state_dict)
        for saved, group in zip(saved_groups, self.param_groups):
            # A checkpoint of torch.optim.Muon lacks fogo's own options: they keep their values.
            for k, v in group.items():
                if k != "memory":
                    saved.setdefault(k, v)
            saved["params"] = group["params"]
        self._synced = None  # the load sets the C++ options: hand them over again next step
        self._cpp.sync(self._cpp_groups())
        self._cpp.load_state_dict(saved_groups, state, memory)  # checked; all or nothing
        self.param_groups[:] = saved_groups
        self._expose()
        self._snapshot_memory()
        run_load_post_hooks(self)

    def _restore(self) -> None:
        """The C++ optimizer from the Python side's groups, opt.state and memory."""
        state, groups = {}, listed_once(self.param_groups)
        for g, group in enumerate(groups):
            for i, p in enumerate(group["params"]):
                if self.state.get(p):
                    state[(g, i)] = self._cpp_state(p, self.state[p])
        memory = self._group_memory(groups, {})
        self._cpp.load_state_dict(groups, state, memory)
        self._expose()

    # -- copies -------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        self._snapshot_memory()
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # copy.deepcopy and pickle: a new C++ optimizer over the copied parameters, holding the
        # copied state.
        super().__setstate__(state)
        self._synced = None  # a new C++ optimizer: nothing handed over yet
        self._cpp = self._Cpp(self.defaults)
        self._shadows, self._written, self._locals = {}, {}, {}
        for group in listed_once(self.param_groups):  # a group listed twice is one C++ group
            self._cpp.add_param_group(self._bind(group["params"]), group,
                                      self._shape_probes(group["params"]))
        self._restore()


def _frozen(value: Any) -> Any:
    """``value`` as an immutable copy to compare with a later one, or _UNKNOWN for a value that
    may change without compare-visible change (a tensor, which a scheduler may update in place;
    an object of a type not listed here)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)):
        items = tuple(_frozen(v) for v in value)
        return _UNKNOWN if _UNKNOWN in items else (type(value).__name__, items)
    if isinstance(value, dict):
        items = tuple((k, _frozen(v)) for k, v in value.items())
        return _UNKNOWN if any(v is _UNKNOWN for _, v in items) else ("dict", items)
    return _UNKNOWN


_UNKNOWN = object()


def _options_key(groups: list[dict[str, Any]], options: dict[str, Any]) -> Optional[tuple]:
    """What a sync hands over, as one value to compare with the last: each group's parameters
    (by identity) and `options` (the names; a group's other keys, FOGO's memory, parameter names,
    are not the C++ options). None (hand over at every step) when some option cannot be compared
    so: a Tensor lr, which a scheduler may change in place."""
    key = []
    for group in groups:
        entries = []
        for name, value in group.items():
            if name != "params" and name not in options:
                continue
            frozen = tuple(map(id, value)) if name == "params" else _frozen(value)
            if frozen is _UNKNOWN:
                return None
            entries.append((name, frozen))
        key.append(tuple(entries))
    return tuple(key)


def normuon_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype of NorMuon's second moment (fogo::normuon_dtype): fp32, fp64 for an fp64
    parameter."""
    return _C.normuon_dtype(p)


def fresh_second_moment(st: dict[str, torch.Tensor], p: torch.Tensor,
                        group: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``st`` with NorMuon's zero second moment where ``group``'s normuon is on (the C++ state's
    second_moment: fogo::MuonParamState's, fogo::FOGOParamState's)."""
    if group.get("normuon"):  # one per row of each matrix (fogo::row_state_sizes)
        st["second_moment"] = p.new_zeros(
            _C.row_state_sizes(list(p.shape), group.get("batch_dims", 0)), dtype=normuon_dtype(p))
    return st
