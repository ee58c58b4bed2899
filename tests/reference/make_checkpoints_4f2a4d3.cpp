// Writes tests/data/fogo_checkpoint_4f2a4d3.pt and muon_checkpoint_4f2a4d3.pt: FOGO and Muon
// checkpoints of fogo at 4f2a4d3, the last before the option tables shared their machinery
// (issue 35), whose FOGO checksum summed ns_schedule and fusion_only at every value. Not built
// here: it compiles against that commit only; build and run it as
// make_fogo_checkpoint_aa1099b.cpp says (without examples/common/checkpoint.cpp).
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <iostream>

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  torch::manual_seed(35);
  {
    // Group 0: the defaults (ns_schedule 0, fusion_only false) but a small memory; group 1:
    // ns_schedule Polar Express and the Gram form; group 2: fusion_only.
    auto a = torch::randn({6, 10}).requires_grad_(true);
    auto b = torch::randn({8, 12}).requires_grad_(true);
    auto c = torch::randn({5, 7}).requires_grad_(true);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(
        std::vector<torch::Tensor>{a},
        std::make_unique<fogo::FOGOOptions>(fogo::FOGOOptions(0.02).proj_dim(8).codebook_size(4)));
    groups.emplace_back(std::vector<torch::Tensor>{b},
                        std::make_unique<fogo::FOGOOptions>(fogo::FOGOOptions(0.01)
                                                                .proj_dim(6)
                                                                .codebook_size(5)
                                                                .seed(11)
                                                                .ns_schedule(fogo::kPolarExpress)
                                                                .ns_form(fogo::NSForm::Gram)
                                                                .ns_dtype(torch::kFloat)));
    groups.emplace_back(
        std::vector<torch::Tensor>{c},
        std::make_unique<fogo::FOGOOptions>(fogo::FOGOOptions(0.02).fusion_only(true)));
    fogo::FOGO opt(std::move(groups), fogo::FOGOOptions(0.02));
    for (int step = 0; step < 4; ++step) {
      for (auto* p : {&a, &b, &c}) p->mutable_grad() = torch::randn(p->sizes());
      opt.step();
      if (step == 1) opt.task_boundary();
    }
    torch::save(opt, dir + "/fogo_checkpoint_4f2a4d3.pt");
    for (size_t g = 0; g < 3; ++g) {
      const auto m = opt.memory(g);
      std::cout << "FOGO group " << g << ": centroids "
                << (m.centroids.defined() ? m.centroids.sizes() : at::IntArrayRef{}) << ", frozen "
                << (m.frozen.defined() ? m.frozen.sizes() : at::IntArrayRef{}) << "\n";
    }
  }
  {
    // Group 0: the defaults (lr 0.02); group 1: ns_schedule Polar Express, Nesterov off.
    auto a = torch::randn({4, 6}).requires_grad_(true);
    auto b = torch::randn({5, 3}).requires_grad_(true);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{a},
                        std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(0.02)));
    groups.emplace_back(
        std::vector<torch::Tensor>{b},
        std::make_unique<fogo::MuonOptions>(
            fogo::MuonOptions(0.01).ns_schedule(fogo::kPolarExpress).nesterov(false)));
    fogo::Muon opt(std::move(groups), fogo::MuonOptions(0.02));
    for (int step = 0; step < 3; ++step) {
      for (auto* p : {&a, &b}) p->mutable_grad() = torch::randn(p->sizes());
      opt.step();
    }
    torch::save(opt, dir + "/muon_checkpoint_4f2a4d3.pt");
  }
}
