// `gpt2 train` data-parallel: two ranks of the real binary (started as torchrun would, on a free
// loopback port, Gloo) against the single process with the same global batch, the truth.
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/testing.h"
#include "rank_launcher.h"
#include "test_util.h"
#include "train.h"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
namespace tr = fogo::trainer;

// Tolerance of a world-2 run against the single process with the global batch, as a bound on
// |a - b| / (1 + |b|) for losses and max |a - b| for weights. The two compute the same
// mathematical quantities; only the fp32 reduction order differs: the mean loss and each weight
// gradient are sums over 2b x T = 256 token rows, summed by one process as one reduction but by
// two ranks as two halves then one sum (and the two means divided by 2). That moves a gradient by
// a few ulps of the sum of its terms (fp32 unit roundoff 6e-8: ~1e-6 relative at most), and the
// six steps below carry it through the optimizer's normalisations (Adam, Newton-Schulz) to
// ~1e-5 of the weights' scale at most. Measured: weights within 1.2e-7 (1.5e-6 with
// accumulation), losses within 2e-7. A mistake is far larger; measured with each rank reading
// rank 0's rows instead of its own: losses off by 2e-4 to 4e-3 relative, weights by 2e-2.
constexpr double kLossTol = 2e-5;
constexpr double kWeightTol = 5e-5;

class DataParallel : public test::CorpusTest {
 protected:
  /// The single-process run (in this process) with `batch` sequences per micro-batch.
  TrainConfig config(const std::string& optimizer, int64_t batch, const std::string& out) const {
    TrainConfig c = tiny_config(optimizer, out);
    c.optimizer.ns_dtype = "fp32";
    c.max_steps = 6;
    c.batch_size = batch;
    c.eval_every = 3;
    c.log_every = 1;
    return c;
  }

  /// `gpt2 compare` of config `name` on 2 ranks with `extra` flags: every rank succeeds, rank 1
  /// prints nothing, and rank 0 writes `report`; returns its text.
  std::string compare_on_two_ranks(const std::string& name, const std::vector<std::string>& extra,
                                   const std::string& report) const {
    TrainConfig c = config("adamw", 4, name);
    std::vector<std::string> args = flags(c);
    args[0] = "compare";
    std::erase_if(args, [](const std::string& a) { return a.rfind("--optimizer=", 0) == 0; });
    args.insert(args.end(), extra.begin(), extra.end());
    const fs::path logs = fs::path(c.out_dir + "_logs");
    fs::create_directories(logs);
    const auto run = fogo::testing::launch_ranks({.exe = fogo::trainer::testing::gpt2_binary(),
                                                  .args = args,
                                                  .nprocs = 2,
                                                  .log_dir = logs,
                                                  .deadline_s = 90});
    EXPECT_TRUE(run.all_succeeded()) << run.logs();
    EXPECT_EQ(run.ranks[1].log, "") << run.logs();
    std::ifstream in(fs::path(c.out_dir) / report);
    EXPECT_TRUE(in.good()) << report << " missing\n" << run.logs();
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  /// The same run as command-line flags of `gpt2 train`.
  static std::vector<std::string> flags(const TrainConfig& c) {
    return {"train",
            "--model=tiny",
            "--data=" + c.data.path,
            "--chunk-bytes=" + std::to_string(c.data.chunk_bytes),
            "--optimizer=" + c.optimizer.name,
            "--lr=0.003",
            "--ns-dtype=fp32",
            "--steps=" + std::to_string(c.max_steps),
            "--batch-size=" + std::to_string(c.batch_size),
            "--grad-accum=" + std::to_string(c.grad_accum),
            "--eval-every=" + std::to_string(c.eval_every),
            "--eval-sequences=" + std::to_string(c.eval_sequences),
            "--log-every=1",
            "--device=cpu",
            "--threads=1",
            "--out=" + c.out_dir,
            "--stop-at-step=" + std::to_string(c.stop_at_step),
            std::string("--resume=") + (c.resume ? "true" : "false"),
            std::string("--shard-step=") + (c.data_parallel.shard_step ? "true" : "false"),
            "--dist-timeout=60"};
  }

  /// `gpt2 train` on `nprocs` ranks with `extra` variables and `rank_args` flags per rank.
  fogo::testing::RankRun launch(const TrainConfig& c, int nprocs,
                                std::function<fogo::testing::Env(int)> extra = {},
                                std::function<std::vector<std::string>(int)> rank_args = {}) const {
    const fs::path logs = fs::path(c.out_dir + "_logs");
    fs::create_directories(logs);
    return fogo::testing::launch_ranks({.exe = fogo::trainer::testing::gpt2_binary(),
                                        .args = flags(c),
                                        .rank_args = std::move(rank_args),
                                        .nprocs = nprocs,
                                        .extra = std::move(extra),
                                        .log_dir = logs,
                                        .deadline_s = 60});
  }

  std::ostringstream log_;
};

double rel(double a, double b) { return std::abs(a - b) / (1 + std::abs(b)); }

/// The curves and final weights of a checkpoint equal `truth`'s within the tolerances.
void expect_close_to(const fs::path& checkpoint, const RunResult& truth, const std::string& what) {
  tr::CheckpointReader in(checkpoint.string());
  EXPECT_EQ(in.get_int("step"), truth.steps) << what;
  for (const auto& [key, curve] :
       {std::pair{"history_train", &truth.train_loss}, std::pair{"history_val", &truth.val_loss}}) {
    const auto rows = in.get_history(key);
    ASSERT_EQ(rows.size(), curve->size()) << what << " " << key;
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i][0], (*curve)[i].step) << what << " " << key;
      EXPECT_EQ(rows[i][1], (*curve)[i].tokens) << what << " " << key << ": tokens are global";
      EXPECT_LT(rel(rows[i][2], (*curve)[i].value), kLossTol)
          << what << " " << key << " at step " << rows[i][0] << ": " << rows[i][2] << " vs "
          << (*curve)[i].value;
    }
  }
  GPT model(truth.model);
  in.load_module("model", *model);
  const auto got = model->named_parameters();
  const auto want = truth.trained->named_parameters();
  double worst = 0;
  for (const auto& item : want) {
    worst = std::max(worst, (got[item.key()] - item.value()).abs().max().item<double>());
  }
  EXPECT_LT(worst, kWeightTol) << what << ": final weights differ by up to " << worst;
  std::cout << "[ " << what << " ] max weight difference " << worst << "\n";
}

