// The training loop end to end on a tiny model: loss falls, resume equals an uninterrupted run,
// compare and sample produce their outputs, bad settings fail with the flag's name.
#include <fogo/enum_names.h>
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/checkpoint.h"
#include "common/cli.h"
#include "common/optimizers.h"
#include "common/report.h"
#include "common/testing.h"
#include "test_util.h"
#include "train.h"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;

// The tiny model on the small corpus, 30 steps of batch 8.
class Training : public test::CorpusTest {
 protected:
  TrainConfig config(const std::string& optimizer, const std::string& out) const {
    TrainConfig c = tiny_config(optimizer, out);
    c.max_steps = 30;
    c.batch_size = 8;
    c.eval_every = 10;
    c.log_every = 5;
    return c;
  }

  std::ostringstream log_;
};

TEST_F(Training, SmokeRunLossFalls) {
  for (const char* optimizer : {"adamw", "muon", "fogo"}) {
    const RunResult r = train(config(optimizer, optimizer), log_);
    ASSERT_EQ(r.val_loss.size(), 4u);  // step 0, 10, 20, 30
    EXPECT_NEAR(r.val_loss.front().value, std::log(256.0), 0.3) << optimizer;
    EXPECT_LT(r.val_loss.back().value, r.val_loss.front().value - 1.0) << optimizer;
    EXPECT_LT(r.train_loss.back().value, r.train_loss.front().value) << optimizer;
    EXPECT_GT(r.tokens_per_second, 0);
    ASSERT_EQ(r.step_seconds.size(), 30u);
    ASSERT_EQ(r.optimizer_seconds.size(), 30u);
    for (size_t k = 0; k < r.step_seconds.size(); ++k)
      EXPECT_LT(r.optimizer_seconds[k], r.step_seconds[k]) << optimizer << " step " << k;
    EXPECT_TRUE(fs::exists(dir_ / optimizer / fogo::trainer::kCheckpointFile));
    EXPECT_TRUE(fs::exists(dir_ / optimizer / "metrics.csv"));
    std::ifstream jsonl(dir_ / optimizer / "metrics.jsonl");
    std::string first;
    std::getline(jsonl, first);
    EXPECT_NE(first.find("\"train_loss\""), std::string::npos) << first;
    // The applied update's RMS for every param group (AdamW's "rest.0" in every optimizer).
    EXPECT_NE(first.find("\"update_rms/rest.0\":"), std::string::npos) << first;
    if (std::string(optimizer) == "fogo") {  // telemetry of each codebook, named by module
      EXPECT_NE(first.find("\"update_rms/attn.c_attn\":"), std::string::npos) << first;
      for (const char* key : {"fogo/attn.c_attn/rbar", "fogo/attn.c_proj/gamma_st",
                              "fogo/mlp.c_fc/codebook_entropy", "fogo/mlp.c_proj/frozen"}) {
        EXPECT_NE(first.find(key), std::string::npos) << key << " not in " << first;
      }
    }
  }
}

// --qk-clip (issue 46): Muon at ten times its usual lr lets the logits grow; with the clip the
// recorded largest logit (each step's, before its clip) stays far below the unclipped run's, and
// with a threshold above every logit (1e30) the run records without clipping.
TEST_F(Training, QkClipHoldsTheLogitsTheUnclippedRunLetsGrow) {
  const auto max_logits = [&](double tau, const std::string& out) {
    TrainConfig c = config("muon", out);
    c.optimizer.muon_adjust = "original";
    c.optimizer.matrix_lr = 0.2;
    c.log_every = 1;
    c.qk_clip = tau;
    train(c, log_);
    std::vector<double> out_values;
    std::ifstream jsonl(dir_ / out / "metrics.jsonl");
    for (std::string line; std::getline(jsonl, line);) {
      const size_t at = line.find("\"max_logit\":");
      EXPECT_NE(at, std::string::npos) << line;
      if (at != std::string::npos) out_values.push_back(std::stod(line.substr(at + 12)));
    }
    return out_values;
  };
  const auto free = max_logits(1e30, "qk-free"), clipped = max_logits(3.0, "qk-clipped");
  ASSERT_EQ(free.size(), 30u);
  ASSERT_EQ(clipped.size(), 30u);
  EXPECT_GT(*std::max_element(free.begin(), free.end()), 4 * 3.0) << "the logits did not grow";
  // After the first step each forward starts from weights clipped at 3: one update's growth.
  for (size_t k = 1; k < clipped.size(); ++k) EXPECT_LT(clipped[k], 2 * 3.0) << "step " << k + 1;
}

TEST_F(Training, Bf16AutocastPathTrains) {
  // The CUDA default, exercised here through CPU autocast: the forward pass (SDPA, RoPE,
  // linears) in bf16, the loss in fp32.
  TrainConfig c = config("muon", "bf16");
  c.autocast = "bf16";
  c.max_steps = 20;
  const RunResult r = train(c, log_);
  EXPECT_LT(r.val_loss.back().value, r.val_loss.front().value - 0.5);
  EXPECT_NE(r.device.find("bf16 autocast"), std::string::npos) << r.device;
}

