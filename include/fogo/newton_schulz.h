#pragma once
// Newton–Schulz orthogonalization: O = NS(B; K), the map both Muon and FOGO apply to momentum.
//
// One implementation serves a single matrix [m, n] and a batch of same-shape matrices
// [batch, m, n] (one batched matmul chain; FOGO sends both of its streams and all same-shape
// parameters through one call). Each iteration applies, on the wide orientation (rows <= cols),
//
//   A = X X^T,   X <- a X + (b A + c A^2) X
//
// Quintic (Muon's coefficients, the default) and cubic (a, b, c) = (1.5, -0.5, 0), the classic
// iteration X <- 1.5 X - 0.5 X X^T X that converges to the polar factor U V^T, are both this map.
// The op sequence on a single matrix is exactly that of torch.optim.Muon's
// `_zeropower_via_newtonschulz`, so results match PyTorch bit for bit on the same device.

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <tuple>

namespace fogo {

/// How X0 is normalised before iterating.
enum class NSNormalization {
  ClampMin,  ///< X0 = B / max(||B||_F, eps)    (torch.optim.Muon)
  AddEps,    ///< X0 = B / (||B||_F + eps)      (FOGO, ALGORITHM.md step 2)
};

/// How the iteration is computed (the same map either way, up to rounding).
enum class NSForm : int64_t {
  Plain = 0,  ///< on X [m, n] itself: torch.optim.Muon's op sequence, bit for bit
  Gram = 1,   ///< on the m x m Gram matrix, applied to X once (newton_schulz, "Gram form")
  Auto = 2,   ///< Gram where newton_schulz_gram_is_cheaper says so for the shape, else Plain
};

struct NSConfig {
  /// (a, b, c) of X <- a X + (b A + c A^2) X. Muon's quintic by default.
  std::array<double, 3> coefficients{3.4445, -4.7750, 2.0315};
  /// Number of iterations K; 0 <= steps < 100.
  int64_t steps = 5;
  double eps = 1e-7;
  NSNormalization normalization = NSNormalization::ClampMin;
  /// Dtype the iteration runs in (kBFloat16 as in torch.optim.Muon, or kFloat32).
  c10::ScalarType compute_dtype = c10::kBFloat16;
  NSForm form = NSForm::Plain;
  /// Gram form: the Gram matrix is formed anew from the current iterate after every
  /// `gram_restart` iterations (0: never), which bounds the rounding it accumulates.
  int64_t gram_restart = 3;

  static constexpr std::array<double, 3> quintic() { return {3.4445, -4.7750, 2.0315}; }
  static constexpr std::array<double, 3> cubic() { return {1.5, -0.5, 0.0}; }
};

/// The coefficient sets by name, for the optimizers' ns_coefficients option:
/// `FOGOOptions().ns_coefficients(fogo::kCubic)` runs the spec's cubic iteration.
inline constexpr std::tuple<double, double, double> kQuintic{3.4445, -4.7750, 2.0315};
inline constexpr std::tuple<double, double, double> kCubic{1.5, -0.5, 0.0};

/// An NSConfig from an optimizer's option fields (coefficients as the (a, b, c) tuple they use).
NSConfig ns_config(const std::tuple<double, double, double>& coefficients, int64_t steps,
                   double eps, NSNormalization normalization, c10::ScalarType compute_dtype,
                   NSForm form, int64_t gram_restart);

/// Checks a configuration; throws c10::Error naming the offending field.
void validate(const NSConfig& config);

/// Orthogonalizes `B` ([m, n] or [batch, m, n], floating point, any device). Tall matrices are
/// transposed internally and back. Returns a tensor of B's shape in `config.compute_dtype`.
///
/// The Gram form (config.form) iterates on the wide orientation's m x m Gram matrix instead of
/// on X: with F_k = a I + b A_k + c A_k^2 each iterate is X_{k+1} = F_k X_k, so
///
///   A_{k+1} = F_k A_k F_k,   Q_{k+1} = F_k Q_k,   X_K = Q_K X_0,
///
/// m x m products plus two m x m x n ones (A_0 and the final Q_K X_0), where the plain form
/// takes two m x m x n products per iteration. A restart every `gram_restart` iterations forms
/// X_k = Q_k X_0 and A_k = X_k X_k^T anew (two more m x m x n products), so the Gram matrix's
/// rounding does not compound over the whole chain: in bf16 it is then as accurate as the plain
/// chain (tests/test_newton_schulz.cpp checks both against the SVD).
at::Tensor newton_schulz(const at::Tensor& B, const NSConfig& config = {});

/// Whether the Gram form takes fewer multiply-adds than the plain one for a matrix with m rows
/// and n columns on its wide orientation (m <= n), `steps` iterations and `restart`.
bool newton_schulz_gram_is_cheaper(int64_t m, int64_t n, int64_t steps, int64_t restart);

/// NS(B) Pi without forming NS(B), for a wide B ([m, n] or [batch, m, n], m <= n) and Pi [n, d];
/// returns [m, d] (or [batch, m, d]) in `config.compute_dtype`. The Gram form (above) with its
/// last product taken against Pi: X_K Pi = Q_K (X_r Pi), X_r the iterate of the last restart
/// (X_0 without one), so the chain's m x n work is A_0, the restarts and one m x n x d product
/// (FOGO needs only P_f = O_f Pi of its fast stream). Cheaper than newton_schulz plus the
/// projection when n is large against m and d (newton_schulz_projected_is_cheaper). Restarts
/// (`config.gram_restart`) as in the Gram form: with them bf16 is as accurate as the plain bf16
/// chain then the projection (tests check both against the SVD); without them the Gram matrix
/// squares the condition number and bf16 loses the small singular directions.
at::Tensor newton_schulz_projected(const at::Tensor& B, const at::Tensor& Pi,
                                   const NSConfig& config = {});

/// Whether newton_schulz_projected takes fewer multiply-adds than newton_schulz followed by the
/// projection, for a wide [m, n] matrix, Pi [n, d], `steps` iterations and a restart every
/// `restart` (0: none).
bool newton_schulz_projected_is_cheaper(int64_t m, int64_t n, int64_t d, int64_t steps,
                                        int64_t restart);

}  // namespace fogo
