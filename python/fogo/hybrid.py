"""The hybrid: matrix weights to FOGO/Muon, everything else (biases, norms, embeddings, output
heads) to AdamW: the split (fogo::split_parameters' rules) as param groups, and fogo.Hybrid, one
optimizer stepping both sides (fogo::HybridOptimizer's Python counterpart)."""

from __future__ import annotations

import weakref
from collections.abc import MutableMapping
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

from . import _C, _nonfinite
from ._cpp_optimizer import (evaluate_closure, repr_without_memory, run_load_post_hooks,
                             run_load_pre_hooks)
from .optim import FOGO, Muon

__all__ = ["split_parameters", "route_parameters", "routing_table", "hybrid_param_groups", "Hybrid"]

#: fogo::ParamSplitRules' default rest_patterns (output heads and classifiers).
DEFAULT_REST_PATTERNS: tuple[str, ...] = tuple(_C.default_rest_patterns)


def split_parameters(
    module: torch.nn.Module,
    rest_patterns: Optional[Sequence[str]] = None,
    matrix_patterns: Sequence[str] = (),
    embeddings_to_rest: bool = True,
) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """(matrix, rest) lists of (name, parameter) over ``module.named_parameters()`` with
    requires_grad, by fogo::split_parameters' rule (fogo::split_routes, the C++ code itself): a
    parameter matching one of ``matrix_patterns`` (ECMAScript regexes, as C++'s std::regex reads
    them, searched in the full name; it must be >= 2-D) goes to the matrix side; otherwise >= 2-D
    parameters go there unless they are weights of nn.Embedding / nn.EmbeddingBag (with
    ``embeddings_to_rest``) or match ``rest_patterns`` (default: DEFAULT_REST_PATTERNS, the usual
    heads). ValueError for an invalid pattern or a matrix_patterns match of fewer than 2-D."""
    named, routes = _routes(module, rest_patterns, matrix_patterns, embeddings_to_rest)
    matrix = [item for item, (to_matrix, _) in zip(named, routes) if to_matrix]
    rest = [item for item, (to_matrix, _) in zip(named, routes) if not to_matrix]
    return matrix, rest


