#!/usr/bin/env python3
"""One optimizer step per optimizer, side by side in one process: torch.optim.Muon, fogo.Muon,
fogo.FOGO (full and fusion-only) and torch.optim.AdamW on the parameter sets of
bench/model_sets.h (issue 37's table; docs/benchmarks.md, "CPU: the optimizers side by side").

    PYTHONPATH=build/python python3 bench/cpu_optimizer_table.py --set resnet18 [--steps 5]

Rows: the five optimizers at their defaults (fogo's ns_dtype "auto"), then the configurations
the targets compare with: fogo.Muon with explicit bf16 / fp32 Newton-Schulz, FOGO with bf16 /
fp32 and ns_form plain / auto. FOGO runs the paper's preset for the set (GPT-2: gpt2, C 256,
d 512; ResNet-18: class_imbalanced_backbone, C 96, d 128) as one codebook group, as fogo_bench.
Parameters: the set's weights (conv weights 4-D for fogo and AdamW, their [out, in*kh*kw] views
for torch.optim.Muon, which takes 2-D only), 0.02 N(0, 1), one fixed gradient N(0, 1) each.

Timing: each step's CPU time (time.process_time) and wall time (time.perf_counter) after
--warmup untimed steps (FOGO's first builds its codebook; ns_dtype auto measures the CPU at the
first step), the medians of --steps. With one thread (--threads, default 1, as issue 37's
figures) the CPU time is the figure to compare on a shared machine: other processes' load
stretches the wall time, not the CPU time. A row whose first step takes more than --slow seconds
of CPU time is timed by that one step alone (for bf16 under an AVX2 limit, where a step takes
minutes and the first step's extra work is small beside it): such rows say "first step alone";
keep --slow above the first steps of ns_form auto rows, which time both forms of every shape. The first lines say the host (CPU model, ATen's capability
and cpuinfo's bf16 flags, any ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS limit), the load
(/proc/loadavg), torch and what auto resolved to; then one Markdown table row per optimizer.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import torch

import fogo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_muon_step import model_shapes  # noqa: E402  (the sets' 2-D views)


def shapes(name):
    """The set's weights as the models hold them (conv 4-D), bench/model_sets.h's order."""
    if name == "gpt2-small":
        return model_shapes(name)
    out = [(64, 3, 3, 3)]
    cin = 64
    for cout in (64, 128, 256, 512):
        for block in range(2):
            out.append((cout, cin if block == 0 else cout, 3, 3))
            out.append((cout, cout, 3, 3))
            if block == 0 and cin != cout:
                out.append((cout, cin, 1, 1))
        cin = cout
    out.append((10, 512))
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def rows(set_name):
    preset = fogo.presets.gpt2() if set_name == "gpt2-small" else \
        fogo.presets.class_imbalanced_backbone()
    fusion = {**preset, "fusion_only": True}
    bf16, fp32 = torch.bfloat16, torch.float32
    muon = {"lr": 0.02}
    return [
        ("torch.optim.Muon", "torch", muon),
        ("fogo.Muon default", fogo.Muon, muon),
        ("FOGO default", fogo.FOGO, preset),
        ("fusion-only FOGO default", fogo.FOGO, fusion),
        ("AdamW", torch.optim.AdamW, {"lr": 1e-3}),
        ("fogo.Muon bf16", fogo.Muon, {**muon, "ns_dtype": bf16}),
        ("fogo.Muon fp32", fogo.Muon, {**muon, "ns_dtype": fp32}),
        ("FOGO bf16", fogo.FOGO, {**preset, "ns_dtype": bf16}),
        ("FOGO fp32", fogo.FOGO, {**preset, "ns_dtype": fp32}),
        ("FOGO bf16 ns_form auto", fogo.FOGO, {**preset, "ns_dtype": bf16, "ns_form": "auto"}),
        ("FOGO fp32 ns_form auto", fogo.FOGO, {**preset, "ns_dtype": fp32, "ns_form": "auto"}),
        ("fusion-only FOGO bf16", fogo.FOGO, {**fusion, "ns_dtype": bf16}),
        ("fusion-only FOGO fp32", fogo.FOGO, {**fusion, "ns_dtype": fp32}),
    ]


def time_one(kind, options, set_name, args):
    torch.manual_seed(0)
    params = []
    for s in shapes(set_name):
        p = torch.nn.Parameter(0.02 * torch.randn(s))
        p.grad = torch.randn(s)
        params.append(p)
    if kind == "torch":
        views = [torch.nn.Parameter(p.detach().reshape(p.shape[0], -1)) for p in params]
        for v, p in zip(views, params):
            v.grad = p.grad.reshape(p.shape[0], -1)
        opt = torch.optim.Muon(views, **options)
    else:
        opt = kind(params, **options)
    def timed():
        cpu, wall = time.process_time(), time.perf_counter()
        opt.step()
        return time.process_time() - cpu, time.perf_counter() - wall

    first = timed()
    if first[0] > args.slow:
        return [first], True
    for _ in range(args.warmup - 1):
        opt.step()
    return [timed() for _ in range(args.steps)], False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=["gpt2-small", "resnet18"], default="resnet18")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--slow", type=float, default=120.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated row names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    limits = [f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                               "ATEN_CPU_CAPABILITY", "FOGO_NS_DTYPE")
              if os.environ.get(k)]
    print(f"host: {cpu_model()}, ATen {torch.backends.cpu.get_cpu_capability()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s)"
          + (f", {' '.join(limits)}" if limits else ""))
    print(f"load at start: {open('/proc/loadavg').read().strip()}")
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    table = []
    for name, kind, options in rows(args.set):
        if only and name not in only:
            continue
        times, slow = time_one(kind, options, args.set, args)
        cpu = statistics.median(t[0] for t in times)
        wall = statistics.median(t[1] for t in times)
        table.append((name, cpu, wall, len(times), slow))
        print(f"  {name}: CPU {cpu:.3f} s, wall {wall:.3f} s ({len(times)} step(s))",
              file=sys.stderr, flush=True)
    for c in fogo.ns_dtype_choices():
        times = "" if c["bf16_ms"] != c["bf16_ms"] else \
            f": bf16 GEMM {c['bf16_ms']:.3g} ms, fp32 {c['fp32_ms']:.3g} ms"
        print(f"ns_dtype auto on {c['device']}: {str(c['dtype']).replace('torch.', '')} "
              f"({c['reason']}{times}; {c['isa']})")
    print(f"load at end: {open('/proc/loadavg').read().strip()}")
    print(f"\n| {args.set}: optimizer | CPU s per step | wall s per step | steps |\n"
          "|---|---|---|---|")
    for name, cpu, wall, n, slow in table:
        print(f"| {name} | {cpu:.3f} | {wall:.3f} | {n}{' (first step alone)' if slow else ''} |")


if __name__ == "__main__":
    main()
