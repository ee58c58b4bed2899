// fogo::Muon's `normuon` option (NorMuon, src/fogo_private/muon/normuon.h) and its `spectral`
// learning-rate rule: the equations against a float64 reference written out here, the state in
// checkpoints, bad options, degenerate gradients and the non-finite policies.
#include <fogo/muon.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace {

using fogo::MuonAdjustLR;
using fogo::MuonOptions;

const fogo::MuonParamState& state_of(const fogo::Muon& opt, const torch::Tensor& p) {
  return static_cast<const fogo::MuonParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

double rule_factor(MuonAdjustLR rule, double A, double B) {
  switch (rule) {
    case MuonAdjustLR::Original:
      return std::sqrt(std::max(1.0, A / B));
    case MuonAdjustLR::MatchRmsAdamW:
      return 0.2 * std::sqrt(std::max(A, B));
    case MuonAdjustLR::Spectral:
      return std::sqrt(A / B);
  }
  return NAN;
}

// NorMuon's step of one parameter in float64, each equation written out with sums over the
// matrix view [A, B]. The momentum is torch.optim.Muon's (lerp, tested against it elsewhere)
// and O is fogo's own Newton–Schulz of that input in fp32 (tested against the SVD elsewhere):
// what is checked here is what NorMuon adds, exactly.
struct Reference {
  torch::Tensor p, buf, v;  // float64; v [A]

  torch::Tensor step(const torch::Tensor& g, const MuonOptions& o, bool normuon) {
    const int64_t A = p.size(0), B = p.numel() / A;
    buf.lerp_(g, 1.0 - o.momentum());
    const torch::Tensor U = o.nesterov() ? g.lerp(buf, o.momentum()) : buf;
    const torch::Tensor O =
        fogo::newton_schulz(U.reshape({A, B}).to(torch::kFloat), fogo::ns_config(o))
            .to(torch::kDouble);
    torch::Tensor update = O;
    if (normuon) {
      const torch::Tensor mean_sq = (O * O).sum(1) / static_cast<double>(B);
      v = o.normuon_beta2() * v + (1.0 - o.normuon_beta2()) * mean_sq;
      const torch::Tensor hat = O / (v.sqrt() + o.normuon_eps()).reshape({A, 1});
      const double norm = std::sqrt((O * O).sum().item<double>());
      const double hat_norm = std::sqrt((hat * hat).sum().item<double>());
      update = hat * (norm / (hat_norm + o.normuon_eps()));
    }
    const double lr = o.lr() * rule_factor(o.adjust_lr(), A, B);
    p = p * (1.0 - o.lr() * o.weight_decay()) - lr * update.reshape(p.sizes());
    return update;
  }
};

// Largest |a - b| relative to the largest |b|.
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-300);
  return (a - b).abs().max().item<double>() / scale;
}

}  // namespace

// Five steps of float64 parameters (wide, tall, square, a conv weight as its [4, 12] view) under
// every learning-rate rule: the parameters and the second moments agree with the reference to
// float64 rounding, and the normalized update differs from Muon's (so the check has teeth).
TEST(NorMuon, StepsFollowItsEquationsInFloat64) {
  const std::vector<std::vector<int64_t>> shapes = {{6, 10}, {12, 5}, {7, 7}, {4, 3, 2, 2}};
  for (const auto rule :
       {MuonAdjustLR::Original, MuonAdjustLR::MatchRmsAdamW, MuonAdjustLR::Spectral}) {
    SCOPED_TRACE(static_cast<int>(rule));
    torch::manual_seed(41);
    const auto o = MuonOptions(0.02)
                       .weight_decay(0.1)
                       .momentum(0.9)
                       .ns_dtype(torch::kFloat)
                       .adjust_lr(rule)
                       .normuon(true)
                       .normuon_beta2(0.9);
    std::vector<torch::Tensor> params;
    std::vector<Reference> refs;
    for (const auto& shape : shapes) {
      const auto p0 = torch::randn(shape, torch::kDouble);
      params.push_back(p0.clone().requires_grad_(true));
      refs.push_back({p0.clone(), torch::zeros_like(p0), torch::zeros({shape[0]}, torch::kDouble)});
    }
    fogo::Muon opt(params, o);
    for (int step = 0; step < 5; ++step) {
      for (size_t k = 0; k < params.size(); ++k) {
        // Rows of unequal scale: what NorMuon evens out.
        const auto scale = torch::linspace(0.1, 3.0, shapes[k][0], torch::kDouble);
        std::vector<int64_t> view(shapes[k].size(), 1);
        view[0] = shapes[k][0];
        const auto g = torch::randn(shapes[k], torch::kDouble) * scale.reshape(view);
        params[k].mutable_grad() = g;
        Reference plain = refs[k];
        plain.buf = plain.buf.clone();
        const auto muon_update = plain.step(g, o, false);
        const auto update = refs[k].step(g, o, true);
        EXPECT_GT(rel_diff(update, muon_update), 0.05) << "shape " << k << " step " << step;
      }
      opt.step();
      for (size_t k = 0; k < params.size(); ++k) {
        EXPECT_LT(rel_diff(params[k].detach(), refs[k].p), 1e-13) << "shape " << k;
        const auto& v = state_of(opt, params[k]).second_moment();
        ASSERT_TRUE(v.defined());
        EXPECT_EQ(v.scalar_type(), torch::kDouble);  // fp64 for an fp64 parameter
        EXPECT_LT(rel_diff(v, refs[k].v), 1e-13) << "shape " << k;
      }
    }
  }
}

