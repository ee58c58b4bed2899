#include "fogo/newton_schulz.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace fogo {

NSConfig ns_config(const std::tuple<double, double, double>& coefficients, int64_t steps,
                   double eps, NSNormalization normalization, c10::ScalarType compute_dtype,
                   NSForm form, int64_t gram_restart) {
  NSConfig ns;
  ns.coefficients = {std::get<0>(coefficients), std::get<1>(coefficients),
                     std::get<2>(coefficients)};
  ns.steps = steps;
  ns.eps = eps;
  ns.normalization = normalization;
  ns.compute_dtype = compute_dtype;
  ns.form = form;
  ns.gram_restart = gram_restart;
  return ns;
}

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
  TORCH_CHECK(
      config.form == NSForm::Plain || config.form == NSForm::Gram || config.form == NSForm::Auto,
      "NSConfig.form (ns_form) is not a known value");
  TORCH_CHECK(config.gram_restart >= 0,
              "NSConfig.gram_restart (ns_gram_restart) must be >= 0, got ", config.gram_restart);
}

namespace {

// a I + P, with `a` added to P's diagonal.
at::Tensor plus_identity(const at::Tensor& P, double a) {
  at::Tensor F = P.clone();
  F.diagonal(0, -2, -1).add_(a);
  return F;
}

// The Gram form on a normalised wide batch X [batch, m, n] (newton_schulz.h): returns NS(X), or
// with Pi [n, d] defined NS(X) Pi, as Q (X Pi) with X the iterate of the last restart.
at::Tensor gram_chain(at::Tensor X, const NSConfig& config, const at::Tensor& Pi = {}) {
  const auto [a, b, c] = config.coefficients;
  at::Tensor Q;  // Q_k since the last restart; undefined stands for the identity
  if (config.steps > 0) {
    at::Tensor A = at::bmm(X, X.transpose(-2, -1));
    for (int64_t k = 0; k < config.steps; ++k) {
      const at::Tensor P = c == 0.0 ? A * b : at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
      Q = Q.defined() ? at::baddbmm(Q, P, Q, /*beta=*/a, /*alpha=*/1.0) : plus_identity(P, a);
      if (k + 1 == config.steps) break;
      if (config.gram_restart > 0 && (k + 1) % config.gram_restart == 0) {
        X = at::bmm(Q, X);
        Q = at::Tensor();
        A = at::bmm(X, X.transpose(-2, -1));
      } else {
        const at::Tensor FA = at::baddbmm(A, P, A, /*beta=*/a, /*alpha=*/1.0);
        A = at::baddbmm(FA, P, FA, /*beta=*/a, /*alpha=*/1.0);  // F A F: the factors commute
      }
    }
  }
  const at::Tensor right = Pi.defined() ? at::matmul(X, Pi) : X;
  return Q.defined() ? at::bmm(Q, right) : right;
}

bool use_gram(const NSConfig& config, int64_t m, int64_t n) {
  switch (config.form) {
    case NSForm::Plain:
      return false;
    case NSForm::Gram:
      return true;
    case NSForm::Auto:
      return newton_schulz_gram_is_cheaper(m, n, config.steps, config.gram_restart);
  }
  return false;
}

}  // namespace

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
  if (use_gram(config, X.size(-2), X.size(-1))) {
    X = batched ? X : X.unsqueeze(0);
    const at::Tensor norms = at::linalg_vector_norm(X, 2, {-2, -1}, /*keepdim=*/true);
    X = gram_chain(
        X / (config.normalization == NSNormalization::ClampMin ? norms.clamp_min(config.eps)
                                                               : norms + config.eps),
        config);
    X = batched ? X : X.squeeze(0);
    return tall ? X.transpose(-2, -1) : X;
  }

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

at::Tensor newton_schulz_projected(const at::Tensor& B, const at::Tensor& Pi,
                                   const NSConfig& config) {
  validate(config);
  TORCH_CHECK(B.dim() == 2 || B.dim() == 3,
              "newton_schulz_projected: input must be [m, n] or [batch, m, n], got shape ",
              B.sizes());
  TORCH_CHECK(at::isFloatingType(B.scalar_type()),
              "newton_schulz_projected: input must be real floating point, got ", B.scalar_type());
  TORCH_CHECK(B.size(-2) <= B.size(-1),
              "newton_schulz_projected: input must be wide (rows <= cols), got shape ", B.sizes());
  TORCH_CHECK(Pi.dim() == 2 && Pi.size(0) == B.size(-1),
              "newton_schulz_projected: Pi must be [n, d] with n = ", B.size(-1), ", got shape ",
              Pi.sizes());
  at::Tensor X = (B.dim() == 3 ? B : B.unsqueeze(0)).to(config.compute_dtype);
  const at::Tensor norms = at::linalg_vector_norm(X, 2, {-2, -1}, /*keepdim=*/true);
  X = X / (config.normalization == NSNormalization::ClampMin ? norms.clamp_min(config.eps)
                                                             : norms + config.eps);
  const at::Tensor Y = gram_chain(X, config, Pi.to(config.compute_dtype));
  return B.dim() == 3 ? Y : Y.squeeze(0);
}

bool newton_schulz_gram_is_cheaper(int64_t m, int64_t n, int64_t steps, int64_t restart) {
  // Multiply-adds per matrix. Plain: each step X X^T (m^2 n), A^2 (m^3), polynomial times X
  // (m^2 n). Gram: A_0 and Q X_0 (m^2 n each); each step A^2 and F Q (m^3 each, the first F Q
  // free); between steps F A F (2 m^3), or at a restart Q X and X X^T (m^2 n each).
  if (steps == 0) return false;
  const double M = static_cast<double>(m), N = static_cast<double>(n);
  const double K = static_cast<double>(steps);
  const double restarts = restart > 0 ? static_cast<double>((steps - 1) / restart) : 0.0;
  const double plain = K * (2 * M * M * N + M * M * M);
  const double gram = 2 * M * M * N + (2 * K - 1) * M * M * M + (K - 1 - restarts) * 2 * M * M * M +
                      restarts * 2 * M * M * N;
  return gram < plain;
}

bool newton_schulz_projected_is_cheaper(int64_t m, int64_t n, int64_t d, int64_t steps,
                                        int64_t restart) {
  // Multiply-adds per matrix. Plain: each step X X^T (m^2 n), A^2 (m^3) and the polynomial times
  // X (m^2 n), then X Pi (m n d). Gram: the Gram form's count (newton_schulz_gram_is_cheaper)
  // with its final Q X (m^2 n) replaced by X Pi (m n d) and Q (X Pi) (m^2 d).
  if (steps == 0) return false;
  const double M = static_cast<double>(m), N = static_cast<double>(n), D = static_cast<double>(d);
  const double K = static_cast<double>(steps);
  const double restarts = restart > 0 ? static_cast<double>((steps - 1) / restart) : 0.0;
  const double plain = K * (2 * M * M * N + M * M * M) + M * N * D;
  const double gram = M * M * N + (2 * K - 1) * M * M * M + (K - 1 - restarts) * 2 * M * M * M +
                      restarts * 2 * M * M * N + M * N * D + M * M * D;
  return gram < plain;
}

}  // namespace fogo
