// What fogo relies on in LibTorch that changed between the torch versions it supports (2.11 and
// 2.15, scripts/torch.sh), each checked on whichever version this binary was built against.
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/headeronly/version.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using torch::optim::OptimizerParamGroup;

std::vector<at::Tensor> make_params(int64_t seed) {
  at::manual_seed(seed);
  return {torch::randn({8, 6}).requires_grad_(), torch::randn({6, 5}).requires_grad_()};
}

std::vector<at::Tensor> values(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

// Two steps of `opt` over `params` with gradients fixed by the step number.
template <class Opt>
void two_steps(Opt& opt, const std::vector<at::Tensor>& params) {
  for (int step = 0; step < 2; ++step) {
    at::manual_seed(100 + step);
    for (const auto& p : params) p.mutable_grad() = torch::randn_like(p);
    opt.step();
  }
}

// The options a group was given, all different from the defaults below.
fogo::FOGOOptions own_fogo() {
  return fogo::FOGOOptions(0.05).seed(3).codebook_size(8).proj_dim(4).ns_dtype(torch::kFloat);
}
fogo::FOGOOptions default_fogo() {
  return fogo::FOGOOptions(1e-3).seed(0).codebook_size(16).proj_dim(4).ns_dtype(torch::kFloat);
}

void expect_own_fogo(const torch::optim::OptimizerOptions& options) {
  const auto& o = static_cast<const fogo::FOGOOptions&>(options);
  EXPECT_EQ(o.lr(), 0.05);
  EXPECT_EQ(o.seed(), 3);
  EXPECT_EQ(o.codebook_size(), 8);
}

// A group's own options are what steps it: FOGO with group options (lr 0.05, seed 3, codebook
// size 8) over defaults that differ moves the parameters exactly as FOGO whose defaults are those
// options. Both ways in: the constructor and add_param_group.
TEST(TorchVersions, FogoGroupOptionsSurviveConstructionAndAddParamGroup) {
  const auto reference_params = make_params(0);
  fogo::FOGO reference(reference_params, own_fogo());
  two_steps(reference, reference_params);

  const auto built_params = make_params(0);
  fogo::FOGO built(
      {OptimizerParamGroup(built_params, std::make_unique<fogo::FOGOOptions>(own_fogo()))},
      default_fogo());
  expect_own_fogo(built.param_groups().at(0).options());
  two_steps(built, built_params);
  EXPECT_TRUE(fogo::test::bit_identical(values(built_params), values(reference_params)));

  // A group added second steps as the second group given to the constructor (FOGO's streams
  // depend on a group's index as well as its seed).
  auto other = torch::randn({4, 4});
  const auto second_params = make_params(0);
  fogo::FOGO second(
      {OptimizerParamGroup({other.clone().requires_grad_()}),
       OptimizerParamGroup(second_params, std::make_unique<fogo::FOGOOptions>(own_fogo()))},
      default_fogo());
  two_steps(second, second_params);
  const auto added_params = make_params(0);
  fogo::FOGO added({other.clone().requires_grad_()}, default_fogo());
  added.add_param_group(
      OptimizerParamGroup(added_params, std::make_unique<fogo::FOGOOptions>(own_fogo())));
  expect_own_fogo(added.param_groups().at(1).options());
  EXPECT_EQ(static_cast<const fogo::FOGOOptions&>(added.param_groups().at(0).options()).lr(), 1e-3);
  two_steps(added, added_params);
  EXPECT_TRUE(fogo::test::bit_identical(values(added_params), values(second_params)));
  // And not as it would with the defaults' options.
  const auto default_params = make_params(0);
  fogo::FOGO defaults(
      {OptimizerParamGroup({other.clone().requires_grad_()}), OptimizerParamGroup(default_params)},
      default_fogo());
  two_steps(defaults, default_params);
  EXPECT_FALSE(fogo::test::bit_identical(values(added_params), values(default_params)));
}

TEST(TorchVersions, MuonGroupOptionsSurviveConstructionAndAddParamGroup) {
  const auto own = fogo::MuonOptions(0.05).momentum(0.9).weight_decay(0.01);
  const auto defaults = fogo::MuonOptions(1e-3);
  const auto reference_params = make_params(1);
  fogo::Muon reference(reference_params, own);
  two_steps(reference, reference_params);

  const auto built_params = make_params(1);
  fogo::Muon built({OptimizerParamGroup(built_params, std::make_unique<fogo::MuonOptions>(own))},
                   defaults);
  two_steps(built, built_params);
  EXPECT_TRUE(fogo::test::bit_identical(values(built_params), values(reference_params)));

  const auto added_params = make_params(1);
  fogo::Muon added({torch::randn({4, 4}).requires_grad_()}, defaults);
  added.add_param_group(
      OptimizerParamGroup(added_params, std::make_unique<fogo::MuonOptions>(own)));
  const auto& o = static_cast<const fogo::MuonOptions&>(added.param_groups().at(1).options());
  EXPECT_EQ(o.lr(), 0.05);
  EXPECT_EQ(o.momentum(), 0.9);
  two_steps(added, added_params);
  EXPECT_TRUE(fogo::test::bit_identical(values(added_params), values(reference_params)));
}

// A checkpoint of an optimizer with its own group options loads into one built the same way and
// continues bit for bit (on torch 2.15 without the fix: "group 0 of the checkpoint has seed 3,
// this optimizer 0").
TEST(TorchVersions, GroupOptionsSurviveACheckpointRoundTrip) {
  const auto params = make_params(2);
  const auto groups = [](const std::vector<at::Tensor>& p) {
    return std::vector{OptimizerParamGroup({p[0]}, std::make_unique<fogo::FOGOOptions>(own_fogo())),
                       OptimizerParamGroup({p[1]})};
  };
  fogo::FOGO first(groups(params), default_fogo());
  two_steps(first, params);
  std::stringstream checkpoint;
  torch::save(first, checkpoint);

  const auto resumed_params = values(params);
  for (auto& p : resumed_params) p.requires_grad_();
  fogo::FOGO resumed(groups(resumed_params), default_fogo());
  torch::load(resumed, checkpoint);
  expect_own_fogo(resumed.param_groups().at(0).options());
  two_steps(first, params);
  two_steps(resumed, resumed_params);
  EXPECT_TRUE(fogo::test::bit_identical(values(resumed_params), values(params)));
}

// The hybrid: a matrix group's own lr through make_hybrid's groups and add_param_group, and an
// AdamW group whose lr equals AdamWOptions' constructor default (1e-3), which torch 2.15's merge
// would replace by the rest side's defaults (3e-4).
TEST(TorchVersions, HybridGroupOptionsSurviveAddParamGroup) {
  auto matrix = torch::randn({6, 6}).requires_grad_();
  auto bias = torch::randn({6}).requires_grad_();
  fogo::HybridOptimizer hybrid(
      std::make_unique<fogo::Muon>(std::vector{matrix}, fogo::MuonOptions(0.02)),
      fogo::with_param_groups<torch::optim::AdamW>({OptimizerParamGroup({bias})},
                                                   torch::optim::AdamWOptions(3e-4)));
  auto extra_matrix = torch::randn({5, 4}).requires_grad_();
  auto extra_bias = torch::randn({5}).requires_grad_();
  hybrid.add_param_group(OptimizerParamGroup(
      {extra_matrix}, std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(0.05))));
  hybrid.add_param_group(OptimizerParamGroup(
      {extra_bias},
      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-3))));
  ASSERT_EQ(hybrid.param_groups().size(), 4u);
  EXPECT_EQ(hybrid.param_groups()[2].options().get_lr(), 0.05);
  EXPECT_EQ(hybrid.param_groups()[3].options().get_lr(), 1e-3);

  // Stepped as the lone parameters of optimizers whose defaults are those options.
  const auto start_matrix = extra_matrix.detach().clone();
  const auto start_bias = extra_bias.detach().clone();
  for (const auto& p : {matrix, bias, extra_matrix, extra_bias})
    p.mutable_grad() = torch::ones_like(p);
  hybrid.step();
  auto lone_matrix = start_matrix.clone().requires_grad_();
  auto lone_bias = start_bias.clone().requires_grad_();
  fogo::Muon muon({lone_matrix}, fogo::MuonOptions(0.05));
  torch::optim::AdamW adamw({lone_bias}, torch::optim::AdamWOptions(1e-3));
  lone_matrix.mutable_grad() = torch::ones_like(lone_matrix);
  lone_bias.mutable_grad() = torch::ones_like(lone_bias);
  muon.step();
  adamw.step();
  EXPECT_TRUE(fogo::test::bit_identical({extra_matrix.detach(), extra_bias.detach()},
                                        {lone_matrix.detach(), lone_bias.detach()}));
}

