#pragma once
// The three optimizers of the comparison, built for a GPT model (kept in one small translation
// unit so the trainer does not depend on how each is configured).
//
//   adamw  AdamW on everything; weight decay on matrices and embeddings only (as nanoGPT)
//   muon   fogo::Muon on the transformer's matrices, AdamW on embeddings (the tied head),
//          LayerNorm weights and biases (the paper's "standard Muon hybrid")
//   fogo   fogo::FOGO with presets::gpt2() on the same matrices, one codebook per parameter
//          shape (c_attn, attn c_proj, c_fc, mlp c_proj), AdamW on the rest
// Muon and FOGO run their Newton–Schulz iterations in OptimizerConfig::ns_dtype.

#include <fogo/fogo_options.h>
#include <fogo/hybrid.h>
#include <fogo/muon_options.h>

#include <optional>
#include <string>
#include <vector>

#include "common/optimizers.h"

namespace gpt2 {

struct OptimizerConfig {
  std::string name = "fogo";  ///< adamw | muon | fogo
  double lr = 6e-4;           ///< AdamW's lr (and the matrix side's unless matrix_lr is set)
  std::optional<double> matrix_lr;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double muon_momentum = 0.95;  ///< --muon-momentum (Nesterov)
  /// Muon's lr rule by its library name (fogo/enum_names.h): "match_rms_adamw" (0.2 sqrt(max(A,
  /// B)): the update RMS of AdamW, so the shared lr 6e-4 and wd 0.1 carry over, as FOGO's sigma
  /// = 0.2 does), "original" or "spectral" (sqrt(A / B); docs/muon.md); or an alias (the
  /// library's, or the trainers' match_rms: fogo::trainer::muon_adjust_aliases()).
  std::string muon_adjust = "match_rms_adamw";
  bool muon_normuon = false;  ///< --muon-normuon: NorMuon's row normalization (MuonOptions)
  int64_t muon_ns_steps = 5;  ///< --muon-ns-steps: Newton–Schulz iterations
  /// --muon-ns-schedule: a published coefficient list by name (deepseek_v4, ...) or rows
  /// "a,b,c;a,b,c;..." (MuonOptions::ns_coefficient_schedule); "" the constant quintic
  std::string muon_ns_schedule;
  double muon_extra_scale = 1.0;  ///< --muon-extra-scale: MuonOptions::extra_scale_factor
  /// Newton–Schulz compute dtype of Muon and FOGO: "bf16" (the library default) or "fp32".
  std::string ns_dtype = "auto";
  /// fogo: --fogo key=value (any FOGOOptions field) and --ablation (common/fogo_flags.h),
  /// applied after presets::gpt2() and the flags above.
  std::vector<std::string> fogo_options;
  std::string ablation = "full";
};

/// The FOGOOptions of a fogo run: presets::gpt2() with the matrix lr, weight decay and
/// --ns-dtype, then --ablation and --fogo. Throws a CliError naming --fogo or --ablation.
fogo::FOGOOptions fogo_options(const OptimizerConfig& config);

/// The MuonOptions of a muon run: the matrix lr, weight decay, --ns-dtype and the --muon-* flags.
/// Throws a CliError naming the --muon-* flag whose value MuonOptions refuses.
fogo::MuonOptions muon_options(const OptimizerConfig& config);

/// Throws a fogo::trainer::CliError naming the offending flag.
void validate(const OptimizerConfig& config);

struct Optimizer {
  /// Its param groups are named (group_name()): fogo's codebooks by the module types they hold
  /// ("attn.c_attn", ...: the telemetry's <group>), muon's one group "matrices", AdamW's "rest.0"
  /// (decay) and "rest.1" (no decay).
  fogo::HybridOptimizer hybrid;
};

Optimizer make_optimizer(const OptimizerConfig& config, const torch::nn::Module& model);

}  // namespace gpt2
