// The one non-finite decision (fogo/nonfinite.h): decide_nonfinite's rule, and every policy giving
// the same outcome on every C++ path that steps (FOGO, Muon, the hybrid over either), for a NaN in
// a matrix gradient and in an AdamW gradient; and the step's scalars checked for an optimizer fogo
// does not know (a test-only MatrixOptimizer).
#include <fogo/fogo.h>
#include <fogo/hybrid.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "fogo_private/frame/nonfinite.h"
#include "test_util.h"

namespace {

using fogo::NonFiniteDecision;
using fogo::NonFinitePolicy;
using Kind = NonFiniteDecision::Kind;
using fogo::test::expect_error;

const NonFinitePolicy kRaise = NonFinitePolicy::Raise, kSkip = NonFinitePolicy::Skip,
                      kMask = NonFinitePolicy::Mask, kUnchecked = NonFinitePolicy::Unchecked;

at::Tensor flag(bool ok) { return torch::tensor(ok); }

// decide_nonfinite, counting its reads to the host.
struct Decided {
  NonFiniteDecision d;
  int64_t reads;
};
Decided decide(const std::vector<NonFinitePolicy>& policies, const std::vector<at::Tensor>& flags,
               bool maskable = true) {
  const int64_t before = fogo::detail::unusable_grad_reads();
  NonFiniteDecision d = fogo::decide_nonfinite(policies, flags, maskable);
  return {d, fogo::detail::unusable_grad_reads() - before};
}

}  // namespace

TEST(NonFiniteDecision, HostItemsAreReadOnceAndAnUnusableRaiseItemWinsOverSkip) {
  // Two unusable Skip items before an unusable Raise item: Raise, naming the Raise item.
  auto r =
      decide({kSkip, kRaise, kSkip, kRaise}, {flag(false), flag(true), flag(false), flag(false)});
  EXPECT_EQ(r.d.kind, Kind::Raise);
  EXPECT_EQ(r.d.item, 3);
  EXPECT_EQ(r.reads, 1);
  // Only Skip items unusable: Skip, naming the first.
  r = decide({kRaise, kSkip, kSkip}, {flag(true), flag(false), flag(false)});
  EXPECT_EQ(r.d.kind, Kind::Skip);
  EXPECT_EQ(r.d.item, 1);
  EXPECT_FALSE(r.d.ok.defined());
  // Every host item usable, no Mask item: Step.
  r = decide({kRaise, kSkip}, {flag(true), flag(true)});
  EXPECT_EQ(r.d.kind, Kind::Step);
  EXPECT_EQ(r.d.item, -1);
  EXPECT_EQ(r.reads, 1);
}

TEST(NonFiniteDecision, MaskItemsAreDecidedOnTheDeviceForTheWholeStep) {
  // Mask items only: nothing read back; the flag is the AND of theirs.
  auto r = decide({kMask, kMask, kUnchecked}, {flag(true), flag(false), at::Tensor()});
  EXPECT_EQ(r.d.kind, Kind::Mask);
  EXPECT_EQ(r.reads, 0);
  ASSERT_TRUE(r.d.ok.defined());
  EXPECT_EQ(r.d.ok.dim(), 0);
  EXPECT_FALSE(r.d.ok.item<bool>());
  r = decide({kMask, kMask}, {flag(true), flag(true)});
  EXPECT_TRUE(r.d.ok.item<bool>());
  // Beside usable Raise items (read once), an unusable Mask item masks the step.
  r = decide({kRaise, kMask}, {flag(true), flag(false)});
  EXPECT_EQ(r.d.kind, Kind::Mask);
  EXPECT_FALSE(r.d.ok.item<bool>());
  EXPECT_EQ(r.reads, 1);
  // An unusable Skip item beside Mask items skips: nothing is stepped to be masked.
  r = decide({kSkip, kMask}, {flag(false), flag(true)});
  EXPECT_EQ(r.d.kind, Kind::Skip);
  EXPECT_FALSE(r.d.ok.defined());
}

TEST(NonFiniteDecision, AStepThatCannotBeMaskedChecksMaskOnTheHostAsSkip) {
  auto r = decide({kMask, kMask}, {flag(true), flag(false)}, /*maskable=*/false);
  EXPECT_EQ(r.d.kind, Kind::Skip);
  EXPECT_EQ(r.d.item, 1);
  EXPECT_EQ(r.reads, 1);
  r = decide({kMask}, {flag(true)}, /*maskable=*/false);
  EXPECT_EQ(r.d.kind, Kind::Step);
  EXPECT_FALSE(r.d.ok.defined());
}

