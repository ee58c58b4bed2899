// FOGO's stages one by one, each against an independent truth: the direct high-dimensional
// solve for the lift, Theorem 4 for the protection, geometry for slerp and the filters, brute
// force and the spec's formulas for the codebook.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fogo_private/fogo/codebook.h"
#include "fogo_private/fogo/momenta.h"
#include "fogo_private/fogo/projected.h"
#include "fogo_private/fogo/projection.h"
#include "fogo_private/fogo/update.h"
#include "test_util.h"

namespace {

torch::Tensor unit(torch::Tensor x) { return x / x.norm(); }
double max_abs(const torch::Tensor& x) { return x.abs().max().item<double>(); }
torch::Tensor row_norms(const torch::Tensor& x) { return torch::linalg_vector_norm(x, 2, {1}); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Projection and lift

TEST(Projection, RademacherIsDeterministicSignsAndShapeDependent) {
  const auto a = fogo::rademacher(3, 40, 16, fogo::ProjectionScale::Unit, torch::kCPU);
  const auto b = fogo::rademacher(3, 40, 16, fogo::ProjectionScale::Unit, torch::kCPU);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(a.abs(), torch::ones_like(a)));
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 0.1);  // fair signs: 640 entries, sd 0.04
  EXPECT_FALSE(
      torch::equal(a, fogo::rademacher(4, 40, 16, fogo::ProjectionScale::Unit, torch::kCPU)));
  EXPECT_FALSE(torch::equal(a.slice(0, 0, 39),
                            fogo::rademacher(3, 39, 16, fogo::ProjectionScale::Unit, torch::kCPU)));
  const auto jl = fogo::rademacher(3, 40, 16, fogo::ProjectionScale::JL, torch::kCPU);
  EXPECT_TRUE(torch::allclose(jl, a / 4.0));
}

TEST(Projection, LiftEqualsDirectHighDimensionalSolve) {
  torch::manual_seed(0);
  for (auto [n, d] : {std::pair<int64_t, int64_t>{50, 12}, {20, 30}, {1, 4}}) {
    for (double lambda : {0.3, 1.0, 4.0}) {
      const auto Pi = fogo::rademacher(7, n, d, fogo::ProjectionScale::Unit, torch::kCPU);
      const auto dz = torch::randn({5, d});
      const auto delta = fogo::proximal_lift(dz, fogo::lift_operator(Pi, lambda));
      // delta_i = (I + 2 lambda Pi Pi^T)^-1 (2 lambda Pi dz_i), solved in R^n in float64.
      const auto P = Pi.to(torch::kDouble);
      const auto A = torch::eye(n, torch::kDouble) + 2 * lambda * P.mm(P.t());
      const auto direct = torch::linalg_solve(A, 2 * lambda * P.mm(dz.to(torch::kDouble).t())).t();
      EXPECT_LT(max_abs(delta.to(torch::kDouble) - direct), 1e-5 * (1 + max_abs(direct)))
          << n << "x" << d << " lambda " << lambda;
      // And it is the minimiser: the gradient delta + 2 lambda Pi (Pi^T delta - dz) vanishes, up
      // to fp32 rounding of delta amplified by the objective's curvature 1 + 2 lambda |Pi|_2^2.
      const auto D = delta.to(torch::kDouble);
      const auto grad = D + 2 * lambda * (D.mm(P) - dz.to(torch::kDouble)).mm(P.t());
      const double curvature =
          1 + 2 * lambda * std::pow(torch::linalg_matrix_norm(P, 2).item<double>(), 2);
      EXPECT_LT(max_abs(grad), 1e-5 * curvature * (1 + max_abs(D)));
    }
  }
}

TEST(Projection, Bf16LiftIsTheDirectSolveAtBf16Precision) {
  // A bf16 step's lift: dz and K = Pi L rounded to bf16 (relative 2^-9 each), products summed in
  // fp32; so each entry of delta is within 2^-8 of the direct solve relative to its scale
  // sum_k |dz_ik| |K_jk|, and no better than bf16 (the rounding is real).
  torch::manual_seed(0);
  for (auto [n, d] : {std::pair<int64_t, int64_t>{300, 32}, {20, 30}}) {
    const auto Pi = fogo::rademacher(7, n, d, fogo::ProjectionScale::Unit, torch::kCPU);
    const auto K = fogo::lift_operator(Pi, 1.0);
    const auto dz = torch::randn({7, d});
    const auto fast = fogo::proximal_lift(dz, K.to(torch::kBFloat16));
    ASSERT_EQ(fast.scalar_type(), torch::kFloat);
    const auto P = Pi.to(torch::kDouble);
    const auto A = torch::eye(n, torch::kDouble) + 2 * 1.0 * P.mm(P.t());
    const auto direct = torch::linalg_solve(A, 2 * P.mm(dz.to(torch::kDouble).t())).t();
    const auto scale = dz.to(torch::kDouble).abs().mm(K.to(torch::kDouble).abs().t());
    const double error = max_abs((fast.to(torch::kDouble) - direct) / scale);
    EXPECT_LT(error, 1.05 / 256) << n << "x" << d;
    EXPECT_GT(error, 1e-6) << "bf16 rounding expected to show";
  }
  EXPECT_THROW(fogo::mm_bf16_f32(torch::ones({2, 2}), torch::ones({2, 2}, torch::kBFloat16)),
               c10::Error);
}

// ---------------------------------------------------------------------------------------------
// Slerp fusion

