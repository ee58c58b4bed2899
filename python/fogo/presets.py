"""The paper's FOGO configurations (fogo::presets), as keyword dicts for fogo.FOGO or a param
group: ``fogo.FOGO(params, **fogo.presets.gpt2())`` or ``{"params": ..., **presets.lora()}``.
Every option is included, read from the C++ presets."""

from typing import Any, Callable

from . import _C

__all__ = sorted(_C.presets)


def _make(name: str) -> Callable[[], dict[str, Any]]:
    def preset() -> dict[str, Any]:
        return dict(_C.presets[name])

    preset.__name__ = preset.__qualname__ = name
    preset.__doc__ = f"fogo::presets::{name}() as FOGO keyword options."
    return preset


for _name in __all__:
    globals()[_name] = _make(_name)
