// End-to-end runs on a small synthetic dataset: the loss drops with every optimizer, and a run
// interrupted and resumed (even from an older checkpoint, after logging past it) ends bit for bit
// where the uninterrupted run ends.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "common/checkpoint.h"
#include "common/optimizers.h"
#include "common/testing.h"
#include "config.h"
#include "resnet.h"
#include "trainer.h"

namespace fs = std::filesystem;
using namespace fogo::resnet;

namespace {

std::string temp_dir() { return fogo::trainer::testing::make_temp_dir("fogo_resnet_run"); }

// 10 classes of 12x12 images: class k is a bright 3x3 patch at position k of a 4x4 grid (minus
// the last six cells), over noise. Easy enough that a few dozen steps show learning.
Dataset synthetic(int64_t per_class, uint64_t seed) {
  auto gen = derived_generator({seed});
  const int64_t n = 10 * per_class;
  auto images = torch::randint(0, 80, {n, 1, 12, 12}, gen, torch::kLong);
  auto labels = torch::arange(n, torch::kLong) % 10;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % 10, r = (k / 4) * 3, c = (k % 4) * 3;
    images[i].slice(1, r, r + 3).slice(2, c, c + 3).add_(160);
  }
  return {images.to(torch::kUInt8), labels};
}

DataSplit synthetic_split() {
  DataSplit d;
  d.name = "synthetic";
  d.train = synthetic(20, 1);
  d.test = synthetic(10, 2);
  return d;
}

Config small(const std::string& scenario, const std::string& out) {
  Config c;
  c.scenario = scenario;
  c.width = 4;
  c.batch_size = 16;
  c.epochs = 2;
  c.out = out;
  c.device = "cpu";
  c.threads = 1;  // ctest runs test binaries side by side on a 2-core machine
  c.log_every = 1;
  c.plots = false;
  c.task_order = "0,1,2,3,4/5,6,7,8,9";
  c.num_domains = 2;
  c.rare_fraction = 0.5;
  return c;
}

using fogo::trainer::testing::read_file;

void copy(const std::string& from, const std::string& to) {
  std::ofstream(to, std::ios::binary) << std::ifstream(from, std::ios::binary).rdbuf();
}

std::vector<double> field(const std::string& jsonl, const std::string& key) {
  std::vector<double> out;
  const std::regex re("\"" + key + "\":([-0-9.eE+]+)");
  for (std::sregex_iterator it(jsonl.begin(), jsonl.end(), re), end; it != end; ++it) {
    out.push_back(std::stod((*it)[1]));
  }
  return out;
}

std::vector<torch::Tensor> model_state(const RunResult& r) {
  ResNet18 m(ResNetOptions{1, 10, r.config.width, *r.config.head_fc});
  fogo::trainer::CheckpointReader in(run_dir(r.config) + "/" + fogo::trainer::kCheckpointFile);
  in.load_module("model", *m);
  std::vector<torch::Tensor> out;
  for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m->buffers()) out.push_back(b.clone());
  return out;
}

}  // namespace

class SmokeRun : public ::testing::TestWithParam<std::string> {};

TEST_P(SmokeRun, LossDrops) {
  const DataSplit data = synthetic_split();
  Config c = small("class-imbalanced", temp_dir());
  c.epochs = 3;
  c.augment = false;  // flips would swap the classes of this synthetic data
  // FOGO's update RMS is sigma * lr = 1e-4 at the paper's lr: too slow to show in a few steps.
  if (GetParam() == "fogo") c.lr = 1e-2;
  std::ostringstream log;
  const RunResult r = train_run(resolve(c, GetParam(), 0), data, log);
  EXPECT_TRUE(r.completed());
  const auto loss = field(read_file(run_dir(r.config) + "/train.jsonl"), "loss");
  ASSERT_GE(loss.size(), 15u);
  double first = 0, last = 0;
  for (size_t k = 0; k < 5; ++k) {
    first += loss[k];
    last += loss[loss.size() - 1 - k];
  }
  EXPECT_LT(last, 0.8 * first) << "first five " << first / 5 << ", last five " << last / 5;
  // The applied update's RMS per param group, every logged step. FOGO scales each matrix's
  // update to RMS sigma * lr exactly (docs/algorithm.md step 9; weight decay 0 here), so every
  // stage group reads 0.1 * 1e-2 (the class-imbalanced preset's sigma).
  const std::string train = read_file(run_dir(r.config) + "/train.jsonl");
  if (GetParam() == "fogo") {
    for (const char* stage : {"stem", "layer1", "layer2", "layer3", "layer4", "fc"}) {
      const auto rms = field(train, std::string("update_rms/") + stage);
      ASSERT_EQ(rms.size(), loss.size()) << stage;
      for (const double v : rms) EXPECT_NEAR(v, 1e-3, 1e-5) << stage;
    }
  } else {
    const auto rms = field(train, GetParam() == "muon" ? "update_rms/matrix" : "update_rms/all");
    ASSERT_EQ(rms.size(), loss.size());
    for (const double v : rms) EXPECT_GT(v, 0.0);
  }
  ASSERT_EQ(r.summary.size(), 6u);
  EXPECT_EQ(r.summary_names.back(), "rare_forget_rate");
  for (size_t k = 0; k + 1 < r.summary.size(); ++k) EXPECT_TRUE(std::isfinite(r.summary[k])) << k;
  // The rare test samples' forgetting events: a count at every evaluation, and a rate in
  // [0, 100] where it is defined (null at the first evaluation, and where no rare test image
  // was correct at the previous one).
  const std::string eval = read_file(run_dir(r.config) + "/eval.jsonl");
  const auto rate = field(eval, "rare_forget_rate"), events = field(eval, "rare_forget_events");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events.front(), 0);
  EXPECT_LE(rate.size(), 2u);
  EXPECT_EQ(std::count(eval.begin(), eval.end(), '\n'), 3);
  EXPECT_NE(eval.find("\"rare_forget_rate\":null"), std::string::npos) << eval;
  for (const double v : rate) EXPECT_TRUE(v >= 0 && v <= 100) << v;
}

