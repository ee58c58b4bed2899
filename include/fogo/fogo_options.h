#pragma once
// FOGOOptions: every hyper-parameter of docs/algorithm.md, defined once in the tables below. Each
// table row generates the builder field (TORCH_ARG), its validation, its serialization and its
// part in operator==; FOGO's step reads the fields and hands the stage functions their own small
// parameter structs (projected.h, codebook.h, update.h). The paper's configurations are in
// fogo::presets.

#include <fogo/newton_schulz.h>
#include <fogo/nonfinite.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace fogo {

/// Pi's scale (projection.h).
enum class ProjectionScale : int64_t {
  Unit = 0,  ///< Pi entries +-1 (the paper's Method section)
  JL = 1,    ///< Pi entries +-1/sqrt(d) (Johnson–Lindenstrauss scaling)
};

// clang-format off
/// Numeric options: X(type, name, default, smallest valid, largest valid). Symbols of
/// docs/algorithm.md in the comments.
#define FOGO_RANGED_OPTIONS(X)                                                                    \
  /* update (step 9) */                                                                           \
  X(double,  lr,               1e-3,  0.0,   INFINITY)     /* learning rate */                    \
  X(double,  weight_decay,     0.0,   0.0,   INFINITY)     /* decoupled */                        \
  X(double,  sigma,            0.2,   0.0,   INFINITY)     /* target update RMS */                \
  X(double,  eps,              1e-8,  1e-30, 1.0)                                                 \
  /* streams and Newton–Schulz (steps 1-2) */                                                     \
  X(double,  mu_s,             0.95,  0.0,   1.0)                                                 \
  X(double,  mu_f,             0.35,  0.0,   1.0)                                                 \
  X(int64_t, ns_steps_slow,    5,     0,     99)           /* K_s */                              \
  X(int64_t, ns_steps_fast,    5,     0,     99)           /* K_f */                              \
  X(int64_t, ns_gram_restart,  3,     0,     99)           /* Gram form: re-form every k */       \
  X(int64_t, ns_schedule,      0,     0,     2)            /* 0 fixed, 1 PolarExpress, 2 tuned */ \
  /* projection and fusion (steps 3-4) */                                                         \
  X(int64_t, proj_dim,         128,   1,     1 << 20)      /* d */                                \
  X(double,  xi,               0.25,  0.0,   1.0)                                                 \
  /* codebook (step 5, flush) */                                                                  \
  X(int64_t, codebook_size,    64,    1,     1 << 20)      /* C */                                \
  X(double,  beta_cb,          0.96,  0.0,   1.0)                                                 \
  X(double,  lambda_c,         0.1,   0.0,   INFINITY)                                            \
  X(int64_t, r_dec,            8,     0,     1 << 20)                                             \
  X(int64_t, reseed_every,     50,    0,     INFINITY)     /* 0: never */                         \
  X(double,  reseed_threshold, 0.03,  0.0,   INFINITY)                                            \
  /* short-term filter (step 6) */                                                                \
  X(double,  eps_st,           0.15,  0.0,   1.0)                                                 \
  X(double,  gamma_hi,         0.05,  0.0,   INFINITY)                                            \
  X(double,  gamma_st_min,     0.10,  0.0,   INFINITY)                                            \
  X(double,  gamma_st_max,     0.30,  gamma_st_min(), INFINITY)                                   \
  X(double,  beta_r,           0.95,  0.0,   1.0)                                                 \
  X(double,  kappa,            0.20,  1e-30, INFINITY)                                            \
  X(double,  tau_plus,         5.0,   0.0,   1e4)                                                 \
  X(double,  tau_minus,        5.0,   0.0,   1e4)                                                 \
  X(double,  lambda_hi,        0.1,   0.0,   INFINITY)                                            \
  /* long-term protection (step 7) and consolidation */                                           \
  X(double,  eps_lt,           0.10,  0.0,   1.0)                                                 \
  X(double,  gamma_lt,         1.0,   0.0,   INFINITY)                                            \
  X(int64_t, lt_candidates,    48,    1,     INFINITY)     /* |A_t| */                            \
  X(int64_t, freeze_per_task,  20,    0,     INFINITY)     /* K frozen per consolidate() */       \
  /* proximal lift (step 8) */                                                                    \
  X(double,  lambda_prox,      1.0,   1e-30, INFINITY)                                            \
  X(int64_t, seed,             0,     -INFINITY, INFINITY) /* Pi and the group generators */

