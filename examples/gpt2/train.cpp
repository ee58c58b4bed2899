#include "train.h"

#include <fogo/fogo_optimizer.h>
#include <fogo/qk_clip.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>

#include "common/checkpoint.h"
#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/fogo_flags.h"
#include "common/metrics.h"
#include "common/optimizers.h"
#include "common/progress.h"
#include "common/report.h"
#include "common/run_dir.h"
#include "common/runtime.h"
#include "common/signature.h"

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

void add_train_flags(tr::Cli& cli, TrainConfig& c, std::string& format) {
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

  cli.section("Optimization");
  cli.choice("optimizer", &c.optimizer.name, {"adamw", "muon", "fogo"}, "update rule");
  cli.flag("lr", &c.optimizer.lr, "peak learning rate (AdamW side; matrix side too by default)");
  cli.flag("matrix-lr", &c.optimizer.matrix_lr, "peak learning rate of Muon/FOGO's matrices");
  cli.flag("weight-decay", &c.optimizer.weight_decay, "decoupled weight decay");
  cli.flag("beta1", &c.optimizer.beta1, "AdamW beta1");
  cli.flag("beta2", &c.optimizer.beta2, "AdamW beta2");
  cli.flag("muon-momentum", &c.optimizer.muon_momentum,
           "Muon's momentum (Nesterov), in [0, 1): the paper's and PyTorch's 0.95");
  cli.choice("muon-adjust", &c.optimizer.muon_adjust, {"match_rms", "original", "spectral"},
             "Muon lr rule: match_rms (0.2 sqrt(max(A,B)), AdamW's update RMS), original "
             "(sqrt(max(1,A/B))) or spectral (sqrt(A/B))");
  cli.flag("muon-normuon", &c.optimizer.muon_normuon,
           "Muon: NorMuon's per-row second-moment normalization of the update (docs/muon.md)");
  cli.flag("muon-ns-steps", &c.optimizer.muon_ns_steps, "Muon's Newton–Schulz iterations");
  cli.flag("muon-ns-schedule", &c.optimizer.muon_ns_schedule,
           "Muon's per-iteration Newton–Schulz coefficients: keller_jordan, polar_express, tuned5, "
           "deepseek_v4, cans, cubic5 or rows a,b,c;a,b,c;... (at most --muon-ns-steps rows)");
  cli.flag("muon-extra-scale", &c.optimizer.muon_extra_scale,
           "Muon's update multiplier, lr x the lr rule's factor x this (Megatron-LM's "
           "extra_scale_factor)");
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

  cli.section("Runtime");
  cli.flag("device", &c.device, "cpu, cuda, cuda:N or auto");
  cli.choice("autocast", &c.autocast, {"auto", "bf16", "off"},
             "bf16 autocast of the forward pass (auto: on CUDA only)");
  cli.flag("deterministic", &c.deterministic, "deterministic kernels (bitwise resume on CPU)");
  cli.flag("seed", &c.seed, "seed of the initialisation and dropout");
  cli.flag("threads", &c.threads, "CPU threads (0: torch's default)");
  tr::add_data_parallel_flags(cli, c.data_parallel);
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

namespace {

void validate(const TrainConfig& c) {
  const auto got = [](auto v) {
    if constexpr (std::is_floating_point_v<decltype(v)>)
      return ", got " + tr::flag_text(v);
    else
      return ", got " + std::to_string(v);
  };
  tr::Cli::require(c.batch_size >= 1, "batch-size", "must be >= 1" + got(c.batch_size));
  tr::Cli::require(c.grad_accum >= 1, "grad-accum", "must be >= 1" + got(c.grad_accum));
  tr::Cli::require(c.max_steps >= 0, "steps", "must be >= 0" + got(c.max_steps));
  tr::Cli::require(c.max_steps > 0 || c.tokens > 0, "tokens",
                   "must be > 0 when --steps is not given");
  tr::Cli::require(c.decay_frac >= 0.0 && c.decay_frac <= 1.0, "decay-frac",
                   "must be in [0, 1]" + got(c.decay_frac));
  tr::Cli::require(c.min_lr_factor >= 0.0 && c.min_lr_factor <= 1.0, "min-lr-factor",
                   "must be in [0, 1]" + got(c.min_lr_factor));
  tr::Cli::require(c.grad_clip >= 0.0, "grad-clip", "must be >= 0" + got(c.grad_clip));
  tr::Cli::require(c.qk_clip >= 0.0, "qk-clip", "must be >= 0 (0: off)" + got(c.qk_clip));
  tr::Cli::require(c.eval_every >= 1, "eval-every", "must be >= 1" + got(c.eval_every));
  tr::Cli::require(c.eval_sequences >= 1, "eval-sequences", "must be >= 1" + got(c.eval_sequences));
  tr::Cli::require(c.log_every >= 1, "log-every", "must be >= 1" + got(c.log_every));
  tr::validate_data_parallel_flags(c.data_parallel);
  tr::Cli::require(c.ckpt_every >= 0, "ckpt-every", "must be >= 0" + got(c.ckpt_every));
  tr::Cli::require(c.stop_at_step >= 0, "stop-at-step", "must be >= 0" + got(c.stop_at_step));
  tr::Cli::require(c.autocast == "auto" || c.autocast == "bf16" || c.autocast == "off", "autocast",
                   "expected one of auto,bf16,off, got '" + c.autocast + "'");
  tr::Cli::require(!c.out_dir.empty(), "out", "no directory given");
}

// A loss curve as checkpoint history rows (step, tokens, value), and back.
tr::History to_rows(const std::vector<Point>& points) {
  tr::History rows;
  for (const Point& p : points) {
    rows.push_back({static_cast<double>(p.step), static_cast<double>(p.tokens), p.value});
  }
  return rows;
}

std::vector<Point> from_rows(const tr::History& rows) {
  std::vector<Point> points;
  for (const auto& r : rows) {
    points.push_back({static_cast<int64_t>(r.at(0)), static_cast<int64_t>(r.at(1)), r.at(2)});
  }
  return points;
}

// The flags that decide a run's trajectory, "auto" resolved: a checkpoint must agree on every
// one with the command that resumes it. --eval-every and --eval-sequences leave the weights alone
// but define the validation curve of the run's history. Left out, as they change neither:
// --out, --log-every, --ckpt-every, --stop-at-step, --resume, --quiet, --peak-tflops; and
// --device, --threads, --deterministic, which change the arithmetic only in its rounding (a
// checkpoint may move between machines).
static std::string fogo_text(const std::vector<std::string>& assignments) {
  std::string out;
  for (const auto& a : assignments) out += (out.empty() ? "" : " ") + a;
  return out.empty() ? "-" : out;
}

// --batch-size is recorded as the global micro-batch, per-rank batch x world size: a run may
// continue on another number of ranks when the global batch stays the same.
tr::RunSignature run_signature(const TrainConfig& cfg, const GPTConfig& model, const Corpus& corpus,
                               int64_t steps, int64_t warmup, bool autocast, int64_t world_size,
                               const torch::Device& device) {
  const auto& o = cfg.optimizer;
  tr::RunSignature s("gpt2");
  s.add("model", cfg.model)
      .add("arch", cfg.arch)
      .add("n-layer", model.n_layer)
      .add("n-head", model.n_head)
      .add("n-embd", model.n_embd)
      .add("block-size", model.block_size)
      .add("vocab-size", model.vocab_size)
      .add("dropout", cfg.dropout)
      .add("data", cfg.data.path)
      .add("format", to_string(corpus.format))
      .add("val-fraction", cfg.data.val_fraction)
      .add("chunk-bytes", cfg.data.chunk_bytes)
      .add("tune-fraction", cfg.data.tune_fraction)
      .add("data-seed", cfg.data_seed)
      .add("optimizer", o.name)
      .add("lr", o.lr)
      .add("matrix-lr", o.matrix_lr.value_or(o.lr))
      .add("weight-decay", o.weight_decay)
      .add("beta1", o.beta1)
      .add("beta2", o.beta2)
      .add("muon-adjust", o.muon_adjust)
      .add("ns-dtype", tr::resolved_ns_dtype(o.ns_dtype, device))  // auto as it resolves here
      .add("fogo", fogo_text(o.fogo_options))
      .add("ablation", o.ablation)
      .add("steps", steps)
      .add("batch-size", cfg.batch_size * world_size)
      .add("grad-accum", cfg.grad_accum)
      .add("warmup-steps", warmup)
      .add("decay-frac", cfg.decay_frac)
      .add("min-lr-factor", cfg.min_lr_factor)
      .add("grad-clip", cfg.grad_clip)
      .add("eval-every", cfg.eval_every)
      .add("eval-sequences", cfg.eval_sequences)
      .add("autocast", autocast ? "bf16" : "off")
      .add("seed", cfg.seed);
  // Recorded when not the default, so that checkpoints made before the flag stay resumable.
  if (o.name == "muon" && o.muon_momentum != 0.95) s.add("muon-momentum", o.muon_momentum);
  if (o.name == "muon" && o.muon_normuon) s.add("muon-normuon", true);
  if (cfg.qk_clip > 0) s.add("qk-clip", cfg.qk_clip);
  if (o.name == "muon" && o.muon_ns_steps != 5) s.add("muon-ns-steps", o.muon_ns_steps);
  if (o.name == "muon" && !o.muon_ns_schedule.empty())
    s.add("muon-ns-schedule", o.muon_ns_schedule);
  if (o.name == "muon" && o.muon_extra_scale != 1.0) s.add("muon-extra-scale", o.muon_extra_scale);
  return s;
}

void write_model_config(tr::CheckpointWriter& w, const GPTConfig& c) {
  w.put("arch", to_string(c.arch));
  w.put("vocab_size", c.vocab_size);
  w.put("block_size", c.block_size);
  w.put("n_layer", c.n_layer);
  w.put("n_head", c.n_head);
  w.put("n_embd", c.n_embd);
  w.put("dropout", c.dropout);
  w.put("rope_base", c.rope_base);
}

GPTConfig read_model_config(tr::CheckpointReader& r) {
  GPTConfig c;
  c.arch = parse_arch(r.get_string("arch"));
  c.vocab_size = r.get_int("vocab_size");
  c.block_size = r.get_int("block_size");
  c.n_layer = r.get_int("n_layer");
  c.n_head = r.get_int("n_head");
  c.n_embd = r.get_int("n_embd");
  c.dropout = r.get_double("dropout");
  c.rope_base = r.get_double("rope_base");
  c.validate();
  return c;
}

std::string format_double(double v, int precision) {
  if (!std::isfinite(v)) return "n/a";
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << v;
  return s.str();
}

// Checks the settings and applies the process-wide ones (threads, determinism, TF32); returns
// the device to train on.
torch::Device set_up_runtime(const TrainConfig& cfg, const tr::DataParallel& dp) {
  validate(cfg);
  validate(cfg.optimizer);
  torch::Device device = tr::parse_device(cfg.device);
  // One GPU per rank: --device cuda (or auto) means the GPU the job's group settled on for this
  // rank (cuda:0 when the rank sees one GPU, as CUDA_VISIBLE_DEVICES per rank gives it; else
  // cuda:LOCAL_RANK).
  if (dp.distributed() && device.is_cuda() && !device.has_index()) {
    device = dp.cuda_device().value_or(
        torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dp.local_rank())));
  }
  tr::set_threads(cfg.threads);
  if (cfg.deterministic) tr::make_deterministic(cfg.seed);
  if (device.is_cuda()) at::globalContext().setFloat32MatmulPrecision("high");  // TF32
  return device;
}

