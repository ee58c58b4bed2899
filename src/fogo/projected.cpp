#include "fogo_private/fogo/projected.h"

#include <ATen/ATen.h>

#include <limits>

#include "fogo_private/fogo/codebook.h"

namespace fogo {

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

ProjectedStepResult ref::projected_step(const at::Tensor& Ps, const at::Tensor& Pf,
                                        const at::Tensor& cbar, const at::Tensor& frozen,
                                        const at::Tensor& nu, const at::Tensor& rbar,
                                        const ProjectedStepParams& p) {
  // Step 4: slerp fusion; step 5: query and memory read against the pre-update codebook.
  const at::Tensor z = slerp_fuse(Ps, Pf, p.xi, p.eps);
  const at::Tensor q = normalize_rows(z, p.eps);
  const at::Tensor valid = at::linalg_vector_norm(z, 2, {1}) > 0;
  const at::Tensor sim = q.mm(cbar.t());
  const Assignments acc = assign(q, sim, valid);
  at::Tensor stats = at::zeros({4}, q.options());
  if (!p.filter) return {z - Ps, q, valid, acc.m, acc.s, rbar, stats};

  // Step 6: short-term filter with adaptive gamma_st. r_t is a group mean, so every row's
  // components come first, then rbar is updated, then the correction is applied. Zero queries
  // take no part (docs/algorithm.md, Clarifications): r_t and the telemetry fractions are means
  // over the valid rows, 0 when a step has none. (A zero row has r_i = 0 and no set; counting it
  // would pull rbar, and so gamma_st, toward the minimum wherever rows stay zero.)
  const ShortTermComponents st = short_term_components(z, sim, cbar, p.short_term);
  const at::Tensor rows = valid.sum().to(z.scalar_type()).clamp_min(1);
  const auto valid_mean = [&](const at::Tensor& per_row) {
    return at::where(valid, per_row.to(z.scalar_type()), 0).sum() / rows;
  };
  const at::Tensor r_t = valid_mean(conflict_ratio(z, st, p.lambda_hi, p.eps));
  const at::Tensor rbar_new = p.beta_r * rbar + (1.0 - p.beta_r) * r_t;
  const at::Tensor gamma_st =
      p.gamma_st_min + (p.gamma_st_max - p.gamma_st_min) * rbar_new / (rbar_new + p.kappa);
  at::Tensor zbar = z - p.gamma_hi * st.z_hi - gamma_st * st.z_conf;
  stats[0] = gamma_st;
  stats[1] = valid_mean(st.any_conflict);
  stats[2] = valid_mean(st.any_over);

  // Step 7: long-term protection against the frozen candidates.
  if (frozen.defined() && frozen.size(0) > 0) {
    const LongTermResult lt = long_term_protect(zbar, frozen, nu, p.long_term);
    zbar = lt.zbar;
    stats[3] = valid_mean(lt.protected_rows);
  }
  return {zbar - Ps, q, valid, acc.m, acc.s, rbar_new, stats};
}

}  // namespace fogo