// fogo::with_param_groups keeps an AdamW group's lr of 1e-3 (AdamWOptions' constructor default)
// under defaults of 3e-4, where torch 2.15's own constructor gives it the defaults' 3e-4.
TEST(TorchVersions, WithParamGroupsKeepsTorchOptimizersGroupsAsGiven) {
  auto p = torch::randn({3}).requires_grad_();
  auto q = torch::randn({3}).requires_grad_();
  const auto groups = [&] {
    std::vector<OptimizerParamGroup> g;
    g.emplace_back(std::vector{p}, std::make_unique<torch::optim::AdamWOptions>(
                                       torch::optim::AdamWOptions(1e-3).weight_decay(0.0)));
    g.emplace_back(std::vector{q});
    return g;
  };
  const auto defaults = torch::optim::AdamWOptions(3e-4).weight_decay(0.1);
  auto ours = fogo::with_param_groups<torch::optim::AdamW>(groups(), defaults);
  const auto& own =
      static_cast<const torch::optim::AdamWOptions&>(ours->param_groups()[0].options());
  EXPECT_EQ(own.lr(), 1e-3);
  EXPECT_EQ(own.weight_decay(), 0.0);
  EXPECT_EQ(ours->param_groups()[1].options().get_lr(), 3e-4);
  torch::optim::AdamW theirs(groups(), defaults);
  const double torch_lr = theirs.param_groups()[0].options().get_lr();
  if (TORCH_VERSION_MINOR == 11) EXPECT_EQ(torch_lr, 1e-3);  // kept as given
  if (TORCH_VERSION_MINOR == 15) EXPECT_EQ(torch_lr, 3e-4);  // merged "by comparison"
}

