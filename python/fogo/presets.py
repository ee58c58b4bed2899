"""The paper's FOGO configurations (fogo::presets), as keyword dicts for fogo.FOGO or a param
group: ``fogo.FOGO(params, **fogo.presets.gpt2())`` or ``{"params": ..., **presets.lora()}``.
Every option is included, read from the C++ presets; the names are those of their one table
(FOGO_PRESETS in fogo/fogo_options.h)."""

from typing import Any, Callable

from . import _C

_DESCRIPTIONS = dict(_C.preset_table())
__all__ = sorted(_DESCRIPTIONS)


def _make(name: str) -> Callable[[], dict[str, Any]]:
    def preset() -> dict[str, Any]:
        return _C.preset(name)

    preset.__name__ = preset.__qualname__ = name
    preset.__doc__ = f"fogo::presets::{name}() as FOGO keyword options: {_DESCRIPTIONS[name]}."
    return preset


for _name in __all__:
    globals()[_name] = _make(_name)
