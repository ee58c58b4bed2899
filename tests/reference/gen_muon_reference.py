#!/usr/bin/env python3
"""Reference trajectories of PyTorch's torch.optim.Muon for fogo's parity test.

Each case ("cases"): a parameter of some shape, an option set, and a seeded sequence of
gradients; the file records the initial parameter, every gradient and the parameter after every
step. Each group case ("group_cases"): several param groups of several parameters stepped
together by one torch.optim.Muon (fogo batches a group's same-shape parameters into one
Newton-Schulz chain); per group its options and, per parameter, the initial value, the gradients,
whether it has a gradient at each step (PyTorch skips it when not) and the value after every step.
tests/test_muon.cpp replays the gradients through fogo::Muon and compares.

    python tests/reference/gen_muon_reference.py tests/data/muon_reference.pt
    python tests/reference/gen_muon_reference.py --check tests/data/muon_reference.pt

The output is deterministic (fixed seeds, CPU) on a given kind of CPU, so re-running it
reproduces the committed file; ctest checks that too (muon_reference_reproducible). The file
records the CPU's matmul signature (cpu_matmul_signature below): PyTorch's bf16 matmul goes
through oneDNN, which rounds differently on an AMX or AVX512-BF16 host than on an AVX512F or AVX2
one, so on a CPU with another signature the check (and tests/test_muon.cpp) compare at bf16
tolerance instead of bit for bit, and say so.
"""
import sys

import torch

STEPS = 4

# (name, shape, options): wide, tall, square, a conv weight as PyTorch can't (skipped there), and
# each option varied once.
CASES = [
    ("wide_default", (16, 40), {}),
    ("tall_default", (40, 16), {}),
    ("square_default", (24, 24), {}),
    ("wide_no_nesterov", (12, 30), {"nesterov": False}),
    ("tall_match_rms_adamw", (30, 12), {"adjust_lr_fn": "match_rms_adamw"}),
    ("square_options", (20, 20), {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.0,
                                   "ns_steps": 3, "eps": 1e-5}),
    ("wide_coefficients", (8, 64), {"ns_coefficients": (3.0, -3.2, 1.2), "lr": 5e-3}),
]


def make_case(index, shape, options):
    gen = torch.Generator().manual_seed(1000 + index)
    param = torch.randn(shape, generator=gen)
    grads = [torch.randn(shape, generator=gen) * (0.5 + k) for k in range(STEPS)]
    p = param.clone().requires_grad_(True)
    opt = torch.optim.Muon([p], **options)
    after = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        after.append(p.detach().clone())
    return {"param": param, "grads": torch.stack(grads), "after": torch.stack(after)}


DEFAULTS = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
            "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7, "ns_steps": 5,
            "adjust_lr_fn": "original"}


# (name, groups): each group (shapes, options, steps at which each parameter has no gradient).
GROUP_CASES = [
    # Three wide, two tall and one square matrix in one group, interleaved.
    ("one_group_mixed_shapes",
     [([(16, 40), (40, 16), (24, 24), (16, 40), (40, 16), (16, 40)], {}, {})]),
    # Two groups sharing a shape (batched per group, with its own options), a tall singleton, and
    # a parameter without a gradient at steps 1 and 2.
    ("two_groups_shared_shape",
     [([(12, 30), (30, 12), (12, 30), (12, 30)],
       {"lr": 0.02, "nesterov": False, "adjust_lr_fn": "match_rms_adamw"}, {2: (1, 2)}),
      ([(12, 30), (20, 20), (12, 30)],
       {"momentum": 0.9, "ns_steps": 3, "ns_coefficients": (3.0, -3.2, 1.2)}, {})]),
]