// The initial weights come from --seed alone, whatever ran before.
GPT make_model(const GPTConfig& mc, int64_t seed, torch::Device device) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  GPT model(mc);
  model->to(device);
  return model;
}

int64_t total_steps(const TrainConfig& cfg, int64_t tokens_per_step) {
  return cfg.max_steps > 0 ? cfg.max_steps : (cfg.tokens + tokens_per_step - 1) / tokens_per_step;
}

int64_t warmup_steps(const TrainConfig& cfg, int64_t steps) {
  const int64_t warmup =
      cfg.warmup_steps >= 0 ? cfg.warmup_steps : std::llround(0.02 * static_cast<double>(steps));
  tr::Cli::require(
      warmup <= steps, "warmup-steps",
      std::to_string(warmup) + " exceeds the run's " + std::to_string(steps) + " steps");
  return warmup;
}

// The flags whose sensible size only the data and the machine bound: refused naming the cause,
// rather than met by an allocator's message (std::bad_alloc) or by what looks like a hang.
void check_sizes(const TrainConfig& cfg, const GPTConfig& mc, const Corpus& corpus) {
  const double ram = tr::physical_memory_bytes();
  // A micro-batch's logits in float32, their gradient and the softmax: three of them at least.
  const double logits = 3.0 * 4.0 * static_cast<double>(cfg.batch_size) *
                        static_cast<double>(mc.block_size) * static_cast<double>(mc.vocab_size);
  tr::Cli::require(ram <= 0 || logits <= ram, "batch-size",
                   std::to_string(cfg.batch_size) + " sequences of " +
                       std::to_string(mc.block_size) + " tokens need " +
                       format_double(logits / 1e9, 1) +
                       " GB for their logits alone, more than this machine's " +
                       format_double(ram / 1e9, 1) + " GB of memory");
  const int64_t windows = corpus.val.num_windows(mc.block_size + 1);
  const int64_t most = std::max<int64_t>(windows, 1024);
  tr::Cli::require(cfg.eval_sequences <= most, "eval-sequences",
                   std::to_string(cfg.eval_sequences) + " is more than the validation split's " +
                       std::to_string(windows) + " distinct windows (and than 1024): every " +
                       "evaluation would take that many forward passes, repeating windows");
}

}  // namespace