TEST(Slerp, EndpointsNormAndAngle) {
  torch::manual_seed(1);
  const auto Ps = torch::randn({6, 10}) * 3, Pf = torch::randn({6, 10});
  const double eps = 1e-8;
  const auto ps = Ps / row_norms(Ps).unsqueeze(1), pf = Pf / row_norms(Pf).unsqueeze(1);
  const auto z0 = fogo::slerp_fuse(Ps, Pf, 0.0, eps);
  EXPECT_LT(max_abs(z0 - Ps), 1e-5);  // xi = 0: the slow direction and scale
  const auto z1 = fogo::slerp_fuse(Ps, Pf, 1.0, eps);
  EXPECT_LT(max_abs(z1 - row_norms(Ps).unsqueeze(1) * pf), 1e-5);  // xi = 1: the fast direction
  for (double xi : {0.25, 0.6}) {
    const auto z = fogo::slerp_fuse(Ps, Pf, xi, eps);
    EXPECT_LT(max_abs(row_norms(z) - row_norms(Ps)), 1e-5);  // the slow stream sets the scale
    const auto theta = torch::acos((ps * pf).sum(1));
    const auto angle = torch::acos(((z / row_norms(z).unsqueeze(1)) * ps).sum(1).clamp(-1, 1));
    EXPECT_LT(max_abs(angle - xi * theta), 1e-3) << xi;  // rotated by xi of the angle
  }
}

TEST(Slerp, ZeroAndParallelRowsStayFinite) {
  auto Ps = torch::zeros({3, 4});
  Ps[1] = torch::tensor({1.0, 2.0, 0.0, 0.0});
  Ps[2] = torch::tensor({1.0, 0.0, 0.0, 0.0});
  auto Pf = Ps.clone();
  Pf[0] = torch::tensor({0.0, 1.0, 0.0, 0.0});
  const auto z = fogo::slerp_fuse(Ps, Pf, 0.5, 1e-8);
  EXPECT_TRUE(torch::isfinite(z).all().item<bool>());
  EXPECT_EQ(max_abs(z[0]), 0.0);  // a zero slow row stays zero
  // Parallel streams: nothing to rotate, up to acos's sqrt(fp32 eps) sensitivity near 1
  // (a = 0.99999994 gives theta = 3.5e-4).
  EXPECT_LT(max_abs(z[1] - Ps[1]), 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Short-term filter

namespace {

// Three orthonormal centroids e0, e1, e2 in R^8 and the filter applied with the given gammas.
torch::Tensor filtered(const torch::Tensor& z, double gamma_hi, double gamma_st,
                       fogo::ShortTermComponents* out = nullptr) {
  const auto cbar = torch::eye(8).slice(0, 0, 3);
  const auto q = fogo::normalize_rows(z, 1e-8);
  const auto c = fogo::short_term_components(z, q.mm(cbar.t()), cbar, {0.15, 5.0, 5.0});
  if (out) *out = c;
  return z - gamma_hi * c.z_hi - gamma_st * c.z_conf;
}

torch::Tensor e(int64_t i) { return torch::eye(8)[i]; }

}  // namespace

TEST(ShortTermFilter, ConflictingComponentIsRemoved) {
  const auto z = (2 * e(4) - e(0)).unsqueeze(0);  // <q, e0> = -0.447 < -eps_st
  fogo::ShortTermComponents c;
  const auto zt = filtered(z, 0.0, 1.0, &c);
  EXPECT_LT(max_abs(c.z_conf - (-e(0)).unsqueeze(0)), 1e-6);
  EXPECT_LT(max_abs(zt - 2 * e(4).unsqueeze(0)), 1e-6);  // exactly the e0 part is gone
  EXPECT_TRUE(c.any_conflict[0].item<bool>());
  EXPECT_FALSE(c.any_over[0].item<bool>());
}

TEST(ShortTermFilter, SafeBandIsUntouched) {
  const auto z = (e(4) + 0.1 * e(0) - 0.12 * e(1)).unsqueeze(0);  // |<q, c_j>| <= 0.15
  fogo::ShortTermComponents c;
  EXPECT_TRUE(torch::equal(filtered(z, 0.5, 1.0, &c), z));
  EXPECT_EQ(max_abs(c.z_hi) + max_abs(c.z_conf), 0.0);
}

TEST(ShortTermFilter, OverAlignedIsDeflatedBySoftmaxWeights) {
  const auto z = (e(0) + 0.8 * e(1) + 0.3 * e(4)).unsqueeze(0);  // over-aligned with e0 and e1
  fogo::ShortTermComponents c;
  const auto zt = filtered(z, 0.5, 1.0, &c);
  const auto q = fogo::normalize_rows(z, 1e-8)[0];
  const double s0 = q[0].item<double>(), s1 = q[1].item<double>();
  const double w0 = std::exp(5 * s0) / (std::exp(5 * s0) + std::exp(5 * s1));
  const auto expected_hi = w0 * 1.0 * e(0) + (1 - w0) * 0.8 * e(1);
  EXPECT_LT(max_abs(c.z_hi[0] - expected_hi), 1e-6);
  EXPECT_LT(max_abs(zt[0] - (z[0] - 0.5 * expected_hi)), 1e-6);
  const auto r = fogo::conflict_ratio(z, c, 0.1, 1e-8);
  EXPECT_NEAR(r.item<double>(), 0.1 * expected_hi.norm().item<double>() / z.norm().item<double>(),
              1e-6);
}

// ---------------------------------------------------------------------------------------------
// Long-term protection: Theorem 4

TEST(LongTermProtection, Theorem4HoldsOverRandomDraws) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t d = 16, K = 1 + trial % 12;
    const auto frozen = fogo::normalize_rows(at::randn({K, d}, gen), 0);
    const auto nu = at::rand({K}, gen) * (trial % 3 == 0 ? 5.0 : 1.0);  // sum nu up to ~30
    const auto x = at::randn({4, d}, gen);
    // eps_lt = 0: every frozen centroid is active, Omega = sum nu_k c_k c_k^T for every row.
    const auto out = fogo::long_term_protect(x, frozen, nu, {0.0, 1.0, 1e-8, true});
    const auto Omega = frozen.t().mm(nu.unsqueeze(1) * frozen);
    const auto energy = [&](const torch::Tensor& v) { return (v.mm(Omega) * v).sum(1); };
    EXPECT_TRUE((energy(out.zbar) <= energy(x) + 1e-4).all().item<bool>()) << trial;
    // Null(Omega): a vector orthogonal to every frozen centroid is left exactly as it is.
    const auto Q = std::get<0>(torch::linalg_qr(frozen.t(), "complete"));
    if (K < d) {
      const auto v = Q.slice(1, K, K + 1).t();  // [1, d], orthogonal to span(frozen)
      const auto kept = fogo::long_term_protect(v, frozen, nu, {0.0, 1.0, 1e-8, true}).zbar;
      EXPECT_LT(max_abs(kept - v), 1e-5) << trial;
    }
  }
}

