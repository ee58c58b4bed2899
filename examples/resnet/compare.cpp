// run_comparison(): every optimizer x seed of a config, then the mean ± sd table and the plots.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/metrics.h"
#include "common/report.h"
#include "common/runtime.h"
#include "trainer.h"

namespace fogo::resnet {
namespace {

std::string label(const std::string& metric) {
  static const std::map<std::string, std::string> names = {
      {"acc", "acc (%)"},
      {"rare_acc", "rare acc (%)"},
      {"nonrare_acc", "non-rare acc (%)"},
      {"rare_forgetting", "rare forgetting (%)"},
      {"mean_rare_forgetting", "mean rare forgetting (%)"},
      {"rare_forget_rate", "rare forget rate (%)"},
      {"AF_clip", "AF clipped (%)"},
      {"AP", "AP (%)"},
      {"AF", "AF (%)"},
      {"BWT", "BWT (%)"}};
  const auto it = names.find(metric);
  return it == names.end() ? metric : it->second;
}

// "fogo - muon on rare_acc", "... and fogo - muon on BWT".
std::string declared_text(const std::vector<trainer::DeclaredTest>& tests) {
  std::string text;
  for (size_t k = 0; k < tests.size(); ++k) {
    text += (k == 0                  ? ""
             : k + 1 == tests.size() ? " and "
                                     : ", ") +
            tests[k].a + " - " + tests[k].b + " on " + tests[k].metric + ", paired by seed";
  }
  return text;
}

// Mean ± sd over the seeds of one optimizer at every x of `curve`; an sd band only when the
// seeds share their x values (they do unless a run was stopped early).
trainer::Series series_of(const std::string& name, const std::vector<const RunResult*>& runs,
                          size_t curve) {
  trainer::Series s{name, {}, {}, {}};
  const auto& x = runs.front()->x;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> ys;
    for (const auto* r : runs) {
      if (r->x.size() == x.size()) ys.push_back(r->curve[i][curve]);
    }
    const trainer::MeanSd m = trainer::mean_sd(ys);
    if (!std::isfinite(m.mean)) continue;  // undefined there (the first forget rate)
    s.x.push_back(x[i]);
    s.y.push_back(m.mean);
    s.sd.push_back(m.n > 1 ? m.sd : 0.0);
  }
  return s;
}

// The table of a comparison: one row per optimizer, mean ± sd over its seeds, under a heading
// naming the setting.
struct Summary {
  std::string heading;
  trainer::Table table;
  bool incomplete = false;              ///< some run stopped early (--stop-at-step)
  std::string verdict;                  ///< the primary tests, then the ranking by their metric
  std::vector<trainer::TestRow> tests;  ///< every metric, every pair: primary and secondary
  std::string machine;                  ///< machine_description()
};

// The results of each optimizer, in run order.
std::map<std::string, std::vector<const RunResult*>> by_optimizer(
    const std::vector<RunResult>& results) {
  std::map<std::string, std::vector<const RunResult*>> by_opt;
  for (const auto& r : results) by_opt[r.config.optimizer].push_back(&r);
  return by_opt;
}

// Every summary metric with one group of per-seed values per optimizer (config's order), each
// value with its seed: optimizers that ran the same seeds are compared paired by seed.
std::vector<trainer::MetricGroups> metric_groups(const Config& config,
                                                 const std::vector<RunResult>& results) {
  const auto& names = results.front().summary_names;
  auto by_opt = by_optimizer(results);
  std::vector<trainer::MetricGroups> metrics;
  for (size_t k = 0; k < names.size(); ++k) {
    metrics.push_back({names[k], {}});
    for (const auto& opt : config.optimizers) {
      if (by_opt[opt].empty()) continue;
      trainer::Group g{opt, {}, {}};
      for (const auto* r : by_opt[opt]) {
        g.values.push_back(r->summary[k]);
        g.units.push_back(r->config.seed);
      }
      metrics.back().groups.push_back(std::move(g));
    }
  }
  return metrics;
}

// What was compared, on which machine, and the wall time of all runs.
std::string summary_heading(const Config& config, const std::string& data_name,
                            const std::vector<RunResult>& results, const std::string& machine) {
  const Config& first = results.front().config;
  std::ostringstream what;
  what << first.scenario << " on " << data_name << ", ResNet-18 width " << first.width << ", "
       << *first.epochs << " epoch(s)" << (first.scenario == "class-imbalanced" ? "" : " per task")
       << ", batch " << first.batch_size << ", seeds";
  for (const int64_t seed : config.seeds) what << " " << seed;
  double wall = 0;
  for (const auto& r : results) wall += r.wall_seconds;
  what << "\nmachine: " << machine << "; " << results.size() << " runs, " << std::fixed
       << std::setprecision(0) << wall << " s of wall time in all";
  return what.str();
}

Summary summarize(const Config& config, const std::string& data_name,
                  const std::vector<RunResult>& results) {
  const auto& names = results.front().summary_names;
  std::vector<std::string> header{"optimizer", "seeds"};
  for (const auto& n : names) header.push_back(label(n));
  header.push_back("train time (s)");
  header.push_back("wall time per run (s)");
  Summary s{{}, trainer::Table(header), false, {}, {}, trainer::machine_description()};
  auto by_opt = by_optimizer(results);
  for (const auto& opt : config.optimizers) {
    const auto& rs = by_opt[opt];
    if (rs.empty()) continue;
    std::vector<std::string> row{opt, std::to_string(rs.size())};
    for (size_t k = 0; k < names.size(); ++k) {
      std::vector<double> v;
      for (const auto* r : rs) v.push_back(r->summary[k]);
      row.push_back(trainer::format_mean_sd(trainer::mean_sd(v), 2));
    }
    std::vector<double> secs, walls;
    for (const auto* r : rs) {
      secs.push_back(r->seconds);
      walls.push_back(r->wall_seconds);
      s.incomplete = s.incomplete || !r->completed();
    }
    row.push_back(trainer::format_mean_sd(trainer::mean_sd(secs), 0));
    row.push_back(trainer::format_mean_sd(trainer::mean_sd(walls), 0));
    s.table.add_row(row);
  }
  // The verdict: the scenario's primary tests, then the ranking by the first one's metric with
  // its leader and runner-up judged within their family.
  std::vector<trainer::MetricGroups> metrics = metric_groups(config, results);
  const std::string& scenario = results.front().config.scenario;
  const std::vector<trainer::DeclaredTest> primary = primary_tests(scenario);
  s.tests = trainer::test_families(metrics, primary);
  const std::string& headline = primary.front().metric;
  const auto at = std::find(names.begin(), names.end(), headline);
  if (at == names.end()) {
    throw std::logic_error("the " + scenario + " summary lacks its primary metric " + headline);
  }
  std::string tests = trainer::primary_verdict(s.tests, label);
  if (tests.empty()) {
    tests = "No primary test: it compares " + primary.front().a + " with " + primary.front().b +
            ", and this comparison lacks one of them.";
  }
  s.verdict = "Primary tests of " + scenario +
              ", named before the runs: " + declared_text(primary) + ".\n" + tests + "\n" +
              trainer::plain_verdict(label(headline), metrics[at - names.begin()].groups, s.tests,
                                     headline, higher_is_better(headline));
  s.heading = summary_heading(config, data_name, results, s.machine);
  return s;
}

// What the table of tests is (above it in summary.md and the printout).
std::string tests_note(const Summary& summary) { return trainer::test_table_note(summary.tests); }

// <out>/summary.md (the table) and <out>/runs.<fmt> (one record per run).
void write_summary(const Config& config, const Summary& summary,
                   const std::vector<RunResult>& results) {
  std::filesystem::create_directories(config.out);
  {
    std::ofstream md(config.out + "/summary.md");
    md << summary.heading << "\n\n"
       << summary.table.to_markdown() << "\n"
       << tests_note(summary) << "\n\n"
       << trainer::test_table(summary.tests).to_markdown() << "\n"
       << summary.verdict << "\n";
    if (!md) throw std::runtime_error("--out: cannot write " + config.out + "/summary.md");
  }
  const auto& names = results.front().summary_names;
  auto all = trainer::MetricsWriter::create(config.out + "/runs." + config.metrics_format);
  for (const auto& r : results) {
    trainer::Record rec;
    rec.set("optimizer", r.config.optimizer).set("seed", r.config.seed).set("steps", r.steps);
    rec.set("completed", r.completed()).set("train_seconds", r.seconds);
    rec.set("wall_seconds", r.wall_seconds);
    for (size_t k = 0; k < names.size(); ++k) rec.set(names[k], r.summary[k]);
    rec.set("lr", *r.config.lr).set("command", r.command).set("machine", r.machine);
    rec.set("date", r.date).set("commit", r.commit).set("isa", r.isa);
    all.write(rec);
  }
}

// accuracy.png and forgetting.png: each optimizer's mean ± sd curves over its seeds.
void plot_curves(const Config& config, const std::vector<RunResult>& results, std::ostream& out) {
  auto by_opt = by_optimizer(results);
  const auto& curves = results.front().curve_names;
  const std::string x = results.front().x_name;
  auto panel = [&](const std::string& curve, const std::string& title) {
    trainer::Panel p{title, x, label(curve), {}};
    const size_t k = std::find(curves.begin(), curves.end(), curve) - curves.begin();
    for (const auto& opt : config.optimizers) {
      if (!by_opt[opt].empty() && !by_opt[opt].front()->x.empty()) {
        p.series.push_back(series_of(opt, by_opt[opt], k));
      }
    }
    return p;
  };
  bool drawn;
  if (results.front().config.scenario == "class-imbalanced") {
    drawn = trainer::plot_png(
        config.out + "/accuracy.png",
        {panel("rare_acc", "Rare-class accuracy"), panel("nonrare_acc", "Non-rare-class accuracy"),
         panel("acc", "Overall accuracy")},
        3, out);
    drawn = trainer::plot_png(
                config.out + "/forgetting.png",
                {panel("rare_forgetting", "Rare-class forgetting (best-so-far drop)"),
                 panel("rare_forget_rate", "Rare-sample forgetting events (% of those correct)")},
                2, out) &&
            drawn;
  } else {
    drawn = trainer::plot_png(config.out + "/accuracy.png",
                              {panel("AP", "Average performance over seen tasks")}, 1, out);
    drawn = trainer::plot_png(
                config.out + "/forgetting.png",
                {panel("AF", "Average forgetting"), panel("BWT", "Backward transfer")}, 2, out) &&
            drawn;
  }
  if (drawn)
    out << "plots: " << config.out << "/accuracy.png, " << config.out << "/forgetting.png\n";
}

}  // namespace