// One run, in the parts of its loop: set-up (the constructor), one training step, evaluation,
// the record of a step (metrics files, progress line) and checkpointing. Everything a step
// depends on is its index (batches, schedule, dropout seed) or state that the checkpoint holds
// (weights, optimizer, history, the partial logging interval): hence an exact resume.
//
// Under torchrun (WORLD_SIZE > 1) the run is data-parallel with a replicated optimizer: each
// rank reads rows [rank x b, (rank + 1) x b) of every global micro-batch of world x b rows (b =
// --batch-size), the gradients are averaged during backward, and every rank steps its own copy
// of the optimizer identically; the evaluation is split over the ranks and summed. Rank 0 alone
// logs, writes the metrics and the checkpoints. Steps and tokens count the global batch.
class Trainer::Impl {
 public:
  Impl(const TrainConfig& cfg, std::ostream& log);
  bool done() const { return step_ >= end_; }
  int64_t step() const { return step_; }
  void advance();
  RunResult finish();

 private:
  struct StepStats {
    double train_loss = 0, grad_norm = 0, lr_factor = 0;
    double max_logit = std::numeric_limits<double>::quiet_NaN();  ///< --qk-clip: before clipping
    std::vector<double> update_rms;  ///< per param group, on recorded steps
  };

  void resume(tr::CheckpointReader& in);
  void open_metrics();
  double clip_qk();
  void describe_run() const;
  StepStats train_step();
  double evaluate();
  void record(const StepStats& stats, bool evaluated, double val_loss);
  void show_progress(const StepStats& stats, bool evaluated, double val_loss, double mfu);
  void checkpoint(bool evaluated, double val_loss);
  double best_val_loss() const;
  void write_state(tr::CheckpointWriter& w) const;

  const TrainConfig cfg_;
  tr::DataParallel& dp_;
  std::ostream& log_;  ///< the given log on rank 0, a sink elsewhere
  const torch::Device device_;
  const bool autocast_;
  const Corpus corpus_;
  const GPTConfig mc_;
  const Batcher train_data_, val_data_;
  GPT model_;
  Optimizer opt_;
  tr::UpdateRms update_rms_;
  const std::vector<torch::Tensor> params_;
  const int64_t tokens_per_step_, steps_, warmup_, end_;
  /// The job's peak: --peak-tflops (per device) x ranks, since tokens/s counts every rank's.
  const double peak_tflops_, max_norm_;
  const tr::RunSignature signature_;
  const std::string ckpt_path_, best_path_;
  RunResult result_;
  int64_t step_ = 0;  ///< steps done
  // Training losses since the last record: a stop between records keeps them in the
  // checkpoint, so records fall on the same steps whether or not the run was interrupted.
  double interval_sum_ = 0;
  int64_t interval_count_ = 0;
  std::vector<tr::MetricsWriter> metrics_;
  std::unique_ptr<tr::Progress> progress_;
  std::optional<tr::RunDirectory> run_dir_;  ///< rank 0: --out, claimed for this run
};

// The files of a run in its --out.
const std::vector<std::string> kRunFiles = {tr::kCheckpointFile, tr::kBestCheckpointFile,
                                            "metrics.jsonl", "metrics.csv"};

