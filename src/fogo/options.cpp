// FOGOOptions: validation, serialization, comparison and docs from the option table of
// fogo_options.h (through fogo_private/frame/options_table.h); and the paper's presets.
#include <torch/serialize/archive.h>

#include "fogo/fogo_options.h"
#include "fogo_private/frame/options_table.h"
#include "fogo_private/frame/scale_text.h"

namespace fogo {

NSConfig ns_config(const FOGOOptions& o, int64_t steps) {
  return fogo::ns_config(o.ns_coefficients(), steps, o.eps(), NSNormalization::AddEps, o.ns_dtype(),
                         o.ns_form(), o.ns_gram_restart(), o.ns_schedule(),
                         o.ns_coefficient_schedule());
}

FOGOOptions::FOGOOptions(double lr) : lr_(lr) {}

double FOGOOptions::get_lr() const { return lr(); }
void FOGOOptions::set_lr(const double lr) { this->lr(lr); }

void FOGOOptions::validate() const {
  option_table::validate<option_table::FOGOTable>(*this);
  // Combinations, after every option alone: coefficients, NS dtype and form made for both
  // streams' step counts (a schedule is made for a number of iterations).
  fogo::validate(ns_config(*this, ns_steps_slow()));
  fogo::validate(ns_config(*this, ns_steps_fast()));
  TORCH_CHECK(heads() == 1 || blocks().empty(), "FOGO: options 'heads' (", heads(),
              ") and 'blocks' ", at::IntArrayRef(blocks()), " both cut the rows; set one of them");
}

MatrixLayout matrix_layout(const FOGOOptions& o) { return {o.batch_dims(), o.heads(), o.blocks()}; }

MatrixLayout FOGOOptions::layout() const { return matrix_layout(*this); }

// sigma is the update's target RMS whatever the shape (step 9 scales it to sigma lr).
UpdateScale FOGOOptions::update_scale(const std::vector<int64_t>& /*sizes*/) const {
  UpdateScale s;
  s.lr = lr();
  s.rms_per_lr = sigma();
  s.text = "lr " + detail::scale_number(s.lr) +
           "; RMS = sigma lr = " + detail::scale_number(s.rms_per_lr) + " lr";
  return s;
}

void FOGOOptions::serialize(torch::serialize::OutputArchive& archive) const {
  option_table::write<option_table::FOGOTable>(*this, archive);
}

void FOGOOptions::serialize(torch::serialize::InputArchive& archive) {
  option_table::read<option_table::FOGOTable>(*this, archive);
}

std::string options_markdown() { return option_table::markdown<option_table::FOGOTable>(); }

bool operator==(const FOGOOptions& a, const FOGOOptions& b) {
  return option_table::equal<option_table::FOGOTable>(a, b);
}

// ---------------------------------------------------------------------------------------------
// Presets: the paper's "Detailed Experimental Setup" (docs/algorithm.md's table), one function per
// row of FOGO_PRESETS (fogo_options.h), which declares them.

namespace presets {

FOGOOptions class_imbalanced_backbone() {
  return FOGOOptions(1e-3)
      .codebook_size(96)
      .proj_dim(128)
      .mu_s(0.97)
      .mu_f(0.35)
      .ns_steps_slow(5)
      .ns_steps_fast(5)
      .xi(0.25)
      .eps_st(0.15)
      .gamma_hi(0.05)
      .gamma_st_min(0.10)
      .gamma_st_max(0.30)
      .kappa(0.15)
      .beta_cb(0.95)
      .lambda_c(0.10)
      .r_dec(8)
      .reseed_every(50)
      .reseed_threshold(0.03)
      .sigma(0.1)
      .lambda_prox(1.0);
}

FOGOOptions class_imbalanced_head() { return class_imbalanced_backbone().codebook_size(64); }

FOGOOptions domain_il_backbone() {
  return class_imbalanced_backbone()
      .codebook_size(64)
      .proj_dim(128)
      .mu_s(0.95)
      .mu_f(0.35)
      .xi(0.3)
      .eps_st(0.15)
      .beta_cb(0.95)
      .reseed_every(50)
      .reseed_threshold(0.03)
      .sigma(0.1)
      .eps_lt(0.10)
      .gamma_lt(0.6)
      .freeze_per_task(21);
}

FOGOOptions domain_il_head() {
  return domain_il_backbone().codebook_size(32).proj_dim(64).gamma_lt(0.4).freeze_per_task(12);
}

FOGOOptions class_il_backbone() {
  return FOGOOptions(2e-3)
      .codebook_size(96)
      .proj_dim(256)
      .mu_s(0.97)
      .mu_f(0.20)
      .ns_steps_slow(4)
      .ns_steps_fast(4)
      .xi(0.2)
      .eps_st(0.25)
      .gamma_hi(0.01)
      .gamma_st_min(0.15)
      .gamma_st_max(0.40)
      .kappa(0.15)
      .beta_cb(0.96)
      .lambda_c(0.05)
      .r_dec(8)
      .reseed_every(50)
      .reseed_threshold(0.10)
      .sigma(0.1)
      .eps_lt(0.001)
      .gamma_lt(1.0)
      .lt_candidates(48)
      .freeze_per_task(20)
      .lambda_prox(1.0);
}

FOGOOptions class_il_head_fc() {
  return class_il_backbone().codebook_size(48).proj_dim(96).freeze_per_task(20);
}

FOGOOptions class_il_classifier() {
  return class_il_backbone().codebook_size(12).proj_dim(16).sigma(0.05).freeze_per_task(8);
}

FOGOOptions gpt2() {
  return FOGOOptions(6e-4)
      .weight_decay(0.1)
      .codebook_size(256)
      .proj_dim(512)
      .mu_s(0.95)
      .mu_f(0.15)
      .ns_steps_slow(5)
      .ns_steps_fast(5)
      .xi(0.25)
      .eps_st(0.20)
      .gamma_hi(0.001)
      .gamma_st_min(0.15)
      .gamma_st_max(0.30)
      .kappa(0.15)
      .beta_cb(0.96)
      .lambda_c(0.05)
      .r_dec(8)
      .reseed_every(200)
      .reseed_threshold(0.10)
      .sigma(0.2)
      .lambda_prox(1.0);
}

FOGOOptions lora() {
  // The table's empty LoRA cells (beta_cb, lambda_c and r, re-seeding, kappa) inherit from the
  // row above, as every other row does: the class-IL rows.
  return class_il_backbone()
      .lr(1e-3)
      .codebook_size(48)
      .proj_dim(128)
      .mu_s(0.96)
      .mu_f(0.16)
      .ns_steps_slow(5)
      .ns_steps_fast(4)
      .xi(0.25)
      .eps_st(0.20)
      .gamma_hi(0.01)
      .gamma_st_min(0.15)
      .gamma_st_max(0.45)
      .sigma(0.2)
      .eps_lt(0.05)
      .gamma_lt(1.0)
      .freeze_per_task(23)
      .lambda_prox(0.8);
}

FOGOOptions by_name(std::string_view name) {
  std::string known;
  for (const Preset& p : table) {
    if (name == p.name) return p.options();
    known += std::string(known.empty() ? "" : ", ") + p.name;
  }
  TORCH_CHECK_VALUE(false, "fogo::presets: no preset named '", name, "' (the presets: ", known,
                    ")");
}

FOGOOptions fusion_only(FOGOOptions base) { return base.fusion_only(true); }

}  // namespace presets

}  // namespace fogo