TEST_F(DataParallel, TwoRanksEqualOneProcessWithTheGlobalBatch) {
  // AdamW and FOGO (codebook, projected streams; Newton-Schulz in fp32); FOGO with gradient
  // accumulation too (2 micro-batches of 2 per rank, the first without communication).
  for (const auto& [optimizer, accum] :
       {std::pair{"adamw", 1}, std::pair{"fogo", 1}, std::pair{"fogo", 2}}) {
    const std::string name = std::string(optimizer) + "_accum" + std::to_string(accum);
    TrainConfig single = config(optimizer, 8 / accum, "single_" + name);
    single.grad_accum = accum;
    const RunResult truth = train(single, log_);

    TrainConfig ranks = config(optimizer, 4 / accum, "ranks_" + name);
    ranks.grad_accum = accum;
    const auto run = launch(ranks, 2);
    ASSERT_TRUE(run.all_succeeded()) << run.logs();
    expect_close_to(fs::path(ranks.out_dir) / tr::kCheckpointFile, truth, name);
    // Rank 0 alone logs and writes: rank 1 printed nothing.
    EXPECT_EQ(run.ranks[1].log, "") << run.logs();
    EXPECT_NE(run.ranks[0].log.find("2 ranks (data-parallel)"), std::string::npos) << run.logs();
    EXPECT_NE(run.ranks[0].log.find("final val loss"), std::string::npos) << run.logs();
    // The routing table at start-up (issue 36, item 5): the tied head/embedding on AdamW.
    EXPECT_NE(run.ranks[0].log.find("| wte.weight | "), std::string::npos) << run.logs();
    EXPECT_TRUE(fs::exists(fs::path(ranks.out_dir) / "metrics.jsonl"));
  }
}