Trainer::Impl::Impl(const TrainConfig& cfg, std::ostream& log)
    : cfg_(cfg),
      dp_(tr::DataParallel::process(std::chrono::seconds(cfg.data_parallel.dist_timeout),
                                    tr::parse_device(cfg.device))),
      log_(dp_.main_only(log)),
      device_(set_up_runtime(cfg, dp_)),
      autocast_(cfg.autocast == "bf16" || (cfg.autocast == "auto" && device_.is_cuda())),
      corpus_(load_corpus(cfg.data)),
      mc_(model_config(cfg, corpus_.vocab_size)),
      train_data_(corpus_.train, "train", mc_.block_size, mc_.vocab_size, cfg.data_seed),
      val_data_(corpus_.val, "val", mc_.block_size, mc_.vocab_size, cfg.data_seed),
      model_(make_model(mc_, cfg.seed, device_)),
      opt_(make_optimizer(cfg.optimizer, *model_)),
      params_(model_->parameters()),
      tokens_per_step_(cfg.batch_size * dp_.world_size() * cfg.grad_accum * mc_.block_size),
      steps_(total_steps(cfg, tokens_per_step_)),
      warmup_(warmup_steps(cfg, steps_)),
      end_(cfg.stop_at_step > 0 ? std::min(cfg.stop_at_step, steps_) : steps_),
      peak_tflops_((cfg.peak_tflops >= 0 ? cfg.peak_tflops : (device_.is_cuda() ? 989.0 : 0.0)) *
                   static_cast<double>(dp_.world_size())),
      max_norm_(cfg.grad_clip > 0 ? cfg.grad_clip : std::numeric_limits<double>::infinity()),
      signature_(
          run_signature(cfg, mc_, corpus_, steps_, warmup_, autocast_, dp_.world_size(), device_)),
      ckpt_path_((std::filesystem::path(cfg.out_dir) / tr::kCheckpointFile).string()),
      best_path_((std::filesystem::path(cfg.out_dir) / tr::kBestCheckpointFile).string()) {
  result_.optimizer = cfg.optimizer.name;
  result_.model = mc_;
  for (const auto& block : *model_->h)
    block->as<Block>()->attn->record_max_logits = cfg.qk_clip > 0;
  result_.steps = steps_;
  result_.tokens_per_step = tokens_per_step_;
  result_.device = tr::describe_runtime(device_) + (autocast_ ? ", bf16 autocast" : ", fp32");
  result_.rank = dp_.rank();
  result_.world_size = dp_.world_size();
  check_sizes(cfg, mc_, corpus_);
  // Every rank must run the same job: the signature, and the flags that steer the ranks'
  // collectives (a rank resuming alone, stopping earlier, sharding differently would hang them).
  tr::RunSignature launch = signature_;
  launch.add("resume", cfg.resume)
      .add("overwrite", cfg.overwrite)
      .add("stop-at-step", cfg.stop_at_step)
      .add("shard-step", cfg.data_parallel.shard_step);
  dp_.check_same_settings(launch);
  dp_.on_main([&] { run_dir_.emplace(cfg.out_dir, kRunFiles, cfg.resume, cfg.overwrite); });
  if (dp_.distributed()) {
    result_.device += ", " + std::to_string(dp_.world_size()) + " ranks (data-parallel)";
    dp_.broadcast_module(*model_);
    dp_.average_gradients_of(*model_);
    if (cfg_.data_parallel.shard_step && opt_.hybrid.matrix()) {
      const auto owners = dp_.shard_step(opt_.hybrid);
      log_ << "sharded step: rank 0 orthogonalizes "
           << std::count(owners.begin(), owners.end(), int64_t{0}) << " of " << owners.size()
           << " matrices\n";
    }
  }
  if (cfg_.resume) {
    // Checkpoints were ckpt.pt before both trainers named them alike: not a run to restart.
    const auto former = std::filesystem::path(cfg_.out_dir) / "ckpt.pt";
    tr::Cli::require(std::filesystem::exists(ckpt_path_) || !std::filesystem::exists(former),
                     "resume",
                     "found " + former.string() + ", the former name of " + tr::kCheckpointFile +
                         ": rename it to continue that run");
    if (!dp_.distributed()) {
      if (auto in = tr::open_for_resume(ckpt_path_, signature_, device_)) resume(*in);
    } else if (const auto bytes = dp_.read_on_main(ckpt_path_)) {
      // Rank 0's checkpoint, on every rank: the file need not be visible to the other ranks.
      tr::CheckpointReader in(ckpt_path_, *bytes, device_);
      signature_.check(in);
      resume(in);
    }
  }
  if (dp_.main()) open_metrics();
  describe_run();
  if (step_ == 0) result_.val_loss.push_back({0, 0, evaluate()});
  if (!cfg_.quiet && dp_.main()) {
    progress_ = std::make_unique<tr::Progress>(
        steps_, step_, tr::ProgressOptions{.label = cfg_.optimizer.name, .unit = "tokens"}, log_);
  }
  model_->train();
}

void Trainer::Impl::resume(tr::CheckpointReader& in) {
  in.load_module("model", *model_);
  in.load_optimizer("optimizer", opt_.hybrid);
  step_ = in.get_int("step");
  result_.train_seconds = in.get_double("train_seconds");
  interval_sum_ = in.get_double("interval_loss_sum");
  interval_count_ = in.get_int("interval_count");
  result_.train_loss = from_rows(in.get_history("history_train"));
  result_.val_loss = from_rows(in.get_history("history_val"));
  log_ << "resumed " << ckpt_path_ << " at step " << step_ << "/" << steps_ << "\n";
}

void Trainer::Impl::open_metrics() {
  const auto open = [&](const char* name) {
    const std::string path = (std::filesystem::path(cfg_.out_dir) / name).string();
    return step_ > 0 ? tr::MetricsWriter::resume(path, step_) : tr::MetricsWriter::create(path);
  };
  for (const char* name : {"metrics.jsonl", "metrics.csv"}) metrics_.push_back(open(name));
  // Issue 47: one record per session that trains the run, from the step it starts at: what made
  // the run's numbers (command line, the binary's commit, machine, CPU ISA, date).
  tr::Record session;
  session.set("step", step_).set("command", tr::command_line()).set("commit", tr::build_commit());
  session.set("machine", tr::machine_description()).set("isa", tr::cpu_isa());
  open("provenance.jsonl").write(session.set("date", tr::utc_now()));
}

void Trainer::Impl::describe_run() const {
  const auto& o = cfg_.optimizer;
  log_ << "[" << o.name << "] " << result_.device << "\n"
       << "  model " << mc_.describe() << ", " << mc_.num_parameters() << " parameters\n"
       << "  data " << corpus_.description << "\n"
       << "  " << steps_ << " steps x " << tokens_per_step_ << " tokens (batch " << cfg_.batch_size
       << (dp_.distributed() ? " x " + std::to_string(dp_.world_size()) + " ranks" : "")
       << " x accum " << cfg_.grad_accum << " x context " << mc_.block_size << "), warmup "
       << warmup_ << ", lr " << o.lr
       << (o.name == "adamw" ? ""
                             : ", Newton-Schulz in " + tr::describe_ns_dtype(o.ns_dtype, device_))
       << "\n"
       << "  routing (side, rule, group and update scale of each parameter):\n"
       << fogo::routing_table(opt_.hybrid.routes(*model_));
}

void Trainer::Impl::advance() {
  const StepStats stats = train_step();
  ++step_;
  interval_sum_ += stats.train_loss;
  ++interval_count_;
  const bool evaluated = step_ % cfg_.eval_every == 0 || step_ == steps_;
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  if (evaluated) {
    val_loss = evaluate();
    result_.val_loss.push_back({step_, step_ * tokens_per_step_, val_loss});
    // Replicated ranks must hold bit-identical weights and FOGO memory (checksums, cheap).
    dp_.check_lockstep(*model_, cfg_.optimizer.name == "fogo"
                                    ? opt_.hybrid.matrix<fogo::FOGO>()
                                    : static_cast<const fogo::FOGO*>(nullptr));
  }
  if (dp_.main()) {
    record(stats, evaluated, val_loss);
    checkpoint(evaluated, val_loss);
  }
}

