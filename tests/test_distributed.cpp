// fogo::dist end to end: real processes on one machine talking over Gloo and a TCPStore.
//
// The binary is its own launcher. Run plainly it is a GoogleTest binary whose tests fork/exec
// copies of itself as the ranks of a job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
// set as torchrun sets them, on a free loopback port). Run with --rank-scenario=NAME (or under
// torchrun: `torchrun --nproc-per-node 2 --no-python fogo_dist_tests --rank-scenario=NAME`) it is
// one rank of scenario NAME: it exits 0 when every check passed, 3 with a line
// "FOGO_DIST_ERROR: <message>" when fogo raised an error, 4 when a check failed.
//
// The truth every rank compares against is the single-process computation, done inside each rank
// on the whole batch without any communication.
#include <dirent.h>
#include <fogo/distributed.h>
#include <fogo/fogo_optimizer.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <fogo/newton_schulz.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fogo_private/distributed/internal.h"
#include "fogo_private/frame/agreement.h"
#include "rank_launcher.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// =============================================================================================
// Rank side: scenarios

struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define RANK_CHECK(cond, ...)                                                             \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::ostringstream out_;                                                            \
      out_ << __FILE__ << ":" << __LINE__ << ": check failed: " #cond " " << __VA_ARGS__; \
      throw CheckFailed(out_.str());                                                      \
    }                                                                                     \
  } while (0)

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

fs::path out_dir() {
  const char* v = std::getenv("FOGO_DIST_OUT");
  return v ? fs::path(v) : fs::temp_directory_path();
}

/// The scenario's group: a CPU job (Gloo alone, whatever GPUs the machine has) but for the
/// "cuda" and "cuda_join" scenarios, whose tensors live on the rank's GPU, and "gloo_cuda",
/// which names no device (Backend::Auto settles on NCCL or Gloo from the ranks' GPUs).
fogo::dist::ProcessGroup make_group(const std::string& scenario) {
  auto options = fogo::dist::ProcessGroupOptions().timeout(
      std::chrono::milliseconds(env_int("FOGO_DIST_TIMEOUT_MS", 30000)));
  if (scenario == "cuda" || scenario == "cuda_join") {
    options.device(torch::Device(torch::kCUDA));
  } else if (scenario != "gloo_cuda") {
    options.device(torch::Device(torch::kCPU));
  }
  return fogo::dist::init_from_env(options);
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

/// Gradients of `params` after backward of `loss_fn()` from zero, copied out.
std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params,
                                    const std::function<torch::Tensor()>& loss_fn) {
  for (auto p : params) {
    p.mutable_grad() = torch::Tensor();
  }
  loss_fn().backward();
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return out;
}

void copy_params(torch::nn::Module& to, const torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  auto dst = to.parameters();
  auto src = from.parameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i].copy_(src[i]);
  }
}

torch::nn::Sequential mlp(std::vector<int64_t> widths, bool bias, torch::Dtype dtype) {
  torch::nn::Sequential net;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    net->push_back(
        torch::nn::Linear(torch::nn::LinearOptions(widths[i], widths[i + 1]).bias(bias)));
    if (i + 2 < widths.size()) {
      net->push_back(torch::nn::Tanh());
    }
  }
  net->to(dtype);
  return net;
}

// --- world 2, batch b per rank == one process, batch 2b -------------------------------------

/// A: dyadic data and weights make every gradient value exact in fp32, whatever the reduction
/// order: the averaged gradients must equal the full-batch ones bit for bit.
void dyadic_first_step(const fogo::dist::ProcessGroup& group) {
  const int64_t b = 8, rank = group.rank();
  torch::manual_seed(1);
  auto model = torch::nn::Linear(8, 4);
  auto reference = torch::nn::Linear(8, 4);
  {
    torch::NoGradGuard no_grad;
    model->weight.copy_(torch::randint(-4, 5, {4, 8}) / 8.0);
    model->bias.copy_(torch::randint(-4, 5, {4}) / 8.0);
  }
  copy_params(*reference, *model);
  const auto x = torch::randint(-2, 3, {2 * b, 8}) / 2.0;
  const auto y = torch::randint(-4, 5, {2 * b, 4}) / 4.0;
  fogo::dist::GradientAverager averager(group, model->parameters());
  torch::mse_loss(model->forward(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b)).backward();
  averager.finish();
  const auto truth =
      grads_of(reference->parameters(), [&] { return torch::mse_loss(reference->forward(x), y); });
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    RANK_CHECK(torch::equal(params[i].grad(), truth[i]),
               "dyadic gradient " << i << " differs from the full batch by "
                                  << max_abs(params[i].grad() - truth[i]));
  }
}

torch::Tensor x_last(const torch::nn::Sequential&) { return torch::ones({1, 6}, torch::kFloat64); }

/// B: an fp64 MLP trained 6 SGD steps, with and without gradient accumulation. Tolerance: the
/// only difference from the single process is the order of the reductions over the 2b = 16
/// samples (two halves of 8 then one sum, instead of one sum of 16) and BLAS blocking; in fp64
/// (unit roundoff 1.1e-16) that moves a gradient by a few ulps of the sum of absolute terms.
/// 1e-12 relative to the largest entry leaves ~1e4 ulps of margin, while a real mistake (a
/// missing average, a stale or mis-assigned bucket, a wrong shard) is of order 1e-1.
void mlp_sgd(const fogo::dist::ProcessGroup& group, bool accumulate) {
  constexpr double kTol = 1e-12;
  const int64_t b = 8, rank = group.rank(), steps = 6;
  torch::manual_seed(2);
  auto model = mlp({6, 16, 16, 3}, true, torch::kFloat64);
  auto reference = mlp({6, 16, 16, 3}, true, torch::kFloat64);
  copy_params(*reference, *model);
  // A small bucket size: several buckets, filled and launched during backward.
  fogo::dist::GradientAverager averager(group, *model,
                                        fogo::dist::GradientAveragerOptions().bucket_bytes(512));
  RANK_CHECK(averager.buckets().size() >= 3, "expected several buckets");
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t step = 0; step < steps; ++step) {
    torch::manual_seed(100 + step);
    const auto x = torch::randn({2 * b, 6}, torch::kFloat64);
    const auto y = torch::randn({2 * b, 3}, torch::kFloat64);
    const auto local_x = x.narrow(0, rank * b, b), local_y = y.narrow(0, rank * b, b);
    opt.zero_grad();
    if (accumulate) {
      // Two micro-batches of b/2; the first must not communicate.
      const auto half = b / 2;
      std::vector<torch::Tensor> first;
      {
        auto no_sync = averager.no_sync();
        first = grads_of(model->parameters(), [&] {
          return torch::mse_loss(model->forward(local_x.narrow(0, 0, half)),
                                 local_y.narrow(0, 0, half));
        });
        opt.zero_grad();
        (0.5 *
         torch::mse_loss(model->forward(local_x.narrow(0, 0, half)), local_y.narrow(0, 0, half)))
            .backward();
      }
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        RANK_CHECK(torch::equal(params[i].grad(), 0.5 * first[i]),
                   "under no_sync() gradient " << i << " changed: it was communicated");
      }
      (0.5 * torch::mse_loss(model->forward(local_x.narrow(0, half, half)),
                             local_y.narrow(0, half, half)))
          .backward();
    } else {
      // Backward of the first layer runs after the later layers' gradients are accumulated:
      // their buckets must already be on the wire by then.
      size_t started_before_first_layer = 0;
      auto h = local_x;
      for (size_t l = 0; l < model->size(); ++l) {
        auto* linear = model->ptr(l)->as<torch::nn::LinearImpl>();
        h = linear ? linear->forward(h) : torch::tanh(h);
        if (l == 0) {
          h.register_hook([&](const torch::Tensor&) {
            started_before_first_layer = averager.buckets_started();
          });
        }
      }
      torch::mse_loss(h, local_y).backward();
      RANK_CHECK(
          started_before_first_layer >= 2 && started_before_first_layer < averager.buckets().size(),
          started_before_first_layer << " of " << averager.buckets().size()
                                     << " buckets started before the first layer's "
                                        "backward");
    }
    averager.finish();
    const auto truth = grads_of(reference->parameters(),
                                [&] { return torch::mse_loss(reference->forward(x), y); });
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto err = max_abs(params[i].grad() - truth[i]);
      RANK_CHECK(err <= kTol * max_abs(truth[i]),
                 "step " << step << " gradient " << i << ": |averaged - full batch| = " << err
                         << " > " << kTol << " * " << max_abs(truth[i]));
    }
    opt.step();
    ref_opt.step();
  }
  if (!accumulate) {
    // Two backward passes without finish() or no_sync(): an error naming the parameter.
    try {
      torch::mse_loss(model->forward(x_last(model)), torch::zeros({1, 3}, torch::kFloat64))
          .backward();
      torch::mse_loss(model->forward(x_last(model)), torch::zeros({1, 3}, torch::kFloat64))
          .backward();
      RANK_CHECK(false, "a second backward before finish() was accepted");
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      RANK_CHECK(what.find("was accumulated twice") != std::string::npos &&
                     what.find("the gradient of 4.") != std::string::npos,
                 "unexpected error: " << what);
    }
  }
  const auto params = model->parameters(), truth = reference->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto err = max_abs(params[i] - truth[i]);
    RANK_CHECK(err <= kTol * max_abs(truth[i]),
               "parameter " << i << " after " << steps << " steps: off by " << err);
  }
}

/// C: parameters without gradients. `a` is used on every rank, `b` on rank 1 only, `c` never:
/// a's gradient is the average, b's is rank 1's / 2 on both ranks, c's stays undefined.
void unused_parameters(const fogo::dist::ProcessGroup& group) {
  torch::manual_seed(3);
  auto a = torch::randn({5, 3}, torch::kFloat64).requires_grad_(true);
  auto bp = torch::randn({3}, torch::kFloat64).requires_grad_(true);
  auto c = torch::randn({4}, torch::kFloat64).requires_grad_(true);
  const auto x = torch::randn({2, 4, 5}, torch::kFloat64);
  // Two steps: the second finds the hooks and bookkeeping reset by the first.
  fogo::dist::GradientAverager averager(group, {a, bp, c},
                                        fogo::dist::GradientAveragerOptions().bucket_bytes(8));
  const auto loss_on = [&](int64_t r) {
    auto h = x[r].mm(a);
    return r == 1 ? (h + bp).pow(2).sum() : h.pow(2).sum();
  };
  for (int step = 0; step < 2; ++step) {
    std::vector<torch::Tensor> g0, g1;
    {
      auto no_sync = averager.no_sync();  // the single-process truth, without the hooks
      g0 = grads_of({a, bp, c}, [&] { return loss_on(0); });
      g1 = grads_of({a, bp, c}, [&] { return loss_on(1); });
    }
    for (auto p : {a, bp, c}) {
      p.mutable_grad() = torch::Tensor();
    }
    loss_on(group.rank()).backward();
    averager.finish();
    RANK_CHECK(torch::equal(a.grad(), (g0[0] + g1[0]) / 2), "a: not the average");
    RANK_CHECK(bp.grad().defined() && torch::equal(bp.grad(), g1[1] / 2),
               "b (used on rank 1 only): expected rank 1's gradient / 2");
    RANK_CHECK(!c.grad().defined(), "c (used nowhere) got a gradient");
  }
}

void scenario_equivalence(const fogo::dist::ProcessGroup& group) {
  dyadic_first_step(group);
  mlp_sgd(group, false);
  mlp_sgd(group, true);
  unused_parameters(group);
}