TEST(NonFiniteDecision, UncheckedItemsAreNeverTestedAndBadCallsAreRefused) {
  auto r = decide({kUnchecked, kUnchecked}, {at::Tensor(), at::Tensor()});
  EXPECT_EQ(r.d.kind, Kind::Step);
  EXPECT_EQ(r.reads, 0);
  r = decide({}, {});
  EXPECT_EQ(r.d.kind, Kind::Step);
  EXPECT_EQ(r.reads, 0);
  expect_error([] { fogo::decide_nonfinite({kRaise}, {}); }, "1 policies for 0 flags");
  expect_error([] { fogo::decide_nonfinite({kSkip}, {at::Tensor()}); },
               "item 0 needs its usable flag");
  expect_error([] { fogo::decide_nonfinite({kMask}, {torch::ones({2}, torch::kBool)}); },
               "item 0 needs its usable flag");
  expect_error([] { fogo::decide_nonfinite({static_cast<NonFinitePolicy>(7)}, {flag(true)}); },
               "item 0 has the unknown policy 7");
}

TEST(NonFiniteDecision, TheUsabilityTestIsTheOverflowLimit) {
  const auto usable = [](const at::Tensor& g) { return fogo::detail::grad_usable(g).item<bool>(); };
  EXPECT_TRUE(usable(torch::ones({3, 4})));
  EXPECT_FALSE(usable(torch::tensor({1.0f, NAN})));
  EXPECT_FALSE(usable(torch::tensor({1.0f, -INFINITY})));
  EXPECT_FALSE(usable(torch::tensor({1e18f})));  // finite, but past kMaxGradNorm
  EXPECT_TRUE(usable(torch::tensor({1e18}, torch::kDouble)));
  EXPECT_FALSE(usable(torch::tensor({1e152}, torch::kDouble)));
  const auto flags =
      fogo::detail::usable_flags({kUnchecked, kMask}, {torch::ones({2}), torch::ones({2})});
  EXPECT_FALSE(flags[0].defined());
  EXPECT_TRUE(flags[1].item<bool>());
}

// -------------------------------------------------------------------------------------------
// The matrix: every policy x every C++ path x where the NaN is.

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 4));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

enum class Path { FOGO, Muon, HybridFOGO, HybridMuon };
const char* path_name(Path p) {
  switch (p) {
    case Path::FOGO:
      return "FOGO";
    case Path::Muon:
      return "Muon";
    case Path::HybridFOGO:
      return "HybridFOGO";
    default:
      return "HybridMuon";
  }
}

fogo::FOGOOptions fogo_options(NonFinitePolicy p) {
  return fogo::FOGOOptions(0.02).proj_dim(4).codebook_size(4).nonfinite(p);
}

// One optimizer of a path, over Net's parameters (standalone: its two weights, one group;
// hybrid: the weights in matrix group 0, the biases in rest group 1).
struct Subject {
  Net net;
  std::unique_ptr<torch::optim::Optimizer> opt;
  fogo::FOGO* fogo = nullptr;
  torch::optim::AdamW* adamw = nullptr;