// Step step_ + 1: forward and backward over the micro-batches, clipping, the update; timed.
Trainer::Impl::StepStats Trainer::Impl::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepStats stats;
  stats.lr_factor = wsd_factor(step_, steps_, warmup_, cfg_.decay_frac, cfg_.min_lr_factor);
  opt_.hybrid.set_lr_factor(stats.lr_factor);
  // Dropout: rank 0 draws as a single process does; other ranks draw other masks (the run then
  // equals the single-process one in distribution only; without dropout, exactly).
  torch::manual_seed(static_cast<uint64_t>(cfg_.seed) + static_cast<uint64_t>(step_) +
                     (static_cast<uint64_t>(dp_.rank()) << 32));
  auto loss_sum = torch::zeros({}, torch::TensorOptions(device_).dtype(torch::kFloat));
  for (int64_t micro = 0; micro < cfg_.grad_accum; ++micro) {
    // This rank's rows of the global micro-batch of world x batch_size rows.
    auto [x, y] =
        train_data_.train_batch(step_, micro, cfg_.batch_size, dp_.rank() * cfg_.batch_size);
    torch::Tensor loss;
    {
      tr::AutocastGuard guard(device_.type(), autocast_);
      loss = model_->loss(x.to(device_), y.to(device_));
    }
    const auto backward = [&] { (loss / static_cast<double>(cfg_.grad_accum)).backward(); };
    // Micro-batches before the last accumulate locally; the last one's backward averages the
    // sums over the ranks as it goes.
    if (micro + 1 < cfg_.grad_accum) {
      dp_.accumulate_locally(backward);
    } else {
      backward();
    }
    loss_sum += loss.detach();
  }
  const auto t_wait = std::chrono::steady_clock::now();
  dp_.finish_gradients();  // every gradient = (sum over ranks) / world
  result_.gradient_wait_seconds.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count());
  // Returns the norm before clipping; with no clipping the gradients are scaled by exactly 1.
  stats.grad_norm = torch::nn::utils::clip_grad_norm_(params_, max_norm_);
  stats.train_loss = dp_.sum(loss_sum.to(torch::kDouble)).item<double>() /
                     static_cast<double>(cfg_.grad_accum * dp_.world_size());
  TORCH_CHECK(std::isfinite(stats.grad_norm) && std::isfinite(stats.train_loss), "step ", step_ + 1,
              ": non-finite loss (", stats.train_loss, ") or gradient norm (", stats.grad_norm,
              "); no update was applied. Lower --lr or check the data");
  // The .item() reads above synchronised: what follows until the next synchronisation is the
  // optimizer's own time.
  // The applied update's RMS per group, on the steps that write a record (outside the timing).
  const int64_t next = step_ + 1;
  const bool recorded = next % cfg_.log_every == 0 || next % cfg_.eval_every == 0 || next == steps_;
  if (recorded) update_rms_.snapshot(opt_.hybrid.param_groups());
  const auto t_opt = std::chrono::steady_clock::now();
  opt_.hybrid.step();
  opt_.hybrid.zero_grad();
  if (cfg_.qk_clip > 0) stats.max_logit = clip_qk();
  if (device_.is_cuda()) torch::cuda::synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  if (recorded) stats.update_rms = update_rms_.measure(opt_.hybrid.param_groups());
  result_.step_seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
  result_.optimizer_seconds.push_back(std::chrono::duration<double>(t1 - t_opt).count());
  result_.train_seconds += result_.step_seconds.back();
  return stats;
}

// QK-Clip after the update (--qk-clip): each layer's heads' largest logits of the step, the
// largest over the ranks, clip c_attn (its fused [q | k | v] rows and bias) at tau; returns the
// largest logit of the step before clipping.
double Trainer::Impl::clip_qk() {
  torch::NoGradGuard no_grad;
  const int64_t H = mc_.n_head, world = dp_.world_size();
  double largest = -std::numeric_limits<double>::infinity();
  for (const auto& block : *model_->h) {
    auto& attn = block->as<Block>()->attn;
    const torch::Tensor mine = attn->take_max_logits();
    TORCH_CHECK(mine.defined(), "--qk-clip: a layer recorded no logits this step");
    const torch::Tensor m = dp_.gather_rows(mine.to(torch::kCPU).unsqueeze(0), world).amax(0);
    largest = std::max(largest, m.max().item<double>());
    fogo::qk_clip(attn->c_attn->weight, attn->c_attn->bias, m, {H, H, mc_.n_embd / H},
                  cfg_.qk_clip);
  }
  return largest;
}

// Mean loss over the fixed validation windows (every window has block_size targets, so the
// mean of the chunks' means weighted by their sizes).
double Trainer::Impl::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  double sum = 0;
  const int64_t n = cfg_.eval_sequences, b = cfg_.batch_size, global = b * dp_.world_size();
  // Chunks of the global batch size; each rank evaluates its rows of each chunk.
  for (int64_t chunk = 0; chunk < n; chunk += global) {
    const int64_t begin = chunk + dp_.rank() * b, end = std::min({n, chunk + global, begin + b});
    if (begin >= end) continue;
    auto [x, y] = val_data_.eval_windows(begin, end, n);
    tr::AutocastGuard guard(device_.type(), autocast_);
    sum += model_->loss(x.to(device_), y.to(device_)).item<double>() *
           static_cast<double>(end - begin);
  }
  model_->train();
  return dp_.sum(sum) / static_cast<double>(n);
}

// A metrics record every --log-every steps and at each evaluation; the progress line.
void Trainer::Impl::record(const StepStats& stats, bool evaluated, double val_loss) {
  const int64_t tokens = step_ * tokens_per_step_;
  const double tps = static_cast<double>(tokens) / result_.train_seconds;
  const double mfu = peak_tflops_ > 0 ? mc_.flops_per_token() * tps / (peak_tflops_ * 1e12) : -1;
  if (evaluated || step_ % cfg_.log_every == 0) {
    const double mean = interval_sum_ / static_cast<double>(interval_count_);
    result_.train_loss.push_back({step_, tokens, mean});
    interval_sum_ = 0;
    interval_count_ = 0;
    tr::Record rec;
    rec.set("step", step_)
        .set("tokens", tokens)
        .set("optimizer", cfg_.optimizer.name)
        .set("lr", cfg_.optimizer.lr * stats.lr_factor)
        .set("train_loss", mean)
        .set("val_loss", val_loss)
        .set("grad_norm", stats.grad_norm)
        .set("tokens_per_s", tps)
        .set("mfu", mfu >= 0 ? mfu : std::numeric_limits<double>::quiet_NaN())
        .set("train_seconds", result_.train_seconds);
    std::vector<std::string> names;
    for (size_t g = 0; g < opt_.hybrid.param_groups().size(); ++g)
      names.push_back(opt_.hybrid.group_name(g));
    tr::add_update_rms(rec, names, stats.update_rms);
    if (cfg_.qk_clip > 0) rec.set("max_logit", stats.max_logit);
    if (cfg_.optimizer.name == "fogo") tr::add_fogo_telemetry(rec, opt_.hybrid);
    for (auto& m : metrics_) m.write(rec);
  }
  if (progress_) show_progress(stats, evaluated, val_loss, mfu);
}