std::vector<trainer::TestRow> comparison_tests(const Config& config,
                                               const std::vector<RunResult>& results) {
  if (results.empty()) return {};
  return trainer::test_families(metric_groups(config, results),
                                primary_tests(results.front().config.scenario));
}

std::vector<trainer::DeclaredTest> primary_tests(const std::string& scenario) {
  if (scenario == "class-imbalanced") return {{"rare_acc", "fogo", "muon"}};
  if (scenario == "domain-il") return {{"AF", "fogo", "muon"}};
  if (scenario == "class-il") return {{"AP", "fogo", "muon"}, {"BWT", "fogo", "muon"}};
  throw std::invalid_argument("primary_tests: unknown scenario '" + scenario + "'");
}

bool higher_is_better(const std::string& metric) {
  for (const char* lower :
       {"AF", "AF_clip", "rare_forgetting", "mean_rare_forgetting", "rare_forget_rate"}) {
    if (metric == lower) return false;
  }
  return true;
}

std::vector<Config> plan_runs(const Config& config) {
  if (config.optimizers.empty()) throw trainer::Cli::error("optimizers", "none given");
  if (config.seeds.empty()) throw trainer::Cli::error("seeds", "none given");
  std::vector<Config> runs;
  for (const auto& opt : config.optimizers) {
    for (const int64_t seed : config.seeds) runs.push_back(resolve(config, opt, seed));
  }
  return runs;
}

