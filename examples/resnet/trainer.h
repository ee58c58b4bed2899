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
#include <iosfwd>
#include <string>
#include <vector>

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
  bool completed() const { return steps == total_steps; }
};

/// Trains (or, with --resume, continues or just reloads) the run `config` describes: a config
/// from resolve(). `data` is the whole dataset on the CPU; the run selects from it and moves what
/// it uses to its device.
RunResult train_run(const Config& config, const DataSplit& data, std::ostream& log);

/// The test images a run evaluates on (--test-per-class of every class): one fixed choice,
/// the same for every seed and optimizer, so that runs of a comparison share one test set.
constexpr uint64_t kTestSelectionSeed = 0x7E57;
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

}  // namespace fogo::resnet