void Trainer::Impl::show_progress(const StepStats& stats, bool evaluated, double val_loss,
                                  double mfu) {
  std::ostringstream extra;
  extra << "lr " << std::scientific << std::setprecision(2) << cfg_.optimizer.lr * stats.lr_factor
        << "  |g| " << std::fixed << std::setprecision(3) << stats.grad_norm;
  if (mfu >= 0) extra << "  MFU " << std::setprecision(1) << 100 * mfu << "%";
  progress_->update(step_, tokens_per_step_, {.loss = stats.train_loss, .extra = extra.str()});
  if (evaluated) {
    progress_->note("[" + cfg_.optimizer.name + "] step " + std::to_string(step_) + "  tokens " +
                    std::to_string(step_ * tokens_per_step_) + "  val loss " +
                    format_double(val_loss, 4));
  }
}

// checkpoint.pt at every evaluation (or every --ckpt-every steps) and at the session's last step,
// so that a crash loses at most the steps since; best.pt whenever the validation loss is the lowest
// yet. Each is replaced atomically.
void Trainer::Impl::checkpoint(bool evaluated, double val_loss) {
  const bool due =
      (cfg_.ckpt_every > 0 ? step_ % cfg_.ckpt_every == 0 : evaluated) || step_ == end_;
  const bool best = evaluated && val_loss < best_val_loss();
  if (!due && !best) return;
  tr::CheckpointWriter w;
  write_state(w);
  if (due) w.commit(ckpt_path_);
  if (best) w.commit(best_path_);
}

// The lowest validation loss of the evaluations before this step's, step 0's (the untrained
// model, not worth keeping) left out.
double Trainer::Impl::best_val_loss() const {
  double best = std::numeric_limits<double>::infinity();
  for (const Point& p : result_.val_loss) {
    if (p.step > 0 && p.step < step_) best = std::min(best, p.value);
  }
  return best;
}

void Trainer::Impl::write_state(tr::CheckpointWriter& w) const {
  signature_.write(w);
  write_model_config(w, mc_);
  w.put("data_format", to_string(corpus_.format));
  w.put("world_size", dp_.world_size());  // informative: the state is the whole replicated one
  w.put("step", step_);
  w.put("train_seconds", result_.train_seconds);
  w.put("interval_loss_sum", interval_sum_);
  w.put("interval_count", interval_count_);
  w.put_history("history_train", to_rows(result_.train_loss));
  w.put_history("history_val", to_rows(result_.val_loss));
  w.put_module("model", *model_);
  w.put_optimizer("optimizer", opt_.hybrid);
}

RunResult Trainer::Impl::finish() {
  if (progress_) progress_->finish();
  const int64_t trained = end_ * tokens_per_step_;
  result_.tokens_per_second =
      result_.train_seconds > 0 ? static_cast<double>(trained) / result_.train_seconds : 0.0;
  if (peak_tflops_ > 0) {
    result_.mfu = mc_.flops_per_token() * result_.tokens_per_second / (peak_tflops_ * 1e12);
  }
  result_.trained = model_;
  return result_;
}

Trainer::Trainer(const TrainConfig& config, std::ostream& log)
    : impl_(std::make_unique<Impl>(config, log)) {}
Trainer::~Trainer() = default;
bool Trainer::done() const { return impl_->done(); }
int64_t Trainer::step() const { return impl_->step(); }
void Trainer::advance() { impl_->advance(); }
RunResult Trainer::finish() { return impl_->finish(); }

RunResult train(const TrainConfig& cfg, std::ostream& log) {
  Trainer trainer(cfg, log);
  while (!trainer.done()) trainer.advance();
  return trainer.finish();
}

std::string step_time_summary(const RunResult& r) {
  constexpr size_t kSkip = 5;
  if (r.step_seconds.size() <= kSkip) return "steady state: fewer than 6 steps timed";
  const auto median = [&](const std::vector<double>& v) {
    std::vector<double> tail(v.begin() + kSkip, v.end());
    std::nth_element(tail.begin(), tail.begin() + tail.size() / 2, tail.end());
    return tail[tail.size() / 2];
  };
  const double step = median(r.step_seconds), optimizer = median(r.optimizer_seconds);
  const double tps = static_cast<double>(r.tokens_per_step) / step;
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << "steady state (steps " << kSkip + 1 << "-"
      << r.step_seconds.size() << "): median step " << 1e3 * step << " ms, optimizer "
      << 1e3 * optimizer << " ms (" << std::setprecision(1) << 100 * optimizer / step
      << "% of the step), ";
  if (r.world_size > 1) {
    const double wait = median(r.gradient_wait_seconds);
    out << std::setprecision(2) << "gradient all-reduce wait " << 1e3 * wait << " ms ("
        << std::setprecision(1) << 100 * wait / step << "%), ";
  }
  out << std::setprecision(0) << tps << " tokens/s";
  if (r.mfu >= 0 && r.tokens_per_second > 0) {
    out << std::setprecision(1) << ", MFU " << 100 * r.mfu * tps / r.tokens_per_second << "%";
  }
  return out.str();
}

