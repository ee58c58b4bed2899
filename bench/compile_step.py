"""The compiled training step against the eager one (docs/python.md, "torch.compile"): a
256-512-256 MLP with biases, batch 64, fogo.Hybrid with Muon and with FOGO on the matrices, on the
CPU with one thread; torch._dynamo.explain's graph breaks, then the median of 20 steps after 3
warm-up steps (compilation), eager and torch.compile(fullgraph=False, default backend).

    OMP_NUM_THREADS=1 PYTHONPATH=build/python .venv/bin/python bench/compile_step.py
"""

import time

import torch

import fogo

OPTIMIZERS = {
    "Muon": lambda m: fogo.Hybrid(m, fogo.Muon, lr=0.02),
    "FOGO": lambda m: fogo.Hybrid(m, fogo.FOGO, lr=0.01),
}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 256))


def train_step(net, opt, x, y):
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def median_ms(step, net, opt, x, y, warmup=3, runs=20):
    for _ in range(warmup):
        step(net, opt, x, y)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step(net, opt, x, y)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[runs // 2]


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    for name, make in OPTIMIZERS.items():
        torch._dynamo.reset()
        net = model()
        explained = torch._dynamo.explain(train_step)(net, make(net), x, y)
        print(name, "graphs", explained.graph_count, "breaks", explained.graph_break_count,
              [str(b.reason).splitlines()[0] for b in explained.break_reasons])
        for mode in ("eager", "compiled"):
            torch._dynamo.reset()
            net = model()
            step = train_step if mode == "eager" else torch.compile(train_step, fullgraph=False)
            print(name, mode, f"median {median_ms(step, net, make(net), x, y):.2f} ms")


if __name__ == "__main__":
    main()
