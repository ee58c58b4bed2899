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

std::vector<SweepPoint> plan_sweep(const Config& config) {
  if (config.optimizers.empty()) throw trainer::Cli::error("optimizers", "none given");
  if (config.seeds.size() < 3) {
    throw trainer::Cli::error("seeds", "--lr-sweep re-runs the chosen lr on >= 3 seeds; got " +
                                           std::to_string(config.seeds.size()));
  }
  for (const double f : config.lr_sweep) {
    if (!(f > 0 && std::isfinite(f))) {
      throw trainer::Cli::error("lr-sweep", "factors must be > 0, got " + trainer::flag_text(f));
    }
  }
  std::vector<SweepPoint> points;
  for (const auto& opt : config.optimizers) {
    const double base = *resolve(config, opt, config.seeds.front()).lr;
    for (const double f : config.lr_sweep) {
      Config c = config;
      c.lr = base * f;
      c.optimizer_lr.clear();  // the grid's lr, not --optimizer-lr's
      c.eval_split = "val";
      c.out = config.out + "/sweep/lr" + lr_text(*c.lr);
      points.push_back({resolve(c, opt, config.seeds.front()), 0.0});
    }
  }
  return points;
}

double choose_lr(const std::vector<SweepPoint>& points, const std::string& optimizer) {
  double best_lr = std::numeric_limits<double>::quiet_NaN();
  double best = -std::numeric_limits<double>::infinity();
  for (const auto& p : points) {
    if (p.config.optimizer != optimizer || !std::isfinite(p.score)) continue;
    // Ties go to the smaller lr (the points come in the grid's order, so compare explicitly).
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

SweepOutcome run_lr_sweep(const Config& config, std::ostream& out) {
  SweepOutcome s;
  s.points = plan_sweep(config);  // a bad flag fails before any training
  const DataSplit data = load_data(s.points.front().config);
  out << "lr sweep: " << s.points.size() << " grid runs on a validation split ("
      << config.val_fraction << " of the training images per class), seed " << config.seeds.front()
      << "\n";
  for (auto& p : s.points) {
    const RunResult r = train_run(p.config, data, out);
    p.score = r.summary.empty() ? std::numeric_limits<double>::quiet_NaN() : r.summary.front();
    s.metric = r.summary_names.front();
  }
  std::vector<Config> finals;
  for (const auto& opt : config.optimizers) {
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
  // The grid: validation score per lr, the chosen lr, and the test metrics of the re-runs.
  trainer::Table grid({"optimizer", "lr", "validation " + s.metric, "chosen"});
  for (const auto& p : s.points) {
    const bool chosen = *p.config.lr == s.chosen.at(p.config.optimizer);
    grid.add_row(
        {p.config.optimizer, lr_text(*p.config.lr), number(p.score, 2), chosen ? "yes" : ""});
  }
  // Test metrics of the chosen lr over the seeds, and Welch's t between every two optimizers.
  std::map<std::string, std::vector<const RunResult*>> by_opt;
  for (const auto& r : s.finals) by_opt[r.config.optimizer].push_back(&r);
  const auto& names = s.finals.front().summary_names;
  std::vector<std::string> header{"metric", "A", "B"};
  header.insert(header.end(), trainer::welch_header().begin(), trainer::welch_header().end());
  trainer::Table welch(header);
  for (size_t k = 0; k < names.size(); ++k) {
    for (size_t a = 0; a < config.optimizers.size(); ++a) {
      for (size_t b = a + 1; b < config.optimizers.size(); ++b) {
        std::vector<double> va, vb;
        for (const auto* r : by_opt[config.optimizers[a]]) va.push_back(r->summary[k]);
        for (const auto* r : by_opt[config.optimizers[b]]) vb.push_back(r->summary[k]);
        std::vector<std::string> row{names[k], config.optimizers[a], config.optimizers[b]};
        const auto cells = trainer::welch_cells(va, vb, 2);
        row.insert(row.end(), cells.begin(), cells.end());
        welch.add_row(row);
      }
    }
  }
  std::ostringstream md;
  md << "Learning-rate sweep: factors";
  for (const double f : config.lr_sweep) md << " " << trainer::flag_text(f);
  md << " of each optimizer's default --lr, scored by the final validation " << s.metric << " (a "
     << config.val_fraction << " per-class split of the training images, never the test set), seed "
     << config.seeds.front() << " (one data order for every point). The chosen lr was re-run on "
     << config.seeds.size() << " seeds on the test set (summary.md: mean ± sd).\n\n"
     << grid.to_markdown() << "\nWelch's t-test between optimizers on the test set ("
     << config.seeds.size() << " seeds each):\n\n"
     << welch.to_markdown();
  std::filesystem::create_directories(config.out);
  {
    std::ofstream f(config.out + "/sweep.md");
    f << md.str();
    if (!f) throw std::runtime_error("--out: cannot write " + config.out + "/sweep.md");
  }
  out << "\nlr sweep (validation " << s.metric << ")\n"
      << grid.to_text() << "\nWelch's t-test (test set)\n"
      << welch.to_text() << "sweep: " << config.out << "/sweep.md";
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