TEST_F(Training, ValidationSetDoesNotDependOnTheBatchSize) {
  // The step-0 validation loss is a function of the initial weights and the validation set
  // alone: with the same seed it must not move when only --batch-size does (16 windows in
  // chunks of 8, or of 5, 5, 5, 1).
  std::vector<double> first;
  for (const int64_t batch : {8, 5}) {
    TrainConfig c = config("adamw", "batch" + std::to_string(batch));
    c.batch_size = batch;
    c.max_steps = 1;
    const RunResult r = train(c, log_);
    ASSERT_FALSE(r.val_loss.empty());
    EXPECT_EQ(r.val_loss.front().step, 0);
    first.push_back(r.val_loss.front().value);
  }
  EXPECT_NEAR(first[0], first[1], 1e-5);
  // The windows themselves: one set of 16, however it is cut.
  const Corpus corpus = load_corpus(config("adamw", "x").data);
  Batcher val(corpus.val, "val", 32, 256, 0);
  const auto whole = val.eval_windows(0, 16, 16).first;
  const auto parts =
      torch::cat({val.eval_windows(0, 5, 16).first, val.eval_windows(5, 15, 16).first,
                  val.eval_windows(15, 16, 16).first});
  EXPECT_TRUE(torch::equal(whole, parts));
  EXPECT_TRUE(torch::equal(val.eval_batch(1, 2, 8).first, whole.slice(0, 8, 16)));
}

TEST_F(Training, LrSweepTunesOnHeldOutTrainingDataAndComparesSeeds) {
  // The tuning split: the tail of every training span, disjoint from what is trained on, and
  // not the validation split.
  TrainConfig base = config("adamw", "sweep");
  const Corpus plain = load_corpus(base.data);
  base.data.tune_fraction = 0.2;
  const Corpus tuned = load_corpus(base.data);
  EXPECT_EQ(tuned.train.num_tokens() + tuned.val.num_tokens(), plain.train.num_tokens());
  EXPECT_NEAR(static_cast<double>(tuned.val.num_tokens()),
              0.2 * static_cast<double>(plain.train.num_tokens()),
              static_cast<double>(plain.train.num_spans()));
  EXPECT_EQ(tuned.train.num_spans(), plain.train.num_spans());

  TrainConfig c = config("adamw", "sweep");
  c.max_steps = 10;
  c.eval_every = 10;
  SweepOptions sweep{{"adamw", "muon"}, {0.5, 2.0}, {1, 2, 3}, 0.1, false};
  const SweepOutcome s = lr_sweep(c, sweep, log_);
  ASSERT_EQ(s.points.size(), 4u);
  for (const char* opt : {"adamw", "muon"}) {
    double best = std::numeric_limits<double>::infinity(), factor = 0;
    for (const auto& p : s.points) {
      if (p.optimizer == opt && p.tune_loss < best) best = p.tune_loss, factor = p.factor;
    }
    EXPECT_EQ(s.chosen.at(opt), factor) << opt;
    ASSERT_EQ(s.finals.at(opt).size(), 3u);
    EXPECT_TRUE(fs::exists(dir_ / "sweep" / (std::string(opt) + "-seed3") / "metrics.jsonl"));
    EXPECT_TRUE(
        fs::exists(dir_ / "sweep" / "sweep" / (std::string(opt) + "-x2") / "metrics.jsonl"));
  }
  EXPECT_EQ(s.points[1].lr, 2.0 * 3e-3);
  std::ifstream md(dir_ / "sweep" / "sweep.md");
  std::stringstream text;
  text << md.rdbuf();
  // Both ran seeds 1, 2, 3: the test is paired by seed, in the secondary family (no fogo here,
  // so no primary test).
  EXPECT_NE(text.str().find("| secondary | val_loss | adamw | muon | paired, 3 |"),
            std::string::npos)
      << text.str();
  sweep.seeds = {1, 2};
  test::expect_error([&] { lr_sweep(c, sweep, log_); }, {"--seeds", ">= 3"});
}