// --- replicated FOGO and Muon: bit-identical ranks, bit-identical to one process --------------

fogo::FOGOOptions small_fogo() {
  return fogo::FOGOOptions(0.02).proj_dim(16).codebook_size(8).reseed_every(4).freeze_per_task(3);
}

/// World 2, 10 steps with a task boundary after step 5. The single-process truth: the gradients
/// of both ranks' shards computed here, averaged as (g0 + g1) / 2 (what an all-reduce of two
/// values computes, addition being commutative), stepped by an identical optimizer. Ranks write
/// their final parameters and FOGO memory for the launcher to compare across ranks.
template <typename Optimizer, typename Options>
void replicated_run(const fogo::dist::ProcessGroup& group, const std::string& name,
                    const Options& options, bool fogo) {
  const int64_t b = 6, rank = group.rank(), steps = 10;
  torch::manual_seed(4);
  auto model = mlp({12, 24, 24, 5}, false, torch::kFloat32);
  auto reference = mlp({12, 24, 24, 5}, false, torch::kFloat32);
  copy_params(*reference, *model);
  // Every rank starts from rank 0's model even if their seeds differed.
  fogo::dist::broadcast_parameters(group, *model);
  RANK_CHECK(torch::equal(model->parameters()[0], reference->parameters()[0]), "broadcast");
  fogo::dist::GradientAverager averager(group, model->parameters(),
                                        fogo::dist::GradientAveragerOptions().bucket_bytes(1024));
  Optimizer opt(model->parameters(), options);
  Optimizer ref_opt(reference->parameters(), options);
  for (int64_t step = 0; step < steps; ++step) {
    if constexpr (std::is_same_v<Optimizer, fogo::FOGO>) {
      if (step == steps / 2) {
        opt.task_boundary();
        ref_opt.task_boundary();
      }
    }
    torch::manual_seed(200 + step);
    const auto x = torch::randn({2 * b, 12}) * (step < steps / 2 ? 1.0 : -2.0);
    const auto y = torch::randn({2 * b, 5});
    const auto loss = [&](torch::nn::Sequential& m, int64_t r) {
      return torch::mse_loss(m->forward(x.narrow(0, r * b, b)), y.narrow(0, r * b, b));
    };
    opt.zero_grad();
    loss(model, rank).backward();
    averager.finish();
    const auto g0 = grads_of(reference->parameters(), [&] { return loss(reference, 0); });
    const auto g1 = grads_of(reference->parameters(), [&] { return loss(reference, 1); });
    auto ref_params = reference->parameters();
    for (size_t i = 0; i < ref_params.size(); ++i) {
      ref_params[i].mutable_grad() = (g0[i] + g1[i]) / 2;
      // Muon and FOGO are invariant to the gradient's scale: check the average itself too.
      RANK_CHECK(torch::equal(model->parameters()[i].grad(), ref_params[i].grad()),
                 name << ": step " << step << " averaged gradient " << i << " differs");
    }
    opt.step();
    ref_opt.step();
    fogo::dist::check_lockstep(group, fogo::dist::module_state(*model));
  }
  std::vector<torch::Tensor> saved;
  const auto params = model->parameters(), truth = reference->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    RANK_CHECK(torch::equal(params[i], truth[i]), name << ": parameter " << i
                                                       << " differs from the single process by "
                                                       << max_abs(params[i] - truth[i]));
    saved.push_back(params[i].detach().clone());
  }
  if constexpr (std::is_same_v<Optimizer, fogo::FOGO>) {
    const auto memory = fogo::dist::fogo_memory(opt);
    const auto ref_memory = fogo::dist::fogo_memory(ref_opt);
    RANK_CHECK(memory.size() == ref_memory.size() && memory.size() >= 5,
               name << ": memory tensors " << memory.size());
    for (size_t i = 0; i < memory.size(); ++i) {
      RANK_CHECK(torch::equal(memory[i].second, ref_memory[i].second),
                 name << ": " << memory[i].first << " differs from the single process");
      saved.push_back(memory[i].second);
    }
    fogo::dist::check_lockstep(group, memory);
  }
  (void)fogo;
  torch::save(saved, (out_dir() / (name + "_rank" + std::to_string(rank) + ".pt")).string());
}

void scenario_replicated(const fogo::dist::ProcessGroup& group) {
  replicated_run<fogo::FOGO>(group, "fogo", small_fogo(), true);
  replicated_run<fogo::Muon>(group, "muon", fogo::MuonOptions(0.02), false);
}

// --- sharded Muon == replicated Muon ---------------------------------------------------------

/// 8 steps of fogo::Muon on averaged gradients, replicated (every rank steps every parameter) and
/// sharded (each parameter stepped by its owner, then broadcast): bit-identical parameters. With
/// `options` Muon's defaults and NorMuon (whose second moments live on their owners).
void scenario_sharded(const fogo::dist::ProcessGroup& group, const fogo::MuonOptions& options) {
  const int64_t b = 6, rank = group.rank(), world = group.world_size(), steps = 8;
  torch::manual_seed(8);
  auto replicated = mlp({12, 24, 24, 24, 5}, false, torch::kFloat32);
  auto sharded = mlp({12, 24, 24, 24, 5}, false, torch::kFloat32);
  copy_params(*sharded, *replicated);
  fogo::dist::GradientAverager averager(group, replicated->parameters());
  fogo::Muon opt(replicated->parameters(), options);
  fogo::dist::ShardedOptimizer sharded_opt(
      group, sharded->parameters(), [&](std::vector<torch::Tensor> owned) {
        return std::make_unique<fogo::Muon>(std::move(owned), options);
      });
  // Costs 13824 (24x24, twice), 3456 (24x12), 600 (5x24): each rank owns something, and the two
  // same-shape matrices (one batched Newton–Schulz chain when replicated) land on two ranks.
  const auto& owners = sharded_opt.owners();
  RANK_CHECK(owners[1] != owners[2], "the two 24x24 matrices share an owner");
  int64_t mine = 0;
  for (const auto o : owners) {
    mine += o == rank;
  }
  RANK_CHECK(mine >= 1 && sharded_opt.local(), "rank " << rank << " owns nothing");
  for (int64_t step = 0; step < steps; ++step) {
    torch::manual_seed(300 + step);
    const auto x = torch::randn({world * b, 12});
    const auto y = torch::randn({world * b, 5});
    opt.zero_grad();
    sharded_opt.zero_grad();
    torch::mse_loss(replicated->forward(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b))
        .backward();
    averager.finish();
    auto from = replicated->parameters(), to = sharded->parameters();
    for (size_t i = 0; i < from.size(); ++i) {
      to[i].mutable_grad() = from[i].grad().clone();
    }
    opt.step();
    sharded_opt.step();
  }
  // Only the owned parameters have state on this rank.
  RANK_CHECK(static_cast<int64_t>(sharded_opt.local()->state().size()) == mine,
             "state of " << sharded_opt.local()->state().size() << " parameters, owns " << mine);
  const auto a = replicated->parameters(), s = sharded->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    RANK_CHECK(torch::equal(a[i], s[i]), "parameter " << i << " (owner " << owners[i]
                                                      << "): sharded differs from replicated by "
                                                      << max_abs(a[i] - s[i]));
  }
  fogo::dist::check_lockstep(group, fogo::dist::module_state(*sharded));
}

/// FOGO with its per-parameter stages sharded (shard_step) against replicated
/// FOGO, 10 steps with a task boundary: parameters, memory and telemetry bit-identical.
void sharded_fogo(const fogo::dist::ProcessGroup& group) {
  const int64_t b = 6, rank = group.rank(), world = group.world_size(), steps = 10;
  torch::manual_seed(9);
  auto replicated = mlp({12, 24, 24, 24, 5}, false, torch::kFloat32);
  auto sharded = mlp({12, 24, 24, 24, 5}, false, torch::kFloat32);
  copy_params(*sharded, *replicated);
  fogo::dist::GradientAverager averager(group, replicated->parameters());
  fogo::FOGO opt(replicated->parameters(), small_fogo());
  fogo::FOGO sharded_opt(sharded->parameters(), small_fogo());
  const auto owners = fogo::dist::shard_step(group, sharded_opt);
  RANK_CHECK(owners.size() == 4 && owners[1] != owners[2] &&
                 std::count(owners.begin(), owners.end(), rank) >= 1,
             "owners of the FOGO parameters");
  for (int64_t step = 0; step < steps; ++step) {
    if (step == steps / 2) {
      opt.task_boundary();
      sharded_opt.task_boundary();
    }
    torch::manual_seed(400 + step);
    const auto x = torch::randn({world * b, 12}) * (step < steps / 2 ? 1.0 : -2.0);
    const auto y = torch::randn({world * b, 5});
    opt.zero_grad();
    sharded_opt.zero_grad();
    torch::mse_loss(replicated->forward(x.narrow(0, rank * b, b)), y.narrow(0, rank * b, b))
        .backward();
    averager.finish();
    auto from = replicated->parameters(), to = sharded->parameters();
    for (size_t i = 0; i < from.size(); ++i) {
      to[i].mutable_grad() = from[i].grad().clone();
    }
    opt.step();
    sharded_opt.step();
  }
  const auto a = replicated->parameters(), s = sharded->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    RANK_CHECK(torch::equal(a[i], s[i]), "FOGO parameter "
                                             << i << ": sharded differs from replicated by "
                                             << max_abs(a[i] - s[i]));
  }
  const auto memory = fogo::dist::fogo_memory(opt),
             sharded_memory = fogo::dist::fogo_memory(sharded_opt);
  RANK_CHECK(memory.size() == sharded_memory.size() && memory.size() >= 5, "memory tensors");
  for (size_t i = 0; i < memory.size(); ++i) {
    RANK_CHECK(torch::equal(memory[i].second, sharded_memory[i].second),
               memory[i].first << ": sharded differs from replicated");
  }
  const auto t = opt.telemetry().at(0), ts = sharded_opt.telemetry().at(0);
  RANK_CHECK(t.rbar == ts.rbar && t.gamma_st == ts.gamma_st && t.delta_ratio == ts.delta_ratio &&
                 t.codebook_entropy == ts.codebook_entropy && t.frozen == ts.frozen,
             "telemetry differs");
  auto state = fogo::dist::module_state(*sharded);
  state.insert(state.end(), sharded_memory.begin(), sharded_memory.end());
  fogo::dist::check_lockstep(group, state);
}

