// fogo::Muon's matrix views beyond one matrix per parameter (matrix_view.h): stacks of experts
// (batch_dims) and fused weights cut into blocks (heads, blocks). The truth each is held to: the
// same matrices as separate parameters, stepped by fogo::Muon (itself held bit for bit to
// torch.optim.Muon in test_muon.cpp).
#include <fogo/muon.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using fogo::test::expect_error;

// A parameter of shape `shape` under `layout` and its matrices as separate parameters (copies of
// the matrix views), stepped side by side on the same gradients: one fogo::Muon for the parameter,
// one for the separate matrices (one group each).
struct Twins {
  fogo::MuonOptions options;
  fogo::MatrixView view;
  torch::Tensor whole;
  std::vector<torch::Tensor> parts;
  std::unique_ptr<fogo::Muon> together, apart;

  Twins(std::vector<int64_t> shape, const fogo::MuonOptions& o) : options(o) {
    whole = torch::randn(shape).requires_grad_(true);
    view = fogo::matrix_view(whole.sizes(), fogo::matrix_layout(o), "test", "the parameter");
    for (int64_t k = 0; k < view.count(); ++k) parts.push_back(part(whole.detach(), k));
    for (auto& p : parts) p.requires_grad_(true);
    together = std::make_unique<fogo::Muon>(std::vector<torch::Tensor>{whole}, o);
    apart =
        std::make_unique<fogo::Muon>(parts, fogo::MuonOptions(o).batch_dims(0).heads(1).blocks({}));
  }
  torch::Tensor part(const torch::Tensor& t, int64_t k) const {
    return fogo::matrix_of(t, view, k).clone();
  }
  // One step of both with gradient `grad` (the whole parameter's shape).
  void step(const torch::Tensor& grad) {
    whole.mutable_grad() = grad.clone();
    for (int64_t k = 0; k < view.count(); ++k)
      parts[static_cast<size_t>(k)].mutable_grad() = part(grad, k);
    together->step();
    apart->step();
  }
  const fogo::MuonParamState& state(const fogo::Muon& opt, const torch::Tensor& p) const {
    return static_cast<const fogo::MuonParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  }
  // Every matrix of the parameter, its momentum and its second moment (NorMuon) equal to the
  // separate parameter's, bit for bit.
  void expect_equal(const std::string& what) const {
    const auto& st = state(*together, whole);
    for (int64_t k = 0; k < view.count(); ++k) {
      const torch::Tensor& p = parts[static_cast<size_t>(k)];
      const auto& sp = state(*apart, p);
      const int64_t b = options.batch_dims();
      EXPECT_TRUE(torch::equal(fogo::matrix_of(whole.detach(), view, k), p.detach()))
          << what << ": matrix " << k << " differs by "
          << (fogo::matrix_of(whole.detach(), view, k) - p.detach()).abs().max().item<double>();
      EXPECT_TRUE(
          torch::equal(fogo::matrix_of(st.momentum_buffer(), view, k), sp.momentum_buffer()))
          << what << ": momentum " << k;
      ASSERT_EQ(st.second_moment().defined(), options.normuon()) << what;
      if (options.normuon()) {
        EXPECT_TRUE(torch::equal(fogo::matrix_of(st.second_moment(), view, k), sp.second_moment()))
            << what << ": second moment " << k;
      }
    }
  }
};

std::string name_of(const std::vector<int64_t>& shape, const fogo::MuonOptions& o) {
  std::ostringstream out;
  out << at::IntArrayRef(shape) << " batch_dims " << o.batch_dims() << " heads " << o.heads()
      << " blocks " << at::IntArrayRef(o.blocks()) << " normuon " << o.normuon() << " adjust_lr "
      << static_cast<int64_t>(o.adjust_lr()) << " ns_dtype " << c10::toString(o.ns_dtype());
  return out.str();
}