// --sweep-seeds and --sweep-extend (issue 34's protocol for the GPT-2 toy): each grid point is
// the mean over the first sweep seeds, and while the best factor is at an edge the grid grows
// beyond it by the grid's own ratio, at most --sweep-extend times.
TEST_F(Training, LrSweepScoresOnSweepSeedsAndExtendsAtAnEdge) {
  TrainConfig c = config("adamw", "sweep-extend");
  c.max_steps = 6;
  c.eval_every = 6;
  // Tiny lrs (3e-3 x 0.01, 0.02): the loss falls with the lr, so the best is the top edge.
  SweepOptions sweep{{"adamw"}, {0.02, 0.01}, {1, 2, 3}, 0.1, false, 2, 2};
  const SweepOutcome s = lr_sweep(c, sweep, log_);
  ASSERT_EQ(s.points.size(), 4u);
  const double factors[4] = {0.01, 0.02, 0.04, 0.08};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_DOUBLE_EQ(s.points[k].factor, factors[k]) << k;
    ASSERT_EQ(s.points[k].seed_losses.size(), 2u) << k;
    EXPECT_DOUBLE_EQ(s.points[k].tune_loss,
                     (s.points[k].seed_losses[0] + s.points[k].seed_losses[1]) / 2)
        << k;
    EXPECT_NE(s.points[k].seed_losses[0], s.points[k].seed_losses[1]) << k;  // two seeds
  }
  EXPECT_LT(s.points[3].tune_loss, s.points[1].tune_loss);
  EXPECT_EQ(s.chosen.at("adamw"), 0.08);
  EXPECT_TRUE(s.at_edge.at("adamw"));  // still at the top after the two added factors
  EXPECT_TRUE(fs::exists(dir_ / "sweep-extend" / "sweep" / "adamw-x0.08-seed2" / "metrics.jsonl"));
  std::ifstream md(dir_ / "sweep-extend" / "sweep.md");
  std::stringstream text;
  text << md.rdbuf();
  EXPECT_NE(text.str().find("yes (grid edge)"), std::string::npos) << text.str();
  sweep.sweep_seeds = 4;
  test::expect_error([&] { lr_sweep(c, sweep, log_); }, {"--sweep-seeds", "1..3"});
}

void expect_same_run(const RunResult& a, const RunResult& b) {
  auto pa = a.trained->named_parameters(), pb = b.trained->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].value(), pb[i].value())) << pa[i].key();
  }
  ASSERT_EQ(a.val_loss.size(), b.val_loss.size());
  for (size_t i = 0; i < a.val_loss.size(); ++i) {
    EXPECT_EQ(a.val_loss[i].value, b.val_loss[i].value) << i;
  }
  ASSERT_EQ(a.train_loss.size(), b.train_loss.size());
  for (size_t i = 0; i < a.train_loss.size(); ++i) {
    EXPECT_EQ(a.train_loss[i].step, b.train_loss[i].step);
    EXPECT_EQ(a.train_loss[i].value, b.train_loss[i].value) << i;
  }
}

TEST_F(Training, ResumeEqualsUninterruptedBitwise) {
  // FOGO (streams, codebooks, re-seeding) and Muon have state; classic + dropout exercises the
  // per-step RNG; the stop at step 13 falls inside a logging interval (log_every 5), a schedule
  // warmup and between evaluations.
  for (const auto& [optimizer, arch, dropout] :
       {std::tuple{"fogo", "paper", 0.0}, std::tuple{"muon", "paper", 0.0},
        std::tuple{"adamw", "classic", 0.1}}) {
    TrainConfig c = config(optimizer, std::string("full_") + optimizer);
    c.arch = arch;
    c.dropout = dropout;
    c.max_steps = 20;
    c.warmup_steps = 15;
    const RunResult full = train(c, log_);

    c.out_dir = (dir_ / (std::string("split_") + optimizer)).string();
    c.stop_at_step = 13;
    const RunResult first = train(c, log_);
    EXPECT_EQ(first.train_loss.back().step, 10);
    c.stop_at_step = 0;
    c.resume = true;
    const RunResult resumed = train(c, log_);
    expect_same_run(full, resumed);

    // The metrics file holds each step once, as if never interrupted.
    std::ifstream csv(fs::path(c.out_dir) / "metrics.csv");
    int lines = 0;
    for (std::string line; std::getline(csv, line);) ++lines;
    EXPECT_EQ(lines, 1 + 4) << "a header and steps 5, 10, 15, 20";

    // Issue 47: each of the two sessions left a provenance record naming the binary's commit,
    // the CPU's ISA and the machine, from the step it started at.
    std::ifstream prov(fs::path(c.out_dir) / "provenance.jsonl");
    std::vector<std::string> records;
    for (std::string line; std::getline(prov, line);) records.push_back(line);
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records[0].rfind("{\"step\":0,", 0), 0u) << records[0];
    EXPECT_EQ(records[1].find("{\"step\":0,"), std::string::npos) << records[1];
    for (const auto& r : records) {
      EXPECT_NE(r.find("\"commit\":\"" + fogo::trainer::build_commit() + "\""), std::string::npos)
          << r;
      EXPECT_NE(r.find("\"isa\":\"" + fogo::trainer::cpu_isa() + "\""), std::string::npos) << r;
      EXPECT_NE(r.find("\"machine\":\""), std::string::npos) << r;
    }
  }
}

int64_t step_of(const fs::path& checkpoint) {
  return fogo::trainer::CheckpointReader(checkpoint.string()).get_int("step");
}