def _routes(module: torch.nn.Module, rest_patterns: Optional[Sequence[str]],
            matrix_patterns: Sequence[str], embeddings_to_rest: bool):
    """The trainable (name, parameter) pairs and fogo::split_routes' (to matrix side, rule)."""
    embedding_weights = set()
    for child in module.modules():
        if isinstance(child, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            embedding_weights.update(id(p) for p in child.parameters())
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    routes = _C.split_routes(
        [(name, list(p.shape), id(p) in embedding_weights) for name, p in named],
        None if rest_patterns is None else list(rest_patterns), list(matrix_patterns),
        embeddings_to_rest)
    return named, routes


def route_parameters(
    module: torch.nn.Module,
    rest_patterns: Optional[Sequence[str]] = None,
    matrix_patterns: Sequence[str] = (),
    embeddings_to_rest: bool = True,
) -> list[dict[str, Any]]:
    """Every trainable parameter as :func:`split_parameters` routes it, as data: dicts with
    ``name``, ``shape``, ``side`` ("matrix" or "adamw") and ``rule`` (the rule that sent it there,
    fogo::split_routes' words). :func:`routing_table` prints them."""
    named, routes = _routes(module, rest_patterns, matrix_patterns, embeddings_to_rest)
    return [{"name": name, "shape": tuple(p.shape), "side": "matrix" if to_matrix else "adamw",
             "rule": rule} for (name, p), (to_matrix, rule) in zip(named, routes)]


def routing_table(routes: list[dict[str, Any]]) -> str:
    """:func:`route_parameters`' or :meth:`Hybrid.routes`' result as fogo::routing_table's
    Markdown table (parameter, shape, side, rule, how the matrix side treats it; from an
    optimizer also the group and the update scale)."""
    return _C.routing_table([(r["name"], list(r["shape"]), r["side"] == "matrix", r["rule"],
                              r.get("group") or "", r.get("update_scale") or "",
                              r.get("treated_as") or "")
                             for r in routes])


def hybrid_param_groups(
    module: torch.nn.Module,
    group_by: Optional[str] = None,
    rest_patterns: Optional[Sequence[str]] = None,
    matrix_patterns: Sequence[str] = (),
    embeddings_to_rest: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Param groups for the hybrid: ``(matrix_groups, rest_groups)``, for fogo.FOGO / fogo.Muon
    and torch.optim.AdamW respectively::

        matrix, rest = fogo.hybrid_param_groups(model, group_by="shape")
        opts = [fogo.FOGO(matrix, lr=2e-3), torch.optim.AdamW(rest, lr=1e-3)]

    Groups carry ``param_names``. ``group_by="shape"`` makes one matrix group (one FOGO codebook)
    per matrix shape "rows x cols" (fogo::shape_key, the paper's GPT-2 setting); ``None`` one
    group. An empty side is an empty list. Options can be added to the groups before use."""
    matrix, rest = split_parameters(module, rest_patterns, matrix_patterns, embeddings_to_rest)
    if group_by not in (None, "shape"):
        raise ValueError(f"group_by must be None or 'shape', got {group_by!r}")
    keys: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, p in matrix:
        keys.setdefault(_C.shape_key(p) if group_by == "shape" else "matrix", []).append((name, p))
    matrix_groups = [_group(key, items) for key, items in keys.items()]
    rest_groups = [_group("rest", rest)] if rest else []
    return matrix_groups, rest_groups


def _group(name: str, items: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    items = list(items)
    return {"params": [p for _, p in items], "param_names": [n for n, _ in items], "name": name}


class _HybridState(MutableMapping):
    """fogo.Hybrid's ``state``: each parameter's entry is its side's own (the same dict), so code
    that reads or writes ``opt.state`` the torch way reaches the optimizer that steps it."""

    def __init__(self, hybrid: "Hybrid"):
        self._hybrid = hybrid

    def _side(self, p: torch.Tensor) -> torch.optim.Optimizer:
        side = self._hybrid._owner.get(id(p))
        if side is None:
            raise KeyError(p)
        return self._hybrid._sides[side]

    def __getitem__(self, p: torch.Tensor) -> Any:
        return self._side(p).state[p]

    def __setitem__(self, p: torch.Tensor, value: Any) -> None:
        self._side(p).state[p] = value

    def __delitem__(self, p: torch.Tensor) -> None:
        del self._side(p).state[p]

    def __iter__(self) -> Iterator[torch.Tensor]:
        for side in self._hybrid._sides.values():
            yield from side.state

    def __len__(self) -> int:
        return sum(len(side.state) for side in self._hybrid._sides.values())


def _adamw_kernel(group: dict[str, Any], options: dict[str, Any]) -> dict[str, bool]:
    """How the AdamW side steps ``group``: by torch's fused kernel (one kernel per device and
    dtype for the whole group, where torch.optim.AdamW steps a parameter at a time on the CPU)
    when every parameter allows it, by torch's own rule (floating point on a device with a fused
    kernel: CUDA, and the CPU since torch 2.4); else by foreach where torch's rule allows that.
    ``fused`` or ``foreach`` given in the group or in ``adamw_options`` is kept as given."""
    given = {**options, **group}
    if given.get("fused") is not None or given.get("foreach") is not None:
        return {}
    from torch.optim.optimizer import _default_to_fused_or_foreach

    fused, foreach = _default_to_fused_or_foreach(
        list(group["params"]), bool(given.get("differentiable", False)), use_fused=True)
    return {"fused": True} if fused else {"foreach": foreach}


def _init_adamw_state(opt: torch.optim.AdamW, group: dict[str, Any]) -> None:
    """AdamW's state for ``group``'s parameters, made now by AdamW's own lazy initialisation
    (``_init_group``, given zero gradients for the call) rather than at their first step: so
    that, as on the matrix side, every parameter has its state from construction on (DCP loads
    into a fresh optimizer's state_dict, and only steps one whose state is empty). No step is
    taken; a zero state is what the first step would have created."""
    params = [p for p in group["params"] if not opt.state.get(p)]
    grads = [p.grad for p in params]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        opt._init_group({**group, "params": params}, [], [], [], [], [], [])
    finally:
        for p, g in zip(params, grads):
            p.grad = g


class Hybrid(torch.optim.Optimizer):
    """One optimizer for a whole model: matrix weights stepped by ``matrix`` (fogo.FOGO or
    fogo.Muon), everything else (biases, norms, embeddings, output heads) by torch.optim.AdamW
    (its fused kernel where the parameters allow it, as fogo::FusedAdamW in C++), as
    fogo::HybridOptimizer does in C++::

        opt = fogo.Hybrid(model, fogo.Muon, lr=0.02, adamw_options={"lr": 3e-4})
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)  # drives both sides

    ``params``: an ``nn.Module`` (split by :func:`split_parameters`' rules, the keywords
    ``group_by``, ``rest_patterns``, ``matrix_patterns``, ``embeddings_to_rest``), an iterable of
    tensors (>= 2-D ones to the matrix side), or param groups, each with ``"side"``: ``"matrix"``
    or ``"rest"`` (or all of its parameters on one side by dimension). ``matrix_options`` and the
    other keywords are the matrix optimizer's options, ``adamw_options`` AdamW's; a group's own
    keys override them.

    ``param_groups`` are the sides' groups themselves (matrix groups first for a module), each
    with its ``"side"``: a scheduler or a hand edit of ``group["lr"]`` applies at the next step.
    ``state`` maps every parameter to its side's state; ``state_dict()`` is one torch-layout dict
    over both (FOGO's memory in its groups), ``load_state_dict()`` restores both. ``matrix`` and
    ``rest`` are the two optimizers (``opt.matrix.task_boundary()``, ``opt.matrix.telemetry()``).

    One ``step()`` evaluates the closure once and steps both sides. Unusable gradients (NaN/Inf,
    or a norm where the arithmetic overflows) are decided once for the whole step, by the C++
    rule (fogo::decide_nonfinite) over both sides' gradients: a matrix group's by its own
    ``nonfinite``, the AdamW side's by the matrix options' ``nonfinite`` (the keyword given
    here). "raise": RuntimeError naming the parameter and its side, nothing stepped; "skip":
    nothing stepped, the step not counted; "mask": both sides step on the device and every
    parameter and state tensor keeps its bits (nothing read back; step counters, FOGO's and
    AdamW's ``step``, advance); "unchecked": no check, NaN reaches the parameters. As
    fogo::HybridOptimizer does in C++ (docs/python.md).
    """

    def __init__(
        self,
        params: Any,
        matrix: type = FOGO,
        matrix_options: Optional[dict[str, Any]] = None,
        adamw_options: Optional[dict[str, Any]] = None,
        *,
        group_by: Optional[str] = None,
        rest_patterns: Optional[Sequence[str]] = None,
        matrix_patterns: Sequence[str] = (),
        embeddings_to_rest: bool = True,
        **options: Any,
    ):
        if not (isinstance(matrix, type) and issubclass(matrix, (FOGO, Muon))):
            raise TypeError(f"fogo.Hybrid: matrix must be fogo.FOGO or fogo.Muon, got {matrix!r}")
        self._matrix_class = matrix
        self._options = {"matrix": {**(matrix_options or {}), **options},
                         "rest": dict(adamw_options or {})}
        self._sides: dict[str, torch.optim.Optimizer] = {}
        self._route: list[tuple[str, int]] = []  # per group: its side and index there
        self._owner: dict[int, str] = {}  # id(parameter) -> side
        self._split: Optional[tuple[Any, ...]] = None  # (module, its split's rules) when given one
        if isinstance(params, torch.nn.Module):
            self._split = (weakref.ref(params), rest_patterns, tuple(matrix_patterns),
                           embeddings_to_rest)
            matrix_groups, rest_groups = hybrid_param_groups(
                params, group_by, rest_patterns, matrix_patterns, embeddings_to_rest)
            groups = [{**g, "side": "matrix"} for g in matrix_groups]
            groups += [{**g, "side": "rest"} for g in rest_groups]
        else:
            groups = list(params)
            if groups and isinstance(groups[0], torch.Tensor):
                groups = [{"params": [p for p in groups if p.dim() >= 2], "side": "matrix"},
                          {"params": [p for p in groups if p.dim() < 2], "side": "rest"}]
                groups = [g for g in groups if g["params"]]
        super().__init__(groups, {})

    # -- groups ----------------------------------------------------------------------------------

    @property
    def state(self) -> _HybridState:  # type: ignore[override]
        return _HybridState(self)

    @state.setter
    def state(self, value: Any) -> None:
        pass  # torch.optim.Optimizer.__init__ sets an empty one: the state is the sides'

    def routes(self, module: Optional[torch.nn.Module] = None,
               rest_patterns: Optional[Sequence[str]] = None, matrix_patterns: Sequence[str] = (),
               embeddings_to_rest: bool = True) -> list[dict[str, Any]]:
        """Every trainable parameter of ``module`` as this optimizer holds it: the dicts of
        :func:`route_parameters` (the split's rule under the given rules) with ``group`` (the
        param group's ``"name"``, else its index), ``lr``, ``rms_per_lr`` (the update's RMS per
        entry over lr: Muon's adjust_lr factor over sqrt(max(rows, cols)), FOGO's sigma; None for
        AdamW), ``update_scale`` (both in words; fogo::update_scale) and ``treated_as`` (the
        matrices the group's batch_dims / heads / blocks make of it: fogo::treated_as). A
        parameter held
        on the other side than the rule sends it to says so in ``rule`` ("placed by hand"); one
        this optimizer does not hold has ``group`` None. ``module`` defaults to the module this
        Hybrid was built from (with its split's rules). :func:`routing_table` prints them."""
        if module is None:
            if self._split is None or self._split[0]() is None:
                raise ValueError("fogo.Hybrid.routes: pass the model (this Hybrid was not built "
                                 "from an nn.Module, or that module is gone)")
            module = self._split[0]()
            _, rest_patterns, matrix_patterns, embeddings_to_rest = self._split
        held = {}
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                held[id(p)] = (g, group)
        params = dict(module.named_parameters())
        out = route_parameters(module, rest_patterns, matrix_patterns, embeddings_to_rest)
        for r in out:
            r.update(group=None, lr=None, rms_per_lr=None, update_scale=None, treated_as=None)
            where = held.get(id(params[r["name"]]))
            if where is None:
                continue
            g, group = where
            side = "matrix" if group["side"] == "matrix" else "adamw"
            if side != r["side"]:
                r["rule"] = f"placed by hand (the split's rule: {r['rule']})"
            kind = "adamw" if side == "adamw" else (
                "fogo" if issubclass(self._matrix_class, FOGO) else "muon")
            options = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            options["lr"] = float(group["lr"])
            scale = _C.update_scale(kind, options, list(r["shape"]))
            r.update(side=side, group=str(group.get("name", g)), lr=scale["lr"],
                     rms_per_lr=scale["rms_per_lr"], update_scale=scale["text"],
                     treated_as=scale["treated"] or None)
        return out

    @property
    def matrix(self) -> Optional[torch.optim.Optimizer]:
        """The matrix side (fogo.FOGO or fogo.Muon), None without matrices."""
        return self._sides.get("matrix")

    @property
    def rest(self) -> Optional[torch.optim.Optimizer]:
        """The AdamW side, None when every parameter is a matrix."""
        return self._sides.get("rest")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        where = f"fogo.Hybrid: param group {len(self.param_groups)}"
        side = group.get("side")
        if side is None:
            dims = {p.dim() >= 2 for p in group["params"]}
            if len(dims) > 1:
                raise ValueError(
                    f"{where} holds matrices and vectors: give it 'side' ('matrix' or 'rest') "
                    "or split it (fogo.hybrid_param_groups)")
            side = "matrix" if dims == {True} else "rest"
        if side not in ("matrix", "rest"):
            raise ValueError(f"{where}: 'side' must be 'matrix' or 'rest', got {side!r}")
        group["side"] = side
        if any(id(p) in self._owner for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        if side == "rest":
            group.update(_adamw_kernel(group, self._options["rest"]))
        opt = self._sides.get(side)
        if opt is None:
            make = self._matrix_class if side == "matrix" else torch.optim.AdamW
            opt = self._sides[side] = make([group], **self._options[side])
        else:
            opt.add_param_group(group)
        if side == "rest":
            _init_adamw_state(opt, opt.param_groups[-1])
        self.param_groups.append(opt.param_groups[-1])
        self._route.append((side, len(opt.param_groups) - 1))
        for p in group["params"]:
            self._owner[id(p)] = side

    def __repr__(self) -> str:
        return repr_without_memory(self)

    def _regroup(self) -> None:
        """The hybrid's groups from the sides' (a side's load_state_dict replaces its dicts)."""
        self.param_groups[:] = [self._sides[s].param_groups[k] for s, k in self._route]

    # -- stepping --------------------------------------------------------------------------------

    @torch.compiler.disable  # a graph break: Dynamo traced AdamW's side into other bits
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Evaluates ``closure`` once, then steps the matrix side and the AdamW side, after one
        non-finite decision for both (fogo/_nonfinite.py). Never traced by torch.compile (a graph
        break, the eager step: docs/python.md, "torch.compile")."""
        loss = evaluate_closure(closure)
        matrix, rest = self.matrix, self.rest
        if matrix is not None:
            matrix._prepare()
        items, maskable = self._nonfinite_items()
        decision = _nonfinite.decide(items, maskable)
        if decision is None:
            return loss
        ok = _nonfinite.mask_ok(decision)
        keep = None if ok is None else _C.MaskScope(ok, self._rest_tensors())
        if matrix is not None:
            matrix._step_decided(decision)
        if rest is not None:
            rest.step()
        if keep is not None:
            keep.restore()
        return loss

    def _nonfinite_items(self) -> tuple[list[_nonfinite.Item], bool]:
        """Every gradient of the step in the hybrid's group order, each by its side's policy, and
        whether the step can be masked (FOGO's first step of a group and an AdamW parameter
        without state cannot be)."""
        items, maskable = [], True
        if self.matrix is not None:
            index = {k: g for g, (side, k) in enumerate(self._route) if side == "matrix"}
            mine = self.matrix._nonfinite_items()
            maskable = self.matrix._maskable(mine)
            items += [it._replace(group=index[it.group], label="fogo.Hybrid (matrix side)")
                      for it in mine]
        rest = [(g, i, p, name) for g, (group, (side, _))
                in enumerate(zip(self.param_groups, self._route)) if side == "rest"
                for i, (p, name) in enumerate(zip(
                    group["params"], group.get("param_names") or [None] * len(group["params"])))
                if p.grad is not None]
        policy = self._rest_policy()
        flags = _nonfinite.usable([policy] * len(rest), [p.grad for _, _, p, _ in rest])
        for (g, i, p, name), flag in zip(rest, flags):
            items.append(_nonfinite.Item(policy, flag, "fogo.Hybrid (rest side)", g, i, p, name,
                                         _nonfinite.whole(p.grad)))
        if maskable and any(it.policy == "mask" for it in items):  # AdamW's state to put back
            maskable = all("exp_avg" in self.rest.state.get(p, {}) for _, _, p, _ in rest)
        items.sort(key=lambda it: (it.group, it.index))
        return items, maskable

    def _rest_policy(self) -> str:
        """The AdamW side's policy: the matrix options' ``nonfinite`` (the matrix side's
        defaults, or what it would have without matrices)."""
        if self.matrix is not None:
            return self.matrix.defaults["nonfinite"]
        return self._options["matrix"].get(
            "nonfinite", self._matrix_class._Cpp.default_options()["nonfinite"])

    def _rest_tensors(self) -> list[torch.Tensor]:
        """What the AdamW side's step changes (its parameters with gradients and their moments;
        local shards of DTensors), for a masked step to put back. Its ``step`` counts advance."""
        out = []
        for group, (side, _) in zip(self.param_groups, self._route):
            if side != "rest":
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.rest.state[p]
                for t in (p, st.get("exp_avg"), st.get("exp_avg_sq"), st.get("max_exp_avg_sq")):
                    if t is not None:
                        out.append(t.to_local() if _nonfinite.whole(t) is None else t)
        return out

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout over every group of both sides (parameters numbered across the
        hybrid's groups); FOGO's memory in its groups. state_dict hooks run."""
        if self.matrix is not None:
            self.matrix._snapshot_memory()
        return super().state_dict()

    @torch._disable_dynamo
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a Hybrid's state_dict() over the same group layout: each side loads its part
        (the matrix side first, checked and all or nothing; then AdamW). Load hooks run."""
        state_dict = run_load_pre_hooks(self, state_dict)
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(
                f"fogo.Hybrid.load_state_dict: the state_dict has {len(saved)} param groups, "
                f"this optimizer {len(self.param_groups)}")
        parts = {s: {"state": {}, "param_groups": []} for s in self._sides}
        where, count = {}, {s: 0 for s in self._sides}
        for g, (group, (side, _)) in enumerate(zip(saved, self._route)):
            n = len(self.param_groups[g]["params"])
            if group.get("side", side) != side or len(group["params"]) != n:
                raise ValueError(
                    f"fogo.Hybrid.load_state_dict: param group {g} of the state_dict is "
                    f"{group.get('side')!r} with {len(group['params'])} parameters, this "
                    f"optimizer's {side!r} with {n}")
            local = list(range(count[side], count[side] + n))
            where.update({key: (side, k) for key, k in zip(group["params"], local)})
            parts[side]["param_groups"].append({**group, "params": local})
            count[side] += n
        for key, value in state_dict["state"].items():
            if key not in where:
                raise ValueError(
                    f"fogo.Hybrid.load_state_dict: state for unknown parameter {key!r}")
            side, k = where[key]
            parts[side]["state"][k] = value
        for side in ("matrix", "rest"):
            if side in parts:
                self._sides[side].load_state_dict(parts[side])
        self._regroup()
        run_load_post_hooks(self)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("defaults", "_matrix_class", "_options", "_sides", "_route")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._split = None  # a copy's module is unknown: routes() then takes it as an argument
        self.param_groups = []
        self._regroup()
        self._owner = {id(p): s for (s, _), g in zip(self._route, self.param_groups)
                       for p in g["params"]}
