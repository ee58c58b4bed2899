#pragma once
// MuonOptions: every option of fogo::Muon, defined once in the table below. Each row generates
// the builder field (TORCH_ARG) here and, through src/fogo_private/frame/options_table.h (the
// machinery FOGOOptions' table shares), its validation, its serialization both ways, its part in
// operator== and in a checkpoint's checksum and format, the docs table (docs/muon.md) and the
// Python keyword (python/src/traits.h). Defaults are torch.optim.Muon's but ns_dtype's (auto,
// which is torch.optim.Muon's bf16 where bf16 is the faster; ns_dtype(kBFloat16) is its
// arithmetic on every host).

#include <fogo/matrix_options.h>
#include <fogo/matrix_view.h>
#include <fogo/newton_schulz.h>
#include <fogo/nonfinite.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace fogo {

enum class MuonAdjustLR : int64_t {
  Original = 0,       ///< lr * sqrt(max(1, A / B))   (Keller Jordan's Muon; PyTorch default)
  MatchRmsAdamW = 1,  ///< lr * 0.2 * sqrt(max(A, B)) (Moonshot; reuses AdamW's lr and wd)
  Spectral = 2,       ///< lr * sqrt(A / B), unclamped (the spectral-norm scaling: dion, torchtitan)
};

// clang-format off
/// X(type, name, default, valid values, checkpoint). The columns are read by
/// src/fogo_private/frame/options_table.h, which says what they mean (FOGO's table shares it). The
/// rows' order is the checkpoint checksum's: a row never moves, and a new one is since(N), N the
/// next format.
#define FOGO_MUON_OPTIONS(X)                                                                       \
  X(double,          lr,              1e-3,                   range(0.0, INFINITY), always())      \
  /* decoupled, with the unadjusted lr */                                                          \
  X(double,          weight_decay,    0.1,                    range(0.0, INFINITY), always())      \
  X(double,          momentum,        0.95,                   range(0.0, 1.0), always())           \
  X(bool,            nesterov,        true,                   any(), always())                     \
  /* or kCubic (newton_schulz.h) */                                                                \
  X(coefficients_t,  ns_coefficients, kQuintic,               finite(), always())                  \
  /* X0 = U / max(|U|_F, eps) */                                                                   \
  X(double,          eps,             1e-7,                   positive(), always())                \
  X(int64_t,         ns_steps,        5,                      range(0, 99), always())              \
  X(MuonAdjustLR,    adjust_lr,       MuonAdjustLR::Original,                                      \
    one_of(MuonAdjustLR::Original, MuonAdjustLR::MatchRmsAdamW, MuonAdjustLR::Spectral),        \
    always())                                                                                      \
  /* Newton–Schulz compute dtype: bf16 (torch.optim.Muon's, bit for bit), fp32, or auto: bf16      \
     where the device computes it faster (ns_dtype.h), else fp32 */                                \
  X(c10::ScalarType, ns_dtype,        kNSDtypeAuto,                                                \
    one_of(kNSDtypeAuto, c10::kBFloat16, c10::kFloat), always())                                   \
  /* refuse N-D (conv) weights as torch.optim.Muon does, instead of taking their matrix view */    \
  X(bool,            strict_2d,       false,                  any(), always())                     \
  /* a gradient holding NaN/Inf or with a norm where the update's arithmetic overflows: Raise      \
     naming the parameter (one host sync per step), Skip the step, Mask it on the device (no       \
     sync: the parameters and momentum buffers keep their bits), or Unchecked (no check, as        \
     torch.optim.Muon); nonfinite.h. Older checkpoints hold check_finite instead */                \
  X(NonFinitePolicy, nonfinite,       NonFinitePolicy::Raise, known(), added())                    \
  /* Newton–Schulz on X (Plain: torch.optim.Muon's op sequence), on its Gram matrix (Gram), the    \
     faster of the two for the shape, timed (Auto), or Default: Auto where ns_dtype auto resolved  \
     to fp32, else Plain; newton_schulz.h */                                                       \
  X(NSForm,          ns_form,         NSForm::Default,                                             \
    one_of(NSForm::Plain, NSForm::Gram, NSForm::Auto, NSForm::Default), added())                   \
  /* Gram form: iterations between re-formings of the Gram matrix (0: never) */                    \
  X(int64_t,         ns_gram_restart, 3,                      range(0, INFINITY), added())         \
  /* CUDA parameters: capture the group's step in a CUDA graph once and replay it (the learning    \
     rate read on the device; docs/cuda.md). Not with data-parallel sharding (steps eagerly) */    \
  X(bool,            cuda_graph,      false,                  any(), added())                      \
  /* per-iteration Newton–Schulz coefficients: kNSConstant (ns_coefficients every iteration,       \
     torch.optim.Muon's), kPolarExpress or kTuned5 (newton_schulz.h), which replace                \
     ns_coefficients. since(1): Muon's checksum left it out until the table (docs/muon.md) */      \
  X(int64_t,         ns_schedule,     kNSConstant,            range(0, 2), since(1))              \
  /* NorMuon (Li et al. 2025): each row of the orthogonalized update divided by the root of its    \
     second moment (a per-row EMA of its mean square, state), then rescaled to the update's        \
     Frobenius norm; docs/muon.md */                                                               \
  X(bool,            normuon,         false,                  any(), since(2))                    \
  /* NorMuon: the second moment's EMA coefficient */                                               \
  X(double,          normuon_beta2,   0.95,                   range(0.0, 1.0), since(2))          \
  /* NorMuon: added to each row's root second moment and to the normalized update's norm (the     \
     lower bound keeps it above zero in fp32 arithmetic) */                                        \
  X(double,          normuon_eps,     1e-10,                  range(1e-30, INFINITY), since(2))   \
  /* a parameter's matrix view (matrix_view.h): its leading batch_dims dimensions a batch of       \
     matrices, each orthogonalized and scaled as a parameter of its own (a stack of experts [E,     \
     out, in]: 1); 0: conv weights [out, in, kh, kw] as their [out, in*kh*kw] view */              \
  X(int64_t,         batch_dims,      0,                      range(0, 64), since(3))             \
  /* each matrix's rows in `heads` equal blocks (a fused projection's heads), each orthogonalized  \
     and scaled as a parameter of its own */                                                       \
  X(int64_t,         heads,           1,                      range(1, INFINITY), since(3))       \
  /* ... or in blocks of these row counts, in order (a fused GQA projection: {q, k, v}); empty:    \
     `heads` */                                                                                    \
  X(sizes_t,         blocks,          sizes_t(),              counts(), since(3))             \
  /* per-iteration Newton–Schulz coefficients as data: iteration k runs row min(k, rows - 1), at   \
     most ns_steps rows; replaces ns_coefficients (ns_schedule must be kNSConstant). Empty: as     \
     before. ns_named_schedules() (newton_schulz.h) holds the published lists */                   \
  X(schedule_t,      ns_coefficient_schedule, schedule_t(),                                        \
    ns_rows(o.ns_steps(), o.ns_schedule()), since(4))                                             \
  /* one multiplier on the update, lr * adjust_lr's factor * extra_scale_factor (Megatron-LM's     \
     convention, torch.optim.Muon's pending one); the decay keeps lr */                            \
  X(double,          extra_scale_factor, 1.0,                 range(0.0, INFINITY), since(4))
