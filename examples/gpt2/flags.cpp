#include <torch/torch.h>

#include <cmath>
#include <string>

#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/fogo_flags.h"
#include "common/optimizers.h"
#include "train.h"

namespace gpt2 {

namespace tr = fogo::trainer;

GPTConfig model_config(const TrainConfig& cfg, int64_t data_vocab) {
  GPTConfig c = GPTConfig::preset(cfg.model, parse_arch(cfg.arch), data_vocab);
  if (cfg.n_layer) c.n_layer = *cfg.n_layer;
  if (cfg.n_head) c.n_head = *cfg.n_head;
  if (cfg.n_embd) c.n_embd = *cfg.n_embd;
  if (cfg.block_size) c.block_size = *cfg.block_size;
  if (cfg.vocab_size) {
    tr::Cli::require(*cfg.vocab_size >= data_vocab, "vocab-size",
                     std::to_string(*cfg.vocab_size) + " is smaller than the data's vocabulary (" +
                         std::to_string(data_vocab) + ")");
    c.vocab_size = *cfg.vocab_size;
  }
  c.dropout = cfg.dropout;
  // The model's own checks throw c10::Error; on a configuration made of flags alone, their
  // failure is a refused command line, as the trainer's own checks are.
  try {
    c.validate();
  } catch (const c10::Error& e) {
    throw tr::CliError(e.what_without_backtrace());
  }
  return c;
}

namespace {

void add_model_flags(tr::Cli& cli, TrainConfig& c) {
  cli.section("Model");
  cli.choice("model", &c.model, {"tiny", "mini", "small", "124m"},
             "size: tiny (L2 E32 T32), mini (L4 E128 T128), small (L6 E192 T256), 124m (GPT-2 "
             "small: L12 H12 E768 T1024)");
  cli.choice("arch", &c.arch, {"paper", "classic"},
             "paper: no biases, RoPE, GELU (the FOGO paper); classic: learned positions, biases");
  cli.flag("n-layer", &c.n_layer, "override the size's layer count");
  cli.flag("n-head", &c.n_head, "override the size's head count");
  cli.flag("n-embd", &c.n_embd, "override the size's width");
  cli.flag("block-size", &c.block_size, "override the size's context length");
  cli.flag("vocab-size", &c.vocab_size,
           "embedding rows (default: the data's, 256 for text, 50257 for GPT-2 tokens)");
  cli.flag("dropout", &c.dropout, "dropout probability (the paper uses 0)");
}

void add_data_flags(tr::Cli& cli, TrainConfig& c, std::string& format) {
  cli.section("Data");
  cli.flag("data", &c.data.path,
           "a text file (byte-level tokens), or a directory holding nanoGPT train.bin/val.bin or "
           "llm.c *train*.bin/*val*.bin shards");
  cli.choice("format", &format, {"auto", "text", "nanogpt", "llmc"},
             "data format (auto: a file is text; a directory is nanogpt when it has a train.bin "
             "without the llm.c magic, llmc otherwise)");
  cli.flag("val-fraction", &c.data.val_fraction, "text: fraction of chunks held out");
  cli.flag("chunk-bytes", &c.data.chunk_bytes, "text: size of the train/val split chunks");
  cli.flag("tune-fraction", &c.data.tune_fraction,
           "> 0: validate on a tuning split, the last fraction of every training span (held out "
           "from training), instead of the validation split (what compare --lr-sweep uses)");
  cli.flag("data-seed", &c.data_seed, "seed of the batch order");
}

// Muon's own flags (the matrix side of --optimizer muon).
void add_muon_flags(tr::Cli& cli, OptimizerConfig& o) {
  cli.flag("muon-momentum", &o.muon_momentum,
           "Muon's momentum (Nesterov), in [0, 1): the paper's and PyTorch's 0.95");
  tr::add_muon_adjust_flag(cli, &o.muon_adjust);
  cli.flag("muon-normuon", &o.muon_normuon,
           "Muon: NorMuon's per-row second-moment normalization of the update (docs/muon.md)");
  cli.flag("muon-ns-steps", &o.muon_ns_steps, "Muon's Newton–Schulz iterations");
  cli.flag("muon-ns-schedule", &o.muon_ns_schedule,
           "Muon's per-iteration Newton–Schulz coefficients: keller_jordan, polar_express, tuned5, "
           "deepseek_v4, cans, cubic5 or rows a,b,c;a,b,c;... (at most --muon-ns-steps rows)");
  cli.flag("muon-extra-scale", &o.muon_extra_scale,
           "Muon's update multiplier, lr x the lr rule's factor x this (Megatron-LM's "
           "extra_scale_factor)");
}

void add_optimization_flags(tr::Cli& cli, TrainConfig& c) {
  cli.section("Optimization");
  cli.choice("optimizer", &c.optimizer.name, {"adamw", "muon", "fogo"}, "update rule");
  cli.flag("lr", &c.optimizer.lr, "peak learning rate (AdamW side; matrix side too by default)");
  cli.flag("matrix-lr", &c.optimizer.matrix_lr, "peak learning rate of Muon/FOGO's matrices");
  cli.flag("weight-decay", &c.optimizer.weight_decay, "decoupled weight decay");
  cli.flag("beta1", &c.optimizer.beta1, "AdamW beta1");
  cli.flag("beta2", &c.optimizer.beta2, "AdamW beta2");
  add_muon_flags(cli, c.optimizer);
  tr::add_ns_dtype_flag(cli, &c.optimizer.ns_dtype);
  tr::add_fogo_flags(cli, &c.optimizer.fogo_options, &c.optimizer.ablation);
  cli.flag("steps", &c.max_steps, "optimizer steps (0: from --tokens)");
  cli.flag("tokens", &c.tokens, "training token budget when --steps is 0");
  cli.flag("batch-size", &c.batch_size, "sequences per micro-batch");
  cli.flag("grad-accum", &c.grad_accum, "micro-batches per optimizer step");
  cli.flag("warmup-steps", &c.warmup_steps, "linear warmup steps (-1: 2% of the steps)");
  cli.flag("decay-frac", &c.decay_frac, "fraction of steps of the final linear decay");
  cli.flag("min-lr-factor", &c.min_lr_factor, "lr factor at the end of the decay");
  cli.flag("grad-clip", &c.grad_clip, "max global gradient norm (0: no clipping)");
  cli.flag("qk-clip", &c.qk_clip,
           "QK-Clip threshold on the attention logits after each update (0: off; 1e30: record "
           "the heads' max logits as max_logit without clipping)");
}

void add_output_flags(tr::Cli& cli, TrainConfig& c) {
  cli.section("Evaluation and output");
  cli.flag("eval-every", &c.eval_every, "steps between validations");
  cli.flag("eval-sequences", &c.eval_sequences,
           "validation windows (a fixed set, the same for every --batch-size)");
  cli.renamed("eval-batches", "eval-sequences");
  cli.flag("log-every", &c.log_every, "steps between metrics records");
  cli.flag("out", &c.out_dir,
           "output directory (metrics.jsonl, metrics.csv, checkpoint.pt, best.pt)");
  cli.flag("ckpt-every", &c.ckpt_every,
           "steps between checkpoints (0: at every evaluation); always at the end, and best.pt "
           "at each new lowest validation loss");
  cli.flag("resume", &c.resume, "continue from <out>/checkpoint.pt when it exists");
  cli.flag("overwrite", &c.overwrite,
           "replace the run already in --out (without it, or --resume, a folder holding a run's "
           "files is refused)");
  cli.flag("stop-at-step", &c.stop_at_step, "stop after this step, checkpointed (0: never)");
  cli.flag("peak-tflops", &c.peak_tflops, "device peak for MFU (-1: 989 on CUDA, none on CPU)");
}

void add_runtime_flags(tr::Cli& cli, TrainConfig& c) {
  cli.section("Runtime");
  cli.flag("device", &c.device, "cpu, cuda, cuda:N or auto");
  cli.choice("autocast", &c.autocast, {"auto", "bf16", "off"},
             "bf16 autocast of the forward pass (auto: on CUDA only)");
  cli.flag("deterministic", &c.deterministic, "deterministic kernels (bitwise resume on CPU)");
  cli.flag("seed", &c.seed, "seed of the initialisation and dropout");
  cli.flag("threads", &c.threads, "CPU threads (0: torch's default)");
  tr::add_data_parallel_flags(cli, c.data_parallel);
}

}  // namespace

void add_train_flags(tr::Cli& cli, TrainConfig& c, std::string& format) {
  add_model_flags(cli, c);
  add_data_flags(cli, c, format);
  add_optimization_flags(cli, c);
  add_output_flags(cli, c);
  add_runtime_flags(cli, c);
}

double wsd_factor(int64_t step, int64_t steps, int64_t warmup, double decay_frac,
                  double min_factor) {
  if (step < warmup) return static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay = static_cast<int64_t>(std::llround(decay_frac * static_cast<double>(steps)));
  const int64_t decay_start = steps - decay;
  if (decay <= 0 || step < decay_start) return 1.0;
  // Linear from 1 at decay_start to min_factor after the last step.
  const double progress = static_cast<double>(step - decay_start + 1) / static_cast<double>(decay);
  return 1.0 - (1.0 - min_factor) * progress;
}

}  // namespace gpt2
