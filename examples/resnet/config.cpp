#include "config.h"

#include <fogo/enum_names.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <stdexcept>

#include "common/cli.h"
#include "common/fogo_flags.h"
#include "common/optimizers.h"
#include "optimizers.h"

namespace fogo::resnet {
namespace {

template <class T>
std::string text(const T& v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

template <class T>
std::string text(const std::vector<T>& v) {
  std::string out;
  for (size_t k = 0; k < v.size(); ++k) out += (k ? "," : "") + text(v[k]);
  return out;
}

// The --fogo assignments as one signature value ("-" for none).
std::string fogo_text(const std::vector<std::string>& assignments) {
  std::string out;
  for (const auto& a : assignments) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out.empty() ? "-" : out;
}

}  // namespace

namespace {

void add_scenario_flags(trainer::Cli& cli, Config& c) {
  cli.section("Scenario and data");
  cli.choice("scenario", &c.scenario, {"class-imbalanced", "class-il", "domain-il"},
             "experiment protocol");
  cli.choice("dataset", &c.dataset, {"fashion-mnist", "cifar10"}, "image dataset");
  cli.flag("data-dir", &c.data_dir,
           "dataset folder (default: /usr/share/datasets/fashion-mnist; required for cifar10)");
  cli.flag("train-per-class", &c.train_per_class,
           "use at most this many training images per class, before the scenario's own "
           "selection (0 = all)");
  cli.flag("test-per-class", &c.test_per_class, "test images per class (0 = all)");
  cli.flag("rare-classes", &c.rare_classes, "class-imbalanced: the rare classes");
  cli.flag("rare-fraction", &c.rare_fraction,
           "class-imbalanced: fraction of each rare class's training images kept");
  cli.flag(
      "task-order", &c.task_order,
      "class-il: paper, order1, order2 (the paper's extra orders) or e.g. 0,1/2,3/4,5/6,7/8,9");
  cli.choice("domains", &c.domains, {"rotate", "permute"},
             "domain-il: domain k rotates images by k * rotation-step degrees, or shuffles pixels "
             "by permutation k (domain 0 is the original data)");
  cli.flag("num-domains", &c.num_domains, "domain-il: number of domains");
  cli.flag("rotation-step", &c.rotation_step, "domain-il: degrees between rotation domains");
  cli.flag("domain-order", &c.domain_order, "domain-il: order the domains are trained in");
  cli.choice("replay", &c.replay, {"none", "er", "derpp"},
             "class-il/domain-il: replay buffer method (ER, or DER++ as in the paper)");
  cli.flag("buffer-size", &c.buffer_size, "replay buffer capacity (samples)");
  cli.flag("replay-batch", &c.replay_batch,
           "replay samples per step (per term for DER++; per rank under torchrun)");
  cli.flag("replay-alpha", &c.replay_alpha,
           "weight of the replay term: ER cross-entropy (1.0), DER++ logit MSE (0.1)");
  cli.flag("der-beta", &c.der_beta, "DER++: weight of the replayed-label cross-entropy");
}

// The evaluation split, the lr sweep and augmentation (still the "Scenario and data" section).
void add_evaluation_flags(trainer::Cli& cli, Config& c) {
  cli.choice("eval-split", &c.eval_split, {"test", "val"},
             "evaluate on the test set, or on a validation split held out from the training "
             "images (--val-fraction per class, the same for every seed)");
  cli.flag("val-fraction", &c.val_fraction,
           "fraction of each class's training images held out "
           "for --eval-split val and --lr-sweep");
  cli.flag(
      "lr-sweep", &c.lr_sweep,
      "learning-rate sweep: factors of each optimizer's default --lr (e.g. 0.25,0.5,1,2,4); "
      "each grid point runs on the first --sweep-seeds seeds and is scored on the validation "
      "split, the best lr is re-run on every seed (>= 3) on the test set; sweep.md, sweep.png");
  cli.flag("sweep-seeds", &c.sweep_seeds,
           "--lr-sweep: score each grid point by its mean validation score over the first N "
           "seeds of --seeds (1..number of seeds)");
  cli.flag("sweep-extend", &c.sweep_extend,
           "--lr-sweep: while an optimizer's best point is at an edge of its grid, add a point "
           "beyond it (the grid's step at that edge), at most this many per optimizer (0 = never)");
  cli.flag("augment", &c.augment, "random crop and horizontal flip of training batches");
  cli.flag("crop-pad", &c.crop_pad, "padding of the random crop (cifar10 4, fashion-mnist 2)");
}

void add_model_flags(trainer::Cli& cli, Config& c) {
  cli.section("Model");
  cli.flag("width", &c.width,
           "channels of the first stage (64 = the standard ResNet-18; 8 or 16 for a CPU)");
  cli.flag("head-fc", &c.head_fc,
           "width of an extra ReLU FC layer before the classifier (class-il: 8 * width, the "
           "paper's head; otherwise 0 = none)");
}

void add_optimizer_flags(trainer::Cli& cli, Config& c) {
  cli.section("Optimization");
  cli.flag("optimizers", &c.optimizers,
           "optimizers to run, each with every seed: adam, adamw, muon, fogo (muon and fogo are "
           "hybrids: AdamW on the 1-D parameters)");
  cli.flag("seeds", &c.seeds, "seeds to run (model init, data selection and order, augmentation)");
  cli.flag("lr", &c.lr,
           "learning rate (class-imbalanced/domain-il: adam, adamw, fogo 1e-3, muon 1e-2; "
           "class-il: 2e-3)");
  cli.flag("optimizer-lr", &c.optimizer_lr,
           "per-optimizer learning rates, e.g. fogo=1e-2,muon=1e-2,adam=3e-3 (optimizers not named "
           "keep the default of --lr; not together with --lr)");
  cli.flag("adamw-lr", &c.adamw_lr,
           "muon/fogo: lr of the AdamW side (1-D parameters) (class-il fogo 5e-4, else 1e-3; "
           "class-il muon 2e-3)");
  cli.flag("head-lr", &c.head_lr, "fogo: lr of the head codebook groups (class-il 5e-4, else lr)");
  trainer::add_muon_adjust_flag(cli, &c.muon_adjust);
  cli.flag("muon-normuon", &c.muon_normuon,
           "muon: NorMuon's per-row second-moment normalization of the update (FOGO's: --fogo "
           "normuon=true)");
  cli.choice("classifier", &c.classifier, {"own", "adamw"},
             "the classifier fc: own (trained by each optimizer like the rest) or adamw (AdamW at "
             "--classifier-lr for every optimizer, adam included)");
  cli.flag("classifier-lr", &c.classifier_lr,
           "--classifier adamw: lr of the classifier's AdamW (default: --adamw-lr's value)");
  cli.flag("weight-decay", &c.weight_decay, "weight decay (adamw 1e-2, others 0)");
  cli.flag("grad-clip", &c.grad_clip,
           "clip the global gradient norm to this (class-il 2.0, else off: 0)");
  cli.renamed("clip", "grad-clip");
  trainer::add_ns_dtype_flag(cli, &c.ns_dtype);
  trainer::add_fogo_flags(cli, &c.fogo_options, &c.ablation);
}

// The schedule and batches (still the "Optimization" section).
void add_schedule_flags(trainer::Cli& cli, Config& c) {
  cli.flag("epochs", &c.epochs,
           "epochs (per task in class-il/domain-il; class-imbalanced 50, class-il 20, "
           "domain-il 15)");
  cli.choice("lr-schedule", &c.lr_schedule, {"auto", "cosine", "constant"},
             "learning-rate schedule per task: cosine = linear warmup, then cosine decay to "
             "--min-lr-factor * lr; auto = cosine at --width >= 64, constant below");
  cli.flag("warmup-frac", &c.warmup_frac, "cosine: fraction of each task's steps spent warming up");
  cli.flag("min-lr-factor", &c.min_lr_factor, "cosine: final lr as a fraction of the peak");
  cli.choice("autocast", &c.autocast, {"auto", "bf16", "off"},
             "bf16 autocast of forward passes, CUDA only (auto: on CUDA, off on the CPU)");
  cli.flag("batch-size", &c.batch_size, "training batch size (per rank under torchrun)");
  cli.flag("eval-batch-size", &c.eval_batch_size, "evaluation batch size");
}

void add_run_flags(trainer::Cli& cli, Config& c) {
  cli.section("Run control and output");
  cli.flag("out", &c.out, "output folder (one sub-folder per run, summary and plots at the top)");
  cli.choice("metrics-format", &c.metrics_format, {"jsonl", "csv"}, "format of the metric files");
  cli.flag("log-every", &c.log_every, "write a training record every N steps");
  cli.flag("eval-every", &c.eval_every,
           "also evaluate every N steps (0: only at the end of each epoch / task)");
  cli.flag("ckpt-every", &c.ckpt_every,
           "checkpoint every N steps (0: at the end of every epoch); always at the end");
  cli.flag("resume", &c.resume, "continue each run from its checkpoint when there is one");
  cli.flag("overwrite", &c.overwrite,
           "replace runs already in --out (without it, or --resume, a run folder holding a run's "
           "files is refused)");
  cli.flag("stop-at-step", &c.stop_at_step,
           "stop each run after this step, with a checkpoint (0 = run to the end)");
  cli.renamed("stop-after", "stop-at-step");
  cli.flag("device", &c.device, "cpu, cuda, cuda:N or auto");
  cli.flag("threads", &c.threads,
           "CPU threads for torch (0 = torch's default; 1 is much faster on a machine whose "
           "cores are busy with other work)");
  cli.flag("plots", &c.plots, "write PNG plots with gnuplot");
  trainer::add_data_parallel_flags(cli, c.data_parallel);
  cli.flag("sync-bn", &c.sync_bn,
           "BatchNorm normalizes over the rows of every rank (SyncBatchNorm): W ranks of "
           "--batch-size b train as one process with W*b does; off: each rank's own b rows, as "
           "DistributedDataParallel (no effect in one process)");
}

}  // namespace

void add_flags(trainer::Cli& cli, Config& c) {
  add_scenario_flags(cli, c);
  add_evaluation_flags(cli, c);
  add_model_flags(cli, c);
  add_optimizer_flags(cli, c);
  add_schedule_flags(cli, c);
  add_run_flags(cli, c);
}

double cosine_factor(int64_t step, int64_t steps, int64_t warmup, double min_factor) {
  if (step < warmup) return static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, steps - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

Augmentation augmentation(const Config& c) {
  if (!c.augment) return {};
  if (c.scenario != "domain-il") return {c.crop_pad.value_or(0), true};
  return {c.domains == "permute" ? 0 : c.crop_pad.value_or(0), false};
}

namespace {

void check_optimizer_name(const std::string& optimizer) {
  if (optimizer != "adam" && optimizer != "adamw" && optimizer != "muon" && optimizer != "fogo") {
    throw trainer::Cli::error("optimizers",
                              "unknown optimizer '" + optimizer + "' (adam, adamw, muon, fogo)");
  }
}

// The defaults that depend on the scenario and dataset.
void fill_scenario_defaults(Config& c) {
  const bool class_il = c.scenario == "class-il", domain_il = c.scenario == "domain-il";
  if (c.data_dir.empty()) {
    if (c.dataset == "cifar10") {
      throw trainer::Cli::error(
          "data-dir", "cifar10 needs the folder holding data_batch_1.bin .. test_batch.bin");
    }
    c.data_dir = "/usr/share/datasets/fashion-mnist";
  }
  if (!c.crop_pad) c.crop_pad = c.dataset == "cifar10" ? 4 : 2;
  if (!c.head_fc) c.head_fc = class_il ? 8 * c.width : 0;
  if (!c.epochs) c.epochs = class_il ? 20 : domain_il ? 15 : 50;
  if (!c.grad_clip) c.grad_clip = class_il ? 2.0 : 0.0;
}

// --optimizer-lr: every entry checked, the one naming `optimizer` moved into --lr.
void apply_optimizer_lr(Config& c, const std::string& optimizer) {
  for (const auto& entry : c.optimizer_lr) {
    const auto eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    if (eq == std::string::npos ||
        (name != "adam" && name != "adamw" && name != "muon" && name != "fogo")) {
      throw trainer::Cli::error("optimizer-lr",
                                "expected optimizer=lr with optimizer adam, "
                                "adamw, muon or fogo, got '" +
                                    entry + "'");
    }
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(entry.substr(eq + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != entry.size() - eq - 1) {
      throw trainer::Cli::error("optimizer-lr",
                                name + ": expected a number, got '" + entry.substr(eq + 1) + "'");
    }
    if (name != optimizer) continue;
    if (c.lr) {
      throw trainer::Cli::error("optimizer-lr", "gives " + name + " an lr and so does --lr (" +
                                                    text(*c.lr) + "): give one of them");
    }
    c.lr = v;
  }
  c.optimizer_lr.clear();  // applied: a resolved config carries its lr in --lr alone
}

// The learning rates' defaults and the classifier's, weight decay, schedule and replay weight.
void fill_optimizer_defaults(Config& c, const std::string& optimizer) {
  const bool class_il = c.scenario == "class-il";
  if (!c.lr) c.lr = class_il ? 2e-3 : optimizer == "muon" ? 1e-2 : 1e-3;
  if (!c.adamw_lr) c.adamw_lr = class_il ? (optimizer == "fogo" ? 5e-4 : 2e-3) : 1e-3;
  if (!c.head_lr) c.head_lr = class_il ? 5e-4 : *c.lr;
  if (c.classifier != "own" && c.classifier != "adamw") {
    throw trainer::Cli::error("classifier", "expected own or adamw, got '" + c.classifier + "'");
  }
  if (c.classifier_lr && c.classifier != "adamw") {
    throw trainer::Cli::error("classifier-lr", "applies with --classifier adamw only");
  }
  if (c.classifier == "adamw" && !c.classifier_lr) c.classifier_lr = *c.adamw_lr;
  trainer::parse_muon_adjust(c.muon_adjust);  // a CliError naming --muon-adjust
  if (!c.weight_decay) c.weight_decay = optimizer == "adamw" ? 1e-2 : 0.0;
  if (c.lr_schedule == "auto") c.lr_schedule = c.width >= 64 ? "cosine" : "constant";
  if (!c.replay_alpha) c.replay_alpha = c.replay == "er" ? 1.0 : 0.1;
}

void check_data(Config& c) {
  if (c.train_per_class < 0) throw trainer::Cli::error("train-per-class", "must be >= 0");
  if (c.eval_split != "test" && c.eval_split != "val") {
    throw trainer::Cli::error("eval-split", "expected test or val, got '" + c.eval_split + "'");
  }
  if (!(c.val_fraction > 0 && c.val_fraction <= 0.5)) {
    throw trainer::Cli::error("val-fraction", "must be in (0, 0.5], got " + text(c.val_fraction));
  }
  if (c.test_per_class < 0) throw trainer::Cli::error("test-per-class", "must be >= 0");
  if (!(c.rare_fraction > 0 && c.rare_fraction <= 1)) {
    throw trainer::Cli::error("rare-fraction", "must be in (0, 1], got " + text(c.rare_fraction));
  }
  for (const int64_t r : c.rare_classes) {
    if (r < 0 || r >= 10)
      throw trainer::Cli::error("rare-classes", "class " + text(r) + " is not in [0, 10)");
    if (std::count(c.rare_classes.begin(), c.rare_classes.end(), r) > 1) {
      throw trainer::Cli::error("rare-classes", "class " + text(r) + " is listed twice");
    }
  }
  if (c.num_domains < 1 || c.num_domains > 64)
    throw trainer::Cli::error("num-domains", "must be in 1..64");
  if (c.domain_order.empty()) {
    for (int64_t d = 0; d < c.num_domains; ++d) c.domain_order.push_back(d);
  }
  {
    auto sorted = c.domain_order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 0; k < sorted.size(); ++k) {
      if (sorted[k] != static_cast<int64_t>(k) ||
          sorted.size() != static_cast<size_t>(c.num_domains)) {
        throw trainer::Cli::error("domain-order", "must be a permutation of 0.." +
                                                      text(c.num_domains - 1) + ", got " +
                                                      text(c.domain_order));
      }
    }
  }
}

void check_replay_and_model(const Config& c) {
  const bool continual = c.scenario == "class-il" || c.scenario == "domain-il";
  if (c.replay != "none" && !continual) {
    throw trainer::Cli::error("replay",
                              "replay applies to the continual scenarios (class-il, domain-il)");
  }
  if (c.buffer_size < 1) throw trainer::Cli::error("buffer-size", "must be >= 1");
  if (c.replay_batch < 1) throw trainer::Cli::error("replay-batch", "must be >= 1");
  if (*c.replay_alpha < 0) throw trainer::Cli::error("replay-alpha", "must be >= 0");
  if (c.der_beta < 0) throw trainer::Cli::error("der-beta", "must be >= 0");
  if (*c.crop_pad < 0 || *c.crop_pad > 16)
    throw trainer::Cli::error("crop-pad", "must be in 0..16");
  if (c.width < 1 || c.width > 1024) throw trainer::Cli::error("width", "must be in 1..1024");
  if (*c.head_fc < 0) throw trainer::Cli::error("head-fc", "must be >= 0");
}

void check_optimization(const Config& c, const std::string& optimizer) {
  for (const auto& [flag, v] : {std::pair<const char*, double>{"lr", *c.lr},
                                {"adamw-lr", *c.adamw_lr},
                                {"head-lr", *c.head_lr},
                                {"classifier-lr", c.classifier_lr.value_or(1e-3)}}) {
    if (!(v > 0 && v < 10)) throw trainer::Cli::error(flag, "must be in (0, 10), got " + text(v));
  }
  if (*c.weight_decay < 0 || *c.weight_decay >= 1)
    throw trainer::Cli::error("weight-decay", "must be in [0, 1)");
  if (*c.grad_clip < 0) throw trainer::Cli::error("grad-clip", "must be >= 0 (0 = off)");
  trainer::parse_ns_dtype(c.ns_dtype);
  if (c.lr_schedule != "cosine" && c.lr_schedule != "constant") {
    throw trainer::Cli::error("lr-schedule",
                              "expected auto, cosine or constant, got '" + c.lr_schedule + "'");
  }
  if (!(c.warmup_frac >= 0 && c.warmup_frac < 1))
    throw trainer::Cli::error("warmup-frac", "must be in [0, 1), got " + text(c.warmup_frac));
  if (!(c.min_lr_factor >= 0 && c.min_lr_factor <= 1))
    throw trainer::Cli::error("min-lr-factor", "must be in [0, 1], got " + text(c.min_lr_factor));
  if (c.autocast != "auto" && c.autocast != "bf16" && c.autocast != "off") {
    throw trainer::Cli::error("autocast", "expected auto, bf16 or off, got '" + c.autocast + "'");
  }
  if (optimizer == "fogo") {
    // Every stage's options as the run will build them: a bad --fogo or --ablation fails here,
    // before any training.
    for (const char* stage : {"stem", "layer1", "layer2", "layer3", "layer4", "head_fc", "fc"}) {
      fogo_group_options(c, stage);
    }
  } else {
    fogo::FOGOOptions unused;  // the flags are checked even where they do not apply
    trainer::apply_fogo_flags(unused, c.ablation, c.fogo_options);
  }
}

void check_run_control(const Config& c) {
  if (*c.epochs < 1) throw trainer::Cli::error("epochs", "must be >= 1");
  if (c.batch_size < 2)
    throw trainer::Cli::error("batch-size", "must be >= 2 (BatchNorm needs 2 samples)");
  if (c.eval_batch_size < 1) throw trainer::Cli::error("eval-batch-size", "must be >= 1");
  if (c.log_every < 1) throw trainer::Cli::error("log-every", "must be >= 1");
  if (c.eval_every < 0) throw trainer::Cli::error("eval-every", "must be >= 0");
  if (c.ckpt_every < 0) throw trainer::Cli::error("ckpt-every", "must be >= 0");
  if (c.stop_at_step < 0) throw trainer::Cli::error("stop-at-step", "must be >= 0");
  if (c.threads < 0) throw trainer::Cli::error("threads", "must be >= 0");
  trainer::validate_data_parallel_flags(c.data_parallel);
  if (c.out.empty()) throw trainer::Cli::error("out", "must not be empty");
}

}  // namespace

Config resolve(const Config& config, const std::string& optimizer, int64_t seed) {
  Config c = config;
  c.optimizer = optimizer;
  c.seed = seed;
  check_optimizer_name(optimizer);
  fill_scenario_defaults(c);
  apply_optimizer_lr(c, optimizer);
  fill_optimizer_defaults(c, optimizer);
  check_data(c);
  check_replay_and_model(c);
  check_optimization(c, optimizer);
  check_run_control(c);
  return c;
}

trainer::RunSignature run_signature(const Config& c) {
  trainer::RunSignature s("resnet_train");
  s.add("scenario", c.scenario)
      .add("dataset", c.dataset)
      .add("train-per-class", c.train_per_class)
      .add("test-per-class", c.test_per_class)
      .add("eval-split", c.eval_split)
      .add("val-fraction", c.eval_split == "val" ? c.val_fraction : 0.0)
      .add("rare-classes", c.rare_classes)
      .add("rare-fraction", c.rare_fraction)
      .add("task-order", c.task_order)
      .add("domains", c.domains)
      .add("num-domains", c.num_domains)
      .add("rotation-step", c.rotation_step)
      .add("domain-order", c.domain_order)
      .add("replay", c.replay)
      .add("buffer-size", c.buffer_size)
      .add("replay-batch", c.replay_batch)
      .add("replay-alpha", *c.replay_alpha)
      .add("der-beta", c.der_beta)
      .add("augment", c.augment)
      .add("crop-pad", *c.crop_pad)
      .add("width", c.width)
      .add("head-fc", *c.head_fc)
      .add("optimizer", c.optimizer)
      .add("seed", c.seed)
      .add("lr", *c.lr)
      .add("adamw-lr", *c.adamw_lr)
      .add("head-lr", *c.head_lr)
      .add("weight-decay", *c.weight_decay)
      .add("grad-clip", *c.grad_clip)
      .add("ns-dtype", c.ns_dtype)
      .add("fogo", fogo_text(c.fogo_options))
      .add("ablation", c.ablation)
      .add("epochs", *c.epochs)
      .add("lr-schedule", c.lr_schedule)
      .add("warmup-frac", c.lr_schedule == "cosine" ? c.warmup_frac : 0.0)
      .add("min-lr-factor", c.lr_schedule == "cosine" ? c.min_lr_factor : 1.0)
      .add("autocast", c.autocast)
      .add("batch-size", c.batch_size)
      .add("eval-every", c.eval_every);
  // Recorded when on (not the default): older checkpoints stay resumable.
  if (c.sync_bn) s.add("sync-bn", true);
  if (c.optimizer == "muon") {
    const std::string adjust = trainer::muon_adjust_signature(c.muon_adjust);
    if (adjust != fogo::enum_name(fogo::MuonAdjustLR::Original)) s.add("muon-adjust", adjust);
  }
  if (c.optimizer == "muon" && c.muon_normuon) s.add("muon-normuon", true);
  if (c.classifier != "own") {
    s.add("classifier", c.classifier).add("classifier-lr", *c.classifier_lr);
  }
  return s;
}

std::string run_dir(const Config& c) { return c.out + "/" + c.optimizer + "-seed" + text(c.seed); }

}  // namespace fogo::resnet
