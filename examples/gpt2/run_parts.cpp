#include "run_parts.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "common/cli.h"
#include "common/optimizers.h"
#include "common/runtime.h"

namespace gpt2 {

namespace tr = fogo::trainer;

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

namespace {

std::string fogo_text(const std::vector<std::string>& assignments) {
  std::string out;
  for (const auto& a : assignments) out += (out.empty() ? "" : " ") + a;
  return out.empty() ? "-" : out;
}

}  // namespace

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
      .add("muon-adjust", tr::muon_adjust_signature(o.muon_adjust))
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

}  // namespace gpt2
