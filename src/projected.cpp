#include "fogo/projected.h"

#include <ATen/ATen.h>

#include <limits>

namespace fogo {

at::Tensor normalize_rows(const at::Tensor& x, double eps) {
  return x / (at::linalg_vector_norm(x, 2, {1}, /*keepdim=*/true) + eps);
}

at::Tensor slerp_fuse(const at::Tensor& Ps, const at::Tensor& Pf, double xi, double eps) {
  const at::Tensor norm_s = at::linalg_vector_norm(Ps, 2, {1}, /*keepdim=*/true);
  const at::Tensor ps = Ps / (norm_s + eps);
  const at::Tensor pf = normalize_rows(Pf, eps);
  const at::Tensor a = (pf * ps).sum(1, /*keepdim=*/true);
  const at::Tensor theta = at::acos(a.clamp(-1.0 + eps, 1.0 - eps));
  const at::Tensor v = normalize_rows(pf - a * ps, eps);
  const at::Tensor fused = at::cos(xi * theta) * ps + at::sin(xi * theta) * v;
  return norm_s * fused;
}

namespace {

// Softmax of tau * score over the entries where mask holds, row by row; rows without any entry
// get all-zero weights (the paper: an empty set gives a zero component).
at::Tensor masked_softmax(const at::Tensor& score, const at::Tensor& mask, double tau) {
  const at::Tensor logits = at::where(
      mask, tau * score, at::full({}, -std::numeric_limits<float>::infinity(), score.options()));
  const at::Tensor weights = at::softmax(logits, 1);
  return at::where(mask, weights, at::zeros({}, score.options()));  // all -inf rows give NaN
}

}  // namespace

ShortTermComponents short_term_components(const at::Tensor& z, const at::Tensor& s,
                                          const at::Tensor& cbar, const ShortTermParams& p) {
  const at::Tensor over = s > p.eps_st;
  const at::Tensor conflict = s < -p.eps_st;
  const at::Tensor alpha_plus = masked_softmax(s, over, p.tau_plus);
  const at::Tensor alpha_minus = masked_softmax(s.abs(), conflict, p.tau_minus);
  const at::Tensor zc = z.mm(cbar.t());  // <z_i, cbar_j>
  return {(alpha_plus * zc).mm(cbar), (alpha_minus * zc).mm(cbar), over.any(1), conflict.any(1)};
}

at::Tensor conflict_ratio(const at::Tensor& z, const ShortTermComponents& c, double lambda_hi,
                          double eps) {
  const auto norm = [](const at::Tensor& x) { return at::linalg_vector_norm(x, 2, {1}); };
  return (norm(c.z_conf) + lambda_hi * norm(c.z_hi)) / (norm(z) + eps);
}

LongTermResult long_term_protect(const at::Tensor& ztilde, const at::Tensor& frozen,
                                 const at::Tensor& nu, const LongTermParams& p) {
  const at::Tensor qt = normalize_rows(ztilde, p.eps);
  const at::Tensor active = qt.mm(frozen.t()).abs() > p.eps_lt;  // B_i  [R, K]
  const at::Tensor weights = at::where(active, nu.unsqueeze(0), at::zeros({}, nu.options()));
  const at::Tensor z_lt = (weights * ztilde.mm(frozen.t())).mm(frozen);  // [R, d]
  at::Tensor gamma = at::full({ztilde.size(0), 1}, p.gamma_lt, ztilde.options());
  if (p.spectral_scaling) {
    // lambda_max(Omega_i) <= trace(Omega_i) = sum_{B_i} nu_k (the c_k are unit vectors).
    const at::Tensor trace = weights.sum(1, /*keepdim=*/true);
    gamma = gamma * at::clamp_max(1.0 / trace.clamp_min(std::numeric_limits<float>::min()), 1.0);
  }
  return {ztilde - gamma * z_lt, active.any(1)};
}

}  // namespace fogo