/// shard_step on fogo::Muon (`muon_options`: Muon's defaults, or NorMuon, whose second moments
/// travel from their owners) and on a hybrid (FOGO matrix side, with NorMuon as Muon; AdamW on
/// the biases, two codebook groups by shape) against the same optimizers replicated, 8 steps:
/// parameters, momenta, second moments and FOGO memory bit-identical, on every rank.
void sharded_step_of(const fogo::dist::ProcessGroup& group, const fogo::MuonOptions& muon_options) {
  const int64_t b = 6, rank = group.rank(), world = group.world_size(), steps = 8;
  torch::manual_seed(10);
  auto replicated = mlp({12, 24, 24, 24, 5}, true, torch::kFloat32);
  auto sharded = mlp({12, 24, 24, 24, 5}, true, torch::kFloat32);
  copy_params(*sharded, *replicated);
  const auto muon_of = [&](torch::nn::Module& m) {
    std::vector<torch::Tensor> matrices;
    for (auto& p : m.parameters()) {
      if (p.dim() == 2) matrices.push_back(p);
    }
    return fogo::Muon(matrices, muon_options);
  };
  // FOGO with NorMuon on its final update when Muon has it: its second moments, too, travel from
  // their owners.
  const auto hybrid_of = [&](torch::nn::Module& m) {
    return fogo::make_hybrid<fogo::FOGO>(m, small_fogo().normuon(muon_options.normuon()),
                                         torch::optim::AdamWOptions(0.01), {}, fogo::shape_key);
  };
  auto muon_replicated = muon_of(*replicated), muon_sharded = muon_of(*sharded);
  auto twin_replicated = mlp({12, 24, 24, 24, 5}, true, torch::kFloat32);
  auto twin_sharded = mlp({12, 24, 24, 24, 5}, true, torch::kFloat32);
  copy_params(*twin_replicated, *replicated);
  copy_params(*twin_sharded, *replicated);
  auto hybrid_replicated = hybrid_of(*twin_replicated), hybrid_sharded = hybrid_of(*twin_sharded);
  const auto muon_owners = fogo::dist::shard_step(group, muon_sharded);
  const auto fogo_owners = fogo::dist::shard_step(group, hybrid_sharded);
  RANK_CHECK(std::count(muon_owners.begin(), muon_owners.end(), rank) >= 1 &&
                 std::count(fogo_owners.begin(), fogo_owners.end(), rank) >= 1,
             "rank " << rank << " owns nothing");
  for (int64_t step = 0; step < steps; ++step) {
    if (step == steps / 2) {
      hybrid_replicated.matrix<fogo::FOGO>()->task_boundary();
      hybrid_sharded.matrix<fogo::FOGO>()->task_boundary();
    }
    torch::manual_seed(700 + step);
    const auto x = torch::randn({world * b, 12});
    const auto y = torch::randn({world * b, 5});
    for (auto* m : {&replicated, &sharded, &twin_replicated, &twin_sharded}) {
      (*m)->zero_grad();
      torch::mse_loss((*m)->forward(x), y).backward();  // the same full-batch gradient everywhere
    }
    muon_replicated.step();
    muon_sharded.step();
    hybrid_replicated.step();
    hybrid_sharded.step();
  }
  const auto expect_equal = [&](torch::nn::Module& a, torch::nn::Module& s, const char* what) {
    const auto pa = a.parameters(), ps = s.parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      RANK_CHECK(torch::equal(pa[i], ps[i]), what << " parameter " << i
                                                  << ": sharded differs from replicated by "
                                                  << max_abs(pa[i] - ps[i]));
    }
  };
  expect_equal(*replicated, *sharded, "Muon");
  expect_equal(*twin_replicated, *twin_sharded, "hybrid FOGO");
  const auto pr = replicated->parameters(), psh = sharded->parameters();
  for (size_t i = 0; i < pr.size(); ++i) {
    if (pr[i].dim() != 2) continue;
    const auto state = [](fogo::Muon& opt, const torch::Tensor& p) {
      return static_cast<fogo::MuonParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    };
    RANK_CHECK(state(muon_replicated, pr[i]) == state(muon_sharded, psh[i]),
               "Muon momentum or second moment " << i << " differs (every rank keeps every state)");
    RANK_CHECK(state(muon_sharded, psh[i]).second_moment().defined() == muon_options.normuon(),
               "second moment " << i << " defined where normuon is off, or missing");
  }
  const auto tr = twin_replicated->parameters(), ts = twin_sharded->parameters();
  for (size_t i = 0; i < tr.size(); ++i) {
    if (tr[i].dim() != 2) continue;
    const auto state = [](fogo::HybridOptimizer& opt, const torch::Tensor& p) {
      return static_cast<fogo::FOGOParamState&>(
          *opt.matrix<fogo::FOGO>()->state().at(p.unsafeGetTensorImpl()));
    };
    RANK_CHECK(state(hybrid_replicated, tr[i]) == state(hybrid_sharded, ts[i]),
               "FOGO momenta or second moment " << i << " differ (every rank keeps every state)");
    RANK_CHECK(state(hybrid_sharded, ts[i]).second_moment().defined() == muon_options.normuon(),
               "FOGO second moment " << i << " defined where normuon is off, or missing");
  }
  const auto memory = fogo::dist::fogo_memory(*hybrid_replicated.matrix<fogo::FOGO>()),
             sharded_memory = fogo::dist::fogo_memory(*hybrid_sharded.matrix<fogo::FOGO>());
  RANK_CHECK(memory.size() == sharded_memory.size() && memory.size() >= 10, "memory tensors");
  for (size_t i = 0; i < memory.size(); ++i) {
    RANK_CHECK(torch::equal(memory[i].second, sharded_memory[i].second),
               memory[i].first << ": sharded differs from replicated");
  }
  auto state = fogo::dist::module_state(*sharded);
  state.insert(state.end(), sharded_memory.begin(), sharded_memory.end());
  fogo::dist::check_lockstep(group, state);
  // Another optimizer type is refused, naming the way that works.
  auto adam = torch::optim::Adam(sharded->parameters());
  try {
    fogo::dist::shard_step(group, adam);
    RANK_CHECK(false, "shard_step accepted torch::optim::Adam");
  } catch (const c10::Error& e) {
    RANK_CHECK(
        std::string(e.what_without_backtrace()).find("ShardedOptimizer") != std::string::npos,
        "the error does not point to ShardedOptimizer: " << e.what_without_backtrace());
  }
}

/// shard_step on fogo::FOGO with a stack of experts (batch_dims 1) and fused weights in unequal
/// blocks (a group each): each expert and block has its owner; against FOGO replicated, 6 steps
/// with a task boundary: parameters and memory bit-identical on every rank. On a CUDA `device`
/// (issue 44; ranks sharing the GPU through Gloo) the parameters to 1e-5 (the codebook's float
/// atomics, and Newton-Schulz batched otherwise by the owners than by the replicated step).
void sharded_fogo_stacks(const fogo::dist::ProcessGroup& group,
                         torch::Device device = torch::kCPU) {
  const bool exact = device.is_cpu();
  torch::manual_seed(13);
  const std::vector<std::vector<int64_t>> shapes = {{4, 12, 10}, {24, 10}};
  std::vector<torch::Tensor> replicated, sharded;
  for (const auto& shape : shapes) {
    replicated.push_back(torch::randn(shape).to(device).requires_grad_(true));
    sharded.push_back(replicated.back().detach().clone().requires_grad_(true));
  }
  const auto fogo_of = [&](const std::vector<torch::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{p[0]},
                        std::make_unique<fogo::FOGOOptions>(small_fogo().batch_dims(1)));
    groups.emplace_back(std::vector<torch::Tensor>{p[1]},
                        std::make_unique<fogo::FOGOOptions>(small_fogo().blocks({12, 6, 6})));
    return fogo::FOGO(groups, small_fogo());
  };
  auto fogo_replicated = fogo_of(replicated), fogo_sharded = fogo_of(sharded);
  const auto owners = fogo::dist::shard_step(group, fogo_sharded);
  RANK_CHECK(owners.size() == 4 + 3, "one owner per matrix, got " << owners.size());
  RANK_CHECK(std::set<int64_t>(owners.begin(), owners.begin() + 4).size() >= 2,
             "the stack's experts were not split across owners");
  for (int64_t step = 0; step < 6; ++step) {
    if (step == 3) {
      fogo_replicated.task_boundary();
      fogo_sharded.task_boundary();
    }
    torch::manual_seed(950 + step);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const torch::Tensor g = torch::randn(shapes[i]).to(device);
      replicated[i].mutable_grad() = g.clone();
      sharded[i].mutable_grad() = g.clone();
    }
    fogo_replicated.step();
    fogo_sharded.step();
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    RANK_CHECK(exact ? torch::equal(replicated[i], sharded[i])
                     : torch::allclose(replicated[i], sharded[i], 1e-5, 1e-6),
               "FOGO parameter " << i << " on " << device << ": sharded differs from replicated by "
                                 << max_abs(replicated[i] - sharded[i]));
  }
  if (!exact) {
    fogo::dist::check_lockstep(group, {{"stack", sharded[0]}, {"fused", sharded[1]}});
    return;
  }
  const auto memory = fogo::dist::fogo_memory(fogo_replicated),
             sharded_memory = fogo::dist::fogo_memory(fogo_sharded);
  RANK_CHECK(memory.size() == sharded_memory.size() && !memory.empty(), "memory tensors");
  for (size_t i = 0; i < memory.size(); ++i) {
    RANK_CHECK(torch::equal(memory[i].second, sharded_memory[i].second),
               memory[i].first << ": sharded differs from replicated");
  }
  fogo::dist::check_lockstep(group, {{"stack", sharded[0]}, {"fused", sharded[1]}});
}

/// shard_step on fogo::Muon with a stack of experts (batch_dims 1) and a fused weight cut into
/// unequal blocks, beside a plain matrix: the unit of work is each matrix, so the experts of the
/// stack are split across owners; against the same Muon replicated, 6 steps (expert 0 idle, an
/// all-zero gradient slice, from step 3): parameters, momenta and second moments bit-identical on
/// every rank. On a CUDA `device` (issue 44; ranks sharing the GPU through Gloo) to fp32 rounding:
/// the owners batch Newton-Schulz otherwise than the replicated step.
void sharded_stacks(const fogo::dist::ProcessGroup& group, bool normuon,
                    torch::Device device = torch::kCPU) {
  const bool exact = device.is_cpu();
  const auto same = [&](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() == b.defined() &&
           (!a.defined() || (exact ? torch::equal(a, b) : torch::allclose(a, b, 1e-5, 1e-6)));
  };
  torch::manual_seed(12);
  const std::vector<std::vector<int64_t>> shapes = {{4, 12, 10}, {24, 10}, {10, 12}};
  std::vector<torch::Tensor> replicated, sharded;
  for (const auto& shape : shapes) {
    replicated.push_back(torch::randn(shape).to(device).requires_grad_(true));
    sharded.push_back(replicated.back().detach().clone().requires_grad_(true));
  }
  const auto muon_of = [&](const std::vector<torch::Tensor>& p) {
    const auto o = fogo::MuonOptions(0.02).normuon(normuon);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{p[0]},
                        std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(o).batch_dims(1)));
    groups.emplace_back(
        std::vector<torch::Tensor>{p[1]},
        std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(o).blocks({12, 6, 6})));
    groups.emplace_back(std::vector<torch::Tensor>{p[2]});
    return fogo::Muon(groups, o);
  };
  auto muon_replicated = muon_of(replicated), muon_sharded = muon_of(sharded);
  const auto owners = fogo::dist::shard_step(group, muon_sharded);
  RANK_CHECK(owners.size() == 4 + 3 + 1, "one owner per matrix, got " << owners.size());
  RANK_CHECK(std::set<int64_t>(owners.begin(), owners.begin() + 4).size() >= 2,
             "the stack's experts were not split across owners");
  RANK_CHECK(std::count(owners.begin(), owners.end(), group.rank()) >= 1,
             "rank " << group.rank() << " owns nothing");
  for (int64_t step = 0; step < 6; ++step) {
    torch::manual_seed(900 + step);
    for (size_t i = 0; i < shapes.size(); ++i) {
      torch::Tensor g = torch::randn(shapes[i]).to(device);
      if (i == 0 && step >= 3) g[0].zero_();
      replicated[i].mutable_grad() = g.clone();
      sharded[i].mutable_grad() = g.clone();
    }
    muon_replicated.step();
    muon_sharded.step();
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    RANK_CHECK(same(replicated[i], sharded[i]),
               "parameter " << i << " on " << device << ": sharded differs from replicated by "
                            << max_abs(replicated[i] - sharded[i]));
    const auto state = [](fogo::Muon& opt, const torch::Tensor& p) {
      return static_cast<fogo::MuonParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    };
    const auto &mine = state(muon_sharded, sharded[i]),
               &ref = state(muon_replicated, replicated[i]);
    RANK_CHECK(same(mine.momentum_buffer(), ref.momentum_buffer()) &&
                   same(mine.second_moment(), ref.second_moment()),
               "momentum or second moment " << i << " differs");
    RANK_CHECK(state(muon_sharded, sharded[i]).second_moment().defined() == normuon,
               "second moment " << i);
  }
  fogo::dist::check_lockstep(group, {{"stack", sharded[0]}, {"fused", sharded[1]}});
}