TEST(LongTermProtection, WithoutSpectralScalingManyTasksCanOvershoot) {
  // Two nearly parallel frozen directions with nu = 1 each: lambda_max ~ 2 > 1/gamma_lt, the
  // literal formula over-corrects and the protected energy grows; the default scaling does not.
  const auto c0 = unit(torch::tensor({1.0, 0.0, 0.0})), c1 = unit(torch::tensor({1.0, 0.05, 0.0}));
  const auto frozen = torch::stack({c0, c1});
  const auto nu = torch::ones({2}) * 1.5;
  const auto x = torch::tensor({{1.0, 0.0, 1.0}});
  const auto Omega = frozen.t().mm(nu.unsqueeze(1) * frozen);
  const auto energy = [&](const torch::Tensor& v) {
    return (v.mm(Omega) * v).sum().item<double>();
  };
  const auto literal = fogo::long_term_protect(x, frozen, nu, {0.0, 1.0, 1e-8, false}).zbar;
  const auto scaled = fogo::long_term_protect(x, frozen, nu, {0.0, 1.0, 1e-8, true}).zbar;
  EXPECT_GT(energy(literal), energy(x));
  EXPECT_LE(energy(scaled), energy(x));
}

TEST(LongTermProtection, OnlyActiveCentroidsAct) {
  const auto frozen = torch::eye(4).slice(0, 0, 2);  // e0, e1
  const auto nu = torch::ones({2}) * 0.5;
  const auto x = torch::tensor({{0.05, 1.0, 0.0, 1.0}});  // |<q, e0>| = 0.035 < eps_lt = 0.1
  const auto out = fogo::long_term_protect(x, frozen, nu, {0.1, 1.0, 1e-8, true});
  // Only e1 is active: gamma = 1 * min(1, 1/0.5) = 1, z_lt = 0.5 * 1.0 e1.
  EXPECT_LT(max_abs(out.zbar - torch::tensor({{0.05, 0.5, 0.0, 1.0}})), 1e-6);
  EXPECT_TRUE(out.protected_rows[0].item<bool>());
}

// ---------------------------------------------------------------------------------------------
// Codebook

TEST(Codebook, AssignmentIsArgmaxCosineAndSkipsZeroQueries) {
  torch::manual_seed(3);
  const auto cbar = fogo::normalize_rows(torch::randn({5, 6}), 0);
  auto q = fogo::normalize_rows(torch::randn({40, 6}), 0);
  q[7].zero_();
  const auto valid = row_norms(q) > 0;
  const auto acc = fogo::assign(q, q.mm(cbar.t()), valid);
  auto m = torch::zeros({5});
  auto s = torch::zeros({5, 6});
  for (int64_t i = 0; i < 40; ++i) {
    if (i == 7) continue;
    int64_t best = 0;
    for (int64_t j = 1; j < 5; ++j) {
      if ((q[i] * cbar[j]).sum().item<double>() > (q[i] * cbar[best]).sum().item<double>())
        best = j;
    }
    m[best] += 1;
    s[best] += q[i];
  }
  EXPECT_TRUE(torch::equal(acc.m, m));
  EXPECT_LT(max_abs(acc.s - s), 1e-5);
}

TEST(Codebook, FlushFollowsTheEmaFormulas) {
  torch::manual_seed(4);
  fogo::Codebook book{fogo::normalize_rows(torch::randn({4, 5}), 0), torch::randn({4, 5}),
                      torch::rand({4}) + 0.5};
  const auto S0 = book.S.clone(), N0 = book.N.clone(), c0 = book.centroids.clone();
  fogo::Assignments acc{torch::tensor({2.0, 0.0, 1.0, 3.0}), torch::randn({4, 5})};
  const void* storage[] = {book.centroids.data_ptr(), book.S.data_ptr(), book.N.data_ptr()};
  fogo::ref::codebook_flush(book, acc, {0.9, 0.0, 1e-8, 2});  // lambda_c = 0: no decorrelation
  // In place (a CUDA graph replaying the step reads and writes the same memory every time).
  EXPECT_EQ(book.centroids.data_ptr(), storage[0]);
  EXPECT_EQ(book.S.data_ptr(), storage[1]);
  EXPECT_EQ(book.N.data_ptr(), storage[2]);
  const auto S = 0.9 * S0 + 0.1 * acc.s, N = 0.9 * N0 + 0.1 * acc.m;
  EXPECT_LT(max_abs(book.S - S), 1e-6);
  EXPECT_LT(max_abs(book.N - N), 1e-6);
  EXPECT_LT(max_abs(book.centroids - fogo::normalize_rows(S / N.unsqueeze(1), 0)), 1e-5);

  // A centroid with N numerically zero keeps its previous direction.
  fogo::Codebook idle{c0.clone(), torch::zeros({4, 5}), torch::zeros({4})};
  fogo::ref::codebook_flush(idle, {torch::zeros({4}), torch::zeros({4, 5})}, {0.9, 0.1, 1e-8, 2});
  EXPECT_TRUE(torch::equal(idle.centroids, c0));
}