TEST_F(Training, CheckpointsAtEveryEvaluationAndKeepsTheBest) {
  // At this rate the validation loss bottoms out before the last step, so the test can tell
  // best.pt from the last checkpoint.
  TrainConfig c = config("adamw", "ckpt");
  c.optimizer.lr = 1e-2;
  c.eval_every = 2;
  const fs::path ckpt = fs::path(c.out_dir) / fogo::trainer::kCheckpointFile,
                 best = fs::path(c.out_dir) / fogo::trainer::kBestCheckpointFile;
  Trainer trainer(c, log_);
  EXPECT_FALSE(fs::exists(ckpt)) << "a checkpoint of the untrained model";
  trainer.advance();
  EXPECT_FALSE(fs::exists(ckpt)) << "a checkpoint before the first evaluation";
  trainer.advance();
  EXPECT_EQ(step_of(ckpt), 2);
  EXPECT_EQ(step_of(best), 2);
  trainer.advance();
  EXPECT_EQ(step_of(ckpt), 2) << "a checkpoint between evaluations";
  while (!trainer.done()) trainer.advance();
  const RunResult r = trainer.finish();
  EXPECT_EQ(step_of(ckpt), 30);
  Point lowest{.value = std::numeric_limits<double>::infinity()};
  for (const Point& p : r.val_loss) {
    if (p.step > 0 && p.value < lowest.value) lowest = p;
  }
  ASSERT_NE(lowest.step, r.val_loss.back().step) << "the loss fell to the end: raise the lr";
  EXPECT_EQ(step_of(best), lowest.step);
  // best.pt is a whole checkpoint, written at that evaluation: its history ends with the
  // lowest loss, and it samples.
  const auto history = fogo::trainer::CheckpointReader(best.string()).get_tensor("history_val");
  EXPECT_EQ(history[-1][2].item<double>(), lowest.value);
  SampleConfig s;
  s.checkpoint = best.string();
  s.tokens = 5;
  EXPECT_EQ(sample(s).size(), 1u + 5u);

  // With --ckpt-every the periodic checkpoint follows it; best.pt still follows evaluations.
  c.out_dir = (dir_ / "ckpt_every").string();
  c.ckpt_every = 3;
  Trainer periodic(c, log_);
  periodic.advance();
  periodic.advance();
  EXPECT_FALSE(fs::exists(fs::path(c.out_dir) / fogo::trainer::kCheckpointFile));
  EXPECT_EQ(step_of(fs::path(c.out_dir) / fogo::trainer::kBestCheckpointFile), 2);
  periodic.advance();
  EXPECT_EQ(step_of(fs::path(c.out_dir) / fogo::trainer::kCheckpointFile), 3);
}

// A rerun into a folder holding a run overwrote it silently (metrics truncated, checkpoint.pt
// replaced, the old best.pt left beside the new run); two jobs on one --out mixed their files.
TEST_F(Training, AFolderHoldingARunIsNeitherOverwrittenNorShared) {
  TrainConfig c = config("adamw", "used");
  c.max_steps = 4;
  c.eval_every = 2;
  train(c, log_);
  const fs::path out(c.out_dir);
  const auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string metrics = read(out / "metrics.jsonl");
  ASSERT_TRUE(fs::exists(out / fogo::trainer::kBestCheckpointFile));
  test::expect_error([&] { train(c, log_); },
                     {"--out: ",
                      "holds a previous run (checkpoint.pt, best.pt, metrics.jsonl, "
                      "metrics.csv)",
                      "--resume", "--overwrite"});
  EXPECT_EQ(read(out / "metrics.jsonl"), metrics);
  EXPECT_EQ(step_of(out / fogo::trainer::kCheckpointFile), 4);
  // While one run holds the folder, a second (even a --resume of it) is refused.
  {
    TrainConfig again = c;
    again.resume = true;
    Trainer running(again, log_);
    test::expect_error([&] { train(again, log_); }, {"--out: ", "is in use by another run"});
  }
  // --overwrite replaces the run whole: a run that keeps no best.pt leaves none of the old one.
  c.overwrite = true;
  c.stop_at_step = 1;
  train(c, log_);
  EXPECT_FALSE(fs::exists(out / fogo::trainer::kBestCheckpointFile));
  EXPECT_EQ(step_of(out / fogo::trainer::kCheckpointFile), 1);
  EXPECT_NE(read(out / "metrics.jsonl"), metrics);
}

TEST_F(Training, ResumeRejectsADifferentRun) {
  TrainConfig c = config("adamw", "run");
  c.max_steps = 4;
  train(c, log_);
  c.resume = true;
  c.optimizer.name = "muon";
  test::expect_error([&] { train(c, log_); },
                     {"--resume: checkpoint '", "belongs to a run with other settings",
                      "--optimizer was adamw, now muon"});
}

// A run folder of the days of ckpt.pt is not silently restarted by --resume.
TEST_F(Training, ResumeNamesTheFormerCheckpointFile) {
  TrainConfig c = config("adamw", "former");
  fs::create_directories(c.out_dir);
  std::ofstream(fs::path(c.out_dir) / "ckpt.pt") << "an old checkpoint";
  c.resume = true;
  try {
    train(c, log_);
    ADD_FAILURE() << "resumed past a ckpt.pt";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--resume: found "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ckpt.pt, the former name of checkpoint.pt"),
              std::string::npos)
        << e.what();
  }
  c.resume = false;  // without --resume the run starts afresh, as any
  c.max_steps = 2;
  EXPECT_NO_THROW(train(c, log_));
}

