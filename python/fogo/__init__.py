"""fogo: the FOGO and Muon optimizers of the fogo C++ library as torch.optim optimizers.

    import fogo
    opt = fogo.FOGO(model.parameters(), lr=1e-3)           # or fogo.Muon(...)
    opt = fogo.Hybrid(model, fogo.Muon, lr=0.02)            # matrices to Muon, the rest to AdamW

docs/python.md has the details.
"""

import torch  # noqa: F401  (loads LibTorch before the extension module)

from ._build import SOURCE_DIR as _SOURCE_DIR, TORCH_VERSION as _BUILT_TORCH


def _check_torch(installed: str, built: str) -> None:
    """fogo._C is compiled against one LibTorch's C++ ABI: under another torch minor version it
    fails to load or, worse, misreads torch's classes. Refused here, before it is loaded."""
    def minor(version: str) -> tuple:
        return tuple(version.split("+")[0].split(".")[:2])

    if minor(installed) != minor(built):
        raise ImportError(
            f"fogo's extension module was compiled against torch {built}, but torch {installed} "
            f"is installed; rebuild it against this torch: pip install --no-build-isolation "
            f"--no-deps --force-reinstall {_SOURCE_DIR} (or, in that checkout, "
            f"FOGO_TORCH=<version> scripts/build.sh fogo_python)")


_check_torch(torch.__version__, _BUILT_TORCH)

from . import _C, presets  # noqa: E402
from .hybrid import (Hybrid, hybrid_param_groups, route_parameters, routing_table,
                     split_parameters)
from .optim import FOGO, Muon, ns_schedules
from . import distributed, qk_clip  # noqa: E402  (fogo.distributed.device_mesh, fogo.qk_clip.qk_clip)

__version__ = "0.1.0"
#: Whether the CUDA kernels were compiled in (else CUDA tensors take the ATen path).
CUDA_KERNELS: bool = _C.cuda_kernels()


def ns_dtype_choices() -> list[dict]:
    """How ``ns_dtype="auto"`` resolved in this process, one dict per device where it did:
    ``device``, ``dtype``, ``reason`` ("measured", "compute capability 9.0 (bf16 tensor cores)",
    "FOGO_NS_DTYPE=fp32", ...), ``isa`` (the CPU's), ``bf16_ms`` and ``fp32_ms`` (the CPU's
    measured GEMM times; NaN when none ran). docs/muon.md, "ns_dtype auto"."""
    return _C.ns_dtype_choices()


def set_ns_auto_dtype(dtype) -> None:
    """Fixes what ``ns_dtype="auto"`` computes in on every device for the rest of the process
    (``torch.bfloat16`` or ``torch.float32``; ``"auto"`` returns to the devices' own choices),
    above the FOGO_NS_DTYPE environment variable: e.g. rank 0's choice for every rank."""
    _C.set_ns_auto_dtype(dtype)

__all__ = [
    "FOGO", "Muon", "Hybrid", "presets", "hybrid_param_groups", "split_parameters",
    "route_parameters", "routing_table", "CUDA_KERNELS",
    "ns_dtype_choices", "set_ns_auto_dtype", "ns_schedules", "distributed", "qk_clip",
]
