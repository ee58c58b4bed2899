"""A small MLP on Fashion-MNIST with fogo.FOGO, fogo.Muon, torch.optim.Muon and AdamW.

Matrix weights go to the optimizer under test and biases / the output layer to AdamW (the hybrid
split, fogo.hybrid_param_groups); AdamW alone trains everything. Data: Debian's IDX files
(package dataset-fashion-mnist, /usr/share/datasets/fashion-mnist). About a minute on 2 CPU cores:

    PYTHONPATH=build/python .venv/bin/python python/examples/fashion_mnist.py
    # or, after `pip install --no-build-isolation .`:  python python/examples/fashion_mnist.py
"""

import argparse
import gzip
import pathlib
import struct
import time

import torch
import torch.nn.functional as F

import fogo


def read_idx(path: pathlib.Path) -> torch.Tensor:
    data = gzip.open(path).read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4 : 4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims :]), dtype=torch.uint8).reshape(shape)


def load(root: pathlib.Path, split: str, limit: int):
    x = read_idx(root / f"{split}-images-idx3-ubyte.gz")[:limit].float().div(255).flatten(1)
    y = read_idx(root / f"{split}-labels-idx1-ubyte.gz")[:limit].long()
    return (x - 0.2860) / 0.3530, y


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


# Muon with AdamW's lr, its update scaled to AdamW's RMS (Moonshot's rule).
MUON = {"lr": 2e-3, "weight_decay": 0.01, "adjust_lr_fn": "match_rms_adamw"}


def optimizers(name: str, model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    # The last Linear is the output head: split by position, as its name is just "4".
    matrix, rest = fogo.hybrid_param_groups(model, rest_patterns=[r"^4\."])
    adamw = lambda groups: torch.optim.AdamW(groups, lr=2e-3, weight_decay=0.01)  # noqa: E731
    if name == "adamw":
        return [adamw(list(model.parameters()))]
    if name == "fogo":
        return [fogo.FOGO(matrix, lr=0.02, sigma=0.2, codebook_size=32, proj_dim=64,
                          ns_dtype=torch.float32), adamw(rest)]
    if name == "fogo.Muon":
        return [fogo.Muon(matrix, **MUON), adamw(rest)]
    if name == "torch.Muon":
        return [torch.optim.Muon(matrix, **MUON), adamw(rest)]
    raise ValueError(name)


def evaluate(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=pathlib.Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--train", type=int, default=60000, help="training images used")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is fastest on a small shared machine)")
    parser.add_argument("--optimizers", default="fogo,fogo.Muon,torch.Muon,adamw")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    xtr, ytr = load(args.data, "train", args.train)
    xte, yte = load(args.data, "t10k", 10000)
    print(f"{'optimizer':<12} {'train loss':>10} {'test acc':>9} {'time':>7}")
    for name in args.optimizers.split(","):
        model = make_model(args.seed)
        opts = optimizers(name, model)
        # One cosine schedule per optimizer: fogo's optimizers read lr from param_groups.
        steps = args.epochs * (len(xtr) // args.batch_size)
        scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, steps) for o in opts]
        g = torch.Generator().manual_seed(args.seed)
        start, losses = time.perf_counter(), []
        for _ in range(args.epochs):
            order = torch.randperm(len(xtr), generator=g)
            for k in range(0, len(xtr) - args.batch_size + 1, args.batch_size):
                idx = order[k : k + args.batch_size]
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
                loss.backward()
                for o in opts:
                    o.step()
                    o.zero_grad()
                for s in scheds:
                    s.step()
                losses.append(loss.item())
        tail = sum(losses[-50:]) / len(losses[-50:])
        print(f"{name:<12} {tail:>10.4f} {evaluate(model, xte, yte):>9.4f} {time.perf_counter() - start:>6.1f}s")
        if name == "fogo":
            t = opts[0].telemetry()[0]
            print(f"{'':<12} FOGO telemetry (group 0): rbar {t['rbar']:.3f}, gamma_st "
                  f"{t['gamma_st']:.3f}, codebook entropy {t['codebook_entropy']:.2f}, "
                  f"live centroids {t['live_centroids']}")


if __name__ == "__main__":
    main()