// --- ShardedOptimizer checkpoints do not depend on the world size ------------------------------

/// Muon (on the matrices) and LibTorch's AdamW (on the biases, whose state has a step count), as
/// sharded optimizers over one MLP: every rank computes the same full-batch gradient, so the
/// trajectory depends on nothing but the optimizer arithmetic.
struct ShardedPair {
  torch::nn::Sequential model = [] {
    torch::manual_seed(11);
    return mlp({12, 24, 24, 24, 5}, true, torch::kFloat32);
  }();
  std::vector<torch::Tensor> matrices, biases;
  std::unique_ptr<fogo::dist::ShardedOptimizer> muon, adamw;

  explicit ShardedPair(const fogo::dist::ProcessGroup& group) {
    for (auto& p : model->parameters()) {
      (p.dim() == 2 ? matrices : biases).push_back(p);
    }
    // Newton-Schulz in bf16, not auto: auto decides by timing, and on a loaded machine the
    // world-2 run that writes the checkpoint and a later job that resumes it can decide apart.
    muon = std::make_unique<fogo::dist::ShardedOptimizer>(
        group, matrices, [](std::vector<torch::Tensor> own) {
          return std::make_unique<fogo::Muon>(std::move(own),
                                              fogo::MuonOptions(0.02).ns_dtype(torch::kBFloat16));
        });
    adamw = std::make_unique<fogo::dist::ShardedOptimizer>(
        group, biases, [](std::vector<torch::Tensor> own) {
          return std::make_unique<torch::optim::AdamW>(std::move(own),
                                                       torch::optim::AdamWOptions(0.01));
        });
  }

  /// Step `step` (0-based) of the trajectory; at step 2 the learning rates change, as a
  /// scheduler would change them on every rank.
  void train_step(int64_t step) {
    if (step == 2) {
      for (auto* opt : {muon.get(), adamw.get()}) {
        if (opt->local()) {
          for (auto& g : opt->local()->param_groups()) {
            g.options().set_lr(g.options().get_lr() * 0.5);
          }
        }
      }
    }
    torch::manual_seed(600 + step);
    const auto x = torch::randn({16, 12});
    const auto y = torch::randn({16, 5});
    muon->zero_grad();
    adamw->zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    muon->step();
    adamw->step();
  }

  std::vector<torch::Tensor> params() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) {
      out.push_back(p.detach().clone());
    }
    return out;
  }
};

constexpr int64_t kSavedAt = 4, kResumedSteps = 3;

/// World 2: steps to kSavedAt, save both optimizers and the model (rank 0 writes), go on to
/// the end: the uninterrupted trajectory.
void scenario_checkpoint_save(const fogo::dist::ProcessGroup& group) {
  ShardedPair run(group);
  for (int64_t step = 0; step < kSavedAt; ++step) {
    run.train_step(step);
  }
  torch::serialize::OutputArchive muon_archive, adamw_archive;
  run.muon->save(muon_archive);
  run.adamw->save(adamw_archive);
  if (group.rank() == 0) {
    muon_archive.save_to((out_dir() / "muon.pt").string());
    adamw_archive.save_to((out_dir() / "adamw.pt").string());
    torch::save(run.params(), (out_dir() / "model.pt").string());
  }
  for (int64_t step = kSavedAt; step < kSavedAt + kResumedSteps; ++step) {
    run.train_step(step);
  }
  if (group.rank() == 0) {
    torch::save(run.params(), (out_dir() / "uninterrupted.pt").string());
  }
}

/// Any world size: load the model and both optimizers from FOGO_DIST_CKPT, take the remaining
/// steps, and compare with the uninterrupted run bit for bit. World 1 also resumes plain
/// (unsharded) optimizers from the same archives, and checks that an archive of another
/// parameter layout is refused without changing the sharded optimizer.
void scenario_checkpoint_resume(const fogo::dist::ProcessGroup& group) {
  const fs::path ckpt = std::getenv("FOGO_DIST_CKPT");
  std::vector<torch::Tensor> saved_model, truth;
  torch::load(saved_model, (ckpt / "model.pt").string());
  torch::load(truth, (ckpt / "uninterrupted.pt").string());
  const auto load_model = [&](torch::nn::Module& m) {
    torch::NoGradGuard no_grad;
    auto ps = m.parameters();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(saved_model[i]);
  };
  const auto archive = [&](const std::string& name) {
    torch::serialize::InputArchive in;
    in.load_from((ckpt / name).string());
    return in;
  };

  ShardedPair run(group);
  load_model(*run.model);
  if (group.world_size() == 1) {
    // The AdamW archive into the sharded Muon: refused, and the optimizer keeps its (empty) state.
    auto wrong = archive("adamw.pt");
    bool refused = false;
    try {
      run.muon->load(wrong);
    } catch (const c10::Error&) {
      refused = true;
    }
    RANK_CHECK(refused, "loading AdamW's archive into the sharded Muon did not fail");
    RANK_CHECK(run.muon->local()->state().empty(), "a refused load changed the state");
  }
  auto muon_in = archive("muon.pt"), adamw_in = archive("adamw.pt");
  run.muon->load(muon_in);
  run.adamw->load(adamw_in);
  for (int64_t step = kSavedAt; step < kSavedAt + kResumedSteps; ++step) {
    run.train_step(step);
  }
  const auto resumed = run.params();
  for (size_t i = 0; i < truth.size(); ++i) {
    RANK_CHECK(torch::equal(resumed[i], truth[i]),
               "world " << group.world_size() << ": parameter " << i
                        << " differs from the uninterrupted world-2 run by "
                        << max_abs(resumed[i] - truth[i]));
  }
  if (group.world_size() == 1) {
    // The gathered archives are the plain optimizers' own format.
    torch::manual_seed(11);
    auto model = mlp({12, 24, 24, 24, 5}, true, torch::kFloat32);
    load_model(*model);
    std::vector<torch::Tensor> matrices, biases;
    for (auto& p : model->parameters()) {
      (p.dim() == 2 ? matrices : biases).push_back(p);
    }
    fogo::Muon muon(matrices, fogo::MuonOptions(0.02).ns_dtype(torch::kBFloat16));
    torch::optim::AdamW adamw(biases, torch::optim::AdamWOptions(0.01));
    auto muon_plain = archive("muon.pt"), adamw_plain = archive("adamw.pt");
    muon.load(muon_plain);
    adamw.load(adamw_plain);
    RANK_CHECK(muon.param_groups()[0].options().get_lr() == 0.01,
               "the halved lr was not in the archive");
    for (int64_t step = kSavedAt; step < kSavedAt + kResumedSteps; ++step) {
      torch::manual_seed(600 + step);
      const auto x = torch::randn({16, 12});
      const auto y = torch::randn({16, 5});
      muon.zero_grad();
      adamw.zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      muon.step();
      adamw.step();
    }
    const auto plain = model->parameters();
    for (size_t i = 0; i < truth.size(); ++i) {
      RANK_CHECK(torch::equal(plain[i], truth[i]), "plain optimizers: parameter "
                                                       << i << " differs by "
                                                       << max_abs(plain[i] - truth[i]));
    }
  }
}

// --- lockstep: an injected divergence is named ------------------------------------------------

void expect_lockstep_error(const fogo::dist::ProcessGroup& group,
                           const fogo::dist::NamedTensors& tensors, const std::string& name) {
  try {
    fogo::dist::check_lockstep(group, tensors);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    RANK_CHECK(what.find("'" + name + "'") != std::string::npos &&
                   what.find("rank(s) 1") != std::string::npos,
               "the error does not name " << name << " and rank 1: " << what);
    std::printf("rank %lld got the expected error: %s\n", static_cast<long long>(group.rank()),
                what.c_str());
    return;
  }
  RANK_CHECK(false, "check_lockstep missed the divergence of " << name);
}

void scenario_lockstep(const fogo::dist::ProcessGroup& group) {
  torch::manual_seed(5);
  auto model = mlp({6, 8, 8, 2}, true, torch::kFloat32);
  fogo::dist::broadcast_parameters(group, *model);
  fogo::dist::check_lockstep(group, fogo::dist::module_state(*model));  // identical: passes
  {
    // One ulp in one entry of the second layer's weight, on rank 1 only.
    torch::NoGradGuard no_grad;
    auto w = model->named_parameters()["2.weight"];
    if (group.rank() == 1) {
      auto flat = w.view({-1});
      flat[7] = std::nextafter(flat[7].item<float>(), 1e9f);
    }
  }
  expect_lockstep_error(group, fogo::dist::module_state(*model), "2.weight");

  // FOGO memory: rank 1's optimizer has another seed (another projection Pi), so after one step
  // on identical gradients its codebook differs while a same-seed pair would agree.
  auto p = torch::ones({8, 16}).requires_grad_(true);
  fogo::FOGO opt({p}, small_fogo().seed(group.rank() == 1 ? 7 : 0));
  torch::manual_seed(6);
  p.mutable_grad() = torch::randn({8, 16});
  opt.step();
  expect_lockstep_error(group, fogo::dist::fogo_memory(opt), "fogo.group0.centroids");
}

// --- failures ---------------------------------------------------------------------------------

/// Rank FOGO_DIST_KILL_RANK is killed (SIGKILL) at step 3. The others must fail with fogo's
/// error within the timeout, not hang.
void scenario_killed(const fogo::dist::ProcessGroup& group) {
  const int64_t victim = env_int("FOGO_DIST_KILL_RANK", 1);
  torch::manual_seed(7);
  auto model = mlp({6, 8, 2}, true, torch::kFloat32);
  fogo::dist::GradientAverager averager(group, model->parameters());
  for (int step = 0; step < 1000; ++step) {
    if (step == 3 && group.rank() == victim) {
      std::raise(SIGKILL);
    }
    model->zero_grad();
    model->forward(torch::randn({4, 6})).sum().backward();
    averager.finish();
  }
  RANK_CHECK(false, "1000 steps passed without noticing the killed rank");
}

/// Only joins: for world-size mismatch, missing ranks, bad addresses.
void scenario_join(const fogo::dist::ProcessGroup& group) { group.barrier(); }

