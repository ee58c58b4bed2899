#pragma once
// FOGOOptions: every hyper-parameter of docs/algorithm.md, defined once in the table below. Each
// row generates the builder field (TORCH_ARG) here and, through
// src/fogo_private/frame/options_table.h (the machinery MuonOptions' table shares), its
// validation, its serialization both ways, its part in operator== and in a checkpoint's checksum
// and format, the docs table (docs/algorithm.md), the Python keyword and the trainers' --fogo
// name=value; FOGO's step reads the fields and hands the stage functions their own small parameter
// structs (projected.h, codebook.h, update.h). The paper's configurations are in fogo::presets.

#include <fogo/matrix_options.h>
#include <fogo/matrix_view.h>
#include <fogo/newton_schulz.h>
#include <fogo/nonfinite.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace fogo {

/// Pi's scale (projection.h).
enum class ProjectionScale : int64_t {
  Unit = 0,  ///< Pi entries +-1 (the paper's Method section)
  JL = 1,    ///< Pi entries +-1/sqrt(d) (Johnson–Lindenstrauss scaling)
};

// clang-format off
/// X(type, name, default, valid values, checkpoint): every option of FOGO, symbols of
/// docs/algorithm.md in the comments. The columns are read by src/fogo_private/frame/options_table.h,
/// which says what they mean (in `valid`, `o` is the options being checked). The rows' order is
/// the checkpoint checksum's: a row never moves, and a new one is since(N), N the next format.
#define FOGO_OPTIONS(X)                                                                           \
  /* update (step 9) */                                                                           \
  X(double,  lr,               1e-3,  range(0.0, INFINITY),      always())  /* learning rate */   \
  X(double,  weight_decay,     0.0,   range(0.0, INFINITY),      always())  /* decoupled */       \
  X(double,  sigma,            0.2,   range(0.0, INFINITY),      always())  /* target RMS */      \
  X(double,  eps,              1e-8,  range(1e-30, 1.0),         always())                        \
  /* NorMuon on the final update Ohat (as MuonOptions::normuon; docs/algorithm.md, "NorMuon"):   \
     each row of the parameter's matrix view divided by the root of its second moment (a per-row \
     EMA of its mean square, state), then rescaled to |Ohat|_F, before the RMS update */         \
  X(bool,    normuon,          false, any(),                     since(2))                        \
  X(double,  normuon_beta2,    0.95,  range(0.0, 1.0),           since(2))                        \
  X(double,  normuon_eps,      1e-10, range(1e-30, INFINITY),    since(2))                        \
  /* streams and Newton–Schulz (steps 1-2) */                                                     \
  X(double,  mu_s,             0.95,  range(0.0, 1.0),           always())                        \
  X(double,  mu_f,             0.35,  range(0.0, 1.0),           always())                        \
  X(int64_t, ns_steps_slow,    5,     range(0, 99),              always())  /* K_s */             \
  X(int64_t, ns_steps_fast,    5,     range(0, 99),              always())  /* K_f */             \
  /* Gram form: re-form the Gram matrix every k iterations */                                     \
  X(int64_t, ns_gram_restart,  3,     range(0, 99),              added())                         \
  /* per-iteration coefficients: 0 fixed (ns_coefficients), 1 Polar Express, 2 tuned */           \
  X(int64_t, ns_schedule,      0,     range(0, 2),               added())                         \
  /* projection and fusion (steps 3-4) */                                                         \
  X(int64_t, proj_dim,         128,   range(1, 1 << 20),         always())  /* d */               \
  X(double,  xi,               0.25,  range(0.0, 1.0),           always())                        \
  /* codebook (step 5, flush) */                                                                  \
  X(int64_t, codebook_size,    64,    range(1, 1 << 20),         always())  /* C */               \
  X(double,  beta_cb,          0.96,  range(0.0, 1.0),           always())                        \
  X(double,  lambda_c,         0.1,   range(0.0, INFINITY),      always())                        \
  X(int64_t, r_dec,            8,     range(0, 1 << 20),         always())                        \
  X(int64_t, reseed_every,     50,    range(0, INFINITY),        always())  /* 0: never */        \
  X(double,  reseed_threshold, 0.03,  range(0.0, INFINITY),      always())                        \
  /* short-term filter (step 6) */                                                                \
  X(double,  eps_st,           0.15,  range(0.0, 1.0),           always())                        \
  X(double,  gamma_hi,         0.05,  range(0.0, INFINITY),      always())                        \
  X(double,  gamma_st_min,     0.10,  range(0.0, INFINITY),      always())                        \
  X(double,  gamma_st_max,     0.30,  range(o.gamma_st_min(), INFINITY), always())                \
  X(double,  beta_r,           0.95,  range(0.0, 1.0),           always())                        \
  X(double,  kappa,            0.20,  range(1e-30, INFINITY),    always())                        \
  X(double,  tau_plus,         5.0,   range(0.0, 1e4),           always())                        \
  X(double,  tau_minus,        5.0,   range(0.0, 1e4),           always())                        \
  X(double,  lambda_hi,        0.1,   range(0.0, INFINITY),      always())                        \
  /* long-term protection (step 7) and consolidation */                                           \
  X(double,  eps_lt,           0.10,  range(0.0, 1.0),           always())                        \
  X(double,  gamma_lt,         1.0,   range(0.0, INFINITY),      always())                        \
  X(int64_t, lt_candidates,    48,    range(1, INFINITY),        always())  /* |A_t| */           \
  /* K, frozen per consolidate() */                                                               \
  X(int64_t, freeze_per_task,  20,    range(0, INFINITY),        always())                        \
  /* proximal lift (step 8) */                                                                    \
  X(double,  lambda_prox,      1.0,   range(1e-30, INFINITY),    always())                        \
  X(int64_t, seed,             0,     any(),                     always())  /* Pi, generators */\
  /* Newton–Schulz coefficients: kQuintic or kCubic (newton_schulz.h) */                         \
  X(coefficients_t, ns_coefficients,         kQuintic, finite(),  always())                       \
  /* gamma_lt by the trace bound */                                                               \
  X(bool,           spectral_scaling,        true,     any(),     always())                       \
  X(bool,           reinit_codebook_on_task, false,    any(),     always())                       \
  /* CUDA parameters: capture steady-state steps in a CUDA graph, replay them (FOGO::step) */     \
  X(bool,           cuda_graph,              false,    any(),     added())                        \
  /* true: steps 1, 2, 4 (in parameter space) and 9 only: no Pi, codebook, filters or lift */    \
  X(bool,           fusion_only,             false,    any(),     added())                        \
  /* Newton–Schulz compute dtype (state stays fp32): bf16 (tensor cores, as torch.optim.Muon),  \
     fp16, fp32 or fp64, which also enable the fast stream's Gram route, or auto (kNSDtypeAuto): \
     bf16 where the device computes it faster, else fp32 (ns_dtype.h) */                          \
  X(c10::ScalarType, ns_dtype,         kNSDtypeAuto,                                              \
    one_of(kNSDtypeAuto, c10::kBFloat16, c10::kHalf, c10::kFloat, c10::kDouble), always())       \
  /* Newton–Schulz on X (Plain), on its Gram matrix with restarts (Gram), the faster by time     \
     (Auto), or Default: Auto where ns_dtype auto resolved to fp32, else Plain (newton_schulz.h) */\
  X(NSForm,          ns_form,          NSForm::Default,                                           \
    one_of(NSForm::Plain, NSForm::Gram, NSForm::Auto, NSForm::Default), added())                 \
  X(ProjectionScale, projection_scale, ProjectionScale::Unit,                                     \
    one_of(ProjectionScale::Unit, ProjectionScale::JL), always())                                 \
  X(NonFinitePolicy, nonfinite,        NonFinitePolicy::Raise, known(), always())              \
  /* a parameter's matrices (matrix_view.h; as MuonOptions'): its leading batch_dims dimensions  \
     a batch (a stack of experts [E, out, in]: 1), each matrix's rows cut into `heads` equal     \
     blocks or blocks of the `blocks` row counts; each matrix its own rows of the projected      \
     space, as a parameter of its own */                                                         \
  X(int64_t,         batch_dims,       0,        range(0, 64),       since(2))                   \
  X(int64_t,         heads,            1,        range(1, INFINITY), since(2))                   \
  X(sizes_t,         blocks,           sizes_t(), counts(),          since(2))                   \
  /* per-iteration Newton–Schulz coefficients as data (as MuonOptions'), for both streams: at     \
     most min(ns_steps_slow, ns_steps_fast) rows; replaces ns_coefficients (ns_schedule 0) */     \
  X(schedule_t,      ns_coefficient_schedule, schedule_t(),                                      \
    ns_rows(std::min(o.ns_steps_slow(), o.ns_steps_fast()), o.ns_schedule()), since(3))
