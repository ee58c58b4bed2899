#pragma once
// One run of the ResNet-18 trainer, private to its sources: what it trains and is tested on
// (Plan), and the Run that holds its state. run() names the stages; each stage is one member
// function, so that another driver (distributed training, say) can enter them. The members are
// defined by concern: set-up (trainer.cpp), training (run_training.cpp), evaluation
// (run_evaluation.cpp), and checkpoints and the result (run_result.cpp).

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/checkpoint.h"
#include "common/data_parallel.h"
#include "common/metrics.h"
#include "common/optimizers.h"
#include "common/progress.h"
#include "common/run_dir.h"
#include "common/runtime.h"
#include "common/signature.h"
#include "optimizers.h"
#include "resnet.h"
#include "trainer.h"

namespace fogo::resnet {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Purposes of derived generators, so the streams of one run never coincide.
enum Stream : uint64_t { kOrder = 1, kStep = 2 };

// What a run trains on and is tested on, already on the training device.
struct Plan {
  std::vector<std::string> task_names;
  std::vector<Dataset> train, test;  ///< per task (class-imbalanced: one task, one test set)
  Normalizer normalize;
  int64_t in_channels = 1, num_classes = 10;
};

Plan make_plan(const Config& c, const DataSplit& data, const torch::Device& device);

// Per-class correct and total counts of `model` on `data` ([num_classes] each, CPU int64), and
// the per-sample correctness (bool [N], CPU).
struct Counts {
  torch::Tensor correct, total, hit;
};
Counts class_counts(ResNet18& model, const Dataset& data, const Normalizer& normalize,
                    int64_t batch_size, int64_t num_classes, bool autocast);

double percent(const torch::Tensor& correct, const torch::Tensor& total);

class Run {
 public:
  Run(const Config& c, const DataSplit& data, std::ostream& log);
  /// The stages in order: resume, logs, announcement, training, result.

  RunResult run();

 private:
  // --- set-up ------------------------------------------------------------------------------

  void build_model_and_optimizer();

  // Every rank must run the same job: the signature, and the flags that steer the ranks'
  // collectives or their data (a rank resuming alone, stopping earlier, reading another folder).
  void check_ranks_agree() const;

  // Data-parallel (under torchrun): every rank starts from rank 0's model, gradients are
  // averaged over the ranks, and each rank trains on its rows of every global batch.
  void join_ranks();

  // The global batch: --batch-size rows on each rank.
  int64_t global_batch() const { return c_.batch_size * dp_.world_size(); }

  // What checkpoints are checked against: the settings, with the global batches.
  trainer::RunSignature signature() const;

  // Steps per epoch of each task, the run's total, and where this session stops.
  void schedule_steps();

  // The scenario's curves and summary metrics, and the accuracy matrix of the continual ones.
  void lay_out_result();

  // --resume: the run's checkpoint, when there is one (its settings checked); true if loaded.
  // Data-parallel: rank 0's checkpoint, sent to every rank.
  bool resume_from_checkpoint();

  // train and eval metrics files: new, or trimmed to the checkpoint's step when resumed.
  void open_logs(bool resumed);

  void announce(bool resumed);

  // --- training ----------------------------------------------------------------------------

  // Every task, epoch by epoch, from the current step to last_; epochs finished before a
  // checkpoint are skipped whole.
  void train();

  // The batches of epoch e of task t from the current step on; epoch_begin is the run's step
  // at the epoch's start.
  void train_epoch(int64_t t, int64_t e, int64_t epoch_begin, trainer::Progress& progress);

  // The learning rate of step `step` (0-based) of task t: a function of the position alone, so a
  // resumed run repeats it.
  void schedule_lr(int64_t t, int64_t step);

  // The order of task t's training images in epoch e: a function of (seed, t, e) alone.
  torch::Tensor epoch_order(int64_t t, int64_t e) const;

  torch::Tensor prepare(const torch::Tensor& images_u8, at::Generator& gen) const;

  // One optimizer step on the global batch `index` of task t; returns (loss, batch accuracy %).
  // Data-parallel, the whole global batch is augmented on every rank (the same draws as one
  // process) and each rank trains on its --batch-size rows of it.
  std::pair<double, double> train_step(int64_t t, const torch::Tensor& index);

  // The replay terms of the loss on samples of the buffer: ER (labels) or DER++ (stored
  // logits, and the labels of a second sample). Data-parallel, every rank draws the same global
  // replay batch (--replay-batch rows per rank) and trains on its share of it.
  torch::Tensor replay_loss(at::Generator& gen);

  // The model's output on this rank's share of the buffer samples `index` (all of them
  // augmented, as one process would), the share's indices, and the weight that turns the mean
  // over the share into its part of the mean over all of `index`: averaged over the ranks (as
  // the gradients are), share size x world / n times the share's mean is the mean over the n.
  // Exactly 1 in a world of one and whenever the ranks' shares are equal.
  std::tuple<torch::Tensor, torch::Tensor, double> replay_forward(const torch::Tensor& index,
                                                                  at::Generator& gen);

