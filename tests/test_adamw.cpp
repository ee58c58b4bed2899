// fogo::FusedAdamW against torch::optim::AdamW: the same inputs, the same options, several steps.
//
// Tolerance. The fused kernel evaluates AdamW's formulas in another order than
// torch::optim::AdamW's ops (exp_avg by a lerp, not mul then add; step_size * m / denom, not
// step_size * (m / denom); for bf16 in fp32 with one rounding per stored tensor, not one per op),
// so the two round differently: a few units in the last place per step, not bit for bit. fp32 and
// fp64 agree to 2e-6 (16 ulp of fp32) of each element's magnitude plus its tensor's largest
// (expect_close); bf16 to 0.03 (4 ulp of bf16) of the same, and the fused run's error against an
// fp64 run from the same start must not exceed torch::optim::AdamW's own. A wrong lr, beta, eps,
// weight decay or bias correction moves an element by far more than these.
#include <fogo/adamw.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <fogo/param_groups.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using fogo::FusedAdamW;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using Params = std::vector<torch::Tensor>;

// Shapes with a vector tail past the CPU kernel's SIMD width (33, 7) and N-D ones.
const std::vector<std::vector<int64_t>> kShapes = {{7}, {5, 3}, {2, 3, 4}, {33}};

Params make_params(torch::ScalarType dtype, uint64_t seed = 0) {
  torch::manual_seed(seed);
  Params out;
  for (const auto& s : kShapes) out.push_back(torch::randn(s).to(dtype).requires_grad_(true));
  return out;
}

Params copies(const Params& ps) {
  Params out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Step k's gradients, the same for every run (a seed per step and parameter).
void set_grads(const Params& ps, int k) {
  for (size_t i = 0; i < ps.size(); ++i) {
    torch::manual_seed(1000 * static_cast<uint64_t>(k) + i);
    ps[i].mutable_grad() = torch::randn(ps[i].sizes()).to(ps[i].device(), ps[i].scalar_type());
  }
}

const AdamWParamState& state_of(const torch::optim::Optimizer& o, const torch::Tensor& p) {
  return static_cast<const AdamWParamState&>(*o.state().at(p.unsafeGetTensorImpl()));
}

// |a - b| <= tol (|b| + max |b|): units in the last place of the element or of the tensor's
// largest element (the moments cancel: an element near zero carries the rounding of its larger
// terms). tol: 2e-6 (16 ulp of 2^-23) for fp32 and fp64, 0.03 (4 ulp of 2^-7) for bf16.
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  const auto x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  const double tol = a.scalar_type() == torch::kBFloat16 ? 0.03 : 2e-6;
  const auto excess = (x - y).abs() - tol * (y.abs() + y.abs().max());
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": max |a - b| " << (x - y).abs().max().item<double>() << ", max |b| "
      << y.abs().max().item<double>();
}

// Every parameter and its state (step, both moments, amsgrad's maximum) close; the steps equal.
void expect_same_run(const torch::optim::Optimizer& a, const Params& pa,
                     const torch::optim::Optimizer& b, const Params& pb) {
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::string at = "parameter " + std::to_string(i);
    expect_close(pa[i], pb[i], at);
    const bool has = a.state().count(pa[i].unsafeGetTensorImpl()) > 0;
    ASSERT_EQ(has, b.state().count(pb[i].unsafeGetTensorImpl()) > 0) << at;
    if (!has) continue;
    const auto &sa = state_of(a, pa[i]), &sb = state_of(b, pb[i]);
    EXPECT_EQ(sa.step(), sb.step()) << at;
    expect_close(sa.exp_avg(), sb.exp_avg(), at + " exp_avg");
    expect_close(sa.exp_avg_sq(), sb.exp_avg_sq(), at + " exp_avg_sq");
    expect_close(sa.max_exp_avg_sq(), sb.max_exp_avg_sq(), at + " max_exp_avg_sq");
  }
}

using Groups = std::function<std::vector<torch::optim::OptimizerParamGroup>(const Params&)>;

// One group of everything with `o`.
Groups one_group(const AdamWOptions& o) {
  return [o](const Params& ps) {
    return std::vector<torch::optim::OptimizerParamGroup>{{ps, std::make_unique<AdamWOptions>(o)}};
  };
}