void report_comparison(const Config& config, const std::string& data_name,
                       const std::vector<RunResult>& results, std::ostream& out) {
  if (results.empty()) return;
  const Summary summary = summarize(config, data_name, results);
  out << "\n"
      << summary.heading << (summary.incomplete ? " (some runs stopped early: --stop-at-step)" : "")
      << "\n"
      << summary.table.to_text() << "\n"
      << tests_note(summary) << "\n"
      << trainer::test_table(summary.tests).to_text();
  write_summary(config, summary, results);
  if (config.plots) plot_curves(config, results, out);
  out << "summary: " << config.out << "/summary.md, " << config.out << "/runs."
      << config.metrics_format << "\n\n"
      << summary.verdict << "\n";
}

std::vector<RunResult> run_comparison(const Config& config, std::ostream& out) {
  if (!config.lr_sweep.empty()) return run_lr_sweep(config, out).finals;
  const std::vector<Config> runs = plan_runs(config);  // a bad flag fails before any training
  const DataSplit data = load_data(runs.front());
  out << "data: " << data.name << " from " << runs.front().data_dir << " (" << data.train.size()
      << " train, " << data.test.size() << " test images)\n";
  std::vector<RunResult> results;
  for (const auto& run : runs) results.push_back(train_run(run, data, out));
  if (trainer::DataParallel::process().main()) report_comparison(config, data.name, results, out);
  return results;
}

}  // namespace fogo::resnet