TEST_F(DataParallel, UnderTorchrun) {
  // torchrun itself (its agent hosts the store; TORCHELASTIC_USE_AGENT_STORE) starts the ranks.
  const auto torchrun = fogo::trainer::testing::find_torchrun(FOGO_TORCHRUN_BUILT);
  if (torchrun.empty()) GTEST_SKIP() << "no torchrun (FOGO_TORCHRUN, the build's, or on PATH)";
  const RunResult truth = train(config("fogo", 8, "single"), log_);
  const TrainConfig ranks = config("fogo", 4, "torchrun");
  std::string args =
      "--standalone --nproc-per-node 2 --no-python " + fogo::trainer::testing::gpt2_binary();
  for (const auto& flag : flags(ranks)) args += " '" + flag + "'";
  const auto r = fogo::trainer::testing::run_command("OMP_NUM_THREADS=1 " + torchrun, args);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("final val loss"), std::string::npos) << r.out << r.err;
  expect_close_to(fs::path(ranks.out_dir) / tr::kCheckpointFile, truth, "torchrun");
}

TEST_F(DataParallel, ShardedStepEqualsReplicatedStepBitForBit) {
  // --shard-step splits the Newton-Schulz work (and FOGO's projection, lift and update) over
  // the ranks; the arithmetic per matrix is unchanged, so curves and weights are identical to
  // the replicated run's, not merely close.
  for (const std::string optimizer : {"fogo", "muon"}) {
    TrainConfig replicated = config(optimizer, 4, "replicated_" + optimizer);
    TrainConfig sharded = config(optimizer, 4, "sharded_" + optimizer);
    sharded.data_parallel.shard_step = true;
    for (const auto* c : {&replicated, &sharded}) {
      const auto run = launch(*c, 2);
      ASSERT_TRUE(run.all_succeeded()) << run.logs();
      // The sharded run did shard (rank 0 says how many matrices it owns), the other did not.
      EXPECT_EQ(run.ranks[0].log.find("sharded step: rank 0 orthogonalizes") != std::string::npos,
                c == &sharded)
          << run.logs();
    }
    tr::CheckpointReader a((fs::path(replicated.out_dir) / tr::kCheckpointFile).string());
    tr::CheckpointReader b((fs::path(sharded.out_dir) / tr::kCheckpointFile).string());
    for (const char* key : {"history_train", "history_val"}) {
      EXPECT_EQ(a.get_history(key), b.get_history(key)) << optimizer << " " << key;
    }
    const GPTConfig mc = model_config(replicated, load_corpus(replicated.data).vocab_size);
    GPT ma(mc), mb(mc);
    a.load_module("model", *ma);
    b.load_module("model", *mb);
    const auto pa = ma->named_parameters(), pb = mb->named_parameters();
    for (const auto& item : pa) {
      EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << optimizer << " " << item.key();
    }
  }
}

TEST_F(DataParallel, CheckpointsMoveBetweenWorldSizes) {
  // The truth: one process with batch 8 throughout.
  const RunResult truth = train(config("fogo", 8, "uninterrupted"), log_);

  // 2 ranks x 4 stopped after step 4 (between evaluations, mid-schedule), continued on one
  // process with the same global batch of 8.
  TrainConfig ranks = config("fogo", 4, "two_then_one");
  ranks.stop_at_step = 4;
  const auto run = launch(ranks, 2);
  ASSERT_TRUE(run.all_succeeded()) << run.logs();
  EXPECT_EQ(tr::CheckpointReader((fs::path(ranks.out_dir) / tr::kCheckpointFile).string())
                .get_int("step"),
            4);
  TrainConfig single = config("fogo", 8, "two_then_one");
  single.resume = true;
  const RunResult resumed = train(single, log_);
  EXPECT_NE(log_.str().find("at step 4/6"), std::string::npos) << log_.str();
  expect_close_to(fs::path(single.out_dir) / tr::kCheckpointFile, truth, "2 ranks then 1");
  // The metrics files hold each step once, in order, as if never interrupted.
  std::ifstream csv(fs::path(single.out_dir) / "metrics.csv");
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 1 + 6) << "a header and steps 1 to 6";
  EXPECT_EQ(resumed.train_loss.size(), 6u);

  // One process stopped after step 2, continued on 2 ranks x 4: rank 0 reads the checkpoint and
  // sends it to rank 1.
  TrainConfig first = config("fogo", 8, "one_then_two");
  first.stop_at_step = 2;
  train(first, log_);
  TrainConfig two = config("fogo", 4, "one_then_two");
  two.resume = true;
  const auto continued = launch(two, 2);
  ASSERT_TRUE(continued.all_succeeded()) << continued.logs();
  EXPECT_NE(continued.ranks[0].log.find("at step 2/6"), std::string::npos) << continued.logs();
  expect_close_to(fs::path(two.out_dir) / tr::kCheckpointFile, truth, "1 process then 2 ranks");
}

