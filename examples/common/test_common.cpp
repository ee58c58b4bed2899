// Tests of the shared trainer utilities: flag parsing and exit statuses, metrics files (and
// their trimming on resume), tables, checkpoints and histories, run signatures, the optimizer
// flags and telemetry, and plots.
#include <fogo/enum_names.h>
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "common/checkpoint.h"
#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/fogo_flags.h"
#include "common/metrics.h"
#include "common/optimizers.h"
#include "common/progress.h"
#include "common/report.h"
#include "common/signature.h"
#ifdef FOGO_WITH_DISTRIBUTED
#include "rank_launcher.h"
#endif

namespace fs = std::filesystem;
using namespace fogo::trainer;

namespace {

// A fresh directory per call. Not std::filesystem::remove_all: the torch wheel's libtorch.so
// exports its own copy of that symbol, which crashes when it wins symbol resolution.
fs::path temp_dir(const std::string& name) {
  std::string pattern = (fs::temp_directory_path() / ("fogo_common_" + name + "_XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool parse(Cli& cli, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  std::ostringstream help;
  return cli.parse(static_cast<int>(args.size()), args.data(), help);
}

std::string error_of(Cli& cli, std::vector<const char*> args) {
  try {
    parse(cli, std::move(args));
  } catch (const CliError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Cli, ParsesEveryKindAndSpelling) {
  Cli cli("prog", "test");
  int64_t epochs = 3;
  double lr = 0.1;
  bool verbose = false, plots = true;
  std::string opt = "adam";
  std::optional<double> wd;
  std::vector<int64_t> seeds{0};
  std::vector<std::string> names;
  cli.flag("epochs", &epochs, "e");
  cli.flag("lr", &lr, "l");
  cli.flag("verbose", &verbose, "v");
  cli.flag("plots", &plots, "p");
  cli.choice("optimizer", &opt, {"adam", "muon"}, "o");
  cli.flag("wd", &wd, "w");
  cli.flag("seeds", &seeds, "s");
  cli.flag("names", &names, "n");
  ASSERT_TRUE(parse(cli, {"--epochs", "7", "--lr=1e-3", "--verbose", "--no-plots", "--optimizer",
                          "muon", "--seeds", "1,2,3", "--names=a,b"}));
  EXPECT_EQ(epochs, 7);
  EXPECT_DOUBLE_EQ(lr, 1e-3);
  EXPECT_TRUE(verbose);
  EXPECT_FALSE(plots);
  EXPECT_EQ(opt, "muon");
  EXPECT_FALSE(wd.has_value());
  EXPECT_EQ(seeds, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(cli.given("epochs"));
  EXPECT_FALSE(cli.given("wd"));
}

TEST(Cli, ErrorsNameTheFlag) {
  Cli cli("prog", "test");
  int64_t epochs = 3;
  double lr = 0.1;
  std::string opt = "adam";
  cli.flag("epochs", &epochs, "e");
  cli.flag("lr", &lr, "l");
  cli.choice("optimizer", &opt, {"adam", "muon"}, "o");
  EXPECT_EQ(error_of(cli, {"--epochs", "ten"}), "--epochs: expected an integer, got 'ten'");
  EXPECT_EQ(error_of(cli, {"--lr", "nan"}), "--lr: expected a finite number, got 'nan'");
  EXPECT_EQ(error_of(cli, {"--lr"}), "--lr: missing value");
  EXPECT_EQ(error_of(cli, {"--optimizer", "sgd"}),
            "--optimizer: expected one of adam,muon, got 'sgd'");
  EXPECT_EQ(error_of(cli, {"--bogus", "1"}), "unknown flag --bogus (see --help)");
  EXPECT_NE(error_of(cli, {"stray"}).find("unexpected argument 'stray'"), std::string::npos);
}

TEST(Cli, HelpShowsDefaults) {
  Cli cli("prog", "Trains things.");
  int64_t epochs = 3;
  cli.section("Training");
  cli.flag("epochs", &epochs, "passes over the data");
  std::vector<const char*> args{"prog", "--help"};
  std::ostringstream help;
  EXPECT_FALSE(cli.parse(2, args.data(), help));
  EXPECT_NE(help.str().find("Training:"), std::string::npos);
  EXPECT_NE(help.str().find("--epochs <value>"), std::string::npos);
  EXPECT_NE(help.str().find("[default: 3]"), std::string::npos);
}

TEST(Metrics, JsonlWritesAndResumeDropsLaterRecords) {
  const fs::path path = temp_dir("jsonl") / "m.jsonl";
  {
    auto w = MetricsWriter::create(path.string());
    for (int64_t s = 1; s <= 5; ++s) {
      w.write(Record().set("step", s).set("loss", 1.0 / s).set("name", "a\"b"));
    }
    w.write(Record().set("step", 6).set("loss", std::nan("")).set("ok", true));
  }
  auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[1], R"({"step":2,"loss":0.5,"name":"a\"b"})");
  EXPECT_EQ(lines[5], R"({"step":6,"loss":null,"ok":true})");
  {
    auto w = MetricsWriter::resume(path.string(), 3);
    w.write(Record().set("step", 4).set("loss", 0.0));
  }
  lines = lines_of(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[3], R"({"step":4,"loss":0})");
}

TEST(Metrics, CsvHeaderQuotingAndResume) {
  const fs::path path = temp_dir("csv") / "m.csv";
  {
    auto w = MetricsWriter::create(path.string());
    w.write(Record().set("step", 1).set("tag", "x,y").set("acc", 0.25));
    w.write(Record().set("step", 2).set("acc", 0.5));
    EXPECT_THROW(w.write(Record().set("step", 3).set("new", 1)), std::invalid_argument);
  }
  auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "step,tag,acc");
  EXPECT_EQ(lines[1], "1,\"x,y\",0.25");
  EXPECT_EQ(lines[2], "2,,0.5");
  {
    auto w = MetricsWriter::resume(path.string(), 1);
    w.write(Record().set("step", 2).set("tag", "z").set("acc", 0.75));
  }
  lines = lines_of(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], "2,z,0.75");
  EXPECT_THROW(MetricsWriter::create((path.parent_path() / "m.txt").string()),
               std::invalid_argument);
}

TEST(Report, MeanSdAndTables) {
  const MeanSd m = mean_sd({1.0, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(m.mean, 2.0);
  EXPECT_DOUBLE_EQ(m.sd, 1.0);
  EXPECT_EQ(format_mean_sd(m, 1), "2.0 ± 1.0");
  EXPECT_EQ(format_mean_sd(mean_sd({4.0}), 2), "4.00");
  EXPECT_EQ(format_mean_sd(mean_sd({1.0, std::nan("")})), "n/a");
  Table t({"opt", "acc"});
  t.add_row({"fogo", "2.0 ± 1.0"});
  t.add_row({"adam", "10.00"});
  EXPECT_EQ(t.to_text(), "opt         acc\n---------------\nfogo  2.0 ± 1.0\nadam      10.00\n");
  EXPECT_EQ(t.to_markdown(), "| opt | acc |\n|---|---:|\n| fogo | 2.0 ± 1.0 |\n| adam | 10.00 |\n");
  EXPECT_THROW(t.add_row({"x"}), std::invalid_argument);
}

TEST(Report, PlotWritesPngWhenGnuplotIsThere) {
  const fs::path png = temp_dir("plot") / "acc.png";
  Panel p{
      "acc",
      "epoch",
      "%",
      {Series{"a", {1, 2, 3}, {1, 2, 3}, {0.1, 0.1, 0.1}}, Series{"b", {1, 2, 3}, {3, 2, 1}, {}}}};
  std::ostringstream log;
  const bool drawn = plot_png(png.string(), {p, p}, 2, log);
  EXPECT_EQ(drawn, gnuplot_available()) << log.str();
  if (drawn) EXPECT_GT(fs::file_size(png), 1000u);
  EXPECT_THROW(plot_png(png.string(), {Panel{"x", "", "", {Series{"bad", {1}, {}, {}}}}}, 1, log),
               std::invalid_argument);
}

TEST(Progress, PrintsStepLossAccRateAndEta) {
  std::ostringstream out;
  Progress progress(100, 0, ProgressOptions{"run", "samples", 0.0, 0}, out);
  ProgressFields f;
  f.epoch = 1;
  f.epochs = 2;
  f.loss = 0.5;
  f.acc = 0.875;
  progress.update(50, 6400, f, true);
  const std::string line = out.str();
  EXPECT_NE(line.find("[run] epoch 1/2  step 50/100  loss 0.5000  acc 87.50%"), std::string::npos)
      << line;
  EXPECT_NE(line.find("samples/s"), std::string::npos);
  EXPECT_NE(line.find("ETA"), std::string::npos);
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(187), "3m07s");
}

TEST(Checkpoint, RoundTripIsExactAndAtomic) {
  const fs::path path = temp_dir("ckpt") / "sub" / "c.pt";
  torch::manual_seed(0);
  torch::nn::Linear a(4, 3), b(4, 3);
  torch::optim::Adam opt_a(a->parameters(), 0.1), opt_b(b->parameters(), 0.1);
  a(torch::randn({2, 4})).sum().backward();
  opt_a.step();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  torch::randn({3}, gen);  // advance it
  {
    CheckpointWriter w;
    w.put("step", int64_t{17});
    w.put("lr", 0.25);
    w.put("config", std::string("x=1"));
    w.put_module("model", *a);
    w.put_optimizer("optimizer", opt_a);
    w.put_generator("rng", gen);
    w.commit(path.string());
  }
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  CheckpointReader r(path.string());
  EXPECT_EQ(r.get_int("step"), 17);
  EXPECT_DOUBLE_EQ(r.get_double("lr"), 0.25);
  EXPECT_EQ(r.get_string("config"), "x=1");
  EXPECT_TRUE(r.has("model"));
  EXPECT_FALSE(r.has("nothing"));
  r.load_module("model", *b);
  r.load_optimizer("optimizer", opt_b);
  auto gen2 = at::make_generator<at::CPUGeneratorImpl>(0);
  r.load_generator("rng", gen2);
  EXPECT_TRUE(torch::equal(a->weight, b->weight));
  EXPECT_TRUE(torch::equal(torch::randn({5}, gen), torch::randn({5}, gen2)));
  // The restored optimizer continues exactly like the original.
  const auto x = torch::randn({2, 4});
  opt_a.zero_grad();
  a(x).sum().backward();
  opt_a.step();
  opt_b.zero_grad();
  b(x).sum().backward();
  opt_b.step();
  EXPECT_TRUE(torch::equal(a->weight, b->weight));

  EXPECT_THROW(r.get_int("missing"), std::runtime_error);
  EXPECT_THROW(CheckpointReader((path.parent_path() / "none.pt").string()), std::runtime_error);
  std::ofstream(path.parent_path() / "junk.pt") << "not a zip";
  EXPECT_THROW(CheckpointReader((path.parent_path() / "junk.pt").string()), std::runtime_error);
  torch::nn::Linear c(5, 3);
  EXPECT_THROW(r.load_module("model", *c), std::runtime_error);
}

TEST(Cli, FlagTextIsTheShortestExactText) {
  EXPECT_EQ(flag_text(0.1), "0.1");
  EXPECT_EQ(flag_text(6e-4), "0.0006");
  EXPECT_EQ(flag_text(1e-5), "1e-05");
  EXPECT_EQ(flag_text(2.0), "2");
  EXPECT_EQ(flag_text(0.0), "0");
  EXPECT_EQ(flag_text(10.0), "10");  // %g would write 1e+01
  EXPECT_EQ(flag_text(-3000.0), "-3000");
  EXPECT_EQ(flag_text(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(flag_text(0.1 + 0.2), "0.30000000000000004");
  for (const double v : {0.1, 6e-4, 1.0 / 3.0, 0.95, 123456789.125, -2.5e-300}) {
    EXPECT_EQ(std::strtod(flag_text(v).c_str(), nullptr), v) << flag_text(v);
  }
}

TEST(RunSignature, TextRoundTripAndDifferences) {
  RunSignature a("prog");
  a.add("model", "mini").add("dropout", 0.1).add("batch-size", 16).add("augment", true);
  a.add("classes", std::vector<int64_t>{4, 5});
  EXPECT_EQ(a.to_text(), "model=mini\ndropout=0.1\nbatch-size=16\naugment=true\nclasses=4,5\n");
  const RunSignature back = RunSignature::from_text("prog", a.to_text());
  EXPECT_EQ(back.entries(), a.entries());
  EXPECT_TRUE(a.differences(back).empty());

  RunSignature b("prog");
  b.add("model", "mini").add("dropout", 0.0).add("batch-size", 8).add("extra", "x");
  EXPECT_EQ(b.differences(a), (std::vector<std::string>{
                                  "--dropout was 0.1, now 0", "--batch-size was 16, now 8",
                                  "--extra was (absent), now x", "--augment was true, now (absent)",
                                  "--classes was 4,5, now (absent)"}));
  EXPECT_THROW(a.add("model", "again"), std::logic_error);
  EXPECT_THROW(a.add("note", "two\nlines"), std::logic_error);
}

TEST(RunSignature, ResumeRefusesAnotherRunNamingTheFlag) {
  const fs::path dir = temp_dir("signature");
  const std::string path = (dir / "checkpoint.pt").string();
  auto signature = [](double dropout) {
    RunSignature s("prog");
    s.add("model", "mini").add("dropout", dropout).add("seed", 1337);
    return s;
  };
  EXPECT_FALSE(open_for_resume(path, signature(0.1)).has_value()) << "no checkpoint yet";
  {
    CheckpointWriter w;
    signature(0.1).write(w);
    w.put("step", int64_t{7});
    w.commit(path);
  }
  auto same = open_for_resume(path, signature(0.1));
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->get_int("step"), 7);
  try {
    open_for_resume(path, signature(0.0));
    ADD_FAILURE() << "resumed under another --dropout";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "--resume: checkpoint '" + path +
                  "' belongs to a run with other settings (--dropout was 0.1, now 0); use "
                  "another --out or drop --resume to start afresh");
  }
  RunSignature other("other_prog");
  other.add("model", "mini");
  try {
    open_for_resume(path, other);
    ADD_FAILURE() << "resumed another program's checkpoint";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("was written by prog, not other_prog"), std::string::npos)
        << e.what();
  }
  {
    CheckpointWriter w;
    w.put("step", int64_t{7});
    w.commit(path);
  }
  try {
    open_for_resume(path, signature(0.1));
    ADD_FAILURE() << "resumed a checkpoint without a signature";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("has no run signature"), std::string::npos) << e.what();
  }
}