std::vector<RunResult> compare(const TrainConfig& config, const std::vector<std::string>& names,
                               std::ostream& log) {
  tr::Cli::require(!names.empty(), "optimizers", "no optimizer given");
  std::vector<RunResult> runs;
  for (const auto& name : names) {
    TrainConfig c = config;
    c.optimizer.name = name;
    c.out_dir = (std::filesystem::path(config.out_dir) / name).string();
    runs.push_back(train(c, log));
    runs.back().trained = GPT(nullptr);  // keep one model in memory at a time
  }
  if (!tr::DataParallel::process().main()) return runs;  // rank 0 writes the report

  // Same schedule and eval cadence for every run, so the evaluated token counts coincide.
  std::vector<std::string> header{"tokens"};
  for (const auto& r : runs) header.push_back(r.optimizer);
  tr::Table curve(header);
  for (size_t i = 0; i < runs[0].val_loss.size(); ++i) {
    std::vector<std::string> row{std::to_string(runs[0].val_loss[i].tokens)};
    for (const auto& r : runs) {
      row.push_back(i < r.val_loss.size() ? format_double(r.val_loss[i].value, 4) : "n/a");
    }
    curve.add_row(row);
  }
  tr::Table summary(
      {"optimizer", "final val loss", "best val loss", "tokens/s", "MFU", "train time (s)"});
  for (const auto& r : runs) {
    double best = std::numeric_limits<double>::infinity();
    for (const auto& p : r.val_loss) best = std::min(best, p.value);
    summary.add_row({r.optimizer, format_double(r.val_loss.back().value, 4), format_double(best, 4),
                     format_double(r.tokens_per_second, 0),
                     r.mfu >= 0 ? format_double(100 * r.mfu, 2) + "%" : "n/a",
                     format_double(r.train_seconds, 1)});
  }

  const std::filesystem::path out(config.out_dir);
  const auto& first = runs.front();
  std::ostringstream md;
  md << "model " << first.model.describe() << " (" << first.model.num_parameters()
     << " parameters), " << first.steps << " steps x " << first.tokens_per_step
     << " tokens = " << first.steps * first.tokens_per_step << " tokens\n"
     << first.device << "\n\n### Validation loss vs training tokens\n\n"
     << curve.to_markdown() << "\n### Summary\n\n"
     << summary.to_markdown();
  {
    std::ofstream f(out / "compare.md");
    TORCH_CHECK(f << md.str(), "compare: cannot write ", (out / "compare.md").string());
  }
  log << "\n" << curve.to_text() << "\n" << summary.to_text();

  auto series = [&](auto member) {
    std::vector<tr::Series> all;
    for (const auto& r : runs) {
      tr::Series s{r.optimizer, {}, {}, {}};
      for (const auto& p : r.*member) {
        s.x.push_back(static_cast<double>(p.tokens) / 1e6);
        s.y.push_back(p.value);
      }
      all.push_back(std::move(s));
    }
    return all;
  };
  tr::plot_png(
      (out / "loss.png").string(),
      {{"GPT-2 training loss", "tokens (millions)", "loss", series(&RunResult::train_loss)},
       {"GPT-2 validation loss", "tokens (millions)", "loss", series(&RunResult::val_loss)}},
      2, log);
  log << "wrote " << (out / "compare.md").string() << " and " << (out / "loss.png").string()
      << "\n";
  return runs;
}

