// The step frame fogo::FOGO and fogo::Muon share (matrix_optimizer.h): what a caller decided for
// a step (StepContext) reaches the step explicitly and rules it, and Mask's restore
// (detail::MaskScope) puts back exactly what a masked step changed.
#include <fogo/detail/checks.h>
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "test_util.h"

namespace {

using fogo::test::bit_identical;

using fogo::NonFinitePolicy;

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(3);
  return {torch::randn({6, 10}).requires_grad_(true), torch::randn({8, 5}).requires_grad_(true)};
}

void feed(std::vector<torch::Tensor>& params, int64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
}

struct Kind {
  const char* name;
  std::function<std::unique_ptr<fogo::MatrixOptimizer>(std::vector<torch::Tensor>, NonFinitePolicy)>
      make;
};

std::vector<Kind> kinds() {
  return {{"Muon",
           [](std::vector<torch::Tensor> p, NonFinitePolicy policy) {
             return std::make_unique<fogo::Muon>(std::move(p),
                                                 fogo::MuonOptions(0.02).nonfinite(policy));
           }},
          {"FOGO", [](std::vector<torch::Tensor> p, NonFinitePolicy policy) {
             return std::make_unique<fogo::FOGO>(
                 std::move(p),
                 fogo::FOGOOptions(0.02).proj_dim(4).codebook_size(6).nonfinite(policy));
           }}};
}

// Every tensor a step may change: the parameters, their state, FOGO's memory; copied.
std::vector<torch::Tensor> everything(fogo::MatrixOptimizer& opt,
                                      const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.detach().clone());
    const auto it = opt.state().find(p.unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    if (const auto* m = dynamic_cast<const fogo::MuonParamState*>(it->second.get())) {
      out.push_back(m->momentum_buffer().clone());
    } else {
      const auto& f = static_cast<const fogo::FOGOParamState&>(*it->second);
      out.push_back(f.slow_momentum().clone());
      out.push_back(f.fast_momentum().clone());
    }
  }
  if (auto* f = dynamic_cast<fogo::FOGO*>(&opt)) {
    const auto m = f->memory(0);
    for (const auto& t : {m.centroids, m.S, m.N}) out.push_back(t);
    out.push_back(torch::tensor({f->telemetry()[0].rbar}, torch::kDouble));
  }
  return out;
}

fogo::StepContext with_flag(bool ok) {
  fogo::StepContext c;
  c.ok = torch::tensor(ok);
  return c;
}

}  // namespace

TEST(StepFrame, TheCallersMaskFlagDecidesTheStep) {
  for (const Kind& kind : kinds()) {
    SCOPED_TRACE(kind.name);
    auto pa = make_params(), pb = make_params();
    auto a = kind.make(pa, NonFinitePolicy::Mask), b = kind.make(pb, NonFinitePolicy::Mask);
    for (int64_t k = 0; k < 2; ++k) {  // past FOGO's first step (checked on the host)
      feed(pa, k);
      feed(pb, k);
      a->step();
      b->step();
    }
    // Usable gradients, but the caller's flag says no (another optimizer's gradient was bad):
    // nothing changes, and nothing is read back.
    feed(pa, 7);
    feed(pb, 7);
    const auto before = everything(*a, pa);
    const int64_t reads = fogo::detail::unusable_grad_reads();
    a->step_with(with_flag(false));
    EXPECT_TRUE(bit_identical(everything(*a, pa), before));
    EXPECT_EQ(fogo::detail::unusable_grad_reads(), reads);
    // The caller's flag says yes: the step its own check would have taken, bit for bit.
    feed(pa, 8);
    feed(pb, 8);
    a->step_with(with_flag(true));
    b->step_with(with_flag(true));
    feed(pa, 9);
    feed(pb, 9);
    a->step_with(with_flag(true));
    b->step();
    // a skipped the step with gradients 7 that b never saw: both took 8 and 9.
    EXPECT_TRUE(bit_identical(everything(*a, pa), everything(*b, pb)));
    EXPECT_FALSE(bit_identical(everything(*a, pa), before));
  }
}

TEST(StepFrame, GradientsTheCallerCheckedAreNotReadAgain) {
  for (const Kind& kind : kinds()) {
    SCOPED_TRACE(kind.name);
    auto pa = make_params(), pb = make_params();
    auto a = kind.make(pa, NonFinitePolicy::Raise), b = kind.make(pb, NonFinitePolicy::Raise);
    for (int64_t k = 0; k < 3; ++k) {
      feed(pa, k);
      feed(pb, k);
      const int64_t reads = fogo::detail::unusable_grad_reads();
      fogo::StepContext checked;
      checked.grads_checked = true;
      a->step_with(checked);
      EXPECT_EQ(fogo::detail::unusable_grad_reads(), reads);
      b->step();
      EXPECT_EQ(fogo::detail::unusable_grad_reads(), reads + 1);
    }
    EXPECT_TRUE(bit_identical(everything(*a, pa), everything(*b, pb)));
  }
}

TEST(StepFrame, NonFiniteGradientsFollowEachPolicyThroughTheFrame) {
  for (const Kind& kind : kinds()) {
    for (const auto policy : {NonFinitePolicy::Raise, NonFinitePolicy::Skip}) {
      SCOPED_TRACE(std::string(kind.name) +
                   (policy == NonFinitePolicy::Raise ? " Raise" : " Skip"));
      auto p = make_params();
      auto opt = kind.make(p, policy);
      feed(p, 1);
      opt->step();
      feed(p, 2);
      p[1].mutable_grad()[0][0] = policy == NonFinitePolicy::Raise ? NAN : INFINITY;
      const auto before = everything(*opt, p);
      if (policy == NonFinitePolicy::Raise) {
        EXPECT_THROW(opt->step(), c10::Error);
      } else {
        opt->step();
      }
      EXPECT_TRUE(bit_identical(everything(*opt, p), before));
    }
  }
}

TEST(MaskScope, PutsBackWhereTheFlagIsFalseAndOnlyThere) {
  torch::manual_seed(5);
  const torch::Tensor a0 = torch::randn({3, 4}), b0 = torch::randn({5});
  for (const bool ok : {false, true}) {
    torch::Tensor a = a0.clone(), b = b0.clone(), undefined;
    const fogo::detail::MaskScope keep(torch::tensor(ok), {a, undefined, b});
    a.mul_(2);
    b.add_(1);
    keep.restore();
    EXPECT_TRUE(torch::equal(a, ok ? a0 * 2 : a0));
    EXPECT_TRUE(torch::equal(b, ok ? b0 + 1 : b0));
  }
  // A step that replaced a tensor: restored into the new one.
  torch::Tensor a = a0.clone();
  const fogo::detail::MaskScope keep(torch::tensor(false), {a});
  torch::Tensor replaced = a0 * 3;
  keep.restore({replaced});
  EXPECT_TRUE(torch::equal(replaced, a0));
  // No flag (the step is not masked): nothing is copied or put back.
  torch::Tensor c = a0.clone();
  const fogo::detail::MaskScope none(torch::Tensor(), {c});
  c.zero_();
  none.restore();
  EXPECT_EQ(c.abs().sum().item<float>(), 0.0f);
}