// An fp32 parameter keeps an fp32 second moment [rows]: the same equations (fp32 arithmetic)
// to fp32 rounding.
TEST(NorMuon, Fp32ParametersFollowTheReferenceToFp32Rounding) {
  torch::manual_seed(42);
  const auto o = MuonOptions(0.02).ns_dtype(torch::kFloat).normuon(true);
  const auto p0 = torch::randn({16, 24});
  auto p = p0.clone().requires_grad_(true);
  Reference ref{p0.to(torch::kDouble), torch::zeros({16, 24}, torch::kDouble),
                torch::zeros({16}, torch::kDouble)};
  fogo::Muon opt({p}, o);
  for (int step = 0; step < 4; ++step) {
    const auto g = torch::randn({16, 24}) * torch::linspace(0.1, 5.0, 16).reshape({16, 1});
    p.mutable_grad() = g;
    opt.step();
    ref.step(g.to(torch::kDouble), o, true);
    EXPECT_LT(rel_diff(p.detach().to(torch::kDouble), ref.p), 1e-6);
  }
  const auto& v = state_of(opt, p).second_moment();
  EXPECT_EQ(v.scalar_type(), torch::kFloat);
  EXPECT_EQ(v.sizes(), torch::IntArrayRef({16}));
  EXPECT_LT(rel_diff(v.to(torch::kDouble), ref.v), 1e-5);
}

// normuon off: no second moment, the plain Muon update (torch.optim.Muon's bits: the parity
// tests in test_muon.cpp run with the default). Switched on after two steps, the second moment
// starts at zeros; switched off again, it keeps its value and the update is Muon's: each step
// against the float64 reference stepped with the same switch.
TEST(NorMuon, OffIsMuonAndSwitchingStartsTheStateAtZeros) {
  torch::manual_seed(43);
  const auto p0 = torch::randn({8, 12}, torch::kDouble);
  auto p = p0.clone().requires_grad_(true);
  auto o = MuonOptions(0.02).ns_dtype(torch::kFloat);
  fogo::Muon opt({p}, o);
  Reference ref{p0.clone(), torch::zeros_like(p0), torch::zeros({8}, torch::kDouble)};
  for (const bool on : {false, false, true, true, false, false}) {
    static_cast<MuonOptions&>(opt.param_groups()[0].options()).normuon(on);
    o.normuon(on);
    const auto g = torch::randn({8, 12}, torch::kDouble) *
                   torch::linspace(0.2, 4.0, 8, torch::kDouble).reshape({8, 1});
    p.mutable_grad() = g;
    opt.step();
    ref.step(g, o, on);
    EXPECT_LT(rel_diff(p.detach(), ref.p), 1e-13) << "normuon " << on;
    const auto& v = state_of(opt, p).second_moment();
    if (!v.defined()) {
      EXPECT_EQ(ref.v.abs().max().item<double>(), 0.0);  // never on so far
      continue;
    }
    EXPECT_LT(rel_diff(v, ref.v), 1e-13);
  }
}

