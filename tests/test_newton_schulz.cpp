// Newton–Schulz against the SVD: NS acts on each singular value independently, through the
// scalar map x -> a x + b x^3 + c x^5, and leaves the singular vectors alone.
#include <fogo/newton_schulz.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

namespace {

// G = U diag(s) V^T with known singular values s in [lo, hi].
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> with_spectrum(
    int64_t m, int64_t n, double lo, double hi, int64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t k = std::min(m, n);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor U = std::get<0>(torch::linalg_qr(at::randn({m, k}, gen, opts)));
  torch::Tensor V = std::get<0>(torch::linalg_qr(at::randn({n, k}, gen, opts)));
  torch::Tensor s = torch::linspace(hi, lo, k, opts);
  return {U.matmul(torch::diag(s)).matmul(V.t()), U, s, V};
}

double scalar_map(double x, const std::array<double, 3>& c, int64_t steps) {
  for (int64_t k = 0; k < steps; ++k) x = c[0] * x + c[1] * x * x * x + c[2] * x * x * x * x * x;
  return x;
}

}  // namespace

TEST(NewtonSchulz, CubicConvergesToPolarFactor) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{12, 20}, {20, 12}, {16, 16}}) {
    auto [G, U, s, V] = with_spectrum(m, n, 0.2, 1.0, 7);
    fogo::NSConfig config;
    config.coefficients = fogo::NSConfig::cubic();
    config.steps = 40;
    config.compute_dtype = torch::kDouble;
    const torch::Tensor O = fogo::newton_schulz(G, config);
    const torch::Tensor polar = U.matmul(V.t());
    EXPECT_LT((O - polar).abs().max().item<double>(), 1e-10) << m << "x" << n;
  }
}

TEST(NewtonSchulz, QuinticActsOnSingularValuesThroughItsScalarMap) {
  const auto coefficients = fogo::NSConfig::quintic();
  for (auto [m, n] : {std::pair<int64_t, int64_t>{16, 48}, {48, 16}, {24, 24}}) {
    auto [G, U, s, V] = with_spectrum(m, n, 0.05, 1.0, 3);
    fogo::NSConfig config;
    config.compute_dtype = torch::kFloat;
    const torch::Tensor O = fogo::newton_schulz(G.to(torch::kFloat), config).to(torch::kDouble);
    // Predicted: U diag(f^5(s / ||G||_F)) V^T.
    const double fro = G.norm().item<double>();
    torch::Tensor predicted_s = torch::empty_like(s);
    for (int64_t i = 0; i < s.size(0); ++i) {
      predicted_s[i] = scalar_map(s[i].item<double>() / fro, coefficients, 5);
    }
    const torch::Tensor predicted = U.matmul(torch::diag(predicted_s)).matmul(V.t());
    EXPECT_LT((O - predicted).abs().max().item<double>(), 2e-4) << m << "x" << n;

    // The band the coefficients give: the image of the normalised input range under f^5. The
    // singular values lie inside it and, unlike the cubic, do not converge to 1.
    const torch::Tensor sv = torch::linalg_svdvals(O);
    double lo = 1e9, hi = -1e9;
    const double x_lo = s.min().item<double>() / fro, x_hi = s.max().item<double>() / fro;
    for (int64_t k = 0; k <= 2000; ++k) {
      const double y = scalar_map(x_lo + (x_hi - x_lo) * k / 2000.0, coefficients, 5);
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
    EXPECT_GE(sv.min().item<double>(), lo - 1e-3);
    EXPECT_LE(sv.max().item<double>(), hi + 1e-3);
    EXPECT_GT((sv - 1.0).abs().max().item<double>(), 0.05);
  }
}

TEST(NewtonSchulz, BatchedEqualsPerMatrix) {
  torch::manual_seed(5);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{8, 20}, {20, 8}}) {
    const torch::Tensor B = torch::randn({5, m, n});
    fogo::NSConfig config;
    config.compute_dtype = torch::kFloat;
    config.normalization = fogo::NSNormalization::AddEps;
    const torch::Tensor batched = fogo::newton_schulz(B, config);
    for (int64_t i = 0; i < 5; ++i) {
      const torch::Tensor single = fogo::newton_schulz(B[i], config);
      EXPECT_LT((batched[i] - single).abs().max().item<double>(), 1e-5) << i;
    }
  }
}

TEST(NewtonSchulz, TallIsTransposeOfWide) {
  torch::manual_seed(6);
  const torch::Tensor G = torch::randn({30, 10});
  fogo::NSConfig config;
  config.compute_dtype = torch::kFloat;
  EXPECT_TRUE(torch::equal(fogo::newton_schulz(G, config), fogo::newton_schulz(G.t(), config).t()));
}

TEST(NewtonSchulz, Bf16ComputeIsCloseToFp32) {
  torch::manual_seed(8);
  const torch::Tensor G = torch::randn({32, 64});
  fogo::NSConfig fp32;
  fp32.compute_dtype = torch::kFloat;
  fogo::NSConfig bf16;  // default: bf16, as torch.optim.Muon
  const torch::Tensor a = fogo::newton_schulz(G, fp32);
  const torch::Tensor b = fogo::newton_schulz(G, bf16);
  EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
  EXPECT_LT((a - b.to(torch::kFloat)).norm().item<double>() / a.norm().item<double>(), 0.05);
}

TEST(NewtonSchulz, DoesNotModifyItsInput) {
  const torch::Tensor G = torch::randn({6, 9});
  const torch::Tensor copy = G.clone();
  fogo::NSConfig config;
  config.compute_dtype = torch::kFloat;
  fogo::newton_schulz(G, config);
  fogo::newton_schulz(G.t(), config);
  EXPECT_TRUE(torch::equal(G, copy));
}

TEST(NewtonSchulz, ZeroMatrixStaysZero) {
  fogo::NSConfig config;
  config.compute_dtype = torch::kFloat;
  const torch::Tensor O = fogo::newton_schulz(torch::zeros({4, 7}), config);
  EXPECT_TRUE(torch::isfinite(O).all().item<bool>());
  EXPECT_EQ(O.abs().max().item<double>(), 0.0);
}

TEST(NewtonSchulz, RejectsBadConfigAndShapes) {
  fogo::NSConfig config;
  config.steps = 100;
  EXPECT_THROW(fogo::newton_schulz(torch::randn({3, 3}), config), c10::Error);
  EXPECT_THROW(fogo::newton_schulz(torch::randn({3})), c10::Error);
  EXPECT_THROW(fogo::newton_schulz(torch::randn({2, 3, 3, 3})), c10::Error);
  EXPECT_THROW(fogo::newton_schulz(torch::ones({3, 3}, torch::kLong)), c10::Error);
}
