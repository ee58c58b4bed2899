"""python/examples/lightning_hybrid.py, briefly: one fogo.Hybrid under Lightning's Trainer, one
epoch, a checkpoint, and a resumed epoch in a new Trainer. The FOGO side's step counter after the
resume proves that its memory came back through Lightning's checkpoint."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="Fashion-MNIST (Debian dataset-fashion-mnist) absent")
def test_lightning_hybrid_trains_and_resumes():
    pytest.importorskip("pytorch_lightning")
    result = subprocess.run(
        [sys.executable, str(ROOT / "python" / "examples" / "lightning_hybrid.py"),
         "--matrix", "fogo", "--train", "1024", "--epochs", "2", "--batch-size", "128"],
        env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "after 16 steps; groups ['matrix', 'rest']" in result.stdout
    assert "FOGO telemetry: step 16," in result.stdout  # 8 steps before the checkpoint, 8 after
