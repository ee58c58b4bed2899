"""fogo: the FOGO and Muon optimizers of the fogo C++ library as torch.optim optimizers.

    import fogo
    opt = fogo.FOGO(model.parameters(), lr=1e-3)           # or fogo.Muon(...)
    opt = fogo.Hybrid(model, fogo.Muon, lr=0.02)            # matrices to Muon, the rest to AdamW

docs/python.md has the details.
"""

import torch  # noqa: F401  (loads LibTorch before the extension module)

from . import _C, presets
from .hybrid import Hybrid, hybrid_param_groups, split_parameters
from .optim import FOGO, Muon

__version__ = "0.1.0"
#: Whether the CUDA kernels were compiled in (else CUDA tensors take the ATen path).
CUDA_KERNELS: bool = _C.cuda_kernels()

__all__ = [
    "FOGO", "Muon", "Hybrid", "presets", "hybrid_param_groups", "split_parameters", "CUDA_KERNELS",
]