TEST(Cli, RenamedFlagNamesItsSuccessor) {
  Cli cli("prog", "test");
  double grad_clip = 0;
  cli.flag("grad-clip", &grad_clip, "g");
  cli.renamed("clip", "grad-clip");
  EXPECT_EQ(error_of(cli, {"--clip", "2"}), "--clip: now called --grad-clip");
  EXPECT_EQ(error_of(cli, {"--clip=2"}), "--clip: now called --grad-clip");
  ASSERT_TRUE(parse(cli, {"--grad-clip", "2"}));
  EXPECT_EQ(grad_clip, 2.0);
  EXPECT_EQ(cli.help().find("--clip"), std::string::npos);
  EXPECT_THROW(cli.renamed("grad-clip", "clip"), CliError) << "renaming to an unknown flag";
}

TEST(Cli, RunMainTurnsErrorsIntoExitStatusesAndOneLine) {
  std::ostringstream err;
  EXPECT_EQ(run_main(
                "prog", [] { return 0; }, err),
            0);
  EXPECT_EQ(run_main(
                "prog", [] { return 3; }, err),
            3);
  EXPECT_EQ(err.str(), "");
  auto outcome = [](const std::function<int()>& body) {
    std::ostringstream e;
    const int status = run_main("prog", body, e);
    return std::pair{status, e.str()};
  };
  EXPECT_EQ(outcome([]() -> int { throw Cli::error("epochs", "must be >= 1"); }),
            std::pair(kExitUsage, std::string("prog: error: --epochs: must be >= 1\n")));
  EXPECT_EQ(outcome([]() -> int { throw std::invalid_argument("--resume: other settings"); }),
            std::pair(kExitUsage, std::string("prog: error: --resume: other settings\n")));
  EXPECT_EQ(outcome([]() -> int { throw std::runtime_error("data file x is empty"); }),
            std::pair(kExitFailure, std::string("prog: error: data file x is empty\n")));
  EXPECT_EQ(outcome([]() -> int { TORCH_CHECK(false, "step 3: non-finite loss"); }),
            std::pair(kExitFailure, std::string("prog: error: step 3: non-finite loss\n")))
      << "a c10::Error, without its backtrace";
}