TEST(Schedule, CosineLrIsAppliedPerTaskAndLogged) {
  // class-il, 2 tasks of 100 images, batch 16: 6 steps per epoch, 12 per task; warmup 0.25 ->
  // 3 steps. The logged lr must follow the schedule and restart at the second task.
  const DataSplit data = synthetic_split();
  Config c = small("class-il", temp_dir());
  c.lr_schedule = "cosine";
  c.warmup_frac = 0.25;
  c.lr = 1e-2;
  std::ostringstream log;
  const RunResult r = train_run(resolve(c, "muon", 0), data, log);
  const auto lr = field(read_file(run_dir(r.config) + "/train.jsonl"), "lr");
  ASSERT_EQ(lr.size(), 24u);
  for (int t = 0; t < 2; ++t) {
    EXPECT_NEAR(lr[12 * t + 0], 1e-2 / 3, 1e-9);
    EXPECT_NEAR(lr[12 * t + 2], 1e-2, 1e-9);
    EXPECT_NEAR(lr[12 * t + 3], 1e-2, 1e-9);  // the cosine's start
    // Step 7 of 12: (7 - 3) / 9 of the way down.
    EXPECT_NEAR(lr[12 * t + 7], 1e-2 * 0.5 * (1 + std::cos(M_PI * 4 / 9)), 1e-9);
    EXPECT_LT(lr[12 * t + 11], 1e-3);
  }
}

TEST(Sweep, ChoosesOnValidationAndComparesOnTestSeeds) {
  // Two optimizers x two lr factors on the validation split (seed 0), then the chosen lr of
  // each on three seeds on the test set, with Welch's t-test in sweep.md.
  const DataSplit data = synthetic_split();
  Config c = small("class-imbalanced", temp_dir());
  c.epochs = 1;
  c.augment = false;
  c.optimizers = {"adam", "muon"};
  c.seeds = {0, 1, 2};
  c.lr_sweep = {0.5, 2.0};
  c.val_fraction = 0.2;
  std::ostringstream log;
  const auto points = plan_sweep(c);
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(*points[0].config.lr, 0.5e-3);  // adam's default 1e-3
  EXPECT_EQ(*points[3].config.lr, 2e-2);    // muon's default 1e-2
  for (const auto& p : points) {
    EXPECT_EQ(p.config.eval_split, "val");  // never the test set
    EXPECT_EQ(p.config.seed, 0);            // one data order for every point
  }
  // run_lr_sweep needs the data from load_data; drive its stages on the synthetic split.
  SweepOutcome s;
  s.points = points;
  for (auto& p : s.points) {
    const RunResult r = train_run(p.config, data, log);
    p.score = r.summary.front();
    s.metric = r.summary_names.front();
    // The validation split: 20% of the 20 training images of each class.
    EXPECT_EQ(field(read_file(run_dir(p.config) + "/eval.jsonl"), "acc").size(), 1u);
  }
  for (const char* opt : {"adam", "muon"}) {
    const double chosen = choose_lr(s.points, opt);
    double best = -1;
    for (const auto& p : s.points)
      if (p.config.optimizer == opt) best = std::max(best, p.score);
    for (const auto& p : s.points)
      if (p.config.optimizer == opt && *p.config.lr == chosen) EXPECT_EQ(p.score, best);
    s.chosen[opt] = chosen;
    Config f = c;
    f.lr = chosen;
    for (const int64_t seed : c.seeds)
      s.finals.push_back(train_run(resolve(f, opt, seed), data, log));
  }
  ASSERT_EQ(s.finals.size(), 6u);
  EXPECT_EQ(s.finals[0].config.eval_split, "test");
  report_sweep(c, s, log);
  const std::string md = read_file(c.out + "/sweep.md");
  EXPECT_NE(md.find("Welch"), std::string::npos) << md;
  EXPECT_NE(md.find("| acc | adam | muon |"), std::string::npos) << md;
  // Fewer than three seeds cannot be compared.
  c.seeds = {0, 1};
  EXPECT_THROW(plan_sweep(c), std::invalid_argument);
}

