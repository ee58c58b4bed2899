"""fogo.distributed: every rank settles on a device it sees before a DeviceMesh is made (issue
44: torch 2.11's DeviceMesh sets the device to LOCAL_RANK, "invalid device ordinal" for ranks
1 and 2 of three on a one-GPU machine). On the CPU, with the device count injected: the rule
itself, and torch's own DeviceMesh over a stand-in CUDA device (its set_device recorded, an
index it does not have refused as the driver refuses it)."""

import pytest
import torch
import torch.distributed as dist

import fogo.distributed as fd


@pytest.mark.parametrize("local_rank, count, index", [
    (0, 1, 0), (1, 1, 0), (2, 1, 0),  # three ranks on one GPU: all on it
    (0, 2, 0), (1, 2, 1), (7, 8, 7),  # a GPU each
    (0, 0, None), (3, 0, None),       # no GPU: nothing to settle
])
def test_each_rank_gets_a_device_it_sees(local_rank, count, index):
    assert fd.local_device_index(local_rank, count) == index


def test_more_ranks_than_several_devices_is_refused_naming_them():
    with pytest.raises(ValueError, match="LOCAL_RANK 3 but only 2 devices"):
        fd.local_device_index(3, 2)
    with pytest.raises(ValueError, match="local_rank must be >= 0, got -1"):
        fd.local_device_index(-1, 1)
    with pytest.raises(ValueError, match="device_count must be >= 0, got -2"):
        fd.local_device_index(0, -2)


class StandInCuda:
    """torch.cuda's device calls on a machine with ``count`` devices: set_device refuses an index
    it does not have ("invalid device ordinal", as the driver does) and initializes CUDA, as
    torch's does."""

    def __init__(self, monkeypatch, count):
        self.count, self.calls, self.initialized = count, [], False
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.count > 0)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)

    def set_device(self, index):
        self.calls.append(index)
        if not 0 <= index < self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.initialized = True


def test_settle_device_sets_the_rank_on_its_device(monkeypatch):
    cuda = StandInCuda(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert fd.settle_device("cuda") == torch.device("cuda", 0)
    assert cuda.calls == [0]
    assert fd.settle_device("cpu") is None and cuda.calls == [0]
    cuda.count = 2
    assert fd.settle_device("cuda", local_rank=1) == torch.device("cuda", 1)
    cuda.count = 0
    assert fd.settle_device("cuda") is None and cuda.calls == [0, 1]


@pytest.fixture
def one_rank_world(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed with gloo and no process group yet")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_mesh_of_rank_2_on_a_one_gpu_machine(monkeypatch, one_rank_world):
    """Rank 2 of three on one GPU: torch's init_device_mesh alone sets device 2 and dies (what
    the 2026-11-27 reading predicted for test_cuda.py's owner-computes test); through
    fogo.distributed.device_mesh the rank is on device 0 first and the mesh keeps it."""
    from torch.distributed.device_mesh import init_device_mesh

    monkeypatch.setenv("LOCAL_RANK", "2")
    cuda = StandInCuda(monkeypatch, 1)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        init_device_mesh("cuda", (1,))
    assert cuda.calls == [2]  # the test has teeth: this is the failure
    cuda = StandInCuda(monkeypatch, 1)
    mesh = fd.device_mesh("cuda", (1,))
    assert mesh.device_type == "cuda" and tuple(mesh.shape) == (1,)
    assert cuda.calls == [0]