/// CUDA (a GPU run): the group's default backend for CUDA tensors (NCCL when fogo has it), one
/// rank per GPU. FOGO and Muon steps with gradients averaged through the group, replicated and
/// with shard_step, equal the same optimizers stepping without any group: world 1 on one GPU
/// (NCCL cannot put two ranks on one device), so the averaged gradient is the gradient itself.
void scenario_cuda(const fogo::dist::ProcessGroup& group) {
  RANK_CHECK(torch::cuda::is_available() && group.cuda_device(), "no CUDA device");
  const torch::Device device = *group.cuda_device();
  for (const bool shard : {false, true}) {
    torch::manual_seed(11);
    auto model = mlp({12, 24, 24, 5}, false, torch::kFloat32);
    auto reference = mlp({12, 24, 24, 5}, false, torch::kFloat32);
    copy_params(*reference, *model);
    model->to(device);
    reference->to(device);
    fogo::dist::broadcast_parameters(group, *model);
    fogo::dist::GradientAverager averager(group, model->parameters());
    fogo::FOGO opt(model->parameters(), small_fogo());
    fogo::FOGO ref_opt(reference->parameters(), small_fogo());
    if (shard) fogo::dist::shard_step(group, opt);
    for (int64_t step = 0; step < 6; ++step) {
      const auto x = torch::randn({8, 12}, device), y = torch::randn({8, 5}, device);
      opt.zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      averager.finish();
      opt.step();
      ref_opt.zero_grad();
      torch::mse_loss(reference->forward(x), y).backward();
      ref_opt.step();
      if (step == 2) {
        opt.task_boundary();
        ref_opt.task_boundary();
      }
    }
    fogo::dist::check_lockstep(group, fogo::dist::module_state(*model));
    const auto a = model->parameters(), b = reference->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      RANK_CHECK(torch::allclose(a[i], b[i], 1e-5, 1e-6),
                 (shard ? "sharded" : "replicated")
                     << " parameter " << i << " differs by " << max_abs(a[i] - b[i]));
    }
  }
}

/// A group without NCCL hands CUDA tensors to Gloo (c10d dispatches by device type: Gloo was
/// registered for CPU tensors only, and a CUDA job without NCCL failed at its first
/// collective). Here (no device named) the ranks settle on Gloo alone: on a machine without a
/// GPU they have none; on a GPU machine both see the one GPU (CUDA_VISIBLE_DEVICES=0, the
/// launcher's), rank 1 with LOCAL_RANK=1 as well, and NCCL cannot put two ranks on one GPU. With
/// a GPU, FOGO through the group on CUDA tensors (broadcast, gradient averaging, shard_step's
/// exchanges, the lockstep check) equals the same steps without a group.
void scenario_gloo_cuda(const fogo::dist::ProcessGroup& group) {
  RANK_CHECK(!group.has_nccl(), "NCCL chosen");
  const auto backend = group.c10d().getBackend(c10::DeviceType::CUDA);
  RANK_CHECK(backend->getBackendName() == "gloo",
             "CUDA tensors go to " << backend->getBackendName());
  if (!torch::cuda::is_available()) {
    RANK_CHECK(!group.cuda_device(), "a GPU on a machine without one");
    return;
  }
  // The process sees one GPU: cuda:0, whatever LOCAL_RANK says.
  RANK_CHECK(group.cuda_device() == torch::Device(torch::kCUDA, 0),
             "rank " << group.rank() << "'s GPU: " << group.cuda_device().value_or(torch::kCPU));
  const auto device = *group.cuda_device();
  const int64_t b = 4, rank = group.rank(), world = group.world_size();
  for (const bool shard : {false, true}) {
    torch::manual_seed(13 + rank);  // the ranks start apart: the broadcast brings them together
    auto model = mlp({12, 24, 24, 5}, false, torch::kFloat32);
    torch::manual_seed(13);
    auto reference = mlp({12, 24, 24, 5}, false, torch::kFloat32);
    model->to(device);
    reference->to(device);
    fogo::dist::broadcast_parameters(group, *model);
    RANK_CHECK(torch::equal(model->parameters()[0], reference->parameters()[0]), "broadcast");
    fogo::dist::GradientAverager averager(group, model->parameters());
    fogo::FOGO opt(model->parameters(), small_fogo());
    fogo::FOGO ref_opt(reference->parameters(), small_fogo());
    if (shard) fogo::dist::shard_step(group, opt);
    for (int64_t step = 0; step < 4; ++step) {
      torch::manual_seed(500 + step);
      const auto x = torch::randn({world * b, 12}).to(device);
      const auto y = torch::randn({world * b, 5}).to(device);
      const auto loss = [&](torch::nn::Sequential& m, int64_t r) {
        return torch::mse_loss(m->forward(x.narrow(0, r * b, b)), y.narrow(0, r * b, b));
      };
      opt.zero_grad();
      loss(model, rank).backward();
      averager.finish();
      std::vector<std::vector<torch::Tensor>> g;
      for (int64_t r = 0; r < world; ++r) {
        g.push_back(grads_of(reference->parameters(), [&] { return loss(reference, r); }));
      }
      auto ref_params = reference->parameters();
      for (size_t i = 0; i < ref_params.size(); ++i) {
        ref_params[i].mutable_grad() = (g[0][i] + g[1][i]) / 2;
        const auto err = max_abs(model->parameters()[i].grad() - ref_params[i].grad());
        RANK_CHECK(err <= 1e-6 * max_abs(ref_params[i].grad()),
                   "step " << step << " averaged gradient " << i << " off by " << err);
      }
      opt.step();
      ref_opt.step();
    }
    fogo::dist::check_lockstep(group, fogo::dist::module_state(*model));
    const auto a = model->parameters(), r = reference->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      RANK_CHECK(torch::allclose(a[i], r[i], 1e-5, 1e-6),
                 (shard ? "sharded" : "replicated")
                     << " parameter " << i << " differs by " << max_abs(a[i] - r[i]));
    }
  }
  // Issue 44: shard_step with stacks and blocks (NorMuon on) on CUDA tensors.
  sharded_stacks(group, /*normuon=*/true, device);
  sharded_fogo_stacks(group, device);
}

// --- ns_form Auto: one decision per shape for the whole job ---------------------------------

/// A timer for ns_form Auto that finds Gram faster on rank 0 and Plain faster on the others,
/// without running anything (decide() times Plain, then Gram).
fogo::NSFormTimer disagreeing_timer(int64_t rank) {
  auto calls = std::make_shared<int64_t>(0);
  return [calls, rank](const std::function<void()>&, const c10::Device&) {
    const bool plain = (*calls)++ % 2 == 0;
    return plain == (rank == 0) ? 2.0 : 1.0;  // rank 0: Plain 2 ms, Gram 1 ms
  };
}

/// This rank's kept decisions as rows (m, n, d, batch, steps, restart, schedule, dtype, gram),
/// sorted; each must have been timed.
torch::Tensor ns_form_table() {
  std::vector<std::vector<int64_t>> rows;
  for (const auto& c : fogo::ns_form_choices()) {
    RANK_CHECK(c.measured, "the decision for " << c.m << "x" << c.n << " was not timed");
    rows.push_back({c.m, c.n, c.d, c.batch, c.steps, c.restart, c.schedule,
                    static_cast<int64_t>(c.dtype), c.gram});
  }
  std::sort(rows.begin(), rows.end());
  auto table = torch::zeros({static_cast<int64_t>(rows.size()), 9}, torch::kInt64);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < 9; ++j) table[i][j] = rows[i][j];
  }
  return table;
}

/// World 2 with timers that disagree (disagreeing_timer). Replicated Muon and FOGO with ns_form
/// Auto: both ranks keep the same decisions and stay bit-identical. A decision made by one rank
/// alone (rank 0 first, then rank 1 on the same shape) is the one the other takes, against its
/// own timing. Sharded Muon (shard_step: each owner decides for its own matrices) does not hang
/// and stays in lockstep; its ranks' decisions go to files for the launcher to compare.
void scenario_agreement(const fogo::dist::ProcessGroup& group) {
  const int64_t rank = group.rank();
  fogo::set_ns_form_timer(disagreeing_timer(rank));
  RANK_CHECK(fogo::ns_form_choices().empty(), "decisions before any step");
  const auto full_batch_step = [](std::vector<torch::nn::Sequential*> models, int64_t step) {
    torch::manual_seed(600 + step);
    const auto x = torch::randn({12, 12}), y = torch::randn({12, 5});
    for (auto* m : models) {
      (*m)->zero_grad();
      torch::mse_loss((*m)->forward(x), y).backward();  // the same gradient on every rank
    }
  };
  torch::manual_seed(12);
  auto muon_model = mlp({12, 24, 24, 5}, false, torch::kFloat32);
  auto fogo_model = mlp({12, 24, 24, 5}, false, torch::kFloat32);
  copy_params(*fogo_model, *muon_model);
  fogo::Muon muon(muon_model->parameters(), fogo::MuonOptions(0.02).ns_form(fogo::NSForm::Auto));
  fogo::FOGO fogo_opt(fogo_model->parameters(), small_fogo().ns_form(fogo::NSForm::Auto));
  for (int64_t step = 0; step < 4; ++step) {
    full_batch_step({&muon_model, &fogo_model}, step);
    muon.step();
    fogo_opt.step();
  }
  RANK_CHECK(fogo::ns_form_choices().size() >= 3, "decisions: " << fogo::ns_form_choices().size());
  fogo::dist::NamedTensors state;
  for (const auto& [name, t] : fogo::dist::module_state(*muon_model)) {
    state.emplace_back("muon." + name, t);
  }
  for (const auto& [name, t] : fogo::dist::module_state(*fogo_model)) {
    state.emplace_back("fogo." + name, t);
  }
  const auto memory = fogo::dist::fogo_memory(fogo_opt);
  state.insert(state.end(), memory.begin(), memory.end());
  state.emplace_back("ns_form_choices", ns_form_table());
  fogo::dist::check_lockstep(group, state);

  // One rank decides alone first: its choice (Gram, rank 0's timing) is the job's.
  const auto config = fogo::ns_config(fogo::kQuintic, 5, 1e-7, fogo::NSNormalization::ClampMin,
                                      torch::kFloat32, fogo::NSForm::Auto, 3);
  const auto alone = torch::randn({8, 40});
  if (rank == 0) (void)fogo::newton_schulz(alone, config);
  group.barrier();
  if (rank != 0) (void)fogo::newton_schulz(alone, config);
  bool found = false;
  for (const auto& c : fogo::ns_form_choices()) {
    if (c.m == 8 && c.n == 40 && c.d == 0) {
      found = true;
      RANK_CHECK(c.gram, "rank " << rank << " took Plain for 8x40; rank 0 decided Gram first");
    }
  }
  RANK_CHECK(found, "no decision for 8x40");

  // Sharded: new shapes, each decided by the rank that owns it.
  auto sharded_model = mlp({12, 16, 16, 16, 5}, false, torch::kFloat32);
  fogo::Muon sharded(sharded_model->parameters(),
                     fogo::MuonOptions(0.02).ns_form(fogo::NSForm::Auto));
  const auto owners = fogo::dist::shard_step(group, sharded);
  RANK_CHECK(std::count(owners.begin(), owners.end(), rank) >= 1, "rank " << rank << " owns none");
  for (int64_t step = 0; step < 3; ++step) {
    full_batch_step({&sharded_model}, step);
    sharded.step();
  }
  fogo::dist::check_lockstep(group, fogo::dist::module_state(*sharded_model));
  torch::save(ns_form_table(),
              (out_dir() / ("ns_form_rank" + std::to_string(rank) + ".pt")).string());
}

/// Under torchrun: the replicated scenario with the launcher's own environment.
void scenario_torchrun(const fogo::dist::ProcessGroup& group) { scenario_replicated(group); }

