"""pytest set-up: one intra-op thread (ctest runs tests side by side on a 2-core machine; results
do not depend on it), and the paths of the checkout and its build."""

import os
import pathlib

import pytest
import torch

torch.set_num_threads(1)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FOGO_BUILD_DIR", ROOT / "build"))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale
