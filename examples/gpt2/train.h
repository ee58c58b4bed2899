#pragma once
// The GPT-2 training loop: warmup-stable-decay schedule, gradient accumulation and clipping,
// bf16 autocast on CUDA, fixed-set validation, metrics, atomic checkpoints with exact resume,
// and a comparison of several optimizers on the same data order and token budget.

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/data_parallel.h"
#include "data.h"
#include "model.h"
#include "optim.h"

namespace fogo::trainer {
class Cli;
}

namespace gpt2 {

struct TrainConfig {
  // Model: a named size, optionally overridden field by field.
  std::string model = "mini";
  std::string arch = "paper";
  std::optional<int64_t> n_layer, n_head, n_embd, block_size, vocab_size;
  double dropout = 0.0;

  DataOptions data{.path = "runs/kjv/kjv.txt"};
  OptimizerConfig optimizer;

  // Budget: max_steps, or when 0, enough steps for `tokens` training tokens.
  int64_t max_steps = 0;
  int64_t tokens = 2'000'000;
  int64_t batch_size = 16;  ///< sequences per micro-batch
  int64_t grad_accum = 1;   ///< micro-batches per step
  /// Warmup-stable-decay: linear warmup over warmup_steps (-1: 2% of the steps, the paper's
  /// 2K of 100K), constant, then linear decay to min_lr_factor over the last decay_frac.
  int64_t warmup_steps = -1;
  double decay_frac = 0.2;
  double min_lr_factor = 0.0;
  double grad_clip = 1.0;  ///< max global gradient norm; 0 disables clipping
  /// --qk-clip TAU: after every update, QK-Clip (fogo::qk_clip) of each layer's c_attn at TAU,
  /// the heads' largest logits recorded in the forwards (all ranks' largest) and written to the
  /// metrics as max_logit (a TAU above every logit, 1e30: recorded, never clipped); 0: off (the
  /// fused attention kernel).
  double qk_clip = 0.0;

  int64_t eval_every = 100;  ///< steps between validations (the last step is always evaluated)
  /// The fixed validation set: this many windows spread evenly over the validation split,
  /// evaluated in chunks of batch_size (the set does not depend on batch_size).
  int64_t eval_sequences = 128;
  int64_t log_every = 10;  ///< steps between metrics records

  std::string out_dir = "runs/gpt2";
  int64_t ckpt_every = 0;    ///< steps between checkpoints (0: at every evaluation)
  bool resume = false;       ///< continue from out_dir/checkpoint.pt when it exists
  bool overwrite = false;    ///< replace a previous run's files in out_dir (else refused)
  int64_t stop_at_step = 0;  ///< stop (with a checkpoint) after this step: simulates a crash

  std::string device = "auto";
  std::string autocast = "auto";  ///< auto (bf16 on CUDA, off on CPU) | bf16 | off
  bool deterministic = true;
  int64_t seed = 1337;       ///< model init and dropout
  int64_t data_seed = 1337;  ///< batch order
  int64_t threads = 0;
  fogo::trainer::DataParallelFlags data_parallel;
  double peak_tflops = -1;  ///< for MFU; < 0: 989 (H100/H200 bf16 dense) on CUDA, none on CPU
  bool quiet = false;       ///< no progress line (tests)
};

/// Registers the flags of `gpt2 train` and `gpt2 compare` (model, data, optimization, output,
/// runtime) with `cli`, bound to `config`; `format` receives --format (parse_data_format).
void add_train_flags(fogo::trainer::Cli& cli, TrainConfig& config, std::string& format);

/// Model configuration from the named size and overrides; vocab from the data when not given.
GPTConfig model_config(const TrainConfig& config, int64_t data_vocab);

/// Learning-rate factor of the warmup-stable-decay schedule at `step` (0-based) of `steps`.
double wsd_factor(int64_t step, int64_t steps, int64_t warmup, double decay_frac,
                  double min_factor);

struct Point {
  int64_t step = 0, tokens = 0;
  double value = 0;
};

struct RunResult {
  std::string optimizer;
  GPTConfig model;
  int64_t steps = 0, tokens_per_step = 0;
  std::vector<Point> train_loss;  ///< mean training loss of each logging interval
  std::vector<Point> val_loss;
  double train_seconds = 0;  ///< training time without validation and checkpoints
  double tokens_per_second = 0, mfu = -1;
  /// Wall-clock seconds of each step this process trained, and of its optimizer part (step and
  /// zero_grad; timed between the synchronisations the loop makes anyway on CUDA).
  std::vector<double> step_seconds, optimizer_seconds;
  /// Data-parallel: of each step, the wait in finish_gradients() for the gradient all-reduces
  /// that backward did not finish (the communication the step does not overlap); 0 alone.
  std::vector<double> gradient_wait_seconds;
  std::string device;
  /// This process's rank and the number of ranks (1: not launched by torchrun). Only rank 0
  /// logs and writes files.
  int64_t rank = 0, world_size = 1;
  GPT trained{nullptr};  ///< the final model
};

/// One run driven step by step. The constructor sets the run up (checks the settings, opens the
/// data, builds the model and optimizer, continues from the checkpoint under --resume, evaluates
/// step 0 of a fresh run); advance() trains one step, then evaluates, records and checkpoints
/// when they are due; finish() ends the run. Throws as train() does.
class Trainer {
 public:
  Trainer(const TrainConfig& config, std::ostream& log);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Whether the run has reached its last step (or --stop-at-step).
  bool done() const;
  /// Steps done so far, those of earlier sessions included.
  int64_t step() const;
  void advance();
  RunResult finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

/// Trains one run into config.out_dir: metrics.jsonl, metrics.csv, checkpoint.pt and best.pt (the
/// checkpoint of the lowest validation loss). Progress goes to `log`. Throws on bad
/// configuration, bad data, or a non-finite loss or gradient.
RunResult train(const TrainConfig& config, std::ostream& log);

/// One line on the steady state of a run: median step and optimizer times over the steps after
/// the first five (library initialisation, FOGO's codebook initialisation), their ratio, and the
/// tokens/s (and MFU, when known) of the median step.
std::string step_time_summary(const RunResult& result);

/// Trains each optimizer with otherwise identical settings into out_dir/<optimizer>, then
/// writes out_dir/compare.md (val loss at each evaluated token count, throughput) and
/// out_dir/loss.png (train and val loss vs tokens). Returns the runs.
std::vector<RunResult> compare(const TrainConfig& config, const std::vector<std::string>& names,
                               std::ostream& log);

/// compare --lr-sweep: for each optimizer, every factor scales --lr (and --matrix-lr) and is
/// scored by its final loss on a tuning split carved from the training data
/// (DataOptions::tune_fraction; the validation split is never used): on config's seed alone
/// (sweep_seeds 1), or by the mean over the first sweep_seeds of `seeds` (seed = data seed).
/// While an optimizer's best factor is the lowest or highest of its grid, a factor beyond that
/// edge (the grid's own ratio there; x2 for a one-point grid) is added and scored, at most
/// `extend` per optimizer (issue 34: x2 grids with edge extension, as resnet_train's). The
/// lowest-loss factor is re-run on every seed of `seeds` (>= 3; seed = data seed) and compared
/// on the validation split, with the paired t-test (by seed) between every two optimizers: FOGO -
/// Muon the primary test, the others secondary (common/stats.h, test_families). Writes
/// out_dir/sweep.md, out_dir/sweep.png; runs in out_dir/sweep/<opt>-x<factor> and
/// out_dir/<opt>-seed<seed>.
struct SweepOptions {
  std::vector<std::string> optimizers;
  std::vector<double> factors;
  std::vector<int64_t> seeds;
  double tune_fraction = 0.1;
  bool plots = true;
  int64_t sweep_seeds = 1;  ///< --sweep-seeds: 1 = config's seed; N = the first N of `seeds`
  int64_t extend = 0;       ///< --sweep-extend: factors added beyond an edge, per optimizer
};
struct SweepPoint {
  std::string optimizer;
  double factor = 0, lr = 0, tune_loss = 0;  ///< tune_loss: the mean over seed_losses
  std::vector<double> seed_losses;           ///< one per sweep seed
};
struct SweepOutcome {
  std::vector<SweepPoint> points;        ///< optimizer-major, each optimizer's in ascending factor
  std::map<std::string, double> chosen;  ///< optimizer -> factor
  std::map<std::string, bool> at_edge;   ///< optimizer -> its best factor is still at an edge
  std::map<std::string, std::vector<double>> finals;  ///< optimizer -> final val loss per seed
};
SweepOutcome lr_sweep(const TrainConfig& config, const SweepOptions& sweep, std::ostream& log);

struct SampleConfig {
  std::string checkpoint;
  std::string prompt = "\n";        ///< text (byte-level models)
  std::vector<int64_t> prompt_ids;  ///< token ids (models trained on GPT-2 tokens)
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  int64_t seed = 0;
  std::string device = "cpu";
};

/// Generates from a checkpoint; returns the text (byte models) or space-separated token ids.
std::string sample(const SampleConfig& config);

}  // namespace gpt2
