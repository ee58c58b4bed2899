#pragma once
// The spellings of the options' enumerations, one list per enumeration (name <-> value): what
// Python's param groups hold (fogo._C, python/src/convert.h) and what the trainers' --fogo flags
// take (examples/common/fogo_flags.cpp). A new enumerator gets its name here, in its list, and
// both follow; a new enumeration type, a list of its own.

#include <fogo/fogo_options.h>
#include <fogo/muon_options.h>
#include <fogo/newton_schulz.h>
#include <fogo/nonfinite.h>

#include <array>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fogo {

/// EnumNames<E>::values: every value of E with its name, in the order messages list them.
template <class E>
struct EnumNames;

template <>
struct EnumNames<ProjectionScale> {
  static constexpr std::pair<const char*, ProjectionScale> values[] = {
      {"unit", ProjectionScale::Unit}, {"jl", ProjectionScale::JL}};
};

template <>
struct EnumNames<NonFinitePolicy> {
  static constexpr std::pair<const char*, NonFinitePolicy> values[] = {
      {"raise", NonFinitePolicy::Raise},
      {"skip", NonFinitePolicy::Skip},
      {"unchecked", NonFinitePolicy::Unchecked},
      {"mask", NonFinitePolicy::Mask}};
};

template <>
struct EnumNames<NSForm> {
  static constexpr std::pair<const char*, NSForm> values[] = {{"plain", NSForm::Plain},
                                                              {"gram", NSForm::Gram},
                                                              {"auto", NSForm::Auto},
                                                              {"default", NSForm::Default}};
};

template <>
struct EnumNames<MuonAdjustLR> {
  static constexpr std::pair<const char*, MuonAdjustLR> values[] = {
      {"original", MuonAdjustLR::Original},
      {"match_rms_adamw", MuonAdjustLR::MatchRmsAdamW},
      {"spectral", MuonAdjustLR::Spectral}};
};

/// EnumAliases<E>::values: other names a value of E is known by (another library's spelling of
/// the same thing), accepted wherever a name is read; what fogo writes is EnumNames' own.
template <class E>
struct EnumAliases {
  static constexpr std::array<std::pair<const char*, E>, 0> values{};
};

template <>
struct EnumAliases<MuonAdjustLR> {
  /// torch.optim.Muon's name (torch 2.15) for the same rule, lr * sqrt(A / B) unclamped.
  static constexpr std::pair<const char*, MuonAdjustLR> values[] = {
      {"spectral_unclamped", MuonAdjustLR::Spectral}};
};

/// What a step decided (Python's NonFiniteDecision.kind).
template <>
struct EnumNames<NonFiniteDecision::Kind> {
  static constexpr std::pair<const char*, NonFiniteDecision::Kind> values[] = {
      {"step", NonFiniteDecision::Kind::Step},
      {"skip", NonFiniteDecision::Kind::Skip},
      {"raise", NonFiniteDecision::Kind::Raise},
      {"mask", NonFiniteDecision::Kind::Mask}};
};

/// The name of `value`; nullptr for a value outside the list (one read from elsewhere).
template <class E>
const char* enum_name(E value) {
  for (const auto& [name, e] : EnumNames<E>::values)
    if (e == value) return name;
  return nullptr;
}

/// The value named `name` (by its name or an alias); nullopt for none.
template <class E>
std::optional<E> enum_from_name(std::string_view name) {
  for (const auto& [n, e] : EnumNames<E>::values)
    if (name == n) return e;
  for (const auto& [n, e] : EnumAliases<E>::values)
    if (name == n) return e;
  return std::nullopt;
}

/// The names for a message, each between `quote`s, separated by `sep` and the last by `last`:
/// enum_names_text<ProjectionScale>("", ", ", " or ") is "unit or jl".
template <class E>
std::string enum_names_text(std::string_view quote, std::string_view sep, std::string_view last) {
  std::string out;
  const size_t count = std::size(EnumNames<E>::values);
  for (size_t k = 0; k < count; ++k) {
    if (k > 0) out += k + 1 == count ? last : sep;
    out.append(quote).append(EnumNames<E>::values[k].first).append(quote);
  }
  for (const auto& [alias, e] : EnumAliases<E>::values) {
    out.append(" (").append(quote).append(alias).append(quote).append(" for ");
    out.append(quote).append(enum_name(e)).append(quote).append(")");
  }
  return out;
}

}  // namespace fogo
