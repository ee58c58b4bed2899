#pragma once
// The online directional memory of one codebook group (docs/algorithm.md step 5, "codebook flush",
// "first step", and the consolidation of "task boundaries"; paper Appendix "Details of Online
// Directional Memory" and "Details of Long-Term Near-Orthogonal Protection").

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>

#include <cstdint>

namespace fogo {

/// Row-wise x / (|x| + eps): queries and centroids as unit directions.
at::Tensor normalize_rows(const at::Tensor& x, double eps);

struct Codebook {
  at::Tensor centroids;  ///< cbar [C, d], unit rows
  at::Tensor S;          ///< EMA of assigned query sums [C, d]
  at::Tensor N;          ///< EMA of assignment counts [C]
};

/// First step of a group: C distinct rows of the valid queries q [R, d] drawn by `gen`, random
/// unit vectors for any shortfall; S = N = 0.
Codebook init_codebook(const at::Tensor& q, const at::Tensor& valid, int64_t C, at::Generator& gen);

/// Step 5's accumulation over one step: a_i = argmax_j s_ij,
/// m_j = #{i valid : a_i = j}, s_j = sum_{i valid, a_i = j} q_i. Zero queries (rows whose fused
/// update is exactly zero, `valid` false) carry no direction and are not counted.
struct Assignments {
  at::Tensor m;  ///< [C]
  at::Tensor s;  ///< [C, d]
};
Assignments assign(const at::Tensor& q, const at::Tensor& sim, const at::Tensor& valid);

struct FlushParams {
  double beta_cb, lambda_c, eps;
  int64_t r_dec;
};

/// S = beta S + (1-beta) s, N = beta N + (1-beta) m, ctilde = S/(N+eps), chat = unit(ctilde);
/// h_j = sum over the r_dec previous centroids l != j most |correlated| with chat_j of
/// <chat_j, cbar_l> cbar_l; c_j = unit(ctilde_j - lambda_c h_j). A centroid whose N_j is
/// numerically zero (<= eps), or whose new direction vanishes, keeps its previous direction.
/// Every tensor of `book` is updated in place.
namespace ref {
void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p);
}  // namespace ref

/// Every centroid with N_j < threshold gets a distinct valid query q_i drawn by `gen`
/// (S_j = threshold q_i, N_j = threshold, c_j = q_i); as many as there are valid queries.
void reseed(Codebook& book, const at::Tensor& q, const at::Tensor& valid, double threshold,
            at::Generator& gen);

/// Consolidation: K centroids by importance
///   score_j = (N_j / sum N) (1 - max_{l!=j} |<c_j, c_l>|) (1 + drift_j),
///   drift_j = 1 - <c_j, c_j^start>,
/// picked greedily, after each pick the others' scores multiplied by (1 - |<c_j, c_pick>|);
/// nu = the picked scores normalised to sum 1 (uniform if they are all zero).
struct FrozenPicks {
  at::Tensor centroids;  ///< [K, d]
  at::Tensor nu;         ///< [K]
};
FrozenPicks select_important(const Codebook& book, const at::Tensor& start, int64_t K);

/// A_t: `k` indices of the frozen bank drawn without replacement with probabilities
/// proportional to `nu` [F] (Efraimidis–Spirakis: the k largest log(u_i) / nu_i, u_i uniform).
/// `log_u` [F] float64 are the draw's keys (candidate_keys); the selection runs on nu's device.
/// Zero weights are floored at 1e-12 (still drawable, last).
at::Tensor sample_candidates(const at::Tensor& nu, int64_t k, const at::Tensor& log_u);

/// The keys log(u_i) of one candidate draw over a bank of F, u_i uniform from the CPU generator
/// `gen` (identical on every device, in checkpoints and across ranks), on `device`: copied from
/// pinned memory without waiting for the device, so a GPU step does not wait for the host.
at::Tensor candidate_keys(int64_t F, at::Generator& gen, const c10::Device& device);

}  // namespace fogo
