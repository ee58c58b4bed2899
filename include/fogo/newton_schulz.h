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
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <fogo/ns_dtype.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace fogo {

/// How X0 is normalised before iterating.
enum class NSNormalization {
  ClampMin,  ///< X0 = B / max(||B||_F, eps)    (torch.optim.Muon)
  AddEps,    ///< X0 = B / (||B||_F + eps)      (FOGO, docs/algorithm.md step 2)
};

/// How the iteration is computed (the same map either way, up to rounding).
enum class NSForm : int64_t {
  Plain = 0,  ///< on X [m, n] itself: torch.optim.Muon's op sequence, bit for bit
  Gram = 1,   ///< on the m x m Gram matrix, applied to X once (newton_schulz, "Gram form")
  Auto = 2,   ///< the faster of the two for the shape: timed (CUDA, CPU), else the cost model
  /// The optimizers' default: Auto where compute dtype kNSDtypeAuto resolved to fp32 (a device
  /// without fast bf16, where no earlier result is kept bit for bit: the faster form, issue 37),
  /// else Plain (bf16, and every dtype set explicitly: torch.optim.Muon's op sequence and the
  /// bits of before). resolve_ns_config decides.
  Default = 3,
};

/// The coefficient sets by name, for the optimizers' ns_coefficients option:
/// `FOGOOptions().ns_coefficients(fogo::kCubic)` runs the spec's cubic iteration. The numbers are
/// written here only; NSConfig's defaults and quintic()/cubic() are made from them.
inline constexpr std::tuple<double, double, double> kQuintic{3.4445, -4.7750, 2.0315};
inline constexpr std::tuple<double, double, double> kCubic{1.5, -0.5, 0.0};

constexpr std::array<double, 3> coefficient_array(const std::tuple<double, double, double>& t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t)};
}

struct NSConfig {
  /// (a, b, c) of X <- a X + (b A + c A^2) X. Muon's quintic by default.
  std::array<double, 3> coefficients = coefficient_array(kQuintic);
  /// Number of iterations K; 0 <= steps < 100.
  int64_t steps = 5;
  double eps = 1e-7;
  NSNormalization normalization = NSNormalization::ClampMin;
  /// Dtype the iteration runs in (kBFloat16 as in torch.optim.Muon, kFloat, kDouble), or
  /// kNSDtypeAuto: resolved for the input's device at the call (ns_dtype.h).
  c10::ScalarType compute_dtype = c10::kBFloat16;
  NSForm form = NSForm::Plain;
  /// Gram form: the Gram matrix is formed anew from the current iterate after every
  /// `gram_restart` iterations (0: never), which bounds the rounding it accumulates.
  int64_t gram_restart = 3;
  /// Per-iteration coefficients: iteration k uses schedule[min(k, size - 1)]; empty (the
  /// default): `coefficients` for every iteration. ns_schedule() and ns_named_schedules() give
  /// the named ones.
  std::vector<std::array<double, 3>> schedule;

  /// The (a, b, c) of iteration k.
  const std::array<double, 3>& at(int64_t k) const {
    if (schedule.empty()) return coefficients;
    return schedule[std::min<size_t>(static_cast<size_t>(k), schedule.size() - 1)];
  }

  static constexpr std::array<double, 3> quintic() { return coefficient_array(kQuintic); }
  static constexpr std::array<double, 3> cubic() { return coefficient_array(kCubic); }
};

/// A per-iteration coefficient list: iteration k runs row min(k, size - 1) (the last repeated
/// beyond the end), as NSConfig::schedule and the optimizers' ns_coefficient_schedule option.
using NSSchedule = std::vector<std::array<double, 3>>;

/// A published coefficient list by name (ns_named_schedules): where it comes from, how many
/// iterations it is made for (0: any; a constant one), and the range of singular values it takes
/// the normalised input's [l, 1] to in that many iterations (tests/test_newton_schulz.cpp checks
/// each against the SVD; docs/muon.md cites them).
struct NamedNSSchedule {
  const char* name;
  NSSchedule rows;
  const char* source;
  int64_t steps;
  double l, lo, hi;
};

