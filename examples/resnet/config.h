#pragma once
// Configuration of the ResNet-18 trainer: one struct, bound to command-line flags by add_flags(),
// completed per run (optimizer, seed) by resolve(), which also fills every "auto" default from
// the paper's protocol for the scenario and optimizer.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/data_parallel.h"
#include "common/signature.h"

namespace fogo::trainer {
class Cli;
}

namespace fogo::resnet {

struct Config {
  // Scenario and data.
  std::string scenario = "class-imbalanced";  ///< class-imbalanced | class-il | domain-il
  std::string dataset = "fashion-mnist";      ///< fashion-mnist | cifar10
  std::string data_dir;                       ///< "" = /usr/share/datasets/fashion-mnist
  int64_t train_per_class = 0;                ///< 0 = all
  int64_t test_per_class = 0;
  std::vector<int64_t> rare_classes{4, 5, 6, 7, 8};
  double rare_fraction = 0.1;
  std::string task_order = "paper";
  std::string domains = "rotate";  ///< rotate | permute
  int64_t num_domains = 4;
  double rotation_step = 45.0;
  std::vector<int64_t> domain_order;  ///< empty = 0..num_domains-1
  std::string replay = "none";        ///< none | er | derpp
  int64_t buffer_size = 200;
  int64_t replay_batch = 32;
  std::optional<double> replay_alpha;  ///< ER 1.0, DER++ 0.1
  double der_beta = 0.5;
  bool augment = true;
  std::optional<int64_t> crop_pad;  ///< CIFAR 4, Fashion-MNIST 2

  /// Where a run is evaluated: test (the test set) | val (a split of --val-fraction of the
  /// training images per class, fixed across seeds, held out from training).
  std::string eval_split = "test";
  double val_fraction = 0.1;
  /// --lr-sweep: factors of each optimizer's default --lr (empty: no sweep; see sweep.cpp).
  std::vector<double> lr_sweep;
  /// --sweep-seeds: each grid point is scored by the mean validation score over the first N
  /// seeds of --seeds (one seed's argmax is partly noise).
  int64_t sweep_seeds = 2;
  /// --sweep-extend: at most this many points added per optimizer beyond the grid's edge while
  /// the best point is at that edge (0: the grid as given).
  int64_t sweep_extend = 4;

  // Model.
  int64_t width = 64;
  std::optional<int64_t> head_fc;  ///< class-il: 8 * width (the paper's head FC), else 0

  // Optimization.
  std::vector<std::string> optimizers{"fogo", "muon", "adam"};
  std::vector<int64_t> seeds{0};
  std::string optimizer = "adam";  ///< of one run (set by resolve)
  int64_t seed = 0;                ///< of one run (set by resolve)
  std::optional<double> lr, adamw_lr, head_lr, weight_decay, grad_clip;
  /// --optimizer-lr name=lr,...: the lr of the optimizers named (those not named keep --lr's
  /// default); resolve() applies the entry of its optimizer and refuses it next to --lr.
  std::vector<std::string> optimizer_lr;
  /// muon: its lr rule by the library's name (fogo/enum_names.h; the list Python reads) or the
  /// trainers' alias (common/optimizers.h): original (lr sqrt(max(1, A/B)), PyTorch's),
  /// match_rms_adamw or match_rms (lr 0.2 sqrt(max(A, B)): update RMS 0.2 lr in every matrix, so
  /// sigma x lr_fogo / 0.2 matches FOGO's update RMS layer by layer), spectral (sqrt(A/B)).
  std::string muon_adjust = "original";
  /// muon: NorMuon's per-row second-moment normalization of the orthogonalized update
  /// (fogo::MuonOptions::normuon; docs/muon.md, "NorMuon"). FOGO's own is --fogo normuon=true.
  bool muon_normuon = false;
  /// own (the classifier fc is a matrix of muon/fogo, of adam/adamw's one group) | adamw (fc's
  /// weight and bias trained by AdamW at --classifier-lr for every optimizer, adam included: the
  /// heads matched, so that a comparison isolates the backbone's update rule).
  std::string classifier = "own";
  std::optional<double> classifier_lr;  ///< --classifier adamw: default the run's --adamw-lr
  std::string ns_dtype = "auto";
  std::vector<std::string> fogo_options;  ///< --fogo key=value, applied to every FOGO group
  std::string ablation = "full";          ///< --ablation (common/fogo_flags.h)  ///< muon/fogo
                                          ///< Newton–Schulz compute dtype: bf16 | fp32
  std::optional<int64_t> epochs;          ///< per task in the continual scenarios
  /// auto (cosine at --width >= 64, the paper-sized model; constant below) | cosine | constant.
  /// cosine: linear warmup over warmup_frac of each task's steps, then cosine decay to
  /// min_lr_factor * lr at the task's end (restarting at every task of the continual scenarios).
  std::string lr_schedule = "auto";
  double warmup_frac = 0.05;
  double min_lr_factor = 0.0;
  std::string autocast = "auto";  ///< auto (bf16 on CUDA, off on CPU) | bf16 (CUDA only) | off
  int64_t batch_size = 128;
  int64_t eval_batch_size = 1000;

  // Run control and output.
  std::string out = "runs/resnet";
  std::string metrics_format = "jsonl";  ///< jsonl | csv
  int64_t log_every = 10;
  int64_t eval_every = 0;  ///< steps; 0 = at the end of every epoch (class-imbalanced) or task
  int64_t ckpt_every = 0;  ///< steps; 0 = at the end of every epoch
  bool resume = false;
  bool overwrite = false;    ///< replace a previous run's files in its folder (else refused)
  int64_t stop_at_step = 0;  ///< stop (with a checkpoint) after this step; 0 = never
  std::string device = "auto";
  int64_t threads = 0;
  trainer::DataParallelFlags data_parallel;  ///< under torchrun
  bool sync_bn = false;  ///< under torchrun: BatchNorm statistics over every rank's rows
  bool plots = true;
};

/// Registers every flag of `config` with `cli` (defaults are the current values).
void add_flags(trainer::Cli& cli, Config& config);

/// A copy of `config` for one run of `optimizer` with `seed`, every optional filled in, checked.
/// Throws a trainer::CliError (an std::invalid_argument) naming the flag at fault.
Config resolve(const Config& config, const std::string& optimizer, int64_t seed);

/// The flags that define a run's trajectory, with the values of a resolved config: stored in
/// checkpoints so that --resume refuses to continue a run under different settings.
trainer::RunSignature run_signature(const Config& resolved);

/// The learning-rate factor of the cosine schedule at `step` (0-based) of a task of `steps`
/// steps: (step + 1) / warmup over the first `warmup` steps, then
/// min + (1 - min) * (1 + cos(pi * (step - warmup) / (steps - warmup))) / 2.
double cosine_factor(int64_t step, int64_t steps, int64_t warmup, double min_factor);

/// The training-batch augmentation of a resolved config. None without --augment. Class
/// scenarios: random crop (--crop-pad, black borders) and horizontal flip. Domain-IL never
/// augments across domains: no flip (a mirrored 45-degree image is a -45-degree one), and with
/// --domains permute no crop either (a shift after the pixel shuffle breaks the permutation).
struct Augmentation {
  int64_t crop_pad = 0;
  bool flip = false;
};
Augmentation augmentation(const Config& resolved);

/// The folder of one run: <out>/<optimizer>-seed<seed>.
std::string run_dir(const Config& resolved);

}  // namespace fogo::resnet