// `steps` steps of FusedAdamW and of torch::optim::AdamW from the same parameters on the same
// gradients (`before(k, opt)` runs on both before step k), compared after each.
void compare(torch::ScalarType dtype, const Groups& groups, int steps,
             const std::function<void(int, torch::optim::Optimizer&)>& before = {}) {
  const Params pf = make_params(dtype), pr = copies(pf);
  auto fused = fogo::with_param_groups<FusedAdamW>(groups(pf), AdamWOptions());
  auto ref = fogo::with_param_groups<AdamW>(groups(pr), AdamWOptions());
  for (int k = 0; k < steps; ++k) {
    if (before) {
      before(k, *fused);
      before(k, *ref);
    }
    set_grads(pf, k);
    set_grads(pr, k);
    fused->step();
    ref->step();
    EXPECT_EQ(fused->last_fused(), pf.size()) << "step " << k << " did not run the fused kernel";
    SCOPED_TRACE("after step " + std::to_string(k));
    expect_same_run(*fused, pf, *ref, pr);
  }
}

TEST(FusedAdamW, MatchesAdamWInFp32AndFp64) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    compare(dtype, one_group(AdamWOptions(1e-2)), 8);
  }
}

TEST(FusedAdamW, MatchesAdamWWithAndWithoutWeightDecay) {
  for (const double wd : {0.0, 0.1}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    compare(torch::kFloat, one_group(AdamWOptions(1e-2).weight_decay(wd)), 6);
  }
}

TEST(FusedAdamW, MatchesAdamWWithAmsgrad) {
  compare(torch::kFloat, one_group(AdamWOptions(1e-2).amsgrad(true).betas({0.5, 0.6})), 8);
}

TEST(FusedAdamW, MatchesAdamWOnTwoGroupsWithTheirOwnOptions) {
  compare(
      torch::kFloat,
      [](const Params& ps) {
        std::vector<torch::optim::OptimizerParamGroup> g;
        g.emplace_back(Params{ps[0], ps[2]},
                       std::make_unique<AdamWOptions>(
                           AdamWOptions(3e-2).betas({0.8, 0.99}).weight_decay(0.05)));
        g.emplace_back(Params{ps[1], ps[3]},
                       std::make_unique<AdamWOptions>(
                           AdamWOptions(5e-3).betas({0.95, 0.9}).eps(1e-6).weight_decay(0.0)));
        return g;
      },
      6);
}

TEST(FusedAdamW, MatchesAdamWWhenLrChangesBetweenSteps) {
  compare(torch::kFloat, one_group(AdamWOptions(1e-2)), 6, [](int k, torch::optim::Optimizer& o) {
    for (auto& g : o.param_groups()) g.options().set_lr(k < 3 ? 1e-2 : 1e-2 / (k + 1));
  });
}

TEST(FusedAdamW, MatchesAdamWOnZeroGradients) {
  const Params pf = make_params(torch::kFloat), pr = copies(pf);
  FusedAdamW fused(pf, AdamWOptions(1e-2).weight_decay(0.1));
  AdamW ref(pr, AdamWOptions(1e-2).weight_decay(0.1));
  for (int k = 0; k < 3; ++k) {
    for (const auto& p : pf) p.mutable_grad() = torch::zeros_like(p);
    for (const auto& p : pr) p.mutable_grad() = torch::zeros_like(p);
    fused.step();
    ref.step();
  }
  EXPECT_EQ(fused.last_fused(), pf.size());
  expect_same_run(fused, pf, ref, pr);
  EXPECT_EQ(state_of(fused, pf[0]).exp_avg().abs().max().item<float>(), 0.0f);
}