// Save after 3 steps, load into an optimizer built with other options, 3 more: the same bits as
// 6 uninterrupted steps, the second moments included (on the checkpoint's device and dtype). A
// checkpoint with normuon off holds no second moment.
TEST(NorMuon, CheckpointRoundTripContinuesBitIdentically) {
  torch::manual_seed(44);
  const auto a0 = torch::randn({6, 10}), b0 = torch::randn({12, 5}, torch::kDouble);
  std::vector<torch::Tensor> ga, gb;
  for (int k = 0; k < 6; ++k) {
    ga.push_back(torch::randn({6, 10}));
    gb.push_back(torch::randn({12, 5}, torch::kDouble));
  }
  const auto o = MuonOptions(0.03).normuon(true).normuon_beta2(0.8).normuon_eps(1e-9);
  const auto steps = [&](fogo::Muon& opt, torch::Tensor& a, torch::Tensor& b, int from, int to) {
    for (int k = from; k < to; ++k) {
      a.mutable_grad() = ga[k].clone();
      b.mutable_grad() = gb[k].clone();
      opt.step();
    }
  };
  auto a1 = a0.clone().requires_grad_(true), b1 = b0.clone().requires_grad_(true);
  fogo::Muon straight({a1, b1}, o);
  steps(straight, a1, b1, 0, 6);

  auto a2 = a0.clone().requires_grad_(true), b2 = b0.clone().requires_grad_(true);
  std::stringstream checkpoint;
  {
    fogo::Muon first({a2, b2}, o);
    steps(first, a2, b2, 0, 3);
    torch::save(first, checkpoint);
  }
  fogo::Muon resumed({a2, b2}, MuonOptions(0.5));
  torch::load(resumed, checkpoint);
  EXPECT_TRUE(static_cast<const MuonOptions&>(resumed.param_groups()[0].options()) == o);
  EXPECT_EQ(state_of(resumed, b2).second_moment().scalar_type(), torch::kDouble);
  steps(resumed, a2, b2, 3, 6);
  EXPECT_TRUE(torch::equal(a1, a2));
  EXPECT_TRUE(torch::equal(b1, b2));
  for (const auto& [x, y] : {std::pair{a1, a2}, std::pair{b1, b2}}) {
    EXPECT_TRUE(state_of(straight, x) == state_of(resumed, y));
  }

  auto c = a0.clone().requires_grad_(true);
  fogo::Muon off({c}, MuonOptions(0.03));
  c.mutable_grad() = ga[0].clone();
  off.step();
  std::ostringstream out;
  torch::save(off, out);
  torch::serialize::InputArchive archive;
  const std::string bytes = out.str();
  archive.load_from(bytes.data(), bytes.size());
  EXPECT_EQ(bytes.find("second_moment"), std::string::npos);
}

// A checkpoint whose second moment is not [rows] (or not finite) is refused naming it, and the
// optimizer keeps its state.
TEST(NorMuon, CheckpointWithABadSecondMomentIsRefusedAndChangesNothing) {
  torch::manual_seed(45);
  auto p = torch::randn({4, 6}).requires_grad_(true);
  fogo::Muon target({p}, MuonOptions(0.02).normuon(true));
  p.mutable_grad() = torch::randn({4, 6});
  target.step();
  fogo::MuonParamState before;
  before.momentum_buffer(state_of(target, p).momentum_buffer().clone());
  before.second_moment(state_of(target, p).second_moment().clone());
  for (const auto& bad : {torch::zeros({6}), torch::zeros({4, 1}), torch::full({4}, NAN)}) {
    auto q = torch::randn({4, 6}).requires_grad_(true);
    fogo::Muon source({q}, MuonOptions(0.02).normuon(true));
    q.mutable_grad() = torch::randn({4, 6});
    source.step();
    auto st = std::make_unique<fogo::MuonParamState>(state_of(source, q));
    st->second_moment(bad);
    source.state()[q.unsafeGetTensorImpl()] = std::move(st);
    std::stringstream checkpoint;
    torch::save(source, checkpoint);
    fogo::test::expect_error([&] { torch::load(target, checkpoint); }, "second_moment");
    EXPECT_TRUE(state_of(target, p) == before);
  }
}

// Options outside their ranges are refused naming them, at construction and at a step (which
// then changes nothing).
TEST(NorMuon, BadOptionsAreRefusedNamingThem) {
  using fogo::test::expect_error;
  auto p = torch::randn({4, 6}).requires_grad_(true);
  for (const double beta2 : {-0.1, 1.5, double(NAN)}) {
    expect_error([&] { fogo::Muon({p}, MuonOptions().normuon(true).normuon_beta2(beta2)); },
                 "Muon: option 'normuon_beta2'");
  }
  for (const double eps : {0.0, -1e-8, 1e-40, double(INFINITY)}) {
    expect_error([&] { fogo::Muon({p}, MuonOptions().normuon(true).normuon_eps(eps)); },
                 "Muon: option 'normuon_eps'");
  }
  fogo::Muon opt({p}, MuonOptions(0.02).normuon(true));
  static_cast<MuonOptions&>(opt.param_groups()[0].options()).normuon_beta2(2.0);
  const auto p0 = p.detach().clone();
  p.mutable_grad() = torch::randn({4, 6});
  expect_error([&] { opt.step(); }, "normuon_beta2");
  EXPECT_TRUE(torch::equal(p.detach(), p0));
}