std::string sample(const SampleConfig& config) {
  const torch::Device device = tr::parse_device(config.device);
  tr::CheckpointReader in(config.checkpoint, device);
  GPT model(read_model_config(in));
  in.load_module("model", *model);
  model->to(device);
  const bool bytes = in.get_string("data_format") == to_string(DataFormat::Text);

  std::vector<int64_t> prompt = config.prompt_ids;
  if (prompt.empty()) {
    TORCH_CHECK(bytes, "sample: ", config.checkpoint,
                " was trained on GPT-2 token ids, which this "
                "program cannot encode or decode; give the prompt as --prompt-ids");
    TORCH_CHECK(!config.prompt.empty(), "--prompt: empty prompt");
    prompt = ByteTokenizer::encode(config.prompt);
  }
  auto ids = model->generate(torch::tensor(prompt, torch::kLong), config.tokens, config.temperature,
                             config.top_k, static_cast<uint64_t>(config.seed));
  std::vector<int64_t> out(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  if (bytes) return ByteTokenizer::decode(out);
  std::ostringstream s;
  for (size_t i = 0; i < out.size(); ++i) s << (i ? " " : "") << out[i];
  return s.str();
}

namespace {}  // namespace

SweepOutcome lr_sweep(const TrainConfig& config, const SweepOptions& sweep, std::ostream& log) {
  tr::Cli::require(!sweep.optimizers.empty(), "optimizers", "no optimizer given");
  tr::Cli::require(
      sweep.seeds.size() >= 3, "seeds",
      "--lr-sweep re-runs the chosen lr on >= 3 seeds; got " + std::to_string(sweep.seeds.size()));
  tr::Cli::require(
      sweep.tune_fraction > 0.0 && sweep.tune_fraction < 0.5, "tune-fraction",
      "--lr-sweep needs a tuning split in (0, 0.5), got " + tr::flag_text(sweep.tune_fraction));
  for (const double f : sweep.factors) {
    tr::Cli::require(f > 0 && std::isfinite(f), "lr-sweep",
                     "factors must be > 0, got " + tr::flag_text(f));
  }
  tr::Cli::require(
      sweep.sweep_seeds >= 1 && sweep.sweep_seeds <= static_cast<int64_t>(sweep.seeds.size()),
      "sweep-seeds",
      "must be in 1.." + std::to_string(sweep.seeds.size()) + " (the --seeds given), got " +
          std::to_string(sweep.sweep_seeds));
  tr::Cli::require(sweep.extend >= 0 && sweep.extend <= 20, "sweep-extend",
                   "must be in 0..20, got " + std::to_string(sweep.extend));
  const std::filesystem::path out(config.out_dir);
  // A run of `name` with every lr of the config scaled by `factor`.
  auto scaled = [&](const std::string& name, double factor) {
    TrainConfig c = config;
    c.optimizer.name = name;
    c.optimizer.lr = config.optimizer.lr * factor;
    if (config.optimizer.matrix_lr) c.optimizer.matrix_lr = *config.optimizer.matrix_lr * factor;
    return c;
  };
  // One grid point: its tuning loss on config's seed, or the mean over the sweep seeds.
  auto score = [&](const std::string& name, double f) {
    SweepPoint p{name, f, scaled(name, f).optimizer.lr, 0, {}};
    for (int64_t k = 0; k < sweep.sweep_seeds; ++k) {
      TrainConfig c = scaled(name, f);
      c.data.tune_fraction = sweep.tune_fraction;  // never the validation split
      std::string folder = name + "-x" + tr::flag_text(f);
      if (sweep.sweep_seeds > 1) {
        c.seed = c.data_seed = sweep.seeds[k];
        folder += "-seed" + std::to_string(sweep.seeds[k]);
      }
      c.out_dir = (out / "sweep" / folder).string();
      p.seed_losses.push_back(train(c, log).val_loss.back().value);
    }
    p.tune_loss = tr::mean_sd(p.seed_losses).mean;
    return p;
  };
  std::vector<double> factors = sweep.factors;
  std::sort(factors.begin(), factors.end());
  factors.erase(std::unique(factors.begin(), factors.end()), factors.end());
  SweepOutcome s;
  for (const auto& name : sweep.optimizers) {
    std::vector<SweepPoint> grid;
    for (const double f : factors) grid.push_back(score(name, f));
    // Extend beyond an edge while the best (lowest finite) loss sits there.
    for (int64_t added = 0;; ++added) {
      int64_t best = -1;
      for (size_t k = 0; k < grid.size(); ++k) {
        if (std::isfinite(grid[k].tune_loss) &&
            (best < 0 || grid[k].tune_loss < grid[best].tune_loss)) {
          best = static_cast<int64_t>(k);
        }
      }
      const int64_t last = static_cast<int64_t>(grid.size()) - 1;
      s.at_edge[name] = best >= 0 && (best == 0 || best == last);
      if (!s.at_edge[name] || added >= sweep.extend) break;
      if (best == 0) {
        const double step = last > 0 ? grid[1].factor / grid[0].factor : 2.0;
        grid.insert(grid.begin(), score(name, grid[0].factor / step));
      } else {
        grid.push_back(score(name, grid[last].factor * grid[last].factor / grid[last - 1].factor));
      }
    }
    s.points.insert(s.points.end(), grid.begin(), grid.end());
  }
  for (const auto& name : sweep.optimizers) {
    double best = std::numeric_limits<double>::infinity(), chosen = 0;
    for (const auto& p : s.points) {
      if (p.optimizer == name && std::isfinite(p.tune_loss) && p.tune_loss < best) {
        best = p.tune_loss;
        chosen = p.factor;
      }
    }
    TORCH_CHECK(chosen > 0, "--lr-sweep: no lr of ", name, " gave a finite loss");
    s.chosen[name] = chosen;
    for (const int64_t seed : sweep.seeds) {
      TrainConfig c = scaled(name, chosen);
      c.data.tune_fraction = 0.0;  // the validation split, as a plain compare
      c.seed = seed;
      c.data_seed = seed;
      c.out_dir = (out / (name + "-seed" + std::to_string(seed))).string();
      RunResult r = train(c, log);
      r.trained = GPT(nullptr);  // keep one model in memory at a time
      s.finals[name].push_back(r.val_loss.back().value);
    }
  }

  tr::Table grid({"optimizer", "lr factor", "lr", "tuning loss", "per seed", "chosen"});
  for (const auto& p : s.points) {
    std::string seeds;
    for (const double v : p.seed_losses)
      seeds += (seeds.empty() ? "" : " / ") + format_double(v, 4);
    const bool chosen = p.factor == s.chosen[p.optimizer];
    grid.add_row({p.optimizer, tr::flag_text(p.factor), tr::flag_text(p.lr),
                  format_double(p.tune_loss, 4), seeds,
                  chosen ? (s.at_edge[p.optimizer] ? "yes (grid edge)" : "yes") : ""});
  }
  tr::Table finals({"optimizer", "lr factor", "seeds", "final val loss"});
  for (const auto& name : sweep.optimizers) {
    finals.add_row({name, tr::flag_text(s.chosen[name]), std::to_string(sweep.seeds.size()),
                    tr::format_mean_sd(tr::mean_sd(s.finals[name]), 4)});
  }
  // Every pair of optimizers on the final validation loss, paired by seed (= data seed): FOGO -
  // Muon is the primary test, named before the runs (issue 34); the others are secondary.
  tr::MetricGroups loss{"val_loss", {}};
  for (const auto& name : sweep.optimizers)
    loss.groups.push_back({name, s.finals[name], sweep.seeds});
  const std::vector<tr::TestRow> tests = tr::test_families({loss}, {{"val_loss", "fogo", "muon"}});
  const tr::Table welch = tr::test_table(tests, 4);
  const std::string verdict = tr::primary_verdict(
      tests, [](const std::string&) { return "the final validation loss"; }, 4);
  std::ostringstream md;
  md << "Learning-rate sweep: factors";
  for (const double f : sweep.factors) md << " " << tr::flag_text(f);
  md << " of --lr (and --matrix-lr), extended by up to " << sweep.extend
     << " factor(s) per optimizer while its best was at an edge of the grid (\"grid edge\": "
        "still there), each point ";
  if (sweep.sweep_seeds == 1) {
    md << "on seed " << config.seed << " / data seed " << config.data_seed;
  } else {
    md << "on the mean over seeds (= data seeds)";
    for (int64_t k = 0; k < sweep.sweep_seeds; ++k) md << " " << sweep.seeds[k];
  }
  md << " (one batch order per seed for all), scored by the final loss on a tuning "
     << "split (the last " << tr::flag_text(sweep.tune_fraction)
     << " of every training span, held out from training; the validation split is not used). "
     << "The chosen factor re-run on " << sweep.seeds.size()
     << " seeds (seed = data seed), final loss on the validation split.\n\n"
     << grid.to_markdown() << "\n"
     << finals.to_markdown() << "\n"
     << tr::test_table_note(tests) << "\n\n"
     << welch.to_markdown() << (verdict.empty() ? "" : "\n" + verdict + "\n");
  if (!tr::DataParallel::process().main()) return s;  // rank 0 writes the report
  std::filesystem::create_directories(out);
  {
    std::ofstream f(out / "sweep.md");
    TORCH_CHECK(f << md.str(), "lr sweep: cannot write ", (out / "sweep.md").string());
  }
  log << "\n"
      << grid.to_text() << "\n"
      << finals.to_text() << "\n"
      << welch.to_text() << (verdict.empty() ? "" : "\n" + verdict + "\n");
  tr::Panel panel{"Tuning loss by learning rate", "log10(lr factor)", "loss", {}};
  for (const auto& name : sweep.optimizers) {
    tr::Series series{name, {}, {}, {}};
    for (const auto& p : s.points) {
      if (p.optimizer != name || !std::isfinite(p.tune_loss)) continue;
      series.x.push_back(std::log10(p.factor));
      series.y.push_back(p.tune_loss);
    }
    panel.series.push_back(series);
  }
  if (sweep.plots) tr::plot_png((out / "sweep.png").string(), {panel}, 1, log);
  return s;
}

}  // namespace gpt2