int rank_main(const std::string& scenario) {
  torch::set_num_threads(1);
  const std::map<std::string, void (*)(const fogo::dist::ProcessGroup&)> scenarios{
      {"equivalence", scenario_equivalence},
      {"replicated", scenario_replicated},
      {"lockstep", scenario_lockstep},
      {"killed", scenario_killed},
      {"join", scenario_join},
      {"cuda_join", scenario_join},
      {"gloo_cuda", scenario_gloo_cuda},
      {"agreement", scenario_agreement},
      {"torchrun", scenario_torchrun},
      {"cuda", scenario_cuda},
      {"checkpoint_save", scenario_checkpoint_save},
      {"checkpoint_resume", scenario_checkpoint_resume},
      {"sharded", [](const fogo::dist::ProcessGroup& g) {
         for (const auto& muon : {fogo::MuonOptions(0.02), fogo::MuonOptions(0.02).normuon(true)}) {
           scenario_sharded(g, muon);
           sharded_step_of(g, muon);
           sharded_stacks(g, muon.normuon());
         }
         sharded_fogo(g);
         sharded_fogo_stacks(g);
       }}};
  try {
    const auto it = scenarios.find(scenario);
    if (it == scenarios.end()) {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 5;
    }
    auto group = make_group(scenario);
    it->second(group);
    group.shutdown();
    std::printf("rank %lld: %s passed\n", static_cast<long long>(group.rank()), scenario.c_str());
    return 0;
  } catch (const CheckFailed& e) {
    std::fprintf(stderr, "FOGO_DIST_CHECK_FAILED: %s\n", e.what());
    return 4;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "FOGO_DIST_ERROR: %s\n", e.what_without_backtrace());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FOGO_DIST_ERROR: %s\n", e.what());
    return 3;
  }
}

// =============================================================================================
// Launcher side

using fogo::testing::free_port;
using fogo::testing::RankResult;

std::string self_path() { return fs::read_symlink("/proc/self/exe").string(); }

struct Job {
  std::vector<RankResult> ranks;
  double seconds = 0;
  bool killed = false;  // the launcher's deadline ran out
  fs::path dir;         // logs and outputs; removed unless a test failed

  Job() = default;
  Job(Job&& other) noexcept
      : ranks(std::move(other.ranks)),
        seconds(other.seconds),
        killed(other.killed),
        dir(std::exchange(other.dir, fs::path())) {}
  Job& operator=(Job&&) = delete;
  ~Job() {
    // POSIX calls: libtorch.so exports its own std::filesystem::remove_all, which crashes here.
    if (dir.empty() || ::testing::Test::HasFailure()) {
      return;
    }
    if (DIR* d = opendir(dir.c_str())) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") {
          unlink((dir / name).c_str());
        }
      }
      closedir(d);
    }
    rmdir(dir.c_str());
  }

  std::string logs() const {
    fogo::testing::RankRun run;
    run.ranks = ranks;
    return run.logs();
  }
};

using Env = fogo::testing::Env;

/// Starts `nprocs` ranks of `scenario` (this binary with --rank-scenario), rank r with the
/// torchrun variables for a world of `nprocs` on a free loopback port, then `extra(r)` on top.
/// Waits at most `deadline_s`.
Job launch(const std::string& scenario, int nprocs, const std::function<Env(int)>& extra = {},
           double deadline_s = 120) {
  Job job;
  job.dir = fs::temp_directory_path() /
            ("fogo_dist_" + std::to_string(getpid()) + "_" + std::to_string(free_port()));
  fs::create_directories(job.dir);
  const auto dir = job.dir.string();
  auto run = fogo::testing::launch_ranks({.exe = self_path(),
                                          .args = {"--rank-scenario=" + scenario},
                                          .nprocs = nprocs,
                                          .extra =
                                              [&](int r) {
                                                Env env{{"FOGO_DIST_OUT", dir}};
                                                if (extra) {
                                                  for (const auto& [k, v] : extra(r)) {
                                                    env[k] = v;
                                                  }
                                                }
                                                return env;
                                              },
                                          .log_dir = job.dir,
                                          .deadline_s = deadline_s});
  job.ranks = std::move(run.ranks);
  job.seconds = run.seconds;
  job.killed = run.killed;
  return job;
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

void expect_all_passed(const Job& job) {
  EXPECT_FALSE(job.killed) << "the launcher killed the ranks after " << job.seconds << " s\n"
                           << job.logs();
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    EXPECT_EQ(job.ranks[r].code, 0) << "rank " << r << " failed\n" << job.logs();
  }
}

std::vector<torch::Tensor> load_tensors(const fs::path& path) {
  std::vector<torch::Tensor> tensors;
  torch::load(tensors, path.string());
  return tensors;
}

// =============================================================================================
// Tests

TEST(Distributed, AveragedGradientsEqualSingleProcessFullBatch) {
  const auto job = launch("equivalence", 2);
  expect_all_passed(job);
}

TEST(DistributedCuda, FogoOnTheGpuThroughTheGroupEqualsFogoWithoutIt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto job = launch("cuda", 1);
  expect_all_passed(job);
}

TEST(Distributed, GlooTakesCudaTensorsInAGroupWithoutNccl) {
  expect_all_passed(launch("gloo_cuda", 2));
}

// Both ranks see the machine's one GPU: NCCL cannot run there, so the job (no device named)
// settles on Gloo, which carries the CUDA tensors through host memory; rank 1 (LOCAL_RANK=1)
// uses cuda:0, the one GPU it sees.
TEST(DistributedCuda, TwoRanksOnOneGpuCommunicateCudaTensorsThroughGloo) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_all_passed(launch("gloo_cuda", 2, [](int) { return Env{{"CUDA_VISIBLE_DEVICES", "0"}}; }));
}

// A CUDA job (device cuda) of two ranks that each see one GPU, the same one: NCCL would fail at
// its first collective ("duplicate GPU"); the ranks refuse at start-up, naming the GPU and the
// fixes. Without NCCL in the build the job runs on Gloo instead.
TEST(DistributedCuda, TwoRanksOnOneGpuAreRefusedAtStartUpForNccl) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto job = launch(
      "cuda_join", 2,
      [](int) {
        return Env{{"CUDA_VISIBLE_DEVICES", "0"}};
      },
      60);
  EXPECT_FALSE(job.killed) << job.logs();
  if (!fogo::dist::built_with_nccl()) {
    expect_all_passed(job);
    return;
  }
  for (const auto& rank : job.ranks) {
    EXPECT_EQ(rank.code, 3) << job.logs();
    EXPECT_TRUE(contains(rank.log, "rank(s) 0, 1 share GPU-") &&
                contains(rank.log, "CUDA_VISIBLE_DEVICES per rank"))
        << job.logs();
  }
}

// ns_form Auto's decisions are the job's: ranks whose timers disagree keep one form per shape
// and stay bit-identical (replicated Muon and FOGO); in sharded steps, where each owner decides
// for its own matrices, nothing waits on the other ranks and what two ranks both decided agrees.
TEST(Distributed, NsFormAutoDecidesOnceForTheJobWhenRanksTimeDifferently) {
  const auto job = launch("agreement", 2);
  expect_all_passed(job);
  if (::testing::Test::HasFailure()) return;
  // The decisions each rank kept, by key (every column but the form): the ones both made agree,
  // and each rank made some alone (the shapes only it owns in the sharded run).
  std::vector<std::map<std::vector<int64_t>, int64_t>> forms(2);
  for (int r = 0; r < 2; ++r) {
    torch::Tensor table;
    torch::load(table, (job.dir / ("ns_form_rank" + std::to_string(r) + ".pt")).string());
    for (int64_t i = 0; i < table.size(0); ++i) {
      const auto row = table[i];
      std::vector<int64_t> key(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + 8);
      forms[r][key] = row[8].item<int64_t>();
    }
  }
  int64_t both = 0, alone[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    for (const auto& [key, gram] : forms[r]) {
      const auto other = forms[1 - r].find(key);
      if (other == forms[1 - r].end()) {
        ++alone[r];
      } else if (r == 0) {
        ++both;
        EXPECT_EQ(gram, other->second) << "the ranks took different forms for " << key[0] << "x"
                                       << key[1] << " (d " << key[2] << ", batch " << key[3] << ")";
      }
    }
  }
  EXPECT_GE(both, 4);
  EXPECT_GE(alone[0], 1);
  EXPECT_GE(alone[1], 1);
}

// The hook itself, in this process: ns_form Auto asks the installed agreement once per new
// decision, with a key that names no device index and this process's own answer, and takes
// the answer it gets; without one it keeps its own.
TEST(Distributed, NsFormAutoTakesTheAgreedFormOncePerShape) {
  fogo::clear_ns_form_choices();
  fogo::set_ns_form_timer(nullptr);  // on the CPU: the cost model's answer
  auto config = fogo::ns_config(fogo::kQuintic, 5, 1e-7, fogo::NSNormalization::ClampMin,
                                torch::kFloat32, fogo::NSForm::Auto, 3);
  ASSERT_FALSE(fogo::newton_schulz_gram_is_cheaper(32, 32, 5, 3));  // so the model says Plain
  std::vector<std::pair<std::string, int64_t>> asked;
  const auto first = fogo::detail::install_agreement([](const std::string&, int64_t) {
    return int64_t{0};  // replaced by the next one
  });
  const auto handle = fogo::detail::install_agreement([&](const std::string& key, int64_t local) {
    asked.emplace_back(key, local);
    return int64_t{1};  // the job says Gram
  });
  torch::manual_seed(5);
  const auto B = torch::randn({32, 32});
  const auto agreed = fogo::newton_schulz(B, config);
  (void)fogo::newton_schulz(B, config);  // kept: not asked again
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].first, "ns_form/32x32/d0/batch0/steps5/restart3/schedule0/Float/cpu");
  EXPECT_EQ(asked[0].second, 0) << "the cost model's answer is Plain";
  ASSERT_EQ(fogo::ns_form_choices().size(), 1u);
  EXPECT_TRUE(fogo::ns_form_choices()[0].gram);
  auto gram = config, plain = config;
  gram.form = fogo::NSForm::Gram;
  plain.form = fogo::NSForm::Plain;
  EXPECT_TRUE(torch::equal(agreed, fogo::newton_schulz(B, gram)));
  EXPECT_FALSE(torch::equal(agreed, fogo::newton_schulz(B, plain)));
  // Removed: the one installed before answers (Plain), then none (the model: Plain).
  fogo::detail::remove_agreement(handle);
  fogo::clear_ns_form_choices();
  EXPECT_TRUE(torch::equal(fogo::newton_schulz(B, config), fogo::newton_schulz(B, plain)));
  EXPECT_FALSE(fogo::ns_form_choices().at(0).gram);
  fogo::detail::remove_agreement(first);
  fogo::clear_ns_form_choices();
  EXPECT_EQ(fogo::detail::agree("any", 7), 7);
  (void)fogo::newton_schulz(B, config);
  EXPECT_EQ(asked.size(), 1u);
  fogo::clear_ns_form_choices();
}

TEST(Distributed, ReplicatedFogoAndMuonRanksBitIdenticalToSingleProcess) {
  const auto job = launch("replicated", 2);
  expect_all_passed(job);
  for (const std::string name : {"fogo", "muon"}) {
    const auto r0 = load_tensors(job.dir / (name + "_rank0.pt"));
    const auto r1 = load_tensors(job.dir / (name + "_rank1.pt"));
    ASSERT_EQ(r0.size(), r1.size()) << name;
    ASSERT_GE(r0.size(), 3u) << name;
    for (size_t i = 0; i < r0.size(); ++i) {
      EXPECT_TRUE(torch::equal(r0[i], r1[i])) << name << " tensor " << i << " differs by rank";
    }
  }
}

/// Runs `command` through the shell; true when it exits 0.
bool shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

