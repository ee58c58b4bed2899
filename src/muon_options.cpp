// MuonOptions: validation, serialization, comparison, checksum and docs, generated from the
// option table of muon_options.h.
#include "fogo/muon_options.h"

#include <torch/serialize/archive.h>

#include <algorithm>
#include <sstream>
#include <type_traits>

#include "fogo/detail/checks.h"
#include "fogo/detail/integrity.h"

namespace fogo {

namespace {

// A value in an error message: a dtype by name, an enumeration by number.
template <class T>
auto printable(const T& v) {
  if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_name(v);
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return v;
  }
}

// The table's `valid` column, one overload per rule; each error names "Muon: option '<name>'".
template <class T>
void check(const char*, const T&, option_rules::Any) {}

template <class T>
void check(const char* name, const T& v, option_rules::Range r) {
  detail::check_range("Muon", name, static_cast<double>(v), r.lo, r.hi);
}

void check(const char* name, double v, option_rules::Positive) {
  TORCH_CHECK(std::isfinite(v) && v > 0, "Muon: option '", name, "' must be finite and > 0, got ",
              v);
}

void check(const char* name, const MuonOptions::coefficients_t& v, option_rules::Finite) {
  const auto [a, b, c] = v;
  TORCH_CHECK(std::isfinite(a) && std::isfinite(b) && std::isfinite(c), "Muon: option '", name,
              "' must be finite, got (", a, ", ", b, ", ", c, ")");
}

template <class T>
void check(const char* name, const T& v, option_rules::Known) {
  TORCH_CHECK(is_known(v), "Muon: option '", name, "' is not a known value (", printable(v), ")");
}

template <class T, size_t N>
void check(const char* name, const T& v, const option_rules::OneOf<T, N>& rule) {
  if (std::find(rule.values.begin(), rule.values.end(), v) != rule.values.end()) return;
  std::ostringstream valid;
  for (const T& x : rule.values) valid << ' ' << printable(x);
  TORCH_CHECK(false, "Muon: option '", name, "' must be one of", valid.str(), ", got ",
              printable(v));
}

// An option as a checkpoint and its checksum hold it: a dtype as its ns_dtype_code (auto -1:
// c10's number for it moves between LibTorch versions), the rest as themselves.
template <class T>
auto archived(const T& v) {
  if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_code(v);
  } else {
    return v;
  }
}

// An option's archive value: enumerations as int64, the rest as themselves.
template <class T>
c10::IValue to_ivalue(const T& v) {
  if constexpr (std::is_enum_v<T>) {
    return c10::IValue(static_cast<int64_t>(archived(v)));
  } else {
    return c10::IValue(v);
  }
}

template <class T>
T from_ivalue(const c10::IValue& v) {
  if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_from_code(v.toInt());
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<T>(v.toInt());
  } else {
    return v.to<T>();
  }
}

}  // namespace

NSConfig ns_config(const MuonOptions& o) {
  return fogo::ns_config(o.ns_coefficients(), o.ns_steps(), o.eps(), NSNormalization::ClampMin,
                         o.ns_dtype(), o.ns_form(), o.ns_gram_restart(), o.ns_schedule());
}

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

double MuonOptions::get_lr() const { return lr(); }
void MuonOptions::set_lr(const double lr) { this->lr(lr); }

void MuonOptions::validate() const {
  using namespace option_rules;
#define FOGO_MUON_CHECK(T, name, def, valid, stored) check(#name, name(), valid);
  FOGO_MUON_OPTIONS(FOGO_MUON_CHECK)
#undef FOGO_MUON_CHECK
  // Combinations (a schedule made for ns_steps iterations), after every option alone so that
  // those errors name Muon's own options, not the NSConfig they feed.
  fogo::validate(ns_config(*this));
}

void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
#define FOGO_MUON_WRITE(T, name, ...) archive.write(#name, to_ivalue(name()));
  FOGO_MUON_OPTIONS(FOGO_MUON_WRITE)
#undef FOGO_MUON_WRITE
}

void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  // Checkpoints from before `nonfinite` hold check_finite (true: Raise, false: Unchecked).
  if (archive.try_read("check_finite", value)) {
    nonfinite(value.toBool() ? NonFinitePolicy::Raise : NonFinitePolicy::Unchecked);
  }
  // An Always option missing: no Muon checkpoint (read throws). An Added one keeps its value.
#define FOGO_MUON_READ(T, name, def, valid, stored)             \
  if constexpr (MuonArchived::stored == MuonArchived::Always) { \
    archive.read(#name, value);                                 \
    name(from_ivalue<T>(value));                                \
  } else if (archive.try_read(#name, value)) {                  \
    name(from_ivalue<T>(value));                                \
  }
  FOGO_MUON_OPTIONS(FOGO_MUON_READ)
#undef FOGO_MUON_READ
}

bool operator==(const MuonOptions& a, const MuonOptions& b) {
#define FOGO_MUON_EQUAL(T, name, ...) a.name() == b.name()&&
  return FOGO_MUON_OPTIONS(FOGO_MUON_EQUAL) true;
#undef FOGO_MUON_EQUAL
}

void MuonOptions::add_to_checksum(detail::Checksum& sum) const {
#define FOGO_MUON_SUM(T, name, def, valid, stored)                                     \
  if (MuonArchived::stored != MuonArchived::AddedAfterChecksum || !(name() == T(def))) \
    sum.option(archived(name()));
  FOGO_MUON_OPTIONS(FOGO_MUON_SUM)
#undef FOGO_MUON_SUM
}

std::string muon_options_markdown() {
  std::string out = "| option | default | valid | checkpoint |\n|---|---|---|---|\n";
#define FOGO_MUON_ROW(T, name, def, valid, stored) \
  out += "| `" #name "` | `" #def "` | `" #valid "` | " #stored " |\n";
  FOGO_MUON_OPTIONS(FOGO_MUON_ROW)
#undef FOGO_MUON_ROW
  return out;
}

}  // namespace fogo