  Subject(Path path, NonFinitePolicy policy) {
    torch::manual_seed(5);
    net = Net();
    const std::vector<torch::Tensor> weights{net->fc1->weight, net->fc2->weight};
    const torch::optim::AdamWOptions adamw_options(3e-3);
    if (path == Path::FOGO) {
      opt = std::make_unique<fogo::FOGO>(weights, fogo_options(policy));
    } else if (path == Path::Muon) {
      opt = std::make_unique<fogo::Muon>(weights, fogo::MuonOptions(0.02).nonfinite(policy));
    } else {
      auto hybrid = std::make_unique<fogo::HybridOptimizer>(
          path == Path::HybridFOGO
              ? fogo::make_hybrid<fogo::FOGO>(*net, fogo_options(policy), adamw_options)
              : fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02).nonfinite(policy),
                                              adamw_options));
      adamw = hybrid->rest<torch::optim::AdamW>();
      fogo = dynamic_cast<fogo::FOGO*>(hybrid->matrix());
      opt = std::move(hybrid);
    }
    if (!fogo) fogo = dynamic_cast<fogo::FOGO*>(opt.get());
  }

  // Gradients of step k for every parameter (the same for every run).
  void feed(int64_t k) {
    torch::manual_seed(100 + k);
    for (auto& p : net->parameters()) p.mutable_grad() = torch::randn(p.sizes());
  }

  // Every tensor a step may change, as bits: parameters, momenta, AdamW's moments, FOGO's memory.
  std::vector<torch::Tensor> bits() {
    std::vector<torch::Tensor> out;
    const auto put = [&](const torch::Tensor& t) {
      out.push_back(t.detach().clone().contiguous().view(torch::kInt));
    };
    for (const auto& p : net->parameters()) {
      put(p);
      void* key = p.unsafeGetTensorImpl();
      for (torch::optim::Optimizer* side : sides()) {
        const auto it = side->state().find(key);
        if (it == side->state().end()) continue;
        if (const auto* m = dynamic_cast<const fogo::MuonParamState*>(it->second.get())) {
          put(m->momentum_buffer());
        } else if (const auto* f = dynamic_cast<const fogo::FOGOParamState*>(it->second.get())) {
          put(f->slow_momentum());
          put(f->fast_momentum());
        } else {
          const auto& a = static_cast<const torch::optim::AdamWParamState&>(*it->second);
          put(a.exp_avg());
          put(a.exp_avg_sq());
        }
      }
    }
    if (fogo) {
      const auto m = fogo->memory(0);
      for (const auto& t : {m.centroids, m.S, m.N}) put(t);
    }
    return out;
  }

  // The step counters: FOGO's step and skipped_steps, each AdamW parameter's step.
  std::vector<int64_t> counters() {
    std::vector<int64_t> out;
    if (fogo) {
      out.push_back(fogo->telemetry()[0].step);
      out.push_back(fogo->telemetry()[0].skipped_steps);
    }
    if (adamw) {
      for (const auto& [key, st] : adamw->state())
        out.push_back(static_cast<const torch::optim::AdamWParamState&>(*st).step());
    }
    return out;
  }

  std::vector<torch::optim::Optimizer*> sides() {
    auto* hybrid = dynamic_cast<fogo::HybridOptimizer*>(opt.get());
    if (!hybrid) return {opt.get()};
    return {hybrid->matrix(), hybrid->rest()};
  }
};

struct Victim {
  const char* name;      ///< for traces
  bool matrix;           ///< a matrix gradient (fc2.weight) or an AdamW one (fc2.bias)
  const char* expected;  ///< what the error names
};

// What one unusable gradient does under `policy` on `path`.
void expect_outcome(Path path, NonFinitePolicy policy, const Victim& victim) {
  Subject s(path, policy);
  for (int64_t k = 0; k < 2; ++k) {  // past FOGO's first step and AdamW's state creation
    s.feed(k);
    s.opt->step();
  }
  s.feed(2);
  torch::Tensor poisoned = victim.matrix ? s.net->fc2->weight : s.net->fc2->bias;
  poisoned.mutable_grad()[0] = NAN;
  const auto before = s.bits();
  const auto counted = s.counters();
  const int64_t reads = fogo::detail::unusable_grad_reads();
  if (policy == kRaise) {
    expect_error([&] { s.opt->step(); }, std::string("gradient of ") + victim.expected +
                                             " contains NaN or Inf; the step was not applied");
  } else {
    s.opt->step();
  }
  const int64_t read = fogo::detail::unusable_grad_reads() - reads;
  const auto after = s.counters();
  if (policy == kUnchecked) {
    // No check, nothing read back: the NaN reaches the parameter (torch.optim's behaviour).
    EXPECT_EQ(read, 0);
    EXPECT_TRUE(torch::isnan(poisoned).any().item<bool>());
    return;
  }
  // Raise, Skip and Mask: every tensor keeps its bits.
  EXPECT_TRUE(fogo::test::bit_identical(s.bits(), before));
  if (policy == kMask) {
    // On the device, nothing read back; the step counts (FOGO's step and skipped_steps, AdamW's).
    EXPECT_EQ(read, 0);
    ASSERT_EQ(after.size(), counted.size());
    for (size_t k = 0; k < after.size(); ++k)
      EXPECT_EQ(after[k], counted[k] + 1) << "counter " << k;
  } else {
    // On the host, once; the step is not counted.
    EXPECT_EQ(read, 1);
    EXPECT_EQ(after, counted);
  }
  // Training goes on with usable gradients.
  s.feed(3);
  s.opt->step();
  for (const auto& p : s.net->parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  EXPECT_FALSE(fogo::test::bit_identical(s.bits(), before));
}

}  // namespace