TEST(Codebook, DecorrelationLowersMaxPairwiseCosine) {
  // Three nearly identical directions and one apart: flushing with lambda_c > 0 pushes the near
  // duplicates apart.
  const auto base = unit(torch::tensor({1.0, 0.0, 0.0, 0.0}));
  auto c = torch::stack({base, unit(base + 0.1 * torch::tensor({0.0, 1.0, 0.0, 0.0})),
                         unit(base + 0.1 * torch::tensor({0.0, 0.0, 1.0, 0.0})),
                         torch::tensor({0.0, 0.0, 0.0, 1.0})});
  auto max_cos = [](const torch::Tensor& x) {
    return (x.mm(x.t()).abs() - torch::eye(x.size(0))).max().item<double>();
  };
  fogo::Codebook with{c.clone(), c.clone(), torch::ones({4})};
  fogo::Codebook without{c.clone(), c.clone(), torch::ones({4})};
  const fogo::Assignments none{torch::zeros({4}), torch::zeros({4, 4})};
  fogo::ref::codebook_flush(without, none, {0.9, 0.0, 1e-8, 2});
  fogo::ref::codebook_flush(with, none, {0.9, 0.3, 1e-8, 2});
  EXPECT_LT(max_cos(with.centroids), max_cos(without.centroids) - 0.01);
  EXPECT_LT(max_abs(row_norms(with.centroids) - 1), 1e-5);
}

TEST(Codebook, ReseedReplacesIdleCentroidsWithDistinctQueries) {
  torch::manual_seed(5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  fogo::Codebook book{fogo::normalize_rows(torch::randn({6, 4}), 0), torch::randn({6, 4}),
                      torch::tensor({0.5, 0.01, 0.2, 0.0, 0.02, 0.9})};
  const auto before = book.centroids.clone();
  const auto q = fogo::normalize_rows(torch::randn({10, 4}), 0);
  fogo::reseed(book, q, torch::ones({10}, torch::kBool), 0.03, gen);
  for (int64_t j : {0, 2, 5}) EXPECT_TRUE(torch::equal(book.centroids[j], before[j]));
  std::set<int64_t> used;
  for (int64_t j : {1, 3, 4}) {
    EXPECT_NEAR(book.N[j].item<double>(), 0.03, 1e-7);
    EXPECT_LT(max_abs(book.S[j] - 0.03 * book.centroids[j]), 1e-7);
    int64_t match = -1;
    for (int64_t i = 0; i < 10; ++i) {
      if (torch::equal(book.centroids[j], q[i])) match = i;
    }
    ASSERT_GE(match, 0) << "centroid " << j << " is not one of the queries";
    used.insert(match);
  }
  EXPECT_EQ(used.size(), 3u);  // distinct queries
}

TEST(Codebook, InitDrawsDistinctQueriesAndFillsShortfall) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const auto q = fogo::normalize_rows(torch::randn({3, 5}), 0);
  const auto book = fogo::init_codebook(q, torch::ones({3}, torch::kBool), 6, gen);
  EXPECT_EQ(book.centroids.sizes(), torch::IntArrayRef({6, 5}));
  EXPECT_LT(max_abs(row_norms(book.centroids) - 1), 1e-5);
  int64_t from_queries = 0;
  for (int64_t j = 0; j < 6; ++j) {
    for (int64_t i = 0; i < 3; ++i) from_queries += torch::equal(book.centroids[j], q[i]);
  }
  EXPECT_EQ(from_queries, 3);
  EXPECT_EQ(book.N.sum().item<double>(), 0.0);
}

TEST(Codebook, ConsolidationPicksByImportance) {
  // Orthogonal centroids: uniqueness 1, no drift: the score is the usage share.
  fogo::Codebook book{torch::eye(5), torch::eye(5), torch::tensor({1.0, 4.0, 0.0, 3.0, 2.0})};
  auto picks = fogo::select_important(book, book.centroids, 3);
  EXPECT_TRUE(
      torch::equal(picks.centroids, torch::eye(5).index_select(0, torch::tensor({1, 3, 4}))));
  EXPECT_LT(max_abs(picks.nu - torch::tensor({4.0, 3.0, 2.0}) / 9.0), 1e-6);

  // Drift counts: centroid 4 moved away from its task-start direction.
  auto start = torch::eye(5);
  start[4] = unit(torch::tensor({1.0, 0.0, 0.0, 0.0, 1.0}));
  picks = fogo::select_important(book, start, 1);
  // scores: 1: 0.4 ; 4: 0.2 * (1 + 1 - 0.707) = 0.259; 3: 0.3 -> centroid 1 first
  EXPECT_TRUE(torch::equal(picks.centroids[0], torch::eye(5)[1]));
  fogo::Codebook drifted{torch::eye(5), torch::eye(5), torch::tensor({1.0, 2.0, 0.0, 1.5, 2.0})};
  picks = fogo::select_important(drifted, start, 1);  // 4: 0.308 * 1.29 beats 1: 0.308
  EXPECT_TRUE(torch::equal(picks.centroids[0], torch::eye(5)[4]));
}