/// Two network namespaces joined by a veth pair: two "hosts" 10.213.0.1 and 10.213.0.2 with no
/// other route to each other, removed again on destruction. `error` says why they could not be
/// made (not root, no CAP_NET_ADMIN, no `ip`).
struct TwoHosts {
  std::string ns[2], link[2], error;
  TwoHosts() {
    const auto id = std::to_string(getpid());
    for (int h = 0; h < 2; ++h) {
      ns[h] = "fogo" + std::to_string(h) + "_" + id;
      link[h] = "vf" + std::to_string(h) + "_" + id;  // interface names: at most 15 characters
    }
    const std::vector<std::string> steps{
        "ip netns add " + ns[0],
        "ip netns add " + ns[1],
        "ip link add " + link[0] + " type veth peer name " + link[1],
        "ip link set " + link[0] + " netns " + ns[0],
        "ip link set " + link[1] + " netns " + ns[1],
        "ip -n " + ns[0] + " addr add 10.213.0.1/24 dev " + link[0],
        "ip -n " + ns[1] + " addr add 10.213.0.2/24 dev " + link[1],
        "ip -n " + ns[0] + " link set " + link[0] + " up",
        "ip -n " + ns[1] + " link set " + link[1] + " up",
        "ip -n " + ns[0] + " link set lo up",
        "ip -n " + ns[1] + " link set lo up"};
    for (const auto& step : steps) {
      if (!shell(step)) {
        error = "`" + step + "` failed (network namespaces need root or CAP_NET_ADMIN)";
        return;
      }
    }
  }
  ~TwoHosts() {
    shell("ip netns del " + ns[0]);  // deleting a namespace deletes its end of the veth pair
    shell("ip netns del " + ns[1]);
    shell("ip link del " + link[0]);  // in case it never moved into the namespace
  }
};

TEST(Distributed, TwoHostsOverAVethPairBitIdenticalToSingleProcess) {
  // Two machines as far as c10d can tell: each rank in its own network namespace, which sees
  // only its own loopback and its end of the veth pair; the store on rank 0's host
  // (MASTER_ADDR=10.213.0.1), Gloo over the veth interfaces (GLOO_SOCKET_IFNAME).
  TwoHosts hosts;
  if (!hosts.error.empty()) GTEST_SKIP() << hosts.error;
  Job job;  // removes the directory unless a test failed
  job.dir = fs::temp_directory_path() / ("fogo_dist_hosts_" + std::to_string(getpid()));
  const fs::path dir = job.dir;
  fs::create_directories(dir);
  const auto run = fogo::testing::launch_ranks(
      {.exe = "/bin/sh",
       .args = {"-c", "exec ip netns exec \"$FOGO_NS\" \"$0\" --rank-scenario=replicated",
                self_path()},
       .nprocs = 2,
       .extra =
           [&](int r) {
             return Env{{"FOGO_NS", hosts.ns[r]},
                        {"MASTER_ADDR", "10.213.0.1"},
                        {"GLOO_SOCKET_IFNAME", hosts.link[r]},
                        {"FOGO_DIST_OUT", dir.string()}};
           },
       .log_dir = dir,
       .deadline_s = 120});
  ASSERT_TRUE(run.all_succeeded()) << run.logs();
  // The scenario checked each rank against the single process; the ranks agree with each other.
  for (const std::string name : {"fogo", "muon"}) {
    const auto r0 = load_tensors(dir / (name + "_rank0.pt"));
    const auto r1 = load_tensors(dir / (name + "_rank1.pt"));
    ASSERT_EQ(r0.size(), r1.size()) << name;
    for (size_t i = 0; i < r0.size(); ++i) {
      EXPECT_TRUE(torch::equal(r0[i], r1[i])) << name << " tensor " << i << " differs by host";
    }
  }
}

TEST(Distributed, ShardedMuonAndFogoEqualReplicatedWorld2) {
  expect_all_passed(launch("sharded", 2));
}

TEST(Distributed, ShardedMuonAndFogoEqualReplicatedWorld3) {
  expect_all_passed(launch("sharded", 3));
}

TEST(Distributed, ShardedCheckpointFromWorld2ResumesOnWorld1And3) {
  const auto saved = launch("checkpoint_save", 2);
  expect_all_passed(saved);
  for (const int world : {1, 3}) {
    expect_all_passed(launch("checkpoint_resume", world, [&](int) {
      return Env{{"FOGO_DIST_CKPT", saved.dir.string()}};
    }));
  }
}

TEST(Distributed, LockstepCheckNamesTheDivergingTensor) {
  const auto job = launch("lockstep", 2);
  expect_all_passed(job);
  for (const auto& rank : job.ranks) {
    EXPECT_TRUE(contains(rank.log, "'2.weight'") && contains(rank.log, "differs on rank(s) 1"))
        << job.logs();
    EXPECT_TRUE(contains(rank.log, "'fogo.group0.centroids'")) << job.logs();
  }
}

TEST(Distributed, KilledRankMakesTheOthersFailWithinTheTimeout) {
  // A 4 s timeout: every rank must have exited (with fogo's error) well within 4 s + start-up.
  const auto job = launch(
      "killed", 3,
      [](int) {
        return Env{{"FOGO_DIST_TIMEOUT_MS", "4000"}};
      },
      60);
  EXPECT_FALSE(job.killed) << job.logs();
  EXPECT_LT(job.seconds, 30) << job.logs();
  EXPECT_EQ(job.ranks[1].signal, SIGKILL) << job.logs();
  for (int r : {0, 2}) {
    EXPECT_EQ(job.ranks[r].code, 3) << "rank " << r << "\n" << job.logs();
    EXPECT_TRUE(contains(job.ranks[r].log, "FOGO_DIST_ERROR: fogo::dist:") &&
                contains(job.ranks[r].log, "failed on rank " + std::to_string(r)) &&
                contains(job.ranks[r].log, "another rank exited, crashed or stalled"))
        << job.logs();
  }
}

TEST(Distributed, KilledStoreHostMakesTheOtherFailWithinTheTimeout) {
  // Rank 0 hosts the TCPStore: its death must not leave rank 1 hanging either.
  const auto job = launch(
      "killed", 2,
      [](int) {
        return Env{{"FOGO_DIST_TIMEOUT_MS", "4000"}, {"FOGO_DIST_KILL_RANK", "0"}};
      },
      60);
  EXPECT_FALSE(job.killed) << job.logs();
  EXPECT_LT(job.seconds, 30) << job.logs();
  EXPECT_EQ(job.ranks[0].signal, SIGKILL) << job.logs();
  EXPECT_EQ(job.ranks[1].code, 3) << job.logs();
  EXPECT_TRUE(contains(job.ranks[1].log, "failed on rank 1 of 2") &&
              contains(job.ranks[1].log, "another rank exited, crashed or stalled"))
      << job.logs();
}

TEST(Distributed, WorldSizeMismatchIsAClearErrorOnEveryRank) {
  const auto job = launch(
      "join", 2,
      [](int r) {
        return Env{{"WORLD_SIZE", r == 1 ? "3" : "2"}, {"FOGO_DIST_TIMEOUT_MS", "10000"}};
      },
      60);
  EXPECT_FALSE(job.killed) << job.logs();
  EXPECT_LT(job.seconds, 30) << job.logs();
  for (const auto& rank : job.ranks) {
    EXPECT_EQ(rank.code, 3) << job.logs();
    EXPECT_TRUE(contains(rank.log, "WORLD_SIZE mismatch")) << job.logs();
  }
  EXPECT_TRUE(contains(job.ranks[1].log, "RANK=1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"))
      << job.logs();
}

TEST(Distributed, MissingRankIsNamedAfterTheTimeout) {
  // WORLD_SIZE=3 but only ranks 0 and 1 start.
  const auto job = launch(
      "join", 2,
      [](int) {
        return Env{{"WORLD_SIZE", "3"}, {"FOGO_DIST_TIMEOUT_MS", "2000"}};
      },
      60);
  EXPECT_FALSE(job.killed) << job.logs();
  EXPECT_LT(job.seconds, 30) << job.logs();
  EXPECT_EQ(job.ranks[0].code, 3) << job.logs();
  EXPECT_TRUE(contains(job.ranks[0].log, "rank(s) 2 of WORLD_SIZE=3 did not join")) << job.logs();
  EXPECT_EQ(job.ranks[1].code, 3) << job.logs();
  EXPECT_TRUE(contains(job.ranks[1].log, "rank(s) 2 of WORLD_SIZE=3 did not join")) << job.logs();
}

TEST(Distributed, BadMasterAddressOrPortIsAClearErrorWithinTheTimeout) {
  using fogo::dist::Launch;
  using fogo::dist::ProcessGroup;
  using fogo::dist::ProcessGroupOptions;
  const auto options = ProcessGroupOptions().timeout(std::chrono::milliseconds(1500));
  const auto expect_error_within = [&](const Launch& launch, const std::string& needle,
                                       double seconds) {
    const auto start = Clock::now();
    try {
      ProcessGroup group(launch, options);
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const c10::Error& e) {
      EXPECT_TRUE(contains(e.what_without_backtrace(), needle)) << e.what_without_backtrace();
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), seconds) << needle;
  };
  Launch l;
  l.rank = 1;
  l.world_size = 2;
  l.local_rank = 1;
  l.master_addr = "127.0.0.1";
  l.master_port = free_port();  // nobody listens there
  expect_error_within(
      l, "cannot reach the rendezvous store at MASTER_ADDR:MASTER_PORT = 127.0.0.1:", 10);
  l.master_addr = "no-such-host.invalid";
  expect_error_within(l,
                      "cannot reach the rendezvous store at MASTER_ADDR:MASTER_PORT = "
                      "no-such-host.invalid:",
                      10);
  l.master_addr = "127.0.0.1";
  l.master_port = 70000;
  expect_error_within(l, "MASTER_PORT=70000 is not a TCP port", 1);
  {
    // Rank 0 cannot host the store on a port another socket holds.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    Launch l0 = l;
    l0.rank = 0;
    l0.local_rank = 0;
    l0.master_port = ntohs(addr.sin_port);
    expect_error_within(l0, "cannot host the rendezvous store", 10);
    // A live but silent store host (a stalled process, another program on MASTER_PORT): the
    // kernel accepts the connection into the backlog, nobody answers. c10d's client waited for
    // the answer forever; now the rank fails within the timeout (1.5 s) and its margin.
    Launch l1 = l;
    l1.master_port = l0.master_port;
    expect_error_within(l1, "accepted the connection but did not answer within the timeout", 6);
    close(fd);
  }
}

