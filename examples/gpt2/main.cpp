// gpt2: GPT-2 pretraining with AdamW, the Muon hybrid and the FOGO hybrid.
//
//   gpt2 prepare-kjv [--out runs/kjv/kjv.txt]       write the default corpus (Debian bible-kjv)
//   gpt2 train   [flags]                            one run
//   gpt2 compare [flags] --optimizers adamw,muon,fogo   same data order and token budget each
//   gpt2 sample  --checkpoint runs/gpt2/checkpoint.pt   generate text from a checkpoint
//
// train and compare run data-parallel when launched by torchrun (WORLD_SIZE > 1):
//   torchrun --standalone --nproc-per-node 4 --no-python gpt2 train [flags]
//
// `gpt2 <command> --help` lists a command's flags. docs/trainers.md (GPT-2) describes them.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/report.h"
#include "train.h"

namespace {

namespace tr = fogo::trainer;

int prepare_kjv_command(const std::string& program, int argc, const char* const* argv) {
  std::string out = "runs/kjv/kjv.txt";
  tr::Cli cli(program, "Writes the KJV text (`bible -f Gen1:1-Rev22:21`) to --out.");
  cli.flag("out", &out, "text file to write");
  if (!cli.parse(argc - 1, argv + 1)) return 0;
  gpt2::prepare_kjv(out);
  std::cout << "wrote " << out << "\n";
  return 0;
}

// compare's own flags: the optimizers, and --lr-sweep with its seeds.
void add_compare_flags(tr::Cli& cli, std::vector<std::string>& optimizers,
                       gpt2::SweepOptions& sweep, std::vector<int64_t>& seeds) {
  cli.flag("optimizers", &optimizers, "optimizers to compare, in order");
  cli.flag("lr-sweep", &sweep.factors,
           "learning-rate sweep: factors of --lr (and --matrix-lr), each scored on a tuning "
           "split of the training data; the best re-run on --seeds, compared on the "
           "validation split with paired t-tests; writes <out>/sweep.md, sweep.png");
  cli.flag("seeds", &seeds, "--lr-sweep: seeds (= data seeds) of the re-runs, >= 3");
  cli.flag("sweep-seeds", &sweep.sweep_seeds,
           "--lr-sweep: score each grid point by the mean over the first N of --seeds (1: "
           "on --seed alone)");
  cli.flag("sweep-extend", &sweep.extend,
           "--lr-sweep: while an optimizer's best factor is at an edge of its grid, add a "
           "factor beyond it, at most this many per optimizer");
}

int train_or_compare(const std::string& command, const std::string& program, int argc,
                     const char* const* argv) {
  gpt2::TrainConfig config;
  std::vector<std::string> optimizers{"adamw", "muon", "fogo"};
  std::string format = "auto";
  tr::Cli cli(program, command == "train"
                           ? "Trains GPT-2 with one optimizer."
                           : "Trains GPT-2 with each optimizer on the same data order and "
                             "token budget; writes <out>/compare.md and <out>/loss.png.");
  gpt2::add_train_flags(cli, config, format);
  gpt2::SweepOptions sweep;
  std::vector<int64_t> seeds{1337, 1338, 1339};
  if (command == "compare") add_compare_flags(cli, optimizers, sweep, seeds);
  if (!cli.parse(argc - 1, argv + 1)) return 0;
  config.data.format = gpt2::parse_data_format(format);
  if (command == "train") {
    const auto result = gpt2::train(config, std::cerr);
    tr::DataParallel::shutdown_process();
    if (result.rank != 0) return 0;  // rank 0 reports for the job
    std::cout << "final val loss " << result.val_loss.back().value << ", "
              << result.tokens_per_second << " tokens/s\n"
              << gpt2::step_time_summary(result) << "\n";
  } else {
    if (sweep.factors.empty()) {
      gpt2::compare(config, optimizers, std::cerr);
    } else {
      sweep.optimizers = optimizers;
      sweep.seeds = seeds;
      if (config.data.tune_fraction > 0) sweep.tune_fraction = config.data.tune_fraction;
      gpt2::lr_sweep(config, sweep, std::cerr);
    }
    tr::DataParallel::shutdown_process();
  }
  return 0;
}

int sample_command(const std::string& program, int argc, const char* const* argv) {
  gpt2::SampleConfig config;
  config.checkpoint = std::string("runs/gpt2/") + tr::kCheckpointFile;
  tr::Cli cli(program, "Generates text from a checkpoint.");
  cli.flag("checkpoint", &config.checkpoint, "checkpoint written by train/compare");
  cli.flag("prompt", &config.prompt, "prompt text (byte-level models)");
  cli.flag("prompt-ids", &config.prompt_ids, "prompt token ids (GPT-2 token models)");
  cli.flag("tokens", &config.tokens, "tokens to generate");
  cli.flag("temperature", &config.temperature, "softmax temperature");
  cli.flag("top-k", &config.top_k, "sample among the k likeliest tokens (0: all)");
  cli.flag("seed", &config.seed, "sampling seed");
  cli.flag("device", &config.device, "cpu, cuda, cuda:N or auto");
  if (!cli.parse(argc - 1, argv + 1)) return 0;
  std::cout << gpt2::sample(config) << "\n";
  return 0;
}

int run(int argc, const char* const* argv) {
  const std::string usage =
      "usage: gpt2 <prepare-kjv|train|compare|sample> [flags]   (gpt2 <command> --help)";
  if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    std::cout << usage << "\n";
    return 0;
  }
  if (argc < 2) throw tr::CliError("no command given; " + usage);
  const std::string command = argv[1];
  const std::string program = "gpt2 " + command;
  if (command == "prepare-kjv") return prepare_kjv_command(program, argc, argv);
  if (command == "train" || command == "compare") {
    return train_or_compare(command, program, argc, argv);
  }
  if (command == "sample") return sample_command(program, argc, argv);
  throw tr::CliError("unknown command '" + command + "'; " + usage);
}

}  // namespace

int main(int argc, char** argv) {
  fogo::trainer::set_command_line(argc, argv);  // each run's provenance (provenance.jsonl)
  return fogo::trainer::run_main("gpt2", [&] { return run(argc, argv); });
}