def make_group_case(index, groups):
    gen = torch.Generator().manual_seed(2000 + index)
    torch_groups, records = [], []
    for shapes, options, no_grad in groups:
        params = [torch.randn(shape, generator=gen) for shape in shapes]
        grads = [torch.stack([torch.randn(shape, generator=gen) * (0.5 + k) for k in range(STEPS)])
                 for shape in shapes]
        has_grad = [torch.tensor([k not in no_grad.get(i, ()) for k in range(STEPS)])
                    for i in range(len(shapes))]
        live = [p.clone().requires_grad_(True) for p in params]
        torch_groups.append({"params": live, **options})
        records.append({"options": {**DEFAULTS, **options}, "params": params, "grads": grads,
                        "has_grad": has_grad, "live": live, "after": [[] for _ in shapes]})
    opt = torch.optim.Muon(torch_groups)
    for k in range(STEPS):
        for record in records:
            for p, g, h in zip(record["live"], record["grads"], record["has_grad"]):
                p.grad = g[k].clone() if h[k] else None
        opt.step()
        for record in records:
            for p, after in zip(record["live"], record["after"]):
                after.append(p.detach().clone())
    for record in records:
        del record["live"]
        record["after"] = [torch.stack(after) for after in record["after"]]
    return {"groups": records}


BF16_ISA = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
# A trajectory made with another bf16 GEMM differs by bf16 rounding in each step's orthogonalized
# update (8 mantissa bits: 0.4% per rounding, a few roundings deep): 5% of the distance the
# parameter has moved bounds it with room, and is far below what a wrong step would give.
CROSS_CPU_RTOL = 0.05


def cpu_matmul_signature():
    """ATen's CPU capability and the bf16 ISA oneDNN picks kernels by; tests/test_util.h's
    cpu_matmul_signature() writes the same string."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = " " + line.split(":", 1)[1].strip() + " "
                    break
    except OSError:
        pass
    present = [f for f in BF16_ISA if f" {f} " in flags]
    return torch.backends.cpu.get_cpu_capability() + "|" + ",".join(present)


def close(stored, fresh):
    """Every trajectory within CROSS_CPU_RTOL of the distance it moved from its start."""
    def walk(a, b):
        if isinstance(a, dict):
            if "after" in a and "param" in a:
                moved = (a["after"] - a["param"]).abs().max()
                return bool(((a["after"] - b["after"]).abs().max() <= CROSS_CPU_RTOL * moved))
            if "after" in a and "params" in a:
                return all(bool((x - y).abs().max() <= CROSS_CPU_RTOL * (x - p).abs().max())
                           for x, y, p in zip(a["after"], b["after"], a["params"]))
            return a.keys() == b.keys() and all(walk(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(map(walk, a, b))
        return True
    return walk(stored, fresh)


def generate():
    cases = {}
    for index, (name, shape, options) in enumerate(CASES):
        case = make_case(index, shape, options)
        case["options"] = {**DEFAULTS, **options}
        cases[name] = case
    group_cases = {name: make_group_case(index, groups)
                   for index, (name, groups) in enumerate(GROUP_CASES)}
    return {"torch_version": str(torch.__version__), "cpu_signature": cpu_matmul_signature(),
            "steps": STEPS, "cases": cases, "group_cases": group_cases}


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        stored = torch.load(argv[2])
        fresh = generate()
        keys = ("cases", "group_cases")
        made_on = stored.get("cpu_signature", "(not recorded)")
        if made_on != fresh["cpu_signature"]:
            if not all(close(stored[key], fresh[key]) for key in keys):
                sys.exit(f"{argv[2]} differs from a fresh run of this script beyond bf16 rounding "
                         f"(rtol {CROSS_CPU_RTOL} of each trajectory's movement)")
            print(f"{argv[2]}: reproduced to bf16 rounding (rtol {CROSS_CPU_RTOL}), not bit for "
                  f"bit: it was made on a CPU with matmul signature {made_on}, this one is "
                  f"{fresh['cpu_signature']} (PyTorch's bf16 matmul rounds differently there)")
            return
        if not all(same(stored.get(key), fresh[key]) for key in keys):
            sys.exit(f"{argv[2]} differs from a fresh run of this script (torch "
                     f"{torch.__version__}, file made with {stored['torch_version']})")
        print(f"{argv[2]}: reproduced exactly ({len(fresh['cases'])} cases, "
              f"{len(fresh['group_cases'])} group cases)")
        return
    torch.save(generate(), argv[1] if len(argv) > 1 else "tests/data/muon_reference.pt")


if __name__ == "__main__":
    main(sys.argv)