// clang-format on

struct FOGOOptions : public torch::optim::OptimizerCloneableOptions<FOGOOptions>,
                     public MatrixOptions {
  using coefficients_t = std::tuple<double, double, double>;
  using sizes_t = std::vector<int64_t>;
  using schedule_t = NSSchedule;
  FOGOOptions(double lr = 1e-3);

#define FOGO_DECLARE_OPTION(T, name, def, ...) TORCH_ARG(T, name) = def;
  FOGO_OPTIONS(FOGO_DECLARE_OPTION)
#undef FOGO_DECLARE_OPTION

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
  friend bool operator==(const FOGOOptions& a, const FOGOOptions& b);
};

/// Every option of the table as a Markdown table (option | default | valid | checkpoint), in table
/// order: docs/algorithm.md holds this text, and a test keeps the two equal.
std::string options_markdown();

/// FOGO's Newton–Schulz configuration for `steps` iterations: X0 = B / (|B|_F + eps)
/// (docs/algorithm.md step 2), the options' coefficients and compute dtype.
NSConfig ns_config(const FOGOOptions& o, int64_t steps);

/// How `o` cuts its group's parameters into matrices (batch_dims, heads, blocks; matrix_view.h).
MatrixLayout matrix_layout(const FOGOOptions& o);

// clang-format off
/// The paper's configurations ("Detailed Experimental Setup"; docs/algorithm.md's table), one row
/// each: X(name, what it is for). The only list of them: it declares fogo::presets::name(),
/// makes fogo::presets::table, and through the table Python's fogo.presets; README's list is
/// checked against it (tests/test_fogo.cpp). The values are in src/fogo/options.cpp.
#define FOGO_PRESETS(X)                                                                           \
  X(class_imbalanced_backbone, "class-imbalanced learning: the backbone's layers")               \
  X(class_imbalanced_head,     "class-imbalanced learning: the head's layers")                  \
  X(domain_il_backbone,        "domain-incremental learning: the backbone's layers")             \
  X(domain_il_head,            "domain-incremental learning: the heads")                         \
  X(class_il_backbone,         "class-incremental learning: the backbone's layers")              \
  X(class_il_head_fc,          "class-incremental learning: the intermediate head FC")           \
  X(class_il_classifier,       "class-incremental learning: the classifier")                     \
  X(gpt2,                      "GPT-2 pretraining: the transformer's matrices")                  \
  X(lora,                      "LoRA-MoE fine-tuning (LLaVA): the LoRA matrices")