// bf16: close to torch::optim::AdamW's bf16 run, and no further than it from an fp64 run of the
// same start on the same (bf16-valued) gradients: the fused kernel's fp32 arithmetic is the more
// accurate.
TEST(FusedAdamW, MatchesAdamWInBf16AndIsNoLessAccurate) {
  const Params pf = make_params(torch::kBFloat16), pr = copies(pf);
  Params exact;
  for (const auto& p : pf) exact.push_back(p.detach().to(torch::kDouble).requires_grad_(true));
  const auto o = AdamWOptions(1e-2).weight_decay(0.1);
  FusedAdamW fused(pf, o);
  AdamW ref(pr, o), truth(exact, o);
  for (int k = 0; k < 8; ++k) {
    set_grads(pf, k);
    set_grads(pr, k);
    for (size_t i = 0; i < exact.size(); ++i)
      exact[i].mutable_grad() = pf[i].grad().to(torch::kDouble);
    fused.step();
    ref.step();
    truth.step();
  }
  EXPECT_EQ(fused.last_fused(), pf.size());
  expect_same_run(fused, pf, ref, pr);
  double fused_err = 0, ref_err = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    fused_err += (pf[i].detach().to(torch::kDouble) - exact[i]).abs().sum().item<double>();
    ref_err += (pr[i].detach().to(torch::kDouble) - exact[i]).abs().sum().item<double>();
  }
  EXPECT_LE(fused_err, ref_err) << "fused bf16 error " << fused_err << ", AdamW's " << ref_err;
}

TEST(FusedAdamW, LeavesAParameterWithoutGradientAsAdamWDoes) {
  const Params pf = make_params(torch::kFloat), pr = copies(pf);
  FusedAdamW fused(pf, AdamWOptions(1e-2));
  AdamW ref(pr, AdamWOptions(1e-2));
  const torch::Tensor untouched = pf[1].detach().clone();
  for (int k = 0; k < 3; ++k) {
    set_grads(pf, k);
    set_grads(pr, k);
    pf[1].mutable_grad() = torch::Tensor();
    pr[1].mutable_grad() = torch::Tensor();
    fused.step();
    ref.step();
  }
  EXPECT_EQ(fused.last_fused(), pf.size() - 1);
  EXPECT_TRUE(torch::equal(pf[1], untouched));
  EXPECT_EQ(fused.state().count(pf[1].unsafeGetTensorImpl()), 0u);
  expect_same_run(fused, pf, ref, pr);
}

TEST(FusedAdamW, RunsTheClosureOnceWithAutogradOn) {
  const Params pf = make_params(torch::kFloat), pr = copies(pf);
  FusedAdamW fused(pf, AdamWOptions(1e-2));
  AdamW ref(pr, AdamWOptions(1e-2));
  const auto closure = [](const Params& ps, int& calls) {
    return [&ps, &calls] {
      ++calls;
      torch::Tensor loss = torch::zeros({});
      for (const auto& p : ps) {
        if (p.grad().defined()) p.mutable_grad().zero_();
        loss = loss + (p * p).sum() + p.sin().sum();
      }
      loss.backward();
      return loss;
    };
  };
  int calls_f = 0, calls_r = 0;
  for (int k = 0; k < 4; ++k) {
    torch::NoGradGuard no_grad;  // as a training loop may be: the step turns autograd on
    const auto lf = fused.step(closure(pf, calls_f));
    const auto lr = ref.step(closure(pr, calls_r));
    expect_close(lf, lr, "loss");
  }
  EXPECT_EQ(calls_f, 4);
  EXPECT_EQ(fused.last_fused(), pf.size());
  expect_same_run(fused, pf, ref, pr);
}

