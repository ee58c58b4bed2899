"""The device each rank settles on before a DeviceMesh is made.

torch 2.11's DeviceMesh (``init_device_mesh``, and ``fully_shard`` without a mesh, which makes
one) sets the current device to ``LOCAL_RANK`` when the process has not chosen one yet: with more
ranks than GPUs on a host (several ranks sharing one GPU over gloo, as fogo's CUDA tests run them
on a one-GPU machine) ranks 1, 2, ... die with "invalid device ordinal". Settling every rank on
a device it can see first (``settle_device``, or ``device_mesh`` which does it and makes the mesh)
leaves DeviceMesh nothing to choose: it respects a device already set.

    import fogo.distributed
    mesh = fogo.distributed.device_mesh("cuda", (world_size,))    # instead of init_device_mesh
"""

import os
from typing import Optional

import torch


def local_device_index(local_rank: int, device_count: int) -> Optional[int]:
    """The device index a rank with ``local_rank`` (its LOCAL_RANK) uses on a host with
    ``device_count`` devices: its own when there are enough, the one device when there is only
    one (every rank shares it), None when there is none. More ranks than devices with more than
    one device is refused: which ranks share which device is the user's choice to make."""
    if local_rank < 0:
        raise ValueError(f"local_rank must be >= 0, got {local_rank}")
    if device_count < 0:
        raise ValueError(f"device_count must be >= 0, got {device_count}")
    if device_count == 0:
        return None
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    raise ValueError(
        f"LOCAL_RANK {local_rank} but only {device_count} devices on this host: set each rank's "
        f"device (torch.cuda.set_device) before making the mesh")


def settle_device(device_type: str = "cuda", local_rank: Optional[int] = None,
                  device_count: Optional[int] = None) -> Optional[torch.device]:
    """Makes this rank's device (``local_device_index``) the current one of ``device_type`` and
    returns it; None (nothing set) for the CPU or where no device is seen. ``local_rank``
    defaults to the LOCAL_RANK environment variable (0 without one), ``device_count`` to the
    devices torch sees (both given by tests)."""
    handle = getattr(torch, device_type, None) if device_type != "cpu" else None
    if handle is None or not hasattr(handle, "set_device"):
        return None
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_count is None:
        device_count = handle.device_count() if handle.is_available() else 0
    index = local_device_index(local_rank, device_count)
    if index is None:
        return None
    handle.set_device(index)
    return torch.device(device_type, index)


def device_mesh(device_type: str, mesh_shape, **kwargs):
    """``torch.distributed.device_mesh.init_device_mesh`` after ``settle_device``: the same
    mesh, on a host with fewer devices than ranks too."""
    from torch.distributed.device_mesh import init_device_mesh

    settle_device(device_type)
    return init_device_mesh(device_type, tuple(mesh_shape), **kwargs)


__all__ = ["local_device_index", "settle_device", "device_mesh"]