// The probe that decides whether a group added through torch::optim::Optimizer& is refused:
// torch 2.11 keeps a custom optimizer's group options, 2.15 replaces them by the defaults.
TEST(TorchVersions, TheProbeKnowsWhetherThisTorchKeepsGroupOptions) {
  if (TORCH_VERSION_MINOR == 11) EXPECT_TRUE(fogo::torch_keeps_group_options());
  if (TORCH_VERSION_MINOR == 15) EXPECT_FALSE(fogo::torch_keeps_group_options());
}

// A group added through a torch::optim::Optimizer& goes around fogo: where this torch dropped its
// options, the next step is refused naming the group and changes nothing; where it kept them, the
// step uses them.
TEST(TorchVersions, AGroupAddedAroundFogoIsRefusedWhereTorchDroppedItsOptions) {
  auto w = torch::randn({4, 4}).requires_grad_();
  auto v = torch::randn({5, 3}).requires_grad_();
  fogo::Muon muon({w}, fogo::MuonOptions(1e-3));
  torch::optim::Optimizer& base = muon;
  base.add_param_group(OptimizerParamGroup({v}, std::make_unique<fogo::MuonOptions>(0.05)));
  w.mutable_grad() = torch::ones_like(w);
  v.mutable_grad() = torch::ones_like(v);
  const auto before = values({w, v});
  if (fogo::torch_keeps_group_options()) {
    EXPECT_EQ(muon.param_groups()[1].options().get_lr(), 0.05);
    muon.step();
    EXPECT_FALSE(fogo::test::bit_identical(values({w, v}), before));
    return;
  }
  fogo::test::expect_error([&] { muon.step(); },
                           "Muon: param group 1 was added through "
                           "torch::optim::Optimizer::add_param_group");
  EXPECT_TRUE(fogo::test::bit_identical(values({w, v}), before));
  // The hybrid likewise.
  fogo::HybridOptimizer hybrid(
      std::make_unique<fogo::Muon>(std::vector{w}, fogo::MuonOptions(1e-3)), nullptr);
  static_cast<torch::optim::Optimizer&>(hybrid).add_param_group(
      OptimizerParamGroup({v}, std::make_unique<torch::optim::AdamWOptions>(1e-3)));
  fogo::test::expect_error([&] { hybrid.step(); }, "HybridOptimizer: param group 1 was added");
  EXPECT_TRUE(fogo::test::bit_identical(values({w, v}), before));
}