std::string saved(const torch::optim::Optimizer& o) {
  torch::serialize::OutputArchive archive;
  o.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load(torch::optim::Optimizer& o, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  o.load(archive);
}

// A FusedAdamW checkpoint is an AdamW checkpoint: each class loads the other's, the state comes
// back exactly, the archives are the same bytes, and the runs go on as one uninterrupted run.
TEST(FusedAdamW, CheckpointsLoadInEitherClassAndContinue) {
  const auto o = AdamWOptions(1e-2).amsgrad(true).weight_decay(0.1);
  const Params p0 = make_params(torch::kFloat), whole = copies(p0);
  FusedAdamW first(p0, o);
  AdamW uninterrupted(whole, o);
  for (int k = 0; k < 3; ++k) {
    set_grads(p0, k);
    first.step();
  }
  // Into torch::optim::AdamW: the same state; over the same tensors, the same archive bytes.
  AdamW mirror(p0, o);
  load(mirror, saved(first));
  EXPECT_EQ(saved(mirror), saved(first));
  const Params p1 = copies(p0);
  AdamW second(p1, o);
  load(second, saved(first));
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_TRUE(state_of(first, p0[i]) == state_of(second, p1[i])) << "parameter " << i;
  }
  for (int k = 3; k < 5; ++k) {
    set_grads(p1, k);
    second.step();
  }
  // And back into FusedAdamW, which goes on through the fused kernel.
  const Params p2 = copies(p1);
  FusedAdamW third(p2, o);
  load(third, saved(second));
  for (int k = 5; k < 8; ++k) {
    set_grads(p2, k);
    third.step();
    EXPECT_EQ(third.last_fused(), p2.size());
  }
  for (int k = 0; k < 8; ++k) {
    set_grads(whole, k);
    uninterrupted.step();
  }
  expect_same_run(third, p2, uninterrupted, whole);
}

// Sparse gradients: AdamW's own error, before any parameter changed.
TEST(FusedAdamW, RefusesSparseGradientsAsAdamWDoes) {
  const Params ps = make_params(torch::kFloat);
  FusedAdamW opt(ps, AdamWOptions(1e-2));
  set_grads(ps, 0);
  ps[3].mutable_grad() = ps[3].grad().to_sparse();
  const Params before = copies(ps);
  fogo::test::expect_error([&] { opt.step(); }, "AdamW does not support sparse gradients");
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(torch::equal(ps[i], before[i])) << i;
}

// A gradient the kernel cannot take (not contiguous) goes through torch::optim::AdamW::step:
// that parameter bit for bit as AdamW's, the others fused.
TEST(FusedAdamW, StepsWhatTheKernelCannotTakeThroughAdamW) {
  const Params pf = make_params(torch::kFloat), pr = copies(pf);
  FusedAdamW fused(pf, AdamWOptions(1e-2));
  AdamW ref(pr, AdamWOptions(1e-2));
  for (int k = 0; k < 3; ++k) {
    set_grads(pf, k);
    set_grads(pr, k);
    for (const Params* ps : {&pf, &pr}) {
      const auto g = (*ps)[1].grad();
      (*ps)[1].mutable_grad() = g.t().contiguous().t();  // the same values, column-major
    }
    fused.step();
    ref.step();
    EXPECT_EQ(fused.last_fused(), pf.size() - 1);
  }
  EXPECT_TRUE(fogo::test::bit_identical({pf[1], state_of(fused, pf[1]).exp_avg()},
                                        {pr[1], state_of(ref, pr[1]).exp_avg()}));
  expect_same_run(fused, pf, ref, pr);
}

TEST(FusedAdamW, IsTheHybridsRestSide) {
  torch::nn::Linear net(4, 3);
  auto opt = fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02), AdamWOptions(1e-3));
  ASSERT_NE(opt.rest<FusedAdamW>(), nullptr);
  EXPECT_NE(opt.rest<AdamW>(), nullptr);  // still an AdamW to code that asks for one
  net(torch::randn({2, 4})).sum().backward();
  opt.step();
  EXPECT_EQ(opt.rest<FusedAdamW>()->last_fused(), 1u);  // the bias
}

TEST(FusedAdamW, MatchesAdamWOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const Params host = make_params(dtype);
    Params pf, pr;
    for (const auto& p : host) {
      pf.push_back(p.detach().cuda().requires_grad_(true));
      pr.push_back(p.detach().cuda().requires_grad_(true));
    }
    FusedAdamW fused(pf, AdamWOptions(1e-2).amsgrad(true).weight_decay(0.1));
    AdamW ref(pr, AdamWOptions(1e-2).amsgrad(true).weight_decay(0.1));
    for (int k = 0; k < 5; ++k) {
      set_grads(pf, k);
      set_grads(pr, k);
      fused.step();
      ref.step();
      EXPECT_EQ(fused.last_fused(), pf.size());
    }
    expect_same_run(fused, pf, ref, pr);
  }
}

}  // namespace