// A zero gradient (O = 0, second moment 0) and a gradient with a zero row never make a NaN:
// the parameter only decays, the zero row's second moment stays 0.
TEST(NorMuon, ZeroGradientsAndZeroRowsStayFinite) {
  torch::manual_seed(46);
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    const auto p0 = torch::randn({5, 7}, dtype), q0 = torch::randn({6, 4}, dtype);
    auto p = p0.clone().requires_grad_(true), q = q0.clone().requires_grad_(true);
    fogo::Muon opt({p, q}, MuonOptions(0.02).weight_decay(0.1).normuon(true));
    for (int step = 0; step < 3; ++step) {
      p.mutable_grad() = torch::zeros({5, 7}, dtype);
      auto g = torch::randn({6, 4}, dtype);
      g[2].zero_();
      q.mutable_grad() = g;
      opt.step();
    }
    EXPECT_TRUE(torch::allclose(p.detach(), p0 * std::pow(1.0 - 0.02 * 0.1, 3)));
    EXPECT_TRUE(torch::isfinite(q).all().item<bool>());
    const auto& vp = state_of(opt, p).second_moment();
    EXPECT_EQ(vp.scalar_type(), dtype);
    EXPECT_EQ(vp.abs().max().item<double>(), 0.0);
    const auto& vq = state_of(opt, q).second_moment();
    EXPECT_EQ(vq[2].item<double>(), 0.0);
    EXPECT_GT(vq.sum().item<double>(), 0.0);
    EXPECT_TRUE(torch::isfinite(vq).all().item<bool>());
  }
}

// Mask: a step with a NaN gradient keeps the second moments' bits with the rest; Raise leaves
// them unchanged too.
TEST(NorMuon, MaskAndRaiseKeepTheSecondMoment) {
  torch::manual_seed(47);
  for (const auto policy : {fogo::NonFinitePolicy::Mask, fogo::NonFinitePolicy::Raise}) {
    auto p = torch::randn({6, 8}).requires_grad_(true),
         q = torch::randn({8, 5}).requires_grad_(true);
    fogo::Muon opt({p, q}, MuonOptions(0.02).normuon(true).nonfinite(policy));
    p.mutable_grad() = torch::randn({6, 8});
    q.mutable_grad() = torch::randn({8, 5});
    opt.step();
    const auto vp = state_of(opt, p).second_moment().clone(),
               vq = state_of(opt, q).second_moment().clone();
    p.mutable_grad() = torch::randn({6, 8});
    q.mutable_grad() = torch::randn({8, 5});
    q.mutable_grad()[1][1] = NAN;
    if (policy == fogo::NonFinitePolicy::Raise) {
      EXPECT_THROW(opt.step(), c10::Error);
    } else {
      opt.step();
    }
    EXPECT_TRUE(torch::equal(state_of(opt, p).second_moment(), vp));
    EXPECT_TRUE(torch::equal(state_of(opt, q).second_moment(), vq));
  }
}

// The spectral rule, lr sqrt(A / B) unclamped, through a step in float64 (momentum 0, no
// Nesterov: O = NS(G)): a wide matrix moves by less than `original` moves it, a tall one by the
// same (both sqrt(A / B) there).
TEST(MuonSpectral, StepScalesTheUpdateBySqrtFanOutOverFanIn) {
  torch::manual_seed(48);
  for (const auto& shape : {std::vector<int64_t>{6, 24}, {24, 6}, {4, 3, 3, 3}}) {
    const auto p0 = torch::randn(shape, torch::kDouble), g = torch::randn(shape, torch::kDouble);
    const int64_t A = shape[0], B = p0.numel() / A;
    std::map<MuonAdjustLR, torch::Tensor> moved;
    for (const auto rule : {MuonAdjustLR::Original, MuonAdjustLR::Spectral}) {
      const auto o = MuonOptions(0.02)
                         .weight_decay(0.1)
                         .momentum(0.0)
                         .nesterov(false)
                         .ns_dtype(torch::kFloat)
                         .adjust_lr(rule);
      auto p = p0.clone().requires_grad_(true);
      fogo::Muon opt({p}, o);
      p.mutable_grad() = g.clone();
      opt.step();
      const auto O = fogo::newton_schulz(g.reshape({A, B}).to(torch::kFloat), fogo::ns_config(o))
                         .to(torch::kDouble)
                         .reshape(shape);
      const double factor = rule == MuonAdjustLR::Spectral
                                ? std::sqrt(static_cast<double>(A) / static_cast<double>(B))
                                : std::sqrt(std::max(1.0, static_cast<double>(A) / B));
      const auto want = p0 * (1.0 - 0.02 * 0.1) - 0.02 * factor * O;
      EXPECT_LT(rel_diff(p.detach(), want), 1e-15) << c10::str(shape);
      moved[rule] = p.detach() - p0 * (1.0 - 0.02 * 0.1);
    }
    const double ratio =
        (moved[MuonAdjustLR::Spectral].norm() / moved[MuonAdjustLR::Original].norm())
            .item<double>();
    const double expected = A < B ? std::sqrt(static_cast<double>(A) / B) : 1.0;
    EXPECT_NEAR(ratio, expected, 1e-12) << c10::str(shape);
  }
}