TEST(Checkpoint, HistoriesRoundTrip) {
  const fs::path path = temp_dir("history") / "h.pt";
  const History curve{{1, 10, 0.5}, {2, 20, std::nan("")}}, empty;
  {
    CheckpointWriter w;
    w.put_history("curve", curve);
    w.put_history("empty", empty);
    EXPECT_THROW(w.put_history("ragged", {{1, 2}, {3}}), std::invalid_argument);
    w.commit(path.string());
  }
  CheckpointReader r(path.string());
  const History back = r.get_history("curve");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0], curve[0]);
  EXPECT_EQ(back[1][1], 20);
  EXPECT_TRUE(std::isnan(back[1][2]));
  EXPECT_TRUE(r.get_history("empty").empty());
}

TEST(Checkpoint, ReadsFromBytesInMemory) {
  // What a rank other than 0 does with the checkpoint rank 0 read and sent.
  const fs::path path = temp_dir("bytes") / "c.pt";
  torch::manual_seed(0);
  torch::nn::Linear a(4, 3), b(4, 3);
  {
    CheckpointWriter w;
    w.put("step", int64_t{5});
    w.put_module("model", *a);
    w.commit(path.string());
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  CheckpointReader r("rank0:" + path.string(), bytes.str());
  EXPECT_EQ(r.get_int("step"), 5);
  r.load_module("model", *b);
  EXPECT_TRUE(torch::equal(a->weight, b->weight));
  try {
    CheckpointReader bad("rank0:c.pt", "not an archive");
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint 'rank0:c.pt': not a readable LibTorch"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallel, OneProcessIsAWorldOfOneWithoutCommunication) {
  // Not started by torchrun (the test's environment has no WORLD_SIZE > 1).
  ASSERT_TRUE(std::getenv("WORLD_SIZE") == nullptr ||
              std::string(std::getenv("WORLD_SIZE")) == "1");
  DataParallel& dp = DataParallel::process();
  EXPECT_EQ(&dp, &DataParallel::process());  // one per process
  EXPECT_EQ(dp.rank(), 0);
  EXPECT_EQ(dp.world_size(), 1);
  EXPECT_TRUE(dp.main());
  EXPECT_FALSE(dp.distributed());
  EXPECT_EQ(dp.sum(2.5), 2.5);
  EXPECT_TRUE(torch::equal(dp.sum(torch::tensor({1.0, 2.0})), torch::tensor({1.0, 2.0})));
  torch::nn::Linear model(2, 1);
  dp.broadcast_module(*model);
  dp.average_gradients_of(*model);
  bool ran = false;
  dp.accumulate_locally([&] { ran = true; });
  EXPECT_TRUE(ran);
  dp.finish_gradients();
  dp.check_lockstep(*model);
  dp.barrier();
  const fs::path file = temp_dir("dp") / "f.bin";
  EXPECT_FALSE(dp.read_on_main(file.string()).has_value());
  std::ofstream(file, std::ios::binary) << std::string("a\0b", 3);
  EXPECT_EQ(dp.read_on_main(file.string()), std::string("a\0b", 3));
  DataParallel::shutdown_process();
}

TEST(Optimizers, NsDtypeFlagAndParsing) {
  Cli cli("prog", "test");
  std::string ns = "bf16";
  add_ns_dtype_flag(cli, &ns);
  ASSERT_TRUE(parse(cli, {"--ns-dtype", "fp32"}));
  EXPECT_EQ(parse_ns_dtype(ns), c10::kFloat);
  EXPECT_EQ(parse_ns_dtype("bf16"), c10::kBFloat16);
  EXPECT_EQ(parse_ns_dtype("auto"), fogo::kNSDtypeAuto);
  EXPECT_EQ(error_of(cli, {"--ns-dtype", "fp16"}),
            "--ns-dtype: expected one of auto,bf16,fp32, got 'fp16'");
  try {
    parse_ns_dtype("fp16");
    ADD_FAILURE() << "accepted fp16";
  } catch (const CliError& e) {
    EXPECT_EQ(std::string(e.what()), "--ns-dtype: expected one of auto,bf16,fp32, got 'fp16'");
  }
  // auto as a run records it (its signature) and says it (its start-up line); explicit values
  // as they are.
  const c10::Device cpu(c10::kCPU);
  EXPECT_EQ(resolved_ns_dtype("fp32", cpu), "fp32");
  EXPECT_EQ(describe_ns_dtype("bf16", cpu), "bf16");
  fogo::set_ns_auto_dtype(c10::kFloat);  // as the distributed layer would; forgets kept choices
  EXPECT_EQ(resolved_ns_dtype("auto", cpu), "fp32");
  const std::string said = describe_ns_dtype("auto", cpu);
  EXPECT_EQ(said.rfind("auto: fp32 (cpu, set_ns_auto_dtype; ", 0), 0u) << said;
  fogo::set_ns_auto_dtype(fogo::kNSDtypeAuto);
}

TEST(Optimizers, FogoTelemetryFieldsPerGroupUnderTheHybridsGroupNames) {
  torch::manual_seed(0);
  auto a = torch::randn({12, 48}).requires_grad_(true);
  auto b = torch::randn({40, 10}).requires_grad_(true);
  auto bias = torch::randn({10}).requires_grad_(true);
  fogo::HybridOptimizer hybrid(
      std::make_unique<fogo::FOGO>(std::vector{torch::optim::OptimizerParamGroup({a}),
                                               torch::optim::OptimizerParamGroup({b})},
                                   fogo::FOGOOptions(0.01).proj_dim(16).codebook_size(8)),
      std::make_unique<torch::optim::AdamW>(std::vector{bias}), {"stem", "fc"});
  a.mutable_grad() = torch::randn({12, 48});
  b.mutable_grad() = torch::randn({40, 10});
  bias.mutable_grad() = torch::randn({10});
  hybrid.step();
  Record r;
  add_fogo_telemetry(r, hybrid);
  const auto t = hybrid.matrix<fogo::FOGO>()->telemetry();
  ASSERT_EQ(t.size(), 2u);
  ASSERT_EQ(r.fields().size(), 18u) << "9 statistics of each group, none of the rest";
  EXPECT_EQ(r.fields().front().first, "fogo/stem/rbar");
  EXPECT_EQ(*r.get("fogo/fc/gamma_st"), Record::Value(t[1].gamma_st));
  EXPECT_EQ(*r.get("fogo/fc/live_centroids"), Record::Value(t[1].live_centroids));
  for (const char* stat : {"frac_conflicting", "frac_over_aligned", "frac_lt_protected",
                           "codebook_entropy", "delta_ratio", "frozen"}) {
    EXPECT_NE(r.get(std::string("fogo/stem/") + stat), nullptr) << stat;
  }

  // No matrix side: nothing. Another matrix optimizer: the checked accessor refuses it.
  Record none;
  add_fogo_telemetry(none, fogo::HybridOptimizer(
                               nullptr, std::make_unique<torch::optim::AdamW>(std::vector{bias})));
  EXPECT_TRUE(none.fields().empty());
  fogo::HybridOptimizer muon(std::make_unique<fogo::Muon>(std::vector{a}, fogo::MuonOptions(0.01)),
                             nullptr);
  EXPECT_THROW(add_fogo_telemetry(none, muon), c10::Error);
  EXPECT_TRUE(none.fields().empty());
}

namespace {

std::string fogo_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const CliError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(FogoFlags, EveryOptionOfTheTablesIsSettableByItsName) {
  // The names come from the X-macro tables; the library's own Markdown table of the options
  // (options_markdown, docs/algorithm.md) is the independent list they must match.
  const auto names = fogo_option_names();
  const std::string table = fogo::options_markdown();
  size_t rows = 0;
  for (size_t at = table.find("\n| `"); at != std::string::npos; at = table.find("\n| `", at + 1))
    ++rows;
  EXPECT_EQ(names.size(), rows);
  for (const auto& n : names) EXPECT_NE(table.find("| `" + n + "` |"), std::string::npos) << n;

  fogo::FOGOOptions o;
  for (const char* a :
       {"xi=0.5", "codebook_size=7", "reseed_every=0", "gamma_st_max=0.7", "spectral_scaling=false",
        "reinit_codebook_on_task=on", "ns_coefficients=cubic", "ns_dtype=fp32", "ns_form=gram",
        "projection_scale=jl", "nonfinite=skip", "seed=-3", "lr=2e-3"}) {
    apply_fogo_assignment(o, a);
  }
  EXPECT_EQ(o.xi(), 0.5);
  EXPECT_EQ(o.codebook_size(), 7);
  EXPECT_EQ(o.reseed_every(), 0);
  EXPECT_EQ(o.gamma_st_max(), 0.7);
  EXPECT_FALSE(o.spectral_scaling());
  EXPECT_TRUE(o.reinit_codebook_on_task());
  EXPECT_EQ(o.ns_coefficients(), fogo::kCubic);
  EXPECT_EQ(o.ns_dtype(), c10::kFloat);
  EXPECT_EQ(o.ns_form(), fogo::NSForm::Gram);
  EXPECT_EQ(o.projection_scale(), fogo::ProjectionScale::JL);
  EXPECT_EQ(o.nonfinite(), fogo::NonFinitePolicy::Skip);
  EXPECT_EQ(o.seed(), -3);
  EXPECT_EQ(o.lr(), 2e-3);
  apply_fogo_assignment(o, "ns_coefficients=1.5,-0.5,0.25");
  EXPECT_EQ(o.ns_coefficients(), std::make_tuple(1.5, -0.5, 0.25));
  apply_fogo_assignment(o, "blocks=8,4,4");  // row counts (issue 36's fused weights)
  EXPECT_EQ(o.blocks(), std::vector<int64_t>({8, 4, 4}));
  apply_fogo_assignment(o, "normuon=true");
  EXPECT_TRUE(o.normuon());
  EXPECT_EQ(fogo_error([&] { apply_fogo_assignment(o, "blocks=8,x"); }),
            "--fogo: blocks: expected an integer, got 'x'");
  // Newton–Schulz coefficient lists (issue 46): by name, or rows; "" none.
  apply_fogo_assignment(o, "ns_coefficient_schedule=cans");
  EXPECT_EQ(o.ns_coefficient_schedule(), fogo::ns_named_schedule("cans"));
  apply_fogo_assignment(o, "ns_coefficient_schedule=quintic;2,-1.5,0.5");
  EXPECT_EQ(o.ns_coefficient_schedule(),
            (fogo::NSSchedule{fogo::NSConfig::quintic(), {2.0, -1.5, 0.5}}));
  apply_fogo_assignment(o, "ns_coefficient_schedule=");
  EXPECT_TRUE(o.ns_coefficient_schedule().empty());
  EXPECT_EQ(fogo_error([&] {
              apply_fogo_assignment(o, "ns_coefficient_schedule=2,-1.5");
            }).rfind("--fogo: ns_coefficient_schedule: expected one of keller_jordan, ", 0),
            0u);
  // Every other option keeps its default.
  EXPECT_EQ(o.mu_s(), fogo::FOGOOptions().mu_s());
}

TEST(FogoFlags, BadKeysAndValuesNameTheFlagAndTheKey) {
  fogo::FOGOOptions o;
  const auto err = [&](const std::string& a) {
    return fogo_error([&] { apply_fogo_flags(o, "full", {a}); });
  };
  EXPECT_EQ(err("bogus=1").rfind("--fogo: unknown option 'bogus' (FOGOOptions has lr, ", 0), 0u)
      << err("bogus=1");
  EXPECT_EQ(err("xi"), "--fogo: expected key=value (a FOGOOptions field), got 'xi'");
  EXPECT_EQ(err("xi=abc"), "--fogo: xi: expected a number, got 'abc'");
  EXPECT_EQ(err("codebook_size=2.5"), "--fogo: codebook_size: expected an integer, got '2.5'");
  EXPECT_EQ(err("spectral_scaling=maybe"),
            "--fogo: spectral_scaling: expected true or false, got 'maybe'");
  EXPECT_EQ(err("ns_dtype=fp16"),
            "--fogo: ns_dtype: expected auto, bf16, fp32 or fp64, got 'fp16'");
  EXPECT_EQ(err("ns_coefficients=1,2"),
            "--fogo: ns_coefficients: expected quintic, cubic or a,b,c, got '1,2'");
  // Out of its range: FOGOOptions::validate names the option.
  const std::string range = err("xi=2");
  EXPECT_EQ(range.rfind("--fogo: ", 0), 0u) << range;
  EXPECT_NE(range.find("xi"), std::string::npos) << range;
  EXPECT_EQ(fogo_error([&] {
              apply_fogo_flags(o, "half", {});
            }).rfind("--ablation: unknown ablation 'half' (full, no-slerp, ", 0),
            0u);
}

// The enumerations by the names of fogo/enum_names.h, each list read from there (a name added
// there is a flag value with no change here), and a wrong one answered with the whole list.
template <class E, class Get>
void expect_every_name_parses(const std::string& key, Get get) {
  std::vector<std::string> names;
  for (const auto& [name, value] : fogo::EnumNames<E>::values) {
    fogo::FOGOOptions o;
    apply_fogo_assignment(o, key + "=" + name);
    EXPECT_EQ(get(o), value) << key << "=" << name;
    names.push_back(name);
  }
  std::string listed;
  for (size_t k = 0; k < names.size(); ++k)
    listed += (k == 0 ? "" : k + 1 == names.size() ? " or " : ", ") + names[k];
  fogo::FOGOOptions o;
  EXPECT_EQ(fogo_error([&] { apply_fogo_assignment(o, key + "=nope"); }),
            "--fogo: " + key + ": expected " + listed + ", got 'nope'");
}

TEST(FogoFlags, EnumerationsTakeTheirListedNames) {
  expect_every_name_parses<fogo::NSForm>("ns_form",
                                         [](const fogo::FOGOOptions& o) { return o.ns_form(); });
  expect_every_name_parses<fogo::ProjectionScale>(
      "projection_scale", [](const fogo::FOGOOptions& o) { return o.projection_scale(); });
  expect_every_name_parses<fogo::NonFinitePolicy>(
      "nonfinite", [](const fogo::FOGOOptions& o) { return o.nonfinite(); });
  // The texts before the lists (the flags' documented spellings).
  fogo::FOGOOptions o;
  EXPECT_EQ(fogo_error([&] { apply_fogo_assignment(o, "nonfinite=ignore"); }),
            "--fogo: nonfinite: expected raise, skip, unchecked or mask, got 'ignore'");
}

TEST(FogoFlags, RepeatableFlagKeepsCommasAndAblationsSetTheirFields) {
  Cli cli("prog", "test");
  std::vector<std::string> assignments{"stale=1"};
  std::string ablation = "full";
  add_fogo_flags(cli, &assignments, &ablation);
  ASSERT_TRUE(parse(
      cli, {"--fogo", "xi=0.1", "--fogo=ns_coefficients=1,2,3", "--ablation", "short-term-only"}));
  EXPECT_EQ(assignments, (std::vector<std::string>{"xi=0.1", "ns_coefficients=1,2,3"}));
  EXPECT_EQ(ablation, "short-term-only");

  const fogo::FOGOOptions d;
  auto with = [](const std::string& name) {
    fogo::FOGOOptions o;
    apply_ablation(o, name);
    return o;
  };
  EXPECT_TRUE(with("full") == d);
  EXPECT_EQ(with("no-slerp").xi(), 0.0);
  EXPECT_EQ(with("no-slerp").gamma_lt(), d.gamma_lt());
  EXPECT_EQ(with("short-term-only").gamma_lt(), 0.0);
  EXPECT_EQ(with("short-term-only").gamma_hi(), d.gamma_hi());
  EXPECT_EQ(with("short-term-only").xi(), d.xi());
  const auto lt = with("long-term-only");
  EXPECT_EQ(lt.gamma_hi() + lt.gamma_st_min() + lt.gamma_st_max(), 0.0);
  EXPECT_EQ(lt.gamma_lt(), d.gamma_lt());
  const auto off = with("memory-off");
  EXPECT_EQ(off.xi() + off.gamma_hi() + off.gamma_st_min() + off.gamma_st_max() + off.gamma_lt(),
            0.0);
  // The ablation first, then --fogo: an explicit value wins.
  fogo::FOGOOptions o;
  apply_fogo_flags(o, "no-slerp", {"xi=0.3"});
  EXPECT_EQ(o.xi(), 0.3);
}

TEST(FogoFlags, MemoryOffIsSlowStreamMuonWithRmsScaling) {
  // docs/algorithm.md's first check through the flag: with memory-off, FOGO's first step is
  // -lr * sigma * sqrt(m n) * O / |O|_F, O the Newton–Schulz polar factor of the gradient
  // (the first slow momentum is a multiple of it; X0 = B / (|B|_F + eps) makes scale moot).
  torch::manual_seed(0);
  const auto g = torch::randn({8, 16});
  auto w = torch::zeros({8, 16}, torch::requires_grad());
  fogo::FOGOOptions o(0.01);
  apply_fogo_flags(o, "memory-off", {"ns_dtype=fp32", "proj_dim=4", "codebook_size=4"});
  fogo::FOGO opt(std::vector<torch::Tensor>{w}, o);
  w.mutable_grad() = g.clone();
  opt.step();
  const auto O = fogo::newton_schulz(g, fogo::ns_config(o, o.ns_steps_slow()));
  const auto expected = -0.01 * o.sigma() * std::sqrt(8.0 * 16.0) * O / O.norm();
  const double rel = ((w.detach() - expected).norm() / expected.norm()).item<double>();
  EXPECT_LT(rel, 1e-5) << rel;
  // With the memory on (the defaults) the first step is the same (nothing remembered yet), but
  // after further steps with other gradients the two differ measurably.
  auto w2 = torch::zeros({8, 16}, torch::requires_grad());
  fogo::FOGOOptions full(0.01);
  apply_fogo_flags(full, "full", {"ns_dtype=fp32", "proj_dim=4", "codebook_size=4"});
  fogo::FOGO opt2(std::vector<torch::Tensor>{w2}, full);
  w2.mutable_grad() = g.clone();
  opt2.step();
  for (int k = 0; k < 3; ++k) {
    const auto gk = torch::randn({8, 16});
    w.mutable_grad() = gk.clone();
    w2.mutable_grad() = gk.clone();
    opt.step();
    opt2.step();
  }
  EXPECT_GT(((w2.detach() - w.detach()).norm() / w.detach().norm()).item<double>(), 1e-3);
}

TEST(Optimizers, UpdateRmsIsTheRmsOfTheAppliedChangePerGroup) {
  // SGD with lr 0.1: the update of each group is exactly -0.1 * its gradients, so its RMS is
  // 0.1 * sqrt(sum g^2 / count) over the group's tensors together.
  auto a = torch::zeros({2, 3}, torch::requires_grad());
  auto b = torch::zeros({4}, torch::requires_grad());
  auto c = torch::zeros({5}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups{torch::optim::OptimizerParamGroup({a, b}),
                                                        torch::optim::OptimizerParamGroup({c})};
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1));
  a.mutable_grad() = torch::full({2, 3}, 2.0);
  b.mutable_grad() = torch::full({4}, -1.0);
  c.mutable_grad() = torch::arange(5, torch::kFloat);
  UpdateRms rms;
  EXPECT_TRUE(rms.measure(sgd.param_groups()).empty());  // no snapshot
  rms.snapshot(sgd.param_groups());
  sgd.step();
  const auto v = rms.measure(sgd.param_groups());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0], 0.1 * std::sqrt((6 * 4.0 + 4 * 1.0) / 10), 1e-7);
  EXPECT_NEAR(v[1], 0.1 * std::sqrt((0 + 1 + 4 + 9 + 16) / 5.0), 1e-7);
  Record r;
  add_update_rms(r, {"matrices", "rest"}, v);
  ASSERT_NE(r.get("update_rms/matrices"), nullptr);
  EXPECT_EQ(std::get<double>(*r.get("update_rms/rest")), v[1]);
}