  // Runs `f` (a collective) and adds its wall time to comm_seconds_: the wait for the gradient
  // all-reduce that backward did not finish, the per-step sums and the replay gathers.
  void communicate(const std::function<void()>& f);

  // Backward, gradient clipping (and the norm for the log), optimizer step.
  void update(torch::Tensor& loss);

  void show_progress(int64_t t, int64_t e, double loss, double acc, trainer::Progress& progress);

  // What follows step_ (the batch of epoch e of task t; epoch_end on its last batch): the
  // metrics record, the evaluations and task boundary that are due, the checkpoint.
  void after_step(int64_t t, int64_t e, bool epoch_end, double loss, double acc,
                  trainer::Progress& progress);

  void log_step(int64_t t, int64_t e, double loss, double acc);

  // --- evaluation --------------------------------------------------------------------------

  // Class-imbalanced: at each epoch's end; continual: at each task's end (then the task
  // boundary, unless it was the last task); both: every --eval-every steps. Data-parallel,
  // rank 0 evaluates, and every rank checks that the ranks hold one model (and FOGO memory and
  // replay buffer).
  void evaluate_if_due(int64_t t, bool task_end, bool epoch_end, trainer::Progress& progress);

  void evaluate_imbalanced(trainer::Progress& progress);

  void evaluate_tasks(int64_t t, bool task_end, trainer::Progress& progress);

  // --- persistence -------------------------------------------------------------------------

  // The run's provenance, one list for the checkpoint, its reload and result.jsonl: the session
  // that trained the run last (command line, machine, date, the binary's commit, CPU ISA).
  template <class Result>
  static auto provenance(Result& r) {
    return std::array{std::pair{"command", &r.command}, std::pair{"machine", &r.machine},
                      std::pair{"date", &r.date}, std::pair{"commit", &r.commit},
                      std::pair{"isa", &r.isa}};
  }

  void save_checkpoint();

  void load_checkpoint(trainer::CheckpointReader& in);

  // --- result ------------------------------------------------------------------------------

  // The run's result (summary metrics once they exist), also written to result.jsonl.
  RunResult finish();

  // Data-parallel, rank 0 alone evaluates: its curves and accuracy matrix go to every rank, so
  // that every rank returns the same result (an --lr-sweep chooses its lrs from them).
  void share_main_result();

  // Class-imbalanced: the last evaluation and the mean rare forgetting; continual: AP, AF and
  // BWT after the last task. NaN where the run stopped before them.
  std::vector<double> summarize() const;

  void write_result() const;

  // The run's wall time over all its sessions: set-up, training and evaluations. Kept in the
  // checkpoint, so that a run resumed or only reloaded (--resume; scripts/run.sh joins runs made
  // by separate processes that way) reports the time it took, not the reload's.
  double wall_seconds() const;

  // First member: the session's clock starts before the rest is built.
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  double wall_before_ = 0;  ///< wall time of the earlier sessions (checkpoint)
  const std::string session_machine_ = trainer::machine_description();
  const std::string session_isa_ = trainer::cpu_isa();
  Config c_;
  trainer::DataParallel& dp_;
  std::ostream& log_;
  torch::Device device_;
  std::string dir_, ckpt_path_;
  Plan plan_;
  ResNet18 model_{nullptr};
  std::unique_ptr<TrainOptimizer> optimizer_;
  std::unique_ptr<ReplayBuffer> buffer_;
  std::vector<int64_t> steps_per_epoch_;
  int64_t total_ = 0, step_ = 0;
  int64_t last_ = 0;  ///< the step this session stops after (--stop-at-step, or total_)
  double seconds_ = 0, grad_norm_ = kNaN, lr_factor_ = 1.0;
  double comm_seconds_ = 0;  ///< data-parallel: time in collectives (communicate())
  bool autocast_ = false;    ///< bf16 autocast of the forward passes (CUDA)
  trainer::UpdateRms update_rms_;
  std::vector<double> last_update_rms_;  ///< of the last logged step, per param group
  double seconds_before_ = 0;            ///< training time of the earlier sessions
  std::chrono::steady_clock::time_point session_start_;
  double best_rare_ = -std::numeric_limits<double>::infinity();
  torch::Tensor rare_correct_;  ///< per rare test sample: correct at the last evaluation
  bool imbalanced_ = true;
  AccuracyMatrix R_;
  RunResult result_;
  std::optional<trainer::MetricsWriter> train_log_, eval_log_;
  std::optional<trainer::RunDirectory> claim_;  ///< rank 0: the run's folder, claimed
};

}  // namespace fogo::resnet