TEST(Momenta, BothStreamsAndTheirNewtonSchulzInputsInOnePass) {
  // B = mu B + G (fp32, each operation rounded), X = B's working view in the NS dtype (the
  // transpose of a tall parameter's 2-D view); with ok false every momentum bit stays.
  torch::manual_seed(15);
  for (const auto x_dtype : {torch::kBFloat16, torch::kFloat, torch::kDouble}) {
    const auto Bs = torch::randn({6, 2, 2}), Bf = torch::randn({6, 2, 2}),
               G = torch::randn({6, 2, 2});
    Bf[0][0][0] = -0.0f;  // a masked step keeps its sign
    fogo::MomentaItem tall{
        Bs.clone(), Bf.clone(), G, torch::empty({4, 6}, x_dtype), torch::empty({4, 6}, x_dtype),
        true};
    const auto W = torch::randn({3, 5}), H = torch::randn({3, 5});
    fogo::MomentaItem wide{
        W.clone(), H.clone(), torch::randn({3, 5}), torch::empty({3, 5}, x_dtype),
        {},        false};  // no fast input: a parameter another rank orthogonalizes
    fogo::ref::momenta_step({tall, wide}, 0.9, 0.3, {});
    const float mu_s = 0.9f, mu_f = 0.3f;  // the scalars as fp32 arithmetic sees them
    EXPECT_TRUE(torch::equal(tall.Bs, Bs * mu_s + G));
    EXPECT_TRUE(torch::equal(tall.Bf, Bf * mu_f + G));
    EXPECT_TRUE(torch::equal(tall.Xs, tall.Bs.reshape({6, 4}).t().to(x_dtype)));
    EXPECT_TRUE(torch::equal(tall.Xf, tall.Bf.reshape({6, 4}).t().to(x_dtype)));
    EXPECT_TRUE(torch::equal(wide.Bs, W * mu_s + wide.G));
    EXPECT_TRUE(torch::equal(wide.Xs, wide.Bs.to(x_dtype)));
    EXPECT_TRUE(torch::equal(wide.Bf, H * mu_f + wide.G));

    // Mask: ok false keeps B's bits whatever G holds; ok true is the plain step.
    fogo::MomentaItem masked{Bs.clone(),
                             Bf.clone(),
                             torch::full({6, 2, 2}, NAN),
                             torch::empty({4, 6}, x_dtype),
                             torch::empty({4, 6}, x_dtype),
                             true};
    fogo::ref::momenta_step({masked}, 0.9, 0.3, torch::tensor(false));
    EXPECT_TRUE(torch::equal(masked.Bs, Bs));
    EXPECT_TRUE(std::signbit(masked.Bf[0][0][0].item<float>()));
    EXPECT_TRUE(torch::equal(masked.Bf, Bf));
    EXPECT_TRUE(torch::equal(masked.Xs, Bs.reshape({6, 4}).t().to(x_dtype)));
    fogo::MomentaItem taken{
        Bs.clone(), Bf.clone(), G, torch::empty({4, 6}, x_dtype), torch::empty({4, 6}, x_dtype),
        true};
    fogo::ref::momenta_step({taken}, 0.9, 0.3, torch::tensor(true));
    EXPECT_TRUE(torch::equal(taken.Bs, tall.Bs));
    EXPECT_TRUE(torch::equal(taken.Xf, tall.Xf));
  }
}

// Issue 33: an empty parameter ({0, 8}, with its Newton–Schulz inputs) among others is skipped,
// as the CUDA kernel skips it (the reference divided 0 by its 0 rows: SIGFPE), and the others get
// what they get alone.
TEST(Momenta, EmptyItemsAreSkippedAndTheOthersStepAsAlone) {
  torch::manual_seed(16);
  const auto item = [](std::vector<int64_t> shape, std::vector<int64_t> x_shape, bool transposed) {
    return fogo::MomentaItem{torch::randn(shape),
                             torch::randn(shape),
                             torch::randn(shape),
                             torch::full(x_shape, 7.0, torch::kBFloat16),
                             torch::full(x_shape, 7.0, torch::kBFloat16),
                             transposed};
  };
  const auto copy = [](const fogo::MomentaItem& m) {
    return fogo::MomentaItem{m.Bs.clone(), m.Bf.clone(), m.G,
                             m.Xs.clone(), m.Xf.clone(), m.transposed};
  };
  const fogo::MomentaItem wide = item({3, 5}, {3, 5}, false), tall = item({6, 2}, {2, 6}, true);
  for (const auto& ok : {torch::Tensor(), torch::tensor(true)}) {
    std::vector<fogo::MomentaItem> got = {copy(wide), item({0, 8}, {0, 8}, false), copy(tall),
                                          item({0, 8}, {8, 0}, true)};
    const std::vector<fogo::MomentaItem> alone = {copy(wide), copy(tall)};
    ASSERT_NO_THROW(fogo::ref::momenta_step(got, 0.9, 0.3, ok));
    for (const auto& m : alone) fogo::ref::momenta_step({m}, 0.9, 0.3, ok);
    for (const auto& [k, a] : {std::pair{0, 0}, {2, 1}}) {
      EXPECT_TRUE(torch::equal(got[k].Bs, alone[a].Bs)) << k;
      EXPECT_TRUE(torch::equal(got[k].Bf, alone[a].Bf)) << k;
      EXPECT_TRUE(torch::equal(got[k].Xs, alone[a].Xs)) << k;
      EXPECT_TRUE(torch::equal(got[k].Xf, alone[a].Xf)) << k;
    }
    for (const int k : {1, 3}) {
      EXPECT_EQ(got[k].Bs.numel(), 0);
      EXPECT_EQ(got[k].Xs.numel(), 0);
    }
    // Only empty items: nothing to do.
    EXPECT_NO_THROW(fogo::ref::momenta_step({item({0, 8}, {0, 8}, false)}, 0.9, 0.3, ok));
  }
}