// Steps `twins` on random gradients and checks them equal after each.
void expect_twins(const std::vector<int64_t>& shape, const fogo::MuonOptions& o,
                  int64_t steps = 3) {
  torch::manual_seed(17);
  Twins twins(shape, o);
  const std::string what = name_of(shape, o);
  for (int64_t s = 0; s < steps; ++s) {
    twins.step(torch::randn(shape));
    twins.expect_equal(what + " step " + std::to_string(s));
  }
}

const fogo::MuonAdjustLR kRules[] = {
    fogo::MuonAdjustLR::Original, fogo::MuonAdjustLR::MatchRmsAdamW, fogo::MuonAdjustLR::Spectral};

}  // namespace

TEST(MatrixView, CutsTheBatchAndTheRowsAndNamesWhatDoesNotFit) {
  const auto stack = fogo::matrix_view({4, 6, 10}, {1, 1, {}}, "Muon", "p");
  EXPECT_EQ(stack.count(), 4);
  EXPECT_EQ(stack.rows_of(3), 6);
  EXPECT_EQ(stack.cols, 10);
  EXPECT_EQ(fogo::to_string(stack), "4 x [6, 10]");
  const auto conv = fogo::matrix_view({8, 3, 3, 3}, {}, "Muon", "p");
  EXPECT_TRUE(conv.single());
  EXPECT_EQ(fogo::to_string(conv), "[8, 27]");
  const auto gqa = fogo::matrix_view({2, 16, 5}, {1, 1, {8, 4, 4}}, "Muon", "p");
  EXPECT_EQ(gqa.count(), 6);
  EXPECT_EQ(gqa.rows_of(4), 4);
  EXPECT_EQ(fogo::to_string(gqa), "2 x [8, 5] + 4 x [4, 5]");
  EXPECT_EQ(fogo::to_string(fogo::matrix_view({16, 5}, {0, 4, {}}, "Muon", "p")), "4 x [4, 5]");
  // Matrix k's view: batch-major, the blocks' rows in order; every element in one view.
  const torch::Tensor t = torch::arange(2 * 16 * 5).view({2, 16, 5});
  EXPECT_TRUE(torch::equal(fogo::matrix_of(t, gqa, 3), t[1].narrow(0, 0, 8)));
  EXPECT_TRUE(torch::equal(fogo::matrix_of(t, gqa, 4), t[1].narrow(0, 8, 4)));
  EXPECT_TRUE(torch::equal(fogo::matrix_of(torch::arange(32).view({2, 16}), gqa, 2),
                           torch::arange(12, 16)));
  expect_error(
      [] {
        fogo::matrix_view({4, 6}, {1, 1, {}}, "Muon", "p");
      },
      "Muon: p has 2 dimensions; option 'batch_dims' 1 needs at least 3");
  expect_error(
      [] {
        fogo::matrix_view({16, 5}, {0, 3, {}}, "Muon", "p");
      },
      "Muon: option 'heads' 3 does not divide the 16 rows");
  expect_error(
      [] {
        fogo::matrix_view({16, 5}, {0, 1, {8, 4}}, "Muon", "p");
      },
      "Muon: option 'blocks' [8, 4] sums to 12 rows");
}

// A stack of experts [E, out, in] (batch_dims 1) steps as its E matrices as separate parameters,
// bit for bit: wide, tall and square experts, a stack of stacks (batch_dims 2) and a stack of conv
// weights (each expert its [out, in*kh*kw] view), under every adjust_lr rule (each expert's own
// shape's scale), with NorMuon on and off (a second moment per row of each expert).
TEST(MuonStacks, StackStepsAsItsExpertsAsSeparateParametersBitForBit) {
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> stacks = {
      {{3, 8, 27}, 1}, {{3, 27, 8}, 1}, {{4, 6, 6}, 1}, {{2, 2, 5, 7}, 2}, {{3, 4, 2, 3, 3}, 1}};
  for (const auto& [shape, b] : stacks) {
    for (const bool normuon : {false, true}) {
      for (const auto rule : kRules) {
        expect_twins(shape, fogo::MuonOptions(0.02)
                                .ns_dtype(torch::kBFloat16)
                                .batch_dims(b)
                                .normuon(normuon)
                                .adjust_lr(rule));
      }
    }
  }
  // fp32 Newton–Schulz too, and no Nesterov.
  expect_twins({3, 8, 27}, fogo::MuonOptions(0.02).ns_dtype(torch::kFloat).batch_dims(1));
  expect_twins({3, 8, 27},
               fogo::MuonOptions(0.02).ns_dtype(torch::kFloat).nesterov(false).batch_dims(1));
}