// Through a torch::optim::Optimizer&, fogo::add_param_group reaches a fogo optimizer's own
// add_param_group: the group keeps its options and steps, on every torch.
TEST(TorchVersions, FogoAddParamGroupThroughAnOptimizerReferenceKeepsTheOptions) {
  auto w = torch::randn({4, 4}).requires_grad_();
  auto v = torch::randn({5, 3}).requires_grad_();
  fogo::Muon muon({w}, fogo::MuonOptions(1e-3));
  torch::optim::Optimizer& base = muon;
  fogo::add_param_group(base, OptimizerParamGroup({v}, std::make_unique<fogo::MuonOptions>(0.05)));
  EXPECT_EQ(muon.param_groups()[1].options().get_lr(), 0.05);
  v.mutable_grad() = torch::ones_like(v);
  const auto start = v.detach().clone();
  muon.step();
  auto lone = start.clone().requires_grad_();
  fogo::Muon reference({lone}, fogo::MuonOptions(0.05));
  lone.mutable_grad() = torch::ones_like(lone);
  reference.step();
  EXPECT_TRUE(fogo::test::bit_identical({v.detach()}, {lone.detach()}));

  auto b = torch::randn({5, 2}).requires_grad_();
  fogo::HybridOptimizer hybrid(
      std::make_unique<fogo::Muon>(std::vector{w}, fogo::MuonOptions(1e-3)), nullptr);
  fogo::add_param_group(static_cast<torch::optim::Optimizer&>(hybrid),
                        OptimizerParamGroup({b}, std::make_unique<fogo::MuonOptions>(0.05)));
  EXPECT_EQ(hybrid.param_groups()[1].options().get_lr(), 0.05);
}

// Every binary loads the NCCL and CUDA runtime of the torch wheel it runs with (the directory
// next to the libtorch_cuda.so it mapped: site-packages/nvidia/*/lib), never a system CUDA
// toolkit's (cmake/FogoTorch.cmake): torch 2.15 needs its own NCCL 2.30 and cudart 13.2.
TEST(TorchVersions, NcclAndCudartAreTheTorchWheels) {
  std::ifstream maps("/proc/self/maps");
  std::string line, torch_cuda, nccl, cudart;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string file = path.substr(path.rfind('/') + 1);
    if (file == "libtorch_cuda.so") torch_cuda = path;
    if (file.rfind("libnccl.so", 0) == 0) nccl = path;
    if (file.rfind("libcudart.so", 0) == 0) cudart = path;
  }
  if (torch_cuda.empty()) GTEST_SKIP() << "this torch has no CUDA (libtorch_cuda.so not mapped)";
  // .../site-packages/torch/lib/libtorch_cuda.so -> .../site-packages/
  const std::string site = torch_cuda.substr(0, torch_cuda.rfind("/torch/lib/") + 1);
  ASSERT_FALSE(nccl.empty()) << "libnccl not mapped";
  ASSERT_FALSE(cudart.empty()) << "libcudart not mapped";
  EXPECT_EQ(nccl.rfind(site + "nvidia/", 0), 0u) << nccl << " is not under " << site;
  EXPECT_EQ(cudart.rfind(site + "nvidia/", 0), 0u) << cudart << " is not under " << site;
}

}  // namespace