/// The named lists: keller_jordan, polar_express, tuned5, deepseek_v4, cans, cubic5
/// (newton_schulz.cpp says where each comes from), in that order.
const std::vector<NamedNSSchedule>& ns_named_schedules();
/// The rows of the named list `name`; throws naming the known ones for another name.
NSSchedule ns_named_schedule(const std::string& name);

/// Per-iteration coefficient schedules, the optimizers' `ns_schedule` option (an integer, so that
/// every option front end takes it as one). Each promises a range for the singular values of
/// X_K given those of the normalised input X_0 in [l, 1] (the scalar map composed K times;
/// tests/test_newton_schulz.cpp checks them against the SVD):
///  - kNSConstant (0, the default): `ns_coefficients` every iteration. Muon's quintic maps
///    [1e-2, 1] to [0.68, 1.14] in 5 iterations.
///  - kPolarExpress (1): Amsel, Persson, Musco, Gower, "The Polar Express" (arXiv 2505.16932),
///    Algorithm 1, degree 5, designed for l = 1e-3: the published coefficients, each divided by
///    (1.01, 1.01^3, 1.01^5) but the last (the paper's safety factor, for inputs up to 1.01 and
///    low-precision rounding), the last repeated beyond 8 iterations. [1e-3, 1] maps to [0.846,
///    1.124] in 5 iterations, [0.994, 1.002] in 6 and to 1 within 1e-6 from 8 on.
///  - kTuned5 (2): the 5-iteration set tuned by You Jiacheng and used by modded-nanogpt and
///    Microsoft's Dion: [1e-2, 1] maps to [0.977, 1.032] (inputs down to 1e-3 reach 0.47).
///    5 iterations exactly (ns_steps must be 5).
inline constexpr int64_t kNSConstant = 0;
inline constexpr int64_t kPolarExpress = 1;
inline constexpr int64_t kTuned5 = 2;

/// The per-iteration coefficients of schedule `id` for `steps` iterations (empty for
/// kNSConstant); throws naming the option for an unknown id or a step count the schedule is not
/// made for.
std::vector<std::array<double, 3>> ns_schedule(int64_t id, int64_t steps);

/// An NSConfig from an optimizer's option fields (coefficients as the (a, b, c) tuple they use);
/// `list`, when not empty, is the schedule (the ns_coefficient_schedule option), else the named
/// schedule `schedule`'s.
NSConfig ns_config(const std::tuple<double, double, double>& coefficients, int64_t steps,
                   double eps, NSNormalization normalization, c10::ScalarType compute_dtype,
                   NSForm form, int64_t gram_restart, int64_t schedule = kNSConstant,
                   const NSSchedule& list = {});

/// Checks a configuration; throws c10::Error naming the offending field.
void validate(const NSConfig& config);

/// `config` as it runs on `device`: compute dtype kNSDtypeAuto resolved (ns_dtype.h) and form
/// Default made Plain or Auto (NSForm). newton_schulz and newton_schulz_projected do this
/// themselves; callers that allocate in the compute dtype first call it.
NSConfig resolve_ns_config(NSConfig config, const c10::Device& device);
/// The form `form` means for compute dtype option `dtype` on `device` (NSForm::Default resolved).
NSForm resolve_ns_form(NSForm form, c10::ScalarType dtype, const c10::Device& device);

/// Orthogonalizes `B` ([m, n] or [batch, m, n], floating point, any device). Tall matrices are
/// transposed internally and back. Returns a tensor of B's shape in `config.compute_dtype`
/// (kNSDtypeAuto resolved for B's device).
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

/// Multiply-adds of one chain on a matrix with m rows and n columns on its wide orientation
/// (m <= n), `steps` iterations: the plain form, or the Gram form with a restart every `restart`
/// (0: none). The benchmarks' FLOP counts (2 per multiply-add) and the cost model use it.
double newton_schulz_macs(int64_t m, int64_t n, int64_t steps, bool gram, int64_t restart);

