"""The pieces of torch.optim.Optimizer's behaviour that fogo's optimizers reproduce outside it
(_cpp_optimizer.py, hybrid.py): load hooks, the closure, the repr, a Tensor lr's rule, and a
param-group list's groups each once."""

from typing import Any, Callable, Optional

import torch


def run_load_pre_hooks(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """torch.optim.Optimizer.load_state_dict's start, for an optimizer that loads its own way:
    a shallow copy of ``state_dict`` through the registered pre-hooks."""
    state_dict = state_dict.copy()
    for pre_hook in opt._optimizer_load_state_dict_pre_hooks.values():
        result = pre_hook(opt, state_dict)
        if result is not None:
            state_dict = result
    return state_dict


def evaluate_closure(closure: Optional[Callable[[], Any]]) -> Any:
    """The loss from a step's ``closure`` (re-evaluating the model), with autograd on; None
    without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def repr_without_memory(opt: torch.optim.Optimizer) -> str:
    """torch.optim.Optimizer's repr without the groups' "memory" (FOGO's): torch's lists every
    group key, and the memory's tensors would fill the screen."""
    groups = opt.param_groups
    opt.param_groups = [{k: v for k, v in g.items() if k != "memory"} for g in groups]
    try:
        return torch.optim.Optimizer.__repr__(opt)
    finally:
        opt.param_groups = groups


def check_tensor_lr(lr: Any) -> None:
    """torch.optim's rule for a learning rate given as a Tensor: one element (its value is read
    at every step, so a scheduler can change it in place)."""
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError(f"Tensor lr must be 1-element, got shape {list(lr.shape)}")


def listed_once(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``groups`` with each group once: a group listed again (the same dict, as
    ``param_groups.extend(param_groups)`` lists it; PyTorch's test_state_dict_deterministic does)
    is the C++ optimizer's one group, and torch's state_dict represents it as its first listing."""
    seen: set[int] = set()
    return [g for g in groups if not (id(g) in seen or seen.add(id(g)))]


def run_load_post_hooks(opt: torch.optim.Optimizer) -> None:
    for post_hook in opt._optimizer_load_state_dict_post_hooks.values():
        post_hook(opt)