// Without batch_dims a stack is one matrix [E*out, in] (today's matrix view): it steps differently
// from its experts, which is what batch_dims is for.
TEST(MuonStacks, WithoutBatchDimsAStackIsOneMatrix) {
  torch::manual_seed(5);
  const auto o = fogo::MuonOptions(0.02).ns_dtype(torch::kBFloat16);
  torch::Tensor flat = torch::randn({3, 8, 27}).requires_grad_(true);
  torch::Tensor stacked = flat.detach().clone().requires_grad_(true);
  fogo::Muon a({flat}, o), b({stacked}, fogo::MuonOptions(o).batch_dims(1));
  const torch::Tensor g = torch::randn({3, 8, 27});
  flat.mutable_grad() = g.clone();
  stacked.mutable_grad() = g.clone();
  a.step();
  b.step();
  EXPECT_FALSE(torch::equal(flat.detach(), stacked.detach()));
}

// An MoE layer whose experts get no gradient in a step. All-zero slices: each such expert steps as
// a separate parameter with a zero gradient does (its momentum decays and still moves it; one that
// never had a gradient takes the weight decay alone: Newton–Schulz of zero is zero), finite, with
// NorMuon too (a zero row of the update is a zero row of the normalized one). No gradient for the
// whole stack (an undefined grad): the stack is skipped, no decay, no state, as any parameter.
TEST(MuonStacks, ExpertsWithoutGradientStayFiniteAsDocumented) {
  for (const bool normuon : {false, true}) {
    torch::manual_seed(23);
    const auto o =
        fogo::MuonOptions(0.02).ns_dtype(torch::kBFloat16).batch_dims(1).normuon(normuon);
    Twins twins({4, 6, 10}, o);
    const torch::Tensor start = twins.whole.detach().clone();
    for (int64_t s = 0; s < 4; ++s) {
      torch::Tensor g = torch::randn({4, 6, 10});
      g[0].zero_();              // expert 0 never routed to
      if (s >= 2) g[1].zero_();  // expert 1 idle from step 2
      twins.step(g);
      twins.expect_equal("normuon " + std::to_string(normuon) + " step " + std::to_string(s));
      EXPECT_TRUE(torch::isfinite(twins.whole.detach()).all().item<bool>());
    }
    // Expert 0: four steps of weight decay alone, 1 - lr wd each time (lr 0.02, wd 0.1).
    torch::Tensor decayed = start[0].clone();
    for (int s = 0; s < 4; ++s) decayed.mul_(1.0 - 0.02 * 0.1);
    EXPECT_TRUE(torch::equal(twins.whole.detach()[0], decayed));
    EXPECT_FALSE(torch::equal(twins.whole.detach()[1], start[1]));
  }
  torch::Tensor stack = torch::randn({4, 6, 10}).requires_grad_(true);
  torch::Tensor other = torch::randn({6, 10}).requires_grad_(true);
  const torch::Tensor before = stack.detach().clone();
  fogo::Muon opt({torch::optim::OptimizerParamGroup(
                      {stack}, std::make_unique<fogo::MuonOptions>(
                                   fogo::MuonOptions(0.02).batch_dims(1).normuon(true))),
                  torch::optim::OptimizerParamGroup({other})},
                 fogo::MuonOptions(0.02));
  other.mutable_grad() = torch::randn({6, 10});
  opt.step();
  EXPECT_TRUE(torch::equal(stack.detach(), before));
  EXPECT_EQ(opt.state().count(stack.unsafeGetTensorImpl()), 0u);
  EXPECT_EQ(opt.state().count(other.unsafeGetTensorImpl()), 1u);
}