TEST(Update, LearningRateOnTheDeviceGivesTheBitsOfOneOnTheHost) {
  // A CUDA graph reads the learning rate from a device tensor; the arithmetic must not change.
  torch::manual_seed(14);
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const bool transposed : {false, true}) {
      for (const double lr : {0.02, 3e-4, 1.0 / 3.0}) {
        const auto base = torch::randn({12, 20}).to(dtype);
        const auto Os =
            torch::randn(transposed ? std::vector<int64_t>{20, 12} : std::vector<int64_t>{12, 20});
        const auto delta = 0.1 * torch::randn(Os.sizes());
        const fogo::UpdateParams host{lr, 0.1, 0.2, 1e-8};
        fogo::UpdateParams device = host;
        device.lr = fogo::LearningRate(123.0 /* ignored */, at::kDouble,
                                       torch::full({}, lr, torch::kDouble));
        auto a = base.clone(), b = base.clone();
        const auto ra = fogo::ref::apply_rms_update({{a, Os, delta, transposed}}, host);
        const auto rb = fogo::ref::apply_rms_update({{b, Os, delta, transposed}}, device);
        EXPECT_TRUE(torch::equal(a, b)) << dtype << " lr " << lr;
        EXPECT_TRUE(torch::equal(ra[0], rb[0]));
        EXPECT_FALSE(torch::equal(a, base));
      }
    }
  }
  auto p = torch::randn({4, 6});
  const auto Os = torch::randn({4, 6}), delta = torch::zeros({4, 6});
  fogo::UpdateParams bad{0.1, 0.0, 0.2, 1e-8};
  for (const auto& lr : {torch::full({}, 0.1), torch::full({1}, 0.1, torch::kDouble)}) {
    bad.lr = fogo::LearningRate(0.1, at::kDouble, lr);
    fogo::test::expect_error(
        [&] {
          fogo::ref::apply_rms_update({{p, Os, delta, false}}, bad);
        },
        "device_lr must be a 0-d float64 tensor");
  }
}

TEST(Update, AGroupIsEachParametersOwnUpdateAndMaskKeepsEveryBit) {
  // The reference's contract, which the CUDA multi-tensor launches follow: every parameter of the
  // list gets its own gamma_t (the list changes no result), and a masked step changes no bit.
  torch::manual_seed(17);
  const fogo::UpdateParams p{0.05, 0.1, 0.2, 1e-8};
  const std::vector<torch::Tensor> bases = {torch::randn({6, 10}), torch::randn({10, 6}),
                                            torch::randn({4, 2, 3, 3}).to(torch::kBFloat16)};
  const auto items = [&] {
    std::vector<fogo::RmsUpdateItem> out;
    for (const auto& b : bases) {
      const int64_t rows = b.size(0), cols = b.numel() / rows;
      const bool transposed = rows > cols;
      const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
      out.push_back({b.clone(), torch::randn({m, n}), 0.1 * torch::randn({m, n}), transposed});
    }
    return out;
  };
  torch::manual_seed(18);
  const auto together = items();
  const auto ratios = fogo::ref::apply_rms_update(together, p);
  torch::manual_seed(18);
  const auto taken = items();
  fogo::ref::apply_rms_update(taken, p, torch::full({}, true));
  torch::manual_seed(18);
  const auto masked = items();
  fogo::ref::apply_rms_update(masked, p, torch::full({}, false));
  for (size_t k = 0; k < bases.size(); ++k) {
    auto alone = together[k];
    alone.param = bases[k].clone();
    const auto ratio = fogo::ref::apply_rms_update({alone}, p);
    // gamma_t from this parameter's own O_s and delta: |Ohat_k|_F scales the step.
    const auto Ohat = together[k].Os + together[k].delta;
    const double step = p.lr.value * p.sigma * std::sqrt(static_cast<double>(Ohat.numel())) /
                        (Ohat.norm().item<double>() + p.eps);
    const auto expected =
        bases[k].to(torch::kDouble) * (1 - p.lr.value * p.weight_decay) -
        step *
            (together[k].transposed ? Ohat.t() : Ohat).reshape(bases[k].sizes()).to(torch::kDouble);
    const double tol = bases[k].scalar_type() == torch::kBFloat16 ? 1e-2 : 1e-5;
    EXPECT_TRUE(torch::allclose(together[k].param.to(torch::kDouble), expected, tol, tol))
        << "parameter " << k;
    EXPECT_TRUE(torch::equal(together[k].param, alone.param)) << "parameter " << k;
    EXPECT_TRUE(torch::equal(ratios[k], ratio[0])) << "parameter " << k;
    EXPECT_TRUE(torch::equal(taken[k].param, together[k].param)) << "parameter " << k;
    EXPECT_TRUE(torch::equal(masked[k].param, bases[k])) << "parameter " << k;
  }
}

TEST(Codebook, CandidateSamplingIsWeightedWithoutReplacementAndReproducible) {
  // Against the exact inclusion probabilities of a weighted draw of 2 out of 3 without
  // replacement (computed by hand from the sequential definition), over many draws.
  const auto nu = torch::tensor({0.6, 0.3, 0.1});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto draw = [](const torch::Tensor& w, int64_t k, at::Generator& g) {
    return fogo::sample_candidates(w, k, fogo::candidate_keys(w.size(0), g, w.device()));
  };
  std::vector<double> count(3, 0.0);
  const int draws = 20000;
  for (int k = 0; k < draws; ++k) {
    const auto pick = draw(nu, 2, gen);
    ASSERT_EQ(pick.size(0), 2);
    ASSERT_NE(pick[0].item<int64_t>(), pick[1].item<int64_t>());
    for (int j = 0; j < 2; ++j) count[pick[j].item<int64_t>()] += 1.0 / draws;
  }
  // P(i in sample) = w_i + sum_{j != i} w_j w_i / (1 - w_j).
  const double w[3] = {0.6, 0.3, 0.1};
  for (int i = 0; i < 3; ++i) {
    double p = w[i];
    for (int j = 0; j < 3; ++j)
      if (j != i) p += w[j] * w[i] / (1 - w[j]);
    EXPECT_NEAR(count[i], p, 0.015) << i;  // binomial sd <= 0.0035 at 20,000 draws
  }
  // The same generator state gives the same picks; a zero weight is drawn only when it must be.
  auto a = at::make_generator<at::CPUGeneratorImpl>(9),
       b = at::make_generator<at::CPUGeneratorImpl>(9);
  EXPECT_TRUE(torch::equal(draw(nu, 2, a), draw(nu, 2, b)));
  const auto zero = torch::tensor({0.5, 0.0, 0.5});
  for (int k = 0; k < 50; ++k) {
    const auto pick = std::get<0>(draw(zero, 2, a).sort());
    EXPECT_TRUE(torch::equal(pick, torch::tensor({0, 2}, torch::kLong)));
    EXPECT_EQ(draw(zero, 3, a).size(0), 3);
  }
  EXPECT_THROW(draw(nu, 4, a), c10::Error);
  // Keys of another length or type are refused, naming them.
  fogo::test::expect_error(
      [&] { fogo::sample_candidates(nu, 2, torch::zeros({2}, torch::kDouble)); },
      "log_u must be [3] float64");
  fogo::test::expect_error([&] { fogo::sample_candidates(nu, 2, torch::zeros({3})); },
                           "log_u must be [3] float64");
}