// ---------------------------------------------------------------------------------------------
// ns_form Auto. The first time newton_schulz meets a (wide shape m x n, batch, compute dtype,
// device, steps, restart, schedule) with form Auto, it decides Plain or Gram for it and keeps the
// decision for the rest of the process (nowhere else: no checkpoint holds it). On a CUDA device
// it times both forms on that input (one warm-up run each, then 3 runs between CUDA events on the
// current stream, cudnn.benchmark-style; one host synchronisation, at first sight only), on the
// CPU likewise with a steady clock (one warm-up run, then the median of 3), and takes the faster
// (Plain on a tie); with timing off, on other devices, or inside a CUDA graph capture (where
// nothing may synchronise: that call takes the model and keeps nothing) it takes the cost model,
// newton_schulz_gram_is_cheaper. Both forms compute the same map, so the choice moves results by
// rounding only; for a given set of kept decisions every call is deterministic.

/// One decision of ns_form Auto: the shape it is for, the form taken, and the measured times in
/// ms (NaN when the cost model decided).
struct NSFormChoice {
  int64_t m = 0, n = 0;  ///< wide orientation (m <= n)
  int64_t d = 0;         ///< Pi's columns for newton_schulz_projected_auto, else 0
  int64_t batch = 0;     ///< matrices in the batch; 0 for a single [m, n] matrix
  int64_t steps = 0, restart = 0;
  int64_t schedule = 0;  ///< 0: constant coefficients, else a hash of the schedule's rows
  c10::ScalarType dtype = c10::kBFloat16;
  std::string device;
  bool gram = false;  ///< the Gram form (newton_schulz) or the projected route was taken
  bool measured = false;
  double plain_ms = 0.0, gram_ms = 0.0;
};

/// How much faster than Plain the Gram form must time for Auto to take it (a fraction of Plain's
/// time): timed alone, the Gram form flatters small launch-bound shapes, whose step runs them
/// beside others (ResNet-18 on an H100, 2026-11-27: Auto's Gram choices, each faster alone, made
/// the step 6.02 ms against Plain's 5.48; issue 44).
inline constexpr double kNSGramMargin = 0.10;

/// Every decision kept in this process, in the order they were made.
std::vector<NSFormChoice> ns_form_choices();
/// Forgets the kept decisions: the next sight of each shape decides again.
void clear_ns_form_choices();
/// How Auto times one form: `run` runs its chain once; returns the time of one run in ms, or NaN
/// for "cannot time here" (the cost model decides). The default times CUDA devices with events
/// and the CPU with a steady clock (above) and returns NaN elsewhere; a test injects its own.
/// Null restores the default.
using NSFormTimer = std::function<double(const std::function<void()>& run, const c10::Device&)>;
void set_ns_form_timer(NSFormTimer timer);
/// Timing on (the default) or off (the cost model everywhere). Kept decisions stay.
void set_ns_form_timing(bool enabled);

/// For FOGO's fast stream: whether newton_schulz_projected(B, Pi, config) is faster than
/// newton_schulz(B, config) followed by the projection, decided once per shape as Auto decides
/// (timed on CUDA and the CPU, newton_schulz_projected_is_cheaper without timing; listed by
/// ns_form_choices with d = Pi's columns).
bool newton_schulz_projected_auto(const at::Tensor& B, const at::Tensor& Pi,
                                  const NSConfig& config);

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

/// Multiply-adds of NS(B) Pi for a wide [m, n] matrix and Pi [n, d]: newton_schulz_projected
/// (gram) or the plain chain followed by the projection.
double newton_schulz_projected_macs(int64_t m, int64_t n, int64_t d, int64_t steps, bool gram,
                                    int64_t restart);

/// Whether newton_schulz_projected takes fewer multiply-adds than newton_schulz followed by the
/// projection, for a wide [m, n] matrix, Pi [n, d], `steps` iterations and a restart every
/// `restart` (0: none).
bool newton_schulz_projected_is_cheaper(int64_t m, int64_t n, int64_t d, int64_t steps,
                                        int64_t restart);

}  // namespace fogo
