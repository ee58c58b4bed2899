// Writes tests/data/fogo_checkpoint_aa1099b.pt and fogo_trainer_checkpoint_aa1099b.pt: a FOGO
// checkpoint and a trainer checkpoint file holding it, of fogo at aa1099b (after the checkpoint
// checksum, before FOGO's ns_schedule and fusion_only; issue 35). Not built here: it compiles
// against that commit only. To write them again:
//   git worktree add /tmp/old aa1099b && cd /tmp/old && cp <this file> make_fixture.cpp
//   add to CMakeLists.txt: add_executable(make_fixture make_fixture.cpp
//     examples/common/checkpoint.cpp), target_include_directories(make_fixture PRIVATE examples),
//     target_link_libraries(make_fixture PRIVATE fogo::fogo)
//   cmake -S . -B build -G Ninja -DFOGO_WITH_CUDA=OFF
//   -DFOGO_BUILD_{TESTS,BENCH,EXAMPLES,PYTHON}=OFF
//     -DFOGO_WITH_DISTRIBUTED=OFF && cmake --build build --target make_fixture
//   OMP_NUM_THREADS=1 build/make_fixture <tests/data>
// (the bytes written depend on this CPU's arithmetic; the tests check what they hold, not them).
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <iostream>

#include "common/checkpoint.h"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  torch::manual_seed(35);
  auto a = torch::randn({6, 10}).requires_grad_(true);
  auto b = torch::randn({8, 12}).requires_grad_(true);
  // Group 1: every option of then away from its default (cuda_graph set after the steps: CPU).
  const auto changed = fogo::FOGOOptions(0.01)
                           .weight_decay(0.05)
                           .sigma(0.15)
                           .eps(1e-7)
                           .mu_s(0.9)
                           .mu_f(0.3)
                           .ns_steps_slow(4)
                           .ns_steps_fast(3)
                           .ns_gram_restart(2)
                           .proj_dim(6)
                           .xi(0.3)
                           .codebook_size(5)
                           .beta_cb(0.9)
                           .lambda_c(0.2)
                           .r_dec(4)
                           .reseed_every(3)
                           .reseed_threshold(0.05)
                           .eps_st(0.2)
                           .gamma_hi(0.04)
                           .gamma_st_min(0.12)
                           .gamma_st_max(0.35)
                           .beta_r(0.9)
                           .kappa(0.25)
                           .tau_plus(4.0)
                           .tau_minus(3.0)
                           .lambda_hi(0.2)
                           .eps_lt(0.15)
                           .gamma_lt(0.8)
                           .lt_candidates(4)
                           .freeze_per_task(2)
                           .lambda_prox(0.9)
                           .seed(11)
                           .ns_coefficients(fogo::kCubic)
                           .spectral_scaling(false)
                           .reinit_codebook_on_task(true)
                           .ns_dtype(torch::kFloat)
                           .ns_form(fogo::NSForm::Gram)
                           .projection_scale(fogo::ProjectionScale::JL)
                           .nonfinite(fogo::NonFinitePolicy::Skip);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{a},
                      std::make_unique<fogo::FOGOOptions>(fogo::FOGOOptions(0.02)));
  groups.emplace_back(std::vector<torch::Tensor>{b}, std::make_unique<fogo::FOGOOptions>(changed));
  fogo::FOGO opt(std::move(groups), fogo::FOGOOptions(0.02));
  for (int step = 0; step < 5; ++step) {
    a.mutable_grad() = torch::randn({6, 10});
    b.mutable_grad() = torch::randn({8, 12});
    opt.step();
    if (step == 2) opt.task_boundary();
  }
  static_cast<fogo::FOGOOptions&>(opt.param_groups()[1].options()).cuda_graph(true);
  torch::save(opt, dir + "/fogo_checkpoint_aa1099b.pt");
  fogo::trainer::CheckpointWriter w;
  w.put("step", int64_t{5});
  w.put_optimizer("optimizer", opt);
  w.commit(dir + "/fogo_trainer_checkpoint_aa1099b.pt");
  for (size_t g = 0; g < 2; ++g) {
    const auto m = opt.memory(g);
    std::cout << "group " << g << ": centroids " << m.centroids.sizes() << " sum "
              << m.centroids.sum().item<double>() << ", frozen "
              << (m.frozen.defined() ? m.frozen.sizes() : at::IntArrayRef{}) << ", step "
              << opt.telemetry()[g].step << "\n";
  }
  std::cout << "a " << a.sum().item<double>() << " b " << b.sum().item<double>() << "\n";
}