/// Options checked elsewhere: X(type, name, default). The coefficients by NSConfig's validation
/// (finite), booleans need none.
#define FOGO_PLAIN_OPTIONS(X)                                                                     \
  X(coefficients_t, ns_coefficients,          kQuintic)  /* or kCubic */                          \
  X(bool,           spectral_scaling,         true)      /* gamma_lt by the trace bound */        \
  X(bool,           reinit_codebook_on_task,  false)                                             \
  /* CUDA parameters: capture steady-state steps in a CUDA graph, replay them (FOGO::step) */     \
  X(bool,           cuda_graph,               false)                                            \
  /* true: steps 1, 2, 4 (in parameter space) and 9 only: no Pi, codebook, filters or lift */    \
  X(bool,           fusion_only,              false)

/// Enumerations, serialized as integers: X(type, name, default).
#define FOGO_ENUM_OPTIONS(X)                                                                      \
  /* Newton–Schulz compute dtype (state stays fp32): bf16 (tensor cores, as torch.optim.Muon),  \
     fp32 or fp64, which also enable the fast stream's Gram route, or auto (kNSDtypeAuto): bf16 \
     where the device computes it faster, else fp32 (ns_dtype.h) */                               \
  X(c10::ScalarType,  ns_dtype,         kNSDtypeAuto)                                             \
  /* Newton–Schulz on X (Plain), on its Gram matrix with restarts (Gram), the faster by time     \
     (Auto), or Default: Auto where ns_dtype auto resolved to fp32, else Plain (newton_schulz.h) */\
  X(NSForm,           ns_form,          NSForm::Default)                                          \
  X(ProjectionScale,  projection_scale, ProjectionScale::Unit)                                    \
  X(NonFinitePolicy,  nonfinite,        NonFinitePolicy::Raise)
// clang-format on

namespace detail {
/// An enumeration option as checkpoints and their checksum hold it: ns_dtype as its
/// ns_dtype_code (auto -1: c10's number for it moves between LibTorch versions), the others as
/// their number; enum_from_archive is the inverse.
template <class T>
int64_t archived_enum(T v) {
  if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_code(v);
  } else {
    return static_cast<int64_t>(v);
  }
}
template <class T>
T enum_from_archive(int64_t code) {
  if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_from_code(code);
  } else {
    return static_cast<T>(code);
  }
}
}  // namespace detail

struct FOGOOptions : public torch::optim::OptimizerCloneableOptions<FOGOOptions> {
  using coefficients_t = std::tuple<double, double, double>;
  FOGOOptions(double lr = 1e-3);

#define FOGO_DECLARE_OPTION(T, name, def, ...) TORCH_ARG(T, name) = def;
  FOGO_RANGED_OPTIONS(FOGO_DECLARE_OPTION)
  FOGO_PLAIN_OPTIONS(FOGO_DECLARE_OPTION)
  FOGO_ENUM_OPTIONS(FOGO_DECLARE_OPTION)
#undef FOGO_DECLARE_OPTION

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
  /// Throws naming the first invalid option.
  void validate() const;
  /// Every option equal.
  friend bool operator==(const FOGOOptions& a, const FOGOOptions& b);
};

/// Every option of the tables as a Markdown table (option | default | valid values), in table
/// order: docs/algorithm.md holds this text, and a test keeps the two equal.
std::string options_markdown();

/// FOGO's Newton–Schulz configuration for `steps` iterations: X0 = B / (|B|_F + eps)
/// (docs/algorithm.md step 2), the options' coefficients and compute dtype.
NSConfig ns_config(const FOGOOptions& o, int64_t steps);

// clang-format off
/// The paper's configurations ("Detailed Experimental Setup"; docs/algorithm.md's table), one row
/// each: X(name, what it is for). The only list of them: it declares fogo::presets::name(),
/// makes fogo::presets::table, and through the table Python's fogo.presets; README's list is
/// checked against it (tests/test_fogo.cpp). The values are in src/fogo_options.cpp.
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
