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
#include "run_parts.h"

namespace gpt2 {

namespace tr = fogo::trainer;

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

  void check_ranks_agree() const;
  void join_ranks();
  void resume_if_saved();
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
  check_ranks_agree();
  dp_.on_main([&] { run_dir_.emplace(cfg.out_dir, kRunFiles, cfg.resume, cfg.overwrite); });
  if (dp_.distributed()) join_ranks();
  if (cfg_.resume) resume_if_saved();
  if (dp_.main()) open_metrics();
  describe_run();
  if (step_ == 0) result_.val_loss.push_back({0, 0, evaluate()});
  if (!cfg_.quiet && dp_.main()) {
    progress_ = std::make_unique<tr::Progress>(
        steps_, step_, tr::ProgressOptions{.label = cfg_.optimizer.name, .unit = "tokens"}, log_);
  }
  model_->train();
}

// Every rank must run the same job: the signature, and the flags that steer the ranks'
// collectives (a rank resuming alone, stopping earlier, sharding differently would hang them).
void Trainer::Impl::check_ranks_agree() const {
  tr::RunSignature launch = signature_;
  launch.add("resume", cfg_.resume)
      .add("overwrite", cfg_.overwrite)
      .add("stop-at-step", cfg_.stop_at_step)
      .add("shard-step", cfg_.data_parallel.shard_step);
  dp_.check_same_settings(launch);
}

// Data-parallel: every rank starts from rank 0's model, the gradients are averaged during
// backward, and under --shard-step each rank orthogonalizes its share of the matrices.
void Trainer::Impl::join_ranks() {
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

// --resume: continues from the run's checkpoint when there is one (its signature checked).
void Trainer::Impl::resume_if_saved() {
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

}  // namespace gpt2
