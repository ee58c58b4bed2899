"""The hybrid split: matrix weights to FOGO/Muon, everything else (biases, norms, embeddings,
output heads) to AdamW, as param groups for two optimizers (fogo::split_parameters' rules)."""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Sequence

import torch

from . import _C

__all__ = ["split_parameters", "hybrid_param_groups"]

#: fogo::ParamSplitRules' default rest_patterns (output heads and classifiers).
DEFAULT_REST_PATTERNS: tuple[str, ...] = tuple(_C.default_rest_patterns)


def split_parameters(
    module: torch.nn.Module,
    rest_patterns: Optional[Sequence[str]] = None,
    matrix_patterns: Sequence[str] = (),
    embeddings_to_rest: bool = True,
) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """(matrix, rest) lists of (name, parameter) over ``module.named_parameters()`` with
    requires_grad: a parameter matching one of ``matrix_patterns`` (regexes searched in the full
    name; it must be >= 2-D) goes to the matrix side; otherwise >= 2-D parameters go there unless
    they are weights of nn.Embedding / nn.EmbeddingBag (with ``embeddings_to_rest``) or match
    ``rest_patterns`` (default: DEFAULT_REST_PATTERNS, the usual heads)."""
    rest_res = [re.compile(p) for p in (DEFAULT_REST_PATTERNS if rest_patterns is None else rest_patterns)]
    matrix_res = [re.compile(p) for p in matrix_patterns]
    embedding_weights = set()
    if embeddings_to_rest:
        for child in module.modules():
            if isinstance(child, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                embedding_weights.update(id(p) for p in child.parameters())
    matrix, rest = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if any(r.search(name) for r in matrix_res):
            if p.dim() < 2:
                raise ValueError(
                    f"matrix_patterns matched '{name}' of shape {list(p.shape)}, but matrix "
                    "optimizers need >= 2-D parameters"
                )
            to_matrix = True
        else:
            to_matrix = (
                p.dim() >= 2
                and id(p) not in embedding_weights
                and not any(r.search(name) for r in rest_res)
            )
        (matrix if to_matrix else rest).append((name, p))
    return matrix, rest


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