// A fused weight cut into blocks along its rows steps as its blocks as separate parameters, bit for
// bit: equal heads, unequal blocks (GQA's q, k, v), blocks of a conv weight's rows, and blocks of
// each expert of a stack; every adjust_lr rule (each block's own shape's scale, the "per-block"
// convention), NorMuon on and off.
TEST(MuonBlocks, FusedWeightStepsAsItsBlocksAsSeparateParametersBitForBit) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t batch_dims, heads;
    std::vector<int64_t> blocks;
  };
  const std::vector<Case> cases = {{{16, 12}, 0, 4, {}},          {{16, 12}, 0, 1, {8, 4, 4}},
                                   {{12, 40}, 0, 1, {4, 2, 6}},   {{6, 2, 3, 3}, 0, 3, {}},
                                   {{2, 12, 9}, 1, 1, {6, 3, 3}}, {{3, 8, 5}, 1, 2, {}}};
  for (const Case& c : cases) {
    for (const bool normuon : {false, true}) {
      for (const auto rule : kRules) {
        expect_twins(c.shape, fogo::MuonOptions(0.02)
                                  .ns_dtype(torch::kBFloat16)
                                  .batch_dims(c.batch_dims)
                                  .heads(c.heads)
                                  .blocks(c.blocks)
                                  .normuon(normuon)
                                  .adjust_lr(rule));
      }
    }
  }
  expect_twins({16, 12}, fogo::MuonOptions(0.02).ns_dtype(torch::kFloat).blocks({8, 4, 4}));
}

// A layout that does not fit a parameter is refused naming the option and the parameter: at
// construction, and at a step after the group's options changed (the step changes nothing).
TEST(MuonBlocks, LayoutsThatDoNotFitAreRefusedNamingTheOption) {
  torch::Tensor w = torch::randn({16, 12}).requires_grad_(true);
  expect_error([&] { fogo::Muon({w}, fogo::MuonOptions().heads(3)); },
               "Muon: option 'heads' 3 does not divide the 16 rows of the matrices of parameter 0 "
               "of group 0");
  expect_error(
      [&] {
        fogo::Muon({w}, fogo::MuonOptions().blocks({8, 4}));
      },
      "Muon: option 'blocks' [8, 4] sums to 12 rows, but the matrices of parameter 0 of "
      "group 0");
  expect_error([&] { fogo::Muon({w}, fogo::MuonOptions().batch_dims(1)); },
               "option 'batch_dims' 1 needs at least 3");
  expect_error(
      [&] {
        fogo::Muon({w}, fogo::MuonOptions().heads(2).blocks({8, 8}));
      },
      "Muon: options 'heads' (2) and 'blocks' [8, 8] both cut the rows");
  expect_error(
      [&] {
        fogo::Muon({w}, fogo::MuonOptions().blocks({16, 0}));
      },
      "Muon: option 'blocks' must list counts >= 1");
  // strict_2d asks the matrices, not the stack, to be 2-D.
  torch::Tensor stack = torch::randn({2, 4, 6}).requires_grad_(true);
  EXPECT_NO_THROW(fogo::Muon({stack}, fogo::MuonOptions().batch_dims(1).strict_2d(true)));
  expect_error([&] { fogo::Muon({stack}, fogo::MuonOptions().strict_2d(true)); },
               "Muon only supports 2D parameters");
  fogo::Muon opt({w}, fogo::MuonOptions(0.02).heads(4));
  w.mutable_grad() = torch::randn({16, 12});
  opt.step();
  const torch::Tensor before = w.detach().clone();
  const torch::Tensor buf =
      static_cast<fogo::MuonParamState&>(*opt.state().at(w.unsafeGetTensorImpl()))
          .momentum_buffer()
          .clone();
  static_cast<fogo::MuonOptions&>(opt.param_groups()[0].options()).heads(5);
  expect_error([&] { opt.step(); }, "option 'heads' 5 does not divide the 16 rows");
  EXPECT_TRUE(torch::equal(w.detach(), before));
  EXPECT_TRUE(
      torch::equal(static_cast<fogo::MuonParamState&>(*opt.state().at(w.unsafeGetTensorImpl()))
                       .momentum_buffer(),
                   buf));
}

