// MuonOptions: validation, serialization, comparison and docs from the option table of
// muon_options.h (through fogo_private/frame/options_table.h); what routing reads of them
// (MatrixOptions: layout, update scale).
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "fogo/enum_names.h"
#include "fogo/muon.h"
#include "fogo/muon_options.h"
#include "fogo_private/frame/options_table.h"
#include "fogo_private/frame/scale_text.h"

namespace fogo {

using option_table::MuonTable;

NSConfig ns_config(const MuonOptions& o) {
  return fogo::ns_config(o.ns_coefficients(), o.ns_steps(), o.eps(), NSNormalization::ClampMin,
                         o.ns_dtype(), o.ns_form(), o.ns_gram_restart(), o.ns_schedule(),
                         o.ns_coefficient_schedule());
}

MatrixLayout matrix_layout(const MuonOptions& o) { return {o.batch_dims(), o.heads(), o.blocks()}; }

MatrixLayout MuonOptions::layout() const { return matrix_layout(*this); }

UpdateScale MuonOptions::update_scale(const std::vector<int64_t>& sizes) const {
  using detail::scale_number;
  UpdateScale s;
  s.lr = lr();
  // Each matrix by its own shape (a block of a fused weight by the block's): one text per shape.
  const auto shapes = detail::distinct_shapes(
      matrix_view(at::IntArrayRef(sizes), layout(), "routing", "a parameter"));
  std::ostringstream text;
  const char* separator = "";
  for (const auto& [rows, cols] : shapes) {
    const auto [f1, f2] = muon_adjusted_lr_factors(adjust_lr(), rows, cols, extra_scale_factor());
    const double factor = f1 * f2;
    // An orthogonal [rows, cols] update has RMS 1 / sqrt(max(rows, cols)) per entry.
    const double rms = factor / std::sqrt(static_cast<double>(std::max(rows, cols)));
    if (std::isnan(s.rms_per_lr)) s.rms_per_lr = rms;
    text << separator;
    if (shapes.size() > 1) text << "[" << rows << ", " << cols << "]: ";
    text << "lr " << scale_number(s.lr) << " x " << scale_number(factor) << " ("
         << enum_name(adjust_lr()) << "); RMS ~ " << scale_number(rms) << " lr";
    separator = "; ";
  }
  s.text = text.str();
  return s;
}

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

double MuonOptions::get_lr() const { return lr(); }
void MuonOptions::set_lr(const double lr) { this->lr(lr); }

void MuonOptions::validate() const {
  option_table::validate<MuonTable>(*this);
  // Combinations (a schedule made for ns_steps iterations), after every option alone so that
  // those errors name Muon's own options, not the NSConfig they feed.
  fogo::validate(ns_config(*this));
  TORCH_CHECK(heads() == 1 || blocks().empty(), "Muon: options 'heads' (", heads(),
              ") and 'blocks' ", at::IntArrayRef(blocks()), " both cut the rows; set one of them");
}

void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
  option_table::write<MuonTable>(*this, archive);
}

void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  // Checkpoints from before `nonfinite` hold check_finite (true: Raise, false: Unchecked).
  c10::IValue value;
  if (archive.try_read("check_finite", value)) {
    nonfinite(value.toBool() ? NonFinitePolicy::Raise : NonFinitePolicy::Unchecked);
  }
  option_table::read<MuonTable>(*this, archive);
}

bool operator==(const MuonOptions& a, const MuonOptions& b) {
  return option_table::equal<MuonTable>(a, b);
}

std::string muon_options_markdown() { return option_table::markdown<MuonTable>(); }

}  // namespace fogo
