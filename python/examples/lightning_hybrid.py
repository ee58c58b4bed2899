"""Fashion-MNIST with PyTorch Lightning and ONE optimizer for the whole model: fogo.Hybrid (matrix
weights to fogo.FOGO or fogo.Muon, biases and the output layer to AdamW), with a cosine schedule
driving both sides, under Lightning's automatic optimization (which takes one optimizer), and a
checkpoint resumed through Lightning (the optimizer's state_dict, FOGO's memory included).

    pip install pytorch_lightning    # python/requirements.txt pins it
    PYTHONPATH=build/python .venv/bin/python python/examples/lightning_hybrid.py --matrix fogo

Data: Debian's IDX files (package dataset-fashion-mnist), as fashion_mnist.py reads them.
"""

import argparse
import pathlib
import sys
import tempfile

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

import fogo

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fashion_mnist import load, make_model  # noqa: E402  (the same data and model)

MATRIX = {
    "fogo": (fogo.FOGO, {"lr": 0.02, "codebook_size": 32, "proj_dim": 64, "ns_dtype": torch.float32}),
    "muon": (fogo.Muon, {"lr": 2e-3, "weight_decay": 0.01, "adjust_lr_fn": "match_rms_adamw"}),
}


class Classifier(pl.LightningModule):
    def __init__(self, matrix: str, steps: int, seed: int):
        super().__init__()
        self.model = make_model(seed)
        self.matrix, self.steps = matrix, steps

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_acc", (self.model(x).argmax(1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        cls, options = MATRIX[self.matrix]
        # The last Linear ("4") is the output head: to AdamW with the biases.
        opt = fogo.Hybrid(self.model, cls, options, {"lr": 2e-3, "weight_decay": 0.01},
                          rest_patterns=[r"^4\."])
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=pathlib.Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--matrix", choices=sorted(MATRIX), default="fogo")
    parser.add_argument("--train", type=int, default=60000, help="training images used")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    xtr, ytr = load(args.data, "train", args.train)
    xte, yte = load(args.data, "t10k", 10000)
    g = torch.Generator().manual_seed(args.seed)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr),
                                        batch_size=args.batch_size, shuffle=True, generator=g)
    test = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xte, yte), batch_size=1000)
    steps = args.epochs * len(train)
    net = Classifier(args.matrix, steps, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        common = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      default_root_dir=tmp)
        # The first epoch, a checkpoint, then the rest resumed from it (the optimizer's state
        # and the schedule included) by a new model and Trainer, as after a restart.
        first = pl.Trainer(max_epochs=1, **common)
        first.fit(net, train, test)
        ckpt = pathlib.Path(tmp) / "epoch1.ckpt"
        first.save_checkpoint(ckpt)
        resumed = Classifier(args.matrix, steps, args.seed)
        final = pl.Trainer(max_epochs=args.epochs, **common)
        final.fit(resumed, train, test, ckpt_path=ckpt)
        acc = final.validate(resumed, test, verbose=False)[0]["val_acc"]
    opt = final.optimizers[0]
    print(f"fogo.Hybrid ({args.matrix} + AdamW): test accuracy {acc:.4f} after "
          f"{final.global_step} steps; groups {[g['side'] for g in opt.param_groups]}")
    if args.matrix == "fogo":
        t = opt.matrix.telemetry()[0]
        print(f"FOGO telemetry: step {t['step']}, codebook entropy {t['codebook_entropy']:.2f}, "
              f"live centroids {t['live_centroids']}")


if __name__ == "__main__":
    main()
