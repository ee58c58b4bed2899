// fogo::FOGO's matrix views beyond one matrix per parameter (matrix_view.h): stacks of experts
// (batch_dims) and fused weights cut into blocks (heads, blocks). The truth: the same matrices
// as separate parameters of one group, stepped by FOGO — each block is its own matrix in the
// projected space as a separate parameter would be (docs/algorithm.md).
#include <fogo/fogo_optimizer.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using fogo::test::expect_error;

fogo::FOGOOptions small_options() {
  return fogo::FOGOOptions(0.01)
      .proj_dim(16)
      .codebook_size(8)
      .reseed_every(3)
      .freeze_per_task(4)
      .weight_decay(0.1);
}

// Two parameters of `shape` under `o`'s layout in one group (one codebook), against their
// matrices as separate parameters in one group: 6 steps with a task boundary after the third; the
// parameters, momenta, memory and telemetry equal bit for bit after each.
void expect_as_separate(const std::vector<int64_t>& shape, const fogo::FOGOOptions& o) {
  const std::string what = c10::str(at::IntArrayRef(shape), " batch_dims ", o.batch_dims(),
                                    " heads ", o.heads(), " blocks ", at::IntArrayRef(o.blocks()),
                                    " fusion_only ", o.fusion_only(), " normuon ", o.normuon());
  torch::manual_seed(29);
  const auto view = fogo::matrix_view(at::IntArrayRef(shape), fogo::matrix_layout(o), "FOGO", "p");
  const int64_t b = o.batch_dims();
  std::vector<torch::Tensor> wholes, parts;
  for (int i = 0; i < 2; ++i) {
    wholes.push_back(torch::randn(shape).requires_grad_(true));
    for (int64_t k = 0; k < view.count(); ++k)
      parts.push_back(fogo::matrix_of(wholes[i].detach(), view, k).clone().requires_grad_(true));
  }
  fogo::FOGO together(wholes, o),
      apart(parts, fogo::FOGOOptions(o).batch_dims(0).heads(1).blocks({}));
  for (int step = 0; step < 6; ++step) {
    if (step == 3) {
      together.task_boundary();
      apart.task_boundary();
    }
    const std::string at_step = what + " step " + std::to_string(step);
    for (size_t i = 0; i < wholes.size(); ++i) {
      const torch::Tensor g = torch::randn(shape);
      wholes[i].mutable_grad() = g.clone();
      for (int64_t k = 0; k < view.count(); ++k)
        parts[i * view.count() + k].mutable_grad() = fogo::matrix_of(g, view, k).clone();
    }
    together.step();
    apart.step();
    for (size_t i = 0; i < wholes.size(); ++i) {
      const auto& st = static_cast<const fogo::FOGOParamState&>(
          *together.state().at(wholes[i].unsafeGetTensorImpl()));
      for (int64_t k = 0; k < view.count(); ++k) {
        const torch::Tensor& p = parts[i * view.count() + k];
        const auto& sp =
            static_cast<const fogo::FOGOParamState&>(*apart.state().at(p.unsafeGetTensorImpl()));
        const torch::Tensor mine = fogo::matrix_of(wholes[i].detach(), view, k);
        EXPECT_TRUE(torch::equal(mine, p.detach()))
            << at_step << " parameter " << i << " matrix " << k << ": differs by "
            << (mine - p.detach()).abs().max().item<double>();
        EXPECT_TRUE(torch::equal(fogo::matrix_of(st.slow_momentum(), view, k), sp.slow_momentum()));
        EXPECT_TRUE(torch::equal(fogo::matrix_of(st.fast_momentum(), view, k), sp.fast_momentum()));
        if (o.normuon())  // NorMuon's second moment: each matrix's rows, as a parameter's
          EXPECT_TRUE(
              torch::equal(fogo::matrix_of(st.second_moment(), view, k), sp.second_moment()))
              << at_step;
      }
    }
    const auto m = together.memory(0), ma = apart.memory(0);
    EXPECT_EQ(m.centroids.defined(), ma.centroids.defined()) << at_step;
    if (m.centroids.defined()) {
      EXPECT_TRUE(torch::equal(m.centroids, ma.centroids)) << at_step;
      EXPECT_TRUE(torch::equal(m.N, ma.N)) << at_step;
    }
    const auto t = together.telemetry().at(0), ta = apart.telemetry().at(0);
    EXPECT_EQ(t.delta_ratio, ta.delta_ratio) << at_step;
    EXPECT_EQ(t.rbar, ta.rbar) << at_step;
  }
}

}  // namespace

