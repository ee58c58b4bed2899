#!/usr/bin/env python3
"""GPT-2 training throughput in eager PyTorch: the reference point for `gpt2 train` on a GPU.

    python3 bench/gpt2_eager.py --device cuda                 # GPT-2 124M, paper architecture
    python3 bench/gpt2_eager.py --device cuda --fused         # the same with fused AdamW

It builds the model of examples/gpt2 (model.h, model.cpp) in torch.nn and times the step of
train.cpp with AdamW (optim.cpp), so that tokens/s and MFU compare with the LibTorch trainer's
`gpt2 train --model 124m --optimizer adamw --device cuda --no-deterministic --batch-size 16`.

Model ("paper" architecture, the only one here): token embedding tied to the output head, no
position table, rotary embeddings (base 10000, rotate-half, tables built in float64 and stored
in fp32, cast to the activations' dtype at use), pre-LayerNorm blocks without biases in linears
or LayerNorms, exact GELU, dropout 0 (the trainer's p = 0 dropout returns its input, so none is
applied here), F.scaled_dot_product_attention(is_causal=True), fp32 cross entropy. Initialised
as nanoGPT and the trainer: N(0, 0.02), residual projections (c_proj) N(0, 0.02 / sqrt(2 L)),
LayerNorm weights 1; the model is built on the CPU under --seed (the trainer's default seed is
1337) and then moved, as the trainer does. Parameter names match the C++ module's (wte,
h.N.attn.c_attn, ..., ln_f).

Step (train.cpp's loop with grad_accum 1): forward and loss under bf16 autocast (CUDA; off on
the CPU, as --autocast auto), backward, clip_grad_norm_(1.0), host reads of the gradient norm
and the loss (train.cpp reads both to check they are finite), optimizer.step(), zero_grad
(set_to_none), device synchronisation. AdamW: lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on tensors of >= 2 dims (embedding and linear weights), none on LayerNorm weights.
The learning-rate schedule is left out: a constant lr costs the same as a scheduled one.
fp32 matmuls use TF32 on CUDA (set_float32_matmul_precision("high")), as the trainer.
--deterministic applies the trainer's deterministic mode (cuDNN deterministic, deterministic
algorithms with warn_only); it is off here by default, while the trainer's --deterministic
defaults on and its documented GPU throughput runs pass --no-deterministic.

Timing: a host clock (time.perf_counter) around each step, which ends synchronised, after
--warmup untimed steps. The optimizer part (step + zero_grad) is timed separately between a
synchronisation before it and the step's final one; the one before is the only sync added to
train.cpp's loop, and it costs little because the host reads of the loss and gradient norm
have already waited for the device. tokens/s = batch x context / median step time (also given
from the mean step time); MFU = flops_per_token x tokens/s / peak, with model.h's
flops_per_token() = 6 N + 12 L E T (N the parameters; there is no position table to exclude).

What is not measured: data loading. One random batch (torch.randint over the vocabulary) is
made on the device before timing and reused every step, so the loss falls by memorisation and
shows that the step trains; token values do not change the work. train.cpp's timed region also
assembles each batch on the host and copies it to the device (2 x batch x context int64).
Other differences from the LibTorch trainer: LibTorch's torch::optim::AdamW and
clip_grad_norm_ loop over parameters one at a time, while this script uses PyTorch's foreach
(multi-tensor) AdamW (or the fused kernel with --fused) and clip_grad_norm_, which is
multi-tensor on CUDA; and
train.cpp's run tokens/s is cumulative tokens / cumulative step time from the first step,
warm-up included, where this script excludes --warmup steps (default 5, as the trainer's
median-based steady-state figures skip its first five steps).

The last line printed is the summary, space-separated key=value pairs (nan where undefined):

    gpt2_eager device= device_name= torch= arch=paper n_layer= n_head= n_embd= block_size=
    vocab_size= batch_size= tokens_per_step= params= flops_per_token= autocast= adamw=
    deterministic= warmup= steps= step_ms_median= step_ms_mean= opt_ms_median= opt_ms_mean=
    opt_share= tokens_per_s= tokens_per_s_mean= peak_tflops= mfu= mfu_mean= loss_init=
    loss_final=

opt_share = opt_ms_median / step_ms_median.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

# train.cpp's optimizer defaults (OptimizerConfig) and gradient clipping.
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 6e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
ROPE_BASE = 10000.0


def apply_rope(x, cos, sin):
    """Rotates pairs (x_i, x_{i+D/2}) of the head dimension, as model.cpp's apply_rope."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    # The tables are fp32; casting them keeps the product in the activations' dtype (bf16 under
    # autocast), which is what the C++ model computes.
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, E = x.shape
        q, k, v = (t.view(B, T, self.n_head, E // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(E, dim=2))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, E))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=False)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, bias=False)
        self.mlp = MLP(n_embd)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        # Submodules in model.cpp's registration order, so parameters() lists them alike.
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)

        head = n_embd // n_head
        inv_freq = ROPE_BASE ** (-torch.arange(0, head, 2, dtype=torch.float64) / head)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1).float()  # [T, head], halves repeated
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)

        residual_std = 0.02 / math.sqrt(2 * n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, residual_std)
                elif p.dim() == 2:  # the embedding and the other linears
                    p.normal_(0.0, 0.02)

    def loss(self, idx, targets):
        T = idx.size(1)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the head tied to the embedding
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def num_parameters(vocab_size, n_layer, n_embd):
    """model.h's GPTConfig::num_parameters() for the paper architecture, tied head counted once:
    V E + L (12 E^2 + 2 E) + E (per block: 4 E^2 attention, 8 E^2 MLP, two LayerNorm weights;
    then ln_f). GPT-2 124M (L 12, E 768) with bytes (V 256): 196,608 + 12 x 7,079,424 + 768 =
    85,150,464; with GPT-2 tokens (V 50257): 123,551,232."""
    return vocab_size * n_embd + n_layer * (12 * n_embd * n_embd + 2 * n_embd) + n_embd


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu, cuda or cuda:N")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--block-size", type=int, default=1024, help="context length")
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--vocab-size", type=int, default=256,
                        help="embedding rows (the trainer's default data is byte-level text)")
    parser.add_argument("--peak-tflops", type=float, default=-1.0,
                        help="device peak for MFU (-1: 989, H100/H200 dense bf16, on CUDA; "
                             "none on the CPU)")
    parser.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto",
                        help="bf16 autocast of the forward pass (auto: on CUDA only)")
    parser.add_argument("--fused", action="store_true",
                        help="fused AdamW kernel instead of the foreach (multi-tensor) one")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=False,
                        help="the trainer's deterministic mode (its default; GPU throughput "
                             "runs of the trainer use --no-deterministic)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch")
    args = parser.parse_args()
    for flag in ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.vocab_size < 2:
        parser.error("--vocab-size must be >= 2")
    if args.n_embd % args.n_head or (args.n_embd // args.n_head) % 2:
        parser.error(f"--n-embd {args.n_embd} must be a multiple of --n-head {args.n_head} "
                     "with an even head size (RoPE rotates pairs)")
    return args


def set_up_runtime(args):
    """The device, whether it is CUDA, the autocast choice and the MFU peak; the trainer's
    process-wide settings (threads, determinism, TF32)."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.deterministic:  # runtime.cpp's make_deterministic
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    if cuda:
        torch.set_float32_matmul_precision("high")  # TF32, as train.cpp on CUDA
    autocast = args.autocast == "bf16" or (args.autocast == "auto" and cuda)
    peak_tflops = args.peak_tflops if args.peak_tflops >= 0 else (989.0 if cuda else 0.0)
    return device, cuda, autocast, peak_tflops


def build(args, device):
    """The model (seeded), its parameters, and AdamW over the trainer's groups (optim.cpp's:
    decay for >= 2-D tensors, none for the LayerNorm weights)."""
    torch.manual_seed(args.seed)
    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    model.to(device)
    model.train()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    expected = num_parameters(args.vocab_size, args.n_layer, args.n_embd)
    assert n_params == expected, f"{n_params} parameters, model.h's formula gives {expected}"
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS,
                                  foreach=not args.fused, fused=args.fused or None)
    return model, params, n_params, optimizer


def make_train_step(model, params, optimizer, x, y, device, autocast):
    """One step; returns (loss, seconds of the step, seconds of step + zero_grad)."""
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def train_step():
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model.loss(x, y)
        loss.backward()
        # train.cpp reads both values on the host (LibTorch's clip_grad_norm_ returns a double)
        # to refuse a non-finite step; the reads wait for the device, as there.
        grad_norm = torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP).item()
        loss_value = loss.item()
        if not (math.isfinite(grad_norm) and math.isfinite(loss_value)):
            raise RuntimeError(f"non-finite loss ({loss_value}) or gradient norm ({grad_norm})")
        sync()  # the one sync train.cpp lacks: it starts the optimizer's clock on an idle device
        opt_start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        end = time.perf_counter()
        return loss_value, end - start, end - opt_start

    return train_step


def summary_record(args, run):
    """The closing key=value record of a run (`run`: what main measured and chose)."""
    step_s, opt_s, losses = run["step_s"], run["opt_s"], run["losses"]
    tokens_per_step, flops_per_token, peak_tflops = (run["tokens_per_step"],
                                                     run["flops_per_token"], run["peak_tflops"])
    step_median, step_mean = statistics.median(step_s), statistics.mean(step_s)
    opt_median, opt_mean = statistics.median(opt_s), statistics.mean(opt_s)
    tps, tps_mean = tokens_per_step / step_median, tokens_per_step / step_mean

    def mfu(tokens_per_s):
        if peak_tflops <= 0:
            return math.nan
        return flops_per_token * tokens_per_s / (peak_tflops * 1e12)

    return {
        "device": str(run["device"]), "device_name": run["device_name"].replace(" ", "_"),
        "torch": torch.__version__, "arch": "paper", "n_layer": args.n_layer,
        "n_head": args.n_head, "n_embd": args.n_embd, "block_size": args.block_size,
        "vocab_size": args.vocab_size, "batch_size": args.batch_size,
        "tokens_per_step": tokens_per_step, "params": run["n_params"],
        "flops_per_token": flops_per_token, "autocast": "bf16" if run["autocast"] else "off",
        "adamw": run["adamw"], "deterministic": int(args.deterministic), "warmup": args.warmup,
        "steps": args.steps, "step_ms_median": f"{1e3 * step_median:.3f}",
        "step_ms_mean": f"{1e3 * step_mean:.3f}", "opt_ms_median": f"{1e3 * opt_median:.3f}",
        "opt_ms_mean": f"{1e3 * opt_mean:.3f}", "opt_share": f"{opt_median / step_median:.4f}",
        "tokens_per_s": f"{tps:.1f}", "tokens_per_s_mean": f"{tps_mean:.1f}",
        "peak_tflops": peak_tflops if peak_tflops > 0 else math.nan,
        "mfu": f"{mfu(tps):.4f}", "mfu_mean": f"{mfu(tps_mean):.4f}",
        "loss_init": f"{losses[0]:.4f}", "loss_final": f"{losses[-1]:.4f}",
    }


def main():
    args = parse_args()
    device, cuda, autocast, peak_tflops = set_up_runtime(args)
    model, params, n_params, optimizer = build(args, device)
    flops_per_token = 6 * n_params + 12 * args.n_layer * args.n_embd * args.block_size
    adamw = "fused" if args.fused else "foreach"
    tokens = torch.randint(args.vocab_size, (args.batch_size, args.block_size + 1),
                           device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    tokens_per_step = args.batch_size * args.block_size
    train_step = make_train_step(model, params, optimizer, x, y, device, autocast)

    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"gpt2_eager: GPT-2 paper L{args.n_layer} H{args.n_head} E{args.n_embd} "
          f"T{args.block_size} V{args.vocab_size}, {n_params:,} parameters, "
          f"{flops_per_token / 1e6:.1f} MFLOP/token")
    print(f"  {device} ({device_name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads, {'bf16 autocast' if autocast else 'fp32'}"
          f"{', TF32' if cuda else ''}, AdamW {adamw}, "
          f"deterministic {'on' if args.deterministic else 'off'}")
    print(f"  batch {args.batch_size} x {args.block_size} = {tokens_per_step} tokens/step, "
          f"{args.warmup} warm-up + {args.steps} timed steps; ln(V) = "
          f"{math.log(args.vocab_size):.4f}", flush=True)

    losses, step_s, opt_s = [], [], []
    for i in range(args.warmup + args.steps):
        loss_value, seconds, opt_seconds = train_step()
        losses.append(loss_value)
        if i >= args.warmup:
            step_s.append(seconds)
            opt_s.append(opt_seconds)
    summary = summary_record(args, dict(
        step_s=step_s, opt_s=opt_s, losses=losses, tokens_per_step=tokens_per_step,
        flops_per_token=flops_per_token, peak_tflops=peak_tflops, device=device,
        device_name=device_name, n_params=n_params, autocast=autocast, adamw=adamw))
    print("gpt2_eager " + " ".join(f"{key}={value}" for key, value in summary.items()))


if __name__ == "__main__":
    main()