// The signature holds --ns-dtype with auto resolved (the dtype the run computed in): the other
// dtype is refused, the same one given explicitly continues the run.
TEST_F(Training, ResumeRejectsAnotherNewtonSchulzDtype) {
  TrainConfig c = config("muon", "ns");
  ASSERT_EQ(c.optimizer.ns_dtype, "auto");
  const std::string here = fogo::trainer::resolved_ns_dtype("auto", torch::Device(torch::kCPU));
  const std::string other = here == "bf16" ? "fp32" : "bf16";
  c.max_steps = 4;
  c.stop_at_step = 2;
  train(c, log_);
  c.resume = true;
  c.optimizer.ns_dtype = other;
  test::expect_error([&] { train(c, log_); },
                     {"--resume", "--ns-dtype was " + here + ", now " + other});
  c.optimizer.ns_dtype = here;
  c.stop_at_step = 3;
  EXPECT_NO_THROW(train(c, log_));
}

// Each of these changes the trajectory while keeping the tokens per step (and so the step
// count): a resume under any of them is refused, naming the flag and both values.
TEST_F(Training, ResumeRejectsEveryTrajectorySetting) {
  TrainConfig base = config("adamw", "changed");
  base.max_steps = 4;
  base.batch_size = 4;
  base.grad_accum = 2;
  base.stop_at_step = 2;
  train(base, log_);
  base.stop_at_step = 0;
  base.resume = true;
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>> changes{
      {[](TrainConfig& c) { std::swap(c.batch_size, c.grad_accum); },
       "--batch-size was 4, now 2; --grad-accum was 2, now 4"},
      {[](TrainConfig& c) { c.batch_size = 8, c.grad_accum = 1; }, "--batch-size was 4, now 8"},
      {[](TrainConfig& c) { c.dropout = 0.1; }, "--dropout was 0, now 0.1"},
      {[](TrainConfig& c) { c.seed = 7; }, "--seed was 1337, now 7"},
      {[](TrainConfig& c) { c.autocast = "bf16"; }, "--autocast was off, now bf16"},
      {[](TrainConfig& c) { c.data.val_fraction = 0.2; }, "--val-fraction was 0.1, now 0.2"}};
  for (const auto& [change, expected] : changes) {
    TrainConfig c = base;
    change(c);
    test::expect_error([&] { train(c, log_); }, {"--resume: checkpoint '", expected});
  }
  // What stays out of the signature may change: the run continues to its end.
  TrainConfig c = base;
  c.log_every = 1;
  c.peak_tflops = 1;
  EXPECT_EQ(train(c, log_).val_loss.back().step, 4);
}