// A stack of experts (batch_dims) steps as its experts as separate parameters, bit for bit: full
// FOGO (each expert's rows in the projected space, its own RMS update) and fusion_only.
TEST(FOGOBlocks, StackStepsAsItsExpertsAsSeparateParameters) {
  for (const bool fusion_only : {false, true}) {
    const auto o = small_options().fusion_only(fusion_only).batch_dims(1);
    expect_as_separate({3, 6, 10}, o);
    expect_as_separate({3, 12, 5}, o);
    expect_as_separate({2, 2, 4, 2, 3}, fogo::FOGOOptions(o).batch_dims(2));
    expect_as_separate({3, 6, 10}, fogo::FOGOOptions(o).normuon(true));  // [E, out] second moment
  }
}

// A fused weight cut into heads or unequal blocks (and the blocks of each expert of a stack)
// steps as its blocks as separate parameters, bit for bit.
TEST(FOGOBlocks, FusedWeightStepsAsItsBlocksAsSeparateParameters) {
  for (const bool fusion_only : {false, true}) {
    const auto o = small_options().fusion_only(fusion_only);
    expect_as_separate({16, 10}, fogo::FOGOOptions(o).heads(4));
    expect_as_separate({16, 10}, fogo::FOGOOptions(o).blocks({8, 4, 4}));
    expect_as_separate({2, 12, 10}, fogo::FOGOOptions(o).batch_dims(1).blocks({6, 3, 3}));
    expect_as_separate({16, 10}, fogo::FOGOOptions(o).blocks({8, 4, 4}).normuon(true));
  }
}

// A layout that does not fit is refused naming the option and the parameter, at construction and
// at a step (which changes nothing); a checkpoint with the options set is format 2 and round-trips
// them.
TEST(FOGOBlocks, LayoutsAreCheckedAndCheckpointed) {
  torch::Tensor w = torch::randn({16, 10}).requires_grad_(true);
  expect_error([&] { fogo::FOGO({w}, small_options().heads(3)); },
               "FOGO: option 'heads' 3 does not divide the 16 rows of the matrices of parameter 0 "
               "of group 0");
  expect_error([&] { fogo::FOGO({w}, small_options().batch_dims(1)); },
               "FOGO: parameter 0 of group 0 (shape [16, 10]) has 2 dimensions; option "
               "'batch_dims' 1 needs at least 3");
  expect_error(
      [&] {
        fogo::FOGO({w}, small_options().heads(2).blocks({8, 8}));
      },
      "FOGO: options 'heads' (2) and 'blocks' [8, 8] both cut the rows");
  fogo::FOGO opt({w}, small_options().blocks({8, 4, 4}));
  w.mutable_grad() = torch::randn({16, 10});
  opt.step();
  const torch::Tensor before = w.detach().clone();
  static_cast<fogo::FOGOOptions&>(opt.param_groups()[0].options()).blocks({8, 4});
  expect_error([&] { opt.step(); }, "FOGO: option 'blocks' [8, 4] sums to 12 rows");
  EXPECT_TRUE(torch::equal(w.detach(), before));
  static_cast<fogo::FOGOOptions&>(opt.param_groups()[0].options()).blocks({8, 4, 4});
  std::ostringstream saved;
  torch::save(opt, saved);
  torch::serialize::InputArchive archive;
  const std::string bytes = saved.str();
  archive.load_from(bytes.data(), bytes.size());
  c10::IValue format;
  archive.read("fogo/format", format);
  EXPECT_EQ(format.toInt(), 2);
  torch::Tensor v = w.detach().clone().requires_grad_(true);
  fogo::FOGO other({v}, small_options());
  std::istringstream in(bytes);
  torch::load(other, in);
  EXPECT_EQ(static_cast<const fogo::FOGOOptions&>(other.param_groups()[0].options()).blocks(),
            (std::vector<int64_t>{8, 4, 4}));
}
