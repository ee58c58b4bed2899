#!/usr/bin/env python3
"""Issue 26's GPU step-speed targets as a Markdown table, from one GPU run's outputs.

    python3 bench/targets.py --bench logs/bench.json --torch-muon logs/torch_muon.txt \\
        --gpt2 adamw=logs/gpt2-adamw.log --gpt2 muon=logs/gpt2-muon.log \\
        --gpt2 fogo=logs/gpt2-fogo.log --gpt2-eager logs/gpt2-eager.log

Inputs (every one optional; a figure whose inputs are missing or unreadable reads "not
measured", and the script still exits 0):
  --bench       fogo_bench's --benchmark_out JSON (BM_Step_* and BM_Stage_FOGO on CUDA, set 0
                GPT-2 small and 1 ResNet-18; aggregates or single runs; the median is taken)
  --torch-muon  the text bench/torch_muon_step.py prints, one line per set
  --gpt2        OPT=PATH, the GPT-2 trainer's log per optimizer (its "steady state" line)
  --gpt2-accum  OPT=PATH, the same with gradient accumulation to the targets' 0.5M tokens per
                step (issue 44): the training-step ratios come from these when given
  --gpt2-eager  bench/gpt2_eager.py's output (its "gpt2_eager ... tokens_per_s=" line)

Columns: the figure, its value on the first GPU run (H100 80GB HBM3, 2026-11-24, commit da0f8fb,
../shared/gpu-runs/2026-11-24-h100.md and docs/benchmarks.md), the value measured now, the
target and whether it is met. Times are medians of fogo_bench's real time, NS bf16.
"""
import argparse
import json
import re
import statistics
import sys

NOT_MEASURED = "not measured"

# Set 0 = GPT-2 small (48 matrices), 1 = ResNet-18; device 1 = CUDA; NS dtype 0 = bf16.
SETS = {0: "GPT-2 small", 1: "ResNet-18"}
TORCH_SETS = {"gpt2-small": 0, "resnet18": 1}


def bench_name(kind, set_, stage=None):
    name = f"BM_{kind}/{set_}/1/0"
    return name if stage is None else f"{name}/{stage}"


STAGE_NS = 1  # bench_stages.cpp's Stage enum: kMomenta 0, kNs 1, ...


def load_bench(path):
    """{run name: median real time in ms} from Google Benchmark's JSON."""
    text = read_text(path)
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        print(f"targets.py: {path} is not JSON: {e}", file=sys.stderr)
        return {}
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    medians, samples = {}, {}
    for b in data.get("benchmarks", []):
        if b.get("error_occurred") or "real_time" not in b:
            continue
        # fogo_bench's benchmarks use real time: Google Benchmark names them ".../real_time".
        name = re.sub(r"/(real|manual)_time$", "", b.get("run_name", b.get("name", "")))
        ms = float(b["real_time"]) * scale.get(b.get("time_unit", "ns"), 1e-6)
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = ms
        else:
            samples.setdefault(name, []).append(ms)
    for name, values in samples.items():
        medians.setdefault(name, statistics.median(values))
    return medians


def read_text(path):
    """The file's text, or None (said on stderr) when there is no path or it cannot be read."""
    if not path:
        return None
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        print(f"targets.py: cannot read {path}: {e}", file=sys.stderr)
        return None


def load_torch_muon(path):
    """{set: median ms} from bench/torch_muon_step.py's lines."""
    out = {}
    text = read_text(path) or ""
    for m in re.finditer(r"torch\.optim\.Muon (\S+) .*?median ([0-9.]+) ms", text):
        if m.group(1) in TORCH_SETS:
            out[TORCH_SETS[m.group(1)]] = float(m.group(2))
    return out


