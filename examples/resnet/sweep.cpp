// The learning-rate sweep of resnet_train --lr-sweep: a grid per optimizer scored on a
// validation split carved from the training data, then the chosen lr on every seed on the test
// set, with Welch's t-test between optimizers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/metrics.h"
#include "common/report.h"
#include "trainer.h"

namespace fogo::resnet {
namespace {

std::string lr_text(double lr) { return trainer::flag_text(lr); }

std::string number(double v, int precision) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

}  // namespace

namespace {

// A grid point of `optimizer` at `lr`: validation split, the first seed, its own output folder.
SweepPoint grid_point(const Config& config, const std::string& optimizer, double lr) {
  Config c = config;
  c.lr = lr;
  c.optimizer_lr.clear();  // the grid's lr, not --optimizer-lr's
  c.eval_split = "val";
  c.out = config.out + "/sweep/lr" + lr_text(lr);
  return {resolve(c, optimizer, config.seeds.front()), 0.0, {}};
}

// The mean of the point's score over the sweep seeds; NaN if any seed's is (a failed run).
void score_point(SweepPoint& p, const Config& config, const SweepScorer& score) {
  p.seed_scores.clear();
  for (int64_t k = 0; k < config.sweep_seeds; ++k) {
    p.seed_scores.push_back(score(resolve(p.config, p.config.optimizer, config.seeds[k])));
  }
  p.score = trainer::mean_sd(p.seed_scores).mean;
}

// The index of the best point (choose_lr's rule: the highest finite score, ties to the smaller
// lr, which comes first); -1 if no score is finite.
int64_t best_index(const std::vector<SweepPoint>& points) {
  int64_t best = -1;
  for (size_t k = 0; k < points.size(); ++k) {
    if (!std::isfinite(points[k].score)) continue;
    if (best < 0 || points[k].score > points[best].score) best = static_cast<int64_t>(k);
  }
  return best;
}

}  // namespace

std::vector<SweepPoint> plan_sweep(const Config& config) {
  if (config.optimizers.empty()) throw trainer::Cli::error("optimizers", "none given");
  if (config.seeds.size() < 3) {
    throw trainer::Cli::error("seeds", "--lr-sweep re-runs the chosen lr on >= 3 seeds; got " +
                                           std::to_string(config.seeds.size()));
  }
  if (config.sweep_seeds < 1 || config.sweep_seeds > static_cast<int64_t>(config.seeds.size())) {
    throw trainer::Cli::error("sweep-seeds",
                              "must be in 1.." + std::to_string(config.seeds.size()) +
                                  " (the seeds given), got " + std::to_string(config.sweep_seeds));
  }
  if (config.sweep_extend < 0 || config.sweep_extend > 20) {
    throw trainer::Cli::error("sweep-extend",
                              "must be in 0..20, got " + std::to_string(config.sweep_extend));
  }
  std::vector<double> factors = config.lr_sweep;
  for (const double f : factors) {
    if (!(f > 0 && std::isfinite(f))) {
      throw trainer::Cli::error("lr-sweep", "factors must be > 0, got " + trainer::flag_text(f));
    }
  }
  // Ascending and distinct: an edge is then the first or last point.
  std::sort(factors.begin(), factors.end());
  factors.erase(std::unique(factors.begin(), factors.end()), factors.end());
  std::vector<SweepPoint> points;
  for (const auto& opt : config.optimizers) {
    const double base = *resolve(config, opt, config.seeds.front()).lr;
    for (const double f : factors) points.push_back(grid_point(config, opt, base * f));
  }
  return points;
}

double choose_lr(const std::vector<SweepPoint>& points, const std::string& optimizer) {
  double best_lr = std::numeric_limits<double>::quiet_NaN();
  double best = -std::numeric_limits<double>::infinity();
  for (const auto& p : points) {
    if (p.config.optimizer != optimizer || !std::isfinite(p.score)) continue;
    // Ties go to the smaller lr (extended points may come in any order, so compare explicitly).
    if (p.score > best || (p.score == best && *p.config.lr < best_lr)) {
      best = p.score;
      best_lr = *p.config.lr;
    }
  }
  if (!std::isfinite(best_lr)) {
    throw std::runtime_error("--lr-sweep: no lr of " + optimizer + " gave a finite score");
  }
  return best_lr;
}

std::vector<SweepPoint> sweep_optimizer(const Config& config, std::vector<SweepPoint> grid,
                                        const SweepScorer& score, bool* at_edge) {
  if (grid.empty()) throw std::invalid_argument("sweep_optimizer: an empty grid");
  for (auto& p : grid) score_point(p, config, score);
  const std::string opt = grid.front().config.optimizer;  // a copy: inserting moves the grid
  const auto lr_at = [&](size_t k) { return *grid[k].config.lr; };
  bool edge = false;
  for (int64_t added = 0;; ++added) {
    const int64_t best = best_index(grid);
    const int64_t last = static_cast<int64_t>(grid.size()) - 1;
    edge = best >= 0 && (best == 0 || best == last);
    if (!edge || added >= config.sweep_extend) break;
    // One step beyond the edge the best point is at, as wide as the grid's step there. A
    // one-point grid is at both edges: the lower one is tried first.
    if (best == 0) {
      const double step = last > 0 ? lr_at(1) / lr_at(0) : 2.0;
      grid.insert(grid.begin(), grid_point(config, opt, lr_at(0) / step));
      score_point(grid.front(), config, score);
    } else {
      const double step = lr_at(last) / lr_at(last - 1);
      grid.push_back(grid_point(config, opt, lr_at(last) * step));
      score_point(grid.back(), config, score);
    }
  }
  if (at_edge) *at_edge = edge;
  return grid;
}

SweepOutcome run_lr_sweep(const Config& config, std::ostream& out) {
  SweepOutcome s;
  const std::vector<SweepPoint> grid = plan_sweep(config);  // a bad flag fails before training
  const DataSplit data = load_data(grid.front().config);
  out << "lr sweep: " << grid.size() << " grid points (more while a best lr is at an edge, up to "
      << config.sweep_extend << " per optimizer), each on " << config.sweep_seeds
      << " seed(s), on a validation split (" << config.val_fraction
      << " of the training images per class)\n";
  const SweepScorer score = [&](const Config& run) {
    const RunResult r = train_run(run, data, out);
    s.metric = r.summary_names.front();
    return r.summary.empty() ? std::numeric_limits<double>::quiet_NaN() : r.summary.front();
  };
  std::vector<Config> finals;
  for (const auto& opt : config.optimizers) {
    std::vector<SweepPoint> mine;
    for (const auto& p : grid) {
      if (p.config.optimizer == opt) mine.push_back(p);
    }
    bool edge = false;
    mine = sweep_optimizer(config, std::move(mine), score, &edge);
    s.points.insert(s.points.end(), mine.begin(), mine.end());
    s.at_edge[opt] = edge;
    s.chosen[opt] = choose_lr(s.points, opt);
    Config c = config;
    c.lr = s.chosen[opt];
    c.optimizer_lr.clear();
    c.eval_split = "test";
    for (const int64_t seed : config.seeds) finals.push_back(resolve(c, opt, seed));
  }
  for (const auto& c : finals) s.finals.push_back(train_run(c, data, out));
  // Data-parallel, every rank has the same results (rank 0's evaluations); rank 0 writes.
  if (trainer::DataParallel::process().main()) {
    report_comparison(config, data.name, s.finals, out);
    report_sweep(config, s, out);
  }
  return s;
}

void report_sweep(const Config& config, const SweepOutcome& s, std::ostream& out) {
  // The grid: validation score per lr (mean ± sd over the sweep seeds, and each seed's), the
  // chosen lr, marked when it is still at an edge of its (extended) grid.
  trainer::Table grid({"optimizer", "lr", "validation " + s.metric, "per seed", "chosen"});
  for (const auto& p : s.points) {
    const std::string& opt = p.config.optimizer;
    const bool chosen = *p.config.lr == s.chosen.at(opt);
    std::string seeds;
    for (const double v : p.seed_scores) seeds += (seeds.empty() ? "" : " / ") + number(v, 2);
    const auto edge = s.at_edge.find(opt);
    const bool at_edge = edge != s.at_edge.end() && edge->second;
    grid.add_row({opt, lr_text(*p.config.lr),
                  trainer::format_mean_sd(trainer::mean_sd(p.seed_scores), 2), seeds,
                  chosen ? (at_edge ? "yes (grid edge)" : "yes") : ""});
  }
  const std::vector<trainer::TestRow> tests = comparison_tests(config, s.finals);
  std::ostringstream md;
  md << "Learning-rate sweep: factors";
  for (const double f : config.lr_sweep) md << " " << trainer::flag_text(f);
  md << " of each optimizer's default --lr, extended by up to " << config.sweep_extend
     << " point(s) per optimizer while its best lr was at an edge of the grid, scored by the "
        "final validation "
     << s.metric << " (a " << config.val_fraction
     << " per-class split of the training images, never the test set), mean over seeds";
  for (int64_t k = 0; k < config.sweep_seeds; ++k) md << " " << config.seeds[k];
  md << " (one data order per seed for every point). The chosen lr was re-run on "
     << config.seeds.size() << " seeds on the test set (summary.md: mean ± sd). \"grid edge\": "
     << "the best lr is still the lowest or highest tried, so the optimum may lie beyond it.\n\n"
     << grid.to_markdown() << "\nThe chosen lrs on the test set (" << config.seeds.size()
     << " seeds each). " << trainer::test_table_note(tests) << "\n\n"
     << trainer::test_table(tests).to_markdown() << "\nmachine: " << trainer::machine_description()
     << "\n";
  std::filesystem::create_directories(config.out);
  {
    std::ofstream f(config.out + "/sweep.md");
    f << md.str();
    if (!f) throw std::runtime_error("--out: cannot write " + config.out + "/sweep.md");
  }
  out << "\nlr sweep (validation " << s.metric << ")\n"
      << grid.to_text() << "sweep: " << config.out << "/sweep.md";
  if (config.plots) {
    trainer::Panel panel{"Validation " + s.metric + " by learning rate", "log10(lr)", s.metric, {}};
    for (const auto& opt : config.optimizers) {
      trainer::Series series{opt, {}, {}, {}};
      for (const auto& p : s.points) {
        if (p.config.optimizer != opt || !std::isfinite(p.score)) continue;
        series.x.push_back(std::log10(*p.config.lr));
        series.y.push_back(p.score);
      }
      panel.series.push_back(series);
    }
    if (trainer::plot_png(config.out + "/sweep.png", {panel}, 1, out)) {
      out << ", " << config.out << "/sweep.png";
    }
  }
  out << "\n";
}

}  // namespace fogo::resnet
