// resnet_train: ResNet-18 with FOGO, Muon and Adam(W) on the paper's forgetting benchmarks.
#include <chrono>
#include <iostream>

#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/report.h"
#include "common/runtime.h"
#include "config.h"
#include "trainer.h"

int main(int argc, char** argv) {
  return fogo::trainer::run_main("resnet_train", [&] {
    fogo::resnet::Config config;
    fogo::trainer::Cli cli(
        "resnet_train",
        "Trains a CIFAR-style ResNet-18 with each optimizer and seed given, on one of the FOGO\n"
        "paper's forgetting benchmarks (class-imbalanced, class-incremental, domain-incremental),\n"
        "then prints mean ± sd over the seeds and plots accuracy and forgetting over time.\n"
        "Fashion-MNIST from the Debian package dataset-fashion-mnist is the default dataset.\n"
        "Example (CPU, minutes):\n"
        "  resnet_train --optimizers fogo,muon,adam --seeds 0,1 --width 8 --epochs 3 \\\n"
        "               --train-per-class 500 --test-per-class 200");
    fogo::resnet::add_flags(cli, config);
    if (!cli.parse(argc, argv)) return 0;
    fogo::trainer::set_command_line(argc, argv);  // each run's provenance (runs.jsonl)
    // Under torchrun, rank 0 alone prints (docs/trainers.md, "Data-parallel").
    const auto& dp = fogo::trainer::DataParallel::process(
        std::chrono::seconds(config.data_parallel.dist_timeout),
        fogo::trainer::parse_device(config.device));
    fogo::resnet::run_comparison(config, dp.main_only(std::cout));
    fogo::trainer::DataParallel::shutdown_process();
    return 0;
  });
}