TEST(Sweep, OptimizerLrGivesEachOptimizerItsOwnRateAndCentresTheGrid) {
  Config c = small("class-imbalanced", temp_dir());
  c.optimizer_lr = {"fogo=1e-2", "adam=3e-3"};
  const Config fogo = resolve(c, "fogo", 0);
  EXPECT_EQ(*fogo.lr, 1e-2);
  EXPECT_EQ(*fogo.head_lr, 1e-2);  // head groups follow lr outside class-il
  EXPECT_TRUE(fogo.optimizer_lr.empty());
  EXPECT_EQ(*resolve(fogo, "fogo", 1).lr, 1e-2);  // a resolved config resolves again
  EXPECT_EQ(*resolve(c, "adam", 0).lr, 3e-3);
  EXPECT_EQ(*resolve(c, "muon", 0).lr, 1e-2);  // not named: the scenario's default
  // The sweep's grid is centred on it, and its grid points carry their own lr.
  c.optimizers = {"fogo"};
  c.seeds = {0, 1, 2};
  c.lr_sweep = {0.5, 2.0};
  const auto points = plan_sweep(c);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(*points[0].config.lr, 5e-3);
  EXPECT_EQ(*points[1].config.lr, 2e-2);
  // Errors name the flag: with --lr too, an unknown optimizer, a bad number.
  const auto error_of = [](const Config& bad, const std::string& opt) {
    try {
      resolve(bad, opt, 0);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Config both = c;
  both.lr = 1e-3;
  EXPECT_NE(error_of(both, "fogo").find("--optimizer-lr: gives fogo an lr and so does --lr"),
            std::string::npos);
  for (const char* bad : {"sgd=1e-2", "fogo", "fogo=fast", "fogo=1e-2x"}) {
    Config b = c;
    b.optimizer_lr = {bad};
    EXPECT_NE(error_of(b, "fogo").find("--optimizer-lr"), std::string::npos) << bad;
  }
}

// --- The sweep protocol (issue 28): multi-seed scores, grids extended past an edge. A fake
// scorer stands in for training, so these run in milliseconds.

namespace {

struct FakeScorer {
  std::function<double(double lr, int64_t seed)> value;
  std::vector<std::pair<double, int64_t>> calls;  // (lr, seed) of every scored run
  SweepScorer scorer() {
    return [this](const Config& run) {
      EXPECT_EQ(run.eval_split, "val");  // never the test set
      calls.emplace_back(*run.lr, run.seed);
      return value(*run.lr, run.seed);
    };
  }
};

Config sweep_config(const std::vector<double>& factors) {
  Config c = small("class-imbalanced", temp_dir());
  c.optimizers = {"adam"};  // default lr 1e-3
  c.seeds = {0, 1, 2};
  c.lr_sweep = factors;
  return c;
}

std::vector<SweepPoint> adam_grid(const Config& c) { return plan_sweep(c); }

std::vector<double> lrs_of(const std::vector<SweepPoint>& points) {
  std::vector<double> lrs;
  for (const auto& p : points) lrs.push_back(*p.config.lr);
  return lrs;
}

}  // namespace

TEST(SweepProtocol, ScoresEachPointByItsMeanOverTheSweepSeeds) {
  Config c = sweep_config({2, 0.5, 1});  // unsorted on purpose: the grid comes back ascending
  c.sweep_seeds = 2;
  c.sweep_extend = 0;
  FakeScorer fake;
  // A peak at lr 1e-3 on seed 0 and at 2e-3 on seed 1: one seed alone would pick either.
  fake.value = [](double lr, int64_t seed) {
    const double peak = seed == 0 ? 1e-3 : 2e-3;
    return 50.0 - 10.0 * std::pow(std::log2(lr / peak), 2) + 3.0 * static_cast<double>(seed);
  };
  bool edge = true;
  const auto points = sweep_optimizer(c, adam_grid(c), fake.scorer(), &edge);
  EXPECT_EQ(lrs_of(points), (std::vector<double>{0.5e-3, 1e-3, 2e-3}));
  // Every point on seeds 0 and 1 (the first two of --seeds), never on seed 2.
  ASSERT_EQ(fake.calls.size(), 6u);
  for (size_t k = 0; k < fake.calls.size(); ++k) EXPECT_EQ(fake.calls[k].second, int64_t(k % 2));
  for (const auto& p : points) {
    ASSERT_EQ(p.seed_scores.size(), 2u);
    EXPECT_EQ(p.seed_scores[0], fake.value(*p.config.lr, 0));
    EXPECT_EQ(p.seed_scores[1], fake.value(*p.config.lr, 1));
    EXPECT_DOUBLE_EQ(p.score, (p.seed_scores[0] + p.seed_scores[1]) / 2);
  }
  // Means: 26.5, 46.5, 46.5: 1e-3 and 2e-3 tie, and the smaller lr wins the tie.
  EXPECT_DOUBLE_EQ(points[1].score, points[2].score);
  EXPECT_EQ(choose_lr(points, "adam"), 1e-3);
  EXPECT_FALSE(edge);
  // A seed whose run gave no score makes the point's score NaN, and it cannot be chosen.
  fake.value = [](double lr, int64_t seed) {
    return seed == 1 && lr > 1.5e-3 ? std::nan("") : 100.0 * lr;
  };
  const auto failed = sweep_optimizer(c, adam_grid(c), fake.scorer());
  EXPECT_TRUE(std::isnan(failed[2].score));
  EXPECT_EQ(choose_lr(failed, "adam"), 1e-3);
}

TEST(SweepProtocol, ExtendsTheGridWhileTheBestPointIsAtAnEdge) {
  Config c = sweep_config({0.5, 1, 2});
  c.sweep_seeds = 1;
  c.sweep_extend = 4;
  FakeScorer fake;
  // A single peak at 8e-3, beyond the grid's top (2e-3): two x2 steps reach it, a third
  // brackets it, and the extension stops with the best point inside.
  fake.value = [](double lr, int64_t) { return -std::pow(std::log2(lr / 8e-3), 2); };
  bool edge = true;
  auto points = sweep_optimizer(c, adam_grid(c), fake.scorer(), &edge);
  EXPECT_EQ(lrs_of(points), (std::vector<double>{0.5e-3, 1e-3, 2e-3, 4e-3, 8e-3, 16e-3}));
  EXPECT_EQ(choose_lr(points, "adam"), 8e-3);
  EXPECT_FALSE(edge);
  EXPECT_EQ(fake.calls.size(), 6u);
  for (const auto& p : points) {
    EXPECT_EQ(p.config.optimizer, "adam");
    EXPECT_EQ(p.config.eval_split, "val");
    EXPECT_NE(p.config.out.find("/sweep/lr"), std::string::npos) << p.config.out;
  }
  // Downwards, with the grid's own step at that edge (x3 here).
  c.lr_sweep = {1, 3, 9};
  fake.calls.clear();
  fake.value = [](double lr, int64_t) { return -std::pow(std::log(lr / 1.2e-4), 2); };
  points = sweep_optimizer(c, adam_grid(c), fake.scorer(), &edge);
  ASSERT_EQ(points.size(), 6u);
  EXPECT_NEAR(*points[0].config.lr, 1e-3 / 27, 1e-15);
  EXPECT_NEAR(choose_lr(points, "adam"), 1e-3 / 9, 1e-15);
  EXPECT_FALSE(edge);
  // A budget too small to reach the peak: the best point stays at the edge, and says so.
  c.lr_sweep = {0.5, 1, 2};
  c.sweep_extend = 2;
  fake.value = [](double lr, int64_t) { return lr; };  // always better higher
  points = sweep_optimizer(c, adam_grid(c), fake.scorer(), &edge);
  EXPECT_EQ(lrs_of(points), (std::vector<double>{0.5e-3, 1e-3, 2e-3, 4e-3, 8e-3}));
  EXPECT_TRUE(edge);
  // A diverging lr (NaN) bounds the grid: the best point is then inside it.
  c.sweep_extend = 4;
  fake.value = [](double lr, int64_t) { return lr > 3e-3 ? std::nan("") : lr; };
  points = sweep_optimizer(c, adam_grid(c), fake.scorer(), &edge);
  EXPECT_EQ(lrs_of(points), (std::vector<double>{0.5e-3, 1e-3, 2e-3, 4e-3}));
  EXPECT_EQ(choose_lr(points, "adam"), 2e-3);
  EXPECT_FALSE(edge);
  // --sweep-extend 0: the grid as given.
  c.sweep_extend = 0;
  fake.value = [](double lr, int64_t) { return lr; };
  EXPECT_EQ(sweep_optimizer(c, adam_grid(c), fake.scorer(), &edge).size(), 3u);
  EXPECT_TRUE(edge);
}

TEST(SweepProtocol, RejectsSweepSeedsAndExtendOutOfRange) {
  const auto error_of = [](const Config& bad) {
    try {
      plan_sweep(bad);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Config c = sweep_config({0.5, 1, 2});
  for (const int64_t bad : {0, 4}) {
    c.sweep_seeds = bad;
    EXPECT_NE(error_of(c).find("--sweep-seeds"), std::string::npos) << bad;
  }
  c.sweep_seeds = 3;
  c.sweep_extend = -1;
  EXPECT_NE(error_of(c).find("--sweep-extend"), std::string::npos);
  c.sweep_extend = 0;
  EXPECT_EQ(error_of(c), "");
}

TEST(Compare, ReportEndsWithAPlainVerdictOnThePrimaryMetric) {
  // fogo and adam only: no primary test (it compares fogo with muon), said so; the ranking by
  // the primary metric (rare_acc) is judged paired by seed within the secondary family.
  Config c = small("class-imbalanced", temp_dir());
  c.optimizers = {"fogo", "adam"};
  c.seeds = {0, 1, 2};
  std::vector<RunResult> results;
  const double rare[2][3] = {{70, 71, 72}, {60, 61, 62.5}};
  for (size_t o = 0; o < 2; ++o) {
    for (int64_t seed = 0; seed < 3; ++seed) {
      RunResult r;
      r.config = resolve(c, c.optimizers[o], seed);
      r.summary_names = {"acc", "rare_acc"};
      r.summary = {10.0, rare[o][seed]};
      results.push_back(r);
    }
  }
  std::ostringstream out;
  report_comparison(c, "synthetic", results, out);
  const std::string verdict =
      "By rare acc (%) (higher is better; mean ± sd over 3 seeds): fogo 71.00 ± 1.00, adam 61.17 "
      "± 1.26. fogo's lead over adam (9.83) is larger than the seed spread (paired t-test p = ";
  const std::string text = out.str();
  EXPECT_NE(text.rfind("\n" + verdict), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n', text.rfind(verdict)), text.size() - 1) << text;  // the last line
  EXPECT_NE(text.find("No primary test: it compares fogo with muon, and this comparison lacks "
                      "one of them."),
            std::string::npos)
      << text;
  EXPECT_NE(read_file(c.out + "/summary.md").find(verdict), std::string::npos);
}

TEST(CompareFamily, SummaryCarriesThePrimaryTestHolmTheDetectableEffectTheMachineAndWallTime) {
  // Three optimizers, two metrics: the primary test (fogo - muon on rare_acc, paired by seed)
  // alone in its family, the five others in the secondary family. fogo's accuracy lead over
  // muon is separated there (paired p 0.001, Holm 0.006); the primary test is not (p 0.08), and
  // the printed verdict says so with the difference these seeds detect at 5%.
  Config c = small("class-imbalanced", temp_dir());
  c.optimizers = {"fogo", "muon", "adam"};
  c.seeds = {0, 1, 2};
  std::vector<RunResult> results;
  const double acc[3][3] = {{70, 72, 74}, {65, 67.5, 69}, {50, 60, 55}};
  const double rare[3][3] = {{40, 44, 41}, {45, 46, 47.5}, {30, 41, 35}};
  for (size_t o = 0; o < 3; ++o) {
    for (int64_t seed = 0; seed < 3; ++seed) {
      RunResult r;
      r.config = resolve(c, c.optimizers[o], seed);
      r.summary_names = {"acc", "rare_acc"};
      r.summary = {acc[o][seed], rare[o][seed]};
      r.wall_seconds = 10.0 + static_cast<double>(o);
      results.push_back(r);
    }
  }
  const auto tests = comparison_tests(c, results);
  ASSERT_EQ(tests.size(), 6u);
  EXPECT_TRUE(tests[0].primary);
  EXPECT_EQ(tests[0].metric, "rare_acc");
  EXPECT_EQ(tests[0].a, "fogo");
  EXPECT_EQ(tests[0].b, "muon");
  EXPECT_TRUE(tests[0].test.paired);
  EXPECT_DOUBLE_EQ(tests[0].test.estimate, -4.5);
  EXPECT_EQ(tests[0].family_size, 1);
  for (size_t k = 1; k < tests.size(); ++k) {
    EXPECT_FALSE(tests[k].primary) << k;
    EXPECT_TRUE(tests[k].test.paired) << k;
    EXPECT_EQ(tests[k].family_size, 5) << k;
  }
  EXPECT_EQ(tests[1].metric, "acc");  // fogo - muon on acc: separated within the five
  EXPECT_LT(tests[1].holm_p, 0.05);
  std::ostringstream out;
  report_comparison(c, "synthetic", results, out);
  const std::string text = out.str();
  const std::string md = read_file(c.out + "/summary.md");
  for (const std::string& s : {text, md}) {
    EXPECT_NE(s.find("machine: "), std::string::npos) << s;
    EXPECT_NE(s.find("torch CPU kernels"), std::string::npos) << s;
    EXPECT_NE(s.find("wall time per run (s)"), std::string::npos) << s;
    EXPECT_NE(s.find("Holm p"), std::string::npos) << s;
    EXPECT_NE(s.find("detectable (80% power)"), std::string::npos) << s;
    EXPECT_NE(s.find("Primary tests of class-imbalanced, named before the runs: fogo - muon on "
                     "rare_acc, paired by seed.\n"),
              std::string::npos)
        << s;
    EXPECT_NE(s.find("Primary test: fogo - muon on rare acc (%), paired by seed over 3 seeds: "
                     "-4.50 (95% CI "),
              std::string::npos)
        << s;
    EXPECT_NE(s.find("Not separated. At the 5% level these seeds detect a difference of about "),
              std::string::npos)
        << s;
    EXPECT_NE(s.find("muon's lead over fogo (4.50) is the primary test above."), std::string::npos)
        << s;
  }
  EXPECT_NE(md.find("| primary | rare_acc | fogo | muon | paired, 3 | -4.50 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| secondary | acc | fogo | muon | paired, 3 | 4.83 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| 0.05/5 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fogo | 3 | 72.00 ± 2.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 10 ± 0 |"), std::string::npos) << md;  // fogo's wall time per run
  EXPECT_NE(md.find("9 runs, 99 s of wall time in all"), std::string::npos) << md;
}

// The main job's verdict (scripts/run.sh; docs/results.md quotes it) from its table's per-seed
// accuracy and rare-class accuracy (rare classes 4-8, seeds 0, 1, 2, results.md): the code turns
// these numbers into exactly these closing lines.
TEST(CompareFamily, MainJobTableEndsWithItsPrimaryTest) {
  Config c = small("class-imbalanced", temp_dir());
  c.optimizers = {"fogo", "muon", "adam"};
  c.seeds = {0, 1, 2};
  const double acc[3][3] = {{68.24, 65.79, 66.11}, {71.51, 66.35, 69.20}, {62.95, 65.88, 67.89}};
  const double rare[3][3] = {{42.48, 40.66, 39.74}, {51.92, 41.58, 44.52}, {32.50, 41.14, 44.00}};
  std::vector<RunResult> results;
  for (size_t o = 0; o < 3; ++o) {
    for (int64_t seed = 0; seed < 3; ++seed) {
      RunResult r;
      r.config = resolve(c, c.optimizers[o], seed);
      r.summary_names = {"acc", "rare_acc"};
      r.summary = {acc[o][seed], rare[o][seed]};
      results.push_back(r);
    }
  }
  std::ostringstream out;
  report_comparison(c, "synthetic", results, out);
  const std::string verdict =
      "\nPrimary tests of class-imbalanced, named before the runs: fogo - muon on rare_acc, "
      "paired by seed.\nPrimary test: fogo - muon on rare acc (%), paired by seed over 3 seeds: "
      "-5.05 (95% CI -15.64 to 5.55; t = -2.05, df 2.0, p = 0.18; Holm over the one primary test "
      "p = 0.18). Not separated. At the 5% level these seeds detect a difference of about 13.21 "
      "or more with 80% power: a smaller one is neither shown nor ruled out.\nBy rare acc (%) "
      "(higher is better; mean ± sd over 3 seeds): muon 46.01 ± 5.33, fogo 40.96 ± 1.39, adam "
      "39.21 ± 5.99. muon's lead over fogo (5.05) is the primary test above.\n";
  const std::string text = out.str();
  ASSERT_GE(text.size(), verdict.size());
  EXPECT_EQ(text.substr(text.size() - verdict.size()), verdict) << text;
}

TEST(CompareFamily, PrimaryTestsAreNamedPerScenario) {
  const auto is = [](const std::vector<fogo::trainer::DeclaredTest>& t, size_t k,
                     const char* metric) {
    return t.size() > k && t[k].metric == metric && t[k].a == "fogo" && t[k].b == "muon";
  };
  EXPECT_TRUE(is(primary_tests("class-imbalanced"), 0, "rare_acc"));
  EXPECT_EQ(primary_tests("class-imbalanced").size(), 1u);
  EXPECT_TRUE(is(primary_tests("domain-il"), 0, "AF"));
  EXPECT_TRUE(is(primary_tests("class-il"), 0, "AP"));
  EXPECT_TRUE(is(primary_tests("class-il"), 1, "BWT"));
  EXPECT_THROW(primary_tests("mnist"), std::invalid_argument);
  EXPECT_FALSE(higher_is_better("AF"));
  EXPECT_FALSE(higher_is_better("mean_rare_forgetting"));
  EXPECT_TRUE(higher_is_better("BWT"));
  EXPECT_TRUE(higher_is_better("rare_acc"));
}

TEST(Autocast, Bf16IsRefusedOffCuda) {
  const DataSplit data = synthetic_split();
  Config c = small("class-imbalanced", temp_dir());
  c.autocast = "bf16";
  std::ostringstream log;
  try {
    train_run(resolve(c, "adam", 0), data, log);
    FAIL() << "bf16 autocast on the CPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--autocast"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SmokeRun, ::testing::Values("adam", "adamw", "muon", "fogo"));

struct ResumeCase {
  std::string scenario, optimizer, replay;
};

// For readable test names in ctest and failure messages.
std::ostream& operator<<(std::ostream& out, const ResumeCase& c) {
  return out << c.scenario << "/" << c.optimizer << "/replay=" << c.replay;
}

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, EqualsUninterrupted) {
  const DataSplit data = synthetic_split();
  const auto& p = GetParam();
  std::ostringstream log;
  auto config = [&](const std::string& out) {
    Config c = small(p.scenario, out);
    c.replay = p.replay;
    c.buffer_size = 20;
    c.replay_batch = 8;
    c.ckpt_every = 4;
    return resolve(c, p.optimizer, 3);
  };
  const RunResult straight = train_run(config(temp_dir()), data, log);
  ASSERT_TRUE(straight.completed());

  Config c = config(temp_dir());
  const std::string dir = run_dir(c);
  c.stop_at_step = 13;  // early in the second task (tasks of 100 images: 12 steps per task)
  EXPECT_FALSE(train_run(c, data, log).completed());
  const std::string ckpt = dir + "/" + fogo::trainer::kCheckpointFile;
  copy(ckpt, dir + "/at13.pt");
  c.resume = true;
  c.stop_at_step = 20;  // an interrupted session: logs run past the checkpoint we go back to
  train_run(c, data, log);
  copy(dir + "/at13.pt", ckpt);
  c.stop_at_step = 0;
  const RunResult resumed = train_run(c, data, log);
  ASSERT_TRUE(resumed.completed());

  const auto a = model_state(straight), b = model_state(resumed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(torch::equal(a[k], b[k])) << "tensor " << k;
  EXPECT_EQ(read_file(run_dir(straight.config) + "/eval.jsonl"), read_file(dir + "/eval.jsonl"));
  const std::string ta = read_file(run_dir(straight.config) + "/train.jsonl");
  const std::string tb = read_file(dir + "/train.jsonl");
  EXPECT_EQ(field(ta, "step"), field(tb, "step"));
  EXPECT_EQ(field(ta, "loss"), field(tb, "loss"));
  // NaN where a metric is undefined (a rare forget rate with nothing learned) counts as equal.
  ASSERT_EQ(straight.summary.size(), resumed.summary.size());
  for (size_t k = 0; k < straight.summary.size(); ++k) {
    const double a = straight.summary[k], b = resumed.summary[k];
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << k << ": " << a << " vs " << b;
  }
  EXPECT_EQ(straight.x, resumed.x);

  // The wall time is the run's over its sessions, kept in the checkpoint: reloading the finished
  // run (--resume; how scripts/run.sh joins runs of separate processes) reports it plus the
  // reload's own seconds, not the reload's alone.
  const double saved = fogo::trainer::CheckpointReader(ckpt).get_double("wall_seconds");
  EXPECT_GE(saved, resumed.seconds);  // training time is part of the wall time
  EXPECT_LE(saved, resumed.wall_seconds);
  // The run's provenance (runs.jsonl: command, machine, date) is the session that trained it
  // last, kept in the checkpoint: a session that only reloads it does not replace it.
  EXPECT_EQ(fogo::trainer::CheckpointReader(ckpt).get_string("command"), resumed.command);
  EXPECT_EQ(resumed.machine, fogo::trainer::machine_description());
  ASSERT_EQ(resumed.date.size(), 20u) << resumed.date;  // 2026-11-27T10:00:00Z
  EXPECT_EQ(resumed.date.substr(0, 2), "20");
  EXPECT_EQ(resumed.date.back(), 'Z');
  const char* reload_argv[] = {"resnet_train", "--resume", "--out", "a b"};
  fogo::trainer::set_command_line(4, reload_argv);
  EXPECT_EQ(fogo::trainer::command_line(), "resnet_train --resume --out 'a b'");
  const auto start = std::chrono::steady_clock::now();
  const RunResult reloaded = train_run(c, data, log);
  const double reload =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(reloaded.wall_seconds, saved);
  EXPECT_LE(reloaded.wall_seconds, saved + reload);
  EXPECT_EQ(reloaded.command, resumed.command);
  EXPECT_EQ(reloaded.date, resumed.date);
  EXPECT_NE(read_file(dir + "/result.jsonl").find("\"date\":\"" + resumed.date + "\""),
            std::string::npos);
  // Issue 47: the record names the binary's commit and the CPU's ISA, kept in the checkpoint with
  // the rest of the provenance.
  const std::string commit = fogo::trainer::build_commit(), isa = fogo::trainer::cpu_isa();
  ASSERT_FALSE(commit.empty());
  EXPECT_EQ(fogo::trainer::CheckpointReader(ckpt).get_string("commit"), commit);
  EXPECT_EQ(fogo::trainer::CheckpointReader(ckpt).get_string("isa"), isa);
  EXPECT_EQ(reloaded.commit, commit);
  EXPECT_EQ(reloaded.isa, isa);
  const std::string record = read_file(dir + "/result.jsonl");
  EXPECT_NE(record.find("\"commit\":\"" + commit + "\""), std::string::npos) << record;
  EXPECT_NE(record.find("\"isa\":\"" + isa + "\""), std::string::npos) << record;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, Resume,
                         ::testing::Values(ResumeCase{"class-imbalanced", "adam", "none"},
                                           ResumeCase{"class-il", "muon", "derpp"},
                                           ResumeCase{"domain-il", "fogo", "er"}),
                         [](const auto& info) {
                           std::string name = info.param.scenario + "_" + info.param.optimizer;
                           for (char& ch : name)
                             ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

TEST(Resume, RefusesOtherSettings) {
  const DataSplit data = synthetic_split();
  std::ostringstream log;
  Config c = small("class-imbalanced", temp_dir());
  c.stop_at_step = 3;
  train_run(resolve(c, "adam", 0), data, log);
  c.resume = true;
  c.lr = 5e-3;
  try {
    train_run(resolve(c, "adam", 0), data, log);
    FAIL() << "resumed under another --lr";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--lr was 0.001, now 0.005"), std::string::npos)
        << e.what();
  }
  c.lr.reset();
  // The signature holds auto resolved: the dtype this host computes in.
  const std::string here = fogo::trainer::resolved_ns_dtype("auto", torch::Device(torch::kCPU));
  const std::string other = here == "bf16" ? "fp32" : "bf16";
  c.ns_dtype = other;
  try {
    train_run(resolve(c, "adam", 0), data, log);
    FAIL() << "resumed under another --ns-dtype";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--ns-dtype was " + here + ", now " + other),
              std::string::npos)
        << e.what();
  }
  // Without --resume the run's folder is not overwritten silently; --overwrite replaces it.
  c.ns_dtype = here;
  c.resume = false;
  try {
    train_run(resolve(c, "adam", 0), data, log);
    FAIL() << "a rerun overwrote the run";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--out: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds a previous run (checkpoint.pt"), std::string::npos)
        << e.what();
  }
  c.overwrite = true;
  EXPECT_NO_THROW(train_run(resolve(c, "adam", 0), data, log));
}

// The binary's command line: a refused one exits with status 2 and one error line naming the
// flag (a renamed flag names its new name), a failed run with status 1; the same statuses and
// style as gpt2.
TEST(Binary, ExitStatusAndErrorLine) {
  using fogo::trainer::testing::run_command;
  const auto usage = [](const std::string& args) {
    const auto r = run_command(fogo::trainer::testing::resnet_train_binary(), args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    return r.err;
  };
  EXPECT_EQ(usage("--bogus 1"), "resnet_train: error: unknown flag --bogus (see --help)\n");
  EXPECT_EQ(usage("--clip 2"), "resnet_train: error: --clip: now called --grad-clip\n");
  EXPECT_EQ(usage("--stop-after 3"),
            "resnet_train: error: --stop-after: now called --stop-at-step\n");
  EXPECT_EQ(usage("--batch-size x"),
            "resnet_train: error: --batch-size: expected an integer, got 'x'\n");
  EXPECT_EQ(usage("--lr -1"), "resnet_train: error: --lr: must be in (0, 10), got -1\n");
  EXPECT_EQ(usage("--fogo bogus=1").rfind("resnet_train: error: --fogo: unknown option 'bogus'", 0),
            0u);
  EXPECT_EQ(usage("--fogo xi=high"),
            "resnet_train: error: --fogo: xi: expected a number, got 'high'\n");
  EXPECT_EQ(usage("--fogo gamma_st_min=0.5 --fogo gamma_st_max=0.2")
                .rfind("resnet_train: error: --fogo: ", 0),
            0u);
  EXPECT_EQ(usage("--ablation half").rfind("resnet_train: error: --ablation: ", 0), 0u);
  EXPECT_EQ(usage("--autocast fp16"),
            "resnet_train: error: --autocast: expected one of auto,bf16,off, got 'fp16'\n");
  EXPECT_EQ(usage("--data-dir /nonexistent").rfind("resnet_train: error: --data-dir: ", 0), 0u);
  const auto help = run_command(fogo::trainer::testing::resnet_train_binary(), "--help");
  EXPECT_EQ(help.status, 0);
  for (const char* flag : fogo::trainer::testing::kSharedFlags) {
    EXPECT_NE(help.out.find(std::string(flag) + " "), std::string::npos) << flag;
  }

  // A malformed dataset is a failed run.
  const std::string dir = temp_dir();
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::ofstream(dir + "/" + name) << "not an IDX file";
  }
  const auto failed =
      run_command(fogo::trainer::testing::resnet_train_binary(), "--data-dir " + dir);
  EXPECT_EQ(failed.status, 1) << failed.err;
  EXPECT_EQ(failed.err.rfind("resnet_train: error: ", 0), 0u) << failed.err;
}
