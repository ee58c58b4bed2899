#include "fogo/newton_schulz.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fogo {

void validate(const NSConfig& config) {
  TORCH_CHECK(config.steps >= 0 && config.steps < 100,
              "NSConfig.steps (ns_steps) must be in [0, 100), got ", config.steps);
  for (double coefficient : config.coefficients) {
    TORCH_CHECK(std::isfinite(coefficient),
                "NSConfig.coefficients (ns_coefficients) must be "
                "finite, got ",
                coefficient);
  }
  TORCH_CHECK(std::isfinite(config.eps) && config.eps > 0,
              "NSConfig.eps must be finite and > 0, got ", config.eps);
  TORCH_CHECK(config.compute_dtype == at::kFloat || config.compute_dtype == at::kBFloat16 ||
                  config.compute_dtype == at::kDouble || config.compute_dtype == at::kHalf,
              "NSConfig.compute_dtype must be a real floating dtype, got ", config.compute_dtype);
}

at::Tensor newton_schulz(const at::Tensor& B, const NSConfig& config) {
  validate(config);
  TORCH_CHECK(B.dim() == 2 || B.dim() == 3,
              "newton_schulz: input must be [m, n] or [batch, m, n], got shape ", B.sizes());
  TORCH_CHECK(at::isFloatingType(B.scalar_type()),
              "newton_schulz: input must be real floating point, got ", B.scalar_type());
  const auto [a, b, c] = config.coefficients;
  const bool batched = B.dim() == 3;
  const bool tall = B.size(-2) > B.size(-1);

  at::Tensor X = B.to(config.compute_dtype);
  if (tall) X = X.transpose(-2, -1);

  // Frobenius normalisation bounds the spectral norm by 1, inside NS's basin.
  if (batched) {
    at::Tensor norms = at::linalg_vector_norm(X, 2, {-2, -1}, /*keepdim=*/true);
    X = X / (config.normalization == NSNormalization::ClampMin ? norms.clamp_min(config.eps)
                                                               : norms + config.eps);
  } else {
    // In place on a fresh copy, as torch.optim.Muon does (keeps its rounding).
    if (X.is_alias_of(B)) X = X.clone();
    at::Tensor norm = X.norm();
    X.div_(config.normalization == NSNormalization::ClampMin ? norm.clamp_min(config.eps)
                                                             : norm + config.eps);
  }

  for (int64_t k = 0; k < config.steps; ++k) {
    if (batched) {
      at::Tensor A = at::bmm(X, X.transpose(-2, -1));
      at::Tensor poly = c == 0.0 ? A * b : at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
      X = at::baddbmm(X, poly, X, /*beta=*/a, /*alpha=*/1.0);
    } else {
      at::Tensor A = at::mm(X, X.t());
      at::Tensor poly = c == 0.0 ? A * b : at::addmm(A, A, A, /*beta=*/b, /*alpha=*/c);
      X = at::addmm(X, poly, X, /*beta=*/a, /*alpha=*/1.0);
    }
  }
  return tall ? X.transpose(-2, -1) : X;
}

}  // namespace fogo