TEST(ReportFamily, MachineNamesTheCpuAndTorchKernels) {
  const std::string m = machine_description();
  EXPECT_NE(m.find("; torch CPU kernels: "), std::string::npos) << m;
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo.good()) GTEST_SKIP() << "no /proc/cpuinfo";
  EXPECT_EQ(m.find("unknown CPU"), std::string::npos) << m;
  EXPECT_NE(m.find(" CPUs)"), std::string::npos) << m;
}

// Issue 47: each of the listed extensions is named exactly when /proc/cpuinfo's first flags line
// has it as a whole word.
TEST(ReportFamily, IsaListsTheCpuinfoFlags) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo.good()) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, flags;
  while (flags.empty() && std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) flags = line.substr(line.find(':') + 1) + " ";
  }
  std::string expected;
  for (const char* flag : {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}) {
    if (flags.find(" " + std::string(flag) + " ") != std::string::npos)
      expected += (expected.empty() ? "" : " ") + std::string(flag);
  }
  EXPECT_EQ(cpu_isa(), expected.empty() ? "none" : expected) << flags;
}

// Issue 47: the binary names the commit it was built from, `git describe --always --dirty` of
// the source tree at build time: a commit of that tree's history (HEAD, or an ancestor when
// commits came after the build), checked with git run now; "unknown" only where git cannot
// describe the tree.
TEST(ReportFamily, BuildCommitIsACommitOfTheSourceTree) {
  const auto run = [](const std::string& args, std::string* out) {
    const std::string cmd = "git -C '" FOGO_SOURCE_DIR "' " + args + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return false;
    char buf[256];
    while (fgets(buf, sizeof buf, p)) *out += buf;
    return pclose(p) == 0;
  };
  std::string head;
  // A copy of the binaries on another machine may not find its source tree.
  if (!run("rev-parse HEAD", &head)) GTEST_SKIP() << FOGO_SOURCE_DIR " is not a git checkout here";
  std::string commit = build_commit();
  ASSERT_NE(commit, "unknown");
  const std::string dirty = "-dirty";
  if (commit.size() > dirty.size() &&
      commit.compare(commit.size() - dirty.size(), dirty.size(), dirty) == 0) {
    commit.resize(commit.size() - dirty.size());
  }
  if (const size_t g = commit.rfind("-g"); g != std::string::npos) commit = commit.substr(g + 2);
  ASSERT_EQ(commit.size(), 12u) << build_commit();  // --abbrev=12
  std::string ignored;
  EXPECT_TRUE(run("merge-base --is-ancestor " + commit + " HEAD", &ignored))
      << build_commit() << " is not HEAD (" << head << ") or one of its ancestors";
}