// ---------------------------------------------------------------------------------------------
// Steps 4-7 against a float64 reference written from docs/algorithm.md row by row, on groups where
// rows are zero queries (|z_i| = 0): they take no part in the memory read, in r_t's mean or in
// the telemetry fractions (Clarifications). The fp32 paths must agree with it to fp32 precision;
// before the fix both paths divided by every row and agreed with each other, so only an
// independent reference could see it.

namespace {

struct Reference {
  torch::Tensor dz, m, s;
  double rbar, gamma_st, conflicting, over, protected_rows;
};

// Straight from docs/algorithm.md steps 4-7, in float64, one row at a time.
Reference reference_step(const torch::Tensor& Ps32, const torch::Tensor& Pf32,
                         const torch::Tensor& cbar32, const torch::Tensor& frozen32,
                         const torch::Tensor& nu32, double rbar,
                         const fogo::ProjectedStepParams& p) {
  const auto D = torch::kDouble;
  const auto Ps = Ps32.to(D), Pf = Pf32.to(D), cbar = cbar32.to(D);
  const int64_t R = Ps.size(0), C = cbar.size(0), d = Ps.size(1);
  const double eps = p.eps;
  std::vector<torch::Tensor> zs, zhis, zconfs;
  std::vector<bool> valid, conflicting, over;
  Reference out;
  out.m = torch::zeros({C}, D);
  out.s = torch::zeros({C, d}, D);
  double r_sum = 0;
  int64_t n_valid = 0, n_conflicting = 0, n_over = 0;
  for (int64_t i = 0; i < R; ++i) {
    const auto ps_row = Ps[i], pf_row = Pf[i];
    const double ns = ps_row.norm().item<double>();
    const auto ps = ps_row / (ns + eps), pf = pf_row / (pf_row.norm().item<double>() + eps);
    const double a = (pf * ps).sum().item<double>();
    const double theta = std::acos(std::clamp(a, -1 + eps, 1 - eps));
    const auto perp = pf - a * ps;
    const auto v = perp / (perp.norm().item<double>() + eps);
    const auto z = ns * (std::cos(p.xi * theta) * ps + std::sin(p.xi * theta) * v);
    const double nz = z.norm().item<double>();
    zs.push_back(z);
    const bool ok = nz > 0;
    valid.push_back(ok);
    auto zhi = torch::zeros({d}, D), zconf = torch::zeros({d}, D);
    bool any_c = false, any_o = false;
    if (ok) {
      const auto q = z / (nz + eps);
      const auto sim = cbar.mv(q);
      const int64_t a_i = sim.argmax().item<int64_t>();
      out.m[a_i] += 1;
      out.s[a_i] += q;
      // H_i, C_i and their softmax weights.
      double max_o = -INFINITY, max_c = -INFINITY;
      for (int64_t j = 0; j < C; ++j) {
        const double sj = sim[j].item<double>();
        if (sj > p.short_term.eps_st) max_o = std::max(max_o, p.short_term.tau_plus * sj);
        if (sj < -p.short_term.eps_st) max_c = std::max(max_c, p.short_term.tau_minus * -sj);
      }
      double sum_o = 0, sum_c = 0;
      for (int64_t j = 0; j < C; ++j) {
        const double sj = sim[j].item<double>();
        if (sj > p.short_term.eps_st) sum_o += std::exp(p.short_term.tau_plus * sj - max_o);
        if (sj < -p.short_term.eps_st) sum_c += std::exp(p.short_term.tau_minus * -sj - max_c);
      }
      for (int64_t j = 0; j < C; ++j) {
        const double sj = sim[j].item<double>(), zc = (z * cbar[j]).sum().item<double>();
        if (sj > p.short_term.eps_st) {
          zhi += std::exp(p.short_term.tau_plus * sj - max_o) / sum_o * zc * cbar[j];
          any_o = true;
        }
        if (sj < -p.short_term.eps_st) {
          zconf += std::exp(p.short_term.tau_minus * -sj - max_c) / sum_c * zc * cbar[j];
          any_c = true;
        }
      }
      r_sum += (zconf.norm().item<double>() + p.lambda_hi * zhi.norm().item<double>()) / (nz + eps);
      ++n_valid;
      n_conflicting += any_c;
      n_over += any_o;
    }
    zhis.push_back(zhi);
    zconfs.push_back(zconf);
  }
  // r_t: the mean over the non-zero queries, 0 when there are none.
  const double r_t = n_valid > 0 ? r_sum / static_cast<double>(n_valid) : 0.0;
  out.rbar = p.beta_r * rbar + (1 - p.beta_r) * r_t;
  out.gamma_st =
      p.gamma_st_min + (p.gamma_st_max - p.gamma_st_min) * out.rbar / (out.rbar + p.kappa);
  const double rows = std::max<int64_t>(n_valid, 1);
  out.conflicting = n_conflicting / rows;
  out.over = n_over / rows;
  out.dz = torch::zeros({R, d}, D);
  int64_t n_protected = 0;
  for (int64_t i = 0; i < R; ++i) {
    auto zt = zs[i] - p.gamma_hi * zhis[i] - out.gamma_st * zconfs[i];
    if (frozen32.defined() && frozen32.size(0) > 0) {
      const auto F = frozen32.to(D), nu = nu32.to(D);
      const auto qt = zt / (zt.norm().item<double>() + eps);
      auto z_lt = torch::zeros({d}, D);
      double trace = 0;
      for (int64_t k = 0; k < F.size(0); ++k) {
        if (std::abs((qt * F[k]).sum().item<double>()) > p.long_term.eps_lt) {
          z_lt += nu[k].item<double>() * (zt * F[k]).sum().item<double>() * F[k];
          trace += nu[k].item<double>();
        }
      }
      n_protected += trace > 0;
      const double gamma = p.long_term.spectral_scaling && trace > 0
                               ? p.long_term.gamma_lt * std::min(1.0, 1.0 / trace)
                               : p.long_term.gamma_lt;
      zt = zt - gamma * z_lt;
    }
    out.dz[i] = zt - Ps[i];
  }
  out.protected_rows = n_protected / rows;
  return out;
}

fogo::ProjectedStepParams zero_query_params() {
  fogo::ProjectedStepParams p{};
  p.xi = 0.6;
  p.eps = 1e-8;
  p.short_term = {0.15, 5.0, 5.0};
  p.lambda_hi = 0.1;
  p.gamma_hi = 0.3;
  p.gamma_st_min = 0.2;
  p.gamma_st_max = 0.9;
  p.beta_r = 0.5;
  p.kappa = 0.3;
  p.long_term = {0.1, 1.0, 1e-8, true};
  p.filter = true;
  return p;
}

}  // namespace

