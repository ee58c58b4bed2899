#!/usr/bin/env python3
"""One torch.optim.Muon step over the same parameter sets as bench/bench_step.cpp, for comparing
fogo::Muon (BM_Step_Muon) with PyTorch's optimizer on the same device.

    python3 bench/torch_muon_step.py --set gpt2-small --device cuda [--steps 50]

torch.optim.Muon accepts 2-D parameters only, so conv weights [out, in, kh, kw] enter as their
[out, in*kh*kw] views (what fogo::Muon orthogonalizes). Defaults as fogo::MuonOptions(0.02): lr
0.02, weight decay 0.1, momentum 0.95, Nesterov, bf16 quintic Newton-Schulz, 5 steps. Prints the
median and mean wall-clock time of one step (synchronised), after warm-up steps.
"""
import argparse
import statistics
import time

import torch


def model_shapes(name):
    if name == "gpt2-small":
        return [s for _ in range(12) for s in ((768, 2304), (768, 768), (3072, 768), (768, 3072))]
    shapes = [(64, 3 * 3 * 3)]
    cin = 64
    for cout in (64, 128, 256, 512):
        for block in range(2):
            shapes.append((cout, (cin if block == 0 else cout) * 9))
            shapes.append((cout, cout * 9))
            if block == 0 and cin != cout:
                shapes.append((cout, cin))  # 1x1 downsample shortcut
        cin = cout
    shapes.append((10, 512))
    return shapes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=["gpt2-small", "resnet18"], default="gpt2-small")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    params = []
    for shape in model_shapes(args.set):
        p = torch.nn.Parameter(0.02 * torch.randn(shape, device=device))
        p.grad = torch.randn(shape, device=device)
        params.append(p)
    opt = torch.optim.Muon(params, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        opt.step()
    sync()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        opt.step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    count = sum(p.numel() for p in params)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch.optim.Muon {args.set} ({len(params)} matrices, {count / 1e6:.2f}M weights) "
          f"on {name}, torch {torch.__version__}: median {statistics.median(times):.3f} ms, "
          f"mean {statistics.mean(times):.3f} ms over {args.steps} steps")


if __name__ == "__main__":
    main()
