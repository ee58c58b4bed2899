// The hybrid's options reach its sides only when they change: an unchanged step copies none, a
// new lr is set in place, and any other edit is copied, whoever makes it.
#include <fogo/fogo.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

struct SmallNetImpl : torch::nn::Module {
  SmallNetImpl() {
    fc = register_module("fc", torch::nn::Linear(6, 8));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  }
  torch::Tensor forward(const torch::Tensor& x) { return norm(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(SmallNet);

void step(SmallNet& net, fogo::HybridOptimizer& opt) {
  opt.zero_grad();
  net->forward(torch::randn({3, 6})).pow(2).sum().backward();
  opt.step();
}

// The options object a side's group holds (its address tells whether it was replaced).
const torch::optim::OptimizerOptions* held(const torch::optim::Optimizer* side) {
  return &side->param_groups()[0].options();
}

template <class Options>
const Options& as(const torch::optim::OptimizerOptions& options) {
  return static_cast<const Options&>(options);
}

// The hybrid's sides, read directly: no accessor of the hybrid (which hands options over too)
// between a step and what a test reads.
struct Sides {
  explicit Sides(fogo::HybridOptimizer& opt) : matrix(opt.matrix()), rest(opt.rest()) {}
  torch::optim::Optimizer* matrix;
  torch::optim::Optimizer* rest;
};

// Both sides' groups hold options equal to the hybrid's (their own operator==).
void expect_sides_hold_hybrids(const fogo::HybridOptimizer& opt, const Sides& sides) {
  EXPECT_TRUE(as<fogo::MuonOptions>(*held(sides.matrix)) ==
              as<fogo::MuonOptions>(opt.param_groups()[0].options()));
  EXPECT_TRUE(as<torch::optim::AdamWOptions>(*held(sides.rest)) ==
              as<torch::optim::AdamWOptions>(opt.param_groups()[1].options()));
}

// The tests' net (seed 0) and hybrid: Muon 0.02 on its matrices, AdamW 3e-3 on the rest.
SmallNet seeded_net() {
  torch::manual_seed(0);
  return SmallNet();
}
fogo::HybridOptimizer muon_hybrid(SmallNet& net) {
  return fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02),
                                       torch::optim::AdamWOptions(3e-3));
}

}  // namespace

TEST(HybridOptions, AnUnchangedStepCopiesNoOptionsAndANewLrIsSetInPlace) {
  SmallNet net = seeded_net();
  auto opt = muon_hybrid(net);
  const Sides sides(opt);
  step(net, opt);
  const auto* matrix = held(sides.matrix);
  const auto* rest = held(sides.rest);
  for (int k = 0; k < 3; ++k) step(net, opt);
  ASSERT_EQ(held(sides.matrix), matrix);
  ASSERT_EQ(held(sides.rest), rest);

  // A scheduler's lr and set_lr_factor's reach the sides at the next step, with no copy.
  torch::optim::StepLR scheduler(opt, 1, 0.5);
  scheduler.step();  // LibTorch's StepLR decays from its second call
  scheduler.step();
  step(net, opt);
  ASSERT_EQ(held(sides.matrix), matrix);
  ASSERT_EQ(held(sides.rest), rest);
  EXPECT_EQ(matrix->get_lr(), 0.01);
  EXPECT_EQ(rest->get_lr(), opt.param_groups()[1].options().get_lr());
  opt.set_lr_factor(0.25);
  step(net, opt);
  ASSERT_EQ(held(sides.matrix), matrix);
  ASSERT_EQ(held(sides.rest), rest);
  EXPECT_EQ(matrix->get_lr(), 0.02 * 0.25);
  EXPECT_EQ(rest->get_lr(), 3e-3 * 0.25);
  expect_sides_hold_hybrids(opt, sides);
}

TEST(HybridOptions, EveryEditOfAnOptionReachesItsSideAtTheNextStep) {
  SmallNet net = seeded_net();
  auto opt = muon_hybrid(net);
  const Sides sides(opt);
  auto& muon = static_cast<fogo::MuonOptions&>(opt.param_groups()[0].options());
  auto& adamw = static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[1].options());
  // Each of AdamW's options (its operator== must see every one) and some of Muon's (the option
  // table's operator== sees all: OptionTable's tests), one at a time, each followed by a step:
  // the side's options are replaced by ones equal to the hybrid's. amsgrad first: LibTorch's AdamW
  // cannot turn it on for a parameter that has state already.
  const std::vector<std::pair<std::string, std::function<void()>>> edits = {
      {"adamw amsgrad", [&] { adamw.amsgrad(true); }},
      {"muon momentum", [&] { muon.momentum(0.9); }},
      {"muon nesterov", [&] { muon.nesterov(false); }},
      {"muon weight_decay", [&] { muon.weight_decay(0.01); }},
      {"adamw betas",
       [&] {
         adamw.betas({0.8, 0.99});
       }},
      {"adamw eps", [&] { adamw.eps(1e-6); }},
      {"adamw weight_decay", [&] { adamw.weight_decay(0.0); }},
  };
  for (const auto& [what, edit] : edits) {
    SCOPED_TRACE(what);
    torch::optim::Optimizer* side = what.rfind("muon", 0) == 0 ? sides.matrix : sides.rest;
    const auto* before = held(side);
    edit();
    step(net, opt);
    EXPECT_NE(held(side), before);
    expect_sides_hold_hybrids(opt, sides);
  }
  // An edit made on a side's own group is overwritten by the hybrid's options, as documented.
  static_cast<fogo::MuonOptions&>(sides.matrix->param_groups()[0].options()).ns_steps(3);
  step(net, opt);
  EXPECT_EQ(as<fogo::MuonOptions>(*held(sides.matrix)).ns_steps(), muon.ns_steps());
  expect_sides_hold_hybrids(opt, sides);
}

TEST(HybridOptions, FOGOsOptionsAreHandedOverOnlyWhenChanged) {
  SmallNet net;
  auto opt = fogo::make_hybrid<fogo::FOGO>(*net, fogo::FOGOOptions(1e-3).proj_dim(4),
                                           torch::optim::AdamWOptions(3e-3));
  const auto* matrix = held(opt.matrix());
  ASSERT_EQ(held(opt.matrix()), matrix);  // each accessor hands the options over, as a step does
  opt.set_lr_factor(0.5);
  ASSERT_EQ(held(opt.matrix()), matrix);
  EXPECT_EQ(matrix->get_lr(), 5e-4);
  static_cast<fogo::FOGOOptions&>(opt.param_groups()[0].options()).sigma(0.3);
  const auto& now = as<fogo::FOGOOptions>(*held(opt.matrix()));
  EXPECT_NE(&now, matrix);
  EXPECT_TRUE(now == as<fogo::FOGOOptions>(opt.param_groups()[0].options()));
  EXPECT_EQ(now.sigma(), 0.3);
}