TEST(NonFiniteMatrix, EveryPolicyHasOneOutcomeOnEveryCppPath) {
  const Victim matrix_standalone{"matrix", true, "parameter 1 of group 0 (shape [4, 8])"};
  const Victim matrix_hybrid{"matrix", true, "parameter 1 of group 0 (shape [4, 8])"};
  const Victim rest_hybrid{"AdamW", false, "parameter 1 of group 1 (shape [4])"};
  for (const Path path : {Path::FOGO, Path::Muon, Path::HybridFOGO, Path::HybridMuon}) {
    const bool hybrid = path == Path::HybridFOGO || path == Path::HybridMuon;
    std::vector<Victim> victims{hybrid ? matrix_hybrid : matrix_standalone};
    if (hybrid) victims.push_back(rest_hybrid);
    for (const NonFinitePolicy policy : {kRaise, kSkip, kMask, kUnchecked}) {
      for (const Victim& v : victims) {
        SCOPED_TRACE(std::string(path_name(path)) + " policy " +
                     std::to_string(static_cast<int>(policy)) + ", NaN in the " + v.name +
                     " gradient");
        expect_outcome(path, policy, v);
      }
    }
  }
}

TEST(NonFiniteMatrix, TheHybridsErrorNamesTheSide) {
  for (const bool matrix : {true, false}) {
    Subject s(Path::HybridMuon, kRaise);
    s.feed(0);
    (matrix ? s.net->fc1->weight : s.net->fc1->bias).mutable_grad()[0] = INFINITY;
    expect_error([&] { s.opt->step(); },
                 matrix ? "HybridOptimizer (matrix side): gradient of parameter 0 of group 0"
                        : "HybridOptimizer (rest side): gradient of parameter 0 of group 1");
  }
}

TEST(NonFiniteMatrix, MixedPoliciesInOneOptimizerFollowTheOneRule) {
  // Group 0 by Raise, group 1 by Mask: an unusable Mask gradient masks the whole step, group 0
  // included (one host read, for the Raise group); an unusable Raise gradient throws naming it.
  torch::manual_seed(9);
  std::vector<torch::Tensor> p{torch::randn({6, 10}).requires_grad_(true),
                               torch::randn({8, 5}).requires_grad_(true)};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{p[0]},
      std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(0.02).nonfinite(kRaise)));
  groups.emplace_back(
      std::vector<torch::Tensor>{p[1]},
      std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(0.02).nonfinite(kMask)));
  fogo::Muon opt(groups);
  const auto feed = [&](int64_t k) {
    torch::manual_seed(k);
    for (auto& t : p) t.mutable_grad() = torch::randn(t.sizes());
  };
  feed(1);
  opt.step();
  const auto copy = [&] {
    return std::vector<torch::Tensor>{p[0].detach().clone(), p[1].detach().clone()};
  };
  feed(2);
  p[1].mutable_grad()[0][0] = NAN;
  auto before = copy();
  int64_t reads = fogo::detail::unusable_grad_reads();
  opt.step();
  EXPECT_TRUE(fogo::test::bit_identical(copy(), before));
  EXPECT_EQ(fogo::detail::unusable_grad_reads() - reads, 1);
  feed(3);
  p[0].mutable_grad()[0][0] = NAN;
  p[1].mutable_grad()[0][0] = NAN;
  expect_error([&] { opt.step(); }, "Muon: gradient of parameter 0 of group 0 (shape [6, 10])");
  EXPECT_TRUE(fogo::test::bit_identical(copy(), before));
  // Group 0 by Skip, group 1 by Raise, both unusable: Raise wins, whatever the order.
  static_cast<fogo::MuonOptions&>(opt.param_groups()[0].options()).nonfinite(kSkip);
  static_cast<fogo::MuonOptions&>(opt.param_groups()[1].options()).nonfinite(kRaise);
  expect_error([&] { opt.step(); }, "Muon: gradient of parameter 0 of group 1 (shape [8, 5])");
  EXPECT_TRUE(fogo::test::bit_identical(copy(), before));
}

// -------------------------------------------------------------------------------------------
// An optimizer fogo does not know gets the frame: the step's scalars and the policies.