TEST_F(DataParallel, CompareUnderRanksWritesOneReportFromRankZero) {
  // `gpt2 compare` on 2 ranks: each optimizer's run is data-parallel; rank 0 alone prints and
  // writes compare.md and the plot, naming both optimizers.
  const std::string text =
      compare_on_two_ranks("compare_ranks", {"--optimizers=adamw,muon"}, "compare.md");
  for (const char* name : {"adamw", "muon", "2 ranks (data-parallel)"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " missing from\n" << text;
  }
}

TEST_F(DataParallel, LrSweepUnderRanksChoosesOneLrEverywhere) {
  // `gpt2 compare --lr-sweep` on 2 ranks: the tuning loss is reduced over the ranks, so every
  // rank chooses the same factor (one that chose another would train apart and fail the lockstep
  // check); rank 0 alone writes sweep.md.
  const std::string text = compare_on_two_ranks(
      "sweep_ranks", {"--optimizers=adamw", "--lr-sweep=0.5,2", "--seeds=0,1,2"}, "sweep.md");
  EXPECT_NE(text.find("| yes"), std::string::npos) << text;
}

TEST_F(DataParallel, BadLaunchesAreClearErrors) {
  // Ranks that disagree on WORLD_SIZE: every rank fails, naming the variable and both values.
  TrainConfig c = config("adamw", 4, "mismatch");
  const auto run = launch(c, 2, [](int r) {
    return fogo::testing::Env{{"WORLD_SIZE", r == 1 ? "3" : "2"}};
  });
  EXPECT_FALSE(run.killed) << run.logs();
  for (const auto& rank : run.ranks) {
    EXPECT_NE(rank.code, 0) << run.logs();
    EXPECT_NE(rank.log.find("gpt2: error: fogo::dist: WORLD_SIZE mismatch"), std::string::npos)
        << run.logs();
  }
  EXPECT_NE(run.ranks[1].log.find("RANK=1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"),
            std::string::npos)
      << run.logs();

  // Ranks launched with another --data-seed and --eval-every (before: the first trained to the
  // end with exit 0, the second aborted inside gloo): every rank stops at start-up with the
  // usage status, rank 1 naming both flags with both values, and nothing is written.
  TrainConfig flags_differ = config("adamw", 4, "flags_differ");
  const auto differ = launch(flags_differ, 2, {}, [](int r) {
    return r == 1 ? std::vector<std::string>{"--data-seed=7", "--eval-every=2"}
                  : std::vector<std::string>{};
  });
  EXPECT_FALSE(differ.killed) << differ.logs();
  for (const auto& rank : differ.ranks) EXPECT_EQ(rank.code, 2) << differ.logs();
  EXPECT_NE(differ.ranks[1].log.find("rank 1 was launched with other flags than rank 0: "
                                     "--data-seed 7 (rank 0: "),
            std::string::npos)
      << differ.logs();
  EXPECT_NE(differ.ranks[1].log.find("--eval-every 2 (rank 0: 3)"), std::string::npos)
      << differ.logs();
  EXPECT_FALSE(fs::exists(fs::path(flags_differ.out_dir) / "metrics.jsonl"));

  // A checkpoint of 2 ranks x 4 resumed with another global batch (1 x 4): refused, naming
  // --batch-size with the global batch sizes.
  TrainConfig ranks = config("adamw", 4, "global_batch");
  ranks.stop_at_step = 2;
  const auto first = launch(ranks, 2);
  ASSERT_TRUE(first.all_succeeded()) << first.logs();
  TrainConfig single = config("adamw", 4, "global_batch");
  single.resume = true;
  test::expect_error([&] { train(single, log_); }, {"--batch-size was 8, now 4"});
}

}  // namespace
}  // namespace gpt2
