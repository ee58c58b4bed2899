#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/report.h"
#include "common/stats.h"
#include "run_parts.h"
#include "train.h"

namespace gpt2 {

namespace tr = fogo::trainer;

namespace {

void check_sweep(const SweepOptions& sweep) {
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
}

// The runs of one sweep: every run is `config` with one optimizer and every lr scaled.
class Sweep {
 public:
  Sweep(const TrainConfig& config, const SweepOptions& sweep, std::ostream& log)
      : config_(config), sweep_(sweep), log_(log), out_(config.out_dir) {}

  // The grid of `name`, extended beyond an edge while its best (lowest finite) loss sits there;
  // records whether the best is still at an edge.
  std::vector<SweepPoint> grid(const std::string& name, SweepOutcome& s) const {
    std::vector<double> factors = sweep_.factors;
    std::sort(factors.begin(), factors.end());
    factors.erase(std::unique(factors.begin(), factors.end()), factors.end());
    std::vector<SweepPoint> grid;
    for (const double f : factors) grid.push_back(score(name, f));
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
      if (!s.at_edge[name] || added >= sweep_.extend) break;
      if (best == 0) {
        const double step = last > 0 ? grid[1].factor / grid[0].factor : 2.0;
        grid.insert(grid.begin(), score(name, grid[0].factor / step));
      } else {
        grid.push_back(score(name, grid[last].factor * grid[last].factor / grid[last - 1].factor));
      }
    }
    return grid;
  }

  // The lowest-loss factor of `name` in s.points, re-run on every seed on the validation split.
  void rerun_chosen(const std::string& name, SweepOutcome& s) const {
    double best = std::numeric_limits<double>::infinity(), chosen = 0;
    for (const auto& p : s.points) {
      if (p.optimizer == name && std::isfinite(p.tune_loss) && p.tune_loss < best) {
        best = p.tune_loss;
        chosen = p.factor;
      }
    }
    TORCH_CHECK(chosen > 0, "--lr-sweep: no lr of ", name, " gave a finite loss");
    s.chosen[name] = chosen;
    for (const int64_t seed : sweep_.seeds) {
      TrainConfig c = scaled(name, chosen);
      c.data.tune_fraction = 0.0;  // the validation split, as a plain compare
      c.seed = seed;
      c.data_seed = seed;
      c.out_dir = (out_ / (name + "-seed" + std::to_string(seed))).string();
      RunResult r = train(c, log_);
      r.trained = GPT(nullptr);  // keep one model in memory at a time
      s.finals[name].push_back(r.val_loss.back().value);
    }
  }

 private:
  // A run of `name` with every lr of the config scaled by `factor`.
  TrainConfig scaled(const std::string& name, double factor) const {
    TrainConfig c = config_;
    c.optimizer.name = name;
    c.optimizer.lr = config_.optimizer.lr * factor;
    if (config_.optimizer.matrix_lr) c.optimizer.matrix_lr = *config_.optimizer.matrix_lr * factor;
    return c;
  }

  // One grid point: its tuning loss on config's seed, or the mean over the sweep seeds.
  SweepPoint score(const std::string& name, double f) const {
    SweepPoint p{name, f, scaled(name, f).optimizer.lr, 0, {}};
    for (int64_t k = 0; k < sweep_.sweep_seeds; ++k) {
      TrainConfig c = scaled(name, f);
      c.data.tune_fraction = sweep_.tune_fraction;  // never the validation split
      std::string folder = name + "-x" + tr::flag_text(f);
      if (sweep_.sweep_seeds > 1) {
        c.seed = c.data_seed = sweep_.seeds[k];
        folder += "-seed" + std::to_string(sweep_.seeds[k]);
      }
      c.out_dir = (out_ / "sweep" / folder).string();
      p.seed_losses.push_back(train(c, log_).val_loss.back().value);
    }
    p.tune_loss = tr::mean_sd(p.seed_losses).mean;
    return p;
  }

  const TrainConfig& config_;
  const SweepOptions& sweep_;
  std::ostream& log_;
  const std::filesystem::path out_;
};

// The tables of a finished sweep: every grid point, and the chosen factors' finals.
std::pair<tr::Table, tr::Table> sweep_tables(const SweepOptions& sweep, SweepOutcome& s) {
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
  return {std::move(grid), std::move(finals)};
}

// sweep.md's opening paragraph: what was swept, on which seeds, scored how.
std::string sweep_method(const TrainConfig& config, const SweepOptions& sweep) {
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
     << " seeds (seed = data seed), final loss on the validation split.\n\n";
  return md.str();
}

// The tuning loss of every grid point against log10(factor), one series per optimizer.
tr::Panel sweep_panel(const SweepOptions& sweep, const SweepOutcome& s) {
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
  return panel;
}

// The tables, the tests between the optimizers and the verdict: to sweep.md and `log` on rank
// 0, with sweep.png.
void report_sweep(const TrainConfig& config, const SweepOptions& sweep, SweepOutcome& s,
                  std::ostream& log) {
  const auto [grid, finals] = sweep_tables(sweep, s);
  // Every pair of optimizers on the final validation loss, paired by seed (= data seed): FOGO -
  // Muon is the primary test, named before the runs (issue 34); the others are secondary.
  tr::MetricGroups loss{"val_loss", {}};
  for (const auto& name : sweep.optimizers)
    loss.groups.push_back({name, s.finals[name], sweep.seeds});
  const std::vector<tr::TestRow> tests = tr::test_families({loss}, {{"val_loss", "fogo", "muon"}});
  const tr::Table welch = tr::test_table(tests, 4);
  const std::string verdict = tr::primary_verdict(
      tests, [](const std::string&) { return "the final validation loss"; }, 4);
  if (!tr::DataParallel::process().main()) return;  // rank 0 writes the report
  const std::filesystem::path out(config.out_dir);
  std::filesystem::create_directories(out);
  {
    std::ofstream f(out / "sweep.md");
    TORCH_CHECK(f << sweep_method(config, sweep) << grid.to_markdown() << "\n"
                  << finals.to_markdown() << "\n"
                  << tr::test_table_note(tests) << "\n\n"
                  << welch.to_markdown() << (verdict.empty() ? "" : "\n" + verdict + "\n"),
                "lr sweep: cannot write ", (out / "sweep.md").string());
  }
  log << "\n"
      << grid.to_text() << "\n"
      << finals.to_text() << "\n"
      << welch.to_text() << (verdict.empty() ? "" : "\n" + verdict + "\n");
  if (sweep.plots) tr::plot_png((out / "sweep.png").string(), {sweep_panel(sweep, s)}, 1, log);
}

}  // namespace

SweepOutcome lr_sweep(const TrainConfig& config, const SweepOptions& sweep, std::ostream& log) {
  check_sweep(sweep);
  const Sweep runs(config, sweep, log);
  SweepOutcome s;
  for (const auto& name : sweep.optimizers) {
    const std::vector<SweepPoint> grid = runs.grid(name, s);
    s.points.insert(s.points.end(), grid.begin(), grid.end());
  }
  for (const auto& name : sweep.optimizers) runs.rerun_chosen(name, s);
  report_sweep(config, sweep, s, log);
  return s;
}

}  // namespace gpt2