TEST_F(Training, CompareWritesTableAndPlot) {
  TrainConfig c = config("adamw", "cmp");
  c.max_steps = 10;
  c.eval_every = 5;
  const auto runs = compare(c, {"adamw", "muon"}, log_);
  ASSERT_EQ(runs.size(), 2u);
  // Same data order and budget: identical evaluated token counts.
  ASSERT_EQ(runs[0].val_loss.size(), runs[1].val_loss.size());
  for (size_t i = 0; i < runs[0].val_loss.size(); ++i) {
    EXPECT_EQ(runs[0].val_loss[i].tokens, runs[1].val_loss[i].tokens);
  }
  std::ifstream md(dir_ / "cmp" / "compare.md");
  std::stringstream text;
  text << md.rdbuf();
  EXPECT_NE(text.str().find("| tokens"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("muon"), std::string::npos);
  if (fogo::trainer::gnuplot_available()) EXPECT_TRUE(fs::exists(dir_ / "cmp" / "loss.png"));
}

TEST_F(Training, SampleGeneratesTextFromACheckpoint) {
  TrainConfig c = config("adamw", "s");
  c.max_steps = 5;
  train(c, log_);
  SampleConfig s;
  s.checkpoint = (dir_ / "s" / fogo::trainer::kCheckpointFile).string();
  s.prompt = "And God";
  s.tokens = 20;
  const std::string a = sample(s);
  EXPECT_EQ(a.size(), 7u + 20u);
  EXPECT_EQ(a.substr(0, 7), "And God");
  EXPECT_EQ(sample(s), a);
  s.checkpoint = (dir_ / "missing.pt").string();
  EXPECT_THROW(sample(s), std::exception);
}

TEST_F(Training, BadSettingsNameTheFlag) {
  // A bad value is a refused command line (std::invalid_argument, exit status 2) naming the
  // flag; a divergent run is a failure of the run (status 1).
  auto expect_flag = [&](TrainConfig c, const std::string& flag) {
    try {
      train(c, log_);
      ADD_FAILURE() << "accepted a bad " << flag;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  TrainConfig c = config("adamw", "bad");
  c.batch_size = 0;
  expect_flag(c, "--batch-size");
  c = config("adamw", "bad");
  c.optimizer.lr = -1;
  expect_flag(c, "--lr");
  c = config("adamw", "bad");
  c.vocab_size = 100;
  expect_flag(c, "--vocab-size");
  c = config("adamw", "bad");
  c.warmup_steps = 100;
  expect_flag(c, "--warmup-steps");
  c = config("adamw", "bad");
  c.n_head = 3;
  expect_flag(c, "--n-embd");
  // Sizes only the data and the machine bound: before, std::bad_alloc, or what looked like a hang.
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>> absurd = {
      {[](TrainConfig& t) { t.batch_size = 1000000000000; },
       "--batch-size: 1000000000000 sequences of 32 tokens need"},
      {[](TrainConfig& t) { t.eval_sequences = 1000000000; },
       "--eval-sequences: 1000000000 is more than the validation split's"},
      {[](TrainConfig& t) { t.threads = 1000000; }, "--threads: must be in [0, "}};
  for (const auto& [set, flag] : absurd) {
    c = config("adamw", "bad");
    set(c);
    expect_flag(c, flag);
  }
  // A divergent run stops with an error instead of logging NaN. Weight decay 0: with it, lr 1e30
  // is refused before the first step (lr x weight_decay > 1 makes the decay factor negative).
  c = config("adamw", "bad");
  c.optimizer.lr = 1e30;
  c.optimizer.weight_decay = 0;
  c.grad_clip = 0;
  try {
    train(c, log_);
    ADD_FAILURE() << "a divergent run went on";
  } catch (const std::invalid_argument& e) {
    ADD_FAILURE() << "a divergent run reported as a bad flag: " << e.what();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("non-finite"), std::string::npos);
  }
}

// What `gpt2 train` and `gpt2 compare` parse from a command line.
TrainConfig parse_train_flags(std::vector<const char*> args) {
  TrainConfig c;
  std::string format = "auto";
  fogo::trainer::Cli cli("gpt2 train", "");
  add_train_flags(cli, c, format);
  args.insert(args.begin(), "train");
  EXPECT_TRUE(cli.parse(static_cast<int>(args.size()), args.data()));
  return c;
}

// The Newton-Schulz dtype of every param group of the matrix side (Muon or FOGO).
std::vector<c10::ScalarType> ns_dtypes(const OptimizerConfig& config, const GPT& model) {
  Optimizer opt = make_optimizer(config, *model);
  std::vector<c10::ScalarType> out;
  for (const auto& group : opt.hybrid.matrix()->param_groups()) {
    if (config.name == "muon") {
      out.push_back(static_cast<const fogo::MuonOptions&>(group.options()).ns_dtype());
    } else {
      out.push_back(static_cast<const fogo::FOGOOptions&>(group.options()).ns_dtype());
    }
  }
  return out;
}

TEST(StepTimes, SummaryIsTheMedianAfterTheFirstFiveSteps) {
  RunResult r;
  r.tokens_per_step = 1000;
  // Five slow start-up steps, then steps of 10, 30 and 20 ms with optimizer parts of 2, 9, 4.
  r.step_seconds = {9, 9, 9, 9, 9, 0.010, 0.030, 0.020};
  r.optimizer_seconds = {1, 1, 1, 1, 1, 0.002, 0.009, 0.004};
  EXPECT_EQ(step_time_summary(r),
            "steady state (steps 6-8): median step 20.00 ms, optimizer 4.00 ms (20.0% of the "
            "step), 50000 tokens/s");
  r.mfu = 0.1;  // MFU scales with throughput: 0.1 at 500 tokens/s is 10 at 50,000
  r.tokens_per_second = 500;
  EXPECT_NE(step_time_summary(r).find(", MFU 1000.0%"), std::string::npos);
  // Data-parallel: the median wait for the gradient all-reduce, and its share of the step.
  r.world_size = 2;
  r.gradient_wait_seconds = {1, 1, 1, 1, 1, 0.001, 0.003, 0.005};
  EXPECT_NE(step_time_summary(r).find("gradient all-reduce wait 3.00 ms (15.0%)"),
            std::string::npos)
      << step_time_summary(r);
  r.step_seconds.resize(5);
  EXPECT_EQ(step_time_summary(r), "steady state: fewer than 6 steps timed");
}

TEST(Flags, NsDtypeParsesAndReachesMuonAndFogo) {
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  EXPECT_EQ(parse_train_flags({}).optimizer.ns_dtype, "auto");  // the library defaults
  for (const char* name : {"muon", "fogo"}) {
    for (const auto& [flag, dtype] :
         {std::pair{"bf16", c10::kBFloat16}, std::pair{"fp32", c10::kFloat}}) {
      const TrainConfig c = parse_train_flags({"--optimizer", name, "--ns-dtype", flag});
      EXPECT_EQ(c.optimizer.ns_dtype, flag);
      const auto dtypes = ns_dtypes(c.optimizer, model);
      ASSERT_EQ(dtypes.size(), std::string(name) == "muon" ? 1u : 4u) << name;
      for (const auto d : dtypes) EXPECT_EQ(d, dtype) << name << " --ns-dtype " << flag;
    }
    const TrainConfig c = parse_train_flags({"--optimizer", name});
    for (const auto d : ns_dtypes(c.optimizer, model)) EXPECT_EQ(d, fogo::kNSDtypeAuto) << name;
  }
  // AdamW takes the flag and ignores it.
  const TrainConfig adamw = parse_train_flags({"--optimizer", "adamw", "--ns-dtype", "fp32"});
  EXPECT_EQ(make_optimizer(adamw.optimizer, *model).hybrid.matrix(), nullptr);

  // A bad value names the flag: on the command line, and in a config built in code.
  try {
    parse_train_flags({"--ns-dtype", "fp16"});
    ADD_FAILURE() << "accepted --ns-dtype fp16";
  } catch (const fogo::trainer::CliError& e) {
    EXPECT_EQ(std::string(e.what()), "--ns-dtype: expected one of auto,bf16,fp32, got 'fp16'");
  }
  OptimizerConfig bad;
  bad.name = "fogo";
  bad.ns_dtype = "fp16";
  test::expect_error([&] { make_optimizer(bad, *model); },
                     {"--ns-dtype: expected one of auto,bf16,fp32, got 'fp16'"});
}

// --muon-momentum reaches Muon's param group (issue 34 sweeps it: 0.8, 0.9, 0.95), is part of a
// run's signature when it is not the default, and a value outside [0, 1) names the flag.
TEST(Flags, MuonMomentumParsesAndReachesMuon) {
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  const auto momentum = [&](const TrainConfig& c) {
    Optimizer opt = make_optimizer(c.optimizer, *model);
    const auto& groups = opt.hybrid.matrix()->param_groups();
    EXPECT_EQ(groups.size(), 1u);
    return static_cast<const fogo::MuonOptions&>(groups.front().options()).momentum();
  };
  EXPECT_DOUBLE_EQ(momentum(parse_train_flags({"--optimizer", "muon"})), 0.95);
  const TrainConfig c = parse_train_flags({"--optimizer", "muon", "--muon-momentum", "0.8"});
  EXPECT_DOUBLE_EQ(c.optimizer.muon_momentum, 0.8);
  EXPECT_DOUBLE_EQ(momentum(c), 0.8);
  OptimizerConfig bad;
  bad.name = "muon";
  bad.muon_momentum = 1.0;
  test::expect_error([&] { make_optimizer(bad, *model); },
                     {"--muon-momentum: must be in [0, 1), got 1"});
}

// --muon-adjust spectral and --muon-normuon (issue 36) reach Muon's param group.
TEST(Flags, MuonSpectralAndNorMuonReachMuon) {
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  const auto options = [&](const TrainConfig& c) {
    Optimizer opt = make_optimizer(c.optimizer, *model);
    return static_cast<const fogo::MuonOptions&>(
        opt.hybrid.matrix()->param_groups().front().options());
  };
  const auto plain = options(parse_train_flags({"--optimizer", "muon"}));
  EXPECT_FALSE(plain.normuon());
  EXPECT_EQ(plain.adjust_lr(), fogo::MuonAdjustLR::MatchRmsAdamW);
  const auto c =
      parse_train_flags({"--optimizer", "muon", "--muon-adjust", "spectral", "--muon-normuon"});
  const auto o = options(c);
  EXPECT_TRUE(o.normuon());
  EXPECT_EQ(o.adjust_lr(), fogo::MuonAdjustLR::Spectral);
}

// --muon-adjust takes the library's names and aliases (fogo/enum_names.h, the list Python reads)
// and this trainer's match_rms for match_rms_adamw; --help lists them from the library, and the run
// signature records one spelling per rule, the one checkpoints recorded before (match_rms).
TEST(Flags, MuonAdjustTakesTheLibrarysNamesAndTheTrainersAlias) {
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  const auto rule = [&](const char* name) {
    Optimizer opt = make_optimizer(
        parse_train_flags({"--optimizer", "muon", "--muon-adjust", name}).optimizer, *model);
    return static_cast<const fogo::MuonOptions&>(
               opt.hybrid.matrix()->param_groups().front().options())
        .adjust_lr();
  };
  fogo::trainer::Cli cli("gpt2 train", "");
  TrainConfig config;
  std::string format;
  add_train_flags(cli, config, format);
  const std::string help = cli.help();
  for (const auto& [name, value] : fogo::EnumNames<fogo::MuonAdjustLR>::values) {
    EXPECT_EQ(rule(name), value) << name;
    EXPECT_NE(help.find(name), std::string::npos) << name;
  }
  for (const auto& [name, value] : fogo::EnumAliases<fogo::MuonAdjustLR>::values) {
    EXPECT_EQ(rule(name), value) << name;
    EXPECT_EQ(fogo::trainer::muon_adjust_signature(name), fogo::enum_name(value)) << name;
  }
  EXPECT_EQ(rule("match_rms"), fogo::MuonAdjustLR::MatchRmsAdamW);
  EXPECT_NE(help.find("match_rms for match_rms_adamw (this trainer's alias)"), std::string::npos);
  EXPECT_EQ(fogo::trainer::muon_adjust_signature("match_rms_adamw"), "match_rms");
  EXPECT_EQ(fogo::trainer::muon_adjust_signature("match_rms"), "match_rms");
  EXPECT_EQ(fogo::trainer::muon_adjust_signature("original"), "original");
  test::expect_error([&] { parse_train_flags({"--muon-adjust", "rms"}); }, {"--muon-adjust"});
  OptimizerConfig bad;
  bad.muon_adjust = "rms";
  test::expect_error([&] { validate(bad); },
                     {"--muon-adjust: expected one of original,match_rms_adamw,spectral,"
                      "spectral_unclamped,match_rms, got 'rms'"});
}

// --muon-ns-steps, --muon-ns-schedule and --muon-extra-scale (issue 46) reach Muon's param group;
// a list longer than the steps, an unknown name and a negative scale are refused naming the flag.
TEST(Flags, MuonNewtonSchulzListAndExtraScaleReachMuon) {
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  const auto options = [&](const TrainConfig& c) {
    Optimizer opt = make_optimizer(c.optimizer, *model);
    return static_cast<const fogo::MuonOptions&>(
        opt.hybrid.matrix()->param_groups().front().options());
  };
  const auto plain = options(parse_train_flags({"--optimizer", "muon"}));
  EXPECT_TRUE(plain.ns_coefficient_schedule().empty());
  EXPECT_EQ(plain.extra_scale_factor(), 1.0);
  const auto o = options(
      parse_train_flags({"--optimizer", "muon", "--muon-ns-steps", "10", "--muon-ns-schedule",
                         "deepseek_v4", "--muon-extra-scale", "0.2"}));
  EXPECT_EQ(o.ns_steps(), 10);
  EXPECT_EQ(o.ns_coefficient_schedule(), fogo::ns_named_schedule("deepseek_v4"));
  EXPECT_EQ(o.extra_scale_factor(), 0.2);
  EXPECT_EQ(options(parse_train_flags(
                        {"--optimizer", "muon", "--muon-ns-schedule", "2,-1.5,0.5;1.5,-0.5,0"}))
                .ns_coefficient_schedule(),
            (fogo::NSSchedule{{2.0, -1.5, 0.5}, {1.5, -0.5, 0.0}}));
  OptimizerConfig bad;
  bad.name = "muon";
  bad.muon_ns_schedule = "deepseek_v4";  // 10 rows, 5 steps
  test::expect_error([&] { make_optimizer(bad, *model); },
                     {"--muon-ns-schedule: Muon: option 'ns_coefficient_schedule' lists 10"});
  bad.muon_ns_schedule = "polar";
  test::expect_error([&] { make_optimizer(bad, *model); },
                     {"--muon-ns-schedule: expected one of keller_jordan"});
  bad.muon_ns_schedule = "";
  bad.muon_extra_scale = -1.0;
  test::expect_error([&] { make_optimizer(bad, *model); },
                     {"--muon-extra-scale: Muon: option 'extra_scale_factor'"});
}

// The binary's command line: a refused one exits with status 2 and one error line naming the
// flag, a failed run with status 1; the same statuses and style as resnet_train.
TEST(Binary, ExitStatusAndErrorLine) {
  using fogo::trainer::testing::run_command;
  const auto usage = [](const std::string& args) {
    const auto r = run_command(fogo::trainer::testing::gpt2_binary(), args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    return r.err;
  };
  EXPECT_EQ(usage("train --bogus 1"), "gpt2: error: unknown flag --bogus (see --help)\n");
  EXPECT_EQ(usage("train --batch-size x"),
            "gpt2: error: --batch-size: expected an integer, got 'x'\n");
  EXPECT_EQ(usage("train --batch-size 0"), "gpt2: error: --batch-size: must be >= 1, got 0\n");
  EXPECT_EQ(usage("train --lr -1"), "gpt2: error: --lr: must be > 0, got -1\n");
  EXPECT_EQ(usage("train --data /nonexistent/corpus.txt"),
            "gpt2: error: --data: /nonexistent/corpus.txt does not exist\n");
  // Every FOGOOptions field by name; an unknown key or a bad value names --fogo and the key.
  EXPECT_EQ(usage("train --fogo bogus=1").rfind("gpt2: error: --fogo: unknown option 'bogus'", 0),
            0u);
  EXPECT_EQ(usage("train --fogo xi=high"),
            "gpt2: error: --fogo: xi: expected a number, got 'high'\n");
  EXPECT_EQ(usage("train --ablation half").rfind("gpt2: error: --ablation: ", 0), 0u);
  EXPECT_EQ(usage("train --eval-batches 2"),
            "gpt2: error: --eval-batches: now called --eval-sequences\n");
  EXPECT_EQ(usage("frobnicate").rfind("gpt2: error: unknown command 'frobnicate'", 0), 0u);
  const auto help = run_command(fogo::trainer::testing::gpt2_binary(), "train --help");
  EXPECT_EQ(help.status, 0);
  for (const char* flag : fogo::trainer::testing::kSharedFlags) {
    EXPECT_NE(help.out.find(std::string(flag) + " "), std::string::npos) << flag;
  }

  test::TempDir dir("binary");
  std::ofstream(dir.path() / "empty.txt").flush();
  const auto failed = run_command(fogo::trainer::testing::gpt2_binary(),
                                  "train --data " + (dir.path() / "empty.txt").string());
  EXPECT_EQ(failed.status, 1) << failed.err;
  EXPECT_EQ(failed.err,
            "gpt2: error: data file " + (dir.path() / "empty.txt").string() + " is empty\n");
}

}  // namespace
}  // namespace gpt2
