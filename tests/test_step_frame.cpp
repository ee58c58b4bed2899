// The step frame fogo::FOGO and fogo::Muon share (matrix_optimizer.h): what a caller decided for
// a step (StepContext) reaches the step explicitly and rules it, and Mask's restore
// (detail::MaskScope) puts back exactly what a masked step changed; a CUDA graph capture that
// fails puts back what its host code changed (detail::SavedStates, GraphedStep::run).
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "fogo_private/frame/graphed_step.h"
#include "fogo_private/frame/nonfinite.h"
#include "fogo_private/ops/ops.h"
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
  fogo::NonFiniteDecision masked;
  masked.kind = fogo::NonFiniteDecision::Kind::Mask;
  masked.ok = torch::tensor(ok);
  fogo::StepContext c;
  c.decided = masked;
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
      checked.decided = fogo::NonFiniteDecision{};  // Step: the caller found them usable
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

// Sharded steps' owners (step_shard.h): costliest first to the least-loaded rank, ties to the
// earlier parameter and the lower rank; the cost Newton–Schulz's m n min(m, n), numel for
// vectors.
TEST(AssignOwners, GreedyByCostTiesInOrder) {
  EXPECT_EQ(fogo::newton_schulz_cost({24, 12}), 24.0 * 12 * 12);
  EXPECT_EQ(fogo::newton_schulz_cost({8, 3, 2, 2}), 8.0 * 12 * 8);  // its [8, 12] view
  EXPECT_EQ(fogo::newton_schulz_cost({7}), 7.0);
  // 10 -> rank 0; 8 -> 1; the first 5 -> 1 (loads 10, 8); the second 5 -> 0 (loads 10, 13);
  // 1 -> 1 (loads 15, 13).
  EXPECT_EQ(fogo::assign_owners({5, 10, 8, 5, 1}, 2), (std::vector<int64_t>{1, 0, 1, 0, 1}));
  EXPECT_EQ(fogo::assign_owners({3, 3, 3}, 3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(fogo::assign_owners({3, 3}, 1), (std::vector<int64_t>{0, 0}));
  EXPECT_THROW(fogo::assign_owners({1}, 0), c10::Error);
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

// What a failed capture's host code may have done to the optimizer's state (a tensor replaced, an
// entry created) is undone: every saved entry comes back with its own tensors (the same ones), a
// parameter that had none has none again. (The capture itself needs a GPU:
// CudaGraph.AFailedCaptureLeavesTheOptimizerAsItWasAndStepsEagerly.)
TEST(GraphedStep, SavedStatesPutBackEachParametersEntryAsItWas) {
  for (const Kind& kind : kinds()) {
    auto p = make_params();
    auto opt = kind.make(p, NonFinitePolicy::Raise);
    feed(p, 4);
    p[1].mutable_grad() = torch::Tensor();  // p[1] gets no state
    opt->step();
    auto& state = opt->state();
    const auto tensors = [&](const torch::Tensor& param) {
      std::vector<torch::Tensor> out;
      const auto& entry = *state.at(param.unsafeGetTensorImpl());
      if (const auto* m = dynamic_cast<const fogo::MuonParamState*>(&entry)) {
        out.push_back(m->momentum_buffer());
      } else {
        const auto& f = static_cast<const fogo::FOGOParamState&>(entry);
        out.push_back(f.slow_momentum());
        out.push_back(f.fast_momentum());
      }
      return out;
    };
    ASSERT_EQ(state.count(p[1].unsafeGetTensorImpl()), 0u) << kind.name;
    const std::vector<torch::Tensor> before = tensors(p[0]);
    fogo::detail::SavedStates saved(*opt, p);
    // As a capture's host code might: p[0]'s entry replaced by one with new tensors, an entry
    // made for p[1].
    auto& entry = state.at(p[0].unsafeGetTensorImpl());
    if (auto* m = dynamic_cast<fogo::MuonParamState*>(entry.get())) {
      m->momentum_buffer(torch::full_like(before[0], 7.0));
    } else {
      static_cast<fogo::FOGOParamState&>(*entry).slow_momentum(torch::full_like(before[0], 7.0));
    }
    state[p[1].unsafeGetTensorImpl()] = state.at(p[0].unsafeGetTensorImpl())->clone();
    saved.restore();
    const std::vector<torch::Tensor> after = tensors(p[0]);
    ASSERT_EQ(after.size(), before.size());
    for (size_t k = 0; k < before.size(); ++k)
      EXPECT_TRUE(after[k].is_same(before[k])) << kind.name << " tensor " << k;
    EXPECT_EQ(state.count(p[1].unsafeGetTensorImpl()), 0u) << kind.name;
  }
}

// GraphedStep::run when the capture fails: `save` was taken just before it and its restore runs,
// the work runs no more (the caller steps eagerly), nothing counts as captured or replayed. Here
// the capture fails because a CPU device has no CUDA stream to capture on (in a build without
// CUDA, run refuses outright); CudaGraph.AFailedCaptureLeavesTheOptimizerAsItWasAndStepsEagerly
// fails one on a GPU, after the work was recorded.
TEST(GraphedStep, AFailedCapturePutsBackWhatSaveTookAndReportsIt) {
  if (!fogo::ops::cuda_kernels_available())
    GTEST_SKIP() << "fogo was built without CUDA: GraphedStep::run refuses every capture";
  fogo::detail::GraphedStep step;
  int saves = 0, restores = 0, works = 0;
  const auto save = [&] {
    ++saves;
    return std::function<void()>([&] { ++restores; });
  };
  fogo::StepInputs in;
  in.grads = {torch::randn({3, 4})};
  in.lr = 0.1;
  const bool captured = step.run(
      {1}, in, torch::Device(torch::kCPU), [&](const fogo::StepInputs&) { ++works; }, "a test",
      save);
  EXPECT_FALSE(captured);
  EXPECT_TRUE(step.failed());
  EXPECT_EQ(saves, 1);
  EXPECT_EQ(restores, 1);
  EXPECT_EQ(works, 0);
  EXPECT_EQ(step.captures(), 0);
  EXPECT_EQ(step.replays(), 0);
}