def load_gpt2(path):
    """(median step ms, tokens/s, tokens per step) from a GPT-2 trainer log, or None."""
    text = read_text(path)
    if text is None:
        return None
    m = re.search(r"steady state \(steps [0-9]+-[0-9]+\): median step ([0-9.]+) ms.*?"
                  r"([0-9.]+) tokens/s", text)
    if not m:
        return None
    per_step = re.search(r"steps x ([0-9]+) tokens", text)
    return float(m.group(1)), float(m.group(2)), int(per_step.group(1)) if per_step else None


def load_eager(path):
    """tokens/s of bench/gpt2_eager.py, or None."""
    m = re.search(r"^gpt2_eager .*\btokens_per_s=([0-9.]+)", read_text(path) or "", re.M)
    return float(m.group(1)) if m else None


def fmt(value, unit=""):
    if value is None:
        return NOT_MEASURED
    if unit == "%":
        return f"{100 * value:.0f}%"
    if unit == "ms":
        return f"{value:.2f} ms"
    return f"{value:.2f}"


def span(values, unit=""):
    """'lo-hi' over the measured values, or not measured when none is."""
    got = [v for v in values if v is not None]
    if not got:
        return NOT_MEASURED
    lo, hi = min(got), max(got)
    suffix = " (partial)" if len(got) < len(values) else ""
    return (fmt(lo, unit) if lo == hi else f"{fmt(lo, unit)}-{fmt(hi, unit)}") + suffix


def verdict(ok):
    return NOT_MEASURED if ok is None else ("yes" if ok else "no")


def ratio(a, b):
    return a / b if a is not None and b else None


def step_rows(bench, torch_muon):
    """The rows of fogo_bench's optimizer steps and stages, and of torch.optim.Muon's step."""
    t = bench.get

    def step(kind, set_):
        return t(bench_name("Step_" + kind, set_))

    out = []
    # fogo::Muon's step on GPT-2 small in its best form (eager Plain, Auto, cuda_graph).
    forms = [step(k, 0) for k in ("Muon", "MuonAuto", "MuonGram", "MuonGraph")]
    best = min((v for v in forms if v is not None), default=None)
    # Issue 44's re-based targets (each a ratio or figure in one run on one GPU).
    out.append(("fogo::Muon step, GPT-2 small, best form", "6.68 ms", fmt(best, "ms"),
                "<= 5.5 ms (then toward 4.5)",
                verdict(None if best is None else best <= 5.5)))
    r = ratio(step("FOGO", 0), step("Muon", 0))
    out.append(("FOGO / fogo::Muon, GPT-2 small", "1.47", fmt(r), "<= 1.3",
                verdict(None if r is None else r <= 1.3)))
    fogo, ns = step("FOGO", 0), t(bench_name("Stage_FOGO", 0, STAGE_NS))
    outside = None if fogo is None or ns is None else (fogo - ns) / fogo
    out.append(("FOGO work outside NS", "28%", fmt(outside, "%"), "<= 25%",
                verdict(None if outside is None else outside <= 0.25)))
    # cuda_graph / eager per optimizer and set.
    graph = {(k, s): ratio(step(k + "Graph", s), step(k, s)) for k in ("FOGO", "Muon")
             for s in SETS}
    values = list(graph.values())
    ok = None if any(v is None for v in values) else all(v <= 1.0 for v in values)
    out.append(("cuda_graph / eager, every optimizer and set", "0.53-1.34", span(values),
                "<= 1.0 everywhere", verdict(ok)))
    # The same with one non-finite policy on both sides (issue 44; the row above compares a Mask
    # graph with a Raise eager step): graph / eager Mask, and graph Raise / eager Raise.
    like = [ratio(step(k + graph_kind, s), step(k + eager_kind, s)) for k in ("FOGO", "Muon")
            for s in SETS for graph_kind, eager_kind in (("Graph", "Mask"), ("GraphRaise", ""))]
    ok = None if any(v is None for v in like) else max(like) <= 1.0
    out.append(("cuda_graph / eager, one policy (Mask, Raise), every optimizer and set",
                "not kept", span(like), "<= 1.0", verdict(ok)))
    # Auto against the better of the two forms it chooses between.
    autos = []
    for k in ("FOGO", "Muon"):
        for s in SETS:
            forms = [v for v in (step(k, s), step(k + "Gram", s)) if v is not None]
            autos.append(ratio(step(k + "Auto", s), min(forms)) if forms else None)
    ok = None if any(v is None for v in autos) else max(autos) <= 1.05
    out.append(("Auto / min(Plain, Gram), every optimizer and set", "up to 2.4",
                span(autos), "<= 1.05", verdict(ok)))
    vs_torch = [ratio(step("Muon", s), torch_muon.get(s)) for s in SETS]
    ok = None if any(v is None for v in vs_torch) else max(vs_torch) <= 0.3
    out.append(("fogo::Muon / torch.optim.Muon, both sets", "0.35-0.56", span(vs_torch),
                "<= 0.3", verdict(ok)))
    return out