// A stack with NorMuon saved after two steps and loaded into a fresh optimizer continues as the
// uninterrupted one, bit for bit; the checkpoint is format 3 (batch_dims, heads and blocks are
// since(3)) and its second moment [E, out] is refused by a group that cuts the stack otherwise.
TEST(MuonStacks, CheckpointsContinueAndHoldTheLayout) {
  torch::manual_seed(31);
  const auto o =
      fogo::MuonOptions(0.02).ns_dtype(torch::kBFloat16).batch_dims(1).heads(2).normuon(true);
  torch::Tensor a = torch::randn({3, 8, 10}).requires_grad_(true);
  torch::Tensor b = a.detach().clone().requires_grad_(true);
  fogo::Muon first({a}, o);
  std::vector<torch::Tensor> grads;
  for (int s = 0; s < 4; ++s) grads.push_back(torch::randn({3, 8, 10}));
  for (int s = 0; s < 2; ++s) {
    a.mutable_grad() = grads[s].clone();
    first.step();
  }
  std::ostringstream saved;
  torch::save(first, saved);
  b.detach().copy_(a.detach());
  fogo::Muon second({b}, fogo::MuonOptions(0.5));
  {
    std::istringstream in(saved.str());
    torch::load(second, in);
  }
  EXPECT_TRUE(static_cast<const fogo::MuonOptions&>(second.param_groups()[0].options()) == o);
  for (int s = 2; s < 4; ++s) {
    a.mutable_grad() = grads[s].clone();
    b.mutable_grad() = grads[s].clone();
    first.step();
    second.step();
    EXPECT_TRUE(torch::equal(a.detach(), b.detach())) << "step " << s;
  }
  torch::serialize::InputArchive archive;
  const std::string bytes = saved.str();
  archive.load_from(bytes.data(), bytes.size());
  c10::IValue format;
  archive.read("muon/format", format);
  EXPECT_EQ(format.toInt(), 3);
}

// The second moment of a stack is [E, out]; a checkpoint whose second moment does not have the
// shape the loaded batch_dims gives is refused naming it, and changes nothing.
TEST(MuonStacks, SecondMomentOfAnotherLayoutIsRefused) {
  torch::manual_seed(37);
  torch::Tensor a = torch::randn({3, 8, 10}).requires_grad_(true);
  fogo::Muon opt({a}, fogo::MuonOptions(0.02).batch_dims(1).normuon(true));
  a.mutable_grad() = torch::randn({3, 8, 10});
  opt.step();
  auto& st = static_cast<fogo::MuonParamState&>(*opt.state().at(a.unsafeGetTensorImpl()));
  EXPECT_EQ(st.second_moment().sizes(), (std::vector<int64_t>{3, 8}));
  st.second_moment(torch::zeros({3}));  // as a batch_dims 0 optimizer's
  std::ostringstream saved;
  torch::save(opt, saved);
  torch::Tensor b = torch::randn({3, 8, 10}).requires_grad_(true);
  fogo::Muon other({b}, fogo::MuonOptions(0.02));
  std::istringstream in(saved.str());
  expect_error([&] { torch::load(other, in); },
               "the checkpoint's second_moment for parameter 0 of group 0 (shape [3, 8, 10]) has "
               "shape [3]");
  EXPECT_TRUE(other.state().empty());
  EXPECT_FALSE(
      static_cast<const fogo::MuonOptions&>(other.param_groups()[0].options()).batch_dims() == 1);
}