// clang-format on

namespace presets {
#define FOGO_DECLARE_PRESET(name, description) FOGOOptions name();
FOGO_PRESETS(FOGO_DECLARE_PRESET)
#undef FOGO_DECLARE_PRESET

/// A row of FOGO_PRESETS: its name, what it is for, and the function that makes its options.
struct Preset {
  const char* name;
  const char* description;
  FOGOOptions (*options)();
};

/// Every preset, in FOGO_PRESETS' order.
inline constexpr Preset table[] = {
#define FOGO_PRESET_ROW(name, description) {#name, description, &name},
    FOGO_PRESETS(FOGO_PRESET_ROW)
#undef FOGO_PRESET_ROW
};

/// The options of the preset called `name`; an error listing the presets if there is none.
FOGOOptions by_name(std::string_view name);

/// `base` as a fusion-only FOGO (option fusion_only): the slow and fast streams, each through
/// Newton–Schulz, fused row by row by slerp in parameter space, RMS-scaled; no projection,
/// codebook, short- or long-term filter or lift is built or run. For the question "does the
/// memory earn its cost" (docs/results.md): the memory-free part of FOGO at its own cost. A
/// variant of any preset, not a preset (not in FOGO_PRESETS).
FOGOOptions fusion_only(FOGOOptions base = gpt2());
}  // namespace presets

}  // namespace fogo