namespace {

struct DecayOptions : torch::optim::OptimizerCloneableOptions<DecayOptions> {
  explicit DecayOptions(double lr = 0.1) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(NonFinitePolicy, nonfinite) = NonFinitePolicy::Raise;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

// Gradient descent with decoupled weight decay: p = (p - lr g) (1 - lr wd).
class Decay : public fogo::MatrixOptimizer {
 public:
  Decay(const std::vector<torch::optim::OptimizerParamGroup>& groups, DecayOptions o)
      : MatrixOptimizer(groups, std::make_unique<DecayOptions>(o)) {}
  Decay(std::vector<torch::Tensor> params, DecayOptions o)
      : Decay({torch::optim::OptimizerParamGroup(std::move(params))}, o) {}
  NonFinitePolicy nonfinite(size_t g) const override { return options(g).nonfinite(); }
  NonFinitePolicy default_nonfinite() const override {
    return static_cast<const DecayOptions&>(defaults()).nonfinite();
  }
  double weight_decay(size_t g) const override { return options(g).weight_decay(); }
  void set_step_shard(fogo::StepShard) override {}

 private:
  const DecayOptions& options(size_t g) const {
    return static_cast<const DecayOptions&>(param_groups_[g].options());
  }
  const char* name() const override { return "Decay"; }
  void check_group(size_t) const override {}
  void check_param(size_t, size_t, const at::Tensor&) const override {}
  void step_group(const GroupStep& s) override {
    const auto& o = options(s.group);
    const fogo::detail::MaskScope keep(s.ok, s.params);
    for (size_t k = 0; k < s.params.size(); ++k) {
      s.params[k].sub_(s.grads[k] * o.lr()).mul_(1.0 - o.lr() * o.weight_decay());
    }
    keep.restore();
  }
};

}  // namespace

TEST(StepScalars, LrTimesWeightDecayIsCheckedForAnyOptimizer) {
  torch::manual_seed(4);
  auto p = torch::randn({3, 4}).requires_grad_(true);
  p.mutable_grad() = torch::randn({3, 4});
  const auto before = p.detach().clone();
  Decay opt({p}, DecayOptions(0.5).weight_decay(3.0));
  expect_error([&] { opt.step(); },
               "Decay: options 'lr' x 'weight_decay' of param group 0 is 0.5 x 3 = 1.5 > 1");
  EXPECT_TRUE(torch::equal(p, before));
  // Within the limit, the step is the optimizer's own.
  static_cast<DecayOptions&>(opt.param_groups()[0].options()).weight_decay(1.0);
  opt.step();
  EXPECT_TRUE(torch::allclose(p, (before - 0.5 * p.grad()) * 0.5));
}

TEST(StepScalars, TheHybridChecksItsAdamWSideToo) {
  Net net;
  auto opt = fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02),
                                           torch::optim::AdamWOptions(2.0).weight_decay(0.75));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::ones(p.sizes());
  const auto before = net->fc1->bias.detach().clone();
  expect_error([&] { opt.step(); },
               "HybridOptimizer: options 'lr' x 'weight_decay' of param group 1 is 2 x 0.75");
  EXPECT_TRUE(torch::equal(net->fc1->bias, before));
}

TEST(NonFiniteMatrix, AThirdOptimizerGetsThePoliciesAloneAndInTheHybrid) {
  Net net;
  auto opt = fogo::make_hybrid<Decay>(*net, DecayOptions(0.1).nonfinite(kMask),
                                      torch::optim::AdamWOptions(3e-3));
  const auto feed = [&] {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::ones(p.sizes());
  };
  feed();
  opt.step();  // AdamW's state exists from here on: the next steps can be masked
  for (auto* poisoned : {&net->fc1->weight, &net->fc1->bias}) {
    feed();
    poisoned->mutable_grad()[0] = NAN;
    std::vector<torch::Tensor> before;
    for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
    const int64_t reads = fogo::detail::unusable_grad_reads();
    opt.step();
    EXPECT_EQ(fogo::detail::unusable_grad_reads(), reads);
    std::vector<torch::Tensor> after;
    for (const auto& p : net->parameters()) after.push_back(p.detach().clone());
    EXPECT_TRUE(fogo::test::bit_identical(after, before));
  }
  // Raise for the matrix group: the hybrid names the parameter; alone, the optimizer does.
  static_cast<DecayOptions&>(opt.param_groups()[0].options()).nonfinite(kRaise);
  feed();
  net->fc1->weight.mutable_grad()[0] = NAN;
  expect_error([&] { opt.step(); },
               "HybridOptimizer (matrix side): gradient of parameter 0 of group 0 (shape [8, 6]) "
               "contains NaN or Inf");
  auto p = torch::zeros({3, 4}).requires_grad_(true);
  p.mutable_grad() = torch::full({3, 4}, INFINITY);
  Decay alone({p}, DecayOptions());
  expect_error([&] { alone.step(); }, "Decay: gradient of parameter 0 of group 0 (shape [3, 4])");
  EXPECT_FALSE(p.any().item<bool>());
}