#ifdef FOGO_WITH_DISTRIBUTED
// The collectives a trainer uses, on three ranks of this binary (tests/rank_launcher.h): each
// rank runs the test below under FOGO_DP_RANK_TEST=1 and checks against what one process knows.
TEST(DataParallelRanks, RowsGatherAndRankZerosValues) {
  if (!std::getenv("FOGO_DP_RANK_TEST")) GTEST_SKIP() << "a rank of the test that follows";
  DataParallel& dp = DataParallel::process();
  ASSERT_EQ(dp.world_size(), 3);
  const int64_t r = dp.rank();
  // 7 rows over 3 ranks: [0, 2), [2, 4), [4, 7); 2 rows: one rank's share is empty.
  const std::vector<std::pair<int64_t, int64_t>> seven{{0, 2}, {2, 4}, {4, 7}};
  EXPECT_EQ(dp.rows(7), seven[static_cast<size_t>(r)]);
  EXPECT_EQ(dp.rows(2).second - dp.rows(2).first, r == 0 ? 0 : 1);
  // Every rank's rows of one [7, 3] tensor (values that do not survive a sloppy sum: -0.0, NaN,
  // denormals, large and small magnitudes), gathered: the whole tensor, bit for bit.
  torch::manual_seed(0);  // the same `whole` on every rank
  auto whole = torch::randn({7, 3}) * torch::tensor({1e30, 1.0, 1e-30}, torch::kFloat);
  whole[0][0] = -0.0f;
  whole[6][2] = std::numeric_limits<float>::quiet_NaN();
  whole[3][1] = std::numeric_limits<float>::denorm_min();
  const auto [b, e] = dp.rows(7);
  const auto gathered = dp.gather_rows(whole.slice(0, b, e).clone(), 7);
  EXPECT_TRUE(torch::equal(gathered.view(torch::kInt), whole.view(torch::kInt)));
  // A wrong share is refused, naming the rows this rank holds.
  EXPECT_THROW(dp.gather_rows(torch::zeros({5, 3}), 7), c10::Error);
  // Rank 0's values, whatever the others pass (another length included).
  const std::vector<double> mine =
      r == 0 ? std::vector<double>{1.5, std::numeric_limits<double>::quiet_NaN(), -2.0}
             : std::vector<double>(static_cast<size_t>(r), 9.0);
  const auto got = dp.from_main(mine);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], 1.5);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], -2.0);
  DataParallel::shutdown_process();
}

TEST(DataParallel, ThreeRanksShareRowsGatherThemAndGetRankZerosValues) {
  const fs::path logs = temp_dir("dp_ranks");
  const auto run = fogo::testing::launch_ranks(
      {.exe = fs::read_symlink("/proc/self/exe").string(),
       .args = {"--gtest_filter=DataParallelRanks.RowsGatherAndRankZerosValues"},
       .nprocs = 3,
       .extra =
           [](int) {
             return fogo::testing::Env{{"FOGO_DP_RANK_TEST", "1"}};
           },
       .log_dir = logs,
       .deadline_s = 120});
  for (const auto& rank : run.ranks) {
    EXPECT_EQ(rank.code, 0) << run.logs();
    // The rank ran the test rather than skipping it.
    EXPECT_NE(rank.log.find("[  PASSED  ] 1 test"), std::string::npos) << run.logs();
    EXPECT_EQ(rank.log.find("SKIPPED"), std::string::npos) << run.logs();
  }
}
#endif