// torchrun's agent store serves its own MASTER_ADDR:MASTER_PORT only: with the endpoint moved by
// the options, rank 0 hosts a store of its own (else every rank would wait for one nobody serves).
TEST(Distributed, TheAgentStoreIsUsedOnlyAtTheAgentsEndpoint) {
  const char* names[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
                         "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"};
  Env saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved[n] = v;
  }
  const Env launch{{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "1"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  for (const auto& [k, v] : launch) setenv(k.c_str(), v.c_str(), 1);
  EXPECT_TRUE(fogo::dist::Launch::from_env().agent_store);
  EXPECT_FALSE(fogo::dist::Launch::from_env(fogo::dist::ProcessGroupOptions().master_port(29611))
                   .agent_store);
  EXPECT_FALSE(
      fogo::dist::Launch::from_env(fogo::dist::ProcessGroupOptions().master_addr("127.0.0.2"))
          .agent_store);
  EXPECT_TRUE(fogo::dist::Launch::from_env(fogo::dist::ProcessGroupOptions().master_port(29500))
                  .agent_store);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
  EXPECT_FALSE(fogo::dist::Launch::from_env().agent_store);
  for (const char* n : names) unsetenv(n);
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

TEST(Distributed, EnvironmentErrorsNameTheVariable) {
  const auto expect_env_error = [](const Env& env, const std::string& needle) {
    const char* names[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
                           "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"};
    Env saved;
    for (const char* n : names) {
      if (const char* v = std::getenv(n)) {
        saved[n] = v;
      }
      unsetenv(n);
    }
    for (const auto& [k, v] : env) {
      setenv(k.c_str(), v.c_str(), 1);
    }
    try {
      fogo::dist::Launch::from_env();
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const c10::Error& e) {
      EXPECT_TRUE(contains(e.what_without_backtrace(), needle)) << e.what_without_backtrace();
    }
    for (const char* n : names) {
      unsetenv(n);
    }
    for (const auto& [k, v] : saved) {
      setenv(k.c_str(), v.c_str(), 1);
    }
  };
  const Env ok{{"RANK", "0"},
               {"WORLD_SIZE", "2"},
               {"LOCAL_RANK", "0"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"}};
  auto e = ok;
  e.erase("MASTER_PORT");
  expect_env_error(e, "MASTER_PORT is not set");
  e = ok;
  e["RANK"] = "2";
  expect_env_error(e, "RANK=2 is not in [0, WORLD_SIZE=2)");
  e = ok;
  e["WORLD_SIZE"] = "two";
  expect_env_error(e, "WORLD_SIZE='two' is not an integer");
  e = ok;
  e["LOCAL_WORLD_SIZE"] = "3";
  expect_env_error(e, "LOCAL_WORLD_SIZE=3 is not in (LOCAL_RANK=0, WORLD_SIZE=2]");
}

// The backend choice (the cause of most of the first H100 run's failures: Auto demanded
// cuda:LOCAL_RANK on every rank of a CPU job on a one-GPU machine), with the machine's GPU count
// injected, so it is tested here without a GPU.
TEST(Distributed, BackendFollowsTheJobsDeviceAndTheGpusPerRank) {
  using fogo::dist::Backend;
  using fogo::dist::choose_backends;
  using fogo::dist::Launch;
  using fogo::dist::ProcessGroupOptions;
  const auto launch = [](int64_t local_rank, int64_t local_world) {
    Launch l;
    l.world_size = 4;
    l.rank = local_rank;
    l.local_rank = local_rank;
    l.local_world_size = local_world;
    l.master_addr = "127.0.0.1";
    l.master_port = 29500;
    return l;
  };
  const auto cpu = ProcessGroupOptions().device(torch::Device(torch::kCPU));
  const auto cuda = ProcessGroupOptions().device(torch::Device(torch::kCUDA));
  const auto expect = [](const fogo::dist::Backends& b, bool gloo, bool nccl, int64_t gpu,
                         const char* what, bool optional = false) {
    EXPECT_EQ(b.gloo, gloo) << what;
    EXPECT_EQ(b.nccl, nccl) << what;
    EXPECT_EQ(b.cuda_device, gpu) << what;
    EXPECT_EQ(b.nccl_optional, optional) << what;
  };
  const auto expect_error = [](const std::function<void()>& f, std::vector<std::string> needles) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << needles[0];
    } catch (const c10::Error& e) {
      for (const auto& n : needles) {
        EXPECT_TRUE(contains(e.what_without_backtrace(), n)) << e.what_without_backtrace();
      }
    }
  };
  // A CPU job: Gloo alone, on every rank, whatever the machine has (1 GPU, 2 local ranks: rank 1
  // used to die at start-up).
  for (const int64_t gpus : {0, 1, 8}) {
    for (const int64_t r : {0, 1}) {
      const auto b = choose_backends(cpu, launch(r, 2), gpus, true);
      EXPECT_TRUE(b.gloo && !b.nccl) << "cpu job, " << gpus << " GPUs";
    }
  }
  // A CUDA job on a process that sees the node's GPUs: its GPU is LOCAL_RANK's.
  expect(choose_backends(cuda, launch(1, 2), 2, true), true, true, 1, "cuda job, 2 GPUs");
  // ... that sees exactly one GPU (CUDA_VISIBLE_DEVICES per rank, as SLURM sets it): cuda:0,
  // whatever LOCAL_RANK (it used to be refused for LOCAL_RANK >= 1).
  expect(choose_backends(cuda, launch(3, 4), 1, true), true, true, 0, "cuda job, 1 GPU visible");
  expect(choose_backends(cuda, launch(0, 2), 1, true), true, true, 0, "cuda job, rank 0, 1 GPU");
  // ... naming its GPU.
  expect(choose_backends(ProcessGroupOptions().device(torch::Device(torch::kCUDA, 1)), launch(0, 2),
                         2, true),
         true, true, 1, "cuda:1 named");
  expect_error(
      [&] {
        choose_backends(ProcessGroupOptions().device(torch::Device(torch::kCUDA, 2)), launch(0, 2),
                        2, true);
      },
      {"ProcessGroupOptions::device is cuda:2 but this process sees 2 CUDA device(s)"});
  // ... with more local ranks than the GPUs the process sees: an error naming the fixes, on the
  // rank without a GPU.
  expect_error([&] { choose_backends(cuda, launch(2, 4), 2, true); },
               {"LOCAL_RANK=2 of 4 local rank(s) finds 2 CUDA device(s)",
                "torchrun --nproc-per-node 2", "CUDA_VISIBLE_DEVICES per rank", "--device cpu"});
  expect_error([&] { choose_backends(cuda, launch(0, 1), 0, true); },
               {"finds 0 CUDA device(s)", "--device cpu"});
  // fogo without NCCL: Gloo alone (the group hands it the CUDA tensors too).
  expect(choose_backends(cuda, launch(1, 2), 2, false), true, false, 1, "cuda job, no NCCL built");
  expect(choose_backends(cuda, launch(3, 4), 2, false), true, false, -1, "no NCCL, GPUs shared");
  expect_error([&] { choose_backends(cuda, launch(0, 2), 0, false); }, {"finds 0 CUDA device(s)"});
  // No device named: each rank offers its GPU; the job takes NCCL only if every rank has one of
  // its own (settle_backends, below).
  expect(choose_backends({}, launch(1, 2), 1, true), true, true, 0, "unset, 1 GPU visible", true);
  expect(choose_backends({}, launch(1, 2), 2, true), true, true, 1, "unset, 2 GPUs", true);
  expect(choose_backends({}, launch(2, 4), 2, true), true, false, -1, "unset, no GPU left", true);
  expect(choose_backends({}, launch(0, 2), 0, true), true, false, -1, "unset, no GPU", true);
  expect(choose_backends({}, launch(0, 2), 1, false), true, false, 0, "unset, no NCCL built");
  // Explicit backends.
  expect(choose_backends(ProcessGroupOptions().backend(Backend::Gloo), launch(1, 2), 2, true), true,
         false, 1, "gloo");
  expect(choose_backends(ProcessGroupOptions().backend(Backend::Nccl), launch(1, 2), 2, true),
         false, true, 1, "nccl");
  expect(choose_backends(ProcessGroupOptions().backend(Backend::Nccl), launch(3, 4), 1, true),
         false, true, 0, "nccl, 1 GPU visible");
  expect_error(
      [&] { choose_backends(ProcessGroupOptions().backend(Backend::Nccl), launch(2, 4), 2, true); },
      {"backend Nccl needs a GPU of its own for each rank", "LOCAL_RANK=2"});
  expect_error(
      [&] {
        choose_backends(ProcessGroupOptions().backend(Backend::Nccl), launch(0, 1), 1, false);
      },
      {"built without NCCL"});
  expect_error(
      [&] {
        choose_backends(ProcessGroupOptions(cpu).backend(Backend::Nccl), launch(0, 1), 1, true);
      },
      {"backend Nccl communicates CUDA tensors", "cpu"});
}

// The job's choice from every rank's offer (what rank 0 decides during the members check and
// every rank then applies), with the ranks' GPUs injected.
TEST(Distributed, JobTakesNcclOnlyWithAGpuOfItsOwnForEveryRank) {
  using fogo::dist::Backends;
  using fogo::dist::detail::Offer;
  using fogo::dist::detail::settle_backends;
  const auto offer = [](bool nccl, bool optional, const std::string& gpu) {
    Offer o;
    o.backends.gloo = true;
    o.backends.nccl = nccl;
    o.backends.nccl_optional = optional;
    o.backends.cuda_device = nccl ? 0 : -1;
    o.gpu = gpu;
    return o;
  };
  // A CUDA job (NCCL required): distinct GPUs, or a clear error naming the ranks that share.
  auto job = settle_backends({offer(true, false, "GPU-a"), offer(true, false, "GPU-b")});
  EXPECT_TRUE(job.nccl && job.problem.empty()) << job.problem;
  job = settle_backends(
      {offer(true, false, "GPU-a"), offer(true, false, "GPU-a"), offer(true, false, "GPU-b")});
  EXPECT_FALSE(job.nccl);
  EXPECT_TRUE(contains(job.problem,
                       "NCCL needs a GPU of its own for each rank, but rank(s) 0, 1 "
                       "share GPU-a") &&
              contains(job.problem, "CUDA_VISIBLE_DEVICES per rank") &&
              contains(job.problem, "Backend::Gloo"))
      << job.problem;
  // No device named: NCCL where every rank has its own GPU, else Gloo alone, without error.
  job = settle_backends({offer(true, true, "GPU-a"), offer(true, true, "GPU-b")});
  EXPECT_TRUE(job.nccl && job.problem.empty());
  job = settle_backends({offer(true, true, "GPU-a"), offer(true, true, "GPU-a")});
  EXPECT_TRUE(!job.nccl && job.problem.empty()) << "two ranks on one GPU";
  job = settle_backends({offer(true, true, "GPU-a"), offer(false, true, "")});
  EXPECT_TRUE(!job.nccl && job.problem.empty()) << "a rank without a GPU";
  // A CPU job.
  job = settle_backends({offer(false, false, ""), offer(false, false, "")});
  EXPECT_TRUE(!job.nccl && job.problem.empty());
  // Ranks given different options.
  job = settle_backends({offer(true, false, "GPU-a"), offer(false, false, "")});
  EXPECT_TRUE(contains(job.problem, "rank(s) 1 were given other backend options")) << job.problem;
  // A rank whose own choice failed: every rank reports it.
  Offer failed;
  failed.error = "fogo::dist: a CUDA job needs a GPU of its own";
  job = settle_backends({offer(true, false, "GPU-a"), failed});
  EXPECT_EQ(job.problem, "fogo::dist: rank 1 of 2 cannot start: a CUDA job needs a GPU of its own");
  // Offers survive the store: encode/decode.
  for (const auto& o : {offer(true, true, "GPU-12|34"), offer(false, false, ""), failed}) {
    const auto back = fogo::dist::detail::decode(fogo::dist::detail::encode(o));
    EXPECT_EQ(back.backends.gloo, o.backends.gloo);
    EXPECT_EQ(back.backends.nccl, o.backends.nccl);
    EXPECT_EQ(back.backends.nccl_optional, o.backends.nccl_optional);
    EXPECT_EQ(back.gpu, o.gpu);
    EXPECT_EQ(back.error, o.error);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string prefix = "--rank-scenario=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) {
      return rank_main(a.substr(prefix.size()));
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
