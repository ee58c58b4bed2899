// The sharded step's saving per rank: one optimizer step of fogo::FOGO and fogo::Muon over a
// model's matrices, replicated (every rank steps everything) against fogo::dist::shard_step (each
// rank runs its share, the results are broadcast), and fogo::Muon in ShardedOptimizer (state
// sharded too). Run it as the ranks of a job:
//
//   OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 --no-python \
//       build/bench/fogo_dist_bench --set gpt2-small --layers 2 --steps 3 --ns-dtype fp32
//
// Every rank steps on the same gradients (the same seed), so the modes compute the same
// parameters; rank 0 prints, per mode, the slowest rank's mean step time (the job waits for it)
// and whether the parameters equal the replicated run's bit for bit.
#include <fogo/distributed.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "model_sets.h"

namespace {

struct Args {
  int64_t set = 0;
  int layers = 12;
  int steps = 3, warmup = 1;
  torch::ScalarType ns_dtype = torch::kBFloat16;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--set") {
      TORCH_CHECK(value == "gpt2-small" || value == "resnet18", "--set: gpt2-small or resnet18");
      a.set = value == "gpt2-small" ? 0 : 1;
    } else if (flag == "--layers") {
      a.layers = std::stoi(value);
    } else if (flag == "--steps") {
      a.steps = std::stoi(value);
    } else if (flag == "--warmup") {
      a.warmup = std::stoi(value);
    } else if (flag == "--ns-dtype") {
      TORCH_CHECK(value == "bf16" || value == "fp32", "--ns-dtype: bf16 or fp32");
      a.ns_dtype = value == "bf16" ? torch::kBFloat16 : torch::kFloat;
    } else {
      TORCH_CHECK(false, "unknown flag ", flag,
                  " (--set, --layers, --steps, --warmup, --ns-dtype, each with a value)");
    }
  }
  TORCH_CHECK(a.steps >= 1 && a.warmup >= 0 && a.layers >= 1,
              "--steps >= 1, --warmup >= 0, --layers >= 1");
  return a;
}

std::vector<torch::Tensor> make_params(const Args& a) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (const auto& shape : fogo::bench::model_shapes(a.set, a.layers)) {
    auto p = (0.02 * torch::randn(shape)).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape);
    params.push_back(p);
  }
  return params;
}

struct Timed {
  double seconds = 0;  ///< the slowest rank's mean step
  std::vector<torch::Tensor> params;
};

/// `warmup` untimed steps, then `steps` timed ones between barriers (the slowest rank's mean).
Timed time_steps(const fogo::dist::ProcessGroup& group, const Args& a,
                 const std::vector<torch::Tensor>& params, const std::function<void()>& step) {
  for (int k = 0; k < a.warmup; ++k) step();
  group.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < a.steps; ++k) step();
  const double mine =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  std::vector<torch::Tensor> all{torch::tensor({mine}, torch::kDouble)};
  group.c10d().allreduce(all, c10d::AllreduceOptions{c10d::ReduceOp::MAX})->wait();
  Timed t{all[0].item<double>(), {}};
  for (const auto& p : params) t.params.push_back(p.detach().clone());
  return t;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    auto group = fogo::dist::init_from_env();
    const auto report = [&](const char* what, const Timed& t, const Timed& truth) {
      if (group.rank() == 0) {
        std::printf("%-28s %9.3f s/step  %5.2fx replicated  %s\n", what, t.seconds,
                    t.seconds / truth.seconds,
                    same(t.params, truth.params) ? "bit-identical" : "DIFFERS");
        std::fflush(stdout);
      }
    };
    if (group.rank() == 0) {
      std::printf("%s (%zu matrices), %lld ranks, NS %s, %d timed steps after %d\n",
                  fogo::bench::set_name(a.set), fogo::bench::model_shapes(a.set, a.layers).size(),
                  static_cast<long long>(group.world_size()),
                  a.ns_dtype == torch::kFloat ? "fp32" : "bf16", a.steps, a.warmup);
    }
    const auto fogo_options = fogo::bench::fogo_preset(a.set, a.ns_dtype);
    const auto muon_options = fogo::MuonOptions(0.02).ns_dtype(a.ns_dtype);
    for (const bool is_fogo : {false, true}) {
      const char* name = is_fogo ? "FOGO" : "fogo::Muon";
      const auto make =
          [&](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        if (is_fogo) return std::make_unique<fogo::FOGO>(std::move(p), fogo_options);
        return std::make_unique<fogo::Muon>(std::move(p), muon_options);
      };
      auto params = make_params(a);
      auto replicated_opt = make(params);
      const Timed replicated = time_steps(group, a, params, [&] { replicated_opt->step(); });
      report((std::string(name) + " replicated").c_str(), replicated, replicated);
      params = make_params(a);
      auto sharded_opt = make(params);
      fogo::dist::shard_step(group, *sharded_opt);
      report((std::string(name) + " shard_step").c_str(),
             time_steps(group, a, params, [&] { sharded_opt->step(); }), replicated);
      if (!is_fogo) {
        params = make_params(a);
        fogo::dist::ShardedOptimizer state_sharded(group, params, make);
        report("fogo::Muon ShardedOptimizer",
               time_steps(group, a, params, [&] { state_sharded.step(); }), replicated);
      }
    }
    group.shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fogo_dist_bench: error: %s\n", e.what());
    return 1;
  }
}
