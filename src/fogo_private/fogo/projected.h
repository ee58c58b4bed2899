#pragma once
// Row-wise work in the projected space R^d (docs/algorithm.md steps 4, 6 and 7). Every function
// takes all rows of a codebook group at once ([R, d]); nothing loops over rows.

#include <ATen/Tensor.h>

#include "fogo_private/fogo/codebook.h"

namespace fogo {

/// Step 4, slerp fusion: z_i = |Ps_i| Slerp(Ps_i, Pf_i; xi) (Appendix "Details of Slow-Fast
/// Fusion"): ps, pf normalised, a = <pf, ps>, theta = acos(clip(a, -1+eps, 1-eps)),
/// v = (pf - a ps)/(|pf - a ps| + eps), z' = cos(xi theta) ps + sin(xi theta) v.
at::Tensor slerp_fuse(const at::Tensor& Ps, const at::Tensor& Pf, double xi, double eps);

struct ShortTermParams {
  double eps_st, tau_plus, tau_minus;
};

/// Step 6's components for rows z [R, d], queries q [R, d] and the pre-update unit centroids
/// cbar [C, d]: s_ij = <q_i, cbar_j>, H_i = {s_ij > eps_st}, C_i = {s_ij < -eps_st},
/// z_hi = sum_{H_i} alpha+ <z_i, cbar_j> cbar_j, z_conf likewise over C_i (softmax weights over
/// each set; an empty set gives a zero component).
struct ShortTermComponents {
  at::Tensor z_hi;          ///< [R, d]
  at::Tensor z_conf;        ///< [R, d]
  at::Tensor any_over;      ///< [R] bool, H_i non-empty
  at::Tensor any_conflict;  ///< [R] bool, C_i non-empty
};
ShortTermComponents short_term_components(const at::Tensor& z, const at::Tensor& s,
                                          const at::Tensor& cbar, const ShortTermParams& p);

/// r_i = (|z_conf_i| + lambda_hi |z_hi_i|) / (|z_i| + eps): per-row energy outside the safe band.
at::Tensor conflict_ratio(const at::Tensor& z, const ShortTermComponents& c, double lambda_hi,
                          double eps);

struct LongTermParams {
  double eps_lt, gamma_lt, eps;
  bool spectral_scaling;
};

/// Step 7: zbar_i = z~_i - gamma_lt_i z_lt_i with z_lt_i = sum_{B_i} nu_k <z~_i, c_k> c_k over
/// B_i = {k : |<q~_i, c_k>| > eps_lt}; gamma_lt_i = gamma_lt min(1, 1/sum_{B_i} nu_k) with
/// spectral scaling (trace bound on lambda_max(Omega_i), so Theorem 4's condition holds),
/// gamma_lt otherwise. `frozen` [K, d] unit rows, `nu` [K].
struct LongTermResult {
  at::Tensor zbar;            ///< [R, d]
  at::Tensor protected_rows;  ///< [R] bool, B_i non-empty
};
LongTermResult long_term_protect(const at::Tensor& ztilde, const at::Tensor& frozen,
                                 const at::Tensor& nu, const LongTermParams& p);

struct ProjectedStepParams {
  double xi, eps;
  ShortTermParams short_term;
  double lambda_hi, gamma_hi, gamma_st_min, gamma_st_max, beta_r, kappa;
  LongTermParams long_term;
  bool filter;  ///< false on a group's first step: the codebook has no history yet
};

/// Everything a group's step does in R^d, rows of all its parameters at once:
/// slerp (4), query and memory read against the pre-update codebook (5), short-term filter with
/// the rbar/gamma_st update (6) and long-term protection (7), ending in dz = zbar - Ps.
struct ProjectedStepResult {
  at::Tensor dz;     ///< [R, d]  zbar - Ps, to be lifted
  at::Tensor q;      ///< [R, d]  queries (for re-seeding)
  at::Tensor valid;  ///< [R]     non-zero queries
  at::Tensor m, s;   ///< [C], [C, d] this step's assignment counts and query sums
  at::Tensor rbar;   ///< 0-d     updated conflict EMA (unchanged when !filter)
  at::Tensor stats;  ///< [4]     gamma_st, frac conflicting, frac over-aligned, frac protected
};

/// `frozen` [K, d] / `nu` [K]: the long-term candidates (K may be 0 or the tensors undefined).
namespace ref {
ProjectedStepResult projected_step(const at::Tensor& Ps, const at::Tensor& Pf,
                                   const at::Tensor& cbar, const at::Tensor& frozen,
                                   const at::Tensor& nu, const at::Tensor& rbar,
                                   const ProjectedStepParams& p);
}  // namespace ref

}  // namespace fogo