// clang-format on

struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions>,
                     public MatrixOptions {
  using coefficients_t = std::tuple<double, double, double>;
  using sizes_t = std::vector<int64_t>;
  using schedule_t = NSSchedule;
  MuonOptions(double lr = 1e-3);

#define FOGO_DECLARE_MUON_OPTION(T, name, def, ...) TORCH_ARG(T, name) = def;
  FOGO_MUON_OPTIONS(FOGO_DECLARE_MUON_OPTION)
#undef FOGO_DECLARE_MUON_OPTION

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
  /// Throws naming the first invalid option.
  void validate() const;
  /// matrix_layout(*this).
  MatrixLayout layout() const override;
  UpdateScale update_scale(const std::vector<int64_t>& sizes) const override;
  /// Every option equal.
  friend bool operator==(const MuonOptions& a, const MuonOptions& b);
};

/// Every option of the table as a Markdown table (option | default | valid values | how it
/// travels in a checkpoint), in table order: docs/muon.md holds this text, and a test keeps the two
/// equal.
std::string muon_options_markdown();

/// torch.optim.Muon's Newton–Schulz of `o` (X0 = U / max(|U|_F, eps)): what Muon's step runs,
/// for code that orthogonalizes outside it (the Python package's sharded FSDP2 step).
NSConfig ns_config(const MuonOptions& o);

/// How `o` cuts its group's parameters into matrices (batch_dims, heads, blocks; matrix_view.h).
MatrixLayout matrix_layout(const MuonOptions& o);

}  // namespace fogo