def trainer_rows(gpt2, eager, gpt2_accum=None):
    """The rows of the GPT-2 trainer's training steps and of eager PyTorch's throughput."""
    out = []
    # Training steps of the GPT-2 trainer per optimizer (at 0.5M tokens per step when given, as
    # the targets are defined), and eager PyTorch's throughput.
    steps = gpt2_accum if gpt2_accum else gpt2
    step_ms = {k: (v[0] if v else None) for k, v in steps.items()}
    tokens = sorted({v[2] for v in steps.values() if v and v[2]})
    at = f" ({', '.join(f'{n:,}' for n in tokens)} tokens/step)" if tokens else ""
    r = ratio(step_ms.get("fogo"), step_ms.get("adamw"))
    out.append(("GPT-2 124M training step, FOGO / AdamW" + at, "not kept", fmt(r), "<= 1.05",
                verdict(None if r is None else r <= 1.05)))
    r = ratio(step_ms.get("fogo"), step_ms.get("muon"))
    out.append(("GPT-2 124M training step, FOGO / Muon" + at, "not kept", fmt(r), "<= 1.03",
                verdict(None if r is None else r <= 1.03)))
    # The trainer against bench/gpt2_eager.py, both with AdamW (what the eager script runs).
    ours = gpt2.get("adamw")[1] if gpt2.get("adamw") else None
    got = NOT_MEASURED if ours is None or eager is None else (
        f"{ours:,.0f} vs {eager:,.0f} tokens/s")
    out.append(("GPT-2 124M trainer tokens/s vs eager PyTorch (both AdamW)", "not kept", got,
                ">= eager's", verdict(None if ours is None or eager is None else ours >= eager)))
    return out




def rows(bench, torch_muon, gpt2, eager, gpt2_accum=None):
    return step_rows(bench, torch_muon) + trainer_rows(gpt2, eager, gpt2_accum)


def table(rows_):
    lines = ["| ratio / figure | now (H100, da0f8fb) | measured | target | met? |",
             "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows_]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", help="fogo_bench --benchmark_out JSON")
    parser.add_argument("--torch-muon", help="output of bench/torch_muon_step.py")
    parser.add_argument("--gpt2", action="append", default=[], metavar="OPT=PATH",
                        help="GPT-2 trainer log per optimizer (adamw, muon, fogo)")
    parser.add_argument("--gpt2-eager", help="output of bench/gpt2_eager.py")
    parser.add_argument("--gpt2-accum", action="append", default=[], metavar="OPT=PATH",
                        help="GPT-2 trainer log per optimizer at 0.5M tokens per step")
    args = parser.parse_args(argv)
    logs = {}
    for flag, specs in (("--gpt2", args.gpt2), ("--gpt2-accum", args.gpt2_accum)):
        logs[flag] = {}
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep:
                parser.error(f"{flag} takes OPT=PATH, got {spec!r}")
            logs[flag][name.lower()] = load_gpt2(path)
    print(table(rows(load_bench(args.bench), load_torch_muon(args.torch_muon), logs["--gpt2"],
                     load_eager(args.gpt2_eager), logs["--gpt2-accum"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