TEST(ProjectedStep, ZeroQueriesTakeNoPartAgainstAFloat64Reference) {
  torch::manual_seed(23);
  const int64_t d = 16, C = 6, K = 3;
  // Codebook and frozen centroids: unit rows, some of them along the data's directions so that
  // the sets and the protection are not empty.
  const auto cbar = fogo::normalize_rows(torch::randn({C, d}), 1e-8);
  const auto frozen = fogo::normalize_rows(torch::randn({K, d}), 1e-8);
  const auto nu = torch::tensor({0.5f, 0.3f, 0.2f});
  struct Case {
    const char* what;
    int64_t rows;
    std::vector<int64_t> zero_rows;
  };
  // The row patterns of the situations the clarification is about.
  const std::vector<Case> cases = {
      {"dead units (some zero rows)", 12, {1, 5, 6, 11}},
      // four experts of 4 rows sharing a codebook, three of them idle this step
      {"idle experts", 16, {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15}},
      // a tall weight's zero columns are zero rows of the working (wide) orientation
      {"zero columns of a tall weight", 10, {0, 9}},
      // after a task boundary the momenta restart at zero: rows without gradient stay zero
      {"rows zero after a task boundary", 8, {2, 3, 4, 5, 6, 7}},
      {"no zero row", 9, {}},
      {"every row zero", 5, {0, 1, 2, 3, 4}},
  };
  const auto p = zero_query_params();
  for (const auto& c : cases) {
    for (const bool protect : {false, true}) {
      auto Ps = torch::randn({c.rows, d}), Pf = Ps + 0.7 * torch::randn({c.rows, d});
      // Half of the rows lean on a centroid (over-aligned) or against one (conflicting).
      for (int64_t i = 0; i < c.rows; i += 2) {
        Ps[i] += (i % 4 == 0 ? 2.5 : -2.5) * cbar[i % C];
        Pf[i] += (i % 4 == 0 ? 2.5 : -2.5) * cbar[i % C];
      }
      for (const int64_t i : c.zero_rows) {
        Ps[i].zero_();
        Pf[i].zero_();
      }
      const auto rbar = torch::full({}, 0.25f);
      const auto F = protect ? frozen : torch::Tensor(), N = protect ? nu : torch::Tensor();
      const auto got = fogo::ref::projected_step(Ps, Pf, cbar, F, N, rbar, p);
      const auto want = reference_step(Ps, Pf, cbar, F, N, 0.25, p);
      const std::string what = std::string(c.what) + (protect ? ", with protection" : "");
      EXPECT_NEAR(got.rbar.item<double>(), want.rbar, 1e-6) << what;
      EXPECT_NEAR(got.stats[0].item<double>(), want.gamma_st, 1e-6) << what;
      EXPECT_NEAR(got.stats[1].item<double>(), want.conflicting, 1e-6) << what;
      EXPECT_NEAR(got.stats[2].item<double>(), want.over, 1e-6) << what;
      if (protect) EXPECT_NEAR(got.stats[3].item<double>(), want.protected_rows, 1e-6) << what;
      const double scale = 1 + max_abs(want.dz);
      EXPECT_LT(max_abs(got.dz.to(torch::kDouble) - want.dz), 2e-5 * scale) << what;
      EXPECT_TRUE(torch::equal(got.m.to(torch::kDouble), want.m)) << what;
      EXPECT_LT(max_abs(got.s.to(torch::kDouble) - want.s), 1e-5) << what;
    }
  }
  // The reference itself: with every row zero nothing is read and r_t is 0, so rbar decays.
  const auto zeros = torch::zeros({3, d});
  const auto none = reference_step(zeros, zeros, cbar, {}, {}, 0.25, p);
  EXPECT_DOUBLE_EQ(none.rbar, 0.5 * 0.25);
}
