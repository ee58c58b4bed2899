#pragma once
// One training run of the ResNet-18 trainer and the comparison of several.
//
// A run (one optimizer, one seed) writes into <out>/<optimizer>-seed<seed>/:
//   train.jsonl|csv    every --log-every steps: step, task, epoch, loss, acc (%), grad_norm, lr,
//                      and FOGO's telemetry (fogo/<group>/<stat>)
//   eval.jsonl|csv     every evaluation: the scenario's accuracies (%), forgetting, AP/AF/BWT
//   result.jsonl       the run's summary (one record)
//   checkpoint.pt      model, optimizer, replay buffer, evaluation history, step; replaced
//                      atomically every --ckpt-every steps (or epoch) and at the end
// Every random choice derives from (seed, position in the run), so --resume continues a run
// bit for bit on the same device and thread count.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "common/report.h"
#include "config.h"
#include "continual.h"
#include "data.h"

namespace fogo::resnet {

struct RunResult {
  Config config;  ///< resolved
  /// Summary metrics (percent), in display order; NaN when the run stopped before they exist.
  std::vector<std::string> summary_names;
  std::vector<double> summary;
  /// Curves for plots: x (epochs, or tasks learned) and one value per curve name per point.
  std::string x_name;
  std::vector<std::string> curve_names;
  std::vector<double> x;
  std::vector<std::vector<double>> curve;
  AccuracyMatrix R;  ///< continual scenarios: R[i][j] in percent (NaN until measured)
  int64_t steps = 0, total_steps = 0;
  double seconds = 0;  ///< training wall time over all sessions of the run
  /// Wall time of the run over all its sessions (set-up, training, evaluations; a session that
  /// only reloads a finished run adds its own seconds), kept in the checkpoint.
  double wall_seconds = 0;
  /// Provenance of the session that trained the run last (kept in the checkpoint, so a run only
  /// reloaded keeps its own): its command line, machine_description(), the UTC time of its
  /// last checkpoint ("" for checkpoints written before 2026-11-27), the binary's build_commit()
  /// and cpu_isa() ("" for checkpoints written before issue 47).
  std::string command, machine, date, commit, isa;
  bool completed() const { return steps == total_steps; }
};

/// Trains (or, with --resume, continues or just reloads) the run `config` describes: a config
/// from resolve(). `data` is the whole dataset on the CPU; the run selects from it and moves what
/// it uses to its device.
RunResult train_run(const Config& config, const DataSplit& data, std::ostream& log);

/// The tests between every two optimizers of `results` on every summary metric, paired by seed
/// (every optimizer runs every seed): the scenario's primary tests as one family, every other
/// test as the secondary family, each Holm-adjusted on its own (summary.md's and sweep.md's
/// table of tests).
std::vector<trainer::TestRow> comparison_tests(const Config& config,
                                               const std::vector<RunResult>& results);

/// The primary tests of a scenario, named before any run (issue 34): FOGO - Muon, paired by seed,
/// on the paper's claim. class-imbalanced: rare_acc; domain-il: AF; class-il: AP and BWT. The
/// printed verdict states them first and then ranks the optimizers by the first one's metric.
std::vector<trainer::DeclaredTest> primary_tests(const std::string& scenario);
/// False for the metrics where lower is better (AF, AF_clip and the rare-forgetting measures).
bool higher_is_better(const std::string& metric);

/// The test images a run evaluates on (--test-per-class of every class): one fixed choice,
/// the same for every seed and optimizer, so that runs of a comparison share one test set.
constexpr uint64_t kTestSelectionSeed = 0x7E57;
constexpr uint64_t kValidationSeed = 0x7A11;
torch::Tensor test_selection(const Config& config, const torch::Tensor& labels,
                             int64_t num_classes);

/// Reads the dataset `config` names (resolved or not) and checks it.
DataSplit load_data(const Config& config);

/// Runs every optimizer x seed of `config`, then prints the mean ± sd table to `out` and writes
/// <out>/summary.md, <out>/runs.<fmt> and the plots (accuracy.png, forgetting.png).
/// Returns the results in run order. In stages:
///   plan_runs          every run's resolved config (a bad flag fails before any training)
///   load_data          the dataset, once for all runs
///   train_run          each run
///   report_comparison  the table, summary files and plots from the results
std::vector<RunResult> run_comparison(const Config& config, std::ostream& out);

/// One resolved config per optimizer x seed, optimizer-major. Throws a trainer::CliError naming
/// the flag at fault.
std::vector<Config> plan_runs(const Config& config);

/// Prints the mean ± sd table of `results` (of plan_runs(config)'s runs, in its order) to `out`
/// and writes <out>/summary.md, <out>/runs.<fmt> and, with --plots, the plots. `data_name`
/// names the dataset in the table's heading.
void report_comparison(const Config& config, const std::string& data_name,
                       const std::vector<RunResult>& results, std::ostream& out);

/// One grid point of --lr-sweep: its resolved config (eval-split val, the first seed, lr = factor
/// x the optimizer's default) and its score: the mean over the first --sweep-seeds seeds of the
/// run's first summary metric (class-imbalanced acc, continual AP) on the validation split, NaN
/// when a seed's run gave none (a failed run must not look good).
struct SweepPoint {
  Config config;
  double score = 0;
  std::vector<double> seed_scores;  ///< one per sweep seed, in --seeds order
};
struct SweepOutcome {
  std::string metric;                    ///< the score's name
  std::vector<SweepPoint> points;        ///< optimizer-major, each optimizer's in ascending lr
  std::map<std::string, double> chosen;  ///< optimizer -> its lr with the best score
  /// optimizer -> its best point is still at an edge of its grid after --sweep-extend points
  std::map<std::string, bool> at_edge;
  std::vector<RunResult> finals;  ///< the chosen lr on every seed, on the test set
};
/// The grid runs of `config` (checked: >= 3 seeds, factors > 0, --sweep-seeds and
/// --sweep-extend in range), optimizer-major, each optimizer's in ascending lr, scores unset.
std::vector<SweepPoint> plan_sweep(const Config& config);
/// The lr of `optimizer`'s best-scoring point (ties: the smaller lr).
double choose_lr(const std::vector<SweepPoint>& points, const std::string& optimizer);
/// The validation score of one run (a config of plan_sweep's points with the seed set).
using SweepScorer = std::function<double(const Config& run)>;
/// One optimizer's sweep: scores `grid` (its points of plan_sweep, ascending lr) on the first
/// --sweep-seeds seeds, then, while the best point is the lowest or highest lr and fewer than
/// --sweep-extend points were added, adds and scores the next lr beyond that edge (the ratio of
/// the two lrs at that edge; x2 for a one-point grid). Returns the scored points in ascending
/// lr; `at_edge` says whether the best one is still at an edge.
std::vector<SweepPoint> sweep_optimizer(const Config& config, std::vector<SweepPoint> grid,
                                        const SweepScorer& score, bool* at_edge = nullptr);
/// --lr-sweep: the grid on the validation split, then the chosen lrs on every seed on the test
/// set; writes the comparison's usual outputs (of the final runs) and sweep.md (the grid, the
/// chosen lrs and Welch's t-test between every two optimizers), sweep.png (score by lr).
SweepOutcome run_lr_sweep(const Config& config, std::ostream& out);
void report_sweep(const Config& config, const SweepOutcome& outcome, std::ostream& out);

}  // namespace fogo::resnet
